"""The tensors onnxruntime sessions bind (runtime/sessions.py): the model's arrays as OrtValues (`Weights`, made once,
over the arrays' own memory or copied to the GPU once), tensors left where a session computes for a later run (`Held`,
`hold`, `empty`), an OrtValue's size where it lives (`ort_nbytes`), the scratch memory for outputs nobody reads
(`SCRATCH`), and the memory faulted in ahead of the outputs a run hands back (`RESERVE`).
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
import time
from contextlib import contextmanager
from typing import Sequence

import numpy as np

from ..graphs.builder import PACKED_SUFFIX
from ..model.precision import COMPUTE, INDEX, narrow, widen
from ..model.quantized import Blocks
from ..model.weights import ROPE, arrays, block_arrays, state_dict


def ort_nbytes(value) -> int:
    """An OrtValue's bytes where it lives (on a GPU too: read off its shape and ONNX type, no copy)."""
    return int(np.prod(value.shape())) * _itemsize(value.data_type())


@functools.cache
def _itemsize(data_type: str) -> int:
    """The element size of an OrtValue's data_type(), "tensor(float)" -> 4, by onnx's own type table."""
    from onnx import TensorProto, helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.DataType.Value(data_type[7:-1].upper()))).itemsize


PREPACK_MB = 128   # a model's float32 product weights its stacked sessions may prepack, all together (Weights.prepacks)
IN_PLACE = 1 << 16  # bytes: a weight this small is opened as an initializer even where onnxruntime copies it (unaligned)


