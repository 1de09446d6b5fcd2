"""Quantised weights kept in their blocks: W [N, K] as integer codes with a float scale (and an integer zero point,
and optionally a float offset) per block of `block` consecutive values along K.

    W[n, k] = scales[n, b] * (code[n, k] - zero_point[n, b]) + offsets[n, b],   b = k // block

This is onnxruntime's com.microsoft.MatMulNBits layout (codes of 2, 4 or 8 bits packed low-first along K, one float
scale and one packed integer zero point per block), plus the offsets that formats with a per-block minimum need (GGUF's
Q4_1, Q5_1 and the K-quants' mins): a graph multiplies by the codes with MatMulNBits and adds the offsets' share as a
small product of block sums (graphs/builder.Graph.linear). sources/gguf_blocks.py makes them from GGUF blocks.

Factored scales (GGUF's K-quants): a super-block of 256 values holds one float16 scale d (and min dmin) and a small
integer per sub-block, and each sub-block's scale is their product, exact in float32. Kept so, as a float32 per
super-block and an int8 per sub-block, instead of a float32 per sub-block (and the offsets likewise, the centred zero
points' share added back: offsets = super_offsets * sub_offsets + scales * zero_points), they take 0.09 bytes a weight
instead of 0.25 for Q4_K: an 8B Q4_K_M file's blocks come to 5.7 GB instead of 7.0 (bench/quantized.py --l8b). A
graph multiplies them out before each product (graphs/builder.Graph.times), in the same float32 operations as
`scales` and `offsets` here.

The NumPy reference de-quantises (`dequantize`, or a part of the rows: `blocks[rows]`): it is the reference, and the
order of its float32 operations is gguf's own (scale times code, then plus offset), so it equals
gguf.quants.dequantize bit for bit (tests/test_gguf_blocks.py).
"""
from __future__ import annotations

import numpy as np

from .precision import COMPUTE

