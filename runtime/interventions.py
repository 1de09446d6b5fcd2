"""Knocking heads out: the head-mask inputs every graph takes (functional.ablate_heads), from a list of heads, and
each head's single-head ablation effect on one text (head importance), batched along the batch axis."""
from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from .results import Encoding

Ablation = Literal["zero", "mean"]


def head_masks(ablate: Sequence[Sequence[int]], ablation: Ablation, layers: int, heads: int
               ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """[layer, head] pairs to knock out as the runtime's head_mask and head_mean [1, L, H]: a knocked-out head's
    output (before the output projection) becomes zero, or its mean over the text's positions. None, None keeps
    every head."""
    if not ablate:
        return None, None
    keep = np.ones((1, layers, heads), np.float32)
    for layer, head in ablate:
        keep[0, layer, head] = 0.0
    return keep, (1.0 - keep) if ablation == "mean" else np.zeros_like(keep)


def head_importance(rt, text: str | Encoding, *, ablation: Ablation = "zero", batch: int = 16,
                    pair: str | None = None) -> tuple[np.ndarray, float]:
    """Each head's single-head ablation effect on a text (or its Encoding), for every head: [L, H], and the intact
    run's value.

    Decoders (an LM head): the change in the text's mean token log-prob when that head alone is knocked out
    (negative: the head helps predict this text). Encoders: 1 - cosine similarity of the mean-pooled final
    hidden states (the sentence embedding) with and without the head. The text is run `batch` times at once,
    the batch axis carrying different head masks; the first run of all keeps every head."""
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    enc = rt.encode(text, pair) if isinstance(text, str) else text
    masks = np.ones((L * H + 1, L, H), np.float32)          # row 0 intact, row 1 + l*H + h ablates (l, h)
    masks[1:].reshape(L * H, L * H)[np.arange(L * H), np.arange(L * H)] = 0.0
    values = []
    for start in range(0, len(masks), batch):
        keep = masks[start:start + batch]
        mean = (1.0 - keep) if ablation == "mean" else np.zeros_like(keep)
        for r in rt.forward([enc] * len(keep), head_mask=keep, head_mean=mean, top_k=0):
            if r.token_logprobs is not None:
                values.append(np.mean(r.token_logprobs[1:]) if len(r.token_logprobs) > 1 else 0.0)
            else:
                values.append(r.hidden.mean(axis=0).astype(np.float64))
    if isinstance(values[0], np.ndarray):
        e = np.stack(values)
        cos = e[1:] @ e[0] / (np.linalg.norm(e[1:], axis=1) * np.linalg.norm(e[0]))
        return (1.0 - cos).reshape(L, H), 1.0
    v = np.asarray(values)
    return (v[1:] - v[0]).reshape(L, H), float(v[0])
