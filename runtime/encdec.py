"""Encoder-decoders, text in and attention out: a source text for the encoder, a target text for the decoder.

    rt = EncoderDecoderRuntime(spec, cache_dir=...)
    res = rt("The house is wonderful.", "Das Haus")
    res.encoder_attentions [L, H, S, S], res.decoder_attentions [L_dec, H, T, T], res.cross_attentions [L_dec, H, T, S]

The decoder reads what transformers' decoder reads when trained on `decoder_text` as labels: the text tokenised with
the tokenizer's own specials, shifted right behind the decoder start token (so the final </s> is what the last
position predicts, not a token read). No decoder text, or a blank one: the start token alone. One graph runs both stacks
(graphs/encdec.py); the NumPy reference (model/encdec.py) runs when asked.

Interventions (below): knock_out (cross-attention heads, or a stack's self-attention, stop reading chosen keys) and
patch (head outputs, hook_z, of the encoder's or the decoder's self-attention or of the cross-attention, from another
run), shaped as runtime/patching.py's knock_out and patch are for the decoders; their edits are model/interventions.py
Edit rows, made by the graph of runs with edits (graphs/encdec.build_graph(edits=True)).
"""
from __future__ import annotations

import functools
import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

from ..analysis.effects import Metric, recovery
from ..graphs.cache import GraphCache
from ..graphs.reduced import compute_key
from ..model import masks as M
from ..model.encdec import EncoderDecoderOutput
from ..model.interventions import CROSS_SITES, HOOKS, Edit, knockout
from ..model.masks import MASKED
from ..model.precision import COMPUTE
from ..sources import ModelSpec
from ..sources.store import fingerprint
from .capabilities import WORK_TFLOP, Capabilities, memory_total
from .errors import InputError
from .options import check_compute_dtype, check_providers, default_providers, device_of
from .results import Encoded, Encoding, Engine, NextToken
from .sessions import Session
from .tensors import Weights
from .tokenizing import Vocabulary
from .errors import Stopped
from .patching import Direction, Knockout, Patching, Prediction

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
                                            arena=self.capabilities.arena, compute_dtype=self.compute_dtype,
                                            optimized=self.graphs.folder)
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


# ---- interventions: knockout and activation patching ---------------------------------------------------------------
# An encoder-decoder's runs with edits: the same Edit objects (model/interventions.py: sites named within a stack,
# "encoder" or "decoder", and a decoder block's cross_ sites), made by the served graph of runs with edits
# (graphs/encdec.build_graph(edits=True)), rows of edits along the batch axis, as runtime/interventions.py runs a
# decoder's; model/interventions.forward_encoder_decoder is their NumPy reference (engine "numpy"). The served graph
# makes the edits the decoders' served runs make by graph input: knockouts (MASKED on cells of masked, cross_masked)
# and head outputs replaced (head_output, cross_head_output: hook_z). The one graph runs every layer: no prefix reuse.

Attention = Literal["encoder", "decoder", "cross"]   # a stack's self-attention, or the decoder's cross-attention
EDITED = ("masked", "cross_masked", "head_output", "cross_head_output")   # the sites the served graph edits
BATCH = 16                                          # rows of edits run at once


def attention_of(e: Edit) -> Attention:
    """Which of an encoder-decoder's attentions an edit's site belongs to."""
    if e.stack not in ("encoder", "decoder"):
        raise InputError(f"an encoder-decoder's edit names its stack, 'encoder' or 'decoder'; {e.hook} has none")
    return "cross" if e.site in CROSS_SITES else e.stack


def site_of(attention: Attention, site: str = "head_output") -> tuple[str, str]:
    """(site, stack) of a site of an attention: ("cross_head_output", "decoder") for the cross-attention's hook_z."""
    if attention not in ("encoder", "decoder", "cross"):
        raise InputError(f"attention {attention!r}: one of 'encoder', 'decoder', 'cross'")
    return ("cross_" + site, "decoder") if attention == "cross" else (site, attention)


@dataclass
class EncoderDecoderTrace:
    """One run of a source text and a decoder text (no padding), with what edits read: each attention's head outputs
    head_output[a] [L, H, Tq, dh] and probabilities attentions[a] [L, H, Tq, Tk] (a: encoder, decoder, cross), the
    decoder's final hidden states [T, D], the next-token logits [V] and the token log-probs [T]."""
    encoding: Encoding
    decoder_encoding: Encoding
    head_output: dict[str, np.ndarray]
    attentions: dict[str, np.ndarray]
    hidden: np.ndarray
    logits: np.ndarray
    token_logprobs: np.ndarray
    seconds: float = 0.0

    @property
    def S(self) -> int:
        return len(self.encoding.ids)

    @property
    def T(self) -> int:
        return len(self.decoder_encoding.ids)


