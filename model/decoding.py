"""Decoding with a key/value cache: how generation adds a token without running the text before it again.

In a decoder a position's keys and values never change once computed (each position sees only the past), so a
generation step keeps every layer's keys and values of the tokens so far (the cache) and runs the new tokens alone:

    step = decode(model, ids, cache)     # ids [B, t]: new tokens at positions P..P+t-1 (P = cache.length)
    step.logits                          # [B, V] next-token logits after the last new token
    step.attentions                      # [L, B, H, P+t] the last new token's attention row over every key
    step.cache                           # the cache with the new tokens' keys and values appended

The first call takes the prompt with an empty cache (a plain forward pass), each later one the token just chosen.
Keys are kept after RoPE, one per key/value head (before grouped-query sharing), as transformers' DynamicCache keeps
them. `keep` [B, L, H] knocks heads out in every step: 0 makes a head's output zero (a head_output edit to zero,
model/interventions.py). graphs/decoding.py writes this step as the ONNX graph generation runs (runtime/generation.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .masks import causal_mask
from .precision import COMPUTE, compute_array
from .transformer import logits


@dataclass
class KVCache:
    keys: list[np.ndarray]       # per layer [B, Hkv, P, d_head], after RoPE (the served graph's: runtime Held tensors,
    values: list[np.ndarray]     # per layer [B, Hkv, P, d_head]            left on the device between steps)

    @classmethod
    def empty(cls, cfg, batch: int = 1) -> KVCache:
        shape = (batch, cfg.n_kv_heads, 0, cfg.d_head)
        return cls([np.zeros(shape, COMPUTE) for _ in range(cfg.n_layers)],
                   [np.zeros(shape, COMPUTE) for _ in range(cfg.n_layers)])

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]


@dataclass
class Step:
    logits: np.ndarray           # [B, V] after the last new token
    attentions: np.ndarray       # [L, B, H, P+t] the last new token's attention over every key
    cache: KVCache


def decode(model, input_ids, cache: KVCache, keep: np.ndarray | None = None) -> Step:
    """One generation step of a decoder with an LM head: the new tokens input_ids [B, t] after cache's P tokens.
    Written out as TransformerBlock computes it, the keys and values of earlier positions read from the cache."""
    cfg = model.cfg
    if not (cfg.causal and cfg.lm_head):
        raise ValueError("decoding needs a decoder with an LM head (a causal model that predicts the next token)")
    ids = np.asarray(input_ids, np.int64)
    B, t = ids.shape
    P = cache.length
    mask = causal_mask(t, P + t, start=P)                                         # [t, P+t]
    x = model.embed(ids, start=P)                                                 # [B, t, D]
    keys, values, rows = [], [], []
    for layer, block in enumerate(model.blocks):
        ablate = None if keep is None else knockout(keep[:, layer], B, t)        # knocked-out heads write zero
        x, probs, (k, v) = block(x, mask, ablate, past=(cache.keys[layer], cache.values[layer]), start=P)
        keys.append(k)                                                            # [B, Hkv, P+t, dh]
        values.append(v)
        rows.append(probs[:, :, -1])                                              # [B, H, P+t]
    last = x[:, -1]                                                               # [B, D]
    if model.ln_f is not None:
        last = model.ln_f(last)
    return Step(logits(model, last), np.stack(rows), KVCache(keys, values))


def knockout(keep: np.ndarray, B: int, t: int) -> tuple:
    """A layer's head mask (functional.ablate_heads) from keep [B, H]: 0 makes a head's output zero."""
    keep = compute_array(keep)
    return keep, np.zeros_like(keep), np.zeros((B, t), COMPUTE)
