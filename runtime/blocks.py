"""A layer's attention in blocks of queries, for texts whose [h, T, T] would not fit (runtime/layerwise.py): memory
linear in T.

At 32,768 tokens one head's probabilities are 4 GiB of float32; a model's whole attention terabytes. Here a layer's
heads run one at a time, and each head's queries in blocks [q0, q1) over the keys they may see, [k0, k1): the causal
mask ends them at q1, a local layer's window (Gemma 3's 512 keys) starts them at q1 - window. Every row is the whole
text's row exactly: a softmax over all of a query's visible keys (a key outside [k0, k1) is hidden from the block's
queries, weight exactly 0, in the whole text's p as here). The block's scores and probabilities [Tq, Tk] stay within
the group budget (ATTNSCOPE_LAYERWISE_GROUP_MB), and the attend graph (graphs/layers.build_attend, block=True)
reduces them before they are dropped: the registry's rows for these queries, the thumbnail's part (pool^T p pool over
the cells the block touches), the asked heads' top-k keys, and the heads' outputs, written into the layer's ctx.

    blocks = query_blocks(T, causal, window, budget_bytes)      # [(q0, q1, k0, k1), ...]
    mask = block_mask(q0, q1, k0, k1, causal, window, hidden)   # [1, 1, Tq, Tk] additive
    rows = exact_rows(lw, checkpoint, layer, queries)           # full rows of chosen queries, recomputed

The same block plan serves a question asked after the run: the full rows of chosen queries and a tile (a query range
by a key range), recomputed from the run's checkpoint of that layer (`exact_parts`), as the weights or value-weighted
(VIEWS). The walk's per-token graphs (block_in, block_out, final) run over such a text in runs of tokens
(`by_tokens`), so that their intermediates ([T, d_ff], [T, VOCAB_CHUNK]) take a run's memory, not the text's.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..analysis.statistics import TextKeys, sentences
from ..graphs.reductions import VALUE_ROW
from ..model.precision import COMPUTE, MASKED
from ..model.transformer import LM_OUTPUTS, VOCAB_CHUNK
from .errors import InputError
from .options import one_blas_thread
from .tensors import Held, hold

if TYPE_CHECKING:
    from .sessions import Session

BLOCK = 64            # queries: blocks are multiples of this (and at least this), but for the text's last
SHORT = 256           # tokens: a head's [T, T] is at most 256 KB, never run in blocks
# a block whose keys touch more thumbnail cells than this pools them by gathering each cell's keys, else by the product
# with the pooling matrix's rows (graphs/reductions.Reductions.thumbnail). One head, SmolLM2's shape, 4,096 tokens,
# 8 MB blocks: the product 0.06 s at 64 cells, 0.11 s at 512, gathering 0.10 s at either; at 32k tokens and 512 cells
# the product copies [Tk, 512] per 64-query block (bench: the overview of a head at 32k tokens, 17 -> 12 s)
CELLS_GATHERED = 256
NO_CELLS = (np.zeros((0, 1), np.int64), np.zeros((0, 1), COMPUTE))


def blocked(T: int, budget_bytes: float) -> bool:
    """Whether a layer runs in blocks of queries: one head's [T, T] passes the budget, and the text is not short."""
    return T > SHORT and T * T * COMPUTE.itemsize > budget_bytes


def key_range(q0: int, q1: int, T: int, causal: bool, window: int) -> tuple[int, int]:
    """The keys queries q0..q1-1 may see: up to q1 under a causal mask; from q0 - window + 1 on a local layer (its
    band hides key j from query i when i - j >= window: model/masks.sliding_window_mask)."""
    return (max(0, q0 - window + 1) if window else 0), (q1 if causal else T)