class Weights:
    """A model's arrays as sessions bind them, by graph-input name (model/weights.arrays; the layer graphs' "block.*"
    and RoPE names through block_arrays, for the layer a run names): each an OrtValue over the array's own memory,
    made on first use and kept (a view of the weight store stays one: nothing is copied, and a bfloat16 weight is
    bound as bfloat16, widened inside the graph)."""

    def __init__(self, model, device: str = "cpu"):
        """device: where the OrtValues live: "cpu" (views of the arrays), or "cuda" (each copied to the GPU once, when
        first bound or placed, and kept there: runs then move only their own inputs and outputs). An array bound under
        two names (the stacked graph's "blocks.3.mlp.up.weight", the layer graphs' "block.mlp.up.weight" of layer 3;
        a RoPE table every layer reads) is one OrtValue: on a GPU one copy, not one per name."""
        self.model, self.device = model, device
        self.named = arrays(model)
        self._layers: dict[int, dict[str, np.ndarray]] = {}
        self._quantised: dict[int, dict] = {}
        self._values: dict[tuple[str, int | None], object] = {}
        self._placed: dict[int, object] = {}          # id(array) -> its OrtValue (the model keeps the arrays alive)
        self._lock = threading.Lock()
        self._wide: dict[tuple[str, int | None], object] = {}   # widened copies kept for the runs `widening` spans
        self._wide_bytes, self._widening, self._budget = 0, 0, 0
        self.prepack_bytes, self.prepacked = 0, 0       # what sessions may prepack (bytes), and have (prepacks)

    def layer(self, layer: int) -> dict[str, np.ndarray]:
        """Layer `layer`'s arrays under the layer graphs' names."""
        if layer not in self._layers:
            self._layers[layer] = block_arrays(self.model, layer)
        return self._layers[layer]

    def quantised(self, layer: int) -> dict:
        """Layer `layer`'s quantised weights whole (model/quantized.Blocks), under the layer graphs' names: what a
        wide graph reads as one float input each (the other graphs bind their parts, `layer`)."""
        if layer not in self._quantised:
            prefix = f"blocks.{layer}."
            self._quantised[layer] = {"block." + name[len(prefix):]: w for name, w in state_dict(self.model).items()
                                      if name.startswith(prefix) and isinstance(w, Blocks)}
        return self._quantised[layer]

    def binds(self, name: str) -> bool:
        """Whether a graph input of this name is one of the model's arrays (not a run's own input)."""
        name = name.removesuffix(PACKED_SUFFIX)
        return name in self.named or name.startswith("block.") or name in ROPE

    def array(self, name: str, layer: int | None = None) -> np.ndarray:
        """The array bound to input `name`: a packed graph's initializer-to-be (graphs/builder.initialized) is the
        array it names, where its session binds it instead (on a GPU); a wide graph's quantised weight, read whole,
        is its Blocks (model/quantized.py), which `value` binds de-quantised."""
        name = name.removesuffix(PACKED_SUFFIX)
        if layer is not None and (name.startswith("block.") or name in ROPE):
            arrays = self.layer(layer)
            return arrays[name] if name in arrays else self.quantised(layer)[name]
        if name.startswith("block."):
            raise ValueError(f"{name} is a layer graph's weight: name the layer whose weights to bind")
        return self.named[name]

    def value(self, name: str, layer: int | None = None, wide: bool = False):
        """The OrtValue bound to input `name` (of layer `layer` in a layer graph); wide: a bfloat16 or float16 array
        widened to float32, or a quantised weight de-quantised (graphs/builder.Graph's `wide` inputs): kept while
        `widening` spans the runs, as its budget allows, else made for this run alone."""
        key = (name, layer if name.startswith("block.") or name in ROPE else None)
        if wide and narrow(self.array(*key)):
            return self._widened(key)
        v = self._values.get(key)
        if v is None:
            with self._lock:
                v = self._values.get(key)
                if v is None:
                    a = self.array(*key)
                    v = self._placed.get(id(a))
                    if v is None:
                        v = self._placed[id(a)] = ort_value(a, self.device)
                    self._values[key] = v
        return v

    def prepacks(self, products: list[str], others: Sequence[str] = ()) -> list[str]:
        """Which of a stacked graph's float32 inputs its session opens as initializers (runtime/options.open_session's
        prepack): its product weights, which onnxruntime prepacks, all of them while the copies fit what is left of
        `prepack_bytes` (each counted at its array's size: onnxruntime's packed copy is about as big), none past it;
        and with them the model's float32 arrays among `others` (options.unmultiplied: norms, biases, an untied
        embedding), those onnxruntime reads in place: 64-byte aligned ones, and small ones (it copies the others:
        MiniLM's word embeddings, 47 MB at an offset of 24 in its file, stay bound, as do its position embeddings).
        On the CPU only: a GPU's session reads the weights placed there."""
        arrays = [self.array(n) for n in products]
        if self.device != "cpu" or any(a.dtype != COMPUTE for a in arrays):
            return []
        need = sum(a.nbytes for a in arrays)
        with self._lock:
            if self.prepacked + need > self.prepack_bytes:
                return []
            self.prepacked += need
        return list(products) + [n for n in others if n in self.named and self.named[n].dtype == COMPUTE
                                 and (self.named[n].ctypes.data % 64 == 0 or self.named[n].nbytes <= IN_PLACE)]

    @contextmanager
    def widening(self, budget_bytes: int):
        """While this lasts (runs that multiply by the same layers' weights many times: a patching request's batches),
        the widened copies that wide graphs bind are made once each and kept, up to budget_bytes in all (past it,
        each run widens its own). Re-entrant; the copies are dropped when the outermost one ends."""
        with self._lock:
            self._widening += 1
            self._budget = max(self._budget, int(budget_bytes))
        try:
            yield
        finally:
            with self._lock:
                self._widening -= 1
                if not self._widening:
                    self._wide.clear()
                    self._wide_bytes = self._budget = 0

    def _widened(self, key):
        v = self._wide.get(key)
        if v is not None:
            return v
        a = self.array(*key)
        v = ort_value(widen(a), self.device)
        with self._lock:
            if self._widening and key not in self._wide and self._wide_bytes + a.size * COMPUTE.itemsize <= self._budget:
                v = self._wide.setdefault(key, v)
                self._wide_bytes += a.size * COMPUTE.itemsize
        return v

    def place(self) -> int:
        """Every array on the device now, under every name a graph binds it by (a server's start: on a GPU the
        weights are copied there before the first request, not inside it); returns the bytes placed."""
        for name in self.named:
            self.value(name)
        for layer in range(len(getattr(self.model, "blocks", ()))):
            for name in self.layer(layer):
                self.value(name, layer)
        return sum(ort_nbytes(v) for v in self._placed.values())


