"""analysis.statistics (and thumbnails, rollout) on hand-made matrices, where the right answer is known without the code under test."""
from __future__ import annotations

import math

import numpy as np
import pytest

from attnscope.analysis import statistics as stats
from attnscope.analysis import rollout, thumbnails
from attnscope.model.masks import MASKED


def random_probs(*shape, seed=0):
    """Row-stochastic random matrices [..., Tq, Tk]."""
    x = np.random.default_rng(seed).random(shape)
    return x / x.sum(-1, keepdims=True)


# ---- entropy -------------------------------------------------------------------------------
def test_entropy_is_minus_sum_p_log_p():
    rows = [[0.5, 0.25, 0.25], [0.1, 0.2, 0.7], [1.0, 0.0, 0.0], [0.0, 0.3, 0.7]]
    by_hand = [-sum(p * math.log(p) for p in row if p > 0) for row in rows]
    np.testing.assert_allclose(stats.entropy(np.array(rows)), by_hand, rtol=1e-12)
    assert stats.entropy(np.array(rows))[0] == pytest.approx(1.5 * math.log(2))


def test_entropy_broadcasts_over_leading_axes():
    p = random_probs(2, 3, 5, 5)
    out = stats.entropy(p)
    assert out.shape == (2, 3, 5)
    assert out[1, 2, 3] == pytest.approx(-(p[1, 2, 3] * np.log(p[1, 2, 3])).sum())


def test_normalized_entropy_uniform_over_visible_keys_is_one_and_one_hot_is_zero():
    T = 6
    causal = np.triu(np.ones((T, T), bool), k=1)
    mask = np.where(causal, MASKED, np.float32(0))
    visible = stats.visible_keys(mask)
    np.testing.assert_array_equal(visible, np.arange(1, T + 1))
    uniform = np.where(causal, 0.0, 1.0) / visible[:, None]                 # row i uniform over keys 0..i
    ne = stats.normalized_entropy(uniform, visible)
    assert ne[0] == 0.0                                                     # one visible key: defined as 0
    np.testing.assert_allclose(ne[1:], 1.0, rtol=1e-12)
    one_hot = np.eye(T)
    np.testing.assert_allclose(stats.normalized_entropy(one_hot, visible), 0.0, atol=0)
    rs = stats.row_stats(uniform, mask)
    np.testing.assert_allclose(rs["normalized_entropy"][1:], 1.0, rtol=1e-12)
    np.testing.assert_allclose(rs["max_weight"], 1.0 / visible)


# ---- per-head summaries --------------------------------------------------------------------
def test_head_stats_identity():
    s = stats.head_stats(np.eye(7))
    assert set(s) == set(stats.HEAD_STATS)
    assert s["diagonal_mass"] == pytest.approx(1.0)
    assert s["mean_distance"] == pytest.approx(0.0)
    assert s["previous_token_mass"] == pytest.approx(0.0)
    assert s["mean_entropy"] == pytest.approx(0.0)
    assert s["first_token_mass"] == pytest.approx(1 / 7) and s["last_token_mass"] == pytest.approx(1 / 7)


def test_head_stats_previous_token():
    T = 7
    p = np.eye(T, k=-1)
    p[0, 0] = 1.0                       # the first query has no previous token: it looks at itself
    s = stats.head_stats(p)
    assert s["previous_token_mass"] == pytest.approx(1.0)
    assert s["diagonal_mass"] == pytest.approx(1 / T)
    assert s["mean_distance"] == pytest.approx((T - 1) / T)


def test_head_stats_first_token_and_batching():
    T = 5
    sink = np.zeros((T, T))
    sink[:, 0] = 1.0
    s = stats.head_stats(np.stack([np.eye(T), sink]))   # [H=2, T, T] -> per head
    np.testing.assert_allclose(s["first_token_mass"], [1 / T, 1.0])
    np.testing.assert_allclose(s["mean_distance"], [0.0, np.arange(T).mean()])


# ---- downsampling --------------------------------------------------------------------------
def test_downsample_512_to_64_keeps_block_means():
    p = random_probs(2, 512, 512, seed=1)
    d = thumbnails.downsample(p, 64)
    assert d.shape == (2, 64, 64)
    assert d.mean() == pytest.approx(p.mean(), rel=1e-12)
    np.testing.assert_allclose(d[1, 3, 5], p[1, 24:32, 40:48].mean(), rtol=1e-12)


def test_downsampled_probability_rows_still_sum_to_one_for_even_blocks():
    """Each cell is a block *mean*, so a row of cells sums to 1 / (keys per block); scaled back by the
    block width it is a distribution again (over key blocks), for every query block."""
    p = random_probs(3, 256, 128, seed=2)
    d = thumbnails.downsample(p, 32)
    assert d.shape == (3, 32, 32)
    keys_per_block = 128 // 32
    np.testing.assert_allclose(d.sum(-1) * keys_per_block, 1.0, atol=1e-12)


def test_downsample_leaves_small_matrices_alone_and_rejects_bad_size():
    p = random_probs(10, 10)
    np.testing.assert_array_equal(thumbnails.downsample(p, 64), p)
    with pytest.raises(ValueError, match="positive"):
        thumbnails.downsample(p, 0)


def test_downsample_uneven_blocks_cover_everything():
    p = random_probs(100, 100, seed=3)
    d = thumbnails.downsample(p, 7)
    assert d.shape == (7, 7)
    rq = np.linspace(0, 100, 8).astype(int)
    weights = np.diff(rq)[:, None] * np.diff(rq)[None, :]
    assert (d * weights).sum() == pytest.approx(p.sum(), rel=1e-12)   # block sums add up to the total


# ---- rollout -------------------------------------------------------------------------------
def test_rollout_rows_sum_to_one():
    attn = random_probs(6, 12, 9, 9, seed=4)
    r = rollout.rollout(attn)
    assert r.shape == (9, 9)
    np.testing.assert_allclose(r.sum(-1), 1.0, atol=1e-12)
    assert np.all(r >= 0)


def test_rollout_of_identity_attention_is_identity():
    attn = np.broadcast_to(np.eye(5), (3, 2, 5, 5))
    np.testing.assert_allclose(rollout.rollout(attn), np.eye(5), atol=1e-12)


def test_rollout_keeps_causality():
    T = 6
    causal = np.tril(np.ones((T, T)))
    attn = random_probs(4, 2, T, T, seed=5) * causal
    attn /= attn.sum(-1, keepdims=True)
    r = rollout.rollout(attn)
    assert np.all(r[np.triu_indices(T, k=1)] == 0.0)
    np.testing.assert_allclose(r.sum(-1), 1.0, atol=1e-12)
