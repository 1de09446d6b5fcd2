"""onnxruntime sessions: one set of options, the weights every run binds, outputs that own their memory.

Every session the app opens is a `Session` (opened by `open_session`'s options): the served graphs (the stacked one,
its cut and teaching-stages variants), the decoding step, an encoder-decoder's graph and the small graphs of a
layer-by-layer run. No graph holds a weight (graphs/builder.py): each reads the model's arrays as inputs, and
`Weights` binds them at every run, as OrtValues over the arrays' own memory (views of the weight store, made once:
nothing is copied). What differs between sessions is stated where they are opened.

    weights = Weights(model)
    sess = Session(graph, providers, threads, weights)
    hidden, attentions = sess.run(["hidden", "attentions"], feeds)        # feeds: the run's own inputs only
    q, k, v = sess.run(list("qkv"), {"x": x}, layer=3, keep="qkv")       # a layer graph: layer 3's weights; q, k, v
    ctx, entropy = attend.run(["ctx", "entropy"], {"q": q, ...}, keep=["ctx"])   # stay on the device (Held)

What leaves the device is what the caller asks for as NumPy: outputs it keeps (`keep`) stay where the session
computes, as `Held` tensors the next run reads in place (on a GPU: device memory; on the CPU: NumPy buffers, the same
binding calls), and `Session.fetched` counts the bytes that come to the host (tests/test_long.py holds a long run
and a generation to exactly what their answers hold).
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import numpy as np

from ..model.precision import COMPUTE, INDEX
from ..model.weights import ROPE, arrays, block_arrays
from .errors import OutOfMemory


# Attention is computed a group of heads (a long text, runtime/layerwise.py) or a chunk of the prompt (generation,
# runtime/generation.py) at a time, its [h, T, T] (or [H, chunk, T]) float32 within this many MB: buffers near the CPU's
# cache size. SmolLM2 on a 2-core AMD EPYC VM (32 MB L3), a layer-by-layer run against a plain one
# (bench/long_input.py --group-mb): 256 MB groups 1.37x at 1024 tokens, 1.44x at 2048, 1.70x at 4096; 8 MB groups
# 1.14x, 1.16-1.26x and 1.43x (512 tokens, where 9 heads take 9.4 MB: 1.29x both); a 2000-token prompt's prefill
# 3.0-6.8 s in 256 MB chunks, 1.8-1.9 s in 8 MB ones.
GROUP_MB = 8


def cores() -> int:
    """CPU cores this process may use (its affinity mask, not the machine's count)."""
    import os
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_providers() -> list[str]:
    """CUDA first where onnxruntime-gpu and a GPU are present, the CPU always."""
    import onnxruntime as ort
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def check_providers(providers: Sequence[str]) -> None:
    """A provider this onnxruntime does not have is a bad option (ValueError), never a reason to rebuild a graph."""
    import onnxruntime as ort
    available = ort.get_available_providers()
    unknown = [p for p in providers if p not in available]
    if unknown:
        raise ValueError(f"execution provider(s) {unknown} are not available in this onnxruntime; "
                         f"available: {available}")


def check_compute_dtype(compute_dtype: str, providers: Sequence[str]) -> None:
    """A mode the device cannot run is a bad option (ValueError, naming what runs it): TF32 and bfloat16 products
    need the CUDA provider (the CPU provider multiplies in float32, and has no bfloat16 MatMul); float16 runs on
    either (onnxruntime's CPU provider has float16 MatMul and Gemm)."""
    from ..model.precision import COMPUTE_DTYPES
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}; got {compute_dtype!r}")
    if compute_dtype in ("tf32", "bfloat16") and device_of(providers) != "cuda":
        raise ValueError(f"compute_dtype {compute_dtype} needs the CUDA execution provider (onnxruntime-gpu and a "
                         f"GPU); these providers ({', '.join(providers) or 'none'}) run float32 or float16 only")


def provider_options(providers: Sequence[str], compute_dtype: str = "float32", device_id: int = 0) -> list:
    """What each execution provider is asked for. CUDA: use_tf32=0 unless the TF32 mode is asked -- its default
    multiplies float32 matrices in TF32 (10 mantissa bits): attention probabilities 0.064-0.091 off torch float32 on
    an H200 (128-2048 tokens, SmolLM2's shape), 9.6e-5 off onnxruntime-CPU with it off -- on `device_id`. (The
    float16 and bfloat16 modes are graphs: their float32 parts stay exact.)"""
    tf32 = "1" if compute_dtype == "tf32" else "0"
    return [(p, {"use_tf32": tf32, "device_id": str(device_id)}) if p == "CUDAExecutionProvider"
            else p for p in providers]


