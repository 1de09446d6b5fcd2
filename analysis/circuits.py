"""Weight-space circuits (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"): what a head
does, read from its weights alone.

In the row-vector convention (x W), head h has W_Q, W_K, W_V [D, d_head] and W_O [d_head, D] (in a grouped-query
model, W_K and W_V of the key/value head it reads), and two D x D circuits:

    QK = W_Q W_K^T     which residual directions attend to which (the score is x_i QK x_j^T, RoPE aside)
    OV = W_V W_O       what the head writes for what it reads

OV copying score: the full OV circuit from tokens to logits, W_E OV W_U [V, V]; its eigenvalues' sum over the sum of
their absolute values, in [-1, 1] (positive: the head raises the logit of the token it attends to, a copying head).
Its non-zero eigenvalues are those of the d_head x d_head matrix W_O W_U W_E W_V, so the V x V matrix is never made.

Composition of an earlier head a (the writer) into a later head b (the reader), ||M||_F / (||A||_F ||B||_F):

    Q-composition   M = OV_a QK_b       a's output feeds b's queries
    K-composition   M = OV_a QK_b^T     a's output feeds b's keys
    V-composition   M = OV_a OV_b       a's output feeds b's values

as TransformerLens' `all_composition_scores` computes them. The norms' weights are folded in (a block's input norm
into W_Q, W_K, W_V; the final norm into W_U) and, in a LayerNorm model, reading weights and W_O are centred
(LayerNorm removes each vector's mean), as TransformerLens' fold_ln and center_writing_weights do; the norms'
scales, which depend on the text, and RoPE's rotation, which depends on the offset, are left out.

Every Frobenius norm is taken through d_head x d_head factors: with R^T R = W^T W (R [d_head, d_head], QR's R),
||W_V,a W_O,a W_Q,b W_K,b^T||_F = ||R_V,a W_O,a W_Q,b R_K,b^T||_F, so one writer layer against every later reader
is one [H d_head, D] x [D, n d_head] product.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.precision import COMPUTE
from ..model.transformer import LayerNorm


@dataclass(frozen=True)
class HeadWeights:
    """Every head's matrices, norms folded in: [n, D, d_head] (W_O: [n, d_head, D]), n = layers x heads, head
    (l, h) at l * heads + h."""
    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray


def _centred(W: np.ndarray, axis: int) -> np.ndarray:
    """C W (axis -2) or W C (axis -1), C = I - 1/D the centring matrix: each column's (row's) mean removed."""
    return W - W.mean(axis=axis, keepdims=True)


def head_weights(model) -> HeadWeights:
    cfg = model.cfg
    H, dh, D = cfg.n_heads, cfg.d_head, cfg.d_model
    group = cfg.n_heads // cfg.n_kv_heads
    layer_norm = cfg.norm == "layer"
    out = {name: [] for name in ("W_Q", "W_K", "W_V", "W_O")}
    for block in model.blocks:
        attn = block.attn
        for name, proj, per in (("W_Q", "q_proj", 1), ("W_K", "k_proj", group), ("W_V", "v_proj", group)):
            W = np.asarray(attn.projection(proj)[0], np.float64).reshape(-1, dh, D).transpose(0, 2, 1)  # [Hkv, D, dh]
            if cfg.norm_first:                     # it reads N(x) = (x C) g s: C diag(g) W, the scale s left out
                W = W * np.asarray(block.ln1.weight, np.float64)[:, None]
                W = _centred(W, -2) if layer_norm else W
            out[name].append(np.repeat(W, per, axis=0))                                   # [H, D, dh]
        W_O = np.asarray(attn.projection("o_proj")[0], np.float64).reshape(D, H, dh).transpose(1, 2, 0)   # [H, dh, D]
        out["W_O"].append(_centred(W_O, -1) if layer_norm else W_O)
    return HeadWeights(**{name: np.concatenate(v) for name, v in out.items()})


def ov_copying(model, w: HeadWeights | None = None) -> np.ndarray:
    """[L, H] each head's OV copying score (module doc); NaN where its full OV circuit is zero."""
    w = head_weights(model) if w is None else w
    cfg = model.cfg
    W_U = np.asarray(model.unembedding, COMPUTE)                          # [V, D]
    if model.ln_f is not None:                                               # the final norm, folded into W_U
        W_U = W_U * np.asarray(model.ln_f.weight, COMPUTE)[None, :]
        if isinstance(model.ln_f, LayerNorm):
            W_U = W_U - W_U.mean(axis=1, keepdims=True)
    G = (W_U.T @ np.asarray(model.wte, COMPUTE)).astype(np.float64)       # [D, D]: W_U^T W_E, token to token
    M = w.W_O @ G @ w.W_V                                                    # [n, dh, dh]
    eig = np.linalg.eigvals(M)
    total = np.abs(eig).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.where(total > 1e-12 * max(1.0, total.max()), eig.sum(axis=-1).real / total, np.nan)
    return score.reshape(cfg.n_layers, cfg.n_heads)


@dataclass(frozen=True)
class Composition:
    """[n, n] scores of writer head a (row) into reader head b (column), n = layers x heads; 0 unless b's layer is
    later than a's."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray


def composition(model, w: HeadWeights | None = None) -> Composition:
    w = head_weights(model) if w is None else w
    cfg = model.cfg
    L, H, dh = cfg.n_layers, cfg.n_heads, cfg.d_head
    n = L * H

    def r(W: np.ndarray) -> np.ndarray:          # [n, D, dh] -> R [n, dh, dh] with R^T R = W^T W, so ||W X|| = ||R X||
        lam, U = np.linalg.eigh(W.transpose(0, 2, 1) @ W)                   # (what QR's R gives, also for rank < dh)
        return np.sqrt(np.maximum(lam, 0.0))[:, :, None] * U.transpose(0, 2, 1)

    R_Q, R_K, R_V, R_O = r(w.W_Q), r(w.W_K), r(w.W_V), r(w.W_O.transpose(0, 2, 1))
    left = (R_V @ w.W_O).astype(COMPUTE)                                  # [n, dh, D]: ||OV_a|| = ||left_a||
    rights = {"q": w.W_Q @ R_K.transpose(0, 2, 1),                           # [n, D, dh]: QK_b's factor
              "k": w.W_K @ R_Q.transpose(0, 2, 1),                           # QK_b^T's
              "v": w.W_V @ R_O.transpose(0, 2, 1)}                           # OV_b's
    left_norm = np.sqrt((left.astype(np.float64) ** 2).sum(axis=(1, 2)))     # [n]
    scores = {}
    for mode, right in rights.items():
        right_norm = np.sqrt((right ** 2).sum(axis=(1, 2)))                  # [n]
        right = np.ascontiguousarray(right.transpose(1, 0, 2).reshape(cfg.d_model, n * dh), COMPUTE)   # [D, n dh]
        S = np.zeros((n, n))
        for la in range(L - 1):
            writers, readers = slice(la * H, (la + 1) * H), slice((la + 1) * H, n)
            m = left[writers].reshape(H * dh, -1) @ right[:, (la + 1) * H * dh:]                 # [H dh, readers dh]
            frob = np.sqrt(np.square(m, out=m).reshape(H, dh, -1, dh).sum(axis=(1, 3), dtype=np.float64))
            with np.errstate(invalid="ignore", divide="ignore"):
                S[writers, readers] = np.nan_to_num(frob / (left_norm[writers, None] * right_norm[None, readers]))
        scores[mode] = S
    return Composition(**scores)
