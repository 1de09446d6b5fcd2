"""What a served model's size allows on this machine, decided once when it loads, from its weights and the server's
memory budget, and what its kind and family allow: the one record the runtime, the planner (a feature that cannot fit
answers 422 naming the limit, before any work, never an out-of-memory kill) and the page (`/api/models`) read. Its
features are what the model can do, by the API's names; which of them each of the page's views needs is the page's
(app/pages.py VIEW_NEEDS).

    caps = Capabilities.of(model, memory_bytes=20 * 2**30, work_flop=4e12)
    caps.stacked          # one run holds the whole model (else every request runs layer by layer)
    caps.refusal("circuits")   # None, or the sentence that names the limit

The numbers, measured on a 2-core, 24 GB machine (bench/big_models.py): a model's weights stay in their file and
are paged in as a run reads them (sources/store.py), so a run of the whole model holds every page of its weights,
plus the float32 copy of the one weight being widened, plus its activations. A layer-by-layer run holds one layer's
pages at a time when the model is too big for that (`release`). The NumPy reference holds every page too. Weight-space
circuits and importance over all heads are priced in floating-point operations against `work_flop`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..model.precision import COMPUTE, Precision
from ..model.transformer import SQUARE_STAGES
from ..model.weights import state_dict

SHARE = 0.45            # of the memory budget one model's weights may take and still run whole (or in NumPy)
SMALL = 1 << 30         # weights up to this many bytes keep onnxruntime's memory arenas (faster; an arena keeps its
#                         peak for good, which for a big model is GBs of widened weights: Capabilities.arena)
SIZE = ("stacked", "numpy", "circuits", "importance", "stages")   # what the weights' size and the work allow here
# What the model's kind and family allow: summary (what /api/attention computes from one stack's run besides its
# attention: the registry's statistics, scores, entropy, thumbnails, masks, ablations), lens (/api/lens), why
# (/api/qk), head_lens (/api/lens's head_lens), attribution (direct logit attribution), patching, knockout,
# predictions (next tokens), generate, jobs (corpus jobs). One entry each in the record, a feature the model cannot do
# with its one short reason (`short`).
KIND = ("summary", "lens", "why", "head_lens", "attribution", "patching", "knockout", "predictions", "generate", "jobs")
FEATURES = SIZE + KIND
# The features of a family that make a decomposition inexact (analyses/checks.py decomposable names them at length; the record
# in a few words): (the config field, its short name).
BENDS = {"qk_norm": "QK-norm", "attn_softcap": "attention soft-capping", "output_norms": "post-norms",
         "final_softcap": "final logit soft-capping"}
WORK_TFLOP = 4.0        # what one request's analysis may cost by default (ATTNSCOPE_WORK_TFLOP)
STACKED_MB = 256        # what a stacked run's attention output may hold by default (ATTNSCOPE_LAYERWISE_MB): with the
#                         token limit, the longest text the stages graph runs, which its capability is priced at


@dataclass(frozen=True)
class Capabilities:
    parameters: int                       # the weights' count
    stored_bytes: int                     # as stored (the checkpoint's own type)
    compute_bytes: int                    # the same in the compute type (float32)
    precision: Precision
    memory_bytes: int                     # the budget it was decided against
    long_tokens: int = 0                  # the longest text one run of its attention fits here (0: not priced)
    reasons: dict[str, str] = field(default_factory=dict)   # a feature it lacks -> why, naming the limit
    short: dict[str, str] = field(default_factory=dict)     # every feature it lacks, in a few words

    @property
    def stacked(self) -> bool:
        """One run may hold the whole model: the stacked graph, its cut and stages variants, the decoding graph."""
        return "stacked" not in self.reasons

    @property
    def release(self) -> bool:
        """A layer-by-layer run gives each layer's weight pages back when it is done with them."""
        return not self.stacked

    @property
    def arena(self) -> bool:
        """Its stacked sessions keep memory arenas: a small model's, and a big one's whose runs convert no weight (its
        weights stored and multiplied in float32, or multiplied in their blocks: MatMulNBits de-quantises one product's
        weight at a time). An arena keeps its peak for good, which for a big model whose weights a run widens
        (bfloat16, float16) or narrows (a reduced compute type) is GBs of converted weights: those runs allocate as they
        go and give it back. Without an arena every buffer of a run comes from the C allocator, whose heap outgrew the
        arena's peak (an 8B Q4_K_M served whole: peak RSS 7.1-7.4 GB without, 6.2-6.6 GB with, at the same speed:
        bench/quantized.py --l8b). The layer-by-layer sessions keep one either way
        (runtime/layerwise.Layerwise.session)."""
        return self.stored_bytes <= SMALL or (self.precision.storage == "float32" and not self.precision.reduced)

    @property
    def widened(self) -> bool:
        """Whether runs that multiply by every layer's weights many times (a patching request's batches of rows,
        runtime/interventions.py) run the layer graphs' wide forms, which read each weight whole in float32, widened
        once per layer for all of them (runtime/tensors.Weights.widening): a model stored in bfloat16 or float16, and
        one kept in quantised blocks whose float32 weights fit the budget beside its own. MatMulNBits, the blocks'
        product, de-quantises its weight a block at a time in every run: a SmolLM2 Q4_1 product of 126 rows (9 heads'
        rows of a 14-token pair) took 9.9 ms against 3.1 ms with float32 weights (bench/matmulnbits.py --tokens 126
        --k 576 --n 1536, one core), and the blocks' products were 9.5 s of patching its 270 heads' 13 s."""
        if self.precision.storage != "float32":
            return True
        return self.stored_bytes < self.compute_bytes <= SHARE * self.memory_bytes - self.stored_bytes

    def allows(self, feature: str) -> bool:
        return feature not in self.reasons and feature not in self.short

    def refusal(self, feature: str) -> str | None:
        return self.reasons.get(feature)

    def record(self) -> dict:
        """The API's form (/api/models): sizes, the storage type, and each feature with its reason when refused (at
        length for the size features, in `reasons`; in a few words for every refused feature, in `short`)."""
        return {"parameters": self.parameters, "weights_bytes": self.stored_bytes, "dtype": self.precision.storage,
                "compute_dtype": self.precision.compute, "memory_budget_bytes": self.memory_bytes,
                "longest_text_tokens": self.long_tokens or None,
                "features": {f: self.allows(f) for f in FEATURES}, "reasons": dict(self.reasons),
                "short": {f: self.short[f] for f in FEATURES if f in self.short}}

    @classmethod
    def of(cls, model, memory_bytes: int, work_flop: float, source: str = "zoo",
           stages_tokens: int | None = None, compute_dtype: str = "float32", max_tokens: int | None = None
           ) -> Capabilities:
        """source: where the model came from (sources/): corpus jobs build zoo models only. stages_tokens: the most
        tokens a run of the stages graph takes (the planner's limit); None: the stages graph is priced at the
        model's positions. compute_dtype: what its sessions' matrix products run in (model/precision.py). max_tokens:
        the longest text it reads (its spec's limit): `long_tokens` is the most of those one run fits (long_tokens)."""
        weights = list(state_dict(model).values())
        n = sum(int(w.size) for w in weights)
        stored = sum(int(w.nbytes) for w in weights)
        caps = cls(n, stored, n * COMPUTE.itemsize, Precision.of(weights, compute_dtype), int(memory_bytes))
        reasons = caps.reasons
        gb = lambda b: f"{b / 2**30:.1f} GB"   # noqa: E731
        whole = f"its weights are {gb(stored)} ({caps.precision.storage})"
        limit = f"{SHARE:.0%} of the {gb(memory_bytes)} memory budget (ATTNSCOPE_MEMORY_MB)"
        if stored > SHARE * memory_bytes:
            reasons["stacked"] = (f"{whole}, more than {limit} one run may hold: every request runs layer by layer, "
                                  f"each layer's weights read when it runs")
            reasons["numpy"] = f"the NumPy reference holds every weight at once, and {whole}, more than {limit}"
        cfg = getattr(model, "cfg", None)
        if cfg is not None and hasattr(model, "blocks"):
            flop = circuits_flop(cfg)
            if flop > work_flop:
                reasons["circuits"] = (f"weight-space circuits compare every pair of its {cfg.n_layers * cfg.n_heads} "
                                       f"heads: ~{flop / 1e12:.0f} TFLOP, above the {work_flop / 1e12:g} TFLOP a "
                                       f"request may take (ATTNSCOPE_WORK_TFLOP)")
            flop = importance_flop(cfg, n)
            if flop > work_flop:
                reasons["importance"] = (f"importance knocks out each of its {cfg.n_layers * cfg.n_heads} heads in "
                                         f"turn (a forward pass from the head's layer each): ~{flop / 1e12:.0f} TFLOP "
                                         f"for 64 tokens, above the {work_flop / 1e12:g} TFLOP a request may take "
                                         f"(ATTNSCOPE_WORK_TFLOP); patch chosen heads instead (/api/patching)")
            T = stages_tokens or cfg.max_positions
            peak = stages_bytes(cfg, T)
            if "stacked" in reasons:
                reasons["stages"] = ("the stages of a head come from the graph that runs every layer at once, and "
                                     + reasons["stacked"].split(":")[0])
            elif stored + peak > memory_bytes:
                reasons["stages"] = (f"a run of the stages graph at {T} tokens holds ~{gb(peak)} (every layer's scores, "
                                     f"scaled and masked scores and probabilities"
                                     f"{', and the logits over the vocabulary' if cfg.lm_head else ''}) besides "
                                     f"{whole}: more than the {gb(memory_bytes)} memory budget (ATTNSCOPE_MEMORY_MB); "
                                     f"its graph is not built")
            if max_tokens:
                blocks = sum(int(a.size) for name, a in state_dict(model).items() if name.startswith("blocks."))
                caps = replace(caps, long_tokens=long_tokens(cfg, blocks, max_tokens, memory_bytes - (
                    0 if "stacked" in reasons else stored), work_flop))
        caps.short.update(_kind(model, source, reasons))
        return caps


