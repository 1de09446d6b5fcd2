"""The weight store: every tensor of a model as a read-only view of its file, memory-mapped, in the type the file
stores it in (model/precision.py's storage types). Nothing is copied when a model loads: a page of a weight is read
from disk when something first touches it, and `release` gives a run's pages back once it is done with them (a model
larger than memory runs layer by layer, each layer's weights read when that layer runs).

    f = mapped(path)                       # one shared read-only mapping per file
    w = f.view(start, end, dtype, shape)   # a NumPy array over those bytes (no copy)
    release([w, ...])                      # drop the pages of these arrays from this process (they stay on disk and,
                                           # while memory allows, in the page cache: a later touch is a page fault)

Only where a file's layout is not ours (a transposed Conv1D, a fused projection split in parts, GGUF blocks,
Gemma's norms stored as weight - 1) does a source derive an array of its own, in the same storage type.
"""
from __future__ import annotations

import functools
import mmap
import os
from pathlib import Path
from typing import Iterable

import numpy as np

PAGE = mmap.PAGESIZE


class MappedFile:
    """One file mapped read-only into memory, shared by every array viewing it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.size = size
        self._bytes = np.frombuffer(self.mmap, np.uint8) if size else np.empty(0, np.uint8)   # the whole file

    @property
    def address(self) -> int:
        return self._bytes.ctypes.data

    def view(self, start: int, end: int, dtype, shape) -> np.ndarray:
        """Bytes [start, end) of the file as an array of `dtype` and `shape` (read-only, no copy). A tensor whose
        bytes do not start on a multiple of its item size is copied (NumPy and onnxruntime want aligned data)."""
        dtype = np.dtype(dtype)
        raw = self._bytes[start:end]
        if (self.address + start) % dtype.itemsize:
            raw = raw.copy()
        return raw.view(dtype).reshape(shape)


@functools.lru_cache(maxsize=256)
def _mapped(path: str, size: int, mtime_ns: int) -> MappedFile:
    return MappedFile(Path(path))


def mapped(path: str | Path) -> MappedFile:
    """The shared mapping of `path` (mapped again when the file changed)."""
    path = Path(path).resolve()
    st = path.stat()
    return _mapped(str(path), st.st_size, st.st_mtime_ns)


def _mapping_of(a: np.ndarray) -> mmap.mmap | None:
    """The mapped file an array views, found through its chain of bases, or None (an array of its own)."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, mmap.mmap) else None


def is_mapped(a: np.ndarray) -> bool:
    """Whether an array is a view of a mapped file (weights read from disk when touched), not one in memory."""
    return _mapping_of(a) is not None


def release(arrays: Iterable[np.ndarray]) -> None:
    """Give back the pages of these arrays that views of mapped files hold (arrays of their own are left alone):
    MADV_DONTNEED on whole pages; a shared read-only mapping loses nothing, a later touch reads the page again."""
    for a in arrays:
        m = _mapping_of(a)
        if m is None or not a.size:
            continue
        start = a.ctypes.data - np.frombuffer(m, np.uint8).ctypes.data
        first = start // PAGE * PAGE
        m.madvise(mmap.MADV_DONTNEED, first, min(start + a.nbytes, len(m)) - first)
