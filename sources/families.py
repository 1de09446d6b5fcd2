"""Model families: one entry of ARCHITECTURES per family, chosen by config.json's `model_type` (or `architectures`).

Each entry is a config mapping (config.json -> TransformerConfig, the input cap, notes for a person) and a name
mapping (our tensor -> the model folder's). Where the families differ from the TransformerConfig defaults:
  BERT      post-norm encoder; separate query/key/value stacked into one in_proj (PyTorch's layout)
  RoBERTa   BERT, but position ids start after the padding index (padding_idx + 1 + position): the
            position table's first padding_idx + 1 rows are never read, so they are dropped here
  GPT-2     pre-norm decoder; Conv1D layers keep weights [in, out], so they are transposed; gelu_new
            is the tanh GELU; learned positions; the LM head is the token embedding (tied)
  Llama     pre-norm, RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases
  Mistral   Llama with a sliding window: exact while the input fits in it, so max_tokens is capped there
  Qwen2     Llama with biases on the q, k and v projections
  Qwen3     Llama with QK-norm: an RMSNorm over each head's queries and keys (weights of d_head) before RoPE
  OLMo 2    Llama with its norms after the sublayers (x = x + N(Attn(x)); x = x + N(MLP(x))) and QK-norm over the
            whole q and k projections (before they are split into heads)
  GPT-NeoX  Pythia's family: LayerNorm with biases, GELU, untied embed_out, RoPE on each head's first rotary_pct of
            its features (rotate-half within them), parallel residual (x = x + Attn(N1(x)) + MLP(N2(x))) when
            use_parallel_residual; query_key_value is one fused matrix laid out per head (q, k, v of head 0, then of
            head 1, ...), split at load
  Phi-3     Llama with fused qkv_proj and gate_up_proj (split into ours at load), a sliding window where its config
            sets one, LongRoPE (the short factors: exact up to original_max_position_embeddings, so capped there) and
            partial rotary embeddings (partial_rotary_factor: only a head's first features turn)
  Gemma 2   Llama's shape with GeGLU (gelu_pytorch_tanh), token embeddings times sqrt(d_model), scores scaled by
            query_pre_attn_scalar, attention and final logit soft-capping, a norm before and after both the
            attention and the MLP (4 per block: OLMo 2's output norms with the pre-norms), alternating local
            (sliding-window) and global layers (layer_types; the window is part of a local layer's own mask, exact
            at every length), tied embeddings. Gemma's RMSNorm multiplies by (1 + weight): 1 is added to the norms'
            weights at load (GGUF files already hold 1 + weight)
  Gemma 3   Gemma 2 without soft-capping, with QK-norm (each head's q and k RMS-normalised) and the local layers'
            own RoPE base (rope_local_base_freq, plain RoPE); the global layers' RoPE scaling (4B and up: linear) is
            the Llama family's (_rope); model_type gemma3_text, or gemma3 with its text_config inside
RoPE scaling (the Llama family and Phi-3; model/rope.py): llama3 (Llama 3.x), linear, yarn, longrope and dynamic
from rope_parameters / rope_scaling, into the one table of each model; dynamic is plain RoPE up to
max_position_embeddings, where its positions end anyway. Positions go to max_position_embeddings within
MAX_POSITIONS (ATTNSCOPE_MAX_TOKENS's ceiling), inputs by default to MAX_TOKENS.
  T5, BART, Marian   encoder-decoders (model/encdec.py, EncoderDecoderConfig): T5 pre-norm RMS with bucketed
            relative positions, unscaled scores, relu or gated FF, the tied LM head at d_model**-0.5 (none when
            config.json has tie_word_embeddings false or the file has its own lm_head); BART post-norm with learned
            positions at offset 2 and layernorm_embedding; Marian sinusoidal; both final_logits_bias. One vocabulary
            and one width for both stacks (anything else is refused)
Adding a family is adding an entry here (and its parity test), never editing routes or the page.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

import numpy as np

from ..model.precision import scalar
from ..model.rope import RopeScaling
from ..model.transformer import TransformerConfig
from .spec import MAX_POSITIONS, MAX_TOKENS, ModelUnavailable

GELU = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}   # hidden_act -> our mlp


class Split(NamedTuple):
    """One part of a fused tensor whose rows are `groups` runs of parts of these sizes (GPT-NeoX's query_key_value:
    per head, q, k and v of d_head rows each; Phi-3's qkv_proj: one run of q, k, v; its gate_up_proj: gate, up)."""
    part: int
    sizes: tuple[int, ...]
    groups: int = 1


class Source(NamedTuple):
    """Where one of our tensors comes from: the model folder's tensors, stacked along rows in this order."""
    names: tuple[str, ...]
    transpose: bool = False   # GPT-2's Conv1D keeps weights [in, out]
    skip_rows: int = 0        # RoBERTa's position table: rows before padding_idx + 1 are never read
    offset: float = 0.0       # added to the values: Gemma's norms multiply by (1 + weight)
    split: Split | None = None  # ours is one part of a fused tensor (GPT-NeoX's query_key_value, Phi-3's qkv_proj)


@dataclass(frozen=True)
class Architecture:
    title: str
    embedding: str                                   # the token embedding's name, which tells the prefix
    config: Callable[[dict, set], tuple[TransformerConfig, int, list[str]]]   # -> cfg, max_tokens, notes
    names: Callable[[TransformerConfig, dict, str], dict[str, Source]]         # our name -> Source


def _get(c: dict, key: str, default=None):
    """A config value; a required one (no default) missing is the config's fault, said in one line."""
    value = c.get(key, default)
    if value is None:
        raise ModelUnavailable(f"config.json has no {key!r}, which its model_type {c.get('model_type')!r} needs")
    return value


def _width(c: dict, d_key: str, h_key: str) -> tuple[int, int]:
    """d_model and heads of a family whose heads split d_model evenly (BERT, RoBERTa, GPT-2)."""
    d, heads = _get(c, d_key), _get(c, h_key)
    if d % heads:
        raise ModelUnavailable(f"config.json's {d_key} {d} is not divisible by {h_key} {heads}")
    return d, heads


def _activation(c: dict, key: str, default: str) -> str:
    act = c.get(key, default)
    if act not in GELU:
        raise ModelUnavailable(f"config.json's {key} is {act!r}; supported: {', '.join(GELU)}")
    return GELU[act]


def _bert_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ModelUnavailable(f"position_embedding_type {c['position_embedding_type']!r} is not supported "
                               f"(only 'absolute', learned positions)")
    if c.get("is_decoder") or c.get("add_cross_attention"):
        raise ModelUnavailable("a BERT-style model configured as a decoder (is_decoder / add_cross_attention) is "
                               "not supported; encoders only")
    offset = _get(c, "pad_token_id", 1) + 1 if c["model_type"] == "roberta" else 0
    positions = _get(c, "max_position_embeddings") - offset
    d, heads = _width(c, "hidden_size", "num_attention_heads")
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=positions, d_model=d, n_heads=heads,
        n_layers=_get(c, "num_hidden_layers"),
        d_ff=_get(c, "intermediate_size"), type_vocab_size=c.get("type_vocab_size", 2), embed_norm=True,
        layer_norm_eps=c.get("layer_norm_eps", 1e-12), mlp=_activation(c, "hidden_act", "gelu"))
    return cfg, min(positions, MAX_TOKENS), []


