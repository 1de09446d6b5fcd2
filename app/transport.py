"""The two wire forms of an answer: JSON (default) and a compact binary tensor form.

Binary (`Accept: application/vnd.attnscope.tensors`):
    b"ATSC" | uint32 little-endian n | n bytes of UTF-8 JSON header | zero padding to 8 bytes | tensor data
The header holds every non-tensor field plus "tensors": [{name, dtype, shape, offset}] with offsets
from the start of the data section; tensors are little-endian float32 or float16, C order.
"""
from __future__ import annotations

import struct

import numpy as np
import orjson

BINARY = "application/vnd.attnscope.tensors"
MAGIC = b"ATSC"


def wants_binary(accept: str | None) -> bool:
    return bool(accept) and BINARY in accept


def to_json(payload: dict, precision: int | None = None) -> bytes:
    """Serialise with numpy arrays written directly (fast), optionally rounded to `precision` decimals."""
    if precision is not None:
        payload = {k: np.round(v, precision) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
                   for k, v in payload.items()}
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY, default=_default)


def _default(obj):
    if isinstance(obj, np.ndarray):  # orjson writes only C-contiguous arrays natively: copy (same dtype)
        if obj.flags.c_contiguous:
            return obj.tolist()
        return np.ascontiguousarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def to_binary(payload: dict, dtype: str = "float32") -> memoryview:
    """Arrays of floats go to the data section in `dtype`; everything else into the JSON header.

    Tensors are written straight into one zero-filled buffer (the padding): a 512-token answer is 75 MB,
    so every extra copy counts."""
    header, arrays, offset = {}, [], 0
    tensors = []
    dt = np.dtype(dtype).newbyteorder("<")
    for key, value in payload.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.ndim >= 2:
            tensors.append({"name": key, "dtype": dtype, "shape": list(value.shape), "offset": offset})
            arrays.append((offset, value))
            offset += value.size * dt.itemsize
            offset += (-offset) % 8
        else:
            header[key] = value
    header["tensors"] = tensors
    head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY, default=_default)
    head += b" " * ((-(len(head) + 8)) % 8)  # data section starts 8-aligned
    start = 8 + len(head)
    out = bytearray(start + offset)
    out[:8] = MAGIC + struct.pack("<I", len(head))
    out[8:start] = head
    for at, value in arrays:
        np.frombuffer(out, dt, value.size, start + at).reshape(value.shape)[...] = value
    return memoryview(out)  # Starlette sends a memoryview as is: no final 75 MB copy


def from_binary(blob: bytes | memoryview) -> dict:
    """Decode the binary form back into a dict of header fields and numpy arrays (for clients and tests)."""
    if blob[:4] != MAGIC:
        raise ValueError("not an attnscope tensor answer (bad magic)")
    (n,) = struct.unpack("<I", blob[4:8])
    header = orjson.loads(blob[8:8 + n])
    data = memoryview(blob)[8 + n:]
    for t in header.pop("tensors"):
        dt = np.dtype(t["dtype"]).newbyteorder("<")
        count = int(np.prod(t["shape"]))
        header[t["name"]] = np.frombuffer(data, dt, count, t["offset"]).reshape(t["shape"])
    return header
