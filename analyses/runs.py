"""Model runs: each computed once per key, cached, shared by every request that needs it, and queued for a bounded
number of run slots.

A plan (analyses/: each analysis' module) names its runs as Run(key, call): `call` runs the model in a worker thread, and its result is a
pure function of the key (model, input, options), so it is cached by content hash. `Runner.result(run)` returns it
from the cache, from an identical run under way, or from a new run that waits for a slot; a queued run nobody waits
for any more is dropped, one already running finishes and is cached. A layer-by-layer run's progress is shared through
`watch` by every request waiting on it.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

import anyio

from ..runtime.results import footprint
from .errors import Busy


@dataclass(frozen=True)
class Run:
    """A unit of model work: `call` (in a worker thread) returns a result with .tokens. steps: the run is many runs
    (patching's, importance's): the runner calls call(progress, stopped), and it reports (runs done, runs) through
    progress as it goes and checks stopped() between them; stopped() is True once nobody waits for its result (its
    clients went away or cancelled), and the run then raises runtime.errors.Stopped instead of finishing."""
    key: str
    call: Callable[..., object]
    steps: bool = False


@dataclass
class RunProgress:
    """Pieces done of a run, and how many it runs: blocks of a layer-by-layer run (all layers, or those a recompute
    needs), or the runs of a run of many (Run.steps); the time left at the rate so far."""
    done: int = 0
    total: int = 0
    since: float | None = None        # when the first piece was reported (time.monotonic)
    first: int = 0                    # pieces done then

    def update(self, done: int, total: int) -> None:
        if self.since is None:
            self.since, self.first = time.monotonic(), done
        self.done, self.total = done, total

    def eta(self) -> float | None:
        """Seconds left at the rate since the first report (None before a second one)."""
        if self.since is None or self.done <= self.first:
            return None
        rate = (self.done - self.first) / max(time.monotonic() - self.since, 1e-9)
        return round((self.total - self.done) / rate, 1)


def nbytes(result) -> int:
    """Memory a result keeps alive, as the cache charges it: runtime.results.footprint, which counts each array at
    the whole buffer it holds (a view of a [rows, vocabulary] matrix is charged the matrix) and the Python objects
    around them. Never what a result says of itself: a result's own count missed what a view held (issue 37: a
    patching answer charged ~4 KB held ~101 MiB)."""
    return footprint(result)


class ResultCache:
    """Least-recently-used, bounded by bytes (each entry charged nbytes(), once, when it is put); thread-safe.
    `bytes` never passes `max_bytes`: an entry bigger than the whole budget is not kept."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._items: OrderedDict[str, tuple[object, int]] = OrderedDict()   # key -> (result, its charge)
        self._lock = threading.Lock()

    def get(self, key: str):
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                return None
            self._items.move_to_end(key)
            return entry[0]

    def put(self, key: str, item, size: int | None = None) -> None:
        """Keep `item`, charged `size` bytes (nbytes(item) when not given)."""
        size = nbytes(item) if size is None else size
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (item, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, old) = self._items.popitem(last=False)
                self.bytes -= old

    def __len__(self) -> int:
        return len(self._items)