def _bert_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """BERT and RoBERTa; m is the prefix ("bert.", "roberta." or none)."""
    e = m + "embeddings."
    offset = c.get("pad_token_id", 1) + 1 if c["model_type"] == "roberta" else 0
    names = {"wte": Source((e + "word_embeddings.weight",)),
             "wpe": Source((e + "position_embeddings.weight",), skip_rows=offset),
             "wtt": Source((e + "token_type_embeddings.weight",))} | _module("ln_embed", e + "LayerNorm")
    for i in range(cfg.n_layers):
        h, p = f"{m}encoder.layer.{i}.", f"blocks.{i}."
        qkv = [f"{h}attention.self.{n}" for n in ("query", "key", "value")]
        names[p + "attn.in_proj_weight"] = Source(tuple(n + ".weight" for n in qkv))
        names[p + "attn.in_proj_bias"] = Source(tuple(n + ".bias" for n in qkv))
        for ours, theirs in (("attn.out_proj", "attention.output.dense"), ("ln1", "attention.output.LayerNorm"),
                             ("mlp.fc", "intermediate.dense"), ("mlp.proj", "output.dense"),
                             ("ln2", "output.LayerNorm")):
            names |= _module(p + ours, h + theirs)
    return names


def _gpt2_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if not c.get("scale_attn_weights", True) or c.get("scale_attn_by_inverse_layer_idx", False):
        raise ModelUnavailable("GPT-2 attention without the 1/sqrt(d_head) scale (scale_attn_weights false) or "
                               "scaled by layer (scale_attn_by_inverse_layer_idx) is not supported")
    d, heads = _width(c, "n_embd", "n_head")
    tie = c.get("tie_word_embeddings", True)
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=_get(c, "n_positions"), d_model=d, n_heads=heads,
        n_layers=_get(c, "n_layer"), d_ff=c.get("n_inner") or 4 * d, norm_first=True, causal=True, final_norm=True,
        layer_norm_eps=c.get("layer_norm_epsilon", 1e-5), mlp=_activation(c, "activation_function", "gelu_new"),
        lm_head=tie or "lm_head.weight" in tensors, tie_embeddings=tie)
    return cfg, min(cfg.max_positions, MAX_TOKENS), []