def _edit_feeds(rt, rows: Sequence[Sequence[Edit]], S: int, T: int) -> dict[str, np.ndarray]:
    """The edits graph's edit inputs for rows of edits: {a}_knocked, {a}_edited, {a}_edits (graphs/encdec.py)."""
    cfg, B = rt.cfg, len(rows)
    H, dh = cfg.n_heads, cfg.d_head
    L = {"encoder": cfg.n_layers, "decoder": cfg.n_decoder_layers, "cross": cfg.n_decoder_layers}
    Tq = {"encoder": S, "decoder": T, "cross": T}
    Tk = {"encoder": S, "decoder": T, "cross": S}
    feeds = {}
    knocks = {attention_of(e) for row in rows for e in row if e.site.endswith("masked")}
    for a in ("encoder", "decoder", "cross"):        # cells only for an attention some row knocks out: else [.., 1, 1]
        feeds[f"{a}_knocked"] = np.zeros((B, L[a], H, Tq[a], Tk[a]) if a in knocks else (B, L[a], H, 1, 1), bool)
        feeds[f"{a}_edited"] = np.zeros((B, L[a], H, Tq[a]), bool)
        feeds[f"{a}_edits"] = np.zeros((B, L[a], H, Tq[a], dh), COMPUTE)
    for b, row in enumerate(rows):
        for e in row:
            a = attention_of(e)
            if e.site not in EDITED:
                raise InputError(f"the served encoder-decoder edits {', '.join(EDITED)}; {e.hook} runs with engine "
                                 "'numpy' (model/interventions.forward_encoder_decoder)")
            if not 0 <= e.layer < L[a]:
                raise InputError(f"layer {e.layer} of {e.hook}: the {a} attention has layers 0..{L[a] - 1}")
            if e.site.endswith("masked"):
                if not np.all(np.asarray(e.value) == MASKED):
                    raise InputError("the served model edits attention scores by knockout only (value MASKED)")
                feeds[f"{a}_knocked"][b, e.layer] |= np.broadcast_to(e.where, (H, Tq[a], Tk[a]))
            else:
                where = np.broadcast_to(e.where, (H, Tq[a]))
                value = np.broadcast_to(np.asarray(e.value, COMPUTE), (H, Tq[a], dh))
                feeds[f"{a}_edited"][b, e.layer] |= where
                feeds[f"{a}_edits"][b, e.layer] = np.where(where[..., None], value, feeds[f"{a}_edits"][b, e.layer])
    return feeds


