"""Transformer blocks and stacks in NumPy: BERT's post-norm encoder, GPT-2's and Llama's pre-norm decoders.

One `Transformer` class covers all three; `TransformerConfig` says which. The attention mask is an
*input* (additive, [B, 1|H, T, T]), built by the caller from padding, causality and user masks, so
the same forward pass (and the same exported ONNX graph) serves every masking choice. So is the
head mask (which heads' outputs to keep, and what replaces the others), for ablations.
graphs/steps.py writes every step below as ONNX nodes, in the same order, naming the code it mirrors: the block is
graphs/steps.transformer_block (TransformerBlock.__call__), the one block builder of every graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from .attention import GroupedQueryAttention, MultiHeadAttention, attention, attention_mask
from .functional import gelu, gelu_tanh, layer_norm, linear, position_weights, rms_norm, rope_tables, silu, soft_cap
from .precision import COMPUTE, scalar, widen
from .rope import RopeScaling

# Teaching outputs, besides the probabilities. Per layer and batch: x [T, D], what the block's q/k/v projections
# read (after ln1 in a pre-norm block); q, k, v and ctx = probs @ v, the head's output before the output
# projection [H, T, d_head] (k and v as each query head reads them); scores, scaled, masked [H, T, T].
STAGES = ("x", "q", "k", "v", "scores", "scaled", "masked", "ctx")
# each stage's site in the block's forward (TransformerBlock.__call__'s hook): ctx is the head's output before any
# ablation; scores, scaled and masked are the sites of the same names (masked: the one model/interventions.py edits)
STAGE_SITES = dict(zip(STAGES, ("attention_input", "query", "key", "value", "scores", "scaled", "masked",
                                "head_output")))
SQUARE_STAGES = ("scores", "scaled", "masked")  # [.., T, T]; the others end in [.., T, features]
LM_OUTPUTS = ("next_token_logits", "token_logprobs")  # decoders with an LM head
VOCAB_CHUNK = 4096  # the LM head's log-sum-exp runs over this many vocabulary rows at a time


@dataclass(frozen=True)
class TransformerConfig:
    """Everything that shapes a model. The defaults are BERT's; the other families set:

      GPT-2   norm_first, causal, final_norm (mlp="gelu_tanh" is the real GPT-2's activation)
      Llama   norm_first, causal, final_norm, norm="rms", position="rope", mlp="swiglu",
              attention="gqa", n_kv_heads, rope_theta, qkv_bias=False, bias=False, lm_head
              (Qwen2 keeps qkv_bias=True; Qwen3 adds qk_norm="head")
      OLMo 2  Llama's, but output_norms instead of norm_first, and qk_norm="full"
      GPT-NeoX GPT-2's LayerNorm and GELU with RoPE (attention="gqa"), parallel_residual, rotary_dim < d_head
      Gemma 2 Llama's, with mlp="geglu", embed_scale, query_pre_attn_scalar, attn_softcap, final_softcap,
              output_norms (with norm_first), sliding_window and layer_types (local and global layers)
      Gemma 3 Gemma 2's without the soft-capping, with qk_norm="head" and rope_local_theta
    """
    vocab_size: int
    max_positions: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    norm_first: bool = False        # False: BERT post-norm; True: GPT-2 / Llama pre-norm
    causal: bool = False            # decoders see only the past (the runtime builds that mask)
    type_vocab_size: int = 0        # BERT's segment (token type) embeddings; 0 = none
    embed_norm: bool = False        # BERT normalises the summed embeddings
    final_norm: bool = False        # GPT-2 and Llama normalise after the last block
    layer_norm_eps: float = 1e-5    # of every norm, LayerNorm or RMSNorm
    temperature: float = 1.0
    norm: Literal["layer", "rms"] = "layer"
    position: Literal["learned", "rope"] = "learned"    # a learned table added to the tokens, or rotary q/k
    mlp: Literal["gelu", "gelu_tanh", "swiglu", "geglu"] = "gelu"   # geglu: SwiGLU's gate through gelu_tanh
    attention: Literal["mha", "gqa"] = "mha"            # PyTorch's MultiheadAttention, or Llama's q/k/v/o
    n_kv_heads: int = 0             # key/value heads shared by groups of query heads (gqa); 0 = n_heads
    d_head: int = 0                 # features per head; 0 = d_model // n_heads
    rope_theta: float = 10000.0     # RoPE's base: the slowest pair turns once per ~2 pi theta tokens
    rope_scaling: RopeScaling | None = None   # Llama 3.x, YaRN, LongRoPE, linear, dynamic (model/rope.py); None: plain
    rotary_dim: int = 0             # features of each head RoPE turns, the first ones (partial rotary: GPT-NeoX's
    #                                 rotary_pct, Phi-3's partial_rotary_factor, x d_head); 0 = d_head
    qkv_bias: bool = True           # biases on the q, k, v projections
    bias: bool = True               # biases on the attention output and MLP projections
    lm_head: bool = False           # next-token logits from the final hidden states
    tie_embeddings: bool = True     # the LM head is the token embedding matrix (no weights of its own)
    qk_norm: Literal[None, "head", "full"] = None   # QK-norm: RMSNorm on the queries and keys before RoPE, over each
                                    # head's d_head features (Qwen3, Gemma 3) or over the whole projection (OLMo 2)
    output_norms: bool = False      # each sublayer's output is normalised before it joins the stream: OLMo 2's
                                    # x = x + P1(Attn(x)) (norm_first False), Gemma's x = x + P1(Attn(N1(x))) (with
                                    # norm_first: 4 norms per block)
    parallel_residual: bool = False  # GPT-NeoX: attention and MLP read the same input, x = x + Attn(N1(x)) + MLP(N2(x))
    # Gemma 2 and 3 (the defaults leave every other family as it was)
    embed_scale: float = 1.0        # token embeddings times this (Gemma: sqrt(d_model), rounded to float32)
    query_pre_attn_scalar: float = 0.0   # scores divided by sqrt(this) instead of sqrt(d_head); 0: d_head
    attn_softcap: float = 0.0       # attention logit soft-capping, scores -> cap * tanh(scores / cap); 0: off
    final_softcap: float = 0.0      # the same on the next-token logits; 0: off
    sliding_window: int = 0         # local layers' window: a query sees its last sliding_window keys (own included)
    layer_types: tuple[str, ...] = ()   # per layer "full_attention" (global) or "sliding_attention" (local)
    rope_local_theta: float = 0.0   # RoPE's base on local layers (Gemma 3's rope_local_base_freq, no scaling);
                                    # 0: rope_theta

    @property
    def has_unembedding(self) -> bool:
        """Tokens can be read out of the residual stream: an LM head, or a decoder whose tied token embeddings serve
        as one (tiny-gpt). The logit lens and the OV copying scores need it."""
        return self.lm_head or (self.causal and self.tie_embeddings)

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window (a local layer), or 0 (a global one: every earlier key)."""
        local = self.layer_types and self.layer_types[layer] == "sliding_attention"
        return self.sliding_window if local else 0

    @property
    def local_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.window(i))

    def __post_init__(self):
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types and (len(self.layer_types) != self.n_layers or not set(self.layer_types) <= {
                "full_attention", "sliding_attention"}):
            raise ValueError(f"layer_types must name each of the {self.n_layers} layers 'full_attention' or "
                             f"'sliding_attention'; got {list(self.layer_types)}")
        if self.local_layers and self.sliding_window < 1:
            raise ValueError(f"sliding_attention layers need a sliding_window >= 1; got {self.sliding_window}")
        if not self.n_kv_heads:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if not self.d_head:
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if not self.rotary_dim:
            object.__setattr__(self, "rotary_dim", self.d_head)
        if isinstance(self.rope_scaling, dict):   # as asdict() wrote it (a GGUF file's cached config)
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.parallel_residual and (self.output_norms or not self.norm_first):
            raise ValueError("parallel_residual needs norm_first and no output_norms (both sublayers read their own "
                             "norm of the same x)")
        if self.parallel_residual and not self.norm_first:
            raise ValueError("parallel_residual needs norm_first (both sublayers read their own norm of the same x)")
        if self.position == "rope" and (self.rotary_dim % 2 or self.rotary_dim > self.d_head):
            raise ValueError(f"rotary_dim must be even and at most d_head {self.d_head}; got {self.rotary_dim}")
        if self.attention == "mha" and self.qk_norm:
            raise ValueError("qk_norm needs attention='gqa'")
        if self.attention == "mha" and (self.position == "rope" or self.n_kv_heads != self.n_heads or
                                        self.d_head * self.n_heads != self.d_model or self.qkv_bias != self.bias):
            raise ValueError("RoPE, n_kv_heads != n_heads, d_head != d_model / n_heads and q/k/v biases without "
                             "output biases need attention='gqa' (PyTorch's MultiheadAttention layout has none)")