def _gpt2_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """GPT-2's Conv1D layers hold weights [in, out]: transposed to [out, in]. c_attn is q, k, v side by side."""
    names = {"wte": Source((m + "wte.weight",)), "wpe": Source((m + "wpe.weight",))} | _module("ln_f", m + "ln_f")
    for i in range(cfg.n_layers):
        h, p = f"{m}h.{i}.", f"blocks.{i}."
        names |= {p + "attn.in_proj_weight": Source((h + "attn.c_attn.weight",), transpose=True),
                  p + "attn.in_proj_bias": Source((h + "attn.c_attn.bias",))}
        names |= _module(p + "attn.out_proj", h + "attn.c_proj", transpose=True)
        names |= _module(p + "ln1", h + "ln_1") | _module(p + "ln2", h + "ln_2")
        names |= _module(p + "mlp.fc", h + "mlp.c_fc", transpose=True)
        names |= _module(p + "mlp.proj", h + "mlp.c_proj", transpose=True)
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("lm_head.weight",))
    return names


def _rope_parameters(c: dict) -> dict:
    """config.json's RoPE settings as one dict, its kind under 'rope_type': `rope_parameters` (transformers 5) or
    `rope_scaling` (4.x, kind under 'type'), as transformers' standardize_rope_params merges them."""
    rope = dict(c.get("rope_scaling") or {}) | dict(c.get("rope_parameters") or {})
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope


def _rope_theta(c: dict) -> float:
    """RoPE's base from `rope_parameters` (transformers 5) or `rope_theta` / `rope_scaling` (4.x), for a family whose
    scaling is not wired (see _rope for those that are)."""
    rope = _rope_parameters(c)
    kind = rope["rope_type"]
    if kind != "default":
        raise ModelUnavailable(f"RoPE scaling {kind!r} is not supported (only plain RoPE, rope_type 'default')")
    if c.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelUnavailable(f"partial rotary embeddings (partial_rotary_factor {c['partial_rotary_factor']}) "
                               f"are not supported")
    return float(rope.get("rope_theta") or c.get("rope_theta") or 10000.0)


ROPE_KINDS = ("linear", "llama3", "yarn", "longrope", "dynamic")   # besides "default": model/rope.py


class Rope(NamedTuple):
    theta: float
    scaling: RopeScaling | None
    rotary_dim: int
    limit: int | None    # the most positions one table serves exactly (longrope, dynamic), or None
    note: str            # for a person, where the limit caps the input


def _rope(c: dict, d_head: int) -> Rope:
    """RoPE as the Llama family and Phi-3 configure it: theta, the scaling (rope_type and its parameters, as
    transformers' ROPE_INIT_FUNCTIONS read them), and the features it turns (Phi-3's partial_rotary_factor)."""
    family, rope = c["model_type"], _rope_parameters(c)
    theta = float(rope.get("rope_theta") or c.get("rope_theta") or 10000.0)
    kind = rope["rope_type"]
    if family == "phi3" and kind in ("su", "yarn"):      # Phi3Config's names for longrope in older configs
        kind = "longrope"
    if kind not in ("default",) + ROPE_KINDS:
        raise ModelUnavailable(f"RoPE scaling {kind!r} is not supported (supported rope_type: default, "
                               f"{', '.join(ROPE_KINDS)})")
    partial = float(rope.get("partial_rotary_factor") or c.get("partial_rotary_factor") or 1.0)
    if partial != 1.0 and family != "phi3":   # LlamaAttention turns every feature: transformers ignores it there
        raise ModelUnavailable(f"partial rotary embeddings (partial_rotary_factor {partial}) are not supported for "
                               f"model_type {family!r} (Phi-3 only)")
    rotary_dim = int(d_head * partial)
    if kind == "default":
        return Rope(theta, None, rotary_dim, None, "")
    positions = _get(c, "max_position_embeddings")
    original = c.get("original_max_position_embeddings") or (4096 if family == "phi3" else None) \
        or rope.get("original_max_position_embeddings") or positions   # a top-level one first, as transformers
    need = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",), "longrope": ("short_factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor")}[kind]
    missing = [k for k in need if rope.get(k) is None and not (k == "factor" and kind == "yarn")]
    if missing:
        raise ModelUnavailable(f"config.json's RoPE scaling {kind!r} has no {', '.join(missing)}")
    factor = rope.get("factor") or positions / original                  # yarn, longrope: the lengths' ratio
    scaling = RopeScaling(
        kind, float(factor), positions if kind == "dynamic" else int(original),
        low_freq_factor=float(rope.get("low_freq_factor") or 1.0),
        high_freq_factor=float(rope.get("high_freq_factor") or 4.0),
        beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
        truncate=bool(rope.get("truncate", True)), mscale=float(rope.get("mscale") or 0),
        mscale_all_dim=float(rope.get("mscale_all_dim") or 0), attention_factor=rope.get("attention_factor"),
        short_factor=rope.get("short_factor") or (), long_factor=rope.get("long_factor") or ())
    if kind == "longrope" and len(scaling.short_factor) != rotary_dim // 2:
        raise ModelUnavailable(f"config.json's longrope short_factor has {len(scaling.short_factor)} entries; its "
                               f"{rotary_dim} rotary features need {rotary_dim // 2}")
    note = {"longrope": f"LongRoPE's short factors are exact up to {original} tokens "
                        f"(original_max_position_embeddings); past it transformers turns every position by the long "
                        f"factors instead, which one table cannot serve: inputs are capped at {original} tokens.",
            "dynamic": f"Dynamic NTK scaling is plain RoPE up to max_position_embeddings ({positions}); past it "
                       f"transformers raises theta with the input's length: inputs are capped at {positions} tokens."
            }.get(kind, "")
    return Rope(theta, scaling, rotary_dim, scaling.limit, note)


