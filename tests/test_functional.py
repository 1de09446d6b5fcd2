"""Value tests of model.functional and model.masks against independent references (PyTorch)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from attnscope.model import functional as F
from attnscope.model import masks as M
from attnscope.model.masks import MASKED
from tests import references as R

ATOL = 1e-6


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(*shape, seed=0, scale=1.0):
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def close(actual, expected, atol=ATOL):
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=0)


# ---- softmax ---------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_softmax_matches_torch(axis, scale):
    x = randn(4, 5, 7, scale=scale)
    close(F.softmax(x, axis=axis), torch.softmax(torch.from_numpy(x), dim=axis).numpy())


def test_softmax_does_not_overflow_and_keeps_dtype():
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1000.0]], np.float32)
    y = F.softmax(x)
    assert y.dtype == np.float32 and np.isfinite(y).all()
    close(y, torch.softmax(torch.from_numpy(x), -1).numpy())
    close(y[1], 1 / 3)


def test_softmax_masked_entry_is_exactly_zero():
    x = np.array([[0.5, MASKED, -0.2, MASKED]], np.float32)
    y = F.softmax(x)
    assert y[0, 1] == 0.0 and y[0, 3] == 0.0
    close(y.sum(-1), 1.0)


def test_softmax_all_masked_row_is_uniform():
    y = F.softmax(np.full((1, 4), MASKED, np.float32))
    close(y, 0.25)


# ---- layer_norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_layer_norm_matches_torch(eps):
    x, w, b = randn(2, 3, 16, seed=1, scale=3.0) + 2.0, randn(16, seed=2), randn(16, seed=3)
    ref = TF.layer_norm(torch.from_numpy(x), (16,), torch.from_numpy(w), torch.from_numpy(b), eps=eps).numpy()
    close(F.layer_norm(x, w, b, eps=eps), ref, atol=1e-5)


def test_layer_norm_uses_biased_variance():
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    y = F.layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), eps=0.0)
    close(y.mean(-1), 0.0)
    close(y.var(-1), 1.0, atol=1e-5)   # np.var is the biased (population) variance


# ---- gelu ------------------------------------------------------------------------------------

def test_gelu_matches_torch_exact_erf():
    x = np.linspace(-6, 6, 241, dtype=np.float32)
    y = F.gelu(x)
    assert y.dtype == np.float32
    close(y, TF.gelu(torch.from_numpy(x), approximate="none").numpy())


def test_gelu_is_not_the_tanh_approximation():
    x = np.linspace(-4, 4, 81, dtype=np.float32)
    tanh_fit = TF.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert np.abs(F.gelu(x) - tanh_fit).max() > 1e-5


# ---- linear ----------------------------------------------------------------------------------

@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_torch(with_bias):
    x, w = randn(2, 3, 5, seed=4), randn(7, 5, seed=5)
    b = randn(7, seed=6) if with_bias else None
    ref = TF.linear(torch.from_numpy(x), torch.from_numpy(w), None if b is None else torch.from_numpy(b)).numpy()
    close(F.linear(x, w, b), ref, atol=1e-5)


# ---- scaled dot-product attention ------------------------------------------------------------

def qkv(seed=7, shape=(2, 3), tq=4, tk=6, d=8, dv=5):
    return randn(*shape, tq, d, seed=seed), randn(*shape, tk, d, seed=seed + 1), randn(*shape, tk, dv, seed=seed + 2)


def torch_sdpa(q, k, v, mask=None, scale=None):
    t = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a))
    return TF.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(mask), scale=scale).numpy()


def reference_probs(q, k, mask=None, temperature=1.0):
    scores = torch.from_numpy(q) @ torch.from_numpy(k).transpose(-1, -2) / (np.sqrt(q.shape[-1]) * temperature)
    if mask is not None:
        scores = scores + torch.from_numpy(mask)
    return torch.softmax(scores, -1).numpy()


def test_sdpa_no_mask_matches_torch():
    q, k, v = qkv()
    out, probs = R.scaled_dot_product_attention(q, k, v)
    close(out, torch_sdpa(q, k, v), atol=1e-5)
    close(probs, reference_probs(q, k))
    close(probs.sum(-1), 1.0)


def test_sdpa_float_mask_matches_torch():
    q, k, v = qkv()
    mask = randn(4, 6, seed=20)            # broadcast over batch and heads
    out, probs = R.scaled_dot_product_attention(q, k, v, mask=mask)
    close(out, torch_sdpa(q, k, v, mask), atol=1e-5)
    close(probs, reference_probs(q, k, mask))


@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 1, 4, 6), (2, 3, 1, 6)])
def test_sdpa_boolean_mask_matches_torch(mask_shape):
    """Ours: True = masked out. Torch SDPA's boolean attn_mask: True = KEEP. So torch gets ~mask."""
    q, k, v = qkv()
    masked_out = rng(21).random(mask_shape) < 0.4
    masked_out[..., 0] = False             # no fully masked rows (torch gives NaN there)
    out, probs = R.scaled_dot_product_attention(q, k, v, mask=M.to_additive(masked_out))
    close(out, torch_sdpa(q, k, v, ~masked_out), atol=1e-5)
    assert (np.broadcast_to(masked_out, probs.shape) <= (probs == 0.0)).all()   # masked -> exactly 0
    # and via combine (the path the module takes)
    out2, _ = R.scaled_dot_product_attention(q, k, v, mask=M.combine(masked_out))
    np.testing.assert_array_equal(out2, out)


