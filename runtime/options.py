"""How onnxruntime sessions are opened: the execution providers, one set of session options, the arena every session
shares when the server caps it, and what onnxruntime's allocation failures mean (OutOfMemory).

    check_providers(providers); check_compute_dtype("float16", providers)     # a bad option: ValueError, at start
    share_arena(arena_mb, providers)                                            # before any session opens
    ort_session = open_session(graph, providers, threads, compute_dtype="float16")

runtime/sessions.py's Session opens every session through open_session; runtime/tensors.py holds what its runs bind.
"""
from __future__ import annotations

import functools
import hashlib
import os
import threading
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Sequence

from ..graphs.cache import sha256, sidecar
from .errors import OutOfMemory


# Attention is computed a group of heads (a long text, runtime/layerwise.py) or a chunk of the prompt (generation,
# runtime/generation.py) at a time, its [h, T, T] (or [H, chunk, T]) float32 within this many MB: buffers near the CPU's
# cache size. SmolLM2 on a 2-core AMD EPYC VM (32 MB L3), a layer-by-layer run against a plain one
# (bench/long_input.py --group-mb): 256 MB groups 1.37x at 1024 tokens, 1.44x at 2048, 1.70x at 4096; 8 MB groups
# 1.14x, 1.16-1.26x and 1.43x (512 tokens, where 9 heads take 9.4 MB: 1.29x both); a 2000-token prompt's prefill
# 3.0-6.8 s in 256 MB chunks, 1.8-1.9 s in 8 MB ones.
GROUP_MB = 8
PLACE_THREADS = True   # False: sessions opened from then on leave their threads to the scheduler (set_placement)


