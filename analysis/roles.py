"""What the teaching models' wired heads do (model/teaching.py declares them by name), checked on any text.

Each role names its target keys for every query; the positional ones are the registry's own rows (the previous-token
role is the `previous` row's key, so a previous-token head is one whose previous_token_mass is ~1). The claim, for
every wired head: >= THRESHOLD of its weight on its target for every query that has one (for same-token, the
targets' total; for uniform, every weight within 1 % of 1/(i+1)).
"""
from __future__ import annotations

import numpy as np

from ..model.teaching import (FIRST_TOKEN, INDUCTION, PREVIOUS_TOKEN, ROLES, SAME_TOKEN, SELF, THRESHOLD, TWO_BACK,
                              UNIFORM)

__all__ = ["ROLES", "ROLE_TARGETS", "ROLE_TEXT", "THRESHOLD", "role_scores", "role_targets"]
from .statistics import ROWS, Diagonal, same_token_keys

ROLE_TARGETS = {
    PREVIOUS_TOKEN: "key i-1",
    FIRST_TOKEN: "key 0",
    SELF: "key i",
    TWO_BACK: "key i-2",
    SAME_TOKEN: "the keys k <= i holding the same token id as i (i itself included), together",
    INDUCTION: "key j+1, where j < i-1 is the latest earlier position holding the same token as i",
    UNIFORM: "every key k <= i equally: each weight within 1 % of 1/(i+1)",
}
# The same roles in a reader's words (the page's head menu and steps view show these).
ROLE_TEXT = {
    PREVIOUS_TOKEN: "puts its weight on the token just before (key i−1)",
    FIRST_TOKEN: "puts its weight on the first token (key 0)",
    SELF: "puts its weight on the token itself (key i)",
    TWO_BACK: "puts its weight on the token two back (key i−2)",
    SAME_TOKEN: "spreads its weight over the earlier copies of the same token (itself included)",
    INDUCTION: "looks at the token right after the latest earlier copy of the current token (key j+1)",
    UNIFORM: "spreads its weight evenly over every visible token",
}
POSITIONAL = {PREVIOUS_TOKEN: ROWS["previous"], FIRST_TOKEN: ROWS["first"], SELF: ROWS["diagonal"],
              TWO_BACK: Diagonal("p_i,i-2: the weight on the key two before", offset=-2)}


def _induction_targets(ids: np.ndarray) -> np.ndarray:
    T = len(ids)
    targets, latest = np.zeros((T, T), bool), {}   # latest: token id -> its last position <= i-2
    for q in range(T):
        if q >= 2:
            latest[ids[q - 2]] = q - 2
        if ids[q] in latest:
            targets[q, latest[ids[q]] + 1] = True
    return targets


def role_targets(role: str, token_ids) -> np.ndarray:
    """[T, T] bool: True where key k is query i's target under `role` (causal, k <= i). All-False row: no target."""
    ids = np.asarray(token_ids)
    T = len(ids)
    if role in POSITIONAL:
        return POSITIONAL[role].targets(T) & np.tri(T, dtype=bool)
    if role == SAME_TOKEN:
        return same_token_keys(ids) | np.eye(T, dtype=bool)
    if role == UNIFORM:
        return np.tri(T, dtype=bool)
    if role == INDUCTION:
        return _induction_targets(ids)
    raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")


def role_scores(weights: np.ndarray, role: str, token_ids) -> np.ndarray:
    """Per query [T]: how well one head's weights [T, T] follow `role`; >= THRESHOLD passes, NaN = no target.

    The weight on the target keys; for uniform, 1 - the largest relative deviation from 1/(i+1).
    """
    weights = np.asarray(weights, np.float64)
    targets = role_targets(role, token_ids)
    if role == UNIFORM:
        n = np.arange(1, len(weights) + 1)[:, None]
        return 1.0 - np.where(targets, np.abs(weights * n - 1.0), 0.0).max(axis=1)
    return np.where(targets.any(axis=1), (weights * targets).sum(axis=1), np.nan)
