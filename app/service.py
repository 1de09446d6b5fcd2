"""The attention service: loaded runtimes, request plans, a result cache and bounded concurrency.

A request is validated once into a Plan (which runtime, which layers and heads, the cache key and ETag);
`run(plan)` returns the model's result, from the cache, from an identical run under way, or from a new
run that waits for a slot. Results are a pure function of (model, input, options), so they are cached by
content hash.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

import anyio
import numpy as np
import orjson
from fastapi import HTTPException

from .. import __version__
from ..model import zoo
from ..model.runtime import AttentionResult, Runtime
from .errors import StartupError
from .schemas import AttentionRequest, ModelInfo, StagesRequest
from .settings import Settings

log = logging.getLogger("attnscope")


TOKEN_BYTES = 400  # Python objects per token of an Encoding (str, ids, offset tuples, flags), measured ~330


def nbytes(result: AttentionResult) -> int:
    """Memory the result keeps alive: each array's whole underlying buffer, once (a view of a padded batch
    output holds all of it), plus the token lists."""
    seen, total = set(), 0
    for a in [result.attentions, result.hidden, result.mask, *(result.stages or {}).values()]:
        while isinstance(a.base, np.ndarray):
            a = a.base
        if id(a) not in seen:
            seen.add(id(a))
            total += a.nbytes
    return total + TOKEN_BYTES * len(result.tokens)


class ByteBudget:
    """Bytes of big answers being built or written, for the whole server: an answer waits until its size
    fits (one larger than the whole budget goes alone), so slow readers cannot make the server hold more
    than this many bytes of answers at once, however many of them there are."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.used = max_bytes, 0
        self._changed: asyncio.Condition | None = None

    async def acquire(self, n: int) -> int:
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            await self._changed.wait_for(lambda: self.used == 0 or self.used + n <= self.max_bytes)
            self.used += n
        return n

    async def release(self, n: int) -> None:
        async with self._changed:
            self.used -= n
            self._changed.notify_all()


