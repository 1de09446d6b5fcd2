"""GGUF's block formats as MatMulNBits blocks (model/quantized.Blocks): W = scale * (code - zero point) + offset per
sub-block, exactly as gguf.quants.dequantize computes it.

Every format here is affine in its codes within a sub-block, with a float32 scale and offset that gguf computes
exactly (a float16 times a small integer):
  Q4_0  d * (q - 8)                      4-bit codes, block 32, zero point 8
  Q4_1  d * q + m                        4-bit codes, block 32, offset m
  Q5_0  d * (q - 16)                     5-bit codes held as 8-bit, block 32, zero point 16
  Q5_1  d * q + m                        8-bit codes (5 used), block 32, offset m
  Q8_0  d * q, q int8                    8-bit codes q + 128, block 32, zero point 128
  Q2_K  d*sc * q - dmin*m                2-bit codes, block 16 (the super-block's sub-blocks), offset -dmin*m
  Q3_K  d*(sc - 32) * (q - 4)            4-bit codes (3 used), block 16, zero point 4
  Q4_K  d*sc * q - dmin*m                4-bit codes, block 32, offset -dmin*m
  Q5_K  d*sc * q - dmin*m                8-bit codes (5 used), block 32, offset -dmin*m
  Q6_K  d*sc * (q - 32)                  8-bit codes (6 used), block 16, zero point 32
The codes, scales and offsets are read by gguf's own de-quantiser on patched copies of the blocks (`_probe`), not by a
second implementation of each bit layout: with the scale fields set to 1 and the mins to 0 it returns code - zero
point; with every code set to zero point + 1 and the mins to 0, the scale; with every code at the zero point, the
offset. Each is exact (small integers, or one float32 product), so scale * (code - zero point) + offset is gguf's value
bit for bit (tests/test_gguf_blocks.py checks every format on random blocks). Another format (IQ*, TQ*) is not
expressible this way: `to_blocks` returns None and the caller de-quantises that tensor alone.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..model.precision import COMPUTE
from ..model.quantized import FACTORS, Blocks, multiplied, pack

ONE, ZERO = np.float16(1).tobytes(), b"\0\0"   # a float16 1 and 0, little-endian


class Format(NamedTuple):
    bits: int                # the MatMulNBits code width the format's codes fit
    block: int               # values per scale (a sub-block for the K-quants)
    zero: int                # the zero point
    offsets: bool            # whether it has a per-block offset (a min)
    unit: dict               # byte range -> bytes: scale 1, min 0 (the probe for codes)
    step: dict               # every code at zero point + 1, mins 0 (the probe for scales)
    base: dict               # every code at the zero point (the probe for offsets)
    d: int | None            # a K-quant's super-block: the byte where its float16 scale d is (and its min dmin)
    dmin: int | None


def _f(bits, block, zero, offsets, unit, step, base=None, d=None, dmin=None):
    return Format(bits, block, zero, offsets, unit, step, base or {}, d, dmin)


FORMATS = {   # byte ranges within one block of the format (gguf.GGML_QUANT_SIZES), gguf's layouts
    "Q4_0": _f(4, 32, 8, False, {(0, 2): ONE}, {(2, 18): b"\x99"}),
    "Q4_1": _f(4, 32, 0, True, {(0, 2): ONE, (2, 4): ZERO}, {(2, 4): ZERO, (4, 20): b"\x11"}, {(4, 20): b"\0"}),
    "Q5_0": _f(8, 32, 16, False, {(0, 2): ONE}, {(2, 6): b"\xff", (6, 22): b"\x11"}),
    "Q5_1": _f(8, 32, 0, True, {(0, 2): ONE, (2, 4): ZERO}, {(2, 4): ZERO, (4, 8): b"\0", (8, 24): b"\x11"},
               {(4, 8): b"\0", (8, 24): b"\0"}),
    "Q8_0": _f(8, 32, 128, False, {(0, 2): ONE}, {(2, 34): b"\x01"}),
    "Q2_K": _f(2, 16, 0, True, {(0, 16): b"\x01", (80, 82): ONE, (82, 84): ZERO},
               {(16, 80): b"\x55", (82, 84): ZERO}, {(16, 80): b"\0"}, d=80, dmin=82),
    "Q3_K": _f(4, 16, 4, False, {(96, 104): b"\x11", (104, 108): b"\xaa", (108, 110): ONE},
               {(0, 32): b"\xff", (32, 96): b"\x55"}, d=108),
    "Q4_K": _f(4, 32, 0, True, {(0, 2): ONE, (2, 4): ZERO, (4, 8): b"\x01", (8, 12): b"\0", (12, 16): b"\x01"},
               {(2, 4): ZERO, (16, 144): b"\x11"}, {(16, 144): b"\0"}, d=0, dmin=2),
    "Q5_K": _f(8, 32, 0, True, {(0, 2): ONE, (2, 4): ZERO, (4, 8): b"\x01", (8, 12): b"\0", (12, 16): b"\x01"},
               {(2, 4): ZERO, (16, 48): b"\0", (48, 176): b"\x11"}, {(16, 48): b"\0", (48, 176): b"\0"},
               d=0, dmin=2),
    "Q6_K": _f(8, 16, 32, False, {(192, 208): b"\x01", (208, 210): ONE}, {(0, 128): b"\x11", (128, 192): b"\xaa"},
               d=208),
}
CHUNK = 1 << 22   # values de-quantised per probe at a time (16 MB of float32): memory stays flat for any tensor


def expressible(kind) -> bool:
    """Whether a ggml type's blocks become Blocks (FORMATS), else it is de-quantised."""
    return getattr(kind, "name", str(kind)) in FORMATS


