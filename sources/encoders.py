"""The encoder families' entries (sources/families.py): BERT and RoBERTa.

  BERT      post-norm encoder; separate query/key/value stacked into one in_proj (PyTorch's layout)
  RoBERTa   BERT, but position ids start after the padding index (padding_idx + 1 + position): the
            position table's first padding_idx + 1 rows are never read, so they are dropped here
"""
from __future__ import annotations

from ..model.transformer import TransformerConfig
from .mapping import Architecture, Source, activation, setting, weight_and_bias, width
from .spec import MAX_TOKENS, ModelUnavailable

def _bert_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ModelUnavailable(f"position_embedding_type {c['position_embedding_type']!r} is not supported "
                               f"(only 'absolute', learned positions)")
    if c.get("is_decoder") or c.get("add_cross_attention"):
        raise ModelUnavailable("a BERT-style model configured as a decoder (is_decoder / add_cross_attention) is "
                               "not supported; encoders only")
    offset = setting(c, "pad_token_id", 1) + 1 if c["model_type"] == "roberta" else 0
    positions = setting(c, "max_position_embeddings") - offset
    d, heads = width(c, "hidden_size", "num_attention_heads")
    cfg = TransformerConfig(
        vocab_size=setting(c, "vocab_size"), max_positions=positions, d_model=d, n_heads=heads,
        n_layers=setting(c, "num_hidden_layers"),
        d_ff=setting(c, "intermediate_size"), type_vocab_size=c.get("type_vocab_size", 2), embed_norm=True,
        layer_norm_eps=c.get("layer_norm_eps", 1e-12), mlp=activation(c, "hidden_act", "gelu"))
    return cfg, min(positions, MAX_TOKENS), []


def _bert_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """BERT and RoBERTa; m is the prefix ("bert.", "roberta." or none)."""
    e = m + "embeddings."
    offset = c.get("pad_token_id", 1) + 1 if c["model_type"] == "roberta" else 0
    names = {"wte": Source((e + "word_embeddings.weight",)),
             "wpe": Source((e + "position_embeddings.weight",), skip_rows=offset),
             "wtt": Source((e + "token_type_embeddings.weight",))} | weight_and_bias("ln_embed", e + "LayerNorm")
    for i in range(cfg.n_layers):
        h, p = f"{m}encoder.layer.{i}.", f"blocks.{i}."
        qkv = [f"{h}attention.self.{n}" for n in ("query", "key", "value")]
        names[p + "attn.in_proj_weight"] = Source(tuple(n + ".weight" for n in qkv))
        names[p + "attn.in_proj_bias"] = Source(tuple(n + ".bias" for n in qkv))
        for ours, theirs in (("attn.out_proj", "attention.output.dense"), ("ln1", "attention.output.LayerNorm"),
                             ("mlp.fc", "intermediate.dense"), ("mlp.proj", "output.dense"),
                             ("ln2", "output.LayerNorm")):
            names |= weight_and_bias(p + ours, h + theirs)
    return names


ENCODERS = {
    "bert": Architecture("BERT", "embeddings.word_embeddings.weight", _bert_config, _bert_names),
    "roberta": Architecture("RoBERTa", "embeddings.word_embeddings.weight", _bert_config, _bert_names),
}
