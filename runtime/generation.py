"""Generation, token by token: a key/value cache, sampling with temperature, top-k and top-p, heads knocked out in
every step, and each new token's attention row.

    gen = Generator(rt, rt.encode(prompt).ids, Sampling(temperature=0.8, top_k=50, seed=1), max_new_tokens=48)
    for token in gen:                 # one model step per token (the first also runs the prompt)
        token.id, token.text, token.probability, token.candidates, token.attention
    gen.stop_reason                   # "max_new_tokens", "eos", "stop" (a stop string) or "time"

A step runs the new token alone against the cached keys and values of every earlier position (graphs/decoding.py,
the ONNX form of model/decoding.py), so a token costs one position, not the whole text. The prompt runs through the
same graph in chunks whose attention stays within a byte budget. A token's attention row (the new token as the
query, every position so far as keys) comes from the step that runs it, so a token is handed out after that step.
Sampling follows transformers' order (temperature, then top-k, then top-p), in float64; `distributions` gives both
the model's own distribution and the one sampled from.

Under a cache policy (`policy`, model/kv_policies.py: streaming, h2o, snapkv) each step runs twice: under the policy
(its keys masked, positions unchanged) and with the full cache, fed the same tokens (the policy's); once while the
policy has hidden nothing (H2O's and SnapKV's prompt), the two caches then one. Two runs of one
row, not one run of two rows (about 1.2x faster a token on SmolLM2): onnxruntime's products are not bit-equal across
batch sizes, and this way a policy that keeps every key is plain generation bit for bit, and the full run is plain
generation of the same tokens. Each token then carries `kv_cache` (CacheView): what the policy did in the step that
chose it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..analysis.effects import log_softmax
from ..model.precision import COMPUTE
from ..graphs.decoding import cache_names
from ..model import decoding
from ..model.decoding import KeyMasks, KVCache, Step
from ..model.kv_policies import Eviction, Full
from ..model.masks import combine, to_additive
from .errors import InputError
from .options import GROUP_MB

CANDIDATES = 10   # alternatives reported per step


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. greedy: the most probable (temperature, top_k and top_p then only shape the
    reported distribution); otherwise drawn from softmax(logits / temperature) restricted to the top_k most
    probable tokens (0: all) and then to the fewest whose probability reaches top_p (1: all)."""
    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not self.temperature > 0:
            raise InputError(f"temperature must be > 0; got {self.temperature} (for the most probable token, ask "
                             "for greedy)")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1]; got {self.top_p}")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0 (0: off); got {self.top_k}")


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def distributions(logits: np.ndarray, sampling: Sampling) -> tuple[np.ndarray, np.ndarray]:
    """The model's next-token distribution p = softmax(logits), and q, the one sampled from: logits / temperature,
    every token below the top_k-th logit removed (ties kept), then every token outside the most probable ones whose
    cumulative probability first reaches top_p (at least one kept), renormalised. Both float64 [V]."""
    z = np.asarray(logits, np.float64)
    p = _softmax(z)
    with np.errstate(over="ignore"):
        z = (z - z.max()) / sampling.temperature                   # shifted first: a tiny temperature gives -inf, not nan
    if 0 < sampling.top_k < len(z):
        z = np.where(z < np.partition(z, -sampling.top_k)[-sampling.top_k], -np.inf, z)
    if sampling.top_p < 1:
        order = np.argsort(z, kind="stable")                       # ascending, as transformers' TopPLogitsWarper
        cumulative = np.cumsum(_softmax(z[order]))
        remove = cumulative <= 1 - sampling.top_p
        remove[-1] = False                                         # the most probable token always stays
        z[order[remove]] = -np.inf
    return p, _softmax(z)


@dataclass
class Candidate:
    id: int
    token: str
    probability: float            # the model's own
    sampling_probability: float   # after temperature, top-k and top-p


@dataclass
class CacheView:
    """A cache policy in the step that chose a token (the query one position before it): the keys that query saw per
    layer and key/value head (kept [L, Hkv]) and the positions evicted since the previous token's (evicted, per layer
    and key/value head), the next-token distributions under the policy (p) and the full cache (f): kl = KL(f || p) in
    nats, top1 (their most probable tokens agree), full_probability (f of the chosen token), full_top (f's most
    probable token), and each head's output change ||z_p - z_f|| / ||z_f|| [L, H] (z: hook_z at that query)."""
    kept: np.ndarray
    evicted: list
    kl: float
    top1: bool
    full_probability: float
    full_top: int
    head_change: np.ndarray


