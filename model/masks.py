"""Attention masks, all turned into one additive float mask.

An additive mask holds 0 where a query may look at a key and MASKED (a huge negative number) where
it may not; it is added to the scaled scores before the softmax, so masked keys get weight exactly 0.
MASKED is float32's lowest finite value rather than -inf, as Hugging Face does: a query whose every
key is masked then spreads evenly instead of producing NaN, and sums of masks clip instead of
overflowing. Boolean masks follow PyTorch's convention: True means *masked out*.
"""
from __future__ import annotations

import numpy as np

from .precision import COMPUTE, MASKED, scalar   # MASKED: the compute type's lowest finite value


def causal_mask(t_query: int, t_key: int | None = None, start: int = 0) -> np.ndarray:
    """Look-ahead mask [Tq, Tk]: query i, at position start + i, may see keys 0..start+i, never a later one (the
    future). start > 0: new tokens after `start` cached ones (model/decoding.py)."""
    t_key = t_query if t_key is None else t_key
    future = np.triu(np.ones((t_query, t_key), dtype=bool), k=1 + start)
    return to_additive(future)


def sliding_window_mask(t_query: int, t_key: int, window: int, start: int = 0) -> np.ndarray:
    """A local layer's band [Tq, Tk] (sliding-window attention, Beltagy et al. 2020; Mistral, Gemma): the query at
    position start + i sees only the last `window` keys, its own included: key j is hidden when start + i - j >= window
    (transformers' sliding_window_overlay). With the causal mask it leaves each query window keys at most."""
    distance = (start + np.arange(t_query))[:, None] - np.arange(t_key)[None, :]     # [Tq, Tk]
    return to_additive(distance >= window)


def padding_mask(keep: np.ndarray) -> np.ndarray:
    """From a [B, S] keep-mask (1 = real token, 0 = padding) to an additive [B, 1, 1, S] mask on keys."""
    keep = np.asarray(keep)
    if keep.ndim != 2:
        raise ValueError(f"padding keep-mask must be [batch, keys]; got shape {keep.shape}")
    return to_additive(keep == 0)[:, None, None, :]


def to_additive(mask: np.ndarray) -> np.ndarray:
    """Boolean (True = masked out) to additive float32; float masks pass through as float32."""
    mask = np.asarray(mask)
    if mask.dtype == bool:
        return np.where(mask, MASKED, scalar(0.0)).astype(COMPUTE)
    if not np.issubdtype(mask.dtype, np.floating):
        raise TypeError(f"a mask must be boolean (True = masked out) or additive float; got dtype {mask.dtype}")
    return mask.astype(COMPUTE, copy=False)


def combine(*masks: np.ndarray | None) -> np.ndarray | None:
    """Sum any number of masks (boolean or additive, broadcastable) into one additive mask."""
    masks = [to_additive(m) for m in masks if m is not None]
    if not masks:
        return None
    out = masks[0]
    with np.errstate(over="ignore"):
        for m in masks[1:]:
            out = out + m
    return np.maximum(out, MASKED)
