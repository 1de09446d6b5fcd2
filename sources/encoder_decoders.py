"""The encoder-decoder families' entries (sources/families.py): two stacks and cross-attention (model/encdec.py,
EncoderDecoderConfig).

  T5, BART, Marian   T5 pre-norm RMS with bucketed
            relative positions, unscaled scores, relu or gated FF, the tied LM head at d_model**-0.5 (none when
            config.json has tie_word_embeddings false or the file has its own lm_head); BART post-norm with learned
            positions at offset 2 and layernorm_embedding; Marian sinusoidal; both final_logits_bias. One vocabulary
            and one width for both stacks (anything else is refused)
"""
from __future__ import annotations

import math

from .mapping import Architecture, Source, setting, weight_and_bias, width
from .spec import MAX_TOKENS, ModelUnavailable

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
    d = setting(c, "d_model")
    # transformers' T5Config: the decoder's output is scaled by d_model**-0.5 unless tie_word_embeddings is false
    scale = c.get("scale_decoder_outputs", c.get("tie_word_embeddings") is not False)
    cfg = EncoderDecoderConfig(
        vocab_size=setting(c, "vocab_size"), d_model=d, n_heads=setting(c, "num_heads"),
        n_layers=setting(c, "num_layers"),
        n_decoder_layers=c.get("num_decoder_layers") or c["num_layers"], d_ff=setting(c, "d_ff"),
        max_positions=T5_MAX_TOKENS, d_head=setting(c, "d_kv"), norm="rms", norm_first=True, position="relative",
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
        names |= weight_and_bias(f"{stack[:3]}_ln_f", h + "final_layer_norm")
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
                        names |= weight_and_bias(f"{p}{ours}.{n}_proj", f"{b}{theirs}.{n}")
                else:
                    names |= weight_and_bias(p + ours, b + theirs)
    names["lm_head"] = Source(("lm_head.weight",))
    return names


def _bart_config(c: dict, tensors: set):
    """BART and Marian: one shape, told apart by their positions and embedding norm."""
    from ..model.encdec import EncoderDecoderConfig
    family = c["model_type"]
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if setting(c, a) != setting(c, b):
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
    d, heads = width(c, "d_model", "encoder_attention_heads")
    positions = setting(c, "max_position_embeddings")
    cfg = EncoderDecoderConfig(
        vocab_size=setting(c, "vocab_size"), d_model=d, n_heads=heads, n_layers=setting(c, "encoder_layers"),
        n_decoder_layers=setting(c, "decoder_layers"), d_ff=setting(c, "encoder_ffn_dim"), max_positions=positions,
        position="learned" if family == "bart" else "sinusoidal", position_offset=2 if family == "bart" else 0,
        embed_scale=math.sqrt(d) if c.get("scale_embedding") else 1.0, embed_norm=family == "bart",
        activation=T5_ACT[act], tie_embeddings="lm_head.weight" not in tensors, logits_bias=True,
        decoder_start_token_id=int(setting(c, "decoder_start_token_id")))
    return cfg, min(positions, MAX_TOKENS), []


BART_BLOCK = {"ln_self": "self_attn_layer_norm", "ln_cross": "encoder_attn_layer_norm", "ln_ff": "final_layer_norm",
              "ff.fc": "fc1", "ff.proj": "fc2"}


def _bart_names(cfg, c: dict, m: str) -> dict[str, Source]:
    names = {"shared": Source((m + "shared.weight",)), "lm_head": Source(("lm_head.weight",)),
             "logits_bias": Source(("final_logits_bias",))}
    for stack, blocks in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        h = f"{m}{stack}."
        names[f"{stack[:3]}_wpe"] = Source((h + "embed_positions.weight",))
        names |= weight_and_bias(f"{stack[:3]}_ln_embed", h + "layernorm_embedding")
        for i in range(blocks):
            b, p = f"{h}layers.{i}.", f"{stack}.{i}."
            for ours, theirs in (("self_attn", "self_attn"), ("cross_attn", "encoder_attn")):
                for n in "qkvo":
                    names |= weight_and_bias(f"{p}{ours}.{n}_proj", f"{b}{theirs}.{'out' if n == 'o' else n}_proj")
            for ours, theirs in BART_BLOCK.items():
                names |= weight_and_bias(p + ours, b + theirs)
    return names


ENCODER_DECODERS = {
    "t5": Architecture("T5", "shared.weight", _t5_config, _t5_names),
    "bart": Architecture("BART", "shared.weight", _bart_config, _bart_names),
    "marian": Architecture("Marian", "shared.weight", _bart_config, _bart_names),
}
