"""The two wire forms of an answer, shared by the server and the client: JSON and a compact binary form.

Decoding needs the standard library and NumPy only, so `attnscope.app.client` works in an environment with
nothing else (it reads the binary form's header with orjson where it is installed: 0.03 ms against the standard
library's 0.11 for MiniLM's 6 KB header); encoding (which only the server does) imports orjson when it is first
called.

Binary (`Accept: application/vnd.attnscope.tensors`):
    b"ATSC" | uint32 little-endian n | n bytes of UTF-8 JSON header | zero padding to 8 bytes | tensor data
The header holds every non-tensor field plus "tensors": [{name, dtype, shape, offset}] with offsets
from the start of the data section; tensors are little-endian float32 or float16 (integer ones, such as top-k key
indices, int32 whatever the float dtype asked), C order.
"""
from __future__ import annotations

import json
import math
import struct
from typing import Callable

import numpy as np

try:
    from orjson import loads as _loads       # the header's JSON, as orjson wrote it (no NaN: null), read the same
except ImportError:                          # pragma: no cover - a client-only environment
    _loads = json.loads

BINARY = "application/vnd.attnscope.tensors"
NDJSON = "application/x-ndjson"   # a layer-by-layer run's progress, line by line, then the answer (app/routers.py)
MAGIC = b"ATSC"


def accepts_binary(accept: str | None) -> bool:
    """True when the Accept header names the binary form with a non-zero quality (`;q=0` means "not this")."""
    return accepts(accept, BINARY)


def accepts(accept: str | None, media_type: str) -> bool:
    """True when the Accept header names `media_type` with a non-zero quality."""
    for part in (accept or "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.lower() != media_type:
            continue
        q = next((p.split("=", 1)[1] for p in params if p.replace(" ", "").lower().startswith("q=")), "1")
        try:
            return float(q) > 0
        except ValueError:
            return False
    return False


def _plain(obj):
    """JSON fallback for numpy values in the header (small lists and scalars)."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def _contiguous(obj):
    """orjson writes C-contiguous float32/64 arrays itself; others come here: copied once, or as lists."""
    if isinstance(obj, np.ndarray) and not obj.flags.c_contiguous:
        return np.ascontiguousarray(obj)
    return _plain(obj)


def to_json(payload: dict) -> bytes:
    """The JSON form; numpy arrays are written directly by orjson (fast; float32 as its shortest repr)."""
    import orjson
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY, default=_contiguous)


PIECE = 1 << 18  # bytes: small pieces of a JSON answer are joined up to this size, big ones stay as they are


def json_chunks(payload: dict, late: Callable[[], dict] | None = None, cells: int = 1 << 14) -> list[bytes]:
    """The JSON form in pieces; b"".join(pieces) == to_json({**payload, **late()}), byte for byte.

    Arrays of more than `cells` values are written a block of rows at a time: each orjson call then holds the
    GIL for a millisecond or two, so the event loop's thread gets it between calls while a worker thread
    writes an 85 MB answer (one orjson call for all of it blocked the loop for its whole 0.6 s; in blocks of
    16k values the loop's median lag is 3-4 ms, bench/overload.py). `late` is called after everything else is
    written (the timing that covers it)."""
    import orjson

    def dump(v) -> bytes:
        return orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY, default=_contiguous)

    out: list[bytes] = []

    def array(a: np.ndarray) -> None:
        if a.size <= cells or a.ndim == 1:
            out.append(dump(a))
            return
        out.append(b"[")
        row = a[0].size
        if row > cells:
            for i in range(len(a)):
                if i:
                    out.append(b",")
                array(a[i])
        else:
            step = max(1, cells // max(row, 1))
            for i in range(0, len(a), step):
                if i:
                    out.append(b",")
                out.append(dump(a[i:i + step])[1:-1])   # the rows without the block's own brackets
        out.append(b"]")

    def fields(items) -> None:
        for key, value in items:
            out.append((b"," if len(out) > 1 else b"") + dump(key) + b":")
            if isinstance(value, np.ndarray) and value.size > cells:
                array(value)
            else:
                out.append(dump(value))

    out.append(b"{")
    fields(payload.items())
    fields((late() if late else {}).items())
    out.append(b"}")
    pieces, run, size = [], [], 0
    for chunk in out + [b""]:                          # join runs of small pieces; keep the big ones
        if run and (size >= PIECE or len(chunk) >= PIECE or not chunk):
            pieces.append(b"".join(run))
            run, size = [], 0
        if len(chunk) >= PIECE:
            pieces.append(chunk)
        elif chunk:
            run.append(chunk)
            size += len(chunk)
    return pieces


def is_tensor(value) -> bool:
    """What travels in the binary form's data section: float and integer arrays of two or more axes."""
    return isinstance(value, np.ndarray) and value.dtype.kind in "fiu" and value.ndim >= 2


def binary_chunks(payload: dict, dtype: str = "float32",
                  cast: Callable[[np.ndarray, np.dtype], np.ndarray] | None = None,
                  late: Callable[[], dict] | None = None) -> list[memoryview | bytes]:
    """The binary form as a list of buffers to send one after another: the header, then each tensor.

    A tensor already in the wire dtype and C-contiguous goes out as a view of its own memory, with no copy
    (a 512-token answer is 75 MB, so copies are what costs). Others are converted once, by `cast` when
    given (the server passes onnxruntime's float16 Cast, much faster than numpy's for tiny values). `late`
    adds header fields after the tensors are converted (the timing that covers it)."""
    header, arrays, tensors, offset = {}, [], [], 0
    floats = np.dtype(dtype).newbyteorder("<")
    for key, value in payload.items():
        if not is_tensor(value):
            header[key] = value
            continue
        dt = floats if value.dtype.kind == "f" else np.dtype("<i4")
        tensors.append({"name": key, "dtype": dt.name, "shape": list(value.shape), "offset": offset})
        if value.dtype == dt and value.flags.c_contiguous:
            data = value
        elif cast is not None and dt.kind == "f":
            data = cast(value, dt)
        else:
            data = np.ascontiguousarray(value, dt)
        pad = (-data.nbytes) % 8
        arrays += [memoryview(data).cast("B")] + ([b"\0" * pad] if pad else [])
        offset += data.nbytes + pad
    header |= late() if late else {}
    header["tensors"] = tensors
    head = to_json(header)  # the same numbers, written the same way, as the JSON form
    head += b" " * ((-(len(head) + 8)) % 8)  # data section starts 8-aligned
    return [MAGIC + struct.pack("<I", len(head)) + head, *arrays]


def from_binary(blob: bytes | bytearray | memoryview) -> dict:
    """Decode the binary form into a dict of header fields and numpy arrays that view `blob` (no copies)."""
    if bytes(blob[:4]) != MAGIC:
        raise ValueError("not an attnscope tensor answer (bad magic)")
    (n,) = struct.unpack("<I", blob[4:8])
    data = memoryview(blob)
    header = _loads(bytes(data[8:8 + n]))
    data = data[8 + n:]
    for t in header.pop("tensors"):
        dt = np.dtype(t["dtype"]).newbyteorder("<")
        header[t["name"]] = np.frombuffer(data, dt, math.prod(t["shape"]), t["offset"]).reshape(t["shape"])
    return header