def device_of(providers: Sequence[str]) -> str:
    """Where a session with these providers keeps its tensors: "cuda" when the CUDA provider is first and available,
    else "cpu"."""
    import onnxruntime as ort
    first = next(iter(providers), "CPUExecutionProvider")
    return "cuda" if first == "CUDAExecutionProvider" and first in ort.get_available_providers() else "cpu"


# The arena every session shares when the server caps it (share_arena): device -> its cap in bytes.
_SHARED: dict[str, int] = {}


def share_arena(mb: float | None, providers: Sequence[str]) -> None:
    """Cap what onnxruntime's sessions may hold for their runs' tensors (intermediates, outputs left on the device),
    all sessions together, at `mb` MB on the device they run on: one memory arena of that size, registered with
    onnxruntime's environment, that every session opened after this shares (the model's weights are the model's,
    outside it). A run that needs more fails at once, for that run only (OutOfMemory: the server answers 507 and
    serves the next request), where without a cap it takes whatever the device has: on a GPU the arena grows until
    the device is full, on the CPU until the kernel's out-of-memory killer ends the process. None: no cap. Process-
    wide, as onnxruntime's environment is: a second cap on the same device must be the same."""
    if not mb:
        return
    import onnxruntime as ort
    device, limit = device_of(providers), int(mb * 2**20)
    if device in _SHARED:
        if _SHARED[device] != limit:
            raise ValueError(f"this process already caps onnxruntime's {device} arena at "
                             f"{_SHARED[device] / 2**20:g} MB; it cannot take {mb:g} MB too")
        return
    provider, name = ("CUDAExecutionProvider", "Cuda") if device == "cuda" else ("CPUExecutionProvider", "Cpu")
    info = ort.OrtMemoryInfo(name, ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    # the arena grows by what a run asks, not by powers of two: a cap is then what runs may hold, not a chunk size
    cfg = ort.OrtArenaCfg({"max_mem": limit, "arena_extend_strategy": 1})
    ort.create_and_register_allocator_v2(provider, info, {"device_id": "0"} if device == "cuda" else {}, cfg)
    _SHARED[device] = limit


# What onnxruntime says when an allocation fails: its arena's cap ("Available memory of N is smaller than requested
# bytes of M"), the device's memory (BFCArena: "Failed to allocate memory for requested buffer of size N"; CUDA:
# "CUDA failure 2: out of memory"; cuBLAS/cuDNN workspaces: "..._STATUS_ALLOC_FAILED"), the host's (std::bad_alloc).
_OUT_OF_MEMORY = ("is smaller than requested bytes", "Failed to allocate memory", "out of memory", "ALLOC_FAILED",
                  "bad_alloc", "bad allocation")


def out_of_memory(error: BaseException, device: str) -> OutOfMemory | None:
    """The OutOfMemory a failed run's onnxruntime error means, naming what to change; None for any other error."""
    import re

    text = str(error)
    said = next((s for s in _OUT_OF_MEMORY if s in text), None)
    if said is None:
        return None
    where = "the GPU" if device == "cuda" else "this machine"
    cap = _SHARED.get(device)
    limit = (f"the {cap / 2**20:g} MB that onnxruntime's runs may hold (ATTNSCOPE_ARENA_MB)" if cap else
             f"the memory {where} has free")
    mb = lambda n: f"{int(n) / 2**20:,.1f} MB"   # noqa: E731
    if m := re.search(r"Available memory of (\d+) is smaller than requested bytes of (\d+)", text):
        clause = f"a {mb(m[2])} tensor, {mb(m[1])} left"
    elif m := re.search(r"requested buffer of size (\d+)", text):
        clause = f"{mb(m[1])} asked"
    else:
        clause = said
    more = "raise ATTNSCOPE_ARENA_MB" if cap else "free memory on the GPU" if device == "cuda" else "free memory"
    return OutOfMemory(f"this run needs more than {limit} (onnxruntime: {clause}): send a shorter text or fewer "
                       f"texts, ask fewer layers at once, or {more}")


def open_session(graph: Path | bytes, providers: Sequence[str], threads: int, *, arena: bool = True,
                 mem_pattern: bool = True, compute_dtype: str = "float32"):
    """An onnxruntime session on a graph file or a serialised graph.

    compute_dtype: what the matrix products run in (model/precision.py): "float32" opens the graph as it is;
    "float16" and "bfloat16" open its reduced form (graphs/reduced.py, made here, so every graph gets it);
    "tf32" asks the CUDA provider for it (provider_options).

    arena: keep a memory arena (an arena keeps its peak for good; a run without one gets fresh pages every time:
    1.8-3x slower at 512 tokens). mem_pattern: plan one block per run (the layer-by-layer graphs turn it off: its
    block is ~1.6x the run's own peak).
    Threads: `threads` intra-op threads, 0 = one per core this process may use, given as a number: left at 0,
    onnxruntime pins its pool's threads to cores, and processes that each pin theirs (a server, its job workers, a
    client on the same machine) share those cores. bench/answer.py on a 2-core VM: MiniLM's layer-5 answer took
    19-23 ms from a server with pinned threads, 15.5 ms unpinned; a raw forward with onnxruntime's default options
    next to the pinned server took 17 ms, next to the unpinned one 11.
    The threads spin while a run is under way (a parallel section starts without waking a sleeping thread) and stop
    the moment it ends (session.force_spinning_stop), so they never take the cores that the server's event loop and
    serialisation need next, nor those of the next session (bench/session_memory.py, the "run" rows). Measured
    against onnxruntime's `session.intra_op.spin_duration_us` (threads spin that long after a run, no stop), MiniLM
    at 128 tokens, layer 5's cut graph, 2-core VM: in a process of its own the stop makes runs bimodal (~9 or ~16
    ms, median 14-15) where 10-20 ms of spinning gives 7.6-8.0 ms (2 ms: 13-14.5); but in the server the run took
    8.1-8.8 ms either way (bench/answer.py), and spinning made the layer-by-layer path 1.65x a plain run instead of
    1.20x (bench/long_input.py): its sessions run one after another, each pool spinning against the next."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = arena
    so.enable_mem_pattern = mem_pattern
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads or cores()
    so.log_severity_level = 3
    if _SHARED:                   # share_arena: one capped arena for every session
        so.add_session_config_entry("session.use_env_allocators", "1")
    if compute_dtype in ("float16", "bfloat16"):
        import onnx
        from ..graphs.reduced import reduce_products
        proto = onnx.load(str(graph)) if isinstance(graph, Path) else onnx.load_from_string(graph)
        graph = reduce_products(proto, compute_dtype).SerializeToString()
    return ort.InferenceSession(str(graph) if isinstance(graph, Path) else graph, so,
                                providers=provider_options(providers, compute_dtype))


_DTYPES = {"tensor(float)": COMPUTE, "tensor(float16)": np.dtype(np.float16), "tensor(int64)": INDEX}


def ort_nbytes(value) -> int:
    """An OrtValue's bytes where it lives (on a GPU too: read off its shape and ONNX type, no copy)."""
    return int(np.prod(value.shape())) * _itemsize(value.data_type())


@functools.cache
def _itemsize(data_type: str) -> int:
    """The element size of an OrtValue's data_type(), "tensor(float)" -> 4, by onnx's own type table."""
    from onnx import TensorProto, helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.DataType.Value(data_type[7:-1].upper()))).itemsize


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
        self._values: dict[tuple[str, int | None], object] = {}
        self._placed: dict[int, object] = {}          # id(array) -> its OrtValue (the model keeps the arrays alive)
        self._lock = threading.Lock()

    def layer(self, layer: int) -> dict[str, np.ndarray]:
        """Layer `layer`'s arrays under the layer graphs' names."""
        if layer not in self._layers:
            self._layers[layer] = block_arrays(self.model, layer)
        return self._layers[layer]

    def binds(self, name: str) -> bool:
        """Whether a graph input of this name is one of the model's arrays (not a run's own input)."""
        return name in self.named or name.startswith("block.") or name in ROPE

    def array(self, name: str, layer: int | None = None) -> np.ndarray:
        if layer is not None and (name.startswith("block.") or name in ROPE):
            return self.layer(layer)[name]
        if name.startswith("block."):
            raise ValueError(f"{name} is a layer graph's weight: name the layer whose weights to bind")
        return self.named[name]

    def value(self, name: str, layer: int | None = None):
        """The OrtValue bound to input `name` (of layer `layer` in a layer graph)."""
        key = (name, layer if name.startswith("block.") or name in ROPE else None)
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
                 **options):
        """options: open_session's (arena, mem_pattern, compute_dtype)."""
        self.ort = open_session(graph, providers, threads, **options)
        self.arena = options.get("arena", True)      # a run's `release` shrinks the arena: none to shrink without
        self.weights = weights
        self.inputs = {i.name for i in self.ort.get_inputs()}
        self.bound = sorted(n for n in self.inputs if weights is not None and weights.binds(n))
        self.declared = {o.name: o for o in self.ort.get_outputs()}
        self.device = device_of(providers)
        self.fetched = 0                              # bytes of outputs handed back by this session's runs
        self.runs = 0                                 # runs made (on a GPU each costs a launch and a synchronisation)
        self.resized = 0                              # runs made twice: an output's declared shape was not its own
        self._count = threading.Lock()

    def get_providers(self) -> list[str]:
        return self.ort.get_providers()

    def get_inputs(self):
        """The run's own inputs (the model's arrays are bound, not fed)."""
        return [i for i in self.ort.get_inputs() if i.name not in self.bound]

    def get_outputs(self):
        return self.ort.get_outputs()

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray], *, layer: int | None = None,
            axes: dict[str, int] | None = None, into: dict[str, np.ndarray] | None = None,
            release: bool = False, drop: Sequence[str] = (), keep: Sequence[str] = ()) -> list:
        names = list(self.declared) if names is None else list(names)
        try:
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
        shapes = {n: [d if isinstance(d, int) else axes[d] for d in self.declared[n].shape] for n in drop}
        with SCRATCH.lend([max(int(np.prod(s)) for s in shapes.values())]) as buffer:
            yield {n: buffer[:int(np.prod(s))].reshape(s) for n, s in shapes.items()}

    def _run(self, names, feeds, layer, axes, into, release, unread: dict, keep: set) -> list:
        binding, own, axes, held = self.ort.io_binding(), dict(into or {}), axes or {}, {}
        for key, value in feeds.items():
            if key in self.inputs and key not in self.bound:
                if isinstance(value, Held):
                    binding.bind_ortvalue_input(key, value.value)
                else:
                    binding.bind_cpu_input(key, np.ascontiguousarray(value))
        for name in self.bound:
            binding.bind_ortvalue_input(name, self.weights.value(name, layer))
        for name in names:
            out = self.declared[name]
            shape = [d if isinstance(d, int) else axes.get(d) for d in (out.shape or [None])]
            dtype = _DTYPES.get(out.type)
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
                own[name] = np.empty(shape, dtype)
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
            values = dict(zip(names, binding.get_outputs()))
            outs = [None if n in unread else held.get(n, values[n]) if n in keep else own[n] if n in own else
                    np.array(values[n].numpy()) for n in names]
        outs = [Held(o, o.numpy() if self.device == "cpu" else None, self) if n in keep and not isinstance(o, Held)
                else o for n, o in zip(names, outs)]      # kept outputs onnxruntime had to size itself
        with self._count:
            self.fetched += sum(o.nbytes for o in outs if isinstance(o, np.ndarray))
            self.runs += 1
        return outs


