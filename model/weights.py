"""Weights in and out: our own flat state dict and .npz files. Hugging Face checkpoints (safetensors,
names per architecture) have a module of their own, checkpoints.py, and GGUF files theirs, gguf.py.

Our flat names follow PyTorch conventions ("blocks.0.attn.in_proj_weight", linear weights [out, in];
Llama-family attention keeps transformers' "blocks.0.attn.q_proj.weight"), so a state dict moves
between this package, PyTorch and NumPy files without renaming.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .transformer import Linear, Transformer


def _params(prefix: str, module) -> dict[str, np.ndarray]:
    """weight (and bias, where the module has one) of a norm or Linear."""
    bias = getattr(module, "bias", None)
    return {prefix + ".weight": module.weight} | ({} if bias is None else {prefix + ".bias": bias})


def state_dict(model: Transformer) -> dict[str, np.ndarray]:
    """Every parameter of the model under a flat, PyTorch-style name (an encoder-decoder names its own)."""
    if hasattr(model, "state_dict"):          # model/encdec.EncoderDecoder
        return model.state_dict()
    sd = {"wte": model.wte}
    for name in ("wpe", "wtt"):
        if getattr(model, name) is not None:
            sd[name] = getattr(model, name)
    if model.ln_embed is not None:
        sd |= _params("ln_embed", model.ln_embed)
    for i, b in enumerate(model.blocks):
        p = f"blocks.{i}."
        sd |= {p + "attn." + k: v for k, v in b.attn.params.items()}
        for name in ("ln1", "ln2", "post_attn_norm", "post_mlp_norm"):   # output norms: OLMo 2's, Gemma's
            if getattr(b, name, None) is not None:                      # (OLMo 2's block has no ln1, ln2)
                sd |= _params(p + name, getattr(b, name))
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
