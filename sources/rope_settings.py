"""config.json's RoPE settings -> `Rope` (theta, the scaling of model/rope.py, the features it turns, the longest
input one table serves exactly), for the families that turn their queries and keys (sources/decoders.py).

RoPE scaling (the Llama family and Phi-3; model/rope.py): llama3 (Llama 3.x), linear, yarn, longrope and dynamic
from rope_parameters / rope_scaling, into the one table of each model; dynamic is plain RoPE up to
max_position_embeddings, where its positions end anyway. Positions go to max_position_embeddings within
MAX_POSITIONS (ATTNSCOPE_MAX_TOKENS's ceiling), inputs by default to MAX_TOKENS.
"""
from __future__ import annotations

from typing import NamedTuple

from ..model.rope import RopeScaling
from .mapping import setting
from .spec import ModelUnavailable

def rope_parameters(c: dict) -> dict:
    """config.json's RoPE settings as one dict, its kind under 'rope_type': `rope_parameters` (transformers 5) or
    `rope_scaling` (4.x, kind under 'type'), as transformers' standardize_rope_params merges them."""
    rope = dict(c.get("rope_scaling") or {}) | dict(c.get("rope_parameters") or {})
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope


def plain_theta(c: dict) -> float:
    """RoPE's base from `rope_parameters` (transformers 5) or `rope_theta` / `rope_scaling` (4.x), for a family whose
    scaling is not wired (see rope_of for those that are)."""
    rope = rope_parameters(c)
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


def rope_of(c: dict, d_head: int) -> Rope:
    """RoPE as the Llama family and Phi-3 configure it: theta, the scaling (rope_type and its parameters, as
    transformers' ROPE_INIT_FUNCTIONS read them), and the features it turns (Phi-3's partial_rotary_factor)."""
    family, rope = c["model_type"], rope_parameters(c)
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
    positions = setting(c, "max_position_embeddings")
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