class LayerNorm:
    def __init__(self, dim: int, eps: float):
        self.weight, self.bias, self.eps = np.ones(dim, COMPUTE), np.zeros(dim, COMPUTE), eps

    def __call__(self, x):
        return layer_norm(x, widen(self.weight), widen(self.bias), self.eps)


class RMSNorm:
    def __init__(self, dim: int, eps: float):
        self.weight, self.eps = np.ones(dim, COMPUTE), eps

    def __call__(self, x):
        return rms_norm(x, widen(self.weight), self.eps)


class Linear:
    def __init__(self, d_in: int, d_out: int, rng: np.random.Generator | None, std: float = 0.02, bias: bool = True):
        self.weight = _normal(rng, (d_out, d_in), std)                  # [out, in]
        self.bias = np.zeros(d_out, COMPUTE) if bias else None

    def __call__(self, x):
        return linear(x, self.weight, self.bias)


class MLP:
    """Position-wise feed-forward: Linear -> GELU -> Linear, applied to each token alone."""

    def __init__(self, cfg: TransformerConfig, rng):
        self.fc, self.proj = Linear(cfg.d_model, cfg.d_ff, rng, bias=cfg.bias), Linear(cfg.d_ff, cfg.d_model, rng, bias=cfg.bias)
        self.act = gelu_tanh if cfg.mlp == "gelu_tanh" else gelu

    def __call__(self, x):
        return self.proj(self.act(self.fc(x)))