PARTS = ("codes", "scales", "zero_points", "offsets")   # a Blocks weight's arrays, under "<weight name>.<part>"
FACTORS = ("super_scales", "sub_scales", "super_offsets", "sub_offsets")   # factored scales' and offsets' arrays


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Integer values < 2**bits [..., n] -> uint8 [..., ceil(n * bits / 8)], packed low-first (value i of a byte in
    bits [i * bits, (i + 1) * bits)); a last byte is padded with zeros."""
    per = 8 // bits
    v = np.asarray(values, np.uint8)
    pad = -v.shape[-1] % per
    if pad:
        v = np.concatenate([v, np.zeros((*v.shape[:-1], pad), np.uint8)], axis=-1)
    v = v.reshape(*v.shape[:-1], -1, per)
    out = np.zeros(v.shape[:-1], np.uint8)
    for i in range(per):
        out |= v[..., i] << np.uint8(bits * i)
    return out


def unpack(packed: np.ndarray, bits: int, n: int, dtype=np.uint8) -> np.ndarray:
    """The inverse of `pack`: uint8 [..., bytes] -> [..., n] of `dtype`, each value written straight into the one
    array returned (no stack of parts, no second copy to convert)."""
    per, mask = 8 // bits, np.uint8((1 << bits) - 1)
    out = np.empty((*packed.shape, per), dtype)
    for i in range(per):                                                  # value i of each byte, low bits first
        out[..., i] = packed if per == 1 else (packed >> np.uint8(bits * i)) & mask
    return out.reshape(*packed.shape[:-1], -1)[..., :n]


class Blocks:
    """One quantised [N, K] weight (see the module's docstring). Arrays, each with N rows:
    codes uint8 [N, K / block, block * bits / 8]; scales float32 [N, K / block]; zero_points uint8
    [N, ceil(K / block * bits / 8)] (packed as codes are); offsets float32 [N, K / block] or None.
    Or, factored (`factors`, FACTORS), scales as super_scales float32 [N, S] times sub_scales int8 [N, K / block] (S
    super-blocks a row), and offsets as super_offsets times sub_offsets plus scales * zero points; `scales` and
    `offsets` then multiply them out (for the NumPy reference; a graph does it in its own nodes).
    `shape` and `dtype` are those of the weight it stands for (float32 values); `nbytes` is what it holds."""

    def __init__(self, codes, scales, zero_points, offsets, bits: int, block: int, factors: dict | None = None):
        self.codes, self.zero_points, self._scales, self._offsets = codes, zero_points, scales, offsets
        self.factors = factors or None
        self.bits, self.block = int(bits), int(block)
        if self.bits not in (2, 4, 8) or self.block < 16 or self.block & (self.block - 1):
            raise ValueError(f"MatMulNBits takes 2, 4 or 8 bits in blocks of a power of two >= 16; got {bits} bits, "
                             f"block {block}")
        if (scales is None) == (self.factors is None):
            raise ValueError("Blocks take scales (and offsets) or their factors, one of the two")
        self.shape = (codes.shape[0], codes.shape[1] * self.block)
        self.dtype, self.ndim = COMPUTE, 2

    @classmethod
    def of(cls, parts: dict, bits: int, block: int) -> Blocks:
        """Blocks from its arrays by part name (`parts`' inverse)."""
        factors = {k: parts[k] for k in FACTORS if parts.get(k) is not None}
        return cls(parts["codes"], parts.get("scales"), parts["zero_points"], parts.get("offsets"), bits, block,
                   factors)

    def map(self, f) -> Blocks:
        """f applied to each of its arrays (each has its N rows first): a permutation of rows, say."""
        return Blocks.of({k: f(a) for k, a in self.parts().items()}, self.bits, self.block)

    @property
    def has_offsets(self) -> bool:
        return self._offsets is not None or (self.factors is not None and "super_offsets" in self.factors)

    @property
    def scales(self) -> np.ndarray:
        """float32 [N, K / block]: as stored, or its factors multiplied out."""
        if self.factors is None:
            return self._scales
        return multiplied(self.factors["super_scales"], self.factors["sub_scales"])

    @property
    def offsets(self) -> np.ndarray | None:
        """float32 [N, K / block] or None: as stored, or its factors multiplied out, plus scales * zero points."""
        if self.factors is None or not self.has_offsets:
            return self._offsets
        return self._offsets_of(self.scales, unpack(self.zero_points, self.bits, self.codes.shape[1], COMPUTE))

    def _offsets_of(self, scales: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """The offsets, given the scales and the float zero points [N, K / block] a caller has already made."""
        if self.factors is None:
            return self._offsets
        return multiplied(self.factors["super_offsets"], self.factors["sub_offsets"]) + scales * zero

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.parts().values())

    def parts(self) -> dict[str, np.ndarray]:
        """Its arrays by part name (PARTS, or FACTORS for the factored scales and offsets), offsets only where it has
        them."""
        out = dict(codes=self.codes, scales=self._scales, zero_points=self.zero_points, offsets=self._offsets)
        return {k: v for k, v in out.items() if v is not None} | (self.factors or {})

    def rows(self, index) -> Blocks:
        """Rows `index` (a slice or integer array) as Blocks of their own (views where NumPy's indexing makes them)."""
        return self.map(lambda a: a[index])

    def dequantize(self) -> np.ndarray:
        """The weight in float32 [N, K]: scale * (code - zero point) (+ offset), in gguf's order of operations. The
        codes are unpacked straight into that one float32 [N, K] array (unpack) and the rest is done there in place
        (a model's start de-quantises every weight: a stack, its copy and temporaries made Gemma 3's 1.6-1.9 s)."""
        N, K = self.shape
        nb = K // self.block
        w = unpack(self.codes.reshape(N, -1), self.bits, K, COMPUTE).reshape(N, nb, self.block)
        zero, scales = unpack(self.zero_points, self.bits, nb, COMPUTE), self.scales   # each made once
        w -= zero[:, :, None]
        w *= scales[:, :, None]
        if self.has_offsets:
            w += self._offsets_of(scales, zero)[:, :, None]
        return w.reshape(N, K)

    # the NumPy reference's reads (model/precision.widen, W[rows], np.asarray(W)): de-quantised, only what is read
    def __getitem__(self, key):
        if isinstance(key, tuple):                      # rows first, then the rest of the key on what they are
            rows = self[key[0]]
            return rows[(slice(None),) * (rows.ndim - 1) + key[1:]]
        index = np.asarray(key) if not isinstance(key, slice) else key
        if isinstance(index, np.ndarray) and index.ndim != 1:
            return self.rows(index.reshape(-1)).dequantize().reshape(*index.shape, self.shape[1])
        if isinstance(index, np.ndarray) and index.ndim == 0:
            return self.rows(index.reshape(1)).dequantize()[0]
        return self.rows(index).dequantize()

    def __array__(self, dtype=None, copy=None):
        w = self.dequantize()
        return w if dtype is None else w.astype(dtype)

    @property
    def T(self) -> np.ndarray:
        return self.dequantize().T

    def astype(self, dtype) -> np.ndarray:
        return self.dequantize().astype(dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"Blocks(shape={self.shape}, bits={self.bits}, block={self.block}, "
                f"offsets={self.has_offsets}, factored={self.factors is not None}, nbytes={self.nbytes})")


def multiplied(sup: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """A super-block's float32 [N, S] times its sub-blocks' integers [N, nb] -> float32 [N, nb] (exact: a float16
    times a small integer)."""
    N, nb = sub.shape
    return (sup[:, :, None] * sub.reshape(N, sup.shape[1], nb // sup.shape[1]).astype(COMPUTE)).reshape(N, nb)


def expand(named: dict) -> dict[str, np.ndarray]:
    """A name -> array dict with each Blocks weight replaced by its parts, "<name>.<part>" (what graphs bind)."""
    out = {}
    for name, value in named.items():
        if isinstance(value, Blocks):
            out |= {f"{name}.{part}": a for part, a in value.parts().items()}
        else:
            out[name] = value
    return out