def test_sdpa_causal_matches_torch_is_causal():
    q, k, v = qkv(tq=6, tk=6)
    out, probs = R.scaled_dot_product_attention(q, k, v, mask=M.causal_mask(6))
    ref = TF.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True).numpy()
    close(out, ref, atol=1e-5)
    assert (probs[..., np.triu(np.ones((6, 6), bool), 1)] == 0.0).all()


@pytest.mark.parametrize("temperature", [0.25, 3.0])
def test_sdpa_temperature_matches_torch_scale(temperature):
    q, k, v = qkv()
    out, probs = R.scaled_dot_product_attention(q, k, v, temperature=temperature)
    close(out, torch_sdpa(q, k, v, scale=1.0 / (np.sqrt(q.shape[-1]) * temperature)), atol=1e-5)
    close(probs, reference_probs(q, k, temperature=temperature))


def test_attention_stages_are_the_steps():
    q, k, _ = qkv()
    mask = randn(4, 6, seed=22)
    st = R.attention_stages(q, k, mask, F.score_scale(SimpleNamespace(d_head=8, temperature=2.0)))
    close(st.scores, (torch.from_numpy(q) @ torch.from_numpy(k).transpose(-1, -2)).numpy(), atol=1e-5)
    close(st.scaled, st.scores / (np.sqrt(8) * 2.0))
    close(st.masked, st.scaled + mask)
    np.testing.assert_array_equal(st.probs, F.softmax(st.masked))
    assert all(a.dtype == np.float32 for a in st)


def test_sdpa_error_q_k_dim_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q and k must have the same last dimension \(d_head\); got 8 and 7"):
        R.scaled_dot_product_attention(q, k[..., :7], v)


def test_sdpa_error_k_v_length_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k and v must have the same number of keys; got 6 and 5"):
        R.scaled_dot_product_attention(q, k, v[..., :5, :])


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_sdpa_error_temperature(temperature):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="temperature must be > 0"):
        R.scaled_dot_product_attention(q, k, v, temperature=temperature)


# ---- masks -----------------------------------------------------------------------------------

def test_masked_is_float32_lowest():
    assert MASKED.dtype == np.float32 and MASKED == np.finfo(np.float32).min and np.isfinite(MASKED)


@pytest.mark.parametrize("tq, tk", [(4, 4), (3, 5), (5, 3)])
def test_causal_mask_values(tq, tk):
    m = M.causal_mask(tq, tk)
    assert m.shape == (tq, tk) and m.dtype == np.float32
    for i in range(tq):
        for j in range(tk):
            assert m[i, j] == (MASKED if j > i else 0.0)