class SwiGLU:
    """Gated feed-forward (Shazeer 2020), Llama's MLP: down(silu(gate(x)) * up(x)).

    The gate decides, feature by feature, how much of the up-projection passes."""

    def __init__(self, cfg: TransformerConfig, rng):
        self.gate = Linear(cfg.d_model, cfg.d_ff, rng, bias=cfg.bias)
        self.up = Linear(cfg.d_model, cfg.d_ff, rng, bias=cfg.bias)
        self.down = Linear(cfg.d_ff, cfg.d_model, rng, bias=cfg.bias)

    def __call__(self, x):
        return self.down(silu(self.gate(x)) * self.up(x))


class GeGLU(SwiGLU):
    """SwiGLU with the GELU (tanh form) as the gate's activation (Shazeer 2020): Gemma's MLP,
    down(gelu_tanh(gate(x)) * up(x))."""

    def __call__(self, x):
        return self.down(gelu_tanh(self.gate(x)) * self.up(x))


class BlockOutput(NamedTuple):
    x: np.ndarray            # [B, T, D] the block's output
    probs: np.ndarray        # [B, H, T, S] its attention probabilities
    present: tuple           # (keys, values) [B, Hkv, S, dh]: the key/value cache, this call's positions included


class TransformerBlock:
    """Attention then MLP, each wrapped in a residual connection and a norm (N: LayerNorm or RMSNorm).

    post-norm (BERT):         x = N1(x + Attn(x));   x = N2(x + MLP(x))
    pre-norm (GPT-2, Llama):  x = x + Attn(N1(x));   x = x + MLP(N2(x))
    Pre-norm keeps an un-normalised residual stream, which is what lets deep stacks train stably.
    Llama's block is the pre-norm one with RMSNorm, grouped-query attention with RoPE, and SwiGLU.
    with cross-attention (an encoder-decoder's decoder block, Vaswani et al. 2017 section 3.2.3; model/encdec.py),
    between the two, reading the encoder's output m (the memory), with its own norm NC:
      post-norm (BART, Marian): x = N1(x + Attn(x));  x = NC(x + Cross(x, m));  x = N2(x + MLP(x))
      pre-norm (T5):            x = x + Attn(N1(x));  x = x + Cross(NC(x), m);  x = x + MLP(N2(x))
    parallel (GPT-NeoX):      x = x + Attn(N1(x)) + MLP(N2(x))
    output norms (OLMo 2):    x = x + P1(Attn(x));   x = x + P2(MLP(x))
    output norms with norm_first (Gemma's 4 norms):  x = x + P1(Attn(N1(x)));   x = x + P2(MLP(N2(x)))
    The output norms P1, P2 are post_attn_norm and post_mlp_norm in both; N1, N2 (ln1, ln2) are the pre-norms of a
    pre-norm block, the norms of the residual sums of a post-norm one, and absent in OLMo 2's.
    A local layer (window > 0) adds its sliding-window band (masks.sliding_window_mask) to the mask it is given,
    like the causal mask: part of the model's own mask, on that layer only.
    """

    _r: tuple = (None, None)    # (W_O, its heads' R transposed): value_norms' factors, made once per W_O (_value_r)

    def __init__(self, cfg: TransformerConfig, rng, rope=None, window: int = 0):
        self.norm_first, self.output_norms, self.parallel_residual = cfg.norm_first, cfg.output_norms, \
            cfg.parallel_residual
        self.window = window
        seed = None if rng is None else int(rng.integers(2**31))
        if cfg.attention == "gqa":
            self.attn = GroupedQueryAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, rope=rope,
                                              qkv_bias=cfg.qkv_bias, out_bias=cfg.bias, temperature=cfg.temperature,
                                              seed=seed, qk_norm=cfg.qk_norm, norm_eps=cfg.layer_norm_eps,
                                              query_pre_attn_scalar=cfg.query_pre_attn_scalar,
                                              softcap=cfg.attn_softcap)
        else:
            self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, bias=cfg.bias, temperature=cfg.temperature,
                                           seed=seed or 0)
        Norm = RMSNorm if cfg.norm == "rms" else LayerNorm
        inner = cfg.norm_first or not cfg.output_norms               # N1, N2: all but OLMo 2's block have them
        self.ln1 = Norm(cfg.d_model, cfg.layer_norm_eps) if inner else None
        self.ln2 = Norm(cfg.d_model, cfg.layer_norm_eps) if inner else None
        self.mlp = SwiGLU(cfg, rng) if cfg.mlp == "swiglu" else GeGLU(cfg, rng) if cfg.mlp == "geglu" else MLP(cfg, rng)
        self.post_attn_norm = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.output_norms else None   # P1
        self.post_mlp_norm = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.output_norms else None    # P2
        self.cross_attn = self.ln_cross = None                                                      # Cross, NC

    @classmethod
    def of(cls, attn, mlp, ln1, ln2, norm_first: bool, cross_attn=None, ln_cross=None) -> TransformerBlock:
        """A block from its parts: an encoder-decoder's (model/encdec.py: attention modules CrossAttention, its own
        feed-forward), with cross-attention (cross_attn and its norm ln_cross) in a decoder block."""
        self = cls.__new__(cls)
        self.attn, self.mlp, self.ln1, self.ln2, self.norm_first = attn, mlp, ln1, ln2, norm_first
        self.output_norms = self.parallel_residual = False
        self.window, self.post_attn_norm, self.post_mlp_norm = 0, None, None
        self.cross_attn, self.ln_cross = cross_attn, ln_cross
        return self

    def local_mask(self, mask, t_query: int, t_key: int, start: int = 0):
        """The mask this layer attends with: `mask` plus, on a local layer, its sliding-window band."""
        return attention_mask(mask, t_query, t_key, start, window=self.window)

    def __call__(self, x, mask=None, head_mask=None, hook=None, past=None, start: int = 0, memory=None,
                 cross_mask=None) -> BlockOutput:
        """The block on x [B, T, D] at positions start..start+T-1, as the class docstring's equations, with the
        attention of model/attention.attention: the one block forward of every NumPy path (Transformer, the
        encoder-decoders' stacks (model/encdec.py), model/interventions.py's edits, model/decoding.py's key/value
        cache).

        mask: additive [B, 1|H, T, S] (S = P + T; this layer's window band is added here); head_mask (keep, mean,
        weights) for this layer or None; hook(site, value) -> value sees and may replace each site (residual,
        attention_input, and attention's; the cross-attention's as cross_attention_input and "cross_" + attention's:
        cross_query, ..., cross_head_output); past: (keys, values) [B, Hkv, P, dh] of the P earlier positions;
        memory [B, S', D] and cross_mask additive [B, 1|H, T, S']: what the cross-attention reads (its block only).
        Returns BlockOutput(x, the block's output; probs [B, H, T, S]; present, the key/value cache with T more); the
        cross-attention's probabilities are its hook's cross_pattern."""
        hook = hook or (lambda site, value: value)
        x = hook("residual", x)
        h = hook("attention_input", self.attention_input(x))
        a = attention(self.attn, h, None, mask, hook, past, start, head_mask, window=self.window)
        cross = None if self.cross_attn is None else lambda x: self.cross_attention(x, memory, cross_mask, hook)
        return BlockOutput(self.after_attention(x, a.out, cross), a.probs, a.present)

    def cross_attention(self, x, memory, mask, hook=None):
        """The cross-attention sublayer in its residual connection: x + Cross(NC(x), m) pre-norm, NC(x + Cross(x, m))
        post-norm; x [B, T, D] the stream after the self-attention's residual, memory [B, S, D].
        Mirrored by graphs/steps.cross_attention."""
        hook = hook or (lambda site, value: value)
        h = hook("cross_attention_input", self.ln_cross(x) if self.norm_first else x)
        c = attention(self.cross_attn, h, memory, mask, lambda site, value: hook("cross_" + site, value))
        return x + c.out if self.norm_first else self.ln_cross(x + c.out)

    def attention_input(self, x):
        """What the attention reads of the block's input x [B, T, D]: N1(x) in a pre-norm block, x itself otherwise."""
        return self.ln1(x) if self.norm_first else x

    def after_attention(self, x, a, cross=None):
        """The block's output from its input x and its attention's output a = Attn(attention_input(x)), both
        [B, T, D]: the residual connections, the norms and the MLP, in the order of the class docstring; cross(x) -> x,
        where given, the cross-attention sublayer between the attention's residual and the MLP's (cross_attention)."""
        if self.parallel_residual:
            return x + a + self.mlp(self.ln2(x))
        if self.output_norms:                                    # OLMo 2, and Gemma with its pre-norms
            x = x + self.post_attn_norm(a)
            return x + self.post_mlp_norm(self.mlp(self.ln2(x) if self.norm_first else x))
        x = x + a if self.norm_first else self.ln1(x + a)
        if cross is not None:
            x = cross(x)
        return x + self.mlp(self.ln2(x)) if self.norm_first else self.ln2(x + self.mlp(x))

    def head_output(self, head: int, ctx: np.ndarray) -> np.ndarray:
        """One head's share of Attn(x): its output ctx [..., T, d_head] through its d_head columns of the output
        projection W_o [D, H * d_head] -> [..., T, D]. The heads' shares plus W_o's bias sum to Attn(x)."""
        W, dh = self.attn.out_projection()[0], ctx.shape[-1]
        return ctx @ widen(W[:, head * dh:(head + 1) * dh]).T

    def value_norms(self, v: np.ndarray, tokens: int = 4096) -> np.ndarray:
        """||v_j W_O^h|| of each head h and key j, v [..., H, T, dh] (as each query head reads it) -> [..., H, T] float32:
        the size of what key j writes into the residual stream through head h per unit of weight (its head_output),
        the norms of value-weighted attention (Kobayashi et al. 2020). With head_output's columns W_h [D, dh] and
        R [dh, dh] such that W_h^T W_h = R^T R (_value_r), ||W_h v_j|| = ||R v_j||: a [dh, dh] product a key, not
        [dh, D] (D / dh times less work, and as exact). `tokens` keys at a time: memory [tokens, dh], whatever T.
        Mirrored by graphs/steps.value_norms (the same product, in the graph)."""
        v = np.asarray(v)
        out, R_t = np.empty(v.shape[:-1], COMPUTE), self._value_r(v.shape[-1])                   # R_t [H, dh, dh]
        for h in range(v.shape[-3]):
            for a in range(0, v.shape[-2], tokens):
                out[..., h, a:a + tokens] = np.linalg.norm(v[..., h, a:a + tokens, :] @ R_t[h], axis=-1)
        return out

    def _value_r(self, dh: int) -> np.ndarray:
        """[H, dh, dh] each head's R^T (W_h^T W_h = R^T R): its Gram's (summed by sgemm: R within 2e-7 of a float64
        Gram's, in half the time) Cholesky factor in float64, or by QR where a head's columns are dependent (a pruned
        head's zeros). Made once per W_O (a W_O given anew, as a loaded checkpoint's, is factored anew)."""
        W = self.attn.out_projection()[0]
        if self._r[0] is not W:
            heads = widen(W).reshape(len(W), -1, dh).transpose(1, 0, 2)                       # [H, D, dh]
            try:
                R_t = np.linalg.cholesky((heads.transpose(0, 2, 1) @ heads).astype(np.float64))  # [H, dh, dh], lower
            except np.linalg.LinAlgError:
                R_t = np.stack([np.linalg.qr(h, mode="r") for h in heads.astype(np.float64)]).transpose(0, 2, 1)
            self._r = (W, np.ascontiguousarray(R_t, COMPUTE))
        return self._r[1]


