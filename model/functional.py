"""The few pure functions a transformer is made of, in NumPy.

Every function works on the last axis (or the last two) and broadcasts over the rest, so the same
code serves one head or a batch of heads. Arrays stay in the dtype they come in (float32 here).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import erf


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)), after subtracting the row max so exp never overflows.

    A key masked with a very large negative number (see masks.MASKED) becomes exactly 0 here,
    which is why masks are added to the scores *before* the softmax: afterwards the row would no
    longer sum to 1.
    """
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Normalise each position's features to mean 0, variance 1 (biased), then scale and shift."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, the exact form x * Phi(x) with the Gaussian CDF written through erf (not the tanh fit)."""
    return (0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(x.dtype, copy=False)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x @ W^T + b with W stored [out, in], as PyTorch and Hugging Face store it."""
    y = x @ weight.T
    return y if bias is None else y + bias


class AttentionStages(NamedTuple):
    """Every intermediate of scaled dot-product attention, for teaching: all [..., Tq, Tk]."""

    scores: np.ndarray  # q . k^T
    scaled: np.ndarray  # scores / (sqrt(d_head) * temperature)
    masked: np.ndarray  # scaled + additive mask
    probs: np.ndarray   # softmax(masked) over keys


def attention_stages(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None = None,
                     temperature: float = 1.0) -> AttentionStages:
    """The steps from queries and keys to attention probabilities.

    q: [..., Tq, d], k: [..., Tk, d], mask: additive, broadcastable to [..., Tq, Tk].
    Dot products of d-dimensional vectors with unit-variance entries have variance d; dividing by
    sqrt(d) keeps the logits at unit scale so the softmax does not saturate into a one-hot that
    passes no gradient. The temperature divides further: > 1 flattens, < 1 sharpens.
    """
    scores = q @ np.swapaxes(k, -1, -2)                                   # [..., Tq, Tk]
    scaled = scores * np.asarray(1.0 / (np.sqrt(q.shape[-1]) * temperature), dtype=q.dtype)
    masked = scaled if mask is None else scaled + mask
    return AttentionStages(scores, scaled, masked, softmax(masked, axis=-1))


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                                 mask: np.ndarray | None = None,
                                 temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q k^T / sqrt(d) + mask) v. Returns (output [..., Tq, dv], weights [..., Tq, Tk])."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension (d_head); got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys; got {k.shape[-2]} and {v.shape[-2]}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    probs = attention_stages(q, k, mask, temperature).probs
    return probs @ v, probs