def _probe(blocks: np.ndarray, patch: dict, kind) -> np.ndarray:
    """gguf's de-quantisation of a copy of `blocks` [rows, n_blocks, type_size] with the byte ranges of every block
    set as `patch` says -> float32 [rows, n_blocks * block_size]."""
    import gguf

    b = blocks.copy()
    for (lo, hi), value in patch.items():
        b[..., lo:hi] = np.frombuffer(value * ((hi - lo) // len(value)), np.uint8)
    return np.asarray(gguf.quants.dequantize(b.reshape(b.shape[0], -1), kind), COMPUTE)


def to_blocks(data: np.ndarray, kind) -> Blocks | None:
    """A GGUF tensor's bytes (GGUFFile's view: [N, row bytes]) as Blocks with N rows, or None for a format they
    cannot express. Rows are read CHUNK values at a time. A K-quant's scales (and offsets) are kept factored
    (model/quantized.py: a float32 per super-block, its float16 d or -dmin, times an int8 per sub-block) where every
    block's factors give gguf's values bit for bit (`_factored`, `_centred`), else as a float32 per sub-block."""
    import gguf

    fmt = FORMATS.get(kind.name)
    if fmt is None:
        return None
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    data = np.asarray(data).reshape(data.shape[0], -1, type_size)
    N, n_gguf = data.shape[:2]
    K = n_gguf * block_size
    nb = K // fmt.block
    codes = np.empty((N, nb, fmt.block * fmt.bits // 8), np.uint8)
    scales = np.empty((N, nb), COMPUTE)
    offsets = np.empty((N, nb), COMPUTE) if fmt.offsets else None
    zero = np.full((N, nb), fmt.zero, np.uint8)
    factors = None if fmt.d is None else {      # a float32 per super-block (gguf's block), an int8 per sub-block
        name: np.empty((N, n_gguf), COMPUTE) if name.startswith("super") else np.empty((N, nb), np.int8)
        for name in FACTORS[:4 if fmt.offsets else 2]}
    step = max(1, CHUNK // K)
    for r in range(0, N, step):
        part, rows = np.ascontiguousarray(data[r:r + step]), slice(r, r + step)
        q = (_probe(part, fmt.unit, kind) + COMPUTE.type(fmt.zero)).reshape(len(part), nb, fmt.block)   # codes
        codes[rows] = pack(q.astype(np.uint8), fmt.bits)
        scales[rows] = _probe(part, fmt.step, kind)[:, ::fmt.block]
        if factors is not None:
            factors = _factored(factors, rows, "scales", scales[rows], _half(part, fmt.d), bits=True)
        if offsets is not None:
            o, raw = _probe(part, fmt.base, kind)[:, ::fmt.block], None
            if factors is not None:
                factors = _factored(factors, rows, "offsets", o, -_half(part, fmt.dmin), bits=False)
            if factors is not None:
                raw = multiplied(factors["super_offsets"][rows], factors["sub_offsets"][rows])
            zero[rows], offsets[rows], exact = _centred(q, scales[rows], o, fmt.bits, raw)
            if not exact:                    # the tensor keeps float32 offsets: these rows' own, as _centred says
                factors = None
                zero[rows], offsets[rows], _ = _centred(q, scales[rows], o, fmt.bits)
    if factors is not None:
        return Blocks(codes, None, pack(zero, fmt.bits), None, fmt.bits, fmt.block, factors)
    return Blocks(codes, scales, pack(zero, fmt.bits), offsets, fmt.bits, fmt.block)


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block [rows, n_blocks, type_size] -> float32 [rows, n_blocks]."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(COMPUTE)


def _factored(factors: dict, rows: slice, what: str, values: np.ndarray, sup: np.ndarray, bits: bool) -> dict | None:
    """Rows `rows` of a tensor's `what` (scales or offsets) [n, nb] as sup [n, S] times int8 sub-block integers, written
    into `factors`; None (the tensor keeps its float32 ones) where an integer is out of range or the product is not
    `values`: bit for bit for scales, in value for offsets (their zeros' signs are checked where they are used, as the
    de-quantised values, by `_centred`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        i = np.nan_to_num(np.rint(values / np.repeat(sup, values.shape[1] // sup.shape[1], axis=1)),
                          nan=0.0, posinf=0.0, neginf=0.0)
    if i.size and (i.min() < -128 or i.max() > 127):
        return None
    i = i.astype(np.int8)
    got = multiplied(sup, i)
    if not (np.array_equal(got.view(np.uint32), values.view(np.uint32)) if bits else np.array_equal(got, values)):
        return None
    factors[f"super_{what}"][rows], factors[f"sub_{what}"][rows] = sup, i
    return factors


def _centred(q: np.ndarray, s: np.ndarray, o: np.ndarray, bits: int,
             raw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """Codes q [n, nb, block] with zero point 0, scales s and offsets o [n, nb] -> a zero point z per block near -o / s
    and the offset o + s * z, so that s * (q - z) + (o + s * z) is each of gguf's values s * q + o bit for bit.
    Centred so, the product by the codes is about as large as the product by the weight: with z = 0 the two parts
    (codes, offsets) were each about twice the answer with opposite signs, and MatMulNBits' rounding error with them
    (SmolLM2's attention, NumPy against onnxruntime, 9.7e-6 -> ~5e-6, as float32 weights give). A block where moving
    the offset would not give gguf's bits keeps z = 0 (each product s * (q - z) is exact: a float16 scale, at most
    6 more bits from a K-quant's sub-block scale, times a code of at most 8 bits).
    raw: the offsets as their factors give them (model/quantized.Blocks.offsets: raw + s * z, z = 0 included), equal
    to o in value; returned last: whether every block gives gguf's bits so (without raw: True, a block that would not
    keeping o itself)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.clip(np.nan_to_num(np.rint(-o / s), nan=0.0, posinf=0.0, neginf=0.0), 0, 2 ** bits - 1).astype(COMPUTE)
    base = o if raw is None else raw
    gguf = s[..., None] * q + o[..., None]

    def exact(z):                # bit for bit: a zero's sign too
        centred = s[..., None] * (q - z[..., None]) + (base + s * z)[..., None]
        return (centred.view(np.uint32) == gguf.view(np.uint32)).all(-1)
    moved = exact(z)
    z = np.where(moved, z, 0).astype(COMPUTE)
    if raw is None:
        return z.astype(np.uint8), np.where(moved, o + s * z, o), True
    return z.astype(np.uint8), raw + s * z, bool((moved | exact(np.zeros_like(z))).all())
