"""Exported graphs on disk: built from the NumPy model on first use (with a progress bar) into a cache folder the
caller chooses, under a key made of the model's shape (its config, and each array's name, shape and type) and of the
exporter's source, so a change to either rebuilds it. A graph holds no weights (graphs/builder.py): a model with
other weights of the same shapes reads the same graph, and the key hashes no weight bytes (an 8B model's key is
as quick as a toy's).

A graph is used only when its checksum matches: each has a sidecar NAME.sha256 with the SHA-256 of its bytes, written
after the graph, so a graph cut short, bit-flipped or left without its sidecar (a kill between the two) is rebuilt.
Temporary files of exports killed half-way (NAME.tmpPID) are removed when the first graph is looked up. A cache
folder that cannot be written gets the graph in a temporary folder of this process instead.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path


from ..model import encdec as encdec_model
from ..model import attention, rope, transformer
from ..model import precision, weights
from ..model.weights import arrays
from . import builder, decoding, encdec, layers, reductions, stacked, steps

log = logging.getLogger("attnscope")
EXPORTER = (builder, steps, stacked, decoding, layers, reductions, transformer, attention, rope, encdec, encdec_model,
            precision, weights)   # the source that shapes an exported graph (attention: every graph reads attn.scale)


def content_key(model) -> str:
    """Hash of the config, of every array's name, shape and stored type, and of the exporter's source: what a graph
    is made of (its weights are bound at run time, runtime/tensors.Weights)."""
    h = hashlib.sha256()
    for mod in EXPORTER:
        h.update(Path(mod.__file__).read_bytes())
    h.update(repr(model.cfg).encode())
    for name, value in sorted(arrays(model).items()):
        h.update(f"{name}:{value.shape}:{value.dtype}".encode())
    return h.hexdigest()[:16]


class GraphCache:
    """One model's exported graphs in `folder`: plain, with the teaching stages, and (decoders) the decoding step."""

    def __init__(self, folder: Path, model_id: str, model):
        self.folder, self.model_id, self.model = Path(folder), model_id, model
        self._key: str | None = None
        self._verified: dict[Path, tuple[int, int]] = {}   # graph -> (size, mtime) when its checksum matched
        self._scratch: Path | None = None                  # where graphs go when the folder cannot be written

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = content_key(self.model)
        return self._key

    def cached_path(self, stages: bool = False, decode: bool = False, edits: bool = False) -> Path:
        """Where the exported graph lives in the cache (it may not exist yet). edits: an encoder-decoder's graph of
        runs with edits (graphs/encdec.build_graph's)."""
        variant = "-decode" if decode else "-stages" if stages else "-edits" if edits else ""
        return self.folder / f"{self.model_id}{variant}-{self.key}.onnx"

    def path(self, stages: bool = False, decode: bool = False, edits: bool = False) -> Path:
        """The exported graph, building it if it is not cached yet or fails its checksum."""
        if not self._verified:                      # first look at the cache: clear what killed exports left
            _remove_stale_temporaries(self.folder)
        path = self.cached_path(stages, decode, edits)
        if self._intact(path):
            return path
        if self._scratch is not None and self._intact(self._scratch / path.name):
            return self._scratch / path.name
        try:
            self._build(path, stages, decode, edits)
            return path
        except OSError as e:
            log.warning("cannot write the graph cache %s (%s); building %s in a temporary folder for this "
                        "process (point ATTNSCOPE_CACHE at a writable folder to keep it)", self.folder,
                        e.strerror or type(e).__name__, path.name)
            self._build(self._scratch_dir() / path.name, stages, decode, edits)
            return self._scratch / path.name

    def stopping(self, depth: int) -> bytes:
        """The served graph cut after `depth` blocks (stacked.build_graph's depth), built in memory: a fraction of a
        second per block, nothing written to the cache."""
        return stacked.build_graph(self.model, depth=depth).SerializeToString()

    def forget(self, path: Path) -> None:
        """A graph that would not open: rebuilt on the next `path` (a read-only cache keeps it, and its scratch
        copy is built instead)."""
        self._verified.pop(path, None)
        try:
            sidecar(path).unlink(missing_ok=True)
        except OSError:
            pass

    def _intact(self, path: Path) -> bool:
        try:
            st = path.stat()
        except OSError:
            return False
        stamp = (st.st_size, st.st_mtime_ns)
        if self._verified.get(path) == stamp:
            return True
        try:
            expected = sidecar(path).read_text().strip()
        except OSError:
            expected = None
        if expected != sha256(path):
            log.warning("cached graph %s %s; rebuilding", path.name,
                        "has no checksum" if expected is None else "does not match its checksum")
            return False
        self._verified[path] = stamp
        return True

    def _build(self, path: Path, stages: bool, decode: bool, edits: bool = False) -> None:
        log.info("exporting %s to %s", self.model_id, path)
        if isinstance(self.model, encdec_model.EncoderDecoder):     # both stacks in one graph
            encdec.export(self.model, path, desc=self.model_id, edits=edits)
        elif decode:
            decoding.export(self.model, path, desc=self.model_id)                # written atomically
        else:
            stacked.export(self.model, path, stages=stages, desc=self.model_id)
        tmp = path.with_name(f"{path.name}.sha256.tmp{os.getpid()}")
        tmp.write_text(sha256(path) + "\n")
        os.replace(tmp, sidecar(path))
        st = path.stat()
        self._verified[path] = (st.st_size, st.st_mtime_ns)

    def _scratch_dir(self) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=f"attnscope-{os.getpid()}-"))
            weakref.finalize(self, shutil.rmtree, self._scratch, True)
        return self._scratch


def sidecar(path: Path) -> Path:
    """Where a cached file's SHA-256 is kept (graphs here, and runtime/options.OptimizedGraphs' optimized forms)."""
    return path.with_name(path.name + ".sha256")


def sha256(path: Path) -> str:
    """A file's SHA-256, read in 4 MB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


_TEMPORARY = re.compile(r"\.tmp(\d+)$")


def _remove_stale_temporaries(folder: Path) -> None:
    """Delete NAME.tmpPID files whose process is gone (an export killed half-way leaves 60-90 MB behind), and
    scratch folders of dead processes in the system's temporary folder."""
    for item in [*_glob(folder, "*.tmp*"), *_glob(Path(tempfile.gettempdir()), "attnscope-*-*")]:
        m = _TEMPORARY.search(item.name) or re.match(r"attnscope-(\d+)-", item.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            shutil.rmtree(item) if item.is_dir() else item.unlink()
            log.info("removed %s, left by a process that is gone", item)
        except OSError:
            pass


def _glob(folder: Path, pattern: str) -> list[Path]:
    try:
        return list(folder.glob(pattern))
    except OSError:
        return []


