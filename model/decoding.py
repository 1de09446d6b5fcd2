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
model/interventions.py). `masks` (KeyMasks) carries a cache policy's (model/kv_policies.py): the additive mask on
every query (causal, plus a band), the keys each layer's key/value heads have evicted (added for every query head of
the group), and which queries' attention the step sums per key (`step.received`, what H2O and SnapKV score). Positions
never change: an evicted key is only masked. graphs/decoding.py writes this step as the ONNX graph generation runs
(runtime/generation.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .functional import repeat_kv
from .masks import causal_mask, combine
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
class KeyMasks:
    """A step's masks under a cache policy (model/kv_policies.py), for t new tokens after P cached ones."""
    attention: np.ndarray        # [B, 1, t, P+t] additive, every layer's: causal, plus a policy's band (streaming)
    keys: np.ndarray             # [B, L, Hkv, P+t] additive: the keys each layer's key/value heads have evicted
    votes: np.ndarray            # [B, t] each new query's weight in Step.received

    @classmethod
    def plain(cls, cfg, B: int, t: int, P: int) -> KeyMasks:
        """The full cache: causal, nothing evicted, no votes."""
        return cls(np.broadcast_to(causal_mask(t, P + t, start=P), (B, 1, t, P + t)).copy(),
                   np.zeros((B, cfg.n_layers, cfg.n_kv_heads, P + t), COMPUTE), np.zeros((B, t), COMPUTE))


@dataclass
class Step:
    logits: np.ndarray           # [B, V] after the last new token
    attentions: np.ndarray       # [L, B, H, P+t] the last new token's attention over every key
    cache: KVCache
    received: np.ndarray | None = None       # [L, B, Hkv, P+t] attention per key, summed over the voting queries
    head_outputs: np.ndarray | None = None   # [L, B, H, d_head] the last new token's z (hook_z, before knock-outs)


def decode(model, input_ids, cache: KVCache, keep: np.ndarray | None = None, masks: KeyMasks | None = None) -> Step:
    """One generation step of a decoder with an LM head: the new tokens input_ids [B, t] after cache's P tokens.
    Written out as TransformerBlock computes it, the keys and values of earlier positions read from the cache; each
    layer's mask the step's attention mask plus its evicted keys, repeated for the query heads of each key/value head."""
    cfg = model.cfg
    if not (cfg.causal and cfg.lm_head):
        raise ValueError("decoding needs a decoder with an LM head (a causal model that predicts the next token)")
    ids = np.asarray(input_ids, np.int64)
    B, t = ids.shape
    P = cache.length
    masks = KeyMasks.plain(cfg, B, t, P) if masks is None else masks
    group = cfg.n_heads // cfg.n_kv_heads
    votes = compute_array(masks.votes)[:, None, :, None]                         # [B, 1, t, 1]
    x = model.embed(ids, start=P)                                                 # [B, t, D]
    keys, values, rows, received, z = [], [], [], [], []
    for layer, block in enumerate(model.blocks):
        ablate = None if keep is None else knockout(keep[:, layer], B, t)        # knocked-out heads write zero
        mask = combine(masks.attention, repeat_kv(masks.keys[:, layer, :, None], group))   # [B, H, t, P+t]
        seen = {}
        x, probs, (k, v) = block(x, mask, ablate, past=(cache.keys[layer], cache.values[layer]), start=P,
                                 hook=lambda site, value: seen.setdefault(site, value))
        keys.append(k)                                                            # [B, Hkv, P+t, dh]
        values.append(v)
        rows.append(probs[:, :, -1])                                              # [B, H, P+t]
        received.append((probs * votes).sum(2).reshape(B, cfg.n_kv_heads, group, -1).sum(2))   # [B, Hkv, P+t]
        z.append(seen["head_output"][:, :, -1])                                   # [B, H, dh]
    last = x[:, -1]                                                               # [B, D]
    if model.ln_f is not None:
        last = model.ln_f(last)
    return Step(logits(model, last), np.stack(rows), KVCache(keys, values), np.stack(received), np.stack(z))


def knockout(keep: np.ndarray, B: int, t: int) -> tuple:
    """A layer's head mask (functional.ablate_heads) from keep [B, H]: 0 makes a head's output zero."""
    keep = compute_array(keep)
    return keep, np.zeros_like(keep), np.zeros((B, t), COMPUTE)
