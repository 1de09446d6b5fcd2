"""The two wire forms of an answer: JSON (default) and a compact binary tensor form.

Binary (`Accept: application/vnd.attnscope.tensors`):
    b"ATSC" | uint32 little-endian n | n bytes of UTF-8 JSON header | zero padding to 8 bytes | tensor data
The header holds every non-tensor field plus "tensors": [{name, dtype, shape, offset}] with offsets
from the start of the data section; tensors are little-endian float32 or float16, C order.
"""
from __future__ import annotations

import functools
import struct

import numpy as np
import orjson
from starlette.responses import Response

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


@functools.cache
def _cast_f16():
    """A one-node onnxruntime graph, Cast(float32 -> float16)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)], "to_float16",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_cpu_mem_arena = False  # an arena would keep its peak (tens of MB per concurrent cast) for good
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def to_float16(a: np.ndarray) -> np.ndarray:
    """float32 -> float16, bit for bit what numpy gives, but through onnxruntime's Cast: numpy takes a slow path
    for results below float16's normal range, and a quarter of attention weights land there (358 ms vs 2-13 ms
    for 512 tokens x 72 heads)."""
    return _cast_f16().run(None, {"x": np.ascontiguousarray(a, np.float32)})[0]


def binary_chunks(payload: dict, dtype: str = "float32") -> list[memoryview | bytes]:
    """The binary form as a list of buffers to send one after another: the header, then each tensor.

    A float32 tensor that is already C-contiguous goes out as a view of its own memory, with no copy:
    a 512-token answer is 75 MB, so copies are what costs. Other tensors are converted once."""
    header, arrays, offset = {}, [], 0
    tensors = []
    dt = np.dtype(dtype).newbyteorder("<")
    for key, value in payload.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.ndim >= 2:
            tensors.append({"name": key, "dtype": dtype, "shape": list(value.shape), "offset": offset})
            if value.dtype == dt and value.flags.c_contiguous:
                data = value
            elif dt == np.float16:
                data = to_float16(value)
            else:
                data = np.ascontiguousarray(value, dt)
            pad = (-data.nbytes) % 8
            arrays += [memoryview(data).cast("B")] + ([b"\0" * pad] if pad else [])
            offset += data.nbytes + pad
        else:
            header[key] = value
    header["tensors"] = tensors
    head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY, default=_default)
    head += b" " * ((-(len(head) + 8)) % 8)  # data section starts 8-aligned
    return [MAGIC + struct.pack("<I", len(head)) + head, *arrays]


def to_binary(payload: dict, dtype: str = "float32") -> bytes:
    """The binary form in one piece (the server streams binary_chunks instead)."""
    return b"".join(binary_chunks(payload, dtype))


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


class BuffersResponse(Response):
    """Sends a list of buffers one after another under one Content-Length (no joining copy)."""

    def __init__(self, buffers: list, media_type: str, headers: dict[str, str]):
        self.buffers = buffers
        super().__init__(None, media_type=media_type, headers=headers)
        self.headers["content-length"] = str(sum(len(b) for b in buffers))

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for i, buf in enumerate(self.buffers):
            await send({"type": "http.response.body", "body": buf, "more_body": i < len(self.buffers) - 1})
