"""What a served model's size allows on this machine, decided once when it loads, from its weights and the server's
memory budget: the one record the runtime, the planner (a feature that cannot fit answers 422 naming the limit,
before any work, never an out-of-memory kill) and the page (`/api/models`) read.

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

from dataclasses import dataclass, field

from ..model.precision import COMPUTE, Precision
from ..model.transformer import SQUARE_STAGES
from ..model.weights import state_dict

SHARE = 0.45            # of the memory budget one model's weights may take and still run whole (or in NumPy)
SMALL = 1 << 30         # weights up to this many bytes keep onnxruntime's memory arenas (faster; an arena keeps its
#                         peak for good, which for a big model is GBs of widened weights)
FEATURES = ("stacked", "numpy", "circuits", "importance", "stages")
WORK_TFLOP = 4.0        # what one request's analysis may cost by default (ATTNSCOPE_WORK_TFLOP)


@dataclass(frozen=True)
class Capabilities:
    parameters: int                       # the weights' count
    stored_bytes: int                     # as stored (the checkpoint's own type)
    compute_bytes: int                    # the same in the compute type (float32)
    precision: Precision
    memory_bytes: int                     # the budget it was decided against
    reasons: dict[str, str] = field(default_factory=dict)   # a feature it lacks -> why, naming the limit

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
        """Sessions keep memory arenas (small models): a big model's runs allocate as they go and give it back."""
        return self.stored_bytes <= SMALL

    def allows(self, feature: str) -> bool:
        return feature not in self.reasons

    def refusal(self, feature: str) -> str | None:
        return self.reasons.get(feature)

    def record(self) -> dict:
        """The API's form (/api/models): sizes, the storage type, and each feature with its reason when refused."""
        return {"parameters": self.parameters, "weights_bytes": self.stored_bytes, "dtype": self.precision.storage,
                "compute_dtype": self.precision.compute, "memory_budget_bytes": self.memory_bytes,
                "features": {f: self.allows(f) for f in FEATURES}, "reasons": dict(self.reasons)}

    @classmethod
    def of(cls, model, memory_bytes: int, work_flop: float, stages_tokens: int | None = None) -> Capabilities:
        """stages_tokens: the most tokens a run of the stages graph takes (the planner's limit); None: the stages
        graph is priced at the model's positions."""
        weights = list(state_dict(model).values())
        n = sum(int(w.size) for w in weights)
        stored = sum(int(w.nbytes) for w in weights)
        caps = cls(n, stored, n * COMPUTE.itemsize, Precision.of(weights), int(memory_bytes))
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
        return caps


def circuits_flop(cfg) -> float:
    """analysis/circuits.py's work: W_U^T W_E (2 V D^2), and each writer layer's [H dh, D] x [D, n dh] products for
    the three compositions."""
    n, dh, D, V = cfg.n_layers * cfg.n_heads, cfg.d_head, cfg.d_model, cfg.vocab_size
    return 2.0 * V * D * D + 3 * 2.0 * cfg.n_layers * (cfg.n_heads * dh) * D * (n * dh)


def stages_bytes(cfg, tokens: int) -> int:
    """What one run of the stages graph holds at its peak over `tokens` tokens, float32: every layer's square stages
    (scores, scaled, masked) and probabilities [L, H, T, T]; its stream, queries, keys, values and contexts; and, with
    an LM head, two [T, V] arrays of logits (the logits and their log-softmax)."""
    L, H, T = cfg.n_layers, cfg.n_heads, tokens
    square = (len(SQUARE_STAGES) + 1) * L * H * T * T
    rows = L * T * (cfg.d_model + 4 * H * cfg.d_head)
    logits = 2 * T * cfg.vocab_size if cfg.lm_head else 0
    return COMPUTE.itemsize * (square + rows + logits)


def importance_flop(cfg, parameters: int, tokens: int = 64) -> float:
    """One forward pass per head from its layer on: about half the blocks' weights each, at 2 FLOP per weight and
    token."""
    return cfg.n_layers * cfg.n_heads * 0.5 * parameters * 2.0 * tokens


def memory_total() -> int:
    """This machine's physical memory in bytes."""
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