def compare(visible: np.ndarray, before: np.ndarray, logits: np.ndarray, full: np.ndarray, z: np.ndarray,
            z_full: np.ndarray, token: int) -> CacheView:
    """CacheView of a step: visible [L, Hkv, S] the keys its query saw, before [L, Hkv, S' <= S] the previous
    query's (positions past S' are new), the two rows' logits [V] and head outputs [L, H, dh]."""
    fresh = np.ones(visible.shape[:2] + (visible.shape[2] - before.shape[2],), bool)
    gone = ~visible & np.concatenate([before, fresh], axis=2)
    evicted = [[np.flatnonzero(head).tolist() for head in layer] for layer in gone]
    lp, lf = log_softmax(logits), log_softmax(full)
    f = np.exp(lf)
    dz = np.linalg.norm(np.asarray(z, np.float64) - z_full, axis=-1)
    norm = np.linalg.norm(np.asarray(z_full, np.float64), axis=-1)
    change = np.divide(dz, norm, out=np.zeros_like(dz), where=norm > 0)
    return CacheView(visible.sum(-1), evicted, float(max((f * (lf - lp)).sum(), 0.0)),
                     int(np.argmax(logits)) == int(np.argmax(full)), float(f[token]), int(np.argmax(full)), change)


@dataclass
class Generated:
    """One new token: its position in the sequence, id, text as a person reads it, probability under the model and
    under the sampling distribution, the step's most probable candidates, and its attention row over every
    position so far [layers asked, heads asked, index + 1] (None when none were asked)."""
    index: int
    id: int
    token: str
    probability: float
    sampling_probability: float
    candidates: list[Candidate]
    attention: np.ndarray | None = None
    kv_cache: CacheView | None = None


def decode(rt, ids: np.ndarray, cache: KVCache, keep: np.ndarray, engine: str = "onnx",
           masks: KeyMasks | None = None) -> Step:
    """One decoding step of the runtime's model: ids [B, t] after cache's tokens (model/decoding.py's decode, through
    the ONNX graph unless engine is "numpy"), under a cache policy's masks where given (then with each key's attention
    received and the last token's head outputs). Through the graph, the grown cache is left where the session
    computes (runtime/tensors.Held: a GPU's memory), and only the logits, attention rows (and those) come to the host."""
    if engine == "numpy":
        return decoding.decode(rt.model, ids, cache, keep, masks)
    cfg, B, t, P = rt.cfg, *ids.shape, cache.length
    policy, masks = masks is not None, KeyMasks.plain(cfg, B, t, P) if masks is None else masks
    feeds = {"input_ids": np.ascontiguousarray(ids, np.int64), "head_mask": np.ascontiguousarray(keep, COMPUTE),
             "attention_mask": np.ascontiguousarray(masks.attention, COMPUTE),
             "key_mask": np.ascontiguousarray(masks.keys, COMPUTE), "votes": np.ascontiguousarray(masks.votes, COMPUTE)}
    names, present = ["next_token_logits", "attentions"] + (["received", "head_outputs"] if policy else []), []
    for layer in range(cfg.n_layers):
        past_k, past_v, present_k, present_v = cache_names(layer)
        feeds[past_k], feeds[past_v] = cache.keys[layer], cache.values[layer]
        present += [present_k, present_v]
    out = rt.session(decode=True).run(names + present, feeds, axes={"batch": B, "keys": P + t}, keep=present)
    n = len(names)                                                  # the cache stays on the device (Held)
    return Step(out[0], out[1], KVCache(out[n::2], out[n + 1::2]), *(out[2:4] if policy else ()))


