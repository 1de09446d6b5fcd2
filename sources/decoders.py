"""The decoder families' entries (sources/families.py). Where they differ from the TransformerConfig defaults:
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
            the Llama family's (rope_of); model_type gemma3_text, or gemma3 with its text_config inside
"""
from __future__ import annotations

from dataclasses import replace

from ..model.precision import scalar
from ..model.transformer import TransformerConfig
from .mapping import Architecture, Source, Split, activation, setting, weight_and_bias, width
from .rope_settings import Rope, plain_theta, rope_of
from .spec import MAX_POSITIONS, MAX_TOKENS, ModelUnavailable

def _gpt2_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if not c.get("scale_attn_weights", True) or c.get("scale_attn_by_inverse_layer_idx", False):
        raise ModelUnavailable("GPT-2 attention without the 1/sqrt(d_head) scale (scale_attn_weights false) or "
                               "scaled by layer (scale_attn_by_inverse_layer_idx) is not supported")
    d, heads = width(c, "n_embd", "n_head")
    tie = c.get("tie_word_embeddings", True)
    cfg = TransformerConfig(
        vocab_size=setting(c, "vocab_size"), max_positions=setting(c, "n_positions"), d_model=d, n_heads=heads,
        n_layers=setting(c, "n_layer"), d_ff=c.get("n_inner") or 4 * d, norm_first=True, causal=True, final_norm=True,
        layer_norm_eps=c.get("layer_norm_epsilon", 1e-5), mlp=activation(c, "activation_function", "gelu_new"),
        lm_head=tie or "lm_head.weight" in tensors, tie_embeddings=tie)
    return cfg, min(cfg.max_positions, MAX_TOKENS), []


def _gpt2_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """GPT-2's Conv1D layers hold weights [in, out]: transposed to [out, in]. c_attn is q, k, v side by side."""
    names = {"wte": Source((m + "wte.weight",)), "wpe": Source((m + "wpe.weight",))}
    names |= weight_and_bias("ln_f", m + "ln_f")
    for i in range(cfg.n_layers):
        h, p = f"{m}h.{i}.", f"blocks.{i}."
        names |= {p + "attn.in_proj_weight": Source((h + "attn.c_attn.weight",), transpose=True),
                  p + "attn.in_proj_bias": Source((h + "attn.c_attn.bias",))}
        names |= weight_and_bias(p + "attn.out_proj", h + "attn.c_proj", transpose=True)
        names |= weight_and_bias(p + "ln1", h + "ln_1") | weight_and_bias(p + "ln2", h + "ln_2")
        names |= weight_and_bias(p + "mlp.fc", h + "mlp.c_fc", transpose=True)
        names |= weight_and_bias(p + "mlp.proj", h + "mlp.c_proj", transpose=True)
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("lm_head.weight",))
    return names


def _sliding_window(c: dict) -> int | None:
    """The window of layers that attend to only the last W keys, if any layer does (Mistral; Qwen2 when asked)."""
    window = c.get("sliding_window")
    if not window:
        return None
    if "layer_types" in c:
        return window if "sliding_attention" in (c["layer_types"] or ()) else None
    return window if c["model_type"] in ("mistral", "phi3") or c.get("use_sliding_window") else None


