"""Where a corpus job's chunks run, each yielding (chunk, sums, problems) as chunks finish: in this process, on a
local process pool (spawned, one Runtime per process), or on Ray Data (an actor pool, one Runtime per actor; a local
cluster, or the one at the address the caller passes). Every engine runs the same ChunkWorker on the same chunks
(same batches, same padding), so they give the same numbers.
"""
from __future__ import annotations

import pickle
import random
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal

from ..analysis.statistics import TextKeys
from ..runtime import DEFAULT_CACHE, InputError, Runtime
from ..runtime.layerwise import Want
from ..runtime.options import cores
from ..runtime.runtime import STOP_EARLY_MB
from ..sources import get
from .errors import CorpusError
from .examples import ExampleOptions, TopExamples
from .readers import Problem
from .sums import JS_ROWS, Sums

CHUNK_SIZE = 64           # texts per unit of work, of progress and of the partial file
Engine = Literal["local", "ray"]   # where a corpus job runs: a process pool on this machine, or Ray Data
BATCH_SIZE = 16           # texts per model run (sorted by length within a chunk, so padding is small)


@dataclass
class Chunk:
    """A unit of work: consecutive texts of the corpus (after sampling) and their line/row numbers."""
    index: int
    unit: str
    numbers: list[int]
    texts: list[str]


def chunks(records: Iterable[tuple[int, str] | Problem], unit: str, size: int = CHUNK_SIZE,
           sample: int | None = None, seed: int = 0,
           on_problem: Callable[[Problem], None] = lambda p: None) -> Iterator[Chunk]:
    """Group the good records into chunks of `size`; with `sample`, a uniform random sample (reservoir,
    seeded, kept in file order) of that many texts first."""
    def good_records():
        for r in records:
            if isinstance(r, Problem):
                on_problem(r)
            else:
                yield r
    good = good_records()
    if sample is not None:
        rng, kept = random.Random(seed), []
        for k, item in enumerate(good):
            if k < sample:
                kept.append(item)
            else:
                j = rng.randrange(k + 1)
                if j < sample:
                    kept[j] = item
        good = iter(sorted(kept))
    buf: list[tuple[int, str]] = []
    index = 0
    for item in good:
        buf.append(item)
        if len(buf) == size:
            yield Chunk(index, unit, [n for n, _ in buf], [t for _, t in buf])
            buf, index = [], index + 1
    if buf:
        yield Chunk(index, unit, [n for n, _ in buf], [t for _, t in buf])


class ChunkWorker:
    """One Runtime; turns a chunk into its Sums (and the texts the model refused). Both engines run this. Its runs
    ask every head's attention and no ends (Want.ends): the graph cut after the last block's attention runs, without
    that block's values and MLP, the final norm or the LM head (SmolLM2's atlas of 400 texts: 38 -> 30 s), the
    same attentions bit for bit."""

    def __init__(self, model_id: str, threads: int = 1, batch_size: int = BATCH_SIZE, js_rows: int = JS_ROWS,
                 runtime=None, cache_dir=None, examples: ExampleOptions | None = None):
        self.rt = runtime if runtime is not None else Runtime(get(model_id), threads=threads, cache_dir=cache_dir or
                                                              DEFAULT_CACHE, stop_early_mb=STOP_EARLY_MB)
        self.batch_size, self.js_rows, self.examples = max(1, batch_size), js_rows, examples
        cfg = self.rt.cfg
        self.want = Want(tuple(range(cfg.n_layers)), tuple(range(cfg.n_heads)), ends=False)

    def __call__(self, chunk: Chunk) -> tuple[Sums, list[Problem]]:
        cfg = self.rt.cfg
        total, problems = Sums(cfg.n_layers, cfg.n_heads), []
        if self.examples is not None:
            total.examples = TopExamples(cfg.n_layers, cfg.n_heads, self.examples)
        order = sorted(range(len(chunk.texts)), key=lambda k: (len(chunk.texts[k]), k))   # similar lengths together
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            try:
                results = self.rt.run([chunk.texts[k] for k in batch], want=self.want)
            except InputError:                                  # find the text the runtime refuses; keep the rest
                results = []
                for k in batch:
                    try:
                        results += self.rt.run([chunk.texts[k]], want=self.want)
                    except InputError as e:
                        problems.append(Problem(chunk.unit, chunk.numbers[k], f"the model refused it ({e})"))
                        results.append(None)
            for k, res in zip(batch, results):
                if res is not None:
                    total.add(Sums.of_result(res, self.js_rows))
                    if total.examples is not None:
                        e = res.encoding
                        total.examples.offer_text(res.attentions, TextKeys.of(e), e.tokens, chunk.texts[k], e.offsets,
                                                  chunk.numbers[k])
        return total, problems


# ---- a pool worker's lifetime: it dies with the process that started it ----------------------------------------
PID_SUFFIX = ".worker.json"     # a live pool worker's pid file: {"pid", "started", "parent", "parent_started"}