def _sliding_window(c: dict) -> int | None:
    """The window of layers that attend to only the last W keys, if any layer does (Mistral; Qwen2 when asked)."""
    window = c.get("sliding_window")
    if not window:
        return None
    if "layer_types" in c:
        return window if "sliding_attention" in (c["layer_types"] or ()) else None
    return window if c["model_type"] in ("mistral", "phi3") or c.get("use_sliding_window") else None


def _llama_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    """Llama, Mistral, Qwen2 and Phi-3: they differ in biases, the sliding window and RoPE (see _rope)."""
    if c.get("hidden_act", "silu") != "silu":
        raise ModelUnavailable(f"hidden_act {c['hidden_act']!r} is not supported (the family's SwiGLU uses silu)")
    family = c["model_type"]
    if family == "qwen2":
        qkv_bias, bias = True, False                      # q/k/v biases; o_proj and the MLP have none
    elif family in ("qwen3", "olmo2"):                    # attention_bias: q, k, v and o, but never the MLP
        if c.get("attention_bias"):
            raise ModelUnavailable(f"attention_bias true (biases on q, k, v and o but not the MLP) is not supported "
                                   f"for model_type {family!r}")
        qkv_bias = bias = False
    else:
        qkv_bias = bias = bool(c.get("attention_bias", False))   # q, k, v and o
        if bool(c.get("mlp_bias", False)) != bias:
            raise ModelUnavailable(f"attention_bias {c.get('attention_bias')} with mlp_bias {c.get('mlp_bias')} "
                                   f"is not supported (both on or both off)")
    d, heads = _get(c, "hidden_size"), _get(c, "num_attention_heads")
    tie = c.get("tie_word_embeddings", False)
    d_head = c.get("head_dim") or d // heads
    rope = _rope(c, d_head)
    positions, notes = min(_get(c, "max_position_embeddings"), MAX_POSITIONS), []   # ATTNSCOPE_MAX_TOKENS's ceiling
    window = _sliding_window(c)
    if window is not None and window < positions:
        positions = window
        notes.append(f"Inputs are capped at {window} tokens, its sliding window: within it every query sees all "
                     f"earlier keys, as transformers computes them; longer texts are truncated.")
    if rope.limit is not None and rope.limit <= positions:
        positions = rope.limit
        notes.append(rope.note)
    max_tokens = min(positions, MAX_TOKENS)
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=positions, d_model=d, n_heads=heads,
        n_layers=_get(c, "num_hidden_layers"), d_ff=_get(c, "intermediate_size"), norm_first=True, causal=True,
        final_norm=True, layer_norm_eps=float(c.get("rms_norm_eps", 1e-6)), norm="rms", position="rope",
        mlp="swiglu", attention="gqa", n_kv_heads=c.get("num_key_value_heads") or heads,
        d_head=d_head, rope_theta=rope.theta, rope_scaling=rope.scaling, rotary_dim=rope.rotary_dim,
        qkv_bias=qkv_bias, bias=bias,
        lm_head=tie or "lm_head.weight" in tensors, tie_embeddings=tie)
    if family == "qwen3":
        cfg = replace(cfg, qk_norm="head")
    if family == "olmo2":
        cfg = replace(cfg, qk_norm="full", norm_first=False, output_norms=True)
    return cfg, max_tokens, notes


LLAMA_BLOCK = {"attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
               "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
               "ln1": "input_layernorm", "ln2": "post_attention_layernorm",
               "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"}


QK_NORMS = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}                 # Qwen3, OLMo 2
OUTPUT_NORMS = {"post_attn_norm": "post_attention_layernorm", "post_mlp_norm": "post_feedforward_layernorm"}  # OLMo 2, Gemma


def _llama_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    names = {"wte": Source((m + "embed_tokens.weight",)), "ln_f.weight": Source((m + "norm.weight",))}
    block = {ours: theirs for ours, theirs in LLAMA_BLOCK.items() if cfg.norm_first or not ours.startswith("ln")}
    block |= (QK_NORMS if cfg.qk_norm else {}) | (OUTPUT_NORMS if cfg.output_norms else {})   # OLMo 2: no ln1, ln2
    for i in range(cfg.n_layers):
        for ours, theirs in block.items():
            names |= _module(f"blocks.{i}.{ours}", f"{m}layers.{i}.{theirs}")
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("lm_head.weight",))
    return names


