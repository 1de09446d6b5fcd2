"""How a family maps a model folder to ours: the parts every family entry is made of (sources/families.py).

An entry (`Architecture`) is a config mapping (config.json -> TransformerConfig, the input cap, notes for a person)
and a name mapping (our tensor -> the model folder's `Source`: its tensors stacked along rows, transposed, offset, or
one `Split` part of a fused tensor). The config readers here say a missing or unsupported value in one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from ..model.transformer import TransformerConfig
from .spec import ModelUnavailable

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


def setting(c: dict, key: str, default=None):
    """A config value; a required one (no default) missing is the config's fault, said in one line."""
    value = c.get(key, default)
    if value is None:
        raise ModelUnavailable(f"config.json has no {key!r}, which its model_type {c.get('model_type')!r} needs")
    return value


def width(c: dict, d_key: str, h_key: str) -> tuple[int, int]:
    """d_model and heads of a family whose heads split d_model evenly (BERT, RoBERTa, GPT-2)."""
    d, heads = setting(c, d_key), setting(c, h_key)
    if d % heads:
        raise ModelUnavailable(f"config.json's {d_key} {d} is not divisible by {h_key} {heads}")
    return d, heads


def activation(c: dict, key: str, default: str) -> str:
    act = c.get(key, default)
    if act not in GELU:
        raise ModelUnavailable(f"config.json's {key} is {act!r}; supported: {', '.join(GELU)}")
    return GELU[act]


def weight_and_bias(ours: str, theirs: str, transpose: bool = False) -> dict[str, Source]:
    """A norm's or linear layer's weight and bias (the bias only where our model has one: see convert)."""
    return {ours + ".weight": Source((theirs + ".weight",), transpose), ours + ".bias": Source((theirs + ".bias",))}
