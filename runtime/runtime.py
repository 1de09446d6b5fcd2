"""Text in, attention out: one model, its vocabulary, its masks and its onnxruntime sessions (or the NumPy reference).

    rt = load("minilm")                       # or Runtime(sources.get("minilm"), cache_dir=...)
    res = rt("The cat sat on the mat.")       # one text -> one AttentionResult
    res.tokens, res.attentions                # [L, H, T, T], rows sum to 1
    res.summary()["previous_token_mass"]      # [L, H]

The ONNX graph is built from the NumPy model on first use and cached on disk (graphs/cache.py, in `cache_dir`, which
the caller chooses). Texts too long for the stacked graph run layer by layer (runtime/layerwise.py).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..model.precision import COMPUTE, MASKED
from ..graphs.cache import GraphCache
from ..graphs.decoding import packs
from ..graphs.reduced import compute_key
from ..model import transformer as T_
from ..sources import ModelSpec, get
from ..sources.store import fingerprint
from .errors import InputError
from .capabilities import STACKED_MB, WORK_TFLOP, Capabilities, memory_total
from .layerwise import Layerwise, Want
from .options import GROUP_MB, check_compute_dtype, check_providers, default_providers, device_of, open_session
from .results import AttentionResult, Encoding, Engine, NextToken, one_block
from .sessions import Session
from .tensors import PREPACK_MB, RESERVE, Weights
from .tokenizing import Vocabulary

DEFAULT_CACHE = Path.home() / ".cache" / "attnscope"
STOP_EARLY_MB = 1024   # a server's stop_early_mb (ATTNSCOPE_STOP_EARLY_MB), and a corpus worker's
log = logging.getLogger("attnscope")


class Runtime:
    """One model, its tokenizer, and its onnxruntime sessions (built lazily, shared across threads)."""

    def __init__(self, spec: ModelSpec, providers: Sequence[str] | None = None, threads: int = 0,
                 cache_dir: str | Path = DEFAULT_CACHE, stop_early_mb: float = 0, memory_mb: float | None = None,
                 work_tflop: float = WORK_TFLOP, compute_dtype: str = "float32", stacked_mb: float = STACKED_MB,
                 prepack_mb: float = PREPACK_MB):
        """stop_early_mb: what the graphs that stop early (depth_for) may hold; 0: runs always go to the end.
        memory_mb: the memory budget its capabilities are decided against (None: 85 % of this machine's);
        work_tflop: what one request's analysis may cost (runtime/capabilities.py); compute_dtype: what the matrix
        products of every session run in (model/precision.py): "float32" exact, or a fast mode, "float16" (the CPU or
        CUDA provider), "bfloat16" or "tf32" (CUDA only; refused with a ValueError elsewhere), labelled in every
        answer, its error against float32 measured by bench/precision.py and bench/gpu.py.
        stacked_mb: the most a stacked run's attention output may hold (the planner's ATTNSCOPE_LAYERWISE_MB, whose
        default it shares: a Runtime made outside the app prices its features as the server does): with the token
        limit, the longest text the stages graph runs, which its capability is priced at; 0: the token limit.
        prepack_mb: how much of its float32 product weights the served graph and its cut graphs may open as
        initializers that onnxruntime prepacks, all sessions together (a copy each: Weights.prepacks); 0: none."""
        self.spec = spec
        self.cache_dir = Path(cache_dir)
        self.providers = list(providers) if providers else default_providers()
        check_compute_dtype(compute_dtype, self.providers)    # before the weights load: a bad option fails at once
        self.compute_dtype = compute_dtype
        self.model = spec.load_model(self.cache_dir)
        self.cfg: T_.TransformerConfig = self.model.cfg
        self.vocabulary = Vocabulary(spec.load_tokenizer(self.cache_dir), spec.id, spec.max_tokens, spec.pair,
                                     self.cfg.vocab_size)
        self.generation = spec.load_generation(self.cache_dir) if self.cfg.lm_head else None   # end-of-text ids, chat template
        self.graphs = GraphCache(self.cache_dir, spec.id, self.model)
        self.weights = Weights(self.model, device_of(self.providers))   # bound by every session's runs
        self.weights.prepack_bytes = int(prepack_mb * 2**20)
        memory = memory_total() * 0.85 if memory_mb is None else memory_mb * 2**20
        tokens = spec.max_tokens
        if stacked_mb:
            cfg = self.cfg
            tokens = min(tokens, int((stacked_mb * 2**20 / (cfg.n_layers * cfg.n_heads * COMPUTE.itemsize)) ** 0.5))
        self.capabilities = Capabilities.of(self.model, memory, work_tflop * 1e12, spec.source, tokens,
                                            compute_dtype, max_tokens=spec.max_tokens)
        self.threads = threads
        self.stop_early_mb = stop_early_mb
        self._sessions: dict[bool | str, object] = {}
        self._lock = threading.Lock()
        self._layerwise = None

    def with_compute_dtype(self, compute_dtype: str) -> Runtime:
        """This model with its matrix products in `compute_dtype` (model/precision.py): a Runtime that shares its
        weights, vocabulary and graph cache (nothing loaded twice) and opens its own sessions, in that mode; itself
        when the mode is its own. ValueError for a mode its providers cannot run."""
        if compute_dtype == self.compute_dtype:
            return self
        check_compute_dtype(compute_dtype, self.providers)
        other = copy.copy(self)
        other.__dict__.pop("key", None)                      # a cached_property: the mode is part of it
        other.compute_dtype = compute_dtype
        other.capabilities = replace(self.capabilities, precision=replace(self.capabilities.precision,
                                                                          compute=compute_dtype))
        other._sessions, other._lock, other._layerwise = {}, threading.Lock(), None
        return other

    @property
    def tokenizer(self):
        return self.vocabulary.tokenizer

    @property
    def provider(self) -> str:
        """The execution provider the served graph runs on."""
        return self.session().get_providers()[0]

    def __call__(self, text: str, pair: str | None = None, **options) -> AttentionResult:
        """One text (or sentence pair) -> its result; options as in `run`."""
        return self.run([text], [pair], **options)[0]

    # ---- tokens (runtime/tokenizing.py) -----------------------------------------------------------------
    def encode(self, text: str, pair: str | None = None) -> Encoding:
        return self.vocabulary.encode(text, pair)

    def encode_ids(self, ids: Sequence[int]) -> Encoding:
        return self.vocabulary.encode_ids(ids)

    def special_ids(self) -> list[int]:
        return self.vocabulary.special_ids()

    def token_string(self, token_id: int) -> str:
        return self.vocabulary.token_string(token_id)

    def top_tokens(self, logits: np.ndarray, k: int) -> list[NextToken]:
        return self.vocabulary.top_tokens(logits, k)

    # ---- masks ------------------------------------------------------------------------------
    def build_mask(self, lengths: Sequence[int], causal: bool,
                   mask_tokens: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """One additive mask [B, 1, T, T]: padding + (causal) + user-masked keys.

        A masked key is hidden from every query but itself, so each query keeps at least one key
        (the causal first token would otherwise have none and its row would be undefined).
        """
        B, T = len(lengths), max(lengths)
        mask = np.zeros((B, 1, T, T), COMPUTE)                   # the graph's input: nothing else [T, T] is made
        if causal:                                               # key j > i hidden: row i of a [T, T] view (no copy)
            band = np.where(np.arange(2 * T - 1) > T - 1, MASKED, 0).astype(COMPUTE)    # of band[T-1-i : 2T-1-i]
            np.minimum(mask, sliding_window_view(band, T)[::-1], out=mask)
        for b, n in enumerate(lengths):
            mask[b, 0, :, n:] = MASKED                                                            # padding keys
            for j in (mask_tokens[b] or ()) if mask_tokens and b < len(mask_tokens) else ():
                if not 0 <= j < n:
                    raise InputError(f"mask_tokens index {j} is out of range: this text has {n} tokens "
                                     f"(0..{n - 1})")
                mask[b, 0, :, j] = MASKED
                mask[b, 0, j, j] = 0.0           # its own query still sees it (causal and padding never hide i, i)
        return mask

    # ---- running ----------------------------------------------------------------------------
    def feeds(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray, lengths: Sequence[int],
              head_mask: np.ndarray | None = None, head_mean: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The ONNX graph's inputs. Head mask defaults keep every head (head_mask 1, head_mean 0);
        given ones are [B|1, L, H] (see functional.ablate_heads)."""
        B, (L, H) = len(ids), (self.cfg.n_layers, self.cfg.n_heads)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.model.wtt is not None:
            feeds["token_type_ids"] = types
        for name, value, default in (("head_mask", head_mask, 1.0), ("head_mean", head_mean, 0.0)):
            if value is None:
                feeds[name] = np.full((B, L, H), default, COMPUTE)
                continue
            value = np.asarray(value, COMPUTE)
            if value.ndim != 3 or value.shape[1:] != (L, H) or value.shape[0] not in (1, B):
                raise InputError(f"{name} must be [texts, layers, heads] = [{B}, {L}, {H}]; got shape {value.shape}")
            feeds[name] = np.ascontiguousarray(np.broadcast_to(value, (B, L, H)))
        feeds["lengths"] = np.asarray(lengths, np.int64)
        return feeds

    def run(self, texts: str | Sequence[str], pairs: Sequence[str | None] | None = None, **options
            ) -> list[AttentionResult]:
        """Run a batch of texts (padded together) and return one trimmed result per text; options as in forward."""
        t0 = time.perf_counter()
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise InputError("no texts given")
        pairs = list(pairs) if pairs is not None else [None] * len(texts)
        if len(pairs) != len(texts):
            raise InputError(f"{len(pairs)} pairs for {len(texts)} texts: give one pair (or None) per text")
        return self.forward([self.encode(t, p) for t, p in zip(texts, pairs)], started=t0, **options)

    def forward(self, encs: Sequence[Encoding], *, causal: bool | None = None,
                mask_tokens: Sequence[Sequence[int]] | None = None, engine: Engine = "onnx", stages: bool = False,
                head_mask: np.ndarray | None = None, head_mean: np.ndarray | None = None, top_k: int = 10,
                want: Want | None = None, started: float | None = None) -> list[AttentionResult]:
        """Run encoded inputs (padded together).

        causal: apply the look-ahead mask (default: the model's own); mask_tokens: per text, token indices hidden as
        keys; engine: "onnx" (the served graph) or "numpy" (the reference); stages: the teaching intermediates too;
        head_mask, head_mean [B|1, L, H]: ablate heads (functional.ablate_heads, runtime/interventions.py); None
        keeps them all. Decoders with an LM head also give the top_k next tokens and every token's log-prob.
        want: what leaves the device (runtime/layerwise.Want, the layer-by-layer path's too): without its `ends`,
        the served graph's first blocks only run (depth_of), and the result has no hidden states or LM outputs, and
        attentions [depth, H, T, T] of which only want.layers' are fetched: the other blocks' are computed into
        scratch memory (on a GPU: left in device memory) and their slices left undefined, so only the asked layers
        of such a result may be read (the NumPy engine and stages run every layer, and fetch all)."""
        t0 = time.perf_counter() if started is None else started
        if engine not in ("onnx", "numpy"):
            raise InputError(f"engine must be 'onnx' or 'numpy'; got {engine!r}")
        causal = self.cfg.causal if causal is None else bool(causal)
        lengths = [len(e.ids) for e in encs]
        B, T = len(encs), max(lengths)
        ids, types = np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)
        for b, e in enumerate(encs):
            ids[b, :lengths[b]], types[b, :lengths[b]] = e.ids, e.type_ids
        mask = self.build_mask(lengths, causal, mask_tokens)
        feeds = self.feeds(ids, types, mask, lengths, head_mask, head_mean)   # checks the head mask's shape
        depth = self.depth_of(want) if engine == "onnx" and not stages else None
        layers = want.layers if depth is not None else None
        lm = list(T_.LM_OUTPUTS) if self.cfg.lm_head and depth is None else []

        if engine == "numpy":
            out = self.model(ids, types if self.model.wtt is not None else None, mask, stages=stages,
                             head_mask=head_mask, head_mean=head_mean, lengths=np.asarray(lengths))
            hidden, attn, st, provider = out.hidden, out.attentions, out.stages, "numpy"
            norms = out.value_norms
            lm_out = {name: getattr(out, name) for name in lm}
        else:
            sess = self.session(stages, depth=depth)
            axes = {"batch": B, "tokens": T, "layers": self.cfg.n_layers, "heads": self.cfg.n_heads}
            if depth is not None:    # one output per block, each written into its slice of the stacked attentions
                feeds = {name: feeds[name] for name in sess.input_names}
                kept = set(range(depth) if layers is None else layers)
                # pages of unasked blocks: untouched; one asked block: its own buffer, every slice of a [depth, ...]
                # view (one_block), so no fresh mapping of every block's size is faulted in (176 faults, 0.37 ms)
                attn = RESERVE.take((1 if len(kept) == 1 else depth, B, self.cfg.n_heads, T, T), COMPUTE)
                per_block = [n for n in sess.declared if not n.startswith("value_norms.")]
                # the asked blocks' attention and value norms written in place (the other blocks' norms stay 0,
                # never read), so the session fetches nothing of its own
                norms = np.zeros((depth, B, self.cfg.n_heads, T), COMPUTE)
                into = {n: attn[0 if len(kept) == 1 else i] for i, n in enumerate(per_block) if i in kept}
                into |= {f"value_norms.{i}": norms[i] for i in sorted(kept)}
                sess.run(per_block + [n for n in into if n not in per_block], feeds, axes=axes, into=into,
                         drop=[n for i, n in enumerate(per_block) if i not in kept])
                hidden, lm_out, st = None, {}, None
            else:
                names = ["hidden", "attentions"] + lm + (list(T_.STAGES) if stages else []) + [
                    n for n in sess.declared if n == "value_norms"]
                outs = dict(zip(names, sess.run(names, feeds, axes=axes)))
                hidden, attn, norms = outs.pop("hidden"), outs.pop("attentions"), outs.pop("value_norms", None)
                lm_out = {name: outs.pop(name) for name in lm}
                st = outs if stages else None
            provider = sess.get_providers()[0]
        seconds = time.perf_counter() - t0

        results = []
        for b, (e, n) in enumerate(zip(encs, lengths)):
            s = None
            if st is not None:
                s = {k: np.ascontiguousarray(v[:, b, ..., :n, :n] if k in T_.SQUARE_STAGES else v[:, b, ..., :n, :])
                     for k, v in st.items()}
            probs = np.ascontiguousarray(attn[:, b, :, :n, :n])
            if depth is not None and len(attn) == 1 < depth:     # the one asked block's buffer
                probs = one_block(probs[0], depth)
            results.append(AttentionResult(
                self.spec.id, engine, provider, causal, e, probs,
                None if hidden is None else np.ascontiguousarray(hidden[b, :n]), mask[b, 0, :n, :n].copy(),
                sorted(set(mask_tokens[b])) if mask_tokens and mask_tokens[b] else [], s, seconds,
                value_norms=None if norms is None else np.ascontiguousarray(norms[:, b, :, :n])))
            if lm_out:
                results[-1].next_token_logits = np.ascontiguousarray(lm_out["next_token_logits"][b])
                results[-1].next_tokens = self.vocabulary.top_tokens(lm_out["next_token_logits"][b], top_k)
                results[-1].token_logprobs = [None] + lm_out["token_logprobs"][b, 1:n].astype(float).tolist()
        return results

    # ---- graphs and sessions ------------------------------------------------------------------------------
    def cache_key(self) -> str:
        """Hash of the model's shapes and of the exporter's source (graphs/cache.py): either changing rebuilds the
        graph (which holds no weights)."""
        return self.graphs.key

    @functools.cached_property
    def key(self) -> str:
        """What determines this model's numbers: its graphs' key and its weights' fingerprint (sources/store.py).
        Results kept beyond a run (the result cache, ETags, circuits and corpus jobs on disk) are keyed by it; a fast
        mode's by its name too (and by its transform's source: compute_key)."""
        return hashlib.sha256(f"{self.graphs.key}:{fingerprint(self.weights.named)}"
                              f"{compute_key(self.compute_dtype)}".encode()).hexdigest()[:16]

    def cached_path(self, stages: bool = False) -> Path:
        return self.graphs.cached_path(stages)

    def onnx_path(self, stages: bool = False) -> Path:
        """The exported graph, building it (with a progress bar) if it is not cached yet or fails its checksum."""
        return self.graphs.path(stages)

    def session(self, stages: bool = False, decode: bool = False, depth: int | None = None):
        """The onnxruntime session (with or without teaching outputs, the decoding step of runtime/generation.py,
        or the graph that stops after `depth` blocks; opened on first use); a corrupt cached file is rebuilt. The
        stages graph allocates per run, without an arena: its peak is huge (four [L, H, T, T] outputs: two
        512-token runs at once would leave ~1.4 GB behind) and its runs are rare."""
        which = ("depth", depth) if depth else "decode" if decode else stages
        sess = self._sessions.get(which)
        if sess is not None:  # the common case takes no lock: building the other graph can take seconds
            return sess
        with self._lock:
            options = dict(arena=self.capabilities.arena and not stages, compute_dtype=self.compute_dtype,
                           packed=decode and packs(self.model),
                           prepack=not stages and not decode and self.compute_dtype == "float32",
                           optimized=self.graphs.folder)
            if depth and which not in self._sessions:
                self._sessions[which] = Session(self.graphs.stopping(depth), self.providers, self.threads,
                                                self.weights, **options)
            if which not in self._sessions:
                check_providers(self.providers)  # a bad option, not a corrupt file: never delete a good graph for it
                path = self.graphs.path(stages, decode)
                try:
                    self._sessions[which] = Session(path, self.providers, self.threads, self.weights, **options)
                except Exception as e:  # noqa: BLE001 - onnxruntime raises its own error types
                    if self.compute_dtype != "float32" and _opens(path):   # the file is good: the mode is not
                        raise ValueError(f"compute_dtype {self.compute_dtype!r}: onnxruntime cannot open "
                                         f"{path.name}'s {self.compute_dtype} form on {self.providers[0]} "
                                         f"({type(e).__name__}: {str(e)[:200]}); use float32 "
                                         f"(ATTNSCOPE_COMPUTE_DTYPE)") from e
                    log.warning("cached graph %s is unreadable (%s); rebuilding", path.name, type(e).__name__)
                    self.graphs.forget(path)
                    self._sessions[which] = Session(self.graphs.path(stages, decode), self.providers,
                                                    self.threads, self.weights, **options)
            return self._sessions[which]

    def depth_for(self, last_layer: int) -> int | None:
        """How many blocks a run needs for the attentions of layers <= last_layer: a power of two (a few graphs,
        each opened once and kept: ~log2 L of them), or all L (the last block's attention still needs no values, MLP,
        final norm, LM head or stacking copy); None: the whole model's graph (stop_early_mb 0 turns cut graphs off,
        and a model too big to run whole has none). A cut graph holds no weights (they are bound at each run), so the
        graphs cost no more than their runs' own memory, and a small model's prepacked copies of what each multiplies
        by, within ATTNSCOPE_PREPACK_MB (Weights.prepacks)."""
        if self.stop_early_mb <= 0 or not self.capabilities.stacked:
            return None
        return min(1 << last_layer.bit_length(), self.cfg.n_layers)

    def depth_of(self, want: Want | None) -> int | None:
        """The cut graph a run for `want` stops at: depth_for its last layer when it needs no ends (None: the whole
        model's graph)."""
        return None if want is None or want.ends or not want.layers else self.depth_for(max(want.layers))

    def depths(self) -> list[int]:
        """Every depth depth_for may answer: the cut graphs a server opens at start."""
        return sorted({d for d in (self.depth_for(layer) for layer in range(self.cfg.n_layers)) if d is not None})

    def prepare(self, checkpoint_every: int = 1, group_mb: float = GROUP_MB,
                step: Callable[[int, int, str], None] | None = None) -> list[str]:
        """Build and open, now, every graph this model's features run (a server calls it at start, so that no request
        builds one): the served graph, the teaching stages, the decoding step, the cut graphs, and the layer-by-layer
        graphs of long texts and of runs with edits; and the weights, on the device (on a GPU: copied there once, now,
        not in the first request). What the model's capabilities refuse (runtime/capabilities.py:
        decided from its size against the memory budget, before anything is built) is not built: its features are
        refused by the planner. A packed decoding step (graphs/decoding.packs) is built but opened by the first
        generation: its session's prepacked copy of the quantised weights (opened in 0.7 s for SmolLM2, 1.4 s for
        Gemma 3; a server's RSS 160 and 360 MB higher after its first generation, bench/quantized.py) is memory a
        server that never generates need not hold.
        step(done, total, name) after each step; returns the steps' names."""
        caps, todo = self.capabilities, [("the weights, copied to the GPU" if self.weights.device == "cuda" else
                                            "the weights, bound", self.weights.place)]
        if caps.stacked:
            todo.append(("served graph", lambda: self.session()))
            if caps.allows("stages"):
                todo.append(("stages graph", lambda: self.session(stages=True)))
            if self.cfg.lm_head:
                todo.append(("decoding graph", lambda: self.graphs.path(decode=True) if packs(self.model) else
                             self.session(decode=True)))
            todo += [(f"graph of the first {d} blocks", lambda d=d: self.session(depth=d)) for d in self.depths()]
        lw = self.layerwise(checkpoint_every, group_mb)
        for which in lw.needed():
            name = which if isinstance(which, str) else f"{which[0]} ({len(which[1])} outputs, " \
                                                            f"{'causal' if which[2] else 'bidirectional'})"
            todo.append((f"layer-by-layer {name}", lambda which=which: lw.session(which)))
        for n, (name, open_) in enumerate(todo):
            open_()
            if step:
                step(n + 1, len(todo), name)
        lw.opened = True
        return [name for name, _ in todo]

    def open_depths(self) -> list[int]:
        """The depths whose cut graphs are open."""
        return [which[1] for which in self._sessions if isinstance(which, tuple)]     # ("depth", d)

    def layerwise(self, checkpoint_every: int = 1, group_mb: float = GROUP_MB):
        """This model run layer by layer, for texts whose stacked attention is too big (runtime/layerwise.py)."""
        with self._lock:
            lw = self._layerwise
            if lw is None or (lw.every, lw.group_mb) != (checkpoint_every, group_mb):   # the same sessions
                self._layerwise = Layerwise(self, checkpoint_every, group_mb, graphs=lw)
            return self._layerwise


def _opens(path: Path) -> bool:
    """Whether onnxruntime opens this graph file as it is (float32, on the CPU)."""
    try:
        open_session(path, ["CPUExecutionProvider"], 1)
        return True
    except Exception:  # noqa: BLE001 - onnxruntime raises its own error types
        return False


def load(model_id: str, *, folder: str | Path | None = None, cache_dir: str | Path = DEFAULT_CACHE,
         providers: Sequence[str] | None = None, threads: int = 0, compute_dtype: str = "float32") -> Runtime:
    """A zoo model, ready to run: `load("minilm")("The cat sat.")`. `folder` overrides where its files come from;
    compute_dtype: "float32" (exact), or a fast mode (Runtime)."""
    return Runtime(get(model_id, None if folder is None else Path(folder)), providers, threads, cache_dir,
                   compute_dtype=compute_dtype)