def _gemma_rope_parameters(c: dict, layer_type: str) -> dict:
    """Gemma 3's RoPE parameters of one layer type: transformers 5's rope_parameters by layer type, or 4.x's
    rope_theta (global), rope_local_base_freq (local) and rope_scaling (global)."""
    rope = c.get("rope_parameters") or {}
    if layer_type in rope:
        return rope[layer_type] or {}
    if layer_type == "sliding_attention":
        return {"rope_type": "default", "rope_theta": c.get("rope_local_base_freq", 10000.0)}
    scaling = c.get("rope_scaling") or {}
    return {**scaling, "rope_type": scaling.get("rope_type") or scaling.get("type") or "default",
            "rope_theta": rope.get("rope_theta") or c.get("rope_theta", 1_000_000.0)}


def _gemma_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    """Gemma 2 and Gemma 3 (gemma3: the text model inside, text_config)."""
    if c["model_type"] == "gemma3":
        c = {**(c.get("text_config") or {}), "model_type": "gemma3"}
    family = "Gemma 3" if c["model_type"].startswith("gemma3") else "Gemma 2"
    act = c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise ModelUnavailable(f"hidden_activation {act!r} is not supported (Gemma's GeGLU uses gelu_pytorch_tanh)")
    if c.get("use_bidirectional_attention"):
        raise ModelUnavailable("use_bidirectional_attention is not supported (attnscope's Gemma is the causal decoder)")
    if c.get("attention_bias"):
        raise ModelUnavailable("attention_bias true is not supported (Gemma's projections have no biases)")
    d, heads, L = _get(c, "hidden_size"), _get(c, "num_attention_heads"), _get(c, "num_hidden_layers")
    pattern = c.get("sliding_window_pattern", 6 if family == "Gemma 3" else 2)
    layer_types = tuple(c.get("layer_types") or (   # transformers' defaults: Gemma 2 alternates, Gemma 3 5:1
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)))
    window = int(c.get("sliding_window") or 0) if "sliding_attention" in layer_types else 0
    if family == "Gemma 3":
        ropes = {t: _gemma_rope_parameters(c, t) for t in ("full_attention", "sliding_attention")}
        local = ropes["sliding_attention"].get("rope_type", "default")
        if local != "default":
            raise ModelUnavailable(f"RoPE scaling {local!r} on sliding_attention is not supported for Gemma 3 (its "
                                   f"local layers turn by plain RoPE, rope_type 'default')")
        full = {"rope_theta": 1_000_000.0} | ropes["full_attention"]   # the global layers: main's RoPE scaling
        rope = _rope({k: c[k] for k in ("max_position_embeddings", "original_max_position_embeddings") if k in c}
                     | {"model_type": c["model_type"], "rope_parameters": full}, c.get("head_dim") or d // heads)
        local_theta = float(ropes["sliding_attention"].get("rope_theta", 10000.0))
    else:
        rope, local_theta = Rope(_rope_theta(c), None, 0, None, ""), 0.0
    theta = rope.theta
    tie = c.get("tie_word_embeddings", True)
    max_tokens = min(_get(c, "max_position_embeddings"), MAX_TOKENS, rope.limit or MAX_TOKENS)
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=max_tokens, d_model=d, n_heads=heads, n_layers=L,
        d_ff=_get(c, "intermediate_size"), norm_first=True, causal=True, final_norm=True,
        layer_norm_eps=float(c.get("rms_norm_eps", 1e-6)), norm="rms", position="rope", mlp="geglu",
        attention="gqa", n_kv_heads=c.get("num_key_value_heads") or heads, d_head=c.get("head_dim") or d // heads,
        rope_theta=theta, rope_scaling=rope.scaling, qkv_bias=False, bias=False,
        lm_head=tie or "lm_head.weight" in tensors, tie_embeddings=tie, embed_scale=float(scalar(d ** 0.5)), query_pre_attn_scalar=float(c.get("query_pre_attn_scalar") or 0.0),
        attn_softcap=float(c.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(c.get("final_logit_softcapping") or 0.0), output_norms=True, sliding_window=window,
        layer_types=layer_types if window else (), rope_local_theta=local_theta if local_theta != theta or rope.scaling else 0.0,
        qk_norm="head" if family == "Gemma 3" else None)
    notes = [rope.note] if rope.note and rope.limit is not None and rope.limit <= max_tokens else []
    if window:
        local = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
        notes.append(f"{len(local)} of its {L} layers are local: each query sees only the last {window} keys "
                     f"(sliding window), part of those layers' own mask like the causal mask.")
    return cfg, max_tokens, notes


GEMMA_BLOCK = {"ln1": "input_layernorm", "ln2": "pre_feedforward_layernorm"} | OUTPUT_NORMS   # 4 norms per block


def _gemma_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """Llama's names, but four norms per block, each (like q_norm, k_norm and the final norm) stored as the
    multiplier 1 + weight."""
    one = lambda name: Source((name,), offset=1.0)   # noqa: E731
    names = {"wte": Source((m + "embed_tokens.weight",)), "ln_f.weight": one(m + "norm.weight")}
    for i in range(cfg.n_layers):
        h, p = f"{m}layers.{i}.", f"blocks.{i}."
        for ours, theirs in LLAMA_BLOCK.items():
            if not ours.startswith("ln"):
                names |= _module(p + ours, h + theirs)
        names |= {p + ours + ".weight": one(h + theirs + ".weight") for ours, theirs in GEMMA_BLOCK.items()}
        names |= {f"{p}attn.{n}_norm.weight": one(f"{h}self_attn.{n}_norm.weight") for n in "qk"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("lm_head.weight",))
    return names


def _gpt_neox_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if not c.get("attention_bias", True):
        raise ModelUnavailable("GPT-NeoX without attention biases (attention_bias false; its MLP keeps them) is not "
                               "supported")
    d, heads = _width(c, "hidden_size", "num_attention_heads")
    rope = c.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", c.get("rotary_pct", 0.25))      # transformers' default, 0.25
    rotary_dim = int(d // heads * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ModelUnavailable(f"partial_rotary_factor {factor} turns {rotary_dim} of each head's {d // heads} "
                               f"features; supported: an even number, at least 2")
    theta = _rope_theta({**c, "rope_theta": c.get("rotary_emb_base", c.get("rope_theta"))})   # 4.x: rotary_emb_base
    tie = c.get("tie_word_embeddings", False)
    positions = _get(c, "max_position_embeddings")
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=positions, d_model=d, n_heads=heads,
        n_layers=_get(c, "num_hidden_layers"), d_ff=_get(c, "intermediate_size"), norm_first=True, causal=True,
        final_norm=True, layer_norm_eps=float(c.get("layer_norm_eps", 1e-5)), mlp=_activation(c, "hidden_act", "gelu"),
        position="rope", attention="gqa", rope_theta=theta, rotary_dim=rotary_dim,
        parallel_residual=bool(c.get("use_parallel_residual", True)), lm_head=tie or "embed_out.weight" in tensors,
        tie_embeddings=tie)
    return cfg, min(positions, MAX_TOKENS), []


