"""onnxruntime sessions: one set of options, the weights every run binds, outputs that own their memory.

Every session the app opens is a `Session` (opened by `open_session`'s options): the served graphs (the stacked one,
its cut and teaching-stages variants), the decoding step, an encoder-decoder's graph and the small graphs of a
layer-by-layer run. No graph holds a weight (graphs/builder.py): each reads the model's arrays as inputs, bound at
every run as OrtValues over the arrays' own memory (views of the weight store, made once by `Weights` and looked up
once by each session: nothing is copied). Where a session opens some of them as initializers instead, which
onnxruntime prepacks (a small model's float32 product weights within ATTNSCOPE_PREPACK_MB, a GGUF model's decoding
step's blocks; never under a capped arena), they are still the model's arrays, given to the session over their own
memory, and onnxruntime keeps its packed copy. What differs between sessions is stated where they are opened.

    weights = Weights(model)
    sess = Session(graph, providers, threads, weights)
    hidden, attentions = sess.run(["hidden", "attentions"], feeds)        # feeds: the run's own inputs only
    q, k, v = sess.run(list("qkv"), {"x": x}, layer=3, keep="qkv")       # a layer graph: layer 3's weights; q, k, v
    ctx, entropy = attend.run(["ctx", "entropy"], {"q": q, ...}, keep=["ctx"])   # stay on the device (Held)

What leaves the device is what the caller asks for as NumPy: outputs it keeps (`keep`) stay where the session
computes, as `Held` tensors the next run reads in place (on a GPU: device memory; on the CPU: NumPy buffers, the same
binding calls), and `Session.fetched` counts the bytes that come to the host (tests/test_long.py holds a long run
and a generation to exactly what their answers hold). Every run flushes float32 denormals to zero
(`denormals_flushed`, the note above it).

Opened with runtime/options.py's open_session (providers, options, the shared arena); what its runs bind and keep is
runtime/tensors.py's (Weights, Held, the scratch memory).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import platform
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import numpy as np

from ..model.precision import COMPUTE, INDEX, narrow
from .options import (default_providers, device_of, on_core, open_session, out_of_memory, placement, release_arena,
                      set_placement, share_arena)
from .tensors import RESERVE, SCRATCH, Held, Weights, empty

_DTYPES = {"tensor(float)": COMPUTE, "tensor(float16)": np.dtype(np.float16), "tensor(int64)": INDEX}


# Denormals. A float32 below 2^-126 (1.2e-38) is a denormal, and arithmetic on one costs x86 cores ~100 times a
# normal number's. A head's attention weights land there wherever a score is 87-104 below its row's largest: a very
# peaked head's do by the million. A block of 1408 x 1408 queries and keys of such a head (softmax, weighted values,
# pooling; one core) took 35 ms where an unpeaked one took 11, and 7 ms with the flush; the page's first request on
# a 32,000-token text, every head of the peaked 2-layer model of tests/browser/test_long_overview.py with its
# statistics and thumbnails, 47 s -> 7.7 s on one core. The zoo's models at 4,096 tokens have few such weights and
# run as fast either way (bench/long_context.py --denormals both). So every run flushes them to zero, as inference
# engines commonly do: onnxruntime's own option for its pool's threads, and the thread that calls the run, set for
# the run's duration (denormals_flushed). A weight under 1.2e-38 becomes 0: below what any statistic, a float32 sum
# of a row or the float16 the page is sent (its smallest 6e-8, kept: the cast's float16 subnormals are not flushed)
# can tell from 0.
FLUSH_DENORMALS = True          # False: runs keep them (bench/long_context.py --denormals kept, to measure the flush)
_MXCSR_FLUSH = 0x8040           # x86's MXCSR: flush-to-zero (bit 15) and denormals-are-zero (bit 6)
_MXCSR_AT = 28                  # its offset in fenv_t, glibc's and musl's on x86-64 alike


@functools.cache
def _libm():
    """The C library's floating-point environment calls, where this process can set MXCSR through them (Linux on
    x86-64), checked once: a denormal times 1 in NumPy is 0 with the flush set, itself with it cleared. None
    elsewhere: runs then keep denormals (slower on a peaked head, the same numbers to float32's precision)."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        tiny = np.full(4, 1e-39, np.float32)
        with _kept(libm):
            _set_flush(libm, True)
            flushed = not (tiny * np.float32(1)).any()
            _set_flush(libm, False)
            kept = bool((tiny * np.float32(1)).all())
        return libm if flushed and kept else None
    except (OSError, AttributeError):
        return None


def _environment(libm):
    """This thread's fenv_t (32 bytes on x86-64; room to spare)."""
    env = (ctypes.c_uint8 * 64)()
    if libm.fegetenv(env) != 0:
        raise OSError("fegetenv failed")
    return env


def _set_flush(libm, on: bool) -> None:
    """Set (or clear) this thread's flush-to-zero and denormals-are-zero."""
    env = _environment(libm)
    mxcsr = int.from_bytes(bytes(env[_MXCSR_AT:_MXCSR_AT + 4]), "little")
    mxcsr = mxcsr | _MXCSR_FLUSH if on else mxcsr & ~_MXCSR_FLUSH
    env[_MXCSR_AT:_MXCSR_AT + 4] = list(mxcsr.to_bytes(4, "little"))
    if libm.fesetenv(env) != 0:
        raise OSError("fesetenv failed")


@contextmanager
def _kept(libm):
    """This thread's floating-point environment, put back at the context's end."""
    saved = _environment(libm)
    try:
        yield
    finally:
        libm.fesetenv(saved)


def flushing() -> bool:
    """Whether runs flush denormals: FLUSH_DENORMALS, where this thread's environment can be set and put back (_libm).
    Sessions ask onnxruntime's flush only then: elsewhere it would flush their opener's thread for good."""
    return FLUSH_DENORMALS and _libm() is not None


@contextmanager
def denormals_flushed():
    """A context in which this thread flushes denormals to zero (the note above); the thread's own environment is
    back at its end. ~3 us a use."""
    libm = _libm() if flushing() else None
    if libm is None:
        yield
        return
    with _kept(libm):
        _set_flush(libm, True)
        yield


@contextmanager
def environment_kept():
    """A context whose end puts back this thread's floating-point environment: onnxruntime sets flush-to-zero on the
    thread that opens the process's first session, for good, when that session asks the flush (open_session); the
    thread is the caller's (a notebook's, the server's event loop), whose NumPy must keep its denormals."""
    libm = _libm()
    if libm is None:
        yield
        return
    with _kept(libm):
        yield


class Session:
    """One onnxruntime session (open_session's options) and the model arrays its graph reads, bound at every run.

    run(names, feeds) -> the named outputs as NumPy arrays that own their memory (onnxruntime's own outputs are views
    into its arena, and each one kept alive -- cached, queued, being sent -- grew the arena for good: 32 held
    512-token results left a server at 2.9 GB idle). Each output is bound to a NumPy buffer of the shape the graph
    declares (its named axes sized by `axes`), or to the buffer `into` gives it (a slice of a bigger array: the graph
    writes it in place); one that cannot be sized is copied out. feeds may hold more than the graph reads; layer:
    which layer's weights a layer graph binds; release: give the memory arena back at the end of the run; drop:
    outputs the graph must write but the caller never reads (the blocks a request did not ask for), left where the
    session computes (on a GPU: device memory, never copied to the host; on the CPU: scratch memory), returned as
    None; keep: outputs the caller feeds to a later run, left on the device as `Held` tensors (a GPU's memory, never
    copied to the host; on the CPU a NumPy array like any output), while feeds may be `Held` (bound where they are).
    `fetched` counts the bytes of the outputs a run hands back to the host, session by session, and those of a kept
    output read back (`Held.host`): what leaves the device is what the answer holds (issue 38)."""

    def __init__(self, graph: Path | bytes, providers: Sequence[str], threads: int, weights: Weights | None = None,
                 packed: bool = False, prepack: bool = False, **options):
        """packed: the graph is a packed one (graphs/builder.Graph's packed: graphs/decoding.packs), whose quantised
        weights' parts are opened as initializers where they live on the CPU (else bound like any weight); prepack: a
        stacked graph whose float32 product weights are opened as initializers too, which onnxruntime prepacks, as far
        as the model's budget goes, and its other float32 weights with them (Weights.prepacks); options:
        open_session's (arena, mem_pattern, compute_dtype)."""
        on_cpu = device_of(providers) == "cpu"
        cpu = weights is not None and on_cpu
        initial = weights.value if cpu and (packed or prepack) else None
        # the pool's threads one on each core but the first, where the runs' callers go (options.placement)
        self.caller, pool = placement(threads) if on_cpu else (None, ())
        with environment_kept():
            self.ort = open_session(graph, providers, threads, initial=initial, flush_denormals=flushing(),
                                    prepack=weights.prepacks if cpu and prepack else None, pool=pool, **options)
        self.arena = options.get("arena", True)      # a run's `release` shrinks the arena: none to shrink without
        self.weights = weights
        self.inputs = {i.name for i in self.ort.get_inputs()}
        self.bound = sorted(n for n in self.inputs if weights is not None and weights.binds(n))
        self._own_inputs = [i for i in self.ort.get_inputs() if i.name not in self.bound]   # asked at every run
        self.wide = {i.name for i in self.ort.get_inputs() if i.name in self.bound and i.type == "tensor(float)"}
        self._binds: dict[int | None, tuple[list, list[str]]] = {}    # layer -> the weights' binding (`_weights`)
        self.input_names = [i.name for i in self._own_inputs]
        # each output's declared shape (its named axes by name) and NumPy dtype, in the graph's order, read once: each
        # read of a NodeArg calls into onnxruntime
        self.declared = {o.name: (list(o.shape or []), _DTYPES.get(o.type)) for o in self.ort.get_outputs()}
        self.device = device_of(providers)
        self.fetched = 0                              # bytes of outputs handed back by this session's runs
        self.runs = 0                                 # runs made (on a GPU each costs a launch and a synchronisation)
        self.resized = 0                              # runs made twice: an output's declared shape was not its own
        self._count = threading.Lock()

    def count_fetched(self, nbytes: int) -> None:
        """A kept output's bytes read back to the host (Held.host)."""
        with self._count:
            self.fetched += nbytes

    def get_providers(self) -> list[str]:
        return self.ort.get_providers()

    def get_inputs(self):
        """The run's own inputs (the model's arrays are bound, not fed)."""
        return list(self._own_inputs)

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray], *, layer: int | None = None,
            axes: dict[str, int] | None = None, into: dict[str, np.ndarray] | None = None,
            release: bool = False, drop: Sequence[str] = (), keep: Sequence[str] = ()) -> list:
        names = list(self.declared) if names is None else list(names)
        try:
            with RESERVE.running(), on_core(self.caller), denormals_flushed():
                if drop:
                    with self._unread(drop, axes or {}) as unread:
                        return self._run(names, feeds, layer, axes, into, release, unread, set(keep))
                return self._run(names, feeds, layer, axes, into, release, {}, set(keep))
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own error types
            refused = out_of_memory(e, self.device)
            if refused is not None:        # this run alone: what it allocated is back in the arena for the next
                raise refused from None
            raise

    @contextmanager
    def _unread(self, drop: Sequence[str], axes: dict[str, int]):
        """name -> where a dropped output goes: "cuda" (device memory onnxruntime allocates), or a view of one
        scratch buffer lent for the run (dropped outputs are never read, so they may share it)."""
        if self.device != "cpu":
            yield dict.fromkeys(drop, self.device)
            return
        shapes = {n: [d if isinstance(d, int) else axes[d] for d in self.declared[n][0]] for n in drop}
        with SCRATCH.lend([max(map(math.prod, shapes.values()))]) as buffer:
            yield {n: buffer[:math.prod(s)].reshape(s) for n, s in shapes.items()}

    def _weights(self, layer: int | None) -> tuple[list, list[str]]:
        """What a run binds of the model's arrays (of layer `layer`, in a layer graph): the OrtValues that stay as they
        are, looked up on the first run and kept by the session (Weights makes each once and never replaces it), and
        the names of the bfloat16, float16 or quantised arrays a float32 input widens, which Weights gives per run (a
        widened copy is kept only while `Weights.widening` lasts)."""
        binds = self._binds.get(layer)
        if binds is None:
            w = self.weights
            widened = [n for n in self.bound if n in self.wide and narrow(w.array(n, layer))]
            binds = self._binds[layer] = ([(n, w.value(n, layer)) for n in self.bound if n not in widened], widened)
        return binds

    def _run(self, names, feeds, layer, axes, into, release, unread: dict, keep: set) -> list:
        binding, own, axes, held = self.ort.io_binding(), dict(into or {}), axes or {}, {}
        for key, value in feeds.items():
            if key in self.inputs and key not in self.bound:
                if isinstance(value, Held):
                    binding.bind_ortvalue_input(key, value.value)
                else:
                    binding.bind_cpu_input(key, np.ascontiguousarray(value))
        kept, widened = self._weights(layer)
        for name, value in kept:
            binding.bind_ortvalue_input(name, value)
        for name in widened:
            binding.bind_ortvalue_input(name, self.weights.value(name, layer, True))
        for name in names:
            declared, dtype = self.declared[name]
            shape = [d if isinstance(d, int) else axes.get(d) for d in (declared or [None])]
            if name in keep:                 # on the device: on a GPU from the session's memory arena; on the CPU in
                if self.device == "cpu" and None not in shape and dtype is not None:     # a NumPy buffer of its own
                    held[name] = empty(shape, dtype, self)
                    binding.bind_ortvalue_output(name, held[name].value)
                else:
                    binding.bind_output(name, self.device, 0)
            elif name in unread:
                where = unread[name]
                if isinstance(where, str):
                    binding.bind_output(name, where, 0)
                else:
                    binding.bind_output(name, "cpu", 0, where.dtype, where.shape, where.ctypes.data)
            elif name in own:
                binding.bind_output(name, "cpu", 0, own[name].dtype, own[name].shape, own[name].ctypes.data)
            elif None in shape or dtype is None:
                binding.bind_output(name, "cpu")
            else:
                own[name] = RESERVE.take(shape, dtype)         # faulted in already, where the reserve has it
                binding.bind_output(name, "cpu", 0, dtype, shape, own[name].ctypes.data)
        options = release_arena() if release and self.arena else None
        try:
            self.ort.run_with_iobinding(binding, options)
        except Exception as e:  # noqa: BLE001 - a declared shape that was not the real one: let onnxruntime size them
            if out_of_memory(e, self.device):
                raise
            with self._count:
                self.resized += 1
            binding.clear_binding_outputs()
            held = {}
            for name in names:
                binding.bind_output(name, self.device if name in keep else "cpu", 0)
            self.ort.run_with_iobinding(binding, options)
            values = dict(zip(names, binding.get_outputs()))
            for name, buffer in (into or {}).items():
                buffer[...] = values[name].numpy()
            outs = [None if n in unread else into[n] if into and n in into else
                    values[n] if n in keep else np.array(values[n].numpy()) for n in names]
        else:
            fetch = any(n not in unread and n not in held and (n in keep or n not in own) for n in names)
            values = dict(zip(names, binding.get_outputs())) if fetch else {}   # none to fetch: all in our buffers
            outs = [None if n in unread else held[n] if n in held else values[n] if n in keep else own[n] if n in own
                    else np.array(values[n].numpy()) for n in names]
        outs = [Held(o, o.numpy() if self.device == "cpu" else None, self) if n in keep and not isinstance(o, Held)
                else o for n, o in zip(names, outs)]      # kept outputs onnxruntime had to size itself
        with self._count:
            self.fetched += sum(o.nbytes for o in outs if isinstance(o, np.ndarray))
            self.runs += 1
        return outs