def inexact(cfg, qk: bool = False, scores: bool = False, direct: bool = False, logits: bool = False) -> list[str]:
    """The config fields (BENDS) of a family that make a decomposition inexact: qk, a score split bilinearly into
    stream components (QK-norm puts a norm between them); scores, that split of the score itself (attention
    soft-capping bends it after); direct, a head's output read as its direct share of the stream (post-norms normalise
    it before it joins); logits, direct effects summed on a logit (final soft-capping bends it)."""
    asked = {"qk_norm": qk, "attn_softcap": scores, "output_norms": direct, "final_softcap": logits}
    return [f for f in BENDS if asked[f] and getattr(cfg, f, None)]


def _kind(model, source: str, reasons: dict[str, str]) -> dict[str, str]:
    """Each feature of its kind and family (KIND, and circuits, importance and stages) the model cannot do, with one
    short reason; the size reasons in few words too."""
    short: dict[str, str] = {}

    def refuse(features, why):
        for f in features:
            short.setdefault(f, why)

    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(model, "blocks"):          # an encoder-decoder: two stacks and cross-attention
        refuse(["summary", "lens", "circuits", "why", "head_lens", "attribution", "generate", "jobs", "importance"],
               "an encoder-decoder: Head, Lines and Steps show its three attentions")
        if not getattr(cfg, "lm_head", True):
            refuse(["predictions", "patching", "knockout"], "no LM head: it predicts no token")
        return short
    if "stacked" in reasons:
        refuse(["stages", "why", "lens", "head_lens", "attribution", "patching", "knockout", "generate"],
               "too big to run whole on this machine: it runs layer by layer")
    if "numpy" in reasons:
        refuse(["numpy"], "too big for the NumPy reference on this machine")
    if not cfg.lm_head:
        why = "an encoder: it predicts no next token" if not cfg.causal else "no LM head: it predicts no next token"
        refuse(["predictions", "generate", "patching", "knockout", "attribution"], why)
    if not cfg.has_unembedding:
        refuse(["lens", "head_lens"], "no unembedding: no tokens can be read out of its stream")
    if not cfg.lm_head:
        # a decoder whose tied embeddings read tokens out of its stream (tiny-gpt) still predicts no next token: its
        # logit lens would show each token predicting itself (p = 1), so the page offers none (the Logit lens tab)
        refuse(["lens"], why)
    bends = lambda **k: f"not exact with {' and '.join(BENDS[f] for f in inexact(cfg, **k))}"   # noqa: E731
    for feature, asked in (("why", {"qk": True, "scores": True, "direct": True}), ("head_lens", {"direct": True}),
                           ("attribution", {"direct": True, "logits": True}), ("circuits", {"qk": True, "direct": True})):
        if inexact(cfg, **asked):
            refuse([feature], bends(**asked))
    if "circuits" in reasons:
        refuse(["circuits"], "over the work a request may take (ATTNSCOPE_WORK_TFLOP)")
    if "importance" in reasons:
        refuse(["importance"], "over the work a request may take (ATTNSCOPE_WORK_TFLOP)")
    if "stages" in reasons:
        refuse(["stages"], "its Steps graph does not fit this machine's memory budget (ATTNSCOPE_MEMORY_MB)")
    if source != "zoo":
        refuse(["jobs"], "not a zoo model: corpus jobs run zoo models")
    return short


