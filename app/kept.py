"""Long runs' finished answers, kept on disk: a page reloaded after a 32,768-token run (minutes on a CPU) shows it
again without running the model again, even once the in-memory result cache has let it go or the server restarted.

Only the binary answers of long texts (those that run layer by layer: Plan.kept) are kept, each as one file named by
its ETag (a hash of attnscope's version, the run's key, the whole request and the wire form: the same request is the
same file, another version never reads it). The folder holds at most ATTNSCOPE_KEPT_MB; the least recently read
files go first. ATTNSCOPE_KEPT_MB=0 keeps nothing. Files are written under a temporary name and renamed, so a
reader never sees half of one; an unreadable file is a miss.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

SUFFIX = ".atsc"


class KeptAnswers:
    """A folder of encoded answers, keyed by ETag, bounded by bytes (least recently read out first)."""

    def __init__(self, folder: Path, max_bytes: int):
        self.folder, self.max_bytes = Path(folder), max_bytes
        self.hits = 0                 # answers served from the folder since start (GET /healthz)
        self._lock = threading.Lock()

    def _path(self, etag: str) -> Path:
        return self.folder / (hashlib.sha256(etag.encode()).hexdigest()[:32] + SUFFIX)

    def get(self, etag: str, count: bool = True) -> bytes | None:
        """The kept answer's bytes (its file's time refreshed: read recently), or None. count: one more hit."""
        if self.max_bytes <= 0:
            return None
        path = self._path(etag)
        try:
            data = path.read_bytes()
            os.utime(path)
        except OSError:
            return None
        self.hits += count
        return data

    def put(self, etag: str, buffers: list) -> None:
        """Keep an answer (a list of buffers, as encoded), then drop the least recently read past the budget."""
        size = sum(len(b) for b in buffers)
        if self.max_bytes <= 0 or size > self.max_bytes:
            return
        path = self._path(etag)
        with self._lock:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                with open(tmp, "wb") as f:
                    for b in buffers:
                        f.write(b)
                tmp.replace(path)
                self._trim()
            except OSError:           # a full or read-only disk: the answer is simply not kept
                return

    def _trim(self) -> None:
        files = []
        for p in self.folder.glob("*" + SUFFIX):
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
        total = sum(s for _, s, _ in files)
        for _, size, p in sorted(files, key=lambda f: f[0]):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
