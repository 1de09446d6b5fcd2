"""Weights in and out: our own flat state dict and .npz files. Hugging Face checkpoints (safetensors,
names per architecture) have a module of their own, checkpoints.py, and GGUF files theirs, gguf.py.

Our flat names follow PyTorch conventions ("blocks.0.attn.in_proj_weight", linear weights [out, in];
Llama-family attention keeps transformers' "blocks.0.attn.q_proj.weight"), so a state dict moves
between this package, PyTorch and NumPy files without renaming.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .precision import compute_array, storage_name
from .quantized import Blocks, expand
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


ROPE = ("rope.cos", "rope.sin")                 # the RoPE tables a layer rotates by, in the layer graphs
ROPE_LOCAL = ("rope_local.cos", "rope_local.sin")   # a model's second pair (Gemma 3's local layers), in its stacked graph


def arrays(model) -> dict[str, np.ndarray]:
    """Every array a graph of this model reads, by the name of the graph input that reads it (graphs/builder.py): the
    weights, as state_dict names them, and the position tables computed from the config (RoPE's cos and sin; the
    local layers' own; Marian's sinusoids). runtime/tensors.Weights binds them by these names at every run."""
    out = expand(state_dict(model))            # a quantised weight: its parts, "<name>.codes" ... (model/quantized.py)
    if getattr(model, "sinusoids", None) is not None:          # model/encdec.py: Marian
        out["sinusoids"] = model.sinusoids
    for names, tables in ((ROPE, getattr(model, "rope", None)), (ROPE_LOCAL, getattr(model, "rope_local", None))):
        if tables is not None:
            out |= dict(zip(names, tables))
    for i in range(len(getattr(model, "blocks", ()))):
        r = value_r(model, i)
        if r is not None:
            out[f"blocks.{i}.attn.value_r"] = r
    return out


def value_r(model, layer: int) -> np.ndarray | None:
    """Block `layer`'s heads' R^T [H, dh, dh] (TransformerBlock._value_r): the value norms' factors a graph reads
    (graphs/steps.value_norms), made once at load: ||R v|| = ||W_h v||, a [dh, dh] product a key where W_h's is
    [dh, D] (and W_O kept in quantised blocks has no head's columns to read); None for a block without value norms."""
    block = model.blocks[layer]
    return block._value_r(model.cfg.d_head) if hasattr(block, "_value_r") else None


def block_arrays(model: Transformer, layer: int) -> dict[str, np.ndarray]:
    """Block `layer`'s arrays under the names of the layer graphs (graphs/layers.py), one graph for every layer:
    "block." + each weight's name within its block, and the RoPE tables this layer rotates by (Transformer.rope_for).
    Views of the model's arrays, no copies."""
    prefix = f"blocks.{layer}."
    out = {"block." + name[len(prefix):]: value for name, value in expand(state_dict(model)).items()
           if name.startswith(prefix)}
    r = value_r(model, layer)
    if r is not None:
        out["block.attn.value_r"] = r
    tables = model.rope_for(layer)
    return out if tables is None else out | dict(zip(ROPE, tables))


def block_layouts(model: Transformer) -> list[int]:
    """For each block, the first block whose arrays have the same layout: each weight's name, type and shape, and a
    quantised one's bits, block size, offsets and factored scales. A layer graph (graphs/layers.py) declares its
    inputs' shapes and a MatMulNBits' bits and block size from the block it is built from, so blocks of one layout
    share a graph and another layout needs its own (Gemma 3's Q4_K_M file holds some layers' mlp.down in Q4_K,
    others' in Q6_K)."""
    layouts, first = {}, []
    sd = state_dict(model)
    for i in range(len(getattr(model, "blocks", ()))):
        prefix = f"blocks.{i}."
        key = tuple((name[len(prefix):], str(w.dtype), tuple(w.shape))
                    + ((w.bits, w.block, w.has_offsets, w.factors is not None) if isinstance(w, Blocks) else ())
                    for name, w in sd.items() if name.startswith(prefix))
        first.append(layouts.setdefault(key, i))
    return first


def identities(named: dict[str, np.ndarray]) -> dict[int, str]:
    """id(array) -> name: how a graph builder names the input of each array it reads (graphs/builder.Graph)."""
    return {id(value): name for name, value in named.items()}


def stored(value) -> np.ndarray:
    """A weight as the model keeps it: the array itself (no copy: a view of its file stays one) when its type is a
    storage type (model/precision.py), else in the compute type. Quantised blocks stay blocks."""
    if isinstance(value, Blocks):
        return value
    value = np.asarray(value)
    try:
        storage_name(value.dtype)
        return value
    except ValueError:
        return compute_array(value)


def load_state_dict(model: Transformer, sd: dict[str, np.ndarray]) -> Transformer:
    """Put a flat state dict (as from `state_dict`) into the model, checking every name and shape. The arrays are
    kept as they are, in their stored type (views of a file stay views): the model widens each where it is used."""
    expected = state_dict(model)
    missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
    if missing or unexpected:
        raise KeyError(f"state dict does not fit this model: missing {missing[:8]}, unexpected {unexpected[:8]}")
    for name, ref in expected.items():
        value = stored(sd[name])
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