GPT_NEOX_BLOCK = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm", "attn.o_proj": "attention.dense",
                  "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}


def _gpt_neox_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """query_key_value [3 D, D] holds, head by head, that head's q, k and v rows: split into q_proj, k_proj, v_proj."""
    names = {"wte": Source((m + "embed_in.weight",))} | _module("ln_f", m + "final_layer_norm")
    for i in range(cfg.n_layers):
        h, p = f"{m}layers.{i}.", f"blocks.{i}."
        for ours, theirs in GPT_NEOX_BLOCK.items():
            names |= _module(p + ours, h + theirs)
        for j, n in enumerate("qkv"):
            names |= {f"{p}attn.{n}_proj.{w}": Source((f"{h}attention.query_key_value.{w}",),
                                                      split=Split(j, (cfg.d_head,) * 3, cfg.n_heads))
                      for w in ("weight", "bias")}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("embed_out.weight",))
    return names


def _phi3_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """Llama's names, but q, k and v are row blocks of one fused qkv_proj [q | k | v], and gate and up of gate_up_proj
    [gate | up] (Phi3MLP: gate, up = gate_up_proj(x).chunk(2))."""
    names = _llama_names(cfg, c, m)
    q, kv, ff = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.d_ff
    for i in range(cfg.n_layers):
        h, p = f"{m}layers.{i}.", f"blocks.{i}."
        for j, n in enumerate("qkv"):
            names[f"{p}attn.{n}_proj.weight"] = Source((h + "self_attn.qkv_proj.weight",), split=Split(j, (q, kv, kv)))
        for j, n in enumerate(("gate", "up")):
            names[f"{p}mlp.{n}.weight"] = Source((h + "mlp.gate_up_proj.weight",), split=Split(j, (ff, ff)))
    return names


def _module(ours: str, theirs: str, transpose: bool = False) -> dict[str, Source]:
    """A norm's or linear layer's weight and bias (the bias only where our model has one: see convert)."""
    return {ours + ".weight": Source((theirs + ".weight",), transpose), ours + ".bias": Source((theirs + ".bias",))}