def ort_value(a: np.ndarray, device: str = "cpu"):
    """An OrtValue of a: on the CPU over a's memory (no copy: a must stay alive, as the model keeps its arrays), on a
    GPU a copy there; in a's type, types NumPy lacks (bfloat16, from ml_dtypes) by their ONNX type over the same
    bits."""
    import onnxruntime as ort
    from ..graphs.builder import onnx_type

    a = np.ascontiguousarray(a)
    native = a.dtype in (COMPUTE, INDEX, np.dtype(np.float16))
    if device == "cpu":
        return ort.OrtValue.ortvalue_from_numpy(a) if native else \
            ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.dtype(f"u{a.dtype.itemsize}")), onnx_type(a.dtype))
    if native:
        return ort.OrtValue.ortvalue_from_numpy(a, device, 0)
    v = ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), onnx_type(a.dtype), device, 0)
    v.update_inplace(a.view(np.dtype(f"u{a.dtype.itemsize}")))
    return v


class Held:
    """A run's output left where its session computes, for a later run to read (Session.run's keep), or an input
    placed there once for many runs (`hold`): an OrtValue (`value`) in the device's memory, bound as it is on either
    device; on the CPU over a NumPy array (`array`, the same memory). `host()` reads it back, counted as fetched by the
    session that made it."""
    __slots__ = ("value", "array", "session")

    def __init__(self, value, array: np.ndarray | None, session=None):
        """session: the runtime/sessions.Session whose run made it (its reads back are counted there), or None."""
        self.value, self.array, self.session = value, array, session

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape if self.array is not None else tuple(self.value.shape())

    @property
    def nbytes(self) -> int:
        """Its bytes where it is kept."""
        return ort_nbytes(self.value)

    def host(self) -> np.ndarray:
        """The tensor as a NumPy array on the host (on the CPU: itself; from a GPU: a copy)."""
        out = self.array if self.array is not None else self.value.numpy()
        if self.session is not None:
            self.session.count_fetched(out.nbytes)
        return out


def hold(a: np.ndarray, device: str) -> Held:
    """An input many runs read (a long text's mask, its pooling matrix), put on the device once: a NumPy array fed
    to a GPU session is copied there at every run (a 2048-token mask: 16 MB a layer)."""
    a = np.ascontiguousarray(a)
    return Held(ort_value(a, device), a if device == "cpu" else None)


def empty(shape: Sequence[int], dtype: np.dtype, session=None) -> Held:
    """An uninitialised CPU tensor for a run to write (Session.run's keep), in memory of its own: a view of
    onnxruntime's arena, kept alive (a long run's checkpoints are its kept x, alive as long as its cached result),
    would grow the arena for good."""
    import onnxruntime as ort

    a = np.empty(shape, dtype)
    return Held(ort.OrtValue.ortvalue_from_numpy(a), a, session)


