"""The few pure functions a transformer is made of, in NumPy.

Every function works on the last axis (or the last two) and broadcasts over the rest, so the same
code serves one head or a batch of heads. Arrays stay in the dtype they come in (float32 here).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .precision import COMPUTE, scalar, widen


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)), after subtracting the row max so exp never overflows.

    A key masked with a very large negative number (see masks.MASKED) becomes exactly 0 here,
    which is why masks are added to the scores *before* the softmax: afterwards the row would no
    longer sum to 1.
    """
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Normalise each position's features to mean 0, variance 1 (biased), then scale and shift."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm (Zhang & Sennrich 2019): divide each position's features by their root mean square, then
    scale. LayerNorm without the centring and the bias; Llama's choice. x * (1 / sqrt(mean(x^2) + eps)) * w,
    in that order, as transformers' LlamaRMSNorm computes it."""
    inv_rms = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + scalar(eps))
    return weight * (x * inv_rms)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, the exact form x * Phi(x) with the Gaussian CDF written through erf (not the tanh fit)."""
    from scipy.special import erf   # scipy on first use: imported at the top it was a fifth of the server's start
    return (0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(x.dtype, copy=False)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU through its tanh fit, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's "gelu_new"."""
    c = scalar(np.sqrt(2.0 / np.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + scalar(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish), x * sigmoid(x): the gate's activation in SwiGLU."""
    from scipy.special import expit
    return x * expit(x)


def soft_cap(x: np.ndarray, cap: float) -> np.ndarray:
    """Logit soft-capping (Gemma 2): cap * tanh(x / cap), a smooth clamp of x into (-cap, cap). Nearly the identity
    for |x| << cap, so large scores or logits stop growing instead of saturating the softmax. cap 0: off."""
    if not cap:
        return x
    cap = np.asarray(cap, dtype=x.dtype)
    return cap * np.tanh(x / cap)


def rope_tables(n_positions: int, d_head: int, theta: float, scaling=None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of rotary position embeddings (Su et al. 2021), each [n_positions, d_head] (d_head: the features
    RoPE turns, the first rotary_dim of a head where it turns only part of them).

    Feature pair (i, i + d_head/2) of position p turns by the angle p * theta^(-2i/d_head): fast for the
    first pairs, slow for the last. The pairing is transformers' rotate-half convention (first half with
    second half), not the interleaved (2i, 2i+1) one of the original paper and llama.cpp. Frequencies
    and angles are rounded to float32 where transformers rounds them (its angles are float32 products):
    at position 4000 a float32 angle is off by up to 2e-4 rad, and rounding alike keeps parity exact.
    """
    if d_head % 2:
        raise ValueError(f"rotary embeddings need an even head dimension; got {d_head}")
    exponents = np.arange(0, d_head, 2, dtype=COMPUTE) / scalar(d_head)                 # 2i / d, float32
    base = (theta ** exponents.astype(np.float64)).astype(COMPUTE)                          # theta^(2i/d)
    inv_freq, attention_factor = scalar(1.0) / base, 1.0                                   # theta^(-2i/d)
    if scaling is not None:   # a RoPE scaling (model/rope.py: Llama 3.x, YaRN, LongRoPE, ...) changes inv_freq
        inv_freq, attention_factor = scaling.inverse_frequencies(base, theta, n_positions)
    angles = np.arange(n_positions, dtype=COMPUTE)[:, None] * inv_freq[None, :]   # [P, d/2], float32
    angles = np.concatenate([angles, angles], axis=-1).astype(np.float64)             # [P, d]
    cos, sin = np.cos(angles).astype(COMPUTE), np.sin(angles).astype(COMPUTE)
    if attention_factor != 1.0:   # YaRN, LongRoPE: cos and sin times the attention factor, every score times its square
        cos, sin = cos * scalar(attention_factor), sin * scalar(attention_factor)
    return cos, sin


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[x1, x2] -> [-x2, x1] on the last axis: a quarter turn of every (x1_i, x2_i) pair."""
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([-x2, x1], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate each position's feature pairs by its angles: x [..., T, d], cos and sin [T, r].

    Rotating queries and keys by their own positions makes q_i . k_j depend on i - j only.
    Partial rotary (GPT-NeoX's rotary_pct, Phi-3's partial_rotary_factor): tables narrower than x, [T, r] with r < d,
    turn x's first r features (rotate-half within them, pairs (i, i + r/2)) and pass the other d - r through.
    """
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return np.concatenate([apply_rope(x[..., :r], cos, sin), x[..., r:]], axis=-1)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: np.ndarray, n_rep: int) -> np.ndarray:
    """Grouped-query attention's sharing: [B, H_kv, T, d] -> [B, H_kv * n_rep, T, d], so that query head h
    reads key/value head h // n_rep (each kv head repeated n_rep times in a row, as transformers does)."""
    return x if n_rep == 1 else np.repeat(x, n_rep, axis=1)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x @ W^T + b with W stored [out, in], as PyTorch and Hugging Face store it; a weight stored in a narrower type
    than the compute type is widened here, where it is used (model/precision.py)."""
    y = x @ widen(weight).T
    return y if bias is None else y + widen(bias)


class AttentionStages(NamedTuple):
    """Every intermediate of scaled dot-product attention, for teaching: all [..., Tq, Tk]."""

    scores: np.ndarray  # q . k^T
    scaled: np.ndarray  # scores * score_scale: scores / (sqrt(d_head) * temperature)
    masked: np.ndarray  # scaled + additive mask
    probs: np.ndarray   # softmax(masked) over keys


def score_scale(cfg) -> np.floating:
    """What a head's raw scores q . k are multiplied by: 1 / (sqrt(d) * temperature), d = d_head, or Gemma's
    query_pre_attn_scalar where set. Dot products of d-dimensional vectors with unit-variance entries have variance
    d; dividing by sqrt(d) keeps the logits at unit scale so the softmax does not saturate into a one-hot that passes
    no gradient. The temperature (ours, for teaching) divides further: > 1 flattens, < 1 sharpens.
    cfg: a TransformerConfig, or an attention module (the same three fields). Every path that scales scores reads
    it here: the NumPy attention (model/attention.attention), the graphs (graphs/steps.attend), the API's stages and QK attribution."""
    d = getattr(cfg, "query_pre_attn_scalar", 0.0) or cfg.d_head
    return scalar(1.0 / (np.sqrt(d) * getattr(cfg, "temperature", 1.0)))


def position_weights(lengths: np.ndarray, T: int) -> np.ndarray:
    """[B, T] weights of a plain average over each text's own tokens: 1/n on its n tokens, 0 on padding."""
    lengths = np.asarray(lengths)
    real = np.arange(T)[None, :] < lengths[:, None]
    return (real / np.maximum(lengths, 1)[:, None]).astype(COMPUTE)


def ablate_heads(ctx: np.ndarray, keep: np.ndarray, mean: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The head-mask contract: each head's output, kept or replaced.

    ctx [B, H, T, d]: every head's output (its attention-weighted values, before the heads are
    concatenated and mixed by the output projection); keep, mean [B, H]; weights [B, T] (see
    position_weights). Returns keep * ctx + (1 - keep) * mean * avg, avg = sum_t weights_t ctx_t the
    head's average output over the text: keep 1 leaves a head as it is (exactly), keep 0 ablates it,
    to zeros (mean 0) or to its mean over the text's own positions (mean 1).
    """
    avg = np.einsum("bt,bhtd->bhd", weights, ctx)[:, :, None, :]          # [B, H, 1, d]
    keep, mean = keep[:, :, None, None], mean[:, :, None, None]
    return keep * ctx + (1 - keep) * mean * avg
