"""What knocking heads out changed, from an intact run and an ablated one (runtime/interventions.py makes them)."""
from __future__ import annotations

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    z = x - x.max()
    return z - np.log(np.exp(z).sum())


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