def query_blocks(T: int, causal: bool, window: int, budget_bytes: float) -> list[tuple[int, int, int, int]]:
    """(q0, q1, k0, k1) of each block: the most queries (a multiple of BLOCK) whose [Tq, Tk] float32 stays within
    the budget, at least BLOCK."""
    n = budget_bytes / COMPUTE.itemsize
    out, q0 = [], 0
    while q0 < T:
        k0, _ = key_range(q0, q0 + 1, T, causal, window)
        if causal:                            # Tq (Tq + q0 - k0) <= n
            c = q0 - k0
            tq = (-c + math.sqrt(c * c + 4 * n)) / 2
        else:
            tq = n / (T - k0)
        tq = min(T - q0, max(BLOCK, int(tq) // BLOCK * BLOCK))
        out.append((q0, q0 + tq, *key_range(q0, q0 + tq, T, causal, window)))
        q0 += tq
    return out


def block_mask(q0: int, q1: int, k0: int, k1: int, causal: bool, window: int, hidden: np.ndarray | None
               ) -> np.ndarray:
    """The additive mask [1, 1, Tq, Tk] of these queries over these keys, as Runtime.build_mask and the layer's band
    (TransformerBlock.local_mask) make it for the whole text: a later key (causal), a key window or more back (a
    local layer), a key the request masks (hidden [T] bool: hidden from every query but itself). Only the columns
    where a query may lose a key are computed: the causal edge's last Tq, the window's first Tq."""
    out = np.zeros((1, 1, q1 - q0, k1 - k0), COMPUTE)

    def band(a: int, b: int) -> None:             # keys k0 + a .. k0 + b - 1
        a, b = max(0, a), min(k1 - k0, b)
        if a >= b:
            return
        d = np.arange(q0, q1)[:, None] - np.arange(k0 + a, k0 + b)[None, :]
        hide = np.zeros(d.shape, bool)
        if causal:
            hide |= d < 0
        if window:
            hide |= d >= window
        out[0, 0, :, a:b][hide] = MASKED

    if hidden is not None and hidden[k0:k1].any():
        band(0, k1 - k0)
        d = np.arange(q0, q1)[:, None] - np.arange(k0, k1)[None, :]
        out[0, 0][hidden[None, k0:k1] & (d != 0)] = MASKED
        return out
    if causal:
        band(q0 - k0, k1 - k0)
    if window:
        band(0, q1 - window - k0 + 1)
    return out


def visible_counts(T: int, causal: bool, hidden: np.ndarray | None) -> np.ndarray:
    """How many keys each query may see under the run's mask (statistics.visible_keys of Runtime.build_mask's), [T]."""
    i = np.arange(T)
    seen = i + 1 if causal else np.full(T, T)
    if hidden is None or not hidden.any():
        return seen
    before = np.cumsum(hidden) if causal else np.full(T, hidden.sum())      # masked keys each query would see
    return seen - before + hidden                                         # ... but itself


def key_set(keys: TextKeys, keyset: str, q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
    """Rows q0..q1-1, columns k0..k1-1 of TextKeys.mask(keyset) (float), without the [T, T]."""
    if keyset == "punctuation":
        return np.asarray(keys.punctuation[k0:k1], COMPUTE)
    if keyset == "other_sentence":
        s = sentences(keys.segments)
        return (s[q0:q1, None] != s[None, k0:k1]).astype(COMPUTE)
    if keyset == "same_token_before":
        ids = np.asarray(keys.token_ids)
        before = np.arange(q0, q1)[:, None] > np.arange(k0, k1)[None, :]
        return ((ids[q0:q1, None] == ids[None, k0:k1]) & before).astype(COMPUTE)
    raise KeyError(f"no block form of key set {keyset!r}")


KEY_INPUTS = {"cross_sentence": "other_sentence", "duplicate": "same_token_before", "punctuation": "punctuation"}
DIAGONALS = {"previous": -1, "next": 1}


class BlockedLayer:
    """One layer's attention over a text, head by head and block by block (see the module docstring). The walk
    (runtime/layerwise.py) makes one per layer; `run` returns what Layerwise._block's groups return, whole."""

    def __init__(self, lw, layer: int, T: int, causal: bool, hidden: np.ndarray | None, keys: TextKeys,
                 pool: np.ndarray | None = None):
        self.lw, self.layer, self.T, self.causal = lw, layer, T, causal
        self.hidden, self.keys, self.pool = hidden, keys, pool
        self.window = lw.rt.model.blocks[layer].window or 0
        self.blocks = query_blocks(T, causal, self.window, lw.group_mb * 2**20)
        self.edges = None if pool is None else np.r_[0, np.cumsum((pool > 0).sum(0))]   # each cell's first token

    def cells(self, a: int, b: int) -> tuple[int, int]:
        """The thumbnail cells tokens a..b-1 touch."""
        return int(np.searchsorted(self.edges, a, "right") - 1), int(np.searchsorted(self.edges, b - 1, "right"))

    def cell_keys(self, k0: int, k1: int, c: int, d: int) -> tuple[np.ndarray, np.ndarray]:
        """The attend_block graph's cell_keys and cell_weights [d - c, S] for keys k0..k1-1 over cells c..d-1
        (graphs/reductions.Reductions._cells): each cell's keys in the block as offsets from k0, padded to the most
        any cell has there, and 1/|cell| (the pooling matrix's weight, whole cell) on them, 0 on the padding."""
        first, end = np.maximum(self.edges[c:d], k0), np.minimum(self.edges[c + 1:d + 1], k1)
        keys = first[:, None] + np.arange(int((end - first).max()))[None, :]
        inside = keys < end[:, None]
        weights = np.where(inside, self.pool[self.edges[c:d], np.arange(c, d)][:, None], 0).astype(COMPUTE)
        return np.where(inside, keys - k0, 0), weights

    def run(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, outputs: tuple[str, ...], heads=(), top_k: int = 0,
            ) -> dict[str, np.ndarray]:
        """q, k, v [1, H, T, dh] -> ctx [1, H, T, dh] and each of `outputs` for the whole text: rows [1, H, T]
        (previous, next: T - 1), the thumbnail [1, H, R, R], the asked heads' attention [1, n, T, T], top_weights
        and top_keys [1, n, T, k], duplicate [1, n, T]."""
        T, H, dh = self.T, q.shape[1], q.shape[3]
        heads = [int(h) for h in heads]
        thumb = next((o for o in outputs if o.startswith("thumbnail")), None)
        graph_outputs = tuple("thumbnail" if o == thumb else o for o in outputs)
        rows = [o for o in outputs if o not in ("attention", "top_weights", "top_keys") and o != thumb]
        ctx = np.empty((1, H, T, dh), COMPUTE)
        out = {o: np.zeros((1, len(heads) if o == "duplicate" else H, T), COMPUTE) for o in rows}
        if thumb:
            R = self.pool.shape[1]
            out[thumb] = np.zeros((1, H, R, R), COMPUTE)
        n = len(heads)
        if "attention" in outputs:       # the asked heads' whole matrices are the answer, within analyses/checks.cells
            out["attention"] = np.zeros((1, n, T, T), COMPUTE)
        k_top = min(max(top_k, 1), T)
        if "top_weights" in outputs:
            out["top_weights"] = np.zeros((1, n, T, k_top), COMPUTE)
            out["top_keys"] = np.zeros((1, n, T, k_top), np.int64)
        which = ("attend_block", graph_outputs, self.causal)
        norms = value_norms(self.lw.rt, self.layer, v[0]) if VALUE_ROW in outputs else None   # [H, T]
        for q0, q1, k0, k1 in self.blocks:
            feeds = {"attention_mask": block_mask(q0, q1, k0, k1, self.causal, self.window, self.hidden),
                     "offsets": np.array([q0, k0], np.int64), "total": np.array([T], np.int64),
                     "top_k": np.array([min(k_top, k1 - k0)], np.int64),
                     "local_window": np.array([self.keys.window], np.int64)}     # read where "local" is asked
            for name, keyset in KEY_INPUTS.items():
                if name in graph_outputs:
                    feeds[f"keys_{keyset}"] = key_set(self.keys, keyset, q0, q1, k0, k1)
            if thumb:
                (a, b), (c, d) = self.cells(q0, q1), self.cells(k0, k1)
                feeds["pool"] = np.ascontiguousarray(self.pool[q0:q1, a:b])
                if d - c > CELLS_GATHERED:       # many cells: each cell's keys gathered, pool_keys empty
                    feeds["pool_keys"] = np.zeros((k1 - k0, 0), COMPUTE)
                    feeds["cell_keys"], feeds["cell_weights"] = self.cell_keys(k0, k1, c, d)
                else:                            # a few: the product with the pooling matrix's rows, no cell gathered
                    feeds["pool_keys"] = np.ascontiguousarray(self.pool[k0:k1, c:d])
                    feeds["cell_keys"], feeds["cell_weights"] = NO_CELLS
            for h in range(H):
                asked = h in heads
                feeds |= {"q": q[:, h:h + 1, q0:q1], "k": k[:, h:h + 1, k0:k1], "v": v[:, h:h + 1, k0:k1],
                          "heads": np.array([0] if asked else [], np.int64)}
                if norms is not None:
                    feeds["value_norms"] = norms[None, h:h + 1, k0:k1]
                names = ["ctx", *graph_outputs]
                got = dict(zip(names, self.lw.run_block(which, feeds, names, ctx[:, h:h + 1, q0:q1])))
                for o in rows:
                    if o == "duplicate":
                        if asked:
                            out[o][0, heads.index(h), q0:q1] = got[o][0, 0]
                    else:
                        out[o][0, h, q0:q1] = got[o][0, 0]
                if thumb:
                    out[thumb][0, h, a:b, c:d] += got["thumbnail"][0, 0]
                if asked:
                    i = heads.index(h)
                    if "attention" in outputs:
                        out["attention"][0, i, q0:q1, k0:k1] = got["attention"][0, 0]
                    if "top_weights" in outputs:
                        kk = got["top_keys"].shape[-1]
                        out["top_weights"][0, i, q0:q1, :kk] = got["top_weights"][0, 0]
                        out["top_keys"][0, i, q0:q1, :kk] = got["top_keys"][0, 0] + k0
        for o, offset in DIAGONALS.items():          # the queries that have that key
            if o in out:
                out[o] = out[o][..., 1:] if offset < 0 else out[o][..., :-1]
        out["ctx"] = ctx
        return out


def value_norms(rt, layer: int, v: np.ndarray) -> np.ndarray:
    """Layer `layer`'s value norms of one text's values v [H, T, dh] -> [H, T] (TransformerBlock.value_norms): NumPy
    products between two of the walk's onnxruntime runs, on one BLAS thread (options.one_blas_thread)."""
    with one_blas_thread():
        return rt.model.blocks[layer].value_norms(v)


def hidden_keys(T: int, mask_tokens) -> np.ndarray | None:
    """The keys a request masks, [T] bool (None: none), checked as Runtime.build_mask checks them."""
    if not mask_tokens:
        return None
    out = np.zeros(T, bool)
    for j in mask_tokens:
        if not 0 <= j < T:
            raise InputError(f"mask_tokens index {j} is out of range: this text has {T} tokens (0..{T - 1})")
        out[j] = True
    return out


# ---- a long text's per-token graphs, in runs of tokens ----
TOKEN_AXIS = {"x": 1, "input_ids": 1, "token_type_ids": 1, "ctx": 2, "q": 2, "k": 2, "v": 2, "x_next": 1,
              "hidden": 1, "token_logprobs": 1}      # the token axis of their inputs and outputs


def tokenwise(lw, T: int, final: bool = False) -> list[tuple[int, int]] | None:
    """The runs of tokens (token_chunks) a walk over T tokens takes its per-token graphs in, their intermediates
    [n, width] within the group budget (a block's widest: the MLP's, the heads'; the LM head's: VOCAB_CHUNK): on the
    CPU, for a text long enough for blocks of queries; None: in one run."""
    if lw.rt.weights.device != "cpu" or not blocked(T, lw.group_mb * 2**20):
        return None
    cfg = lw.rt.cfg
    width = VOCAB_CHUNK if final else max(cfg.d_ff, cfg.n_heads * (cfg.d_head or cfg.d_model // cfg.n_heads),
                                          cfg.d_model)
    return token_chunks(T, width, lw.group_mb * 2**20)


def token_chunks(T: int, width: int, budget_bytes: float) -> list[tuple[int, int]]:
    """[a, b) of each run of tokens a per-token graph takes over a long text: the most tokens (a multiple of BLOCK,
    at least BLOCK) whose [n, width] float32 intermediates stay within the budget."""
    n = max(BLOCK, int(budget_bytes / (width * COMPUTE.itemsize)) // BLOCK * BLOCK)
    return [(a, min(a + n, T)) for a in range(0, T, n)]


def by_tokens(lw, which: str, feeds: dict, names: list[str], chunks, layer: int | None = None,
              release: bool = False) -> dict:
    """A graph whose every token is computed alone (block_in, block_out without a mean ablation, final: norms,
    projections, MLPs, RoPE at the positions fed as `start`) over a long text in runs of tokens (token_chunks): its
    intermediates then take a run's memory, not the text's ([T, d_ff] floats of the MLP, [T, 4096] of each chunk of
    the LM head's vocabulary; onnxruntime's arenas keep their peak for good, and grow by powers of two). The
    whole text's outputs, as the graph run once would give them: q, k, v and x_next as Held (on the CPU), hidden and
    token_logprobs whole, next_token_logits the last token's. A log-prob reads the token before its own: each
    run of `final` starts one token early. chunks None: one run (the block graphs' outputs kept where it runs)."""
    if not chunks:
        return lw.run_graph(which, feeds, names, release, layer, keep=() if which.startswith("final") else tuple(names))
    out: dict[str, np.ndarray] = {}
    for n, (a, b) in enumerate(chunks):
        lo = max(a - 1, 0) if which == "final" else a
        part = {name: cut(value, lo, b, TOKEN_AXIS[name]) if name in TOKEN_AXIS else value
                for name, value in feeds.items()}
        part |= {"lengths": np.array([b - lo], np.int64), "start": np.array([lo], np.int64)}
        got = lw.run_graph(which, part, names, release and n == len(chunks) - 1, layer)
        for name, value in got.items():
            if name == "next_token_logits":
                out[name] = value
                continue
            axis = TOKEN_AXIS[name]
            if name not in out:
                shape = list(value.shape)
                shape[axis] = max(b for _, b in chunks)
                out[name] = np.empty(shape, value.dtype)
            out[name][(slice(None),) * axis + (slice(a, b),)] = cut(value, a - lo, b - lo, axis)
    return {name: hold(value, "cpu") if name in ("q", "k", "v", "x_next") else value for name, value in out.items()}


def final_parts(lw, x, inputs: dict, chunks, logprobs: bool) -> dict:
    """The final graph over the walk's last x [1, T, D] (by_tokens): hidden and, with an LM head, the next-token
    logits and with `logprobs` every token's log-prob. Without them the LM head runs at the last position alone, the
    final norm at every one: 2 V D FLOP instead of 2 T V D (Gemma 3 at 30,000 tokens: 10 of its 22.6 TFLOP)."""
    if logprobs or not lw.rt.cfg.lm_head:
        return by_tokens(lw, "final", inputs | {"x": x}, ["hidden"] + (list(LM_OUTPUTS) if lw.rt.cfg.lm_head else []),
                         chunks, release=True)
    out = by_tokens(lw, "final_norm", {"x": x}, ["hidden"], chunks)
    T = x.shape[1]
    last = {"x": cut(x, T - 1, T, 1), "input_ids": inputs["input_ids"][:, T - 1:],
            "lengths": np.array([1], np.int64)}
    return out | lw.run_graph("final_logits", last, ["next_token_logits"], release=True)


def cut(value, a: int, b: int, axis: int) -> np.ndarray:
    """Tokens a..b-1 of an array (or a Held one) along its token axis, contiguous."""
    array = (value.array if value.array is not None else value.host()) if isinstance(value, Held) else value
    return np.ascontiguousarray(array[(slice(None),) * axis + (slice(a, b),)])


# ---- how a layer's attention is split and fed: groups of heads, a run's axes, the inputs it does not read ----
def run_axes(feeds: dict) -> dict[str, int]:
    """The named axes of a layer graph's run (batch, tokens), read off its stream or query input: its outputs are then
    sized by Session.run, each in memory of its own (on the CPU, a kept x, q, k, v is a NumPy buffer of its own, not
    a view that pins onnxruntime's arena: a checkpoint lives as long as its cached result)."""
    for name, axis in (("x", 1), ("input_ids", 1), ("q", 2)):
        if name in feeds:
            shape = feeds[name].shape
            return {"batch": shape[0], "tokens": shape[axis]}
    return {}


def unread_inputs(sess: Session, names, T: int) -> dict[str, np.ndarray]:
    """Neutral values for a graph's inputs that feed only outputs the run does not read: no asked heads, k 1, zero
    key sets (each at its declared shape, its token axes T long)."""
    out = {}
    for i in sess.get_inputs():
        if i.name in names:
            shape = [0 if d == "asked" else T if d == "tokens" else d if isinstance(d, int) else 1 for d in i.shape]
            out[i.name] = (np.ones(shape, np.int64) if i.name == "top_k" else
                           np.zeros(shape, np.int64 if "int64" in i.type else COMPUTE))
    return out


def head_groups(H: int, groups: int) -> list[tuple[int, int]]:
    """[first, end) heads of each of `groups` consecutive groups, as even as can be."""
    edges = np.linspace(0, H, min(groups, H) + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


VIEWS = {"weights": "the attention weights alpha_ij", "value_weighted": "value-weighted attention (Kobayashi et al. "
         "2020, 'Attention is not only a weight'): alpha_ij ||v_j W_O^h||, normalised to sum to 1 over each row"}


def exact_parts(lw, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, heads, causal: bool,
                hidden: np.ndarray | None, queries=(), tile=None, view: str = "weights") -> dict[str, np.ndarray]:
    """Full rows of chosen queries ("rows" [n, Q, T]) and a tile ("tile" [n, qb - qa, kd - kc]) of the asked heads of
    one layer, from its q, k, v [1, H, T, dh]: each query's row over all its visible keys (the block attend graph on
    that query alone, or on the tile's queries in blocks), so exact whatever the text's length; in a view of VIEWS
    (value_weighted: each whole row times its keys' value norms, TransformerBlock.value_norms, normalised)."""
    T, heads = q.shape[2], [int(h) for h in heads]
    window = lw.rt.model.blocks[layer].window or 0
    which = ("weights_block", ("attention",), causal)         # the weights alone: no ctx, no reductions
    norms = value_norms(lw.rt, layer, v[0]) if view == "value_weighted" else None
    out = {}

    def block(q0, q1, k0, k1, h):
        feeds = {"attention_mask": block_mask(q0, q1, k0, k1, causal, window, hidden), "q": q[:, h:h + 1, q0:q1],
                 "k": k[:, h:h + 1, k0:k1], "heads": np.array([0], np.int64)}
        p = lw.run_block(which, feeds, ["attention"])[0][0, 0]
        if norms is None:
            return p
        p = p * norms[h, k0:k1]                                  # every visible key of these rows: exact sums
        return p / p.sum(-1, keepdims=True)

    if queries:
        rows = np.zeros((len(heads), len(queries), T), COMPUTE)
        for n, h in enumerate(heads):
            for i, query in enumerate(queries):
                k0, k1 = key_range(query, query + 1, T, causal, window)
                rows[n, i, k0:k1] = block(query, query + 1, k0, k1, h)[0]
        out["rows"] = rows
    if tile is not None:
        (qa, qb), (kc, kd) = tile
        part = np.zeros((len(heads), qb - qa, kd - kc), COMPUTE)
        for q0, q1, k0, k1 in query_blocks(T, causal, window, lw.group_mb * 2**20):
            a, b = max(q0, qa), min(q1, qb)
            if a >= b:
                continue
            k0, k1 = key_range(a, b, T, causal, window)
            c, d = max(k0, kc), min(k1, kd)
            for n, h in enumerate(heads):
                p = block(a, b, k0, k1, h)
                if c < d:
                    part[n, a - qa:b - qa, c - kc:d - kc] = p[:, c - k0:d - k0]
        out["tile"] = part
    return out


def exact_qkv(lw, layer: int, x, chunks, causal: bool, queries=(), tile=None, release: bool = False
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v [1, H, T, dh] for rows or a tile asked alone over a long text (exact_parts after a run:
    Layerwise.recompute), in the run's own runs of tokens (chunks: tokenwise's), so the same bits as the run's: k and v
    of the runs up to the last key they read (causal; every run else), from the block's first graph without its query
    projection (block_kv), and q of the runs that hold an asked query alone, zero elsewhere (never read). Gemma 3 at
    30,000 tokens: ~20 of the layer's 60 GFLOP of q, k, v."""
    T = x.shape[1]
    spans = [(i, i + 1) for i in queries] + ([tuple(tile[0])] if tile is not None else [])
    last = max(b for _, b in spans) if causal else T
    kv = by_tokens(lw, "block_kv", {"x": x}, ["k", "v"], [(a, b) for a, b in chunks if a < last], layer, release)
    runs = [(a, b) for a, b in chunks if any(a < d and c < b for c, d in spans)]
    asked = by_tokens(lw, "block_in", {"x": x}, ["q"], runs, layer)["q"].host()
    q = np.zeros(asked.shape[:2] + (T,) + asked.shape[3:], asked.dtype)      # calloc: untouched pages cost nothing
    for a, b in runs:
        q[:, :, a:b] = asked[:, :, a:b]
    return q, kv["k"].host(), kv["v"].host()


# ---- which layers a walk keeps and runs ----
def checkpoint_spacing(cfg, T: int, every: int, budget_bytes: float) -> int:
    """How many layers apart a walk over T tokens keeps its checkpoints: `every` (ATTNSCOPE_CHECKPOINT_EVERY), or
    further apart where that many [T, D] float32 checkpoints would pass `budget_bytes` -- the share of the result
    cache a run's checkpoints may take (analyses/attention.py CHECKPOINTS_SHARE: half): a run whose kept parts pass the cache is not kept at
    all, and every head asked after it runs the whole walk again instead of a few blocks (Llama 3.1 8B's shape at
    4,096 tokens: 32 x 64 MB = 2.1 GB of checkpoints against a 768 MB cache; spaced 6 apart, 384 MB)."""
    fit = int(budget_bytes // (T * cfg.d_model * COMPUTE.itemsize))       # checkpoints the budget holds
    return max(every, math.ceil(cfg.n_layers / max(fit, 1)))


def kept_layers(n_layers: int, every: int, asked=()) -> set[int]:
    """The layers whose input x a walk keeps: every `every`-th (checkpoint_spacing), except that an asked layer takes
    the place of the spaced one below it, so that the layers a request looked at answer later questions (rows, a
    tile: a zoom into what was drawn) from their own input, q, k and v alone, and not by running the layers between
    again (Gemma 3 at 30,000 tokens: 2.75 s for layer 5 from layer 4's input). As many as the spacing keeps: the
    same memory. Layer 0 is always kept (every walk starts there)."""
    kept = set(range(0, n_layers, every))
    for layer in sorted(set(asked)):
        below = layer - layer % every
        if layer not in kept and below in kept and below != 0 and below not in asked:
            kept = kept - {below} | {layer}
    return kept


def _walk(needed: list[int], checkpoints: list[int]) -> list[tuple[int, bool]]:
    """The blocks to run to reach every layer in `needed`: (layer, start from its checkpoint). Goes on from the layer
    before when no checkpoint lies between; a checkpoint, when reached, is always used (it holds the first run's x)."""
    steps: list[tuple[int, bool]] = []
    at = None                                                  # the layer whose input x is in hand
    for target in needed:
        c = max(l for l in checkpoints if l <= target)
        start = at is None or not (c < at <= target)
        if start:
            at = c
        while at <= target:
            steps.append((at, start))
            start, at = False, at + 1
    return steps
