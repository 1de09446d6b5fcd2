"""Encoder-decoders, text in and attention out: a source text for the encoder, a target text for the decoder.

    rt = EncoderDecoderRuntime(spec, cache_dir=...)
    res = rt("The house is wonderful.", "Das Haus")
    res.encoder_attentions [L, H, S, S], res.decoder_attentions [L_dec, H, T, T], res.cross_attentions [L_dec, H, T, S]

The decoder reads what transformers' decoder reads when trained on `decoder_text` as labels: the text tokenised with
the tokenizer's own specials, shifted right behind the decoder start token (so the final </s> is what the last
position predicts, not a token read). No decoder text, or a blank one: the start token alone. One graph runs both stacks
(graphs/encdec.py); the NumPy reference (model/encdec.py) runs when asked.
"""
from __future__ import annotations

import functools
import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..graphs.cache import GraphCache
from ..graphs.reduced import compute_key
from ..model import masks as M
from ..model.encdec import EncoderDecoderOutput
from ..sources import ModelSpec
from ..sources.store import fingerprint
from .capabilities import WORK_TFLOP, Capabilities, memory_total
from .errors import InputError
from .options import check_compute_dtype, check_providers, default_providers, device_of
from .results import Encoded, Encoding, Engine, NextToken
from .sessions import Session
from .tensors import Weights
from .tokenizing import Vocabulary

DEFAULT_CACHE = Path.home() / ".cache" / "attnscope"


@dataclass
class EncoderDecoderResult(Encoded):
    """One source text and one decoder text, trimmed to their own tokens."""
    model: str
    engine: Engine
    provider: str
    encoding: Encoding                    # the source (encoder) tokens
    decoder_encoding: Encoding            # the decoder's tokens, the start token first
    encoder_attentions: np.ndarray        # [L, H, S, S]
    decoder_attentions: np.ndarray        # [L_dec, H, T, T] (causal)
    cross_attentions: np.ndarray          # [L_dec, H, T, S]: decoder queries x encoder keys
    next_token_logits: np.ndarray         # [V] after the decoder's last token
    next_tokens: list[NextToken]
    token_logprobs: list[float | None]    # log p(decoder token t | tokens before it, source); None for the first
    seconds: float = 0.0
    steps: EncoderDecoderOutput | None = None   # with stages: the NumPy run, every attention's steps and masks

    @property
    def attentions(self) -> np.ndarray:
        """The encoder's self-attention: what `attention` means for every model."""
        return self.encoder_attentions

    causal = False                        # the encoder's attention (`attention`) sees both ways
    mask_tokens: tuple = ()

    @property
    def decoder_tokens(self) -> list[str]:
        return self.decoder_encoding.tokens


