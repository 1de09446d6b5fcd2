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

from .functional import linear, repeat_kv, soft_cap, softmax
from .masks import causal_mask


@dataclass
class KVCache:
    keys: list[np.ndarray]       # per layer [B, Hkv, P, d_head], after RoPE
    values: list[np.ndarray]     # per layer [B, Hkv, P, d_head]

    @classmethod
    def empty(cls, cfg, batch: int = 1) -> KVCache:
        shape = (batch, cfg.n_kv_heads, 0, cfg.d_head)
        return cls([np.zeros(shape, np.float32) for _ in range(cfg.n_layers)],
                   [np.zeros(shape, np.float32) for _ in range(cfg.n_layers)])

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
    P, group = cache.length, cfg.n_heads // cfg.n_kv_heads
    mask = causal_mask(t, P + t, start=P)                                         # [t, P+t]
    x = model.embed(ids, start=P)                                                 # [B, t, D]
    keys, values, rows = [], [], []
    for layer, block in enumerate(model.blocks):
        h = block.attention_input(x)
        q, k, v = block.attn.project(h, start=P)                                  # q [B, H, t, dh]; k, v [B, Hkv, t, dh]
        k = np.concatenate([cache.keys[layer], k], axis=2)                        # [B, Hkv, P+t, dh]
        v = np.concatenate([cache.values[layer], v], axis=2)
        keys.append(k)
        values.append(v)
        scores = q @ np.swapaxes(repeat_kv(k, group), -1, -2) / np.float32(
            np.sqrt(cfg.query_pre_attn_scalar or cfg.d_head) * cfg.temperature)
        scores = soft_cap(scores, cfg.attn_softcap)                               # Gemma 2 (0: as it was)
        probs = softmax(scores + block.local_mask(mask, t, P + t, start=P), axis=-1)   # [B, H, t, P+t]
        z = probs @ repeat_kv(v, group)                                           # [B, H, t, dh]
        if keep is not None:
            z = z * np.asarray(keep, np.float32)[:, layer, :, None, None]         # knocked-out heads write zero
        a = linear(z.transpose(0, 2, 1, 3).reshape(B, t, -1), *block.attn.out_projection())   # [B, t, D]
        x = block.after_attention(x, a)
        rows.append(probs[:, :, -1])                                              # [B, H, P+t]
    last = x[:, -1]                                                               # [B, D]
    if model.ln_f is not None:
        last = model.ln_f(last)
    return Step(soft_cap(last @ model.unembedding.T, cfg.final_softcap), np.stack(rows), KVCache(keys, values))
