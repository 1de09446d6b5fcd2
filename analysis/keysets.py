"""The key sets a text marks for the statistics registry's rows (analysis/statistics.py TextKeys): punctuation, the
sentences of a pair, earlier copies of a query's token, induction targets."""
from __future__ import annotations

import functools
import unicodedata

import numpy as np


@functools.lru_cache(maxsize=1 << 16)    # a vocabulary's pieces: every request asks about its tokens again
def is_punctuation(piece: str) -> bool:
    """A token whose characters (spaces aside) are all Unicode punctuation (categories P*)."""
    piece = piece.strip()
    return bool(piece) and all(unicodedata.category(c).startswith("P") for c in piece)


def sentences(segments) -> np.ndarray:
    """Sentence (0 = A, 1 = B) of each token from the tokenizer's segments (0, 1, -1 for an added special token):
    a special token belongs to the sentence before it, [CLS] to A. [T]"""
    out, current = [], 0
    for s in segments:
        current = s if s >= 0 else current
        out.append(current)
    return np.asarray(out, np.int64)


def same_token_keys(token_ids) -> np.ndarray:
    """[Tq, Tk] True where key j < i holds query i's own token."""
    ids = np.asarray(token_ids)
    return (ids[:, None] == ids[None, :]) & np.tri(len(ids), k=-1, dtype=bool)


def induction_targets(token_ids) -> np.ndarray:
    """[Tq, Tk] True at key j + 1 where an earlier key j < i - 1 holds query i's own token: the token that followed
    the earlier occurrence, the key an induction head reads ([A][B] ... [A] -> [B]). The occurrence just before i
    (j = i - 1) is left out: its follower is the query itself."""
    same = same_token_keys(token_ids)
    out = np.zeros_like(same)
    out[:, 1:] = same[:, :-1]
    return out & np.tri(len(same), k=-1, dtype=bool)
