"""RoPE scaling: how a rotary model turns its feature pairs when it reads past the length it was trained on.

Plain RoPE (functional.rope_tables) turns pair i of position p by the angle p * inv_freq_i, inv_freq_i = 1 / base_i
with base_i = theta^(2i/d). A scaled model changes inv_freq (and may multiply cos and sin by an attention factor),
once, for every position; the tables stay [positions, d]. The kinds transformers knows (modeling_rope_utils.py's
ROPE_INIT_FUNCTIONS), each computed here in float32 in transformers' order, so the tables agree to the last bit:

  linear    position interpolation (Chen et al. 2023): every inv_freq / factor
  llama3    Llama 3.1's: pairs whose wavelength 2 pi / inv_freq is above original / low_freq_factor turn factor
            times slower, those below original / high_freq_factor as before, a smooth mix in between
  yarn      YaRN (Peng et al. 2023), "NTK-by-parts": a linear ramp over the pairs between plain RoPE (fast pairs,
            more than beta_fast turns in the original length) and interpolation by factor (slow pairs, fewer than
            beta_slow turns); cos and sin are multiplied by the attention factor 0.1 ln(factor) + 1 (its
            "temperature" sqrt(1/t), which scales every score by its square)
  longrope  LongRoPE (Ding et al. 2024), Phi-3's: inv_freq_i / ext_i, one searched factor per pair, the short
            ones up to the original length and the long ones past it; cos and sin times
            sqrt(1 + ln(factor) / ln(original))
  dynamic   dynamic NTK: plain RoPE up to max_position_embeddings; past it transformers raises theta with the
            input's length (every position's angle then depends on how long the input is)

Two of them depend on the input's length, which one table cannot: longrope switches every position to its long
factors once the input passes the original length, and dynamic changes theta past max_position_embeddings. A table
is exact below that length (the short factors; plain RoPE), and `limit` says where it ends: the model's positions
stop there (sources/decoders.py caps them and says so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .precision import COMPUTE
f32 = COMPUTE.type


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling from config.json's rope_parameters (transformers 5) or rope_scaling (4.x), in our names."""
    kind: Literal["linear", "llama3", "yarn", "longrope", "dynamic"]
    factor: float = 1.0                    # how many times longer than the original length (linear, llama3, yarn,
    #                                        dynamic; longrope: for its attention factor only)
    original_max_positions: int = 0       # the length it was pretrained on (llama3, yarn, longrope; dynamic:
    #                                        max_position_embeddings, where it starts to change theta)
    low_freq_factor: float = 1.0           # llama3: wavelengths above original / low_freq_factor are scaled fully
    high_freq_factor: float = 4.0          # llama3: wavelengths below original / high_freq_factor are kept
    beta_fast: float = 32.0                # yarn: pairs turning more than this often in the original length: kept
    beta_slow: float = 1.0                 # yarn: pairs turning less often than this: interpolated
    truncate: bool = True                  # yarn: the ramp's ends rounded outwards to whole pairs
    mscale: float = 0.0                    # yarn (DeepSeek): attention factor mscale(factor, mscale) / mscale(
    mscale_all_dim: float = 0.0            #   factor, mscale_all_dim) when both are set
    attention_factor: float | None = None  # yarn, longrope: cos and sin are multiplied by it; None: from factor
    short_factor: tuple[float, ...] = ()   # longrope: one per pair, inputs up to original_max_positions
    long_factor: tuple[float, ...] = ()    # longrope: one per pair, longer inputs (not served: see `limit`)

    def __post_init__(self):
        for name in ("short_factor", "long_factor"):       # lists from JSON -> tuples (the config is hashed)
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))

    @property
    def limit(self) -> int | None:
        """The most positions one table serves exactly (None: any number)."""
        return self.original_max_positions if self.kind in ("longrope", "dynamic") else None

    def inverse_frequencies(self, base: np.ndarray, theta: float, n_positions: int) -> tuple[np.ndarray, float]:
        """inv_freq [d/2] float32 and the attention factor, from base = theta^(2i/d) [d/2] float32."""
        if self.limit is not None and n_positions > self.limit:
            raise ValueError(f"RoPE scaling {self.kind!r} changes with the input's length past "
                             f"{self.limit} positions; tables for {n_positions} positions would not be exact")
        return KINDS[self.kind](self, base, theta)


def reciprocal(x: np.ndarray) -> np.ndarray:
    """1 / x in float32. transformers writes a number over a tensor (2 pi / inv_freq), which torch computes as the
    tensor's reciprocal times the number: two roundings, reproduced here as such."""
    return f32(1.0) / x


def position_interpolation(s: RopeScaling, base: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    """linear: positions squeezed by factor, i.e. every inv_freq / factor."""
    return (f32(1.0) / base) / f32(s.factor), 1.0


def llama3(s: RopeScaling, base: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    """Llama 3.1: wavelength 2 pi / inv_freq long (> original / low_freq_factor): inv_freq / factor; short (<
    original / high_freq_factor): kept; between: (1 - smooth) inv_freq / factor + smooth inv_freq, smooth =
    (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)."""
    inv_freq = f32(1.0) / base
    original, low, high = s.original_max_positions, s.low_freq_factor, s.high_freq_factor
    low_freq_wavelen, high_freq_wavelen = f32(original / low), f32(original / high)
    wavelen = reciprocal(inv_freq) * f32(2 * math.pi)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / f32(s.factor), inv_freq)
    smooth = (reciprocal(wavelen) * f32(original) - f32(low)) / f32(high - low)
    smoothed = (f32(1.0) - smooth) * scaled / f32(s.factor) + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(f32), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor for a context `scale` times longer: 0.1 mscale ln(scale) + 1 (1 when not longer)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn(s: RopeScaling, base: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    """YaRN: pair i keeps plain RoPE (extrapolation) or is interpolated by factor, mixed by a linear ramp over the
    pairs between those that turn beta_fast and beta_slow times in the original length."""
    d, factor = 2 * len(base), s.factor
    if s.attention_factor is not None:
        attention_factor = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        attention_factor = float(yarn_mscale(factor, s.mscale) / yarn_mscale(factor, s.mscale_all_dim))
    else:
        attention_factor = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:     # the pair that turns `rotations` times in the original length
        return (d * math.log(s.original_max_positions / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001                                   # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(d // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
    extrapolation = f32(1.0) - ramp                     # 1: plain RoPE, 0: interpolated
    inv_extrapolation, inv_interpolation = reciprocal(base), reciprocal(f32(factor) * base)
    inv_freq = inv_interpolation * (f32(1.0) - extrapolation) + inv_extrapolation * extrapolation
    return inv_freq.astype(f32), attention_factor


def longrope(s: RopeScaling, base: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    """LongRoPE's short factors (the table serves inputs up to the original length): inv_freq_i = 1 / (ext_i base_i);
    attention factor sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1), unless the config gives one."""
    ext = np.asarray(s.short_factor, f32)
    if ext.shape != base.shape:
        raise ValueError(f"longrope short_factor has {len(ext)} entries; the rotary dimensions need {len(base)}")
    attention_factor = s.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if s.factor <= 1.0 else \
            math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_positions))
    return reciprocal(ext * base), attention_factor


def dynamic_ntk(s: RopeScaling, base: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    """Dynamic NTK up to max_position_embeddings: theta unchanged, plain RoPE."""
    return f32(1.0) / base, 1.0


KINDS = {"linear": position_interpolation, "llama3": llama3, "yarn": yarn, "longrope": longrope,
         "dynamic": dynamic_ntk}
