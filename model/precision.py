"""The precision policy: which float type a model's weights are stored in, and which one its arithmetic runs in.

Decided here, once; no other module names a float type (masks, graphs, readers and byte sizes ask this one).

    storage   the checkpoint's own: float32, bfloat16 or float16. Weights stay in it, as views of their files
              (sources/store.py): an 8B bfloat16 checkpoint is 16 GB, not its float32 form's 32.
    compute   float32 by default. A bfloat16 or float16 number widened to float32 is exact (float32 holds every value
              of both), so bf16 storage + float32 arithmetic gives the float32 answer on the same weights, at half
              the memory. Each weight is widened where it is used (`widen`; in a graph, a Cast before its MatMul),
              and softmax and reductions run in float32 as well.
              Or a fast mode (COMPUTE_DTYPES), where the model's matrix products run reduced: "float16" and
              "bfloat16" (each product's operands cast to it, its result back to float32: graphs/reduced.py), or
              "tf32" (float32 products multiplied in TF32 by the CUDA provider, runtime/options.provider_options).
              Softmax, norms, masks and every reduction stay float32 in every mode; activations, outputs and
              statistics are float32 numbers (COMPUTE) whatever the mode. A fast mode is labelled in every answer,
              and its error against float32 is measured per model (bench/precision.py, bench/gpu.py).

The NumPy reference always computes in float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

COMPUTE = np.dtype(np.float32)            # every activation, score, probability and statistic
STORAGE = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
           "float16": np.dtype(np.float16)}   # the weights' types a checkpoint may hold
INDEX = np.dtype(np.int64)                # token ids, positions, lengths
MASKED = COMPUTE.type(np.finfo(COMPUTE).min)   # a hidden key's additive mask value: exp underflows to exactly 0,
#                                               and a row whose every key is hidden spreads evenly instead of NaN
EPS = float(np.finfo(COMPUTE).eps)        # the compute type's unit roundoff (x2): 1.19e-7
COMPUTE_DTYPES = ("float32", "tf32", "float16", "bfloat16")   # what a model's matrix products may run in: float32
#                                                              exact (the default), or a fast mode


def scalar(value) -> np.generic:
    """A Python number as a compute-type scalar (so arrays stay in the compute type when it is mixed in)."""
    return COMPUTE.type(value)


def compute_array(value) -> np.ndarray:
    """Any array-like as a compute-type array (no copy when it already is one)."""
    return np.asarray(value, COMPUTE)


def widen(weight: np.ndarray) -> np.ndarray:
    """A stored weight in the compute type: itself when it is float32, else an exact widened copy (quantised blocks,
    model/quantized.Blocks: de-quantised, exactly as gguf de-quantises them)."""
    if hasattr(weight, "dequantize"):
        return weight.dequantize()
    return weight if weight.dtype == COMPUTE else weight.astype(COMPUTE)


def narrow(weight) -> bool:
    """Whether `widen` copies this stored weight: one narrower than the compute type, or kept in quantised blocks."""
    return hasattr(weight, "dequantize") or weight.dtype != COMPUTE


def storage_name(dtype) -> str:
    """'float32', 'bfloat16' or 'float16' for a weight's dtype; ValueError for any other."""
    for name, d in STORAGE.items():
        if np.dtype(dtype) == d:
            return name
    raise ValueError(f"weights stored as {np.dtype(dtype)} are not supported; stored types: {', '.join(STORAGE)}")


@dataclass(frozen=True)
class Precision:
    """One model's policy: the type its weights are stored in (the checkpoint's own) and the one its matrix products
    run in (float32, or a fast mode of a device session)."""
    storage: str = "float32"
    compute: str = "float32"

    def __post_init__(self):
        if self.storage not in STORAGE:
            raise ValueError(f"storage must be one of {', '.join(STORAGE)}; got {self.storage!r}")
        if self.compute not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}; got {self.compute!r}")

    @property
    def reduced(self) -> bool:
        """Whether the products run in a fast mode (labelled in every answer), not float32."""
        return self.compute != "float32"

    @property
    def storage_dtype(self) -> np.dtype:
        return STORAGE[self.storage]

    def stored_bytes(self, n_params: int) -> int:
        return int(n_params) * self.storage_dtype.itemsize

    def compute_bytes(self, n_values: int) -> int:
        """Bytes of n_values numbers in the compute type (an activation, a widened weight)."""
        return int(n_values) * COMPUTE.itemsize

    @classmethod
    def of(cls, weights, compute: str = "float32") -> Precision:
        """The policy of a model whose weights are these arrays: stored as the largest share of them is (a
        bfloat16 checkpoint may keep a few float32 tensors; GGUF files de-quantise to float32), its products run in
        `compute`."""
        sizes: dict[str, int] = {}
        for w in weights:
            name = storage_name(w.dtype)
            sizes[name] = sizes.get(name, 0) + w.size
        return cls(max(sizes, key=sizes.get) if sizes else "float32", compute)
