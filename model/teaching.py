"""A tiny GPT-2 style decoder whose first heads are wired by hand, so each shows one textbook pattern.

Positions are sinusoids in the first 16 features and tokens live in the rest, with feature 16 marking
the first token ([CLS], used as beginning-of-sequence). A head's pattern is then a choice of W_q, W_k:
  q_i . k_j = (R q-features of i) . (k-features of j), so rotating position i back by one step makes
  query i match key i-1 best (a previous-token head), not rotating matches i itself (a self head),
  a constant query against the BOS marker makes every query look at token 0 (an attention sink),
  a zero query scores every key equally (a running average of the past), and projecting token
  features through the same matrix on both sides matches equal tokens (a same-token head).
Every other weight is seeded random; the remaining heads show what untrained attention looks like.
"""
from __future__ import annotations

import numpy as np

from .transformer import Transformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=30522, max_positions=512, d_model=64, n_heads=4, n_layers=4, d_ff=256,
                           norm_first=True, causal=True, final_norm=True)
N_FREQ = 8                    # sinusoid pairs in features 0..15
BOS_FEATURE = 2 * N_FREQ      # feature 16 marks the first token
BOS_ID = 101                  # [CLS] in MiniLM's vocabulary
PATTERNS = {(0, 0): "previous token", (0, 1): "first token (sink)", (0, 2): "self", (0, 3): "uniform over the past",
            (1, 0): "same token", (1, 1): "two tokens back"}


def _rotation(steps: int) -> np.ndarray:
    """Block-diagonal [16, 16] rotation turning position i's sinusoids into position i - steps'."""
    R = np.zeros((2 * N_FREQ, 2 * N_FREQ))
    for f, w in enumerate(_freqs()):
        c, s = np.cos(w * steps), np.sin(w * steps)
        R[2 * f:2 * f + 2, 2 * f:2 * f + 2] = [[c, s], [-s, c]]  # [cos a, sin a] -> [cos(a - w), sin(a - w)]
    return R


def _freqs() -> np.ndarray:
    return 1.0 / (40.0 ** (np.arange(N_FREQ) / N_FREQ))  # from 1 rad/token down to ~1/25


def wired_gpt(seed: int = 1234, gain: float = 12.0) -> Transformer:
    cfg = CONFIG
    model = Transformer(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    D, dh, P = cfg.d_model, cfg.d_head, 2 * N_FREQ

    pos = np.arange(cfg.max_positions)[:, None] * _freqs()[None, :]
    model.wpe = np.zeros((cfg.max_positions, D), np.float32)
    model.wpe[:, 0:P:2], model.wpe[:, 1:P:2] = np.cos(pos), np.sin(pos)
    model.wte[:, :P + 1] = 0.0
    model.wte[:, P + 1:] = rng.standard_normal((cfg.vocab_size, D - P - 1)) * 0.4
    model.wte[BOS_ID, BOS_FEATURE] = 4.0

    same_token = np.linalg.qr(rng.standard_normal((D - P - 1, dh)))[0].T      # [dh, 47], orthonormal rows
    for (layer, head), pattern in PATTERNS.items():
        p = model.blocks[layer].attn.params
        q, k = slice(head * dh, (head + 1) * dh), slice(D + head * dh, D + (head + 1) * dh)
        Wq, Wk = np.zeros((dh, D)), np.zeros((dh, D))
        bq = np.zeros(dh)
        if pattern in ("previous token", "self", "two tokens back"):
            steps = {"previous token": 1, "self": 0, "two tokens back": 2}[pattern]
            Wq[:, :P], Wk[:, :P] = gain * _rotation(steps), np.eye(P)
        elif pattern == "first token (sink)":
            bq[0], Wk[0, BOS_FEATURE] = gain, gain / 2
        elif pattern == "same token":
            Wq[:, P + 1:], Wk[:, P + 1:] = gain / 2 * same_token, same_token
        p["in_proj_weight"][q], p["in_proj_weight"][k] = Wq, Wk
        p["in_proj_bias"][q], p["in_proj_bias"][k] = bq, 0.0
    for block in model.blocks[:2]:   # keep the residual stream's positions readable for layer 1
        block.attn.params["out_proj.weight"] *= 0.1
    return model