@dataclass
class TransformerOutput:
    hidden: np.ndarray                     # [B, T, D] after the last block (and the final norm)
    attentions: np.ndarray                 # [L, B, H, T, T]
    stages: dict[str, np.ndarray] | None = field(default=None)  # name -> [L, B, H, T, T|d_head], x [L, B, T, D]
    next_token_logits: np.ndarray | None = None   # [B, V] after each text's last token (LM head only)
    token_logprobs: np.ndarray | None = None      # [B, T] log p(token_t | tokens before t); 0 at t = 0
    value_norms: np.ndarray | None = None         # [L, B, H, T] ||v_j W_O^h|| (TransformerBlock.value_norms)


def _values(seen: dict):
    """A block hook that keeps the value site (each query head's values) in `seen` and changes nothing."""
    def hook(site, value):
        if site == "value":
            seen[site] = value
        return value
    return hook


class Transformer:
    """Token (+ position, + segment) embeddings, n_layers blocks, an optional final norm and LM head.

    Weights are drawn from N(0, 0.02^2) by seed; seed=None leaves them zero, to be loaded (a 135M
    model then costs nothing to construct)."""

    def __init__(self, cfg: TransformerConfig, seed: int | None = 0):
        rng = None if seed is None else np.random.default_rng(seed)
        self.cfg = cfg
        self.wte = _normal(rng, (cfg.vocab_size, cfg.d_model))                                    # tokens
        self.wpe = _normal(rng, (cfg.max_positions, cfg.d_model)) if cfg.position == "learned" else None  # positions
        self.wtt = _normal(rng, (cfg.type_vocab_size, cfg.d_model)) if cfg.type_vocab_size else None      # segments
        self.rope = rope_tables(cfg.max_positions, cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling) \
            if cfg.position == "rope" else None                                     # (cos, sin) [P, rotary_dim]
        self.rope_local = rope_tables(cfg.max_positions, cfg.rotary_dim, cfg.rope_local_theta) \
            if self.rope is not None and cfg.rope_local_theta and cfg.local_layers else None   # local layers' own
        Norm = RMSNorm if cfg.norm == "rms" else LayerNorm
        self.ln_embed = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.embed_norm else None
        self.blocks = [TransformerBlock(cfg, rng, self.rope_for(i), cfg.window(i)) for i in range(cfg.n_layers)]
        self.ln_f = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.final_norm else None
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, rng, bias=False) \
            if cfg.lm_head and not cfg.tie_embeddings else None                                       # [V, D]

    def rope_for(self, layer: int):
        """The RoPE tables (cos, sin) layer `layer` rotates by: the local layers' own base where it has one."""
        return self.rope_local if self.rope_local is not None and self.cfg.window(layer) else self.rope

    @property
    def unembedding(self) -> np.ndarray:
        """The LM head's weight [V, D]: logits = hidden @ W^T. Tied: the token embedding itself."""
        return self.wte if self.lm_head is None else self.lm_head.weight

    def embed(self, input_ids, token_type_ids=None, start: int = 0):
        """Token (+ position, + segment) embeddings of input_ids [B, T] at positions start..start+T-1 -> [B, T, D]."""
        T = input_ids.shape[1]
        if start + T > self.cfg.max_positions:
            raise ValueError(f"{start + T} tokens is more than this model's {self.cfg.max_positions} positions; "
                             "truncate the input")
        x = widen(self.wte[input_ids])                                    # [B, T, D]
        if self.cfg.embed_scale != 1.0:                                   # Gemma: times sqrt(d_model)
            x = x * scalar(self.cfg.embed_scale)
        if self.wpe is not None:
            x = x + widen(self.wpe[start:start + T])
        if self.wtt is not None:
            x = x + widen(self.wtt[np.zeros_like(input_ids) if token_type_ids is None else token_type_ids])
        return x if self.ln_embed is None else self.ln_embed(x)

    def head_masks(self, head_mask, head_mean, lengths, B: int, T: int) -> list | None:
        """Per layer (keep [B, H], mean [B, H], weights [B, T]) from head_mask and head_mean [B|1, L, H]."""
        if head_mask is None and head_mean is None:
            return None
        L, H = self.cfg.n_layers, self.cfg.n_heads
        arrays = []
        for name, value, default in (("head_mask", head_mask, 1.0), ("head_mean", head_mean, 0.0)):
            value = np.full((B, L, H), default, COMPUTE) if value is None else np.asarray(value, COMPUTE)
            if value.ndim != 3 or value.shape[1:] != (L, H) or value.shape[0] not in (1, B):
                raise ValueError(f"{name} must be [batch, layers, heads] = [{B}, {L}, {H}]; got shape {value.shape}")
            arrays.append(np.broadcast_to(value, (B, L, H)))
        keep, mean = arrays
        weights = position_weights(lengths, T)
        return [(keep[:, layer], mean[:, layer], weights) for layer in range(L)]

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, stages: bool = False,
                 head_mask=None, head_mean=None, lengths=None) -> TransformerOutput:
        """input_ids [B, T] int; attention_mask additive [B, 1|H, T, T] (None: everything visible);
        head_mask, head_mean [B, L, H] (see functional.ablate_heads; None: keep every head);
        lengths [B]: each text's real tokens, padding after them (None: all T)."""
        input_ids = np.asarray(input_ids, np.int64)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [batch, tokens]; got shape {input_ids.shape}")
        B, T = input_ids.shape
        lengths = np.full(B, T) if lengths is None else np.asarray(lengths, np.int64)
        per_layer = self.head_masks(head_mask, head_mean, lengths, B, T)
        x = self.embed(input_ids, token_type_ids)
        probs, seen, norms = [], [], []
        for i, block in enumerate(self.blocks):
            seen.append({})
            x, p, _ = block(x, attention_mask, None if per_layer is None else per_layer[i],
                            hook=seen[-1].setdefault if stages else _values(seen[-1]))
            probs.append(p)
            norms.append(block.value_norms(seen[-1]["value"]))
        st = {name: [s[site] for s in seen] for name, site in STAGE_SITES.items()} if stages else {}
        if self.ln_f is not None:
            x = self.ln_f(x)
        out = TransformerOutput(x, np.stack(probs), {k: np.stack(v) for k, v in st.items()} if stages else None,
                                value_norms=np.stack(norms))
        if self.cfg.lm_head:
            out.next_token_logits, out.token_logprobs = self.lm_outputs(x, input_ids, lengths)
        return out

    def lm_outputs(self, hidden, input_ids, lengths) -> tuple[np.ndarray, np.ndarray]:
        """Next-token logits after each text's last token [B, V], and log p(token_t | tokens < t) [B, T].

        log p(x_t | x_<t) = logit_{t-1}[x_t] - logsumexp_v logit_{t-1}[v]. The log-sum-exp runs over VOCAB_CHUNK
        vocabulary rows at a time (each text's next-token logits are its last row of them) and the target logit is one
        dot product, so no [T, V] array is ever held (at 4096 tokens and SmolLM2's 49152 words: 805 MB). The first
        token has no context: its entry is 0. Log-probs are clipped at 0 (rounding noise). Mirrored node for node by
        graphs/steps.lm_outputs."""
        W, B = self.unembedding, len(hidden)                              # W [V, D]
        cap = self.cfg.final_softcap                                      # Gemma 2: logits soft-capped (0: off)
        following = np.concatenate([input_ids[:, 1:], np.zeros((B, 1), np.int64)], axis=1)   # x_{t+1}, [B, T]
        target = soft_cap(np.einsum("btd,btd->bt", hidden, widen(W[following])), cap)   # logit_t[x_{t+1}], [B, T]
        rows, lse = [], []                                                # per vocabulary chunk
        for v in range(0, len(W), VOCAB_CHUNK):
            z = soft_cap(hidden @ widen(W[v:v + VOCAB_CHUNK]).T, cap)     # [B, T, chunk]
            rows.append(z[np.arange(B), lengths - 1])                     # each text's last position, [B, chunk]
            lse.append(_logsumexp(z))                                     # [B, T] (z is its scratch)
        next_token_logits, lse = np.concatenate(rows, -1), np.stack(lse, -1)   # [B, V], [B, T, chunks]
        logp_next = np.minimum(target - _logsumexp(lse), 0.0)             # log p(x_{t+1} | x_<=t), [B, T]
        token_logprobs = np.concatenate([np.zeros((B, 1), COMPUTE), logp_next[:, :-1]], axis=1)
        return next_token_logits, token_logprobs.astype(COMPUTE)