class Scratch:
    """Memory for outputs a run must write but nobody reads: a graph cut after a request's last layer still returns
    every block's attention, and the blocks a request did not ask for go here. The buffers are reused run after run
    (their pages are faulted in once: a fresh [L, H, T, T] array, faulted in page by page by the run's threads, was
    ~5 ms of a 14 ms MiniLM run in the server, bench/answer.py), and one is lent per run, so runs at once never share
    one; as many are kept as ran at once, each as big as its biggest use."""

    def __init__(self):
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    @contextmanager
    def lend(self, shape: Sequence[int], dtype=COMPUTE):
        """A [shape] array of undefined contents, the caller's until the block ends."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        with self._lock:
            buffer = self._free.pop() if self._free else np.empty(0, np.uint8)
        if buffer.nbytes < nbytes:
            buffer = np.empty(nbytes, np.uint8)
        try:
            yield buffer[:nbytes].view(dtype).reshape(shape)
        finally:
            with self._lock:
                self._free.append(buffer)


SCRATCH = Scratch()


class Reserve:
    """Memory for the outputs a run hands back (its result, kept by the server's cache), faulted in before the run.
    A fresh array's pages are faulted in one by one by the first writes: onnxruntime's threads, in the middle of the
    run, both taking the process's memory lock (MiniLM's last-layer answer at 128 tokens: 192 faults, its run 0.2-0.5
    ms longer on a 2-core VM: bench/ab.py). `take` hands out a buffer written through beforehand, when one of the
    size is ready (else np.empty's, as without the reserve). A thread of the reserve's own writes the next ones while
    the cores are idle: when no run is under way (`running`) and none has ended for QUIET seconds, so it takes no
    core from a run or from the answer being built; under a load that leaves no such pause it writes nothing. It keeps
    one buffer for each of the last few sizes taken (MAX_KINDS), each of MIN_BYTES or more, MAX_BYTES in all. A buffer
    is the size rounded up to one of eight classes per power of two, so texts a few tokens apart share one; an output
    is a view of it and holds it (the result cache charges the buffer: at most 1/8 more than the output)."""

    MIN_BYTES, MAX_BYTES, MAX_KINDS, QUIET = 1 << 18, 32 << 20, 4, 0.01

    def __init__(self):
        self._forked()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:        # a forked child (a corpus worker) has no such thread: it starts its own
        self._ready: dict[int, np.ndarray] = {}       # size class -> a buffer written through
        self._wanted: list[int] = []                  # the classes taken lately, the latest last
        self._runs, self._ended = 0, 0.0              # runs under way; when the last one ended (time.monotonic)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    @staticmethod
    def size_class(nbytes: int) -> int:
        step = max(1 << 12, 1 << max(nbytes.bit_length() - 4, 0))      # eight classes per power of two, pages
        return -(-nbytes // step) * step

    def take(self, shape: Sequence[int], dtype) -> np.ndarray:
        """An uninitialised [shape] array (np.empty's), over memory faulted in already when the reserve has it."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not self.MIN_BYTES <= nbytes <= self.MAX_BYTES:
            return np.empty(shape, dtype)
        kind = self.size_class(nbytes)
        with self._changed:
            buffer = self._ready.pop(kind, None)
            if kind in self._wanted:
                self._wanted.remove(kind)
            self._wanted = self._wanted[1 - self.MAX_KINDS:] + [kind]
            for old in [k for k in self._ready if k not in self._wanted]:    # ready ones of classes no longer wanted
                del self._ready[old]
        if buffer is None:
            return np.empty(shape, dtype)
        return buffer[:nbytes].view(dtype).reshape(shape)

    @contextmanager
    def running(self):
        """A run under way (Session.run): the reserve writes nothing until it is over (and QUIET after)."""
        with self._changed:
            self._runs += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._fill, name="attnscope-reserve", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._changed:
                self._runs -= 1
                self._ended = time.monotonic()
                if self._missing() is not None:      # the thread sleeps unless there is something to write: a run
                    self._changed.notify()           # of many's small runs wake nothing

    def _missing(self) -> int | None:
        """The latest class taken that has no buffer ready, within MAX_BYTES."""
        budget = self.MAX_BYTES - sum(self._ready)
        return next((k for k in reversed(self._wanted) if k not in self._ready and k <= budget), None)

    def _next(self) -> int:
        """Waits until a buffer is missing and the cores have been idle QUIET seconds; its size class."""
        with self._changed:
            while True:
                kind = self._missing()
                wait = None if kind is None or self._runs else self._ended + self.QUIET - time.monotonic()
                if wait is not None and wait <= 0:
                    return kind
                self._changed.wait(wait)

    def _fill(self) -> None:
        while True:
            kind = self._next()
            buffer = np.empty(kind, np.uint8)
            ctypes.memset(buffer.ctypes.data, 0, kind)         # faulted in here, without the GIL (a ctypes call)
            with self._changed:
                if kind in self._wanted:
                    self._ready[kind] = buffer


RESERVE = Reserve()
