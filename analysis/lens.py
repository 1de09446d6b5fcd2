"""Reading tokens out of the residual stream: the logit lens (nostalgebraist 2020) and a head's logit lens.

    logit lens    the stream after the embeddings and after each block, through the final norm and the
                  unembedding, as if the model stopped there: logits_r = N_f(x_r) W_U^T. The last row is the
                  model's own prediction.
    head lens     what one head writes at each position, head_p = z_p W_O,h, through the final norm with its scale
                  frozen at the run's value (analysis/norms.py) and the unembedding: its direct effect on every
                  logit, the same quantity direct logit attribution gives per head. The tokens it pushes up most
                  (promotes) and down most (suppresses).

Both need an unembedding: an LM head, or a decoder's tied token embeddings (model.unembedding).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.precision import COMPUTE
from ..model.functional import soft_cap
from .norms import FrozenNorm
from .qk import head_outputs


def top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest entries of each row of x [n, V] and their indices, largest first (ties: the lower index).
    k passes of argmax, each winner set aside (x is restored): for a small k over a vocabulary-wide row, several
    times faster than a partition."""
    k, rows = min(k, x.shape[-1]), np.arange(len(x))
    idx = np.empty((len(x), k), np.int64)
    for i in range(k):
        idx[:, i] = x.argmax(axis=-1)
        if i == 0:
            vals = np.empty((len(x), k), x.dtype)
        vals[:, i] = x[rows, idx[:, i]]
        x[rows, idx[:, i]] = -np.inf
    for i in range(k):
        x[rows, idx[:, i]] = vals[:, i]
    return idx, vals


@dataclass(frozen=True)
class Lens:
    """The logit lens of one text: rows = the stream after the embeddings and after each block."""
    top_ids: np.ndarray        # [R, T, k] int64, most probable first
    top_probs: np.ndarray      # [R, T, k] float32
    next_probs: np.ndarray     # [R, T] float32: p(the token that comes next); 0 at the last position


def logit_lens(model, residual: np.ndarray, ids, k: int) -> Lens:
    """residual [R, T, D] (a Trace's: the stream entering each block, and leaving the last) -> its Lens."""
    W = model.unembedding                                                      # [V, D]
    ids = np.asarray(ids, np.int64)
    R, T, _ = residual.shape
    top_ids, top_probs, next_probs = np.zeros((R, T, k), np.int64), np.zeros((R, T, k), COMPUTE), \
        np.zeros((R, T), COMPUTE)
    for r in range(R):
        x = residual[r] if model.ln_f is None else model.ln_f(residual[r])
        logits = soft_cap(x @ W.T, model.cfg.final_softcap)                    # [T, V] (Gemma 2: capped)
        top_ids[r], values = top_k(logits, k)
        following = logits[np.arange(T - 1), ids[1:]]                          # [T - 1] the next token's logit
        m = values[:, :1]                                                      # each row's max
        logits -= m                                                            # in place: a [T, V] array is 50 MB
        lse = m[:, 0] + np.log(np.exp(logits, out=logits).sum(axis=-1))        # [T] log-sum-exp
        top_probs[r] = np.exp(values - lse[:, None])
        next_probs[r, :-1] = np.exp(following - lse[:-1])
    return Lens(top_ids, top_probs, next_probs)


@dataclass(frozen=True)
class HeadLens:
    """A head's direct effect on the logits at each position: the tokens it promotes and suppresses most."""
    layer: int
    head: int
    promoted_ids: np.ndarray       # [T, k], largest logit first
    promoted_logits: np.ndarray    # [T, k]
    suppressed_ids: np.ndarray     # [T, k], most negative first
    suppressed_logits: np.ndarray  # [T, k]


def head_lens(model, z: np.ndarray, final: np.ndarray, layer: int, head: int, k: int) -> HeadLens:
    """z [T, d_head] the head's output before W_O at each position; final [T, D] the stream leaving the last block
    (where the final norm's scale is frozen)."""
    part = head_outputs(model, layer, np.asarray(z)[None], [head])[0]         # [T, D]
    logits = FrozenNorm.of(model.ln_f, final)(part).astype(COMPUTE) @ model.unembedding.T     # [T, V]
    up, up_vals = top_k(logits, k)
    down, down_vals = top_k(np.negative(logits, out=logits), k)
    return HeadLens(layer, head, up, up_vals, down, -down_vals)