@functools.cache
def _cast_session():
    """A one-node onnxruntime graph, Cast(float32 -> float16), on the exporter's opset and IR version. No arena:
    it would keep its peak (tens of MB per concurrent cast) for good. A server opens it at start (open_helpers)."""
    from onnx import TensorProto, helper

    from ..graphs.builder import Graph, model_proto

    g = Graph()
    g.op("Cast", "x", to=TensorProto.FLOAT16, out="y")
    proto = model_proto(g, [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], "to_float16")
    with environment_kept():
        return open_session(proto.SerializeToString(), ["CPUExecutionProvider"], 0, arena=False,
                            flush_denormals=flushing())


def open_helpers(arena_mb: float | None = None, providers: Sequence[str] = (), place_threads: bool = True) -> None:
    """Set up what the process's sessions share: the capped arena (share_arena, before any session opens), whether
    they place their threads (set_placement), and the helper graphs (the float16 cast), opened now so that no request
    builds one."""
    set_placement(place_threads)
    share_arena(arena_mb, providers or default_providers())
    _cast_session()


def to_float16(a: np.ndarray) -> np.ndarray:
    """float32 -> float16, bit for bit what numpy gives, but through onnxruntime's Cast: numpy takes a slow path
    for results below float16's normal range, and a quarter of attention weights land there (358 ms vs 2-13 ms
    for 512 tokens x 72 heads)."""
    with denormals_flushed():
        return _cast_session().run(None, {"x": np.ascontiguousarray(a, COMPUTE)})[0]
