"""Key/value-cache eviction policies: which keys each key/value head keeps while a decoder generates.

A policy never moves a key: an evicted key is masked (its additive mask MASKED, so its weight is exactly 0) for every
later query, and every position keeps its RoPE position. That is how the papers' own "simulation" code evaluates
them, and what a real cache that drops the key's row computes (the same softmax over the same kept keys). The rules,
as implemented here (i: a query's position, j: a key's, P: the prompt's length):

full        every key is kept (plain generation).
streaming   StreamingLLM (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"): key j is
            kept for query i iff j < sinks or i - j < window. The rule is a band, so it masks the prompt's queries
            too, and every layer and head keeps the same keys.
h2o         H2O (Zhang et al. 2023, "Heavy-Hitter Oracle"), as its real-drop cache (H2OKVCache_LayerWise) runs: the
            prompt runs with the full cache; each key's score is the attention it has received, summed over every
            query so far (the prompt's and each generated token's, under the policy) and over the query heads that
            share its key/value head; after the prompt and after each step, a cache over `budget` keys keeps the
            last `recent` positions and the budget - recent highest-scoring of the others. The first new token is
            therefore the full cache's; query i sees at most budget + 1 keys (its own included).
snapkv      SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You Are Looking for Before Generation"), compressing the
            prompt once: the last `window` prompt queries (the observation window) vote with their attention on the
            earlier keys (softmax over all keys, summed over those queries and over the query heads sharing a key/
            value head), the votes are pooled along the keys (avg_pool1d or max_pool1d, kernel `kernel`, stride 1,
            padding kernel // 2, the average counting the padding as torch does), and each key/value head keeps the
            budget - window best-voted prefix keys and the window itself; a prompt of fewer than `budget` tokens is
            kept whole. Generated tokens are never evicted. The first new token is the full cache's.
Budgets count keys per key/value head: one number for every layer and head, one per layer, or one per layer and
key/value head ([layer][kv_head]); a head's rule runs on its own budget alone, so a per-layer budget keeps, in each
layer, what that layer's number would keep everywhere, until the layers' different evictions change later queries.
Defaults: H2O none (the paper splits the budget evenly, recent = budget / 2); SnapKV window 32, kernel 5, avg. Ties go to the earlier position
(a stable sort), where torch.topk's order is unspecified. Grouped-query heads share their key/value head's choice (the
scores summed over the group; the original H2O and SnapKV were written for one key/value head per query head).

`Eviction` holds one generation's state (kept keys [L, Hkv, S], H2O's scores); runtime/generation.py and
model/decoding.py feed its masks to the step and its `observe` the step's attention received per key.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .masks import to_additive


@dataclass(frozen=True)
class Full:
    name = "full"


@dataclass(frozen=True)
class Streaming:
    sinks: int
    window: int
    name = "streaming"

    def hidden(self, t_query: int, t_key: int, start: int) -> np.ndarray:
        """[t_query, t_key] True where the rule hides key j from the query at position start + i."""
        distance = (start + np.arange(t_query))[:, None] - np.arange(t_key)[None, :]
        return (distance >= self.window) & (np.arange(t_key) >= self.sinks)[None, :]


@dataclass(frozen=True)
class H2O:
    budget: int | tuple   # one number, a tuple per layer, or tuples per layer of one per key/value head
    recent: int
    name = "h2o"


@dataclass(frozen=True)
class SnapKV:
    budget: int | tuple   # one number, a tuple per layer, or tuples per layer of one per key/value head
    window: int = 32
    kernel: int = 5
    pooling: str = "avg"
    name = "snapkv"


def budgets(budget, n_layers: int, n_kv_heads: int) -> np.ndarray:
    """A budget as [L, Hkv] keys: one number for every key/value head, a list per layer, or [layer][kv_head]."""
    b = np.asarray(budget, np.int64)
    return np.broadcast_to(b.reshape(b.shape + (1,) * (2 - b.ndim)), (n_layers, n_kv_heads))


def top(scores: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """The k highest-scoring of the candidate positions (ties: the earlier), as a bool mask over scores' axis."""
    keep = np.zeros(len(scores), bool)
    if k > 0:
        idx = np.flatnonzero(candidates)
        keep[idx[np.argsort(-scores[idx], kind="stable")[:k]]] = True
    return keep


