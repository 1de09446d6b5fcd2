"""Attention rollout (Abnar & Zuidema 2020): what each token's final representation draws on, through every layer."""
from __future__ import annotations

import numpy as np


def rollout(attentions: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) over layers of [L, H, T, T]: how much each token's
    final representation draws on each input token, counting the residual path as identity. [T, T]"""
    A = np.asarray(attentions, np.float64).mean(axis=1)                   # [L, T, T], heads averaged
    A = residual * np.eye(A.shape[-1]) + (1 - residual) * A
    out = np.eye(A.shape[-1])
    for layer in A:
        out = layer @ out
    return out / out.sum(axis=-1, keepdims=True)