def logits(model: Transformer, x: np.ndarray) -> np.ndarray:
    """Next-token logits of final hidden states x [..., D] (after the final norm): x @ W_U^T [..., V], soft-capped where
    the model caps them (Gemma 2), W_U read VOCAB_CHUNK rows at a time (each widened once read: a bfloat16 unembedding
    is never whole in float32). Every NumPy path reads logits here but lm_outputs (off its log-sum-exp's chunks)."""
    W = model.unembedding                                                 # [V, D]
    out = np.empty(x.shape[:-1] + (len(W),), x.dtype)
    for v in range(0, len(W), VOCAB_CHUNK):
        out[..., v:v + VOCAB_CHUNK] = x @ widen(W[v:v + VOCAB_CHUNK]).T
    return soft_cap(out, model.cfg.final_softcap)


def _normal(rng: np.random.Generator | None, shape, std: float = 0.02) -> np.ndarray:
    """N(0, std^2) float32 weights, or zeros (not yet loaded) without a generator."""
    if rng is None:
        return np.zeros(shape, COMPUTE)
    return (rng.standard_normal(shape) * std).astype(COMPUTE)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis, the max subtracted first so exp never overflows.
    Works in place: x is scratch (a [B, T, VOCAB_CHUNK] chunk of logits is never copied)."""
    m = x.max(axis=-1, keepdims=True)
    x -= m
    return np.log(np.exp(x, out=x).sum(axis=-1)) + m[..., 0]