class RunSlots:
    """At most `n` model runs at once. Waiters are served oldest first, but newest first while more than `n`
    wait, except that one waiting `patience` seconds or more goes first. Under overload the oldest waiters
    are the likeliest to give up while their run is under way, the newest the likeliest to still be there
    (adaptive LIFO: with oldest-first, 64 clients that give up after 2 s got 0.3x the single-run rate,
    bench/overload.py); a client that has already waited `patience` is a patient one, and is not starved
    (pure newest-first left wrk's patient clients waiting over 60 s, bench/load.py -c32)."""

    def __init__(self, n: int, patience: float = 5.0):
        self.n = self.free = n
        self.patience = patience
        self._waiters: deque[tuple[float, asyncio.Future]] = deque()   # (since, future), oldest first

    async def acquire(self) -> None:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        loop = asyncio.get_running_loop()
        entry = (loop.time(), loop.create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():   # handed a slot just as it was cancelled: pass it on
                self.release()
            elif entry in self._waiters:
                self._waiters.remove(entry)
            raise

    def release(self) -> None:
        while self._waiters and self._waiters[0][1].done():      # waiters that went away
            self._waiters.popleft()
        while self._waiters:
            since, _ = self._waiters[0]
            lifo = len(self._waiters) > self.n and asyncio.get_running_loop().time() - since < self.patience
            _, fut = self._waiters.pop() if lifo else self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


class Runner:
    """The cache, the run slots and the runs under way, for the whole server."""

    def __init__(self, max_inflight: int, max_queue: int, cache_bytes: int):
        self.max_inflight, self.max_queue = max_inflight, max_queue
        self.cache = ResultCache(cache_bytes)
        self._slots = RunSlots(max_inflight)
        self._waiting = self._running = 0
        self._pending: dict[str, asyncio.Future] = {}
        self._waiters: dict[asyncio.Future, int] = {}   # requests awaiting each pending run
        self._started: set[asyncio.Future] = set()       # pending runs that hold a slot
        self._progress: dict[str, RunProgress] = {}      # layer-by-layer runs under way (or about to be), by run key
        self._stops: dict[asyncio.Future, threading.Event] = {}   # runs of many (Run.steps): set when abandoned
        self.computed = 0                                 # runs computed since start (not answered from a cache)

    async def result(self, run: Run) -> tuple[object, bool]:
        """The run's result and whether it was shared (the cache, or an identical run under way)."""
        hit = self.cache.get(run.key)
        if hit is not None:
            return hit, True
        task = self._pending.get(run.key)
        shared = task is not None                                # the same run is under way: share it
        if task is None:
            # admitted runs (waiting or running) are counted the moment they are admitted, so a burst cannot
            # slip past the bound before the first of it takes a slot
            self._admit()
            # The run is a task of its own: a request that goes away (cancelled) neither cancels a run that
            # other requests share nor leaks a slot or a count. A run that nobody waits for any more is dropped
            # while it waits for a slot; one already running finishes and is cached.
            self._waiting += 1
            stop = threading.Event()
            task = asyncio.ensure_future(self._queued(run, stop))
            self._pending[run.key] = task
            self._waiters[task] = 0
            if run.steps:
                self._stops[task] = stop
            task.add_done_callback(lambda done: self._done(run.key, done))
        self._waiters[task] += 1
        try:
            return await asyncio.shield(task), shared
        finally:
            left = self._waiters.get(task)                  # None once the run is done
            if left is not None:
                self._waiters[task] = left - 1
                if left == 1 and not task.done() and task not in self._started:
                    if self._pending.get(run.key) is task:  # a later identical request starts afresh
                        del self._pending[run.key]
                    task.cancel()
                elif left == 1 and not task.done() and task in self._stops:   # a run of many, under way: it stops
                    self._stops[task].set()                                  # before its next piece
                    if self._pending.get(run.key) is task:
                        del self._pending[run.key]

    async def _queued(self, run: Run, stop: threading.Event):
        result, size = await self._in_slot(lambda: self._execute(run, stop), started=True)
        self.cache.put(run.key, result, size)
        return result

    async def _in_slot(self, call: Callable[[], object], started: bool = False):
        """call() in a worker thread once a run slot is free, counted as waiting (the caller counted it) and then as
        running. started: mark this task as holding a slot (a run under way finishes even if nobody waits)."""
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        if started:
            self._started.add(asyncio.current_task())
        self._running += 1
        try:
            return await anyio.to_thread.run_sync(call)
        finally:
            self._running -= 1
            self._slots.release()

    def _admit(self) -> None:
        """Busy when the runs in flight and waiting fill the slots and the queue."""
        if self._waiting + self._running >= self.max_inflight + self.max_queue:
            raise Busy(f"busy: {self._running} model runs in flight and {self._waiting} waiting "
                       f"(ATTNSCOPE_MAX_INFLIGHT, ATTNSCOPE_MAX_QUEUE); retry shortly", {"Retry-After": "1"})

    async def step(self, call: Callable[[], object], admit: bool = True):
        """One uncached piece of model work (a step of a generation) in a worker thread, when a run slot is free: so
        a long generation takes turns with every other run, a slot per step. admit: refuse it (Busy) when the queue
        is full, as a new run is; a generation's later steps are already admitted and wait."""
        if admit:
            self._admit()
        self._waiting += 1
        return await self._in_slot(call)

    def _execute(self, run: Run, stop: threading.Event) -> tuple[object, int]:
        """The run itself and what its result holds (nbytes, measured here in the worker thread, off the event
        loop). A run of many reports its progress under its key (watch) and stops when `stop` is set."""
        result = run.call(self.watch(run.key).update, stop.is_set) if run.steps else run.call()
        self.computed += 1
        return result, nbytes(result)

    def _done(self, key: str, task: asyncio.Future) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]
        self._waiters.pop(task, None)
        self._started.discard(task)
        self._stops.pop(task, None)
        if not task.cancelled():
            task.exception()  # mark retrieved: the requests awaiting it re-raise it; nobody else needs to

    def watch(self, key: str) -> RunProgress:
        """The progress of the run under this key, shared by every request waiting on it."""
        return self._progress.setdefault(key, RunProgress())

    def unwatch(self, key: str) -> None:
        """Stop tracking a run's progress once it is over (or never started)."""
        if key not in self._pending:
            self._progress.pop(key, None)

    def counts(self) -> dict[str, int]:
        """Model runs in flight, requests waiting for a slot, and what the result cache holds (/healthz shows them)."""
        return {"running": self._running, "waiting": self._waiting, "max_inflight": self.max_inflight,
                "max_queue": self.max_queue, "cache_bytes": self.cache.bytes, "cache_max_bytes": self.cache.max_bytes,
                "runs_computed": self.computed}