class EncoderDecoderInterventions:
    """An encoder-decoder's runs with edits: trace (one run, what edits read kept) and run (rows of edits)."""

    def __init__(self, rt: EncoderDecoderRuntime, batch: int = BATCH):
        self.rt, self.batch = rt, max(1, int(batch))

    def session(self) -> Session:
        """The graph of runs with edits (graphs/encdec.build_graph(edits=True)), opened on first use."""
        rt = self.rt
        with rt._lock:
            if getattr(rt, "_edits_session", None) is None:
                check_providers(rt.providers)
                rt._edits_session = Session(rt.graphs.path(edits=True), rt.providers, rt.threads, rt.weights,
                                            arena=rt.capabilities.arena, compute_dtype=rt.compute_dtype,
                                            optimized=rt.graphs.folder)
        return rt._edits_session

    def trace(self, enc: Encoding, dec: Encoding, engine: Engine = "onnx") -> EncoderDecoderTrace:
        t0 = time.perf_counter()
        out = self._run(enc, dec, [[]], engine)
        return EncoderDecoderTrace(enc, dec, {a: out[f"{a}_head_output"][0] for a in ("encoder", "decoder", "cross")},
                                   {a: out[f"{a}_attentions"][0] for a in ("encoder", "decoder", "cross")},
                                   out["hidden"][0], out["next_token_logits"][0], out["token_logprobs"][0],
                                   time.perf_counter() - t0)

    def run(self, enc: Encoding, dec: Encoding, rows: Sequence[Sequence[Edit]], engine: Engine = "onnx",
            progress=None, stop=None) -> dict[str, np.ndarray]:
        """Every row's edits made to the run of (enc, dec), `batch` rows at a time along the batch axis: {hidden
        [R, T, D], next_token_logits [R, V], token_logprobs [R, T], {a}_attentions [R, L, H, Tq, Tk], {a}_head_output
        [R, L, H, Tq, dh]} (a: encoder, decoder, cross; R rows). progress(rows done, rows) after each batch; stop():
        checked before each, True raises Stopped."""
        parts: dict[str, list] = {}
        if progress is not None:
            progress(0, len(rows))
        for n in range(0, len(rows), self.batch):
            if stop is not None and stop():
                raise Stopped(f"stopped after {n} of {len(rows)} runs: nobody waits for the result")
            for name, value in self._run(enc, dec, rows[n:n + self.batch], engine).items():
                parts.setdefault(name, []).append(value)
            if progress is not None:
                progress(min(n + self.batch, len(rows)), len(rows))
        return {name: np.concatenate(values) for name, values in parts.items()}

    def _run(self, enc: Encoding, dec: Encoding, rows: Sequence[Sequence[Edit]], engine: Engine) -> dict:
        rt, B = self.rt, len(rows)
        S, T = len(enc.ids), len(dec.ids)
        ids = np.repeat(np.array([enc.ids], np.int64), B, axis=0)
        dids = np.repeat(np.array([dec.ids], np.int64), B, axis=0)
        masks = {k: np.repeat(v, B, axis=0) for k, v in rt.masks([S], [T]).items()}
        if engine == "numpy":
            from ..model.interventions import forward_encoder_decoder
            edited = forward_encoder_decoder(rt.model, ids, dids, masks, [list(r) for r in rows])
            c = edited.cache
            got = {"hidden": edited.hidden, "next_token_logits": edited.logits, "token_logprobs": edited.token_logprobs}
            for a in ("encoder", "decoder", "cross"):
                site, stack = site_of(a)
                n = rt.cfg.n_layers if a == "encoder" else rt.cfg.n_decoder_layers
                got[f"{a}_head_output"] = np.stack([c[(stack, site, l)] for l in range(n)], axis=1)
                got[f"{a}_attentions"] = np.stack([c[(stack, site.replace("head_output", "pattern"), l)]
                                                   for l in range(n)], axis=1)
            return got
        if engine != "onnx":
            raise InputError(f"engine must be 'onnx' or 'numpy'; got {engine!r}")
        feeds = {"input_ids": ids, "decoder_input_ids": dids, **masks,
                 "decoder_lengths": np.full(B, T, np.int64), **_edit_feeds(rt, rows, S, T)}
        names = ["hidden", "next_token_logits", "token_logprobs"] + [
            f"{a}_{n}" for a in ("encoder", "decoder", "cross") for n in ("attentions", "head_output")]
        outs = dict(zip(names, self.session().run(names, feeds, axes={"batch": B, "source": S, "target": T})))
        for a in ("encoder", "decoder", "cross"):        # [L, B, ...] -> [B, L, ...], as the NumPy reference's
            for n in ("attentions", "head_output"):
                outs[f"{a}_{n}"] = np.ascontiguousarray(np.swapaxes(outs[f"{a}_{n}"], 0, 1))
        return outs


