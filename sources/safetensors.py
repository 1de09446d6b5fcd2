"""Safetensors files read here rather than with the safetensors package: its NumPy reader has no bfloat16, which
most Llama-family checkpoints use, and the header alone tells a truncated file.

    tensors = read_header(path)      # name -> Tensor(path, dtype, shape, byte range), checked against the file size
    w = read_tensor(tensors[name])   # a read-only view of the mapped file, in the type the file stores (store.py)
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..model.precision import STORAGE, compute_array
from .spec import ModelUnavailable, one_line
from .store import mapped

# the types a weight may be stored in (model/precision.py's storage types), by their safetensors names; float64 is
# read too, and narrowed to the compute type (no checkpoint we know stores weights so)
DTYPES = {"F32": STORAGE["float32"], "F16": STORAGE["float16"], "BF16": STORAGE["bfloat16"], "F64": np.dtype("<f8")}
INTEGERS = {"U8": np.dtype(np.uint8), "I8": np.dtype(np.int8)}   # the GGUF cache's quantised parts (codes, factors)


class Tensor(NamedTuple):
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int            # byte offsets in the file
    end: int


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors a .safetensors file describes (an 8-byte length, a JSON header, then the data),
    checked against the file's size: a truncated file is named here, before anything is read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise ModelUnavailable(f"{path.name} is {size:,} bytes and not a readable safetensors file "
                                   f"(truncated or corrupt); fix: copy or save it again")
        header = f.read(n)
    tensors, base = {}, 8 + n
    try:
        for name, t in json.loads(header).items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            bits = int(re.sub(r"\D", "", t["dtype"].split("_")[0]) or 8)   # BOOL, U8, I64, BF16, F8_E4M3, ...
            if not 0 <= begin <= end or end - begin != math.prod(t["shape"]) * bits // 8:
                raise ValueError(f"tensor {name}'s byte range does not fit its shape")
            tensors[name] = Tensor(path, t["dtype"], tuple(t["shape"]), base + begin, base + end)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelUnavailable(f"{path.name} has an unreadable safetensors header ({one_line(e)}; corrupt); "
                               f"fix: copy or save it again") from None
    needed = max((t.end for t in tensors.values()), default=base)
    if needed > size:
        raise ModelUnavailable(f"{path.name} is truncated: {size:,} bytes, but its header describes {needed:,}; "
                               f"fix: copy or download it again")
    return tensors


def read_tensor(t: Tensor) -> np.ndarray:
    """One tensor as a read-only view of its mapped file, in its stored type (float64: narrowed to the compute type,
    a copy)."""
    w = mapped(t.path).view(t.start, t.end, DTYPES[t.dtype], t.shape)
    return compute_array(w) if t.dtype == "F64" else w


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError):
            raise ModelUnavailable(f"{index.name} in {folder} is not a safetensors index (no weight_map); "
                                   f"fix: save the model again") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ModelUnavailable(f"{len(missing)} of the {len(shards)} shards {index.name} names are missing from "
                                   f"{folder} ({', '.join(missing[:3])}); fix: copy or download them")
        return [folder / s for s in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    others = sorted(p.name for p in folder.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".h5", ".msgpack"))
    found = f"found only {', '.join(others[:3])}; attnscope reads safetensors" if others else "found no weights"
    raise ModelUnavailable(f"no model.safetensors in {folder} ({found}); fix: save it with "
                           f"model.save_pretrained(folder) (safetensors is its default)")


def write_streamed(path: Path, named, metadata) -> None:
    """A .safetensors file from (name, array) pairs made one at a time (an 8B GGUF file's blocks: GBs that are never
    in memory at once). Each array goes to a side file of its item size as it comes; then the header (which names
    every offset, and `metadata()`, called once every pair is written) is written, and the side files joined after
    it, widest items first, so that every tensor starts aligned to its item size and the data has no holes."""
    import shutil

    names = {dtype: name for name, dtype in (DTYPES | INTEGERS).items()}
    sides, entries = {}, {}
    try:
        for name, a in named:
            a = np.ascontiguousarray(a)
            side = sides.get(a.dtype.itemsize)
            if side is None:
                side = sides[a.dtype.itemsize] = open(path.with_name(f"{path.name}.{a.dtype.itemsize}"), "w+b")
            entries[name] = (a.dtype.itemsize, side.tell(), names[a.dtype], list(a.shape))
            a.reshape(-1).view(np.uint8).tofile(side)
        starts, at = {}, 0
        for size in sorted(sides, reverse=True):
            starts[size], at = at, at + sides[size].tell()
        header = {"__metadata__": metadata()} | {name: {"dtype": dtype, "shape": shape, "data_offsets": [
            starts[size] + offset, starts[size] + offset + math.prod(shape) * size]}
            for name, (size, offset, dtype, shape) in entries.items()}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        with open(path, "wb") as out:
            out.write(len(blob).to_bytes(8, "little") + blob)
            for size in sorted(sides, reverse=True):
                sides[size].seek(0)
                shutil.copyfileobj(sides[size], out, 1 << 24)
    finally:
        for size, side in sides.items():
            side.close()
            Path(side.name).unlink(missing_ok=True)
