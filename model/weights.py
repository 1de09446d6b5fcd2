"""Weights in and out: Hugging Face BERT safetensors, our own flat state dict, and .npz files
(GGUF files have a module of their own, gguf.py).

Our flat names follow PyTorch conventions ("blocks.0.attn.in_proj_weight", linear weights [out, in];
Llama-family attention keeps transformers' "blocks.0.attn.q_proj.weight"), so a state dict moves
between this package, PyTorch and NumPy files without renaming.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .transformer import Linear, Transformer, TransformerConfig


def _params(prefix: str, module) -> dict[str, np.ndarray]:
    """weight (and bias, where the module has one) of a norm or Linear."""
    bias = getattr(module, "bias", None)
    return {prefix + ".weight": module.weight} | ({} if bias is None else {prefix + ".bias": bias})


def state_dict(model: Transformer) -> dict[str, np.ndarray]:
    """Every parameter of the model under a flat, PyTorch-style name."""
    sd = {"wte": model.wte}
    for name in ("wpe", "wtt"):
        if getattr(model, name) is not None:
            sd[name] = getattr(model, name)
    if model.ln_embed is not None:
        sd |= _params("ln_embed", model.ln_embed)
    for i, b in enumerate(model.blocks):
        p = f"blocks.{i}."
        sd |= {p + "attn." + k: v for k, v in b.attn.params.items()}
        sd |= _params(p + "ln1", b.ln1) | _params(p + "ln2", b.ln2)
        for name, linear in vars(b.mlp).items():          # fc, proj (GELU) or gate, up, down (SwiGLU)
            if isinstance(linear, Linear):
                sd |= _params(p + "mlp." + name, linear)
    for name in ("ln_f", "lm_head"):
        if getattr(model, name) is not None:
            sd |= _params(name, getattr(model, name))
    return sd


def load_state_dict(model: Transformer, sd: dict[str, np.ndarray]) -> Transformer:
    """Copy a flat state dict (as from `state_dict`) into the model, checking every name and shape."""
    expected = state_dict(model)
    missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
    if missing or unexpected:
        raise KeyError(f"state dict does not fit this model: missing {missing[:8]}, unexpected {unexpected[:8]}")
    for name, ref in expected.items():
        value = np.asarray(sd[name], np.float32)
        if value.shape != ref.shape:
            raise ValueError(f"{name} has shape {value.shape}; the model needs {ref.shape}")
        _assign(model, name, value)
    return model


def _assign(model: Transformer, name: str, value: np.ndarray) -> None:
    parts = name.split(".")
    if parts[0] == "blocks":
        block = model.blocks[int(parts[1])]
        if parts[2] == "attn":
            block.attn.params[".".join(parts[3:])] = value
            return
        obj = block
        for p in parts[2:-1]:
            obj = getattr(obj, p)
        setattr(obj, parts[-1], value)
    elif len(parts) == 1:
        setattr(model, name, value)
    else:
        setattr(getattr(model, parts[0]), parts[1], value)


def save_npz(model: Transformer, path: str | Path) -> None:
    np.savez(path, **state_dict(model))


def load_npz(model: Transformer, path: str | Path) -> Transformer:
    with np.load(path) as f:
        return load_state_dict(model, dict(f))


def bert_config(config_json: dict) -> TransformerConfig:
    """Our config from a Hugging Face BertConfig dict (post-norm encoder, exact GELU)."""
    if config_json.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"only the exact GELU is supported; this model uses {config_json['hidden_act']!r}")
    return TransformerConfig(
        vocab_size=config_json["vocab_size"], max_positions=config_json["max_position_embeddings"],
        d_model=config_json["hidden_size"], n_heads=config_json["num_attention_heads"],
        n_layers=config_json["num_hidden_layers"], d_ff=config_json["intermediate_size"],
        type_vocab_size=config_json.get("type_vocab_size", 2), embed_norm=True,
        layer_norm_eps=config_json.get("layer_norm_eps", 1e-12))


def bert_to_state_dict(hf: dict[str, np.ndarray], n_layers: int) -> dict[str, np.ndarray]:
    """Rename Hugging Face BertModel tensors (with or without the "bert." prefix) to ours.

    BERT keeps separate query/key/value projections; PyTorch's MultiheadAttention (and ours) stacks
    them into one in_proj_weight [3E, E] in q, k, v order.
    """
    hf = {k.removeprefix("bert."): v for k, v in hf.items()}
    e = "embeddings."
    sd = {"wte": hf[e + "word_embeddings.weight"], "wpe": hf[e + "position_embeddings.weight"],
          "wtt": hf[e + "token_type_embeddings.weight"],
          "ln_embed.weight": hf[e + "LayerNorm.weight"], "ln_embed.bias": hf[e + "LayerNorm.bias"]}
    for i in range(n_layers):
        h, p = f"encoder.layer.{i}.", f"blocks.{i}."
        att = h + "attention.self."
        sd[p + "attn.in_proj_weight"] = np.concatenate([hf[att + n + ".weight"] for n in ("query", "key", "value")])
        sd[p + "attn.in_proj_bias"] = np.concatenate([hf[att + n + ".bias"] for n in ("query", "key", "value")])
        for ours, theirs in (("attn.out_proj", "attention.output.dense"), ("ln1", "attention.output.LayerNorm"),
                             ("mlp.fc", "intermediate.dense"), ("mlp.proj", "output.dense"),
                             ("ln2", "output.LayerNorm")):
            sd[p + ours + ".weight"], sd[p + ours + ".bias"] = hf[h + theirs + ".weight"], hf[h + theirs + ".bias"]
    return sd


def load_bert(model_dir: str | Path) -> Transformer:
    """A BERT encoder from a Hugging Face folder holding config.json and model.safetensors."""
    from safetensors.numpy import load_file

    model_dir = Path(model_dir)
    for f in ("config.json", "model.safetensors"):
        if not (model_dir / f).is_file():
            raise FileNotFoundError(f"{model_dir / f} is missing: the model folder must hold config.json and "
                                    f"model.safetensors (reinstall the model package)")
    cfg = bert_config(json.loads((model_dir / "config.json").read_text()))
    model = Transformer(cfg)
    return load_state_dict(model, bert_to_state_dict(load_file(model_dir / "model.safetensors"), cfg.n_layers))