class Held:
    """A run's output left where its session computes, for a later run to read (Session.run's keep), or an input
    placed there once for many runs (`hold`): an OrtValue (`value`) in the device's memory, bound as it is on either
    device; on the CPU over a NumPy array (`array`, the same memory). `host()` reads it back, counted as fetched by the
    session that made it."""
    __slots__ = ("value", "array", "session")

    def __init__(self, value, array: np.ndarray | None, session: Session | None = None):
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
            with self.session._count:
                self.session.fetched += out.nbytes
        return out


def hold(a: np.ndarray, device: str) -> Held:
    """An input many runs read (a long text's mask, its pooling matrix), put on the device once: a NumPy array fed
    to a GPU session is copied there at every run (a 2048-token mask: 16 MB a layer)."""
    a = np.ascontiguousarray(a)
    return Held(ort_value(a, device), a if device == "cpu" else None)


def empty(shape: Sequence[int], dtype: np.dtype, session: Session | None = None) -> Held:
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
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
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


@functools.cache
def release_arena():
    """Run options that give a session's memory arena back to the OS at the end of the run."""
    import onnxruntime as ort
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


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
    return open_session(proto.SerializeToString(), ["CPUExecutionProvider"], 0, arena=False)


def open_helpers(arena_mb: float | None = None, providers: Sequence[str] = ()) -> None:
    """Set up what the process's sessions share: the capped arena (share_arena, before any session opens), and the
    helper graphs (the float16 cast), opened now so that no request builds one."""
    share_arena(arena_mb, providers or default_providers())
    _cast_session()


def to_float16(a: np.ndarray) -> np.ndarray:
    """float32 -> float16, bit for bit what numpy gives, but through onnxruntime's Cast: numpy takes a slow path
    for results below float16's normal range, and a quarter of attention weights land there (358 ms vs 2-13 ms
    for 512 tokens x 72 heads)."""
    return _cast_session().run(None, {"x": np.ascontiguousarray(a, COMPUTE)})[0]
