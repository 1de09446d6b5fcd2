"""Head-finding scores (statistics.SCORES): the means the text defines, and the induction probe's."""
from __future__ import annotations

import numpy as np

from .statistics import NO_KEYS, ROWS, SCORES, TextKeys, mean, rows


def score_rows() -> tuple[str, ...]:
    """The rows the text's own scores read."""
    return tuple(dict.fromkeys(s.row for s in SCORES.values() if s.row is not None))


def scores_of(row_values: dict[str, np.ndarray], keys: TextKeys = NO_KEYS) -> dict[str, np.ndarray]:
    """Every score the text itself defines (all but the induction probe's), each [...], from the rows it reads
    (those of the stacked path, or those a layer-by-layer run kept)."""
    out = {}
    for name, score in SCORES.items():
        if score.row is None:
            continue
        values = row_values[score.row]
        counted = ROWS[score.row].counted(values.shape[-1], keys)
        out[name] = mean(values[..., score.from_query:], counted[score.from_query:])
    return out


def head_scores(p: np.ndarray, token_ids) -> dict[str, np.ndarray]:
    """Every score that the text itself defines (all but the induction probe's), from probabilities p [..., T, T]
    of a text with these token ids. Each [...]."""
    keys = TextKeys(token_ids=list(token_ids))
    return scores_of(rows(p, keys, score_rows()), keys)


def duplicate_token_score(p: np.ndarray, token_ids) -> np.ndarray:
    """Weight on earlier keys with query i's own token, averaged over the queries that have one. [...]"""
    return head_scores(p, token_ids)["duplicate_token"]


def induction_score(p: np.ndarray, n: int, offset: int = 0) -> np.ndarray:
    """On a probe [offset tokens] + r_1..r_n + r_1..r_n: weight from query offset+n+k on key offset+k+1,
    mean over k = 0..n-2 (the second copy's queries that have a 'next token after the first copy'). [...]"""
    q = offset + n + np.arange(n - 1)
    return p[..., q, q - n + 1].mean(axis=-1)


def probe_ids(vocab_size: int, n: int, avoid: set[int], seed: int = 0) -> list[int]:
    """N distinct random token ids (no special tokens) repeated twice: the induction probe."""
    rng = np.random.default_rng(seed)
    pool = np.setdiff1d(np.arange(vocab_size), np.fromiter(avoid, int, len(avoid)))
    first = rng.choice(pool, size=n, replace=False).tolist()
    return first + first