def knock_out(rt: EncoderDecoderRuntime, enc: Encoding, dec: Encoding, queries, keys, layers: tuple[int, int],
              top_k: int = 10, *, attention: Attention = "cross", heads=None) -> Knockout:
    """Attention knockout in an encoder-decoder (runtime/patching.knock_out's, for a source and a decoder text): in
    `attention`'s layers first..last (inclusive) every head (or those `heads` names) stops reading `keys` from
    `queries`, MASKED on those cells of its masked scores (the softmax renormalises the rest of each row). cross:
    decoder positions (queries) stop reading source positions (keys); encoder, decoder: a stack's self-attention.
    The prediction before and after: of the decoder's last position, and its tokens' log-probs."""
    t0 = time.perf_counter()
    iv = EncoderDecoderInterventions(rt)
    site, stack = site_of(attention, "masked")
    S, T, H = len(enc.ids), len(dec.ids), rt.cfg.n_heads
    n = rt.cfg.n_layers if attention == "encoder" else rt.cfg.n_decoder_layers
    Tq, Tk = (S, S) if attention == "encoder" else (T, T) if attention == "decoder" else (T, S)
    first, last = (int(i) for i in layers)
    if not 0 <= first <= last < n:
        raise InputError(f"layers {list(layers)}: the {attention} attention has layers 0..{n - 1}, first <= last")
    for name, positions, count in (("queries", queries, Tq), ("keys", keys, Tk), ("heads", heads or (), H)):
        if any(not 0 <= int(p) < count for p in positions):
            raise InputError(f"{name} {list(positions)}: the {attention} attention's {name} are 0..{count - 1}")
    base = iv.trace(enc, dec)
    edits = knockout(range(first, last + 1), queries, keys, H, Tq, Tk, site=site, stack=stack, only=heads)
    out = iv.run(enc, dec, [edits])

    def prediction(logits, logprobs, hidden) -> Prediction:
        return Prediction(logits, [None] + np.asarray(logprobs[1:], float).tolist(),
                          rt.vocabulary.top_tokens(logits, top_k), hidden)
    before = prediction(base.logits, base.token_logprobs, base.hidden)
    after = prediction(out["next_token_logits"][0], out["token_logprobs"][0], out["hidden"][0])
    return Knockout(dec.tokens, before, after, (first, last), time.perf_counter() - t0)


@dataclass(frozen=True)
class EncoderDecoderPatching(Patching):
    """Patching's answer for an encoder-decoder: which attention's heads were patched (the site is their output,
    head_output or cross_head_output, in `stack`); the positions are the source's (encoder) or the decoder's."""
    attention: Attention = "cross"
    stack: str = "decoder"

    @property
    def hook(self) -> str:
        """The hook of the patched site, its layer left as a field: decoder.blocks.{layer}.cross_attn.hook_z."""
        return f"{self.stack}." + HOOKS[self.site]


def patch(rt: EncoderDecoderRuntime, clean: tuple[Encoding, Encoding], corrupt: tuple[Encoding, Encoding],
          metric: Metric, *, site: str = "head_output", attention: Attention = "cross", per_position: bool = False,
          direction: Direction = "denoise", batch: int | None = None, progress=None,
          stop=None) -> EncoderDecoderPatching:
    """Activation patching (runtime/patching.patch's, for an encoder-decoder): every (layer, head) -- every (layer,
    head, position) with per_position -- of `attention`'s head outputs (hook_z: encoder or decoder self-attention, or
    the cross-attention) between the two runs, each a (source, decoder text) pair of the same token counts, in
    `direction`; the metric read at the decoder's last position. progress(runs done, runs); stop() between batches."""
    if site != "head_output":
        raise InputError(f"site {site!r}: an encoder-decoder patches head outputs (head_output)")
    name, stack = site_of(attention, site)
    (ce, cd), (ke, kd) = clean, corrupt
    if (len(ce.ids), len(cd.ids)) != (len(ke.ids), len(kd.ids)):
        raise InputError(f"clean and corrupt must have the same token counts: clean has {len(ce.ids)} source and "
                         f"{len(cd.ids)} decoder tokens, corrupt {len(ke.ids)} and {len(kd.ids)}")
    t0 = time.perf_counter()
    iv = EncoderDecoderInterventions(rt) if batch is None else EncoderDecoderInterventions(rt, batch)
    traces = {"clean": iv.trace(ce, cd), "corrupt": iv.trace(ke, kd)}
    base, source = (traces["corrupt"], traces["clean"]) if direction == "denoise" else \
        (traces["clean"], traces["corrupt"])
    z = source.head_output[attention]                                         # [L, H, Tq, dh]
    L, H, Tq = z.shape[:3]
    cells = [(l, h, t) for l in range(L) for h in range(H) for t in (range(Tq) if per_position else (None,))]
    rows = []
    for l, h, t in cells:
        where = np.zeros((H, Tq), bool)
        where[h, slice(None) if t is None else t] = True
        rows.append([Edit(name, l, where, z[l], stack)])
    enc, dec = (base.encoding, base.decoder_encoding)
    logits = iv.run(enc, dec, rows, progress=progress, stop=stop)["next_token_logits"]
    patched = metric(logits).reshape((L, H, Tq) if per_position else (L, H))
    c, k = (float(metric(traces[n].logits)) for n in ("clean", "corrupt"))
    tokens = (ce if attention == "encoder" else cd).tokens
    return EncoderDecoderPatching(tokens, name, direction, metric, c, k, patched, recovery(patched, c, k),
                                  time.perf_counter() - t0, attention, stack)