def circuits_flop(cfg) -> float:
    """analysis/circuits.py's work: W_U^T W_E (2 V D^2), and each writer layer's [H dh, D] x [D, n dh] products for
    the three compositions."""
    n, dh, D, V = cfg.n_layers * cfg.n_heads, cfg.d_head, cfg.d_model, cfg.vocab_size
    return 2.0 * V * D * D + 3 * 2.0 * cfg.n_layers * (cfg.n_heads * dh) * D * (n * dh)


def importance_flop(cfg, parameters: int, tokens: int = 64) -> float:
    """One forward pass per head from its layer on: about half the blocks' weights each, at 2 FLOP per weight and
    token."""
    return cfg.n_layers * cfg.n_heads * 0.5 * parameters * 2.0 * tokens


def memory_total() -> int:
    """This machine's physical memory in bytes."""
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def stages_bytes(cfg, tokens: int) -> int:
    """What one run of the stages graph holds at its peak over `tokens` tokens, float32: every layer's square stages
    (scores, scaled, masked) and probabilities [L, H, T, T]; its stream, queries, keys, values and contexts; and, with
    an LM head, two [T, V] arrays of logits (the logits and their log-softmax)."""
    L, H, T = cfg.n_layers, cfg.n_heads, tokens
    square = (len(SQUARE_STAGES) + 1) * L * H * T * T
    rows = L * T * (cfg.d_model + 4 * H * cfg.d_head)
    logits = 2 * T * cfg.vocab_size if cfg.lm_head else 0
    return COMPUTE.itemsize * (square + rows + logits)


