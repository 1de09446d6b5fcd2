"""Numbers derived from attention probabilities: entropy, per-head summaries, rollout, downsampling.

All functions take probabilities p [..., Tq, Tk] whose rows sum to 1 and broadcast over leading axes.
"""
from __future__ import annotations

import numpy as np

from .masks import MASKED

def _float(p) -> np.ndarray:
    """Float arrays keep their dtype (float32 attention stays float32: 512 tokens x 72 heads is 75 MB)."""
    p = np.asarray(p)
    return p if np.issubdtype(p.dtype, np.floating) else p.astype(np.float64)


# The per-head statistics: name -> (label, what it shows). The API's schema, the page's menu and its
# explanations all come from here.
STAT_INFO = {
    "mean_entropy": ("mean entropy (nats)", "How spread out each row is, averaged over the queries: near 0 = every "
                     "token looks at one key; high = attention spread over many keys."),
    "first_token_mass": ("first-token mass", "Average weight on the first token ([CLS] for BERT). Many heads park "
                         "their attention there when they have nothing to do."),
    "last_token_mass": ("last-token mass", "Average weight on the last token ([SEP] for BERT): another common "
                        "‘no-op’ place to put attention."),
    "diagonal_mass": ("diagonal mass", "Average weight a token puts on itself."),
    "previous_token_mass": ("previous-token mass", "Average weight a token puts on the token just before it: high "
                            "for ‘previous-token’ heads."),
    "next_token_mass": ("next-token mass", "Average weight a token puts on the token just after it: high for "
                        "‘next-token’ heads (an encoder sees both ways; 0 under a causal mask)."),
    "mean_distance": ("mean distance (tokens)", "How far away the attended keys are, on average, in tokens: small = "
                      "local heads, large = long-range heads."),
    "cross_sentence_mass": ("cross-sentence mass", "Sentence pairs only: average weight a token puts on the other "
                            "sentence ([CLS] and the first [SEP] count as sentence A, the last [SEP] as B)."),
}
PAIR_STATS = ("cross_sentence_mass",)                          # computed only when a sentence pair is given
HEAD_STATS = tuple(k for k in STAT_INFO if k not in PAIR_STATS)  # computed for every input


def entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy of each row in nats, -sum p log p (0 log 0 = 0). [..., Tq]"""
    p = _float(p)
    log_p = np.zeros_like(p)
    np.log(p, out=log_p, where=p > 0)
    return -np.einsum("...k,...k->...", p, log_p)                         # one pass, no p*log_p temporary


def visible_keys(mask: np.ndarray) -> np.ndarray:
    """How many keys each query may see, from an additive mask [..., Tq, Tk]. [..., Tq]"""
    return (np.asarray(mask) > MASKED / 2).sum(axis=-1)


def normalize_entropy(h: np.ndarray, n_visible: np.ndarray) -> np.ndarray:
    """Row entropy / log(visible keys): 0 = all weight on one key, 1 = spread evenly; 0 when one key is visible.
    Clipped to [0, 1]: float32 rounding puts a uniform row's entropy a hair above log(n) (1.00000095)."""
    n = np.asarray(n_visible, np.float64)
    return np.clip(np.where(n > 1, h / np.log(np.maximum(n, 2)), 0.0), 0.0, 1.0).astype(h.dtype)


def normalized_entropy(p: np.ndarray, n_visible: np.ndarray) -> np.ndarray:
    """Entropy / log(visible keys): 0 = all weight on one key, 1 = spread evenly. 0 when one key is visible."""
    return normalize_entropy(entropy(p), n_visible)


