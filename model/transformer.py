"""Transformer blocks and stacks in NumPy: BERT's post-norm encoder and GPT-2's pre-norm decoder.

One `Transformer` class covers both; `TransformerConfig` says which. The attention mask is an
*input* (additive, [B, 1|H, T, T]), built by the caller from padding, causality and user masks, so
the same forward pass (and the same exported ONNX graph) serves every masking choice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .attention import MultiHeadAttention
from .functional import gelu, layer_norm, linear

STAGES = ("q", "k", "scores", "scaled", "masked")  # teaching outputs, besides the probabilities


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    max_positions: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    norm_first: bool = False        # False: BERT post-norm; True: GPT-2 pre-norm
    causal: bool = False            # decoders see only the past (the runtime builds that mask)
    type_vocab_size: int = 0        # BERT's segment (token type) embeddings; 0 = none
    embed_norm: bool = False        # BERT normalises the summed embeddings
    final_norm: bool = False        # GPT-2 normalises after the last block
    layer_norm_eps: float = 1e-5
    temperature: float = 1.0

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class LayerNorm:
    def __init__(self, dim: int, eps: float):
        self.weight, self.bias, self.eps = np.ones(dim, np.float32), np.zeros(dim, np.float32), eps

    def __call__(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


class Linear:
    def __init__(self, d_in: int, d_out: int, rng: np.random.Generator, std: float = 0.02):
        self.weight = (rng.standard_normal((d_out, d_in)) * std).astype(np.float32)  # [out, in]
        self.bias = np.zeros(d_out, np.float32)

    def __call__(self, x):
        return linear(x, self.weight, self.bias)


class MLP:
    """Position-wise feed-forward: Linear -> GELU -> Linear, applied to each token alone."""

    def __init__(self, cfg: TransformerConfig, rng):
        self.fc, self.proj = Linear(cfg.d_model, cfg.d_ff, rng), Linear(cfg.d_ff, cfg.d_model, rng)

    def __call__(self, x):
        return self.proj(gelu(self.fc(x)))


class TransformerBlock:
    """Attention then MLP, each wrapped in a residual connection and a LayerNorm.

    post-norm (BERT):  x = LN1(x + MHA(x));   x = LN2(x + MLP(x))
    pre-norm (GPT-2):  x = x + MHA(LN1(x));   x = x + MLP(LN2(x))
    Pre-norm keeps an un-normalised residual stream, which is what lets deep stacks train stably.
    """

    def __init__(self, cfg: TransformerConfig, rng):
        self.norm_first = cfg.norm_first
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, temperature=cfg.temperature,
                                       seed=int(rng.integers(2**31)))
        self.ln1, self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps), LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = MLP(cfg, rng)

    def __call__(self, x, mask=None, stages: bool = False):
        """x [B, T, D], mask additive [B, 1|H, T, T]. Returns x, probs [B, H, T, T], stages or None."""
        h = self.ln1(x) if self.norm_first else x
        a, probs, st, (q, k, _) = self.attn(h, attn_mask=mask, average_attn_weights=False, return_stages=True)
        x = x + a if self.norm_first else self.ln1(x + a)
        x = x + self.mlp(self.ln2(x)) if self.norm_first else self.ln2(x + self.mlp(x))
        return x, probs, (dict(q=q, k=k, scores=st.scores, scaled=st.scaled, masked=st.masked) if stages else None)


@dataclass
class TransformerOutput:
    hidden: np.ndarray                     # [B, T, D] after the last block
    attentions: np.ndarray                 # [L, B, H, T, T]
    stages: dict[str, np.ndarray] | None = field(default=None)  # name -> [L, B, H, T, T|d_head]


class Transformer:
    """Token (+ position, + segment) embeddings, then n_layers blocks."""

    def __init__(self, cfg: TransformerConfig, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.cfg = cfg
        self.wte = (rng.standard_normal((cfg.vocab_size, cfg.d_model)) * 0.02).astype(np.float32)     # tokens
        self.wpe = (rng.standard_normal((cfg.max_positions, cfg.d_model)) * 0.02).astype(np.float32)  # positions
        self.wtt = (rng.standard_normal((cfg.type_vocab_size, cfg.d_model)) * 0.02).astype(np.float32) \
            if cfg.type_vocab_size else None                                                          # segments
        self.ln_embed = LayerNorm(cfg.d_model, cfg.layer_norm_eps) if cfg.embed_norm else None
        self.blocks = [TransformerBlock(cfg, rng) for _ in range(cfg.n_layers)]
        self.ln_f = LayerNorm(cfg.d_model, cfg.layer_norm_eps) if cfg.final_norm else None

    def embed(self, input_ids, token_type_ids=None):
        T = input_ids.shape[1]
        if T > self.cfg.max_positions:
            raise ValueError(f"{T} tokens is more than this model's {self.cfg.max_positions} positions; truncate the input")
        x = self.wte[input_ids] + self.wpe[:T]                            # [B, T, D]
        if self.wtt is not None:
            x = x + self.wtt[np.zeros_like(input_ids) if token_type_ids is None else token_type_ids]
        return x if self.ln_embed is None else self.ln_embed(x)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, stages: bool = False) -> TransformerOutput:
        """input_ids [B, T] int; attention_mask additive [B, 1|H, T, T] (None: everything visible)."""
        input_ids = np.asarray(input_ids, np.int64)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [batch, tokens]; got shape {input_ids.shape}")
        x = self.embed(input_ids, token_type_ids)
        probs, st = [], {name: [] for name in STAGES}
        for block in self.blocks:
            x, p, s = block(x, attention_mask, stages)
            probs.append(p)
            for name in st if stages else ():
                st[name].append(s[name])
        if self.ln_f is not None:
            x = self.ln_f(x)
        return TransformerOutput(x, np.stack(probs), {k: np.stack(v) for k, v in st.items()} if stages else None)
