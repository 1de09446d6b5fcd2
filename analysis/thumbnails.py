"""Pictures of many heads at once: block-averaged thumbnails (the model view, a long text's overview) and each
query's heaviest keys (the line view of a long text). The same block rule holds on every path: here in NumPy, and
inside the layer-by-layer graphs as pool^T p pool (graphs/reductions.py)."""
from __future__ import annotations

import numpy as np

from ..model.precision import COMPUTE

def block_edges(T: int, size: int) -> np.ndarray:
    """The thumbnail block rule, the same on every path: min(size, T) blocks splitting T as evenly as possible;
    block r covers tokens edges[r]..edges[r + 1] - 1. [min(size, T) + 1]"""
    return np.linspace(0, T, min(size, T) + 1).astype(int)


def block_ranges(T: int, size: int) -> list[list[int]]:
    """[start, end) token range of each thumbnail row/column block (block_edges), as the API lists them."""
    edges = block_edges(T, size)
    return [[int(a), int(b)] for a, b in zip(edges[:-1], edges[1:])]


def pooling_matrix(T: int, size: int) -> np.ndarray:
    """[T, R] with 1/|block r| on block r's tokens: pool^T p pool is downsample(p, size) as two matrix products
    (how a layer-by-layer run pools inside the graph). The identity when T <= size, as downsample leaves p alone."""
    edges = block_edges(T, size)
    pool = np.zeros((T, len(edges) - 1), COMPUTE)
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