def started_at(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22); None when there is no such
    process (or no /proc). With the pid it names one process: a pid reused later has another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])    # fields after "(comm)": state is field 3


def is_pool_worker(pid: int, started: int | None) -> bool:
    """Whether `pid` is still the pool worker a pid file recorded: the same start time, and a spawned
    multiprocessing child (its command line runs multiprocessing.spawn's spawn_main)."""
    if started is None or started_at(pid) != started:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"multiprocessing" in cmdline and b"spawn_main" in cmdline


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the thread that started it ends (prctl PR_SET_PDEATHSIG), and, on any system,
    a watcher thread that ends it once its parent is gone (reparented: getppid() changes). A worker blocked on its
    task pipe never notices a parent killed with SIGKILL: the pipe's other end is its own, too."""
    import os
    import signal
    import threading
    import time
    if sys.platform == "linux":
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    if os.getppid() != parent:         # the parent died before the signal was set
        os._exit(1)
    threading.Thread(target=watch, name="attnscope-parent-watch", daemon=True).start()


def _pid_file(folder, parent: int) -> None:
    """Record this worker in `folder` (removed when it exits; a server that starts later stops any left)."""
    import atexit
    import json
    import os
    from pathlib import Path
    path = Path(folder) / f"{os.getpid()}{PID_SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": os.getpid(), "started": started_at(os.getpid()), "parent": parent,
                                "parent_started": started_at(parent)}))
    atexit.register(path.unlink, missing_ok=True)


# ---- engines ----------------------------------------------------------------------------------------
_POOL_WORKER: ChunkWorker | Exception | None = None


def _pool_init(model_id: str, threads: int, batch_size: int, js_rows: int, cache_dir,
               examples: ExampleOptions | None = None, nice: int = 0, parent: int | None = None,
               pid_folder=None) -> None:
    global _POOL_WORKER
    import os
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the driver's: it saves the partial sums and stops
    if parent is not None:
        _die_with_parent(parent)
        if pid_folder is not None:
            _pid_file(pid_folder, parent)
    if nice:
        os.nice(nice)                                 # a server's job: interactive requests come first
    try:
        _POOL_WORKER = ChunkWorker(model_id, threads, batch_size, js_rows, cache_dir=cache_dir, examples=examples)
    except Exception as e:  # noqa: BLE001 - reported with the first chunk, not as a broken pool
        _POOL_WORKER = CorpusError(f"a worker could not load {model_id!r}: {type(e).__name__}: {e}")


def _pool_run(chunk: Chunk) -> tuple[Chunk, Sums, list[Problem]]:
    if isinstance(_POOL_WORKER, Exception):
        raise _POOL_WORKER
    sums, problems = _POOL_WORKER(chunk)
    return Chunk(chunk.index, chunk.unit, [], []), sums, problems   # send back the index, not the texts


def run_inprocess(work: Iterable[Chunk], worker: ChunkWorker) -> Iterator[tuple[Chunk, Sums, list[Problem]]]:
    for chunk in work:
        yield (chunk, *worker(chunk))


def run_local(work: Iterable[Chunk], model_id: str, workers: int, threads: int, batch_size: int,
              js_rows: int, cache_dir=None, examples: ExampleOptions | None = None,
              nice: int = 0, pid_folder=None) -> Iterator[tuple[Chunk, Sums, list[Problem]]]:
    """A process pool (spawned, so no onnxruntime state is forked), one Runtime per process, each at `nice`. Its
    workers die with this process (_die_with_parent), and keep a pid file in `pid_folder` while they live."""
    import multiprocessing as mp
    import os
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_pool_init,
                               initargs=(model_id, threads, batch_size, js_rows, cache_dir, examples, nice,
                                         os.getpid(), None if pid_folder is None else str(pid_folder)))
    try:
        pending, work = set(), iter(work)
        while True:
            while len(pending) < 2 * workers and (chunk := next(work, None)) is not None:
                pending.add(pool.submit(_pool_run, chunk))
            if not pending:
                return
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
    finally:
        pids = list(getattr(pool, "_processes", None) or {})
        pool.shutdown(wait=True, cancel_futures=True)
        if pid_folder is not None:                       # a worker that died without its atexit
            from pathlib import Path
            for pid in pids:
                (Path(pid_folder) / f"{pid}{PID_SUFFIX}").unlink(missing_ok=True)