_LLAMA = dict(embedding="embed_tokens.weight", config=_llama_config, names=_llama_names)
ARCHITECTURES = {
    "bert": Architecture("BERT", "embeddings.word_embeddings.weight", _bert_config, _bert_names),
    "roberta": Architecture("RoBERTa", "embeddings.word_embeddings.weight", _bert_config, _bert_names),
    "gpt2": Architecture("GPT-2", "wte.weight", _gpt2_config, _gpt2_names),
    "llama": Architecture("Llama", **_LLAMA),
    "mistral": Architecture("Mistral", **_LLAMA),
    "qwen2": Architecture("Qwen2", **_LLAMA),
    "qwen3": Architecture("Qwen3", **_LLAMA),
    "olmo2": Architecture("OLMo 2", **_LLAMA),
    "gpt_neox": Architecture("GPT-NeoX", "embed_in.weight", _gpt_neox_config, _gpt_neox_names),
    "phi3": Architecture("Phi-3", "embed_tokens.weight", _llama_config, _phi3_names),
    "gemma2": Architecture("Gemma 2", "embed_tokens.weight", _gemma_config, _gemma_names),
    "gemma3_text": Architecture("Gemma 3", "embed_tokens.weight", _gemma_config, _gemma_names),
    "gemma3": Architecture("Gemma 3 (its text model)", "embed_tokens.weight", _gemma_config, _gemma_names),
}
CLASS_PREFIXES = {"Bert": "bert", "Roberta": "roberta", "GPT2": "gpt2", "Llama": "llama", "Mistral": "mistral",
                  "Qwen2": "qwen2", "Qwen3": "qwen3", "Olmo2": "olmo2", "GPTNeoX": "gpt_neox", "Phi3": "phi3",
                  "Gemma2": "gemma2", "Gemma3": "gemma3"}
# (BertModel, BertForMaskedLM, GPT2LMHeadModel, Qwen2ForCausalLM, ...)
SUPPORTED = (f"supported: {', '.join(a.title for a in ARCHITECTURES.values())} model folders "
             f"(model_type {', '.join(ARCHITECTURES)}) and Llama-family or Gemma 3 .gguf files")


def architecture(c: dict) -> str:
    """The family from config.json: `model_type`, else the class named in `architectures`."""
    kind = c.get("model_type")
    if kind is None:
        for cls in c.get("architectures") or ():
            kind = next((a for p, a in CLASS_PREFIXES.items() if re.match(p + r"(Model|For|LMHead)", cls)), None)
            if kind:
                break
    if kind not in ARCHITECTURES:
        found = f"model_type {c.get('model_type')!r}, architectures {c.get('architectures')}"
        raise ModelUnavailable(f"config.json says {found}; {SUPPORTED}")
    return kind


# ---- encoder-decoders (model/encdec.py) -------------------------------------------------------------------------
T5_ACT = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}
T5_MAX_TOKENS = 512   # T5's relative positions have no table to run out of; this is the length it was trained on


def _t5_config(c: dict, tensors: set):
    from ..model.encdec import EncoderDecoderConfig
    proj = c.get("feed_forward_proj", "relu")
    gated, _, act = proj.rpartition("-")
    act = "gelu_new" if proj == "gated-gelu" else act           # transformers' own special case
    if gated not in ("", "gated") or act not in T5_ACT:
        raise ModelUnavailable(f"config.json's feed_forward_proj is {proj!r}; supported: an activation of "
                               f"{', '.join(T5_ACT)}, optionally gated ('gated-gelu')")
    d = _get(c, "d_model")
    # transformers' T5Config: the decoder's output is scaled by d_model**-0.5 unless tie_word_embeddings is false
    scale = c.get("scale_decoder_outputs", c.get("tie_word_embeddings") is not False)
    cfg = EncoderDecoderConfig(
        vocab_size=_get(c, "vocab_size"), d_model=d, n_heads=_get(c, "num_heads"), n_layers=_get(c, "num_layers"),
        n_decoder_layers=c.get("num_decoder_layers") or c["num_layers"], d_ff=_get(c, "d_ff"),
        max_positions=T5_MAX_TOKENS, d_head=_get(c, "d_kv"), norm="rms", norm_first=True, position="relative",
        relative_buckets=c.get("relative_attention_num_buckets", 32),
        relative_max_distance=c.get("relative_attention_max_distance", 128), final_norm=True, scaled=False,
        activation=T5_ACT[act], gated=bool(gated), bias=False, layer_norm_eps=float(c.get("layer_norm_epsilon", 1e-6)),
        lm_scale=d ** -0.5 if scale else 1.0, tie_embeddings="lm_head.weight" not in tensors,
        decoder_start_token_id=int(c.get("decoder_start_token_id", c.get("pad_token_id", 0)) or 0))
    return cfg, T5_MAX_TOKENS, [f"Inputs are capped at {T5_MAX_TOKENS} tokens, the length T5 was trained on."]


