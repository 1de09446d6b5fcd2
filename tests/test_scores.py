"""Head-finding scores on attention patterns built by hand: each score is 1 on its own pattern and 0 (or its
known value) on the others."""
from __future__ import annotations

import numpy as np
import pytest

from attnscope.analysis import scores

T = 12


def onehot(targets, T=T):
    """A [T, T] pattern: query i puts all its weight on key targets[i]."""
    p = np.zeros((T, T))
    p[np.arange(T), targets] = 1.0
    return p


def causal_uniform(T=T):
    return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]


PREV = onehot([0] + list(range(T - 1)))            # query 0 sees only itself
NEXT = onehot(list(range(1, T)) + [T - 1])
SELF = onehot(list(range(T)))
SINK = onehot([0] * T)
LAST = onehot([T - 1] * T)


@pytest.mark.parametrize("name, pattern, expected", [
    ("previous_token", PREV, 1.0), ("previous_token", SELF, 0.0), ("previous_token", NEXT, 0.0),
    ("next_token", NEXT, 1.0), ("next_token", PREV, 0.0), ("next_token", causal_uniform(), 0.0),
    ("first_token_sink", SINK, 1.0), ("first_token_sink", SELF, 0.0), ("first_token_sink", LAST, 0.0),
    ("last_token", LAST, 1.0), ("last_token", SINK, 0.0),
])
def test_positional_scores(name, pattern, expected):
    ids = list(range(100, 100 + T))                   # all different: no duplicates
    assert scores.head_scores(pattern, ids)[name] == pytest.approx(expected)


def test_previous_token_on_uniform_causal_rows():
    # query i spreads 1/(i+1) over keys 0..i: its weight on i-1 is 1/(i+1)
    expected = np.mean([1 / (i + 1) for i in range(1, T)])
    assert scores.head_scores(causal_uniform(), range(T))["previous_token"] == pytest.approx(expected)


def test_duplicate_token_score():
    ids = [5, 7, 9, 5, 7, 3, 5]                      # queries 3, 4 and 6 repeat an earlier token
    p = onehot([0, 0, 0, 0, 1, 0, 3], T=7)           # 3 -> 0 (a 5), 4 -> 1 (a 7), 6 -> 3 (a 5): all duplicates
    assert scores.duplicate_token_score(p, ids) == pytest.approx(1.0)
    half = p.copy()
    half[6] = 0
    half[6, [0, 5]] = 0.5                            # query 6: half on an earlier 5, half on a 3
    assert scores.duplicate_token_score(half, ids) == pytest.approx((1 + 1 + 0.5) / 3)
    assert scores.duplicate_token_score(SELF[:7, :7], ids) == 0.0   # itself does not count
    assert scores.duplicate_token_score(p, [1, 2, 3, 4, 5, 6, 7]) == 0.0   # no repeats: no queries, score 0


def test_induction_score_on_a_constructed_induction_head():
    n, offset = 5, 1
    L = offset + 2 * n
    targets = list(range(L))                          # first copy: attend to self
    for k in range(n):                                # second copy: query offset+n+k -> offset+k+1
        targets[offset + n + k] = min(offset + k + 1, L - 1)
    p = onehot(targets, T=L)
    assert scores.induction_score(p, n, offset) == pytest.approx(1.0)
    assert scores.induction_score(onehot(list(range(L)), T=L), n, offset) == 0.0
    # a previous-token head is not an induction head
    assert scores.induction_score(onehot([0] + list(range(L - 1)), T=L), n, offset) == 0.0
    # the duplicate-token head attends to the same token (k+offset), one before the induction target
    dup = onehot([q if q < offset + n else q - n for q in range(L)], T=L)
    assert scores.induction_score(dup, n, offset) == 0.0


def test_scores_broadcast_over_layers_and_heads():
    p = np.stack([np.stack([PREV, SINK]), np.stack([LAST, NEXT])])   # [2, 2, T, T]
    s = scores.head_scores(p, range(T))
    np.testing.assert_allclose(s["previous_token"], [[1, 1 / (T - 1)], [0, 0]])   # SINK: query 1 -> key 0
    np.testing.assert_allclose(s["first_token_sink"], [[1 / (T - 1), 1], [0, 0]])   # PREV: query 1 on key 0
    np.testing.assert_allclose(s["last_token"], [[0, 0], [1, 2 / T]])   # NEXT: queries T-2 and T-1 on the last key


def test_probe_ids_repeat_distinct_non_special_tokens():
    ids = scores.probe_ids(1000, 50, avoid={0, 1, 2})
    assert ids[:50] == ids[50:] and len(set(ids[:50])) == 50 and not {0, 1, 2} & set(ids)
    assert ids == scores.probe_ids(1000, 50, avoid={0, 1, 2})          # seeded: the same probe every time
