"""Multi-head attention (Vaswani et al. 2017, section 3.2.2) and grouped-query attention in NumPy.

MultiHeadAttention carries PyTorch's `nn.MultiheadAttention` state-dict names and layouts, so one set
of tensors loads into both (`load_state_dict` / `state_dict`), and options mean what they mean there
(BERT, GPT-2). GroupedQueryAttention is the Llama family's: separate q/k/v/o projections named as in
transformers, rotary positions, and fewer key/value heads than query heads.
CrossAttention is the encoder-decoders' (T5, BART, Marian). Inputs are batch-first: [batch, time, features]; an
unbatched [time, features] input also works for MultiHeadAttention.

The modules hold weights and project; the attention itself is written once, in `attention` (self- and cross-attention,
causal, sliding window, grouped-query, additive mask, head mask, named hook sites, key/value cache), and every
NumPy path runs it: the modules' own calls, the blocks, the interventions reference and decoding. tests/references.py
keeps a plain textbook form apart from it, for the parity tests.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import masks as M
from .functional import (AttentionStages, ablate_heads, apply_rope, linear, repeat_kv, rms_norm, score_scale,
                         soft_cap, softmax)
from .precision import COMPUTE, scalar, widen


class MultiHeadAttention:
    """h heads of scaled dot-product attention, each on its own d_head = embed_dim / h slice.

    Every head projects queries, keys and values into a small subspace, attends there, and the
    heads' outputs are concatenated and mixed by out_proj. Options, as in PyTorch:
      bias           biases on the q/k/v and output projections
      add_bias_kv    a learned key and value appended to every sequence (a "sink" to attend to)
      add_zero_attn  an all-zero key and value appended after that
      kdim, vdim     feature sizes of key/value inputs when they differ from embed_dim (cross-attention)
      dropout        on the attention weights in training; identity here (inference only)
    and two of ours: temperature (divides the scaled scores) and causal (a look-ahead mask).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, temperature: float = 1.0, causal: bool = False,
                 seed: int = 0):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be positive; got {embed_dim} and {num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"num_heads must divide embed_dim: {embed_dim} is not divisible by {num_heads}; "
                             f"pick num_heads from {[h for h in range(1, embed_dim + 1) if embed_dim % h == 0][:12]}...")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0; got {temperature}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.same_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout, self.bias, self.temperature, self.causal = dropout, bias, temperature, causal
        self.add_bias_kv, self.add_zero_attn = add_bias_kv, add_zero_attn
        self.params = self._init_params(np.random.default_rng(seed))

    @property
    def d_head(self) -> int:          # functional.score_scale reads it
        return self.head_dim

    # ---- parameters -------------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        E = self.embed_dim
        shapes = ({"in_proj_weight": (3 * E, E)} if self.same_dim else
                  {"q_proj_weight": (E, E), "k_proj_weight": (E, self.kdim), "v_proj_weight": (E, self.vdim)})
        if self.bias:
            shapes["in_proj_bias"] = (3 * E,)
        if self.add_bias_kv:
            shapes |= {"bias_k": (1, 1, E), "bias_v": (1, 1, E)}
        shapes["out_proj.weight"] = (E, E)
        if self.bias:
            shapes["out_proj.bias"] = (E,)
        return shapes

    def _init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Xavier-uniform projections and zero biases, as PyTorch initialises them."""
        params = {}
        for name, shape in self.param_shapes().items():
            if name.endswith("bias") and name != "bias_k" and name != "bias_v":
                params[name] = np.zeros(shape, COMPUTE)
            else:
                fan_out, fan_in = shape[-2], shape[-1]
                limit = np.sqrt(6.0 / (fan_in + fan_out))
                params[name] = rng.uniform(-limit, limit, shape).astype(COMPUTE)
        return params

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.params.items()}

    def load_state_dict(self, state: dict) -> None:
        """Load tensors named and shaped as `nn.MultiheadAttention.state_dict()` (arrays or tensors)."""
        expected = self.param_shapes()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            raise KeyError(f"state dict does not match this MultiHeadAttention(embed_dim={self.embed_dim}, "
                           f"kdim={self.kdim}, vdim={self.vdim}, bias={self.bias}, add_bias_kv={self.add_bias_kv}): "
                           f"missing {missing}, unexpected {unexpected}")
        loaded = {}
        for name, shape in expected.items():
            value = np.asarray(state[name].detach().cpu().numpy() if hasattr(state[name], "detach") else state[name],
                               dtype=COMPUTE)
            if value.shape != shape:
                raise ValueError(f"{name} has shape {value.shape}; this module needs {shape}")
            loaded[name] = value.copy()
        self.params = loaded

    def _projection(self, which: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Weight [E, in] and bias [E] of the q (0), k (1) or v (2) projection."""
        E, p = self.embed_dim, self.params
        w = p["in_proj_weight"][which * E:(which + 1) * E] if self.same_dim else p[("q", "k", "v")[which] + "_proj_weight"]
        b = p["in_proj_bias"][which * E:(which + 1) * E] if self.bias else None
        return w, b

    def out_projection(self) -> tuple[np.ndarray, np.ndarray | None]:
        """W_O [E, E] (the heads' outputs, concatenated, mixed back into the stream) and its bias (or None)."""
        return self.params["out_proj.weight"], self.params.get("out_proj.bias")

    def projection(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Weight [out, in] and bias (or None) by GroupedQueryAttention's names: q_proj, k_proj, v_proj, o_proj."""
        return self.out_projection() if name == "o_proj" else self._projection(("q_proj", "k_proj", "v_proj").index(name))

    @property
    def scale(self) -> np.floating:
        """What the scores q . k are multiplied by: functional.score_scale, 1 / (sqrt(d_head) * temperature)."""
        return score_scale(self)

    def project(self, x, start: int = 0, memory=None):
        """Queries [B, H, Tq, dh] of x [B, Tq, E]; keys and values [B, H, S', dh] of memory (a (key [B, S, kdim],
        value [B, S, vdim]) pair, or one array for both; None: x itself), S' counting the learned bias_kv key and
        the zero_attn key where this module has them. Positions are not this module's business: start is taken for
        GroupedQueryAttention's signature."""
        key, value = (x, x) if memory is None else memory if isinstance(memory, tuple) else (memory, memory)
        (B, _, E), H, dh = x.shape, self.num_heads, self.head_dim
        q = linear(x, *self._projection(0))                               # [B, Tq, E]
        k = linear(key, *self._projection(1))                             # [B, S, E]
        v = linear(value, *self._projection(2))                           # [B, S, E]
        if self.add_bias_kv:                                              # one learned extra key/value
            k = np.concatenate([k, np.broadcast_to(self.params["bias_k"], (B, 1, E))], axis=1)
            v = np.concatenate([v, np.broadcast_to(self.params["bias_v"], (B, 1, E))], axis=1)
        q, k, v = (t.reshape(B, -1, H, dh).transpose(0, 2, 1, 3) for t in (q, k, v))  # [B, H, T|S', dh]
        if self.add_zero_attn:                                            # one all-zero extra key/value
            zeros = np.zeros((B, H, 1, dh), COMPUTE)
            k, v = np.concatenate([k, zeros], axis=2), np.concatenate([v, zeros], axis=2)
        return q, k, v

    # ---- forward ----------------------------------------------------------------------------
    def __call__(self, query, key=None, value=None, key_padding_mask=None, attn_mask=None,
                 need_weights: bool = True, average_attn_weights: bool = True, causal: bool | None = None,
                 return_stages: bool = False, head_mask=None):
        """Attend from query [B, Tq, E] to key [B, S, kdim] / value [B, S, vdim] (self-attention if omitted).

        key_padding_mask: [B, S], True (or additive -inf) on keys to ignore.
        attn_mask: [Tq, S], [B*num_heads, Tq, S] (PyTorch's forms) or [B|1, H|1, Tq, S]; boolean
                   True = masked out, or an additive float mask.
        head_mask: (keep [B, H], mean [B, H], weights [B, Tq]) for functional.ablate_heads, or None.
        Returns (output [B, Tq, E], weights [B, Tq, S'] averaged over heads, [B, H, Tq, S'] per head,
        or None), S' counting any bias_kv / zero_attn keys; with return_stages, also the stages.
        The attention itself is `attention` below, the one every NumPy path runs.
        """
        query = np.asarray(query, COMPUTE)
        key = query if key is None else np.asarray(key, COMPUTE)
        value = key if value is None else np.asarray(value, COMPUTE)
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = query[None], key[None], value[None]
            key_padding_mask = None if key_padding_mask is None else np.asarray(key_padding_mask)[None]
        self._check_inputs(query, key, value)
        B, Tq, _ = query.shape
        mask = self._mask(attn_mask, key_padding_mask, causal, B, Tq, key.shape[1])   # [B|1, H|1, Tq, S] or None
        for extra in (self.add_bias_kv, self.add_zero_attn):              # every query sees the extra keys
            mask = _pad_keys(mask) if extra else mask
        seen: dict[str, np.ndarray] = {}
        out, probs, _ = attention(self, query, (key, value), mask, hook=seen.setdefault if return_stages else None,
                                  head_mask=head_mask)
        weights = None
        if need_weights:
            weights = probs.mean(axis=1) if average_attn_weights else probs
        if unbatched:
            out = out[0]
            weights = None if weights is None else weights[0]
        if return_stages:
            stages = _stages(seen, probs)
            qkv = (seen["query"], seen["key"], seen["value"])
            return out, weights, AttentionStages(*(s[0] if unbatched else s for s in stages)), qkv
        return out, weights

    def _check_inputs(self, query, key, value):
        if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:
            raise ValueError(f"query, key and value must all be [batch, time, features] (or all unbatched "
                             f"[time, features]); got shapes {query.shape}, {key.shape}, {value.shape}")
        if query.shape[-1] != self.embed_dim:
            raise ValueError(f"query has {query.shape[-1]} features; this module's embed_dim is {self.embed_dim}")
        if key.shape[-1] != self.kdim:
            raise ValueError(f"key has {key.shape[-1]} features but kdim is {self.kdim}; "
                             f"construct with kdim={key.shape[-1]} for cross-attention")
        if value.shape[-1] != self.vdim:
            raise ValueError(f"value has {value.shape[-1]} features but vdim is {self.vdim}; "
                             f"construct with vdim={value.shape[-1]}")
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(f"query {query.shape}, key {key.shape} and value {value.shape} must share the batch "
                             f"size, and key and value the sequence length")

    def _mask(self, attn_mask, key_padding_mask, causal, B, Tq, S):
        """All masks as one additive [B|1, H|1, Tq, S] array (or None)."""
        H = self.num_heads
        parts = []
        if attn_mask is not None:
            m = np.asarray(attn_mask)
            if m.ndim == 2 and m.shape == (Tq, S):
                m = m[None, None]
            elif m.ndim == 3 and m.shape == (B * H, Tq, S):
                m = m.reshape(B, H, Tq, S)
            elif not (m.ndim == 4 and m.shape[3] == S and m.shape[2] in (1, Tq) and m.shape[0] in (1, B) and m.shape[1] in (1, H)):
                raise ValueError(f"attn_mask has shape {m.shape}; expected (Tq, S) = {(Tq, S)}, "
                                 f"(batch*num_heads, Tq, S) = {(B * H, Tq, S)}, or (B|1, H|1, Tq|1, S)")
            parts.append(M.to_additive(m))
        if key_padding_mask is not None:
            kpm = np.asarray(key_padding_mask)
            if kpm.shape != (B, S):
                raise ValueError(f"key_padding_mask has shape {kpm.shape}; expected (batch, keys) = {(B, S)}")
            parts.append(M.to_additive(kpm)[:, None, None, :])
        if self.causal if causal is None else causal:
            parts.append(M.causal_mask(Tq, S)[None, None])
        return M.combine(*parts)


class GroupedQueryAttention:
    """Grouped-query attention (Ainslie et al. 2023) with rotary positions: the Llama family's attention.

    n_heads query heads share n_kv_heads key/value heads: query head h reads key/value group
    h // (n_heads / n_kv_heads). n_kv_heads = n_heads is plain multi-head attention, 1 is multi-query.
    Every query head still has its own attention pattern, and all of them are reported. Queries and
    keys are rotated by their positions (RoPE) before the dot product, so scores see relative offsets.
    d_head need not be d_model / n_heads. Parameters are named as transformers names them (q_proj,
    k_proj, v_proj, o_proj; weights [out, in]); biases are off (Llama) or on q/k/v only (Qwen2).
    Gemma's options: qk_norm "head" (QK-norm, Gemma 3: each head's query and key RMS-normalised over its d_head
    features before RoPE, one weight [d_head] shared by the heads: q_norm, k_norm), query_pre_attn_scalar (scores
    divided by its square root instead of sqrt(d_head): functional.score_scale) and softcap (attention logit soft-capping, Gemma 2).
    graphs/steps.project mirrors project step by step (and MultiHeadAttention.project's fused in_proj).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, d_head: int, rope=None,
                 qkv_bias: bool = False, out_bias: bool = False, temperature: float = 1.0, seed: int | None = 0,
                 std: float = 0.02, qk_norm: str | None = None, norm_eps: float = 1e-6,
                 query_pre_attn_scalar: float = 0.0, softcap: float = 0.0):
        """Weights from N(0, std^2) by seed (seed=None: zeros, to be loaded); biases zero, QK-norm weights one.
        qk_norm: None, "head" (RMSNorm over each head's d_head query/key features, Qwen3, Gemma 3) or "full" (over the
        whole q and k projections before they are split into heads, OLMo 2), before RoPE; norm_eps is its epsilon."""
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads must divide n_heads: {n_heads} query heads cannot share {n_kv_heads} "
                             f"key/value heads evenly")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0; got {temperature}")
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, d_head
        self.group = n_heads // n_kv_heads       # query heads per key/value head
        self.rope = rope                         # (cos, sin), each [max_positions, d_head], or None
        self.qkv_bias, self.out_bias, self.temperature = qkv_bias, out_bias, temperature
        self.qk_norm, self.norm_eps, self.softcap = qk_norm, norm_eps, softcap
        self.query_pre_attn_scalar = query_pre_attn_scalar
        rng = None if seed is None else np.random.default_rng(seed)
        self.params = {name: (np.ones(shape, COMPUTE) if "_norm." in name else
                              np.zeros(shape, COMPUTE) if name.endswith("bias") or rng is None else
                              (rng.standard_normal(shape) * std).astype(COMPUTE))
                       for name, shape in self.param_shapes().items()}

    @property
    def d_head(self) -> int:          # functional.score_scale reads it
        return self.head_dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        D, q, kv = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        shapes = {"q_proj.weight": (q, D), "k_proj.weight": (kv, D), "v_proj.weight": (kv, D), "o_proj.weight": (D, q)}
        if self.qkv_bias:
            shapes |= {"q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,)}
        if self.out_bias:
            shapes["o_proj.bias"] = (D,)
        if self.qk_norm:   # RMSNorm weights: per head (shared by every head) or over the whole projection
            shapes |= {"q_norm.weight": (self.head_dim if self.qk_norm == "head" else q,),
                       "k_norm.weight": (self.head_dim if self.qk_norm == "head" else kv,)}
        return shapes

    def projection(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Weight [out, in] and bias (or None) of q_proj, k_proj, v_proj or o_proj."""
        return self.params[name + ".weight"], self.params.get(name + ".bias")

    def out_projection(self) -> tuple[np.ndarray, np.ndarray | None]:
        """W_O [D, H * d_head] and its bias (or None): o_proj."""
        return self.projection("o_proj")

    @property
    def scale(self) -> np.floating:
        """What the scores q . k are multiplied by: functional.score_scale (1 / sqrt(d_head), or Gemma's
        query_pre_attn_scalar, over the temperature)."""
        return score_scale(self)

    def project(self, x, start: int = 0, memory=None):
        """Queries [B, H, T, dh] of x [B, T, D] and the key/value heads' keys and values [B, Hkv, S, dh] of memory
        [B, S, D] (None: x itself, S = T), q and k rotated as positions start..start+T-1 (start > 0: new tokens
        after a key/value cache, model/decoding.py). Rotary positions need self-attention (memory None)."""
        if memory is not None and self.rope is not None:
            raise ValueError("rotary positions need self-attention: queries and keys at the same positions")
        m = x if memory is None else memory
        (B, T, _), S = x.shape, m.shape[1]
        H, Hkv, dh = self.n_heads, self.n_kv_heads, self.head_dim
        q, k = linear(x, *self.projection("q_proj")), linear(m, *self.projection("k_proj"))     # [B, T|S, H|Hkv * dh]
        if self.qk_norm == "full":                                                                 # OLMo 2
            q, k = self.qk_normed(q, k)
        q = q.reshape(B, T, H, dh).transpose(0, 2, 1, 3)                                          # [B, H, T, dh]
        k = k.reshape(B, S, Hkv, dh).transpose(0, 2, 1, 3)                                        # [B, Hkv, S, dh]
        v = linear(m, *self.projection("v_proj")).reshape(B, S, Hkv, dh).transpose(0, 2, 1, 3)    # [B, Hkv, S, dh]
        if self.qk_norm == "head":                                                                 # Qwen3
            q, k = self.qk_normed(q, k)
        if self.rope is not None:
            cos, sin = (t[start:start + T] for t in self.rope)                                     # [T, dh]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def qk_normed(self, q, k):
        """QK-norm: RMSNorm of queries and keys over their last axis (a head's d_head features, or the whole
        projection's), each with its own weight. It bounds the scores' size whatever the stream's scale."""
        return (rms_norm(q, self.params["q_norm.weight"], self.norm_eps),
                rms_norm(k, self.params["k_norm.weight"], self.norm_eps))

    def __call__(self, x, attn_mask=None, head_mask=None, average_attn_weights: bool = False,
                 return_stages: bool = False):
        """x [B, T, D]; attn_mask additive [B|1, H|1, T, T]; head_mask as in MultiHeadAttention.

        Returns (output [B, T, D], weights [B, H, T, T] per query head, or [B, T, T] averaged) and, with
        return_stages, the stages and the (q, k, v) each query head used, [B, H, T, d_head] (q and k
        after QK-norm and RoPE; k and v repeated per group).
        """
        seen: dict[str, np.ndarray] = {}
        out, probs, _ = attention(self, x, None, attn_mask, hook=seen.setdefault if return_stages else None,
                                  head_mask=head_mask)
        weights = probs.mean(axis=1) if average_attn_weights else probs
        if return_stages:
            return out, weights, _stages(seen, probs), (seen["query"], seen["key"], seen["value"])
        return out, weights


class Attended(NamedTuple):
    out: np.ndarray          # [B, T, D] the attention's output, W_O z + b_O
    probs: np.ndarray        # [B, H, T, P+T] each query head's probabilities over every key
    present: tuple           # (keys, values) [B, Hkv, P+T, dh]: past's with this call's appended (the cache)


def attention(attn, x, memory=None, mask=None, hook=None, past=None, start: int = 0, head_mask=None,
              causal: bool = False, window: int = 0) -> Attended:
    """Attention from x [B, T, D] (the queries' input, at positions start..start+T-1) to memory [B, S, D] (the keys'
    and values' input; None: x itself, self-attention): the one attention every NumPy path runs -- the blocks of
    decoders, encoders and encoder-decoders (model/transformer.py: self- and cross-attention), the interventions
    reference (hook edits sites), decoding (past: the key/value cache of the P earlier positions) and the modules'
    own calls (MultiHeadAttention, GroupedQueryAttention, CrossAttention). attn is one of those modules: it
    projects (attn.project), says what the scores are multiplied by (attn.scale) and holds W_O. The graphs mirror it
    step for step: graphs/steps.attention (project, the cache, repeat_kv), steps.attend (scores to z; the one
    attention of every graph) and steps.block_output (the head mask, then steps.out_projection).

        q, k, v = project(x, memory)          QK-norm and RoPE in project; k, v after past's, then per query head
        scores  = q k^T                                            [B, H, T, S]
        scaled  = soft_cap(scores * scale)    scale = attn.scale (functional.score_scale, or 1: T5)
        masked  = scaled + mask               (+ causal, + the sliding window band)
        pattern = softmax(masked)
        z       = pattern v                   (head_mask: functional.ablate_heads)
        out     = W_O z + b_O

    hook(site, value) -> value, where given, sees each named site and may replace it: query, key, value [B, H, T|S,
    dh] (key and value as each query head reads them: grouped-query heads repeated), scores (q k^T), scaled,
    masked (scaled + mask: model/interventions.py's "masked"), pattern [B, H, T, S], head_output (z, before any
    ablation) [B, H, T, dh]. Each is named as the teaching stage it is (model/transformer.py STAGES). mask: additive [B|1, 1|H, T, S], S = P + T for self-attention (None: none); causal and
    window add the look-ahead mask and a local layer's band (masks.sliding_window_mask) to it."""
    hook = hook or (lambda site, value: value)
    B, T, _ = x.shape
    q, k, v = attn.project(x, start, memory)                           # q [B, H, T, dh]; k, v [B, Hkv, S, dh]
    if past is not None:
        k, v = np.concatenate([past[0], k], axis=2), np.concatenate([past[1], v], axis=2)    # [B, Hkv, P+S, dh]
    mask = attention_mask(mask, T, k.shape[2], start, causal, window)
    group = getattr(attn, "group", 1)
    q, k_h, v_h = hook("query", q), hook("key", repeat_kv(k, group)), hook("value", repeat_kv(v, group))
    scores = hook("scores", q @ np.swapaxes(k_h, -1, -2))             # [B, H, T, S]
    scaled = hook("scaled", soft_cap(scores * attn.scale, getattr(attn, "softcap", 0.0)))
    masked = hook("masked", scaled if mask is None else scaled + mask)
    probs = hook("pattern", softmax(masked, axis=-1))
    z = hook("head_output", probs @ v_h)                               # [B, H, T, dh]
    if head_mask is not None:
        z = ablate_heads(z, *head_mask)
    out = linear(z.transpose(0, 2, 1, 3).reshape(B, T, -1), *attn.out_projection())         # [B, T, D]
    return Attended(out, probs, (k, v))


def attention_mask(mask, t_query: int, t_key: int, start: int = 0, causal: bool = False, window: int = 0):
    """mask (additive, or None) with the look-ahead mask (causal) and a sliding window's band (window > 0) added, for
    queries at positions start..start+t_query-1 over keys 0..t_key-1."""
    parts = [mask]
    if causal:
        parts.append(M.causal_mask(t_query, t_key, start)[None, None])
    if window:
        parts.append(M.sliding_window_mask(t_query, t_key, window, start)[None, None])
    return mask if len(parts) == 1 else M.combine(*parts)


def _stages(seen: dict[str, np.ndarray], probs: np.ndarray) -> AttentionStages:
    """The teaching stages of one attention from the sites `attention` showed its hook."""
    return AttentionStages(seen["scores"], seen["scaled"], seen["masked"], probs)


class CrossAttention(GroupedQueryAttention):
    """Encoder-decoder attention (Vaswani et al. 2017, section 3.2.3): queries from one sequence x [B, Tq, D], keys
    and values from another, the memory [B, S, D] (the encoder's output); with memory = x it is self-attention.
    The encoder-decoders' attention (T5, BART, Marian, model/encdec.py): q/k/v/o as transformers names them, one
    key/value head per query head, no rotary positions (their positions are added to the tokens, or to the scores
    as a bias that arrives inside the additive mask). `scaled`: scores times 1/sqrt(d_head) (BART, Marian), or not
    at all (T5, whose initialisation absorbs it). In the graphs it is what any attention is (graphs/steps.attention)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, bias: bool, scaled: bool = True,
                 seed: int | None = 0, std: float = 0.02):
        super().__init__(d_model, n_heads, n_heads, d_head, qkv_bias=bias, out_bias=bias, seed=seed, std=std)
        self.scaled = scaled

    @property
    def scale(self) -> np.floating:
        """What the scores are multiplied by: score_scale (1/sqrt(d_head)), or 1 (T5)."""
        return score_scale(self) if self.scaled else scalar(1.0)

    def __call__(self, x, memory=None, attn_mask=None, head_mask=None):
        """x [B, Tq, D] (queries); memory [B, S, D] (keys and values; None: x); attn_mask additive [B|1, H|1, Tq, S]
        (padding, causality and T5's position bias). Returns (output [B, Tq, D], probs [B, H, Tq, S], stages,
        (q, k, v)): q [B, H, Tq, dh], k and v [B, H, S, dh]."""
        seen: dict[str, np.ndarray] = {}
        out, probs, _ = attention(self, x, memory, attn_mask, hook=seen.setdefault, head_mask=head_mask)
        return out, probs, _stages(seen, probs), (seen["query"], seen["key"], seen["value"])


def _pad_keys(mask: np.ndarray | None) -> np.ndarray | None:
    """Let every query see one more key (appended last): a zero column on an additive mask."""
    if mask is None:
        return None
    return np.concatenate([mask, np.zeros(mask.shape[:-1] + (1,), COMPUTE)], axis=-1)