class ResultCache:
    """Least-recently-used, bounded by bytes; thread-safe."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._items: OrderedDict[str, AttentionResult] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> AttentionResult | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: str, item: AttentionResult) -> None:
        size = nbytes(item)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = item
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self.bytes -= nbytes(old)


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


@dataclass(frozen=True)
class Plan:
    """A validated request: everything the run, the payload and the wire form need, decided once."""
    request: AttentionRequest | StagesRequest
    runtime: Runtime
    layers: list[int]
    heads: list[int]
    stages: bool          # run the graph with the teaching outputs
    key: str              # content hash of the model run (cache key)
    etag: str             # of the answer: the run, every option, the wire form
    binary: bool


def _select(name: str, asked: list[int] | None, n: int) -> list[int]:
    if asked is None:
        return list(range(n))
    if not asked:
        raise HTTPException(422, f"{name} is empty: leave it out for all {n}, or list indices 0..{n - 1}")
    bad = [i for i in asked if i >= n]
    if bad:
        raise HTTPException(422, f"{name} {bad} out of range: this model has {n} {name} (0..{n - 1})")
    return list(dict.fromkeys(asked))


class AttentionService:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.runtimes: dict[str, Runtime] = {}
        self.cache = ResultCache(settings.cache_mb * 2**20)
        self._slots = RunSlots(settings.max_inflight)
        self._render: anyio.CapacityLimiter | None = None
        self._waiting = self._running = 0
        self._pending: dict[str, asyncio.Future] = {}
        self._waiters: dict[asyncio.Future, int] = {}   # requests awaiting each pending run
        self._started: set[asyncio.Future] = set()       # pending runs that hold a slot
        self.sending = ByteBudget(settings.max_sending_mb * 2**20)

    # ---- start-up ---------------------------------------------------------------------------
    def load(self) -> None:
        """Build every configured model and open its session (exporting the graph on first start).
        Whatever stops a model from loading becomes one StartupError line naming the fix."""
        st = self.settings
        for model_id in st.models:
            try:
                rt = Runtime(zoo.get(model_id, st.model_dirs().get(model_id)), providers=st.providers or None,
                             threads=st.threads, cache_dir=st.cache)
                rt.session(stages=False)
            except zoo.ModelUnavailable as e:
                raise StartupError(f"model {model_id!r}: {e}") from None
            except KeyError as e:
                raise StartupError(f"ATTNSCOPE_MODELS: {e.args[0]}") from None
            except ValueError as e:  # the runtime's word for a bad option (e.g. an unknown execution provider)
                raise StartupError(f"model {model_id!r}: {e}; fix: set ATTNSCOPE_PROVIDERS to available ones, or "
                                   f"leave it empty for the default") from None
            except OSError as e:
                raise StartupError(f"model {model_id!r}: cannot write its ONNX graph ({e}); fix: point "
                                   f"ATTNSCOPE_CACHE at a writable folder") from None
            self.runtimes[model_id] = rt
            log.info("%s ready on %s", model_id, rt.provider)

    def runtime(self, model_id: str) -> Runtime:
        rt = self.runtimes.get(model_id)
        if rt is None:
            shown = model_id if len(model_id) <= 64 else model_id[:64] + "…"
            raise HTTPException(404, f"unknown model {shown!r}; available: {', '.join(self.runtimes)}")
        return rt

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=i, title=rt.spec.title, description=rt.spec.description, kind=rt.spec.kind,
                          layers=rt.cfg.n_layers, heads=rt.cfg.n_heads, d_model=rt.cfg.d_model,
                          d_head=rt.cfg.d_head, max_tokens=rt.spec.max_tokens, pair=rt.spec.pair,
                          provider=rt.provider)
                for i, rt in self.runtimes.items()]

    # ---- planning: every check that needs only the request and the model, once ---------------
    def plan(self, req: AttentionRequest | StagesRequest, binary: bool) -> Plan:
        rt = self.runtime(req.model)
        chars = len(req.text) + len(req.text_pair or "")
        if chars > self.settings.max_chars:
            raise HTTPException(413, f"text is {chars} characters; the limit is {self.settings.max_chars} "
                                     f"(ATTNSCOPE_MAX_CHARS). The model reads at most {rt.spec.max_tokens} tokens anyway")
        if len(req.mask_tokens) > self.settings.max_mask_tokens:
            raise HTTPException(422, f"mask_tokens has {len(req.mask_tokens)} entries; the limit is "
                                     f"{self.settings.max_mask_tokens} (ATTNSCOPE_MAX_MASK_TOKENS)")
        stages = isinstance(req, StagesRequest)
        layers = _select("layers", [req.layer] if stages else req.layers, rt.cfg.n_layers)
        heads = _select("heads", [req.head] if stages else req.heads, rt.cfg.n_heads)
        run = [req.model, rt.cache_key(), req.engine, req.text, req.text_pair, req.causal,
               sorted(set(req.mask_tokens)), stages]
        key = hashlib.sha256(orjson.dumps(run)).hexdigest()[:32]
        answer = [__version__, key, req.model_dump(mode="json"), binary]
        etag = 'W/"' + hashlib.sha256(orjson.dumps(answer)).hexdigest()[:32] + '"'
        return Plan(req, rt, layers, heads, stages, key, etag, binary)

    def _check_size(self, plan: Plan, tokens: int) -> None:
        """Once the token count is known: refuse an answer with more attention values than its wire form allows."""
        req = plan.request
        if plan.stages or "attention" not in req.include:
            return
        side = min(tokens, req.resolution or tokens)
        cells = len(plan.layers) * len(plan.heads) * side * side
        limit = self.settings.max_binary_cells if plan.binary else self.settings.max_json_cells
        if cells > limit:
            raise HTTPException(422, f"this answer would hold {cells:,} attention values; the "
                                     f"{'binary' if plan.binary else 'JSON'} limit is {limit:,} "
                                     f"(ATTNSCOPE_MAX_{'BINARY' if plan.binary else 'JSON'}_CELLS). Ask for fewer "
                                     f"layers or heads, set resolution"
                                     + ("" if plan.binary else ", or ask for the binary form (Accept: "
                                        "application/vnd.attnscope.tensors)"))

    # ---- running ----------------------------------------------------------------------------
    async def run(self, plan: Plan) -> tuple[AttentionResult, bool]:
        """The model's result for this plan, checked against the answer's size limit; returns (result, cache_hit)."""
        result, hit = await self._result(plan)
        self._check_size(plan, len(result.tokens))
        return result, hit

    async def _result(self, plan: Plan) -> tuple[AttentionResult, bool]:
        hit = self.cache.get(plan.key)
        if hit is not None:
            return hit, True
        run = self._pending.get(plan.key)
        shared = run is not None                                # the same run is under way: share it
        if run is None:
            # admitted runs (waiting or running) are counted the moment they are admitted, so a burst cannot
            # slip past the bound before the first of it takes a slot
            if self._waiting + self._running >= self.settings.max_inflight + self.settings.max_queue:
                raise HTTPException(503, f"busy: {self._running} model runs in flight and "
                                         f"{self._waiting} waiting (ATTNSCOPE_MAX_INFLIGHT, ATTNSCOPE_MAX_QUEUE); "
                                         f"retry shortly", headers={"Retry-After": "1"})
            # The run is a task of its own: a request that goes away (cancelled) neither cancels a run that
            # other requests share nor leaks a slot or a count. A run that nobody waits for any more is dropped
            # while it waits for a slot; one already running finishes and is cached.
            self._waiting += 1
            run = asyncio.ensure_future(self._queued_run(plan))
            self._pending[plan.key] = run
            self._waiters[run] = 0
            run.add_done_callback(lambda done: self._run_done(plan.key, done))
        self._waiters[run] += 1
        try:
            return await asyncio.shield(run), shared
        finally:
            left = self._waiters.get(run)                   # None once the run is done
            if left is not None:
                self._waiters[run] = left - 1
                if left == 1 and not run.done() and run not in self._started:
                    if self._pending.get(plan.key) is run:  # a later identical request starts afresh
                        del self._pending[plan.key]
                    run.cancel()

    async def _queued_run(self, plan: Plan) -> AttentionResult:
        me = asyncio.current_task()
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._started.add(me)
        self._running += 1
        try:
            computed = await anyio.to_thread.run_sync(self._forward, plan)
        finally:
            self._running -= 1
            self._slots.release()
        self.cache.put(plan.key, computed)
        return computed

    @staticmethod
    def _forward(plan: Plan) -> AttentionResult:
        req = plan.request
        try:
            [res] = plan.runtime.run([req.text], [req.text_pair], causal=req.causal,
                                     mask_tokens=[req.mask_tokens] if req.mask_tokens else None,
                                     engine=req.engine, stages=plan.stages)
        except ValueError as e:  # the runtime's word for bad input
            raise HTTPException(422, str(e)) from None
        return res

    def _run_done(self, key: str, run: asyncio.Future) -> None:
        if self._pending.get(key) is run:
            del self._pending[key]
        self._waiters.pop(run, None)
        self._started.discard(run)
        if not run.cancelled():
            run.exception()  # mark retrieved: the requests awaiting it re-raise it; nobody else needs to

    def runs(self) -> dict[str, int]:
        """Model runs in flight and requests waiting for a slot (/healthz shows them)."""
        return {"running": self._running, "waiting": self._waiting, "max_inflight": self.settings.max_inflight,
                "max_queue": self.settings.max_queue}

    def render_slots(self) -> anyio.CapacityLimiter:
        """Answers built at once: a 512-token answer briefly holds a few hundred MB of copies."""
        if self._render is None:
            self._render = anyio.CapacityLimiter(self.settings.max_renders)
        return self._render