def _llama_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    """Llama, Mistral, Qwen2 and Phi-3: they differ in biases, the sliding window and RoPE (see rope_of)."""
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
    d, heads = setting(c, "hidden_size"), setting(c, "num_attention_heads")
    tie = c.get("tie_word_embeddings", False)
    d_head = c.get("head_dim") or d // heads
    rope = rope_of(c, d_head)
    positions, notes = min(setting(c, "max_position_embeddings"), MAX_POSITIONS), []   # ATTNSCOPE_MAX_TOKENS's ceiling
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
        vocab_size=setting(c, "vocab_size"), max_positions=positions, d_model=d, n_heads=heads,
        n_layers=setting(c, "num_hidden_layers"), d_ff=setting(c, "intermediate_size"), norm_first=True, causal=True,
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
            names |= weight_and_bias(f"blocks.{i}.{ours}", f"{m}layers.{i}.{theirs}")
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
    d, heads, L = setting(c, "hidden_size"), setting(c, "num_attention_heads"), setting(c, "num_hidden_layers")
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
        rope = rope_of({k: c[k] for k in ("max_position_embeddings", "original_max_position_embeddings") if k in c}
                     | {"model_type": c["model_type"], "rope_parameters": full}, c.get("head_dim") or d // heads)
        local_theta = float(ropes["sliding_attention"].get("rope_theta", 10000.0))
    else:
        rope, local_theta = Rope(plain_theta(c), None, 0, None, ""), 0.0
    theta = rope.theta
    tie = c.get("tie_word_embeddings", True)
    max_tokens = min(setting(c, "max_position_embeddings"), MAX_TOKENS, rope.limit or MAX_TOKENS)
    cfg = TransformerConfig(
        vocab_size=setting(c, "vocab_size"), max_positions=max_tokens, d_model=d, n_heads=heads, n_layers=L,
        d_ff=setting(c, "intermediate_size"), norm_first=True, causal=True, final_norm=True,
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
                names |= weight_and_bias(p + ours, h + theirs)
        names |= {p + ours + ".weight": one(h + theirs + ".weight") for ours, theirs in GEMMA_BLOCK.items()}
        names |= {f"{p}attn.{n}_norm.weight": one(f"{h}self_attn.{n}_norm.weight") for n in "qk"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("lm_head.weight",))
    return names


def _gpt_neox_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if not c.get("attention_bias", True):
        raise ModelUnavailable("GPT-NeoX without attention biases (attention_bias false; its MLP keeps them) is not "
                               "supported")
    d, heads = width(c, "hidden_size", "num_attention_heads")
    rope = c.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", c.get("rotary_pct", 0.25))      # transformers' default, 0.25
    rotary_dim = int(d // heads * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ModelUnavailable(f"partial_rotary_factor {factor} turns {rotary_dim} of each head's {d // heads} "
                               f"features; supported: an even number, at least 2")
    theta = plain_theta({**c, "rope_theta": c.get("rotary_emb_base", c.get("rope_theta"))})   # 4.x: rotary_emb_base
    tie = c.get("tie_word_embeddings", False)
    positions = setting(c, "max_position_embeddings")
    cfg = TransformerConfig(
        vocab_size=setting(c, "vocab_size"), max_positions=positions, d_model=d, n_heads=heads,
        n_layers=setting(c, "num_hidden_layers"), d_ff=setting(c, "intermediate_size"), norm_first=True, causal=True,
        final_norm=True, layer_norm_eps=float(c.get("layer_norm_eps", 1e-5)), mlp=activation(c, "hidden_act", "gelu"),
        position="rope", attention="gqa", rope_theta=theta, rotary_dim=rotary_dim,
        parallel_residual=bool(c.get("use_parallel_residual", True)), lm_head=tie or "embed_out.weight" in tensors,
        tie_embeddings=tie)
    return cfg, min(positions, MAX_TOKENS), []


GPT_NEOX_BLOCK = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm", "attn.o_proj": "attention.dense",
                  "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h"}


def _gpt_neox_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """query_key_value [3 D, D] holds, head by head, that head's q, k and v rows: split into q_proj, k_proj, v_proj."""
    names = {"wte": Source((m + "embed_in.weight",))} | weight_and_bias("ln_f", m + "final_layer_norm")
    for i in range(cfg.n_layers):
        h, p = f"{m}layers.{i}.", f"blocks.{i}."
        for ours, theirs in GPT_NEOX_BLOCK.items():
            names |= weight_and_bias(p + ours, h + theirs)
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



_LLAMA = dict(embedding="embed_tokens.weight", config=_llama_config, names=_llama_names)
DECODERS = {
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