def test_causal_mask_default_square():
    np.testing.assert_array_equal(M.causal_mask(3), M.causal_mask(3, 3))
    np.testing.assert_array_equal(M.causal_mask(3), np.array([[0, MASKED, MASKED], [0, 0, MASKED], [0, 0, 0]],
                                                             np.float32))


@pytest.mark.parametrize("keep_dtype", [np.int64, bool, np.float32])
def test_padding_mask_shape_and_values(keep_dtype):
    keep = np.array([[1, 1, 1, 0], [1, 1, 0, 0]]).astype(keep_dtype)
    m = M.padding_mask(keep)
    assert m.shape == (2, 1, 1, 4) and m.dtype == np.float32
    np.testing.assert_array_equal(m[:, 0, 0], np.array([[0, 0, 0, MASKED], [0, 0, MASKED, MASKED]], np.float32))


def test_padding_mask_broadcasts_over_heads_and_queries():
    q, k, v = qkv(shape=(2, 3))
    keep = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    _, probs = R.scaled_dot_product_attention(q, k, v, mask=M.padding_mask(keep))
    assert (probs[0, ..., 4:] == 0.0).all() and (probs[1] > 0).all()


@pytest.mark.parametrize("shape", [(4,), (2, 1, 4)])
def test_padding_mask_error_shape(shape):
    with pytest.raises(ValueError, match=r"padding keep-mask must be \[batch, keys\]"):
        M.padding_mask(np.ones(shape))


def test_to_additive_bool_and_float():
    b = np.array([[True, False], [False, True]])
    np.testing.assert_array_equal(M.to_additive(b), np.array([[MASKED, 0], [0, MASKED]], np.float32))
    f = np.array([[0.5, -1.0]], np.float64)
    out = M.to_additive(f)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, f.astype(np.float32))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.complex64])
def test_to_additive_error_dtype(dtype):
    with pytest.raises(TypeError, match=r"a mask must be boolean \(True = masked out\) or additive float; got dtype"):
        M.to_additive(np.zeros((2, 2), dtype))


def test_combine_error_dtype():
    with pytest.raises(TypeError, match="boolean .* or additive float"):
        M.combine(np.zeros((2, 2), bool), np.zeros((2, 2), np.int64))


def test_combine_bool_and_float():
    b = np.array([[False, True, False]])
    f = np.array([[0.5, 0.25, -1.0]], np.float32)
    c = M.combine(b, f)
    assert c.dtype == np.float32
    np.testing.assert_array_equal(c, np.array([[0.5, MASKED, -1.0]], np.float32))   # MASKED + 0.25 rounds to MASKED


def test_combine_broadcasts_and_clips_instead_of_overflowing():
    causal = np.triu(np.ones((3, 3), bool), 1)            # [Tq, Tk]
    pad = M.padding_mask(np.array([[1, 1, 0], [1, 1, 1]]))  # [B, 1, 1, Tk]
    with np.errstate(all="raise"):
        c = M.combine(causal, pad, causal)                 # two MASKED added at the same spot
    assert c.shape == (2, 1, 3, 3)
    assert np.isfinite(c).all() and c.min() == MASKED
    expected = causal[None, None] | (np.array([[1, 1, 0], [1, 1, 1]]) == 0)[:, None, None, :]
    np.testing.assert_array_equal(c == MASKED, expected)
    np.testing.assert_array_equal(c[~expected], 0.0)


def test_combine_none():
    assert M.combine() is None and M.combine(None, None) is None
    f = np.array([[0.0, -2.0]], np.float32)
    np.testing.assert_array_equal(M.combine(None, f, None), f)


def test_combine_matches_torch_sdpa_with_both_masks():
    """Boolean (ours: True = out) plus float, combined, equals torch given float(-inf where out) + float."""
    q, k, v = qkv()
    out_mask = rng(30).random((4, 6)) < 0.3
    out_mask[:, 0] = False
    f = randn(2, 1, 4, 6, seed=31)
    out, _ = R.scaled_dot_product_attention(q, k, v, mask=M.combine(out_mask, f))
    torch_mask = np.where(out_mask, -np.inf, 0.0).astype(np.float32) + f
    close(out, torch_sdpa(q, k, v, torch_mask), atol=1e-5)
