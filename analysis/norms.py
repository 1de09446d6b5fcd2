"""A norm with its scale frozen at a run's value: a linear map (plus a constant), so that whatever is a sum before
it stays a sum after it.

    LayerNorm  N(x) = (x - mean(x)) * s * g + b,   s = 1 / sqrt(var(x) + eps)
    RMSNorm    N(x) = x * s * g,                   s = 1 / sqrt(mean(x^2) + eps)

With s fixed at the value the run computed from the whole x, N(sum_c c) = sum_c F(c) + b, where F(c) = (c - mean(c))
* s * g (LayerNorm) or c * s * g (RMSNorm). Direct logit attribution (the final norm), QK attribution (each block's
input norm, and a post-norm model's norms along the stream) and the head logit lens read a norm this way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.transformer import LayerNorm


@dataclass(frozen=True)
class FrozenNorm:
    scale: np.ndarray          # [..., D] g * s at each position (float64)
    centre: bool               # LayerNorm: every part is centred first
    bias: np.ndarray | None    # [D] LayerNorm's b: the constant the sum gains; None for RMSNorm (or no norm)

    @classmethod
    def of(cls, norm, x: np.ndarray) -> "FrozenNorm":
        """The norm (LayerNorm, RMSNorm, or None: the identity) frozen at its input x [..., D]."""
        x = np.asarray(x, np.float64)
        if norm is None:
            return cls(np.ones_like(x), False, None)
        g = np.asarray(norm.weight, np.float64)
        if isinstance(norm, LayerNorm):
            return cls(g / np.sqrt(x.var(axis=-1, keepdims=True) + norm.eps), True, np.asarray(norm.bias, np.float64))
        return cls(g / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + norm.eps), False, None)

    def __call__(self, parts: np.ndarray) -> np.ndarray:
        """F(part) for parts [..., D] (broadcast against the scale's positions): the linear part of the norm."""
        parts = np.asarray(parts, np.float64)
        return (parts - parts.mean(axis=-1, keepdims=True) if self.centre else parts) * self.scale