class EncoderDecoderRuntime:
    """One encoder-decoder, its tokenizer and its onnxruntime session (opened on first use)."""

    def __init__(self, spec: ModelSpec, providers: Sequence[str] | None = None, threads: int = 0,
                 cache_dir: str | Path = DEFAULT_CACHE, stop_early_mb: float = 0, memory_mb: float | None = None,
                 work_tflop: float = WORK_TFLOP, compute_dtype: str = "float32"):
        """As Runtime's (compute_dtype: what its graph's matrix products run in)."""
        self.spec, self.cache_dir = spec, Path(cache_dir)
        self.providers = list(providers) if providers else default_providers()
        check_compute_dtype(compute_dtype, self.providers)
        self.compute_dtype = compute_dtype
        self.model = spec.load_model(self.cache_dir)
        self.cfg = self.model.cfg
        self.vocabulary = Vocabulary(spec.load_tokenizer(self.cache_dir), spec.id, spec.max_tokens, False,
                                     self.cfg.vocab_size)
        self.generation = None
        self.graphs = GraphCache(self.cache_dir, spec.id, self.model)
        self.threads = threads
        self.weights = Weights(self.model, device_of(self.providers))
        memory = memory_total() * 0.85 if memory_mb is None else memory_mb * 2**20
        self.capabilities = Capabilities.of(self.model, memory, work_tflop * 1e12, spec.source,
                                            compute_dtype=compute_dtype)
        self._session = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        return self.vocabulary.tokenizer

    @property
    def provider(self) -> str:
        return self.session().get_providers()[0]

    def session(self, stages: bool = False):
        if self._session is None:
            with self._lock:
                if self._session is None:
                    check_providers(self.providers)
                    self._session = Session(self.graphs.path(), self.providers, self.threads, self.weights,
                                            arena=self.capabilities.arena, compute_dtype=self.compute_dtype)
        return self._session

    def cache_key(self) -> str:
        return self.graphs.key

    @functools.cached_property
    def key(self) -> str:
        """Runtime.key: the graphs' key and the weights' fingerprint."""
        return hashlib.sha256(f"{self.graphs.key}:{fingerprint(self.weights.named)}"
                              f"{compute_key(self.compute_dtype)}".encode()).hexdigest()[:16]

    def onnx_path(self, stages: bool = False) -> Path:
        return self.graphs.path()

    # ---- tokens ---------------------------------------------------------------------------------------
    def encode(self, text: str, pair: str | None = None) -> Encoding:
        return self.vocabulary.encode(text, pair)

    def encode_decoder(self, decoder_text: str | None) -> Encoding:
        """[decoder start] + the decoder text's tokens (with the tokenizer's specials) but its last: the labels
        shifted right, as transformers' shift_tokens_right makes them. No decoder text, or a blank one (nothing but
        white space), is the start token alone, in every family: a blank text has nothing for the decoder to read,
        and the tokenizers' specials alone (BART's <s> </s>, T5's and Marian's </s>) would differ by family."""
        start = self.cfg.decoder_start_token_id
        head = Encoding([start], [0], [self.vocabulary.token_string(start)], [(0, 0)], [True], [-1], False, [False])
        if decoder_text is None or not decoder_text.strip():
            return head
        e = self.vocabulary.encode(decoder_text)
        n = min(len(e.ids) - 1, self.spec.max_tokens - 1)
        return Encoding(head.ids + e.ids[:n], [0] * (n + 1), head.tokens + e.tokens[:n], head.offsets + e.offsets[:n],
                        head.special + e.special[:n], head.segments + e.segments[:n],
                        e.truncated or n < len(e.ids) - 1, head.punctuation + e.punctuation[:n])

    def token_string(self, token_id: int) -> str:
        return self.vocabulary.token_string(token_id)

    def special_ids(self) -> list[int]:
        return self.vocabulary.special_ids()

    # ---- running --------------------------------------------------------------------------------------
    def __call__(self, text: str, decoder_text: str | None = None, **options) -> EncoderDecoderResult:
        return self.forward([self.encode(text)], [self.encode_decoder(decoder_text)], **options)[0]

    @staticmethod
    def masks(src_lengths: Sequence[int], dec_lengths: Sequence[int]) -> dict[str, np.ndarray]:
        """The three additive masks: encoder [B, 1, S, S] (its padding), decoder [B, 1, T, T] (causal + padding),
        cross [B, 1, T, S] (the encoder's padding)."""
        B, S, T = len(src_lengths), max(src_lengths), max(dec_lengths)
        src_pad = M.padding_mask(np.arange(S)[None, :] < np.asarray(src_lengths)[:, None])   # [B, 1, 1, S]
        dec_pad = M.padding_mask(np.arange(T)[None, :] < np.asarray(dec_lengths)[:, None])   # [B, 1, 1, T]
        return {"encoder_mask": np.ascontiguousarray(np.broadcast_to(src_pad, (B, 1, S, S))),
                "decoder_mask": np.ascontiguousarray(np.broadcast_to(
                    M.combine(dec_pad, M.causal_mask(T)[None, None]), (B, 1, T, T))),
                "cross_mask": np.ascontiguousarray(np.broadcast_to(src_pad, (B, 1, T, S)))}

    def forward(self, encs: Sequence[Encoding], decs: Sequence[Encoding], *, engine: Engine = "onnx",
                top_k: int = 10, stages: bool = False) -> list[EncoderDecoderResult]:
        """Run source and decoder encodings (padded together). stages: keep every attention's steps (the steps view,
        /api/stages): the NumPy reference runs (the graph keeps only the probabilities), one text at a time."""
        t0 = time.perf_counter()
        if engine not in ("onnx", "numpy"):
            raise InputError(f"engine must be 'onnx' or 'numpy'; got {engine!r}")
        sl, dl = [len(e.ids) for e in encs], [len(d.ids) for d in decs]
        B = len(encs)
        ids, dec = np.zeros((B, max(sl)), np.int64), np.zeros((B, max(dl)), np.int64)
        for b in range(B):
            ids[b, :sl[b]], dec[b, :dl[b]] = encs[b].ids, decs[b].ids
        masks = self.masks(sl, dl)
        if stages and B != 1:
            raise InputError("the steps of an encoder-decoder's heads are kept for one text at a time")
        engine, steps = "numpy" if stages else engine, None
        if engine == "numpy":
            out = self.model(ids, dec, masks["encoder_mask"], masks["decoder_mask"], masks["cross_mask"], dl,
                             stages=stages)
            steps = out if stages else None
            outs, provider = {n: getattr(out, n) for n in ("encoder_attentions", "decoder_attentions",
                                                           "cross_attentions", "next_token_logits", "token_logprobs")}, "numpy"
        else:
            sess = self.session()
            feeds = {"input_ids": ids, "decoder_input_ids": dec, **masks, "decoder_lengths": np.asarray(dl, np.int64)}
            names = ["encoder_attentions", "decoder_attentions", "cross_attentions", "next_token_logits",
                     "token_logprobs"]
            outs = dict(zip(names, sess.run(names, feeds, axes={"batch": B, "source": max(sl), "target": max(dl)})))
            provider = sess.get_providers()[0]
        seconds = time.perf_counter() - t0
        return [EncoderDecoderResult(
            self.spec.id, engine, provider, e, d, np.ascontiguousarray(outs["encoder_attentions"][:, b, :, :s, :s]),
            np.ascontiguousarray(outs["decoder_attentions"][:, b, :, :t, :t]),
            np.ascontiguousarray(outs["cross_attentions"][:, b, :, :t, :s]), outs["next_token_logits"][b].copy(),
            self.vocabulary.top_tokens(outs["next_token_logits"][b], top_k),
            [None] + outs["token_logprobs"][b, 1:t].astype(float).tolist(), seconds, steps)
            for b, (e, d, s, t) in enumerate(zip(encs, decs, sl, dl))]