def _t5_names(cfg, c: dict, m: str) -> dict[str, Source]:
    names = {"shared": Source((m + "shared.weight",))}
    for stack, blocks in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        h = f"{m}{stack}."
        names |= _module(f"{stack[:3]}_ln_f", h + "final_layer_norm")
        names[f"{stack[:3]}_bias.weight"] = Source((h + "block.0.layer.0.SelfAttention.relative_attention_bias.weight",))
        for i in range(blocks):
            b, p = f"{h}block.{i}.layer.", f"{stack}.{i}."
            ff = 2 if stack == "decoder" else 1
            parts = {"self_attn": "0.SelfAttention", "ln_self": "0.layer_norm", "cross_attn": "1.EncDecAttention",
                     "ln_cross": "1.layer_norm", "ln_ff": f"{ff}.layer_norm", "ff.proj": f"{ff}.DenseReluDense.wo",
                     "ff.fc": f"{ff}.DenseReluDense.{'wi_0' if cfg.gated else 'wi'}",
                     "ff.up": f"{ff}.DenseReluDense.wi_1"}
            for ours, theirs in parts.items():
                if ours.endswith("_attn"):
                    for n in "qkvo":
                        names |= _module(f"{p}{ours}.{n}_proj", f"{b}{theirs}.{n}")
                else:
                    names |= _module(p + ours, b + theirs)
    names["lm_head"] = Source(("lm_head.weight",))
    return names


def _bart_config(c: dict, tensors: set):
    """BART and Marian: one shape, told apart by their positions and embedding norm."""
    from ..model.encdec import EncoderDecoderConfig
    family = c["model_type"]
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if _get(c, a) != _get(c, b):
            raise ModelUnavailable(f"config.json's {a} {c[a]} differs from its {b} {c[b]}; attnscope supports "
                                   f"encoder-decoders whose two stacks have the same width")
    for key in ("add_final_layer_norm", "normalize_before", "add_bias_logits"):   # mBART's and others' options
        if c.get(key):
            raise ModelUnavailable(f"config.json sets {key}, which {family} folders attnscope reads do not have")
    if family == "marian" and (not c.get("share_encoder_decoder_embeddings", True) or
                               c.get("decoder_vocab_size") not in (None, c.get("vocab_size"))):
        raise ModelUnavailable("a Marian model with separate encoder and decoder vocabularies "
                               "(share_encoder_decoder_embeddings false) is not supported")
    act = c.get("activation_function", "gelu")
    if act not in T5_ACT:
        raise ModelUnavailable(f"config.json's activation_function is {act!r}; supported: {', '.join(T5_ACT)}")
    d, heads = _width(c, "d_model", "encoder_attention_heads")
    positions = _get(c, "max_position_embeddings")
    cfg = EncoderDecoderConfig(
        vocab_size=_get(c, "vocab_size"), d_model=d, n_heads=heads, n_layers=_get(c, "encoder_layers"),
        n_decoder_layers=_get(c, "decoder_layers"), d_ff=_get(c, "encoder_ffn_dim"), max_positions=positions,
        position="learned" if family == "bart" else "sinusoidal", position_offset=2 if family == "bart" else 0,
        embed_scale=math.sqrt(d) if c.get("scale_embedding") else 1.0, embed_norm=family == "bart",
        activation=T5_ACT[act], tie_embeddings="lm_head.weight" not in tensors, logits_bias=True,
        decoder_start_token_id=int(_get(c, "decoder_start_token_id")))
    return cfg, min(positions, MAX_TOKENS), []


BART_BLOCK = {"ln_self": "self_attn_layer_norm", "ln_cross": "encoder_attn_layer_norm", "ln_ff": "final_layer_norm",
              "ff.fc": "fc1", "ff.proj": "fc2"}


def _bart_names(cfg, c: dict, m: str) -> dict[str, Source]:
    names = {"shared": Source((m + "shared.weight",)), "lm_head": Source(("lm_head.weight",)),
             "logits_bias": Source(("final_logits_bias",))}
    for stack, blocks in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        h = f"{m}{stack}."
        names[f"{stack[:3]}_wpe"] = Source((h + "embed_positions.weight",))
        names |= _module(f"{stack[:3]}_ln_embed", h + "layernorm_embedding")
        for i in range(blocks):
            b, p = f"{h}layers.{i}.", f"{stack}.{i}."
            for ours, theirs in (("self_attn", "self_attn"), ("cross_attn", "encoder_attn")):
                for n in "qkvo":
                    names |= _module(f"{p}{ours}.{n}_proj", f"{b}{theirs}.{'out' if n == 'o' else n}_proj")
            for ours, theirs in BART_BLOCK.items():
                names |= _module(p + ours, b + theirs)
    return names


ARCHITECTURES |= {
    "t5": Architecture("T5", "shared.weight", _t5_config, _t5_names),
    "bart": Architecture("BART", "shared.weight", _bart_config, _bart_names),
    "marian": Architecture("Marian", "shared.weight", _bart_config, _bart_names),
}
CLASS_PREFIXES |= {"T5": "t5", "Bart": "bart", "Marian": "marian"}   # T5ForConditionalGeneration, BartModel, ...
SUPPORTED = (f"supported: {', '.join(a.title for a in ARCHITECTURES.values())} model folders "
             f"(model_type {', '.join(ARCHITECTURES)}) and Llama-family .gguf files")