def attended_keys(cfg, T: int, layer: int) -> int:
    """The query-key pairs one head of `layer` scores over T tokens under the causal mask (and a local layer's
    window), or all T^2 (an encoder): what a layer-by-layer run computes (runtime/blocks.py)."""
    if not cfg.causal:
        return T * T
    w = cfg.window(layer) or T
    return (min(T, w) * (min(T, w) + 1)) // 2 + max(0, T - w) * w


def forward_flop(cfg, block_parameters: int, T: int) -> float:
    """A forward pass over T tokens: 2 FLOP per block weight and token, each head's scores and weighted values
    (4 d_head per query-key pair), and with an LM head the logits of every position (token_logprobs: 2 T V D)."""
    attention = sum(4.0 * cfg.n_heads * cfg.d_head * attended_keys(cfg, T, layer) for layer in range(cfg.n_layers))
    return 2.0 * block_parameters * T + attention + (2.0 * T * cfg.vocab_size * cfg.d_model if cfg.lm_head else 0)


def walk_bytes(cfg, T: int, group_mb: float = 8) -> int:
    """What a layer-by-layer run over T tokens holds at its peak besides the weights, float32: every layer's
    checkpoint [T, D] (the most a run keeps), the stream, q, k, v, the heads' outputs and the MLP's activations of the
    layer it runs, the LM head's chunk of logits, every head's kept rows, and three block buffers (runtime/blocks.py)."""
    from ..model.transformer import VOCAB_CHUNK
    per_token = (cfg.n_layers + 3) * cfg.d_model + 4 * cfg.n_heads * cfg.d_head + 3 * cfg.d_ff \
        + (2 * VOCAB_CHUNK if cfg.lm_head else 0) + 12 * cfg.n_layers * cfg.n_heads
    return COMPUTE.itemsize * T * per_token + int(3 * group_mb * 2**20)


def long_tokens(cfg, block_parameters: int, max_tokens: int, memory_bytes: float, work_flop: float) -> int:
    """The most tokens (up to max_tokens) whose layer-by-layer run fits memory_bytes and work_flop."""
    fits = lambda T: walk_bytes(cfg, T) <= memory_bytes and forward_flop(cfg, block_parameters, T) <= work_flop  # noqa: E731
    lo, hi = 0, max_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo

