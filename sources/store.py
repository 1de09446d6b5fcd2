"""The weight store: every tensor of a model as a read-only view of its file, memory-mapped, in the type the file
stores it in (model/precision.py's storage types). Nothing is copied when a model loads: a page of a weight is read
from disk when something first touches it, and `release` gives a run's pages back once it is done with them (a model
larger than memory runs layer by layer, each layer's weights read when that layer runs).

    f = mapped(path)                       # one shared read-only mapping per file
    w = f.view(start, end, dtype, shape)   # a NumPy array over those bytes (no copy)
    release([w, ...])                      # drop the pages of these arrays from this process (they stay on disk and,
                                           # while memory allows, in the page cache: a later touch is a page fault)
    read([w, ...])                         # read their pages now (from disk where they are not in memory)

Only where a file's layout is not ours (a transposed Conv1D, a fused projection split in parts, GGUF blocks,
Gemma's norms stored as weight - 1) does a source derive an array of its own, in the same storage type.
"""
from __future__ import annotations

import functools
import hashlib
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
            st = os.fstat(f.fileno())
            size = st.st_size
            self.mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.size, self.identity = size, (str(self.path), size, st.st_mtime_ns)
        if self.mmap is not None:
            _FILES[id(self.mmap)] = self
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


_FILES: dict[int, MappedFile] = {}   # every mapping made, by its mmap's id (kept: an array may outlive the lru entry)


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
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj   # np.frombuffer(mmap) holds a memoryview
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


def read(arrays: Iterable[np.ndarray]) -> None:
    """Read the pages of these arrays that views of mapped files hold, from disk where they are not in memory (one
    byte of each page; MADV_WILLNEED, which should read ahead without a touch, read nothing ahead on this machine's
    kernel: a cold 436 MB layer touched after it took as long as one never advised). The walks layer by layer run it
    in a thread of their own on the next layer while they compute one (runtime/layerwise.Layerwise.read_ahead)."""
    for a in arrays:
        if a.size and _mapping_of(a) is not None:
            a.reshape(-1).view(np.uint8)[::PAGE].max()           # NumPy's reduction runs without the GIL


SAMPLE = 1 << 20          # an array of its own larger than FULL is fingerprinted by this many bytes of it, strided
FULL = 16 << 20


def fingerprint(named: dict[str, np.ndarray]) -> str:
    """The identity of a model's weights, without reading them all: every name, shape and type; a view of a mapped
    file by the file (path, size, modification time) and its place in it; an array of its own by its bytes (a
    strided sample of SAMPLE bytes where it is larger than FULL). What results cached beyond a process are keyed by
    (a graph holds no weights, so its key does not tell two models of the same shapes apart)."""
    h = hashlib.sha256()
    for name in sorted(named):
        a = named[name]
        h.update(f"{name}:{a.shape}:{a.dtype}".encode())
        m = _mapping_of(a)
        if m is not None and id(m) in _FILES:
            f = _FILES[id(m)]
            h.update(repr((f.identity, a.ctypes.data - f.address)).encode())
            continue
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        h.update(raw.tobytes() if raw.nbytes <= FULL else raw[::max(1, raw.nbytes // SAMPLE)].tobytes())
    return h.hexdigest()[:16]