def cores() -> int:
    """CPU cores this process may use (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def placement(threads: int, allowed: Sequence[int] | None = None) -> tuple[int | None, tuple[int, ...]]:
    """Where the threads of a session that takes every core this process may use (`allowed`: its affinity mask) run
    (threads in all, 0 = one per core): the thread that calls a run on the first core, for the run's duration
    (on_core), and onnxruntime's pool threads one on each of the others (open_session's `pool`). (None, ()) with one
    thread, with fewer threads than cores (processes that share the machine: corpus workers with cores // workers
    threads each would all be placed on the same first cores), or no affinity to set (not Linux): the scheduler
    places them.

    Unplaced, the scheduler put the pool's thread on the core of the thread that woke it whenever the other core was
    busy at that moment (the server's event loop handing the request over, the client reading the last answer): the
    two threads then shared one core, the waiting one spinning out its time slice, while the other core sat idle for
    4-8 ms before the scheduler moved either (both had just run: it keeps such threads where they are). perf's
    sched_switch trace on a 2-core VM: MiniLM's layer-5 run took 15 ms, or 20-23 ms when its threads so shared a core,
    in 30-40 % of a server's runs. Placed, the server's runs in bench/answer.py's order took 15.3-17.2 ms (medians of
    four runs of it) against 20.5-21.8 unplaced, and the layer-0 run 1.4-1.6 against 2.2-5.5 ms; run in a process
    of their own, placed or not took the same time (SmolLM2 at 512 tokens, stacked and layer by layer). onnxruntime's
    own pinning (threads left at 0) pins the pool but not the caller, which could land on a pool thread's core: a
    server so pinned answered in 19-23 ms, unpinned 15.5 (earlier, the same VM)."""
    if not PLACE_THREADS:
        return None, ()
    try:
        allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    except AttributeError:  # not Linux
        return None, ()
    n = threads or len(allowed)
    if n < 2 or n != len(allowed):
        return None, ()
    return allowed[0], tuple(allowed[1:n])


def set_placement(on: bool) -> None:
    """Whether sessions opened from now on place their threads (ATTNSCOPE_PLACE_THREADS: runtime/sessions.open_helpers
    sets it as a server starts)."""
    global PLACE_THREADS
    PLACE_THREADS = on


@contextmanager
def on_core(core: int | None):
    """This thread kept on `core` for the context (a run's caller: placement), its own mask back at the end; None,
    or a core it may not be moved to: left where it is."""
    moved = False
    if core is not None:
        before = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {core})
            moved = True
        except OSError:
            pass
    try:
        yield
    finally:
        if moved:
            os.sched_setaffinity(0, before)


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
                 mem_pattern: bool = True, compute_dtype: str = "float32", initial=None, prepack=None,
                 flush_denormals: bool = False, optimized: Path | None = None, pool: Sequence[int] = ()):
    """An onnxruntime session on a graph file or a serialised graph.

    initial: a model array's name -> its OrtValue, for the inputs a packed graph opens as initializers
    (graphs/builder.initialized: its quantised weights' parts, which onnxruntime then prepacks); given only where they
    live on the CPU. The OrtValues are the caller's, over the weights' own memory: nothing is copied but what
    onnxruntime packs. prepack (with `initial`): given the float32 weights the graph's products read (product_weights)
    and the float32 inputs no product reads (unmultiplied), the names of those to open as initializers as well:
    product weights, which onnxruntime then prepacks for its sgemm, and with them other weights, which it reads in
    place (the caller decides, within its budget: Weights.prepacks). MiniLM's forward at 128 tokens took 25.1 ms with
    them bound, 22.4 with them prepacked, for one more copy of them in memory per session (bench/answer.py); with the
    others opened too a run binds 2 of MiniLM's 53 other weights (~0.15 ms less Python a run). Neither under a capped
    arena (share_arena): a session with one prepacked initializer runs outside the shared arena, past its cap (a
    300-token SmolLM2 prompt ran through the packed decoding graph under a 1 MB cap); its weights are then bound.

    flush_denormals: its pool's threads flush float32 denormals to zero (runtime/sessions.py denormals_flushed,
    which a caller that asks it opens the session inside of: onnxruntime flushes the opening thread's for good).
    optimized: a folder that keeps the graph as onnxruntime optimizes it (OptimizedGraphs): a later open reads that
    instead of optimizing again (CPU only; a session given initializers, whose optimized form holds them, optimizes).
    compute_dtype: what the matrix products run in (model/precision.py): "float32" opens the graph as it is;
    "float16" and "bfloat16" open its reduced form (graphs/reduced.py, made here, so every graph gets it);
    "tf32" asks the CUDA provider for it (provider_options).

    arena: keep a memory arena (an arena keeps its peak for good; a run without one gets fresh pages every time:
    1.8-3x slower at 512 tokens). mem_pattern: plan one block per run (the layer-by-layer graphs turn it off: its
    block is ~1.6x the run's own peak).
    Threads: `threads` intra-op threads, 0 = one per core this process may use, given as a number (left at 0,
    onnxruntime would pin its pool's threads itself, not the caller's: placement). pool: the cores of the pool's
    threads, one each (placement's: Session places the runs' callers to match); none given, they are unpinned.
    The threads spin while a run is under way (a parallel section starts without waking a sleeping thread) and stop
    the moment it ends (session.force_spinning_stop), so they never take the cores that the server's event loop and
    serialisation need next, nor those of the next session (bench/session_memory.py, the "run" rows). Measured
    against onnxruntime's `session.intra_op.spin_duration_us` (threads spin that long after a run, no stop), MiniLM
    at 128 tokens, layer 5's cut graph, 2-core VM: in a process of its own the stop makes runs bimodal (~9 or ~16
    ms, median 14-15) where 10-20 ms of spinning gives 7.6-8.0 ms (2 ms: 13-14.5); but in the server the run took
    8.1-8.8 ms either way (bench/answer.py), and spinning made the layer-by-layer path 1.65x a plain run instead of
    1.20x (bench/long_input.py): its sessions run one after another, each pool spinning against the next."""
    import onnxruntime as ort

    def options(optimize: bool = True):      # a fresh set for each try: a session's initializers are added to it
        so = ort.SessionOptions()
        so.enable_cpu_mem_arena = arena
        so.enable_mem_pattern = mem_pattern
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        so.add_session_config_entry("session.force_spinning_stop", "1")
        if flush_denormals:                   # its pool's threads flush them (runtime/sessions.py denormals_flushed)
            so.add_session_config_entry("session.set_denormal_as_zero", "1")
        level = ort.GraphOptimizationLevel
        so.graph_optimization_level = level.ORT_ENABLE_ALL if optimize else level.ORT_DISABLE_ALL   # a saved form:
        #                                                                                            optimized already
        so.intra_op_num_threads = threads or cores()
        if pool:                  # placement's: onnxruntime numbers the cores from 1
            so.add_session_config_entry("session.intra_op_thread_affinities", ";".join(str(c + 1) for c in pool))
        so.log_severity_level = 3
        if _SHARED:                   # share_arena: one capped arena for every session
            so.add_session_config_entry("session.use_env_allocators", "1")
        return so
    device = device_of(providers)
    if device in _SHARED:                 # under a capped arena (share_arena) every weight is bound: onnxruntime runs
        initial = None                    # a session with one prepacked initializer outside the shared arena
    providers = provider_options(providers, compute_dtype)
    kept = OptimizedGraphs(optimized, providers) if optimized is not None and device == "cpu" else None
    if compute_dtype not in ("float16", "bfloat16") and initial is None:        # the graph as it is
        saved = kept.path(graph) if kept is not None else None
        if saved is not None:
            with suppress(Exception):   # onnxruntime's own errors: a saved form that will not open
                return ort.InferenceSession(str(saved), options(optimize=False), providers=providers)
        return ort.InferenceSession(str(graph) if isinstance(graph, Path) else graph, options(), providers=providers)
    import onnx

    from ..graphs.builder import initialized
    from ..graphs.reduced import reduce_products
    proto = onnx.load(str(graph)) if isinstance(graph, Path) else onnx.load_from_string(graph)
    parts = initialized(proto)           # a packed graph's quantised parts
    names = dict(parts) if initial is not None else {}
    if initial is not None and prepack is not None:
        names |= {name: name for name in prepack(product_weights(proto), unmultiplied(proto))}
    if compute_dtype in ("float16", "bfloat16"):
        proto = reduce_products(proto, compute_dtype)
    # a packed graph's products are rewritten with its quantised parts in hand (its logits from a saved form made
    # without them were 2e-6 off, tests/test_optimized_graphs.py): it is optimized at every open
    unchanged = isinstance(graph, Path) and compute_dtype not in ("float16", "bfloat16")   # the file's graph, as it is
    saved = kept.path(graph if unchanged else proto.SerializeToString()) if kept is not None and not parts else None
    for attempt in ([onnx.load(str(saved))] if saved is not None else []) + [proto]:
        inputs = {i.name for i in attempt.graph.input}     # (an input the optimizer found unread is gone)
        values = {name: initial(array) for name, array in names.items() if name in inputs}
        _as_initializers(attempt, values)
        so = options(optimize=attempt is proto)
        if values:
            so.add_external_initializers(list(values), list(values.values()))
        try:
            return ort.InferenceSession(attempt.SerializeToString(), so, providers=providers)
        except Exception:  # noqa: BLE001 - onnxruntime's own errors: a saved form that will not open, the graph again
            if attempt is proto:
                raise


class OptimizedGraphs:
    """Graphs as onnxruntime optimizes them (its offline mode), kept in a folder (the graph cache's) under the hash
    of the graph's bytes, onnxruntime's version and the providers: the first session on a graph optimizes it and
    saves the result (written whole, then renamed into place, with its checksum beside it, as graphs/cache.py writes
    graphs); later sessions, in this process or another, open that with optimization off. The optimized form has no
    weights: a session that opens float32 weights as initializers (prepacked products) adds them to it, as
    open_session adds them to the graph itself (a packed graph, whose quantised parts change how it is optimized,
    is optimized at every open). The optimizations are ORT_ENABLE_EXTENDED's
    (ORT_ENABLE_ALL adds only layout passes for convolutions, and a file saved at ALL may hold this CPU's layouts):
    every output is the same bit for bit (tests/test_optimized_graphs.py). SmolLM2's stages graph opened in 2.07 s
    optimizing, 0.41 s from its optimized form; its served graph with its prepacked weights in 2.38 s and 0.45 s (a
    2-core VM). A folder that cannot be written, or a saved form that fails its checksum or will not open, leaves the
    session to optimize as before."""

    def __init__(self, folder: Path, providers: list):
        self.folder, self.providers = Path(folder), providers

    def path(self, graph: Path | bytes) -> Path | None:
        """The graph's optimized form, made and saved now if it is not yet; None where it cannot be kept."""
        import onnxruntime as ort
        key = hashlib.sha256(f"{_digest(graph)} {ort.__version__} {self.providers!r}".encode()).hexdigest()[:24]
        saved = self.folder / f"optimized-{key}.onnx"
        if _intact(saved):
            return saved
        data = graph.read_bytes() if isinstance(graph, Path) else graph
        # this thread's temporary files (graphs/cache.py removes those of processes that are gone)
        tmp = saved.with_name(f"{saved.stem}-{threading.get_ident()}.onnx.tmp{os.getpid()}")
        check = tmp.with_name(tmp.name.replace(".onnx.", ".sha256."))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(tmp)
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        try:
            tmp.touch()
            ort.InferenceSession(data, so, providers=self.providers)     # optimizes and saves; the session is let go
            check.write_text(f"{sha256(tmp)}\n")
            os.replace(tmp, saved)
            os.replace(check, sidecar(saved))
            return saved
        except Exception:  # noqa: BLE001 - a folder that cannot be written (or is full), or a graph that will not open
            return None
        finally:
            for left in (tmp, check):
                with suppress(OSError):        # (a folder under a file: NotADirectoryError)
                    left.unlink(missing_ok=True)


def _digest(graph: Path | bytes) -> str:
    """A graph's SHA-256: a cached graph's from its sidecar (graphs/cache.py checked it against the file as it gave
    the path: not hashed twice per open), else of its bytes."""
    if isinstance(graph, bytes):
        return hashlib.sha256(graph).hexdigest()
    try:
        return sidecar(graph).read_text().strip()
    except OSError:
        return sha256(graph)


def _intact(path: Path) -> bool:
    """Whether a saved form is there and its sidecar holds its SHA-256 (graphs/cache.py's rule for graphs)."""
    try:
        return sidecar(path).read_text().strip() == sha256(path)
    except OSError:
        return False


def product_weights(proto) -> list[str]:
    """The float32 graph inputs a MatMul multiplies by, directly or through a Transpose (graphs/builder.Graph.linear's
    x @ W^T): those whose prepacked copy speeds a run."""
    readers = _readers(proto)

    def multiplied(name: str) -> bool:
        return all(n.op_type in PRODUCTS or (n.op_type == "Transpose" and all(
            m.op_type in PRODUCTS for m in readers.get(n.output[0], ()))) for n in readers[name])
    return [name for name in _float_inputs(proto) if name in readers and multiplied(name)]


def unmultiplied(proto) -> list[str]:
    """The float32 graph inputs no product reads (norms, biases, an untied embedding): opened with the product
    weights, a session reads them in place. One that a product reads as well (a tied embedding: Gather, and the LM
    head's Transpose and MatMul) is left out: onnxruntime would fold its Transpose into a copy."""
    readers = _readers(proto)
    return [name for name in _float_inputs(proto) if name in readers
            and not any(n.op_type in PRODUCTS or n.op_type == "Transpose" for n in readers[name])]


PRODUCTS = ("MatMul", "Gemm")


def _readers(proto) -> dict[str, list]:
    readers: dict[str, list] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _float_inputs(proto) -> list[str]:
    from onnx import TensorProto
    return [i.name for i in proto.graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT]


def _as_initializers(proto, values: dict) -> None:
    """Graph inputs named as `values` (name -> OrtValue) -> initializers whose data the session is given
    (SessionOptions.add_external_initializers): each declared by its input's type and its value's shape, its data
    "in memory"."""
    from onnx import TensorProto
    inputs = {i.name: i for i in proto.graph.input}
    for name, value in values.items():
        t = TensorProto(name=name, data_type=inputs[name].type.tensor_type.elem_type, dims=value.shape(),
                        data_location=TensorProto.EXTERNAL)
        t.external_data.add(key="location", value="in-memory")
        proto.graph.initializer.append(t)
        proto.graph.input.remove(inputs[name])


@functools.cache
def _blas():
    from threadpoolctl import ThreadpoolController     # after NumPy's import: it finds the BLAS NumPy loaded
    return ThreadpoolController()


_ONE_BLAS_THREAD = threading.Lock()


@contextmanager
def one_blas_thread():
    """A context in which NumPy's BLAS runs on one thread: for a product between two onnxruntime runs of a walk.
    OpenBLAS's threads spin after a product (tens of ms) on the cores onnxruntime's pool needs next: SmolLM2's walk
    of 561 tokens took 1.28 s with the value norms' products on two threads and 0.56 s on one (runtime/blocks.py
    value_norms). ~6 us a use.
    The limit is the process's (OpenBLAS has one pool), so one thread at a time holds it: threadpoolctl lets only the
    thread that set it change it until that thread's context ends, and the contexts of two walks that overlapped
    each read the other's limit as the one to put back, leaving the process's BLAS on one thread for good. A walk's
    norms wait at most for another walk's products of one layer."""
    with _ONE_BLAS_THREAD, _blas().limit(limits=1, user_api="blas"):
        yield


@functools.cache
def release_arena():
    """Run options that give a session's memory arena back to the OS at the end of the run."""
    import onnxruntime as ort
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options
