"""What an intervention changed: the metrics a patching run reads from next-token logits, and the effect of an
ablation or knockout on the prediction (runtime/interventions.py makes the runs)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Over the last axis, in float64."""
    x = np.asarray(x, np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class Metric:
    """What a patching run measures at the last position: logit(target) - logit(distractor), or without a
    distractor log p(target)."""
    target: int
    distractor: int | None = None

    @property
    def name(self) -> str:
        return "logprob" if self.distractor is None else "logit_difference"

    @property
    def reads(self) -> list[int] | None:
        """The logits it reads: target and distractor; None for log p(target), whose normaliser reads them all."""
        return None if self.distractor is None else [self.target, self.distractor]

    def __call__(self, logits: np.ndarray, only_read: bool = False) -> np.ndarray:
        """logits [..., V] -> the metric [...], float64 (arrays of their own). only_read: logits holds just the
        columns `reads` names, in that order [..., 2] (a run that computed only those)."""
        logits = np.asarray(logits, np.float64)
        if self.distractor is None:        # a copy: the column alone, not a view that keeps [..., V] alive
            return log_softmax(logits)[..., self.target].copy()
        t, d = (0, 1) if only_read else (self.target, self.distractor)
        return logits[..., t] - logits[..., d]


def recovery(patched: np.ndarray, clean: float, corrupt: float) -> np.ndarray | None:
    """(patched - corrupt) / (clean - corrupt): 1 where patching restores the clean metric, 0 where it changes
    nothing. None when clean and corrupt agree (nothing to recover)."""
    if abs(clean - corrupt) < 1e-6:
        return None
    return (np.asarray(patched, np.float64) - corrupt) / (clean - corrupt)


def effect(ablated, intact) -> dict:
    """Decoders: the next-token distribution (KL(intact || ablated), the intact top tokens) and each token's
    log-prob change; encoders: the mean-pooled embedding's cosine similarity."""
    if intact.next_token_logits is not None:
        before, after = (log_softmax(x.next_token_logits) for x in (intact, ablated))
        change = [None] + [a - b for a, b in zip(ablated.token_logprobs[1:], intact.token_logprobs[1:])]
        return {"kl": float(np.sum(np.exp(before) * (before - after))),
                "next_tokens_before": [t._asdict() for t in intact.next_tokens],
                "token_logprob_change": change,
                "mean_logprob_change": float(np.mean(change[1:])) if len(change) > 1 else 0.0}
    a, b = (x.hidden.mean(axis=0).astype(np.float64) for x in (ablated, intact))
    return {"cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))}