class RayChunks:
    """Ray Data's callable class for map_batches: one ChunkWorker (one Runtime, one onnxruntime session) per
    actor. A batch of text rows (chunk, number, text) becomes one row of pickled Sums per chunk it touches."""

    def __init__(self, model_id: str, threads: int, batch_size: int, js_rows: int, unit: str, cache_dir=None,
                 examples: ExampleOptions | None = None):
        self.worker = ChunkWorker(model_id, threads, batch_size, js_rows, cache_dir=cache_dir, examples=examples)
        self.unit = unit

    def __call__(self, batch):
        import pyarrow as pa
        ids, numbers, texts = (batch.column(c).to_pylist() for c in ("chunk", "number", "text"))
        out = {"chunk": [], "texts": [], "result": []}
        for index in sorted(set(ids)):
            keep = [k for k, c in enumerate(ids) if c == index]
            chunk = Chunk(index, self.unit, [numbers[k] for k in keep], [texts[k] for k in keep])
            out["chunk"].append(index)
            out["texts"].append(len(keep))
            out["result"].append(pickle.dumps(self.worker(chunk)))
        return pa.table({"chunk": pa.array(out["chunk"], pa.int64()), "texts": pa.array(out["texts"], pa.int64()),
                         "result": pa.array(out["result"], pa.binary())})


def ray_start(num_cpus: int | None = None, address: str | None = None) -> bool:
    """Join the Ray cluster at `address` (the CLI passes RAY_ADDRESS), else start a local one; True when this call
    started Ray."""
    import logging

    import ray
    if ray.is_initialized():
        return False
    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(address="local", num_cpus=num_cpus or cores(), include_dashboard=False,  # a new one, even
                     log_to_driver=False, logging_level=logging.WARNING)      # if `ray start` runs here too
    except Exception as e:  # noqa: BLE001 - ConnectionError, auth and version mismatches alike
        where = f"join the Ray cluster at {address} (RAY_ADDRESS)" if address else "start a local Ray cluster"
        raise CorpusError(f"cannot {where}: {type(e).__name__}: {str(e).strip().splitlines()[0]}") from None
    return True


def run_ray(work: Iterable[Chunk], model_id: str, workers: int, threads: int, batch_size: int,
            js_rows: int, chunk_size: int, cache_dir=None,
            examples: ExampleOptions | None = None) -> Iterator[tuple[Chunk, Sums, list[Problem]]]:
    """Ray Data: one block per chunk, map_batches over an actor pool of `workers` RayChunks actors."""
    import logging

    import pyarrow as pa
    import ray
    import ray.data                              # configures its loggers on import: quieten them after

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").addFilter(
        lambda record: not record.getMessage().startswith("Progress bars disabled"))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False             # ours shows texts/s and the ETA
    ctx.print_on_execution_start = False
    blocks, sizes, unit = [], {}, "line"
    for chunk in work:
        unit = chunk.unit
        sizes[chunk.index] = len(chunk.texts)
        blocks.append(pa.table({"chunk": pa.array([chunk.index] * len(chunk.texts), pa.int64()),
                                "number": pa.array(chunk.numbers, pa.int64()), "text": pa.array(chunk.texts)}))
    if not blocks:
        return
    ds = ray.data.from_arrow(blocks).map_batches(
        RayChunks, batch_size=chunk_size, batch_format="pyarrow", num_cpus=threads,
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(blocks))),     # no idle actors to start
        fn_constructor_kwargs={"model_id": model_id, "threads": threads, "batch_size": batch_size,
                               "js_rows": js_rows, "unit": unit, "cache_dir": cache_dir, "examples": examples})
    partial: dict[int, tuple[int, Sums, list[Problem]]] = {}
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        for index, n, blob in zip(*(batch.column(c).to_pylist() for c in ("chunk", "texts", "result"))):
            sums, problems = pickle.loads(blob)
            if index in partial:                 # a chunk that Ray split across two batches
                m, s, p = partial[index]
                n, sums, problems = m + n, s.add(sums), p + problems
            if n < sizes[index]:
                partial[index] = (n, sums, problems)
                continue
            partial.pop(index, None)
            yield Chunk(index, unit, [], []), sums, problems


def start(engine: Engine, work: Iterable[Chunk], model_id: str, workers: int | None, batch_size: int,
          js_rows: int, chunk_size: int, rt, say, examples: ExampleOptions | None = None,
          nice: int = 0, pid_folder=None) -> tuple[Iterator, int, int]:
    """The chosen engine's stream of finished chunks, its workers and each worker's onnxruntime threads. `nice`:
    the local pool's processes run at that niceness (a server's jobs yield the cores to interactive requests)."""
    n_cores = cores()
    if engine == "ray":
        if workers is None:
            import ray
            workers = max(1, int(ray.cluster_resources().get("CPU", n_cores)))
        return run_ray(work, model_id, workers, 1, batch_size, js_rows, chunk_size, rt.cache_dir, examples), \
            workers, 1
    workers = n_cores if workers is None else workers
    if workers == 0:
        return run_inprocess(work, ChunkWorker(model_id, batch_size=batch_size, js_rows=js_rows, runtime=rt,
                                               examples=examples)), 0, rt.threads or n_cores
    if workers > n_cores:
        say(f"{workers} workers on {n_cores} cores: they will compete for the cores")
    threads = max(1, n_cores // workers)
    return run_local(work, model_id, workers, threads, batch_size, js_rows, rt.cache_dir, examples, nice,
                     pid_folder), workers, threads