def pool(votes: np.ndarray, kernel: int, how: str) -> np.ndarray:
    """avg_pool1d / max_pool1d over the last axis, stride 1, padding kernel // 2 (zeros counted in the average,
    -inf for the maximum, as torch pads them)."""
    pad = kernel // 2
    fill = -np.inf if how == "max" else 0.0
    padded = np.pad(votes, [(0, 0)] * (votes.ndim - 1) + [(pad, pad)], constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=-1)
    return windows.max(-1) if how == "max" else windows.sum(-1) / kernel


class Eviction:
    """One generation's cache under a policy: kept [L, Hkv, S] (the keys not evicted), and H2O's scores."""

    def __init__(self, policy, n_layers: int, n_kv_heads: int, prompt_length: int):
        self.policy, self.L, self.Hkv, self.P = policy, n_layers, n_kv_heads, prompt_length
        self.kept = np.ones((n_layers, n_kv_heads, 0), bool)
        self.scores = np.zeros((n_layers, n_kv_heads, 0))

    def masks(self, t: int, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For t new tokens at positions start..start+t-1: the query-dependent band hidden [t, start+t] (streaming's;
        all False otherwise), the keys kept [L, Hkv, start+t] (the new ones always), and the weight of each new query
        in the attention the rule reads back ([t]: H2O every query, SnapKV its observation window)."""
        S = start + t
        self.kept = np.concatenate([self.kept, np.ones((self.L, self.Hkv, t), bool)], axis=2)
        self.scores = np.concatenate([self.scores, np.zeros((self.L, self.Hkv, t))], axis=2)
        hidden = self.policy.hidden(t, S, start) if isinstance(self.policy, Streaming) else np.zeros((t, S), bool)
        positions = start + np.arange(t)
        if isinstance(self.policy, H2O):
            votes = np.ones(t)
        elif isinstance(self.policy, SnapKV):
            votes = ((positions >= self.P - self.policy.window) & (positions < self.P)).astype(float)
        else:
            votes = np.zeros(t)
        return hidden, self.kept.copy(), votes

    def observe(self, received: np.ndarray) -> None:
        """After a step: received [L, Hkv, S], the attention each key got from the step's voting queries (summed
        over them and over the query heads of its key/value head). H2O adds it to the scores and evicts down to its
        budget once the prompt is in; SnapKV compresses the prompt when its last token has run."""
        S = self.kept.shape[2]
        p = self.policy
        if isinstance(p, H2O):
            self.scores += received
            if S < self.P:
                return
            for (layer, h), budget in np.ndenumerate(budgets(p.budget, self.L, self.Hkv)):
                kept = self.kept[layer, h]
                if kept.sum() <= budget:
                    continue
                old = kept & (np.arange(S) < S - p.recent)
                self.kept[layer, h] = top(self.scores[layer, h], old, budget - p.recent) | (np.arange(S) >= S - p.recent)
        elif isinstance(p, SnapKV) and S == self.P and self.P > p.window:
            prefix = self.P - p.window
            pooled = pool(received[:, :, :prefix], p.kernel, p.pooling)                   # [L, Hkv, prefix]
            for (layer, h), budget in np.ndenumerate(budgets(p.budget, self.L, self.Hkv)):
                if self.P >= budget:
                    self.kept[layer, h, :prefix] = top(pooled[layer, h], np.ones(prefix, bool), budget - p.window)

    def visible(self, query: int) -> np.ndarray:
        """The keys the query at `query` (< S) attends to under the policy: [L, Hkv, query + 1] bool."""
        kept = self.kept[:, :, :query + 1].copy()
        if isinstance(self.policy, Streaming):
            kept &= ~self.policy.hidden(1, query + 1, query)[0]
        return kept


def additive(hidden: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step's two masks from Eviction.masks: the band, additive [t, S], and the kept keys, additive [L, Hkv, S]."""
    return to_additive(hidden), to_additive(~kept)