def row_stats(p: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Per query row: entropy (nats), normalised entropy, max weight. Each [..., Tq]."""
    h = entropy(p)
    return {"entropy": h, "normalized_entropy": normalize_entropy(h, visible_keys(mask)),
            "max_weight": _float(p).max(axis=-1)}


def head_rows(p: np.ndarray) -> dict[str, np.ndarray]:
    """The per-query numbers that the per-head summaries and scores average, each [..., Tq] (previous and
    next [..., Tq - 1]): weight on the first key and on the last, on itself (diagonal), on the key before
    (previous, queries i >= 1) and after (next, queries i < T-1), and the mean distance sum_j p_ij |i - j|.
    A long run computes exactly these inside the graph, layer by layer (export._layer_reductions)."""
    p = _float(p)
    T = p.shape[-1]
    idx = np.arange(T)
    return {"first": p[..., :, 0], "last": p[..., :, -1], "diagonal": p[..., idx, idx],
            "previous": p[..., idx[1:], idx[:-1]], "next": p[..., idx[:-1], idx[1:]],
            "distance": np.einsum("...qk,qk->...q", p, np.abs(idx[:, None] - idx[None, :]).astype(p.dtype))}


def _mean(rows: np.ndarray) -> np.ndarray:
    """Mean over queries; 0 when there are none (previous/next of a one-token text)."""
    return rows.mean(axis=-1) if rows.shape[-1] else np.zeros(rows.shape[:-1], rows.dtype)


def summarize(rows: dict[str, np.ndarray], row_entropy: np.ndarray) -> dict[str, np.ndarray]:
    """HEAD_STATS from head_rows and the row entropy: each the mean over query rows."""
    return {"mean_entropy": row_entropy.mean(axis=-1), "first_token_mass": _mean(rows["first"]),
            "last_token_mass": _mean(rows["last"]), "diagonal_mass": _mean(rows["diagonal"]),
            "previous_token_mass": _mean(rows["previous"]), "next_token_mass": _mean(rows["next"]),
            "mean_distance": _mean(rows["distance"])}


def sentences(segments) -> np.ndarray:
    """Sentence (0 = A, 1 = B) of each token from the tokenizer's segments (0, 1, -1 for an added special token):
    a special token belongs to the sentence before it, [CLS] to A. [T]"""
    out, current = [], 0
    for s in segments:
        current = s if s >= 0 else current
        out.append(current)
    return np.asarray(out, np.int64)


def head_stats(p: np.ndarray, row_entropy: np.ndarray | None = None, segments=None) -> dict[str, np.ndarray]:
    """Per head [...]: the means over query rows of what each head is known for.

    first/last token mass: weight on key 0 ([CLS]) and key T-1 ([SEP] for BERT);
    diagonal / previous / next-token mass: weight on key i / i-1 / i+1 from query i (averaged over the queries
    that have one); mean distance: sum_j p_ij |i - j|, in tokens. Pass row_entropy if it is already computed.
    With `segments` of a sentence pair, also cross-sentence mass: the weight each query puts on the other
    sentence's keys (see `sentences`), averaged over all queries.
    """
    out = summarize(head_rows(p), entropy(p) if row_entropy is None else row_entropy)
    if segments is not None and 1 in segments:
        s = sentences(segments)
        other = (s[:, None] != s[None, :]).astype(p.dtype)                   # [T, T] 1 where key is in the other
        out["cross_sentence_mass"] = np.einsum("...qk,qk->...q", _float(p), other).mean(axis=-1)
    return out


def rollout(attentions: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) over layers of [L, H, T, T]: how much each token's
    final representation draws on each input token, counting the residual path as identity. [T, T]"""
    A = np.asarray(attentions, np.float64).mean(axis=1)                   # [L, T, T], heads averaged
    A = residual * np.eye(A.shape[-1]) + (1 - residual) * A
    out = np.eye(A.shape[-1])
    for layer in A:
        out = layer @ out
    return out / out.sum(axis=-1, keepdims=True)


def block_edges(T: int, size: int) -> np.ndarray:
    """The thumbnail block rule, the same on every path: min(size, T) blocks splitting T as evenly as possible;
    block r covers tokens edges[r]..edges[r + 1] - 1. [min(size, T) + 1]"""
    return np.linspace(0, T, min(size, T) + 1).astype(int)


def pooling_matrix(T: int, size: int) -> np.ndarray:
    """[T, R] with 1/|block r| on block r's tokens: pool^T p pool is downsample(p, size) as two matrix products
    (how a long run pools inside the graph). The identity when T <= size, as downsample leaves p alone."""
    edges = block_edges(T, size)
    pool = np.zeros((T, len(edges) - 1), np.float32)
    for r, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        pool[a:b, r] = 1.0 / (b - a)
    return pool


def downsample(p: np.ndarray, size: int) -> np.ndarray:
    """Block-average the last two axes to at most size x size (for overview thumbnails).

    Blocks follow block_edges (T split as evenly as possible), so each output cell is the mean weight of its block.
    """
    T_q, T_k = p.shape[-2], p.shape[-1]
    if size <= 0:
        raise ValueError(f"resolution must be positive; got {size}")
    if T_q <= size and T_k <= size:
        return np.asarray(p)
    p = np.asarray(p, np.float64)
    rq, rk = block_edges(T_q, size), block_edges(T_k, size)
    sums = np.add.reduceat(np.add.reduceat(p, rq[:-1], axis=-2), rk[:-1], axis=-1)
    return sums / (np.diff(rq)[:, None] * np.diff(rk)[None, :])


def top_keys(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k keys with the most weight for every query row, heaviest first, ties to the lower key index (as
    ONNX TopK orders them): (indices int32 [..., Tq, k'], weights [..., Tq, k']), k' = min(k, Tk)."""
    p = np.asarray(p)
    k = min(int(k), p.shape[-1])
    idx = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    return idx.astype(np.int32), np.take_along_axis(p, idx, axis=-1)


# ---- head-finding scores ------------------------------------------------------------------------------
# Each is a number per head in [0, 1]: the mean, over the queries for which the role has a target, of the weight
# the head puts on that target. Roles from the circuits literature (Elhage et al. 2021; Olsson et al. 2022;
# TransformerLens' head detectors).
SCORE_INFO = {
    "previous_token": "weight on key i-1 from query i, mean over queries i >= 1",
    "next_token": "weight on key i+1 from query i, mean over queries i < T-1 (0 under a causal mask)",
    "duplicate_token": "weight on earlier keys holding the same token as query i, mean over the queries whose "
                       "token occurred earlier (on this text)",
    "induction": "on a probe of N random tokens repeated twice (the API runs it): weight from query i in the "
                 "second copy on key i-N+1, the token after the same token's first occurrence, mean over the "
                 "second copy (TransformerLens' induction score)",
    "first_token_sink": "weight on key 0 from every query i >= 1 (query 0 has only itself under a causal mask)",
    "last_token": "weight on the last key ([SEP] for BERT), mean over all queries",
}


def same_token_keys(token_ids) -> np.ndarray:
    """[Tq, Tk] True where key j < i holds query i's own token."""
    ids = np.asarray(token_ids)
    return (ids[:, None] == ids[None, :]) & np.tri(len(ids), k=-1, dtype=bool)


def duplicate_token_score(p: np.ndarray, token_ids, mass: np.ndarray | None = None) -> np.ndarray:
    """Weight on earlier keys with query i's own token, averaged over the queries that have one. [...]
    `mass` [..., Tq]: that weight per query, when already computed (a long run computes it in the graph)."""
    same = same_token_keys(token_ids)
    has = same.any(axis=-1)
    if not has.any():
        return np.zeros(np.shape(p)[:-2] if mass is None else mass.shape[:-1], np.float32)
    if mass is None:
        mass = np.einsum("...qk,qk->...q", p, same.astype(p.dtype))                # [..., Tq]
    return mass[..., has].mean(axis=-1)


def induction_score(p: np.ndarray, n: int, offset: int = 0) -> np.ndarray:
    """On a probe [offset tokens] + r_1..r_n + r_1..r_n: weight from query offset+n+k on key offset+k+1,
    mean over k = 0..n-2 (the second copy's queries that have a 'next token after the first copy'). [...]"""
    q = offset + n + np.arange(n - 1)
    return p[..., q, q - n + 1].mean(axis=-1)


def head_scores(p: np.ndarray, token_ids, rows: dict[str, np.ndarray] | None = None,
                duplicate_mass: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every score that the text itself defines (all but the induction probe's). Each [...].
    From p, or from its head_rows and per-query duplicate-token mass when those are given (p is then unused)."""
    rows = head_rows(p) if rows is None else rows
    first = rows["first"]
    return {"previous_token": _mean(rows["previous"]), "next_token": _mean(rows["next"]),
            "duplicate_token": duplicate_token_score(p, token_ids, duplicate_mass),
            "first_token_sink": _mean(first[..., 1:]), "last_token": _mean(rows["last"])}


def probe_ids(vocab_size: int, n: int, avoid: set[int], seed: int = 0) -> list[int]:
    """N distinct random token ids (no special tokens) repeated twice: the induction probe."""
    rng = np.random.default_rng(seed)
    pool = np.setdiff1d(np.arange(vocab_size), np.fromiter(avoid, int, len(avoid)))
    first = rng.choice(pool, size=n, replace=False).tolist()
    return first + first