@dataclass
class Generator:
    """Tokens after `ids`, one model step per token (see the module docstring). keep [1, L, H]: 0 knocks a head out
    (its output is zero) in the prompt's run and every step; layers, heads: whose attention rows each token carries;
    stop: texts that end the generation once the continuation contains one; deadline: time.monotonic() past which
    no further step runs; chunk_bytes: the prompt runs in chunks whose attention (heads x chunk x tokens float32)
    stays within it; policy: a cache policy (model/kv_policies.py; None or Full: the full cache, one run a step);
    forced: tokens taken in order instead of chosen (teacher forcing: a given answer's probability, token by token,
    bench/kv_policies.py), the generation's own choices after them."""
    rt: object
    ids: list[int]
    sampling: Sampling
    max_new_tokens: int
    keep: np.ndarray | None = None
    stop: tuple[str, ...] = ()
    layers: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()
    deadline: float | None = None
    chunk_bytes: int = GROUP_MB * 2**20
    engine: str = "onnx"
    policy: object = None
    forced: tuple[int, ...] = ()
    new_ids: list[int] = field(default_factory=list)
    views: list[CacheView] = field(default_factory=list)     # under a policy: each token's CacheView
    stop_reason: str | None = None

    def __post_init__(self):
        cfg = self.rt.cfg
        if not (cfg.causal and cfg.lm_head):
            raise InputError(f"{self.rt.spec.id} does not generate text: it is not a decoder with an LM head")
        if not self.ids:
            raise InputError("the prompt has no tokens")
        self.keep = np.ones((1, cfg.n_layers, cfg.n_heads), COMPUTE) if self.keep is None else self.keep
        full = self.policy is None or isinstance(self.policy, Full)
        self._eviction = None if full else Eviction(self.policy, cfg.n_layers, cfg.n_kv_heads, len(self.ids))
        self._view = self._before = None
        self._rng = np.random.default_rng(self.sampling.seed)
        self._cache: KVCache | None = None
        self._logits: np.ndarray | None = None
        self._eos = set(self.rt.generation.eos_ids) if self.rt.generation else set()

    def __iter__(self):
        return self

    def _step(self, ids: list[int]) -> Step:
        t, start = len(ids), self._cache.length
        if self._eviction is None:
            step = decode(self.rt, np.array([ids], np.int64), self._cache, self.keep, self.engine)
            self._cache, self._logits = step.cache, step.logits[0]
            return step
        hidden, kept, votes = self._eviction.masks(t, start)
        masks = KeyMasks.plain(self.rt.cfg, 1, t, start)
        same = self._full is self._cache and not hidden.any() and kept.all()   # nothing evicted yet: one run
        masks.attention[0, 0] = combine(masks.attention[0, 0], hidden)
        masks.keys[0], masks.votes[0] = to_additive(~kept), votes
        step = decode(self.rt, np.array([ids], np.int64), self._cache, self.keep, self.engine, masks)
        full = step if same else decode(self.rt, np.array([ids], np.int64), self._full, self.keep, self.engine,
                                        KeyMasks.plain(self.rt.cfg, 1, t, start))
        self._cache, self._full, self._logits = step.cache, full.cache, step.logits[0]
        # what the step's last query saw, then the policy's eviction
        self._view = (kept & ~hidden[-1], full.logits[0], step.head_outputs[:, 0], full.head_outputs[:, 0])
        self._eviction.observe(step.received[:, 0])
        return step

    def prefill(self) -> None:
        """Run the prompt (in chunks), filling the cache; the first token is chosen from its last logits."""
        cfg = self.rt.cfg
        self._cache = self._full = KVCache.empty(cfg)
        chunk = max(1, int(self.chunk_bytes // (cfg.n_heads * len(self.ids) * COMPUTE.itemsize)))
        for start in range(0, len(self.ids), chunk):
            self._step(self.ids[start:start + chunk])

    def __next__(self) -> Generated:
        if self.stop_reason is not None:
            raise StopIteration
        if self._cache is None:
            self.prefill()
        p, q = distributions(self._logits, self.sampling)
        if len(self.new_ids) < len(self.forced):
            token = int(self.forced[len(self.new_ids)])
        elif self.sampling.greedy:
            token = int(np.argmax(self._logits))
        else:
            cdf = np.cumsum(q)
            token = min(int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right")), len(q) - 1)
        k = min(CANDIDATES, len(p))
        top = np.argpartition(-p, k - 1)[:k]
        top = top[np.argsort(-p[top], kind="stable")]                   # the most probable, in order
        candidates = [Candidate(int(i), self.rt.token_string(int(i)), float(p[i]), float(q[i])) for i in top]
        view = None
        if self._eviction is not None:
            visible, full, z, z_full = self._view
            before = self._before if self._before is not None else np.zeros(visible.shape[:2] + (0,), bool)
            view, self._before = compare(visible, before, self._logits, full, z, z_full, token), visible
            self.views.append(view)
        step = self._step([token])
        self.new_ids.append(token)
        rows = None
        if self.layers and self.heads:
            rows = step.attentions[np.ix_(list(self.layers), [0], list(self.heads))][:, 0]   # [layers, heads, keys]
        out = Generated(len(self.ids) + len(self.new_ids) - 1, token, self.rt.token_string(token), float(p[token]),
                        float(q[token]), candidates, rows, view)
        self.stop_reason = self._stopped(token)
        return out

    def _stopped(self, token: int) -> str | None:
        if token in self._eos:
            return "eos"
        if self.stop and any(s in self.text for s in self.stop):
            return "stop"
        if len(self.new_ids) >= self.max_new_tokens:
            return "max_new_tokens"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "time"
        return None

    @property
    def text(self) -> str:
        """The continuation so far, decoded."""
        return self.rt.tokenizer.decode(self.new_ids, skip_special_tokens=False)
