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
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

import anyio
import numpy as np
import orjson
from fastapi import HTTPException

from .. import __version__
from ..model import stats, zoo
from ..model.layerwise import LayerwiseResult, Want
from ..model.runtime import AttentionResult, Encoding, Runtime, head_importance
from .errors import StartupError
from .schemas import AttentionRequest, ImportanceRequest, ModelInfo, StagesRequest
from .settings import Settings

log = logging.getLogger("attnscope")


@dataclass(frozen=True)
class Importance:
    """Every head's single-head ablation effect on one text (model.runtime.head_importance)."""
    tokens: list[str]
    values: np.ndarray     # [L, H]
    baseline: float
    seconds: float
    lm: bool               # measured on log-probs (an LM head) or on the embedding


TOKEN_BYTES = 400  # Python objects per token of an Encoding (str, ids, offset tuples, flags), measured ~330


def nbytes(result: AttentionResult | Importance | LayerwiseResult) -> int:
    """Memory the result keeps alive: each array's whole underlying buffer, once (a view of a padded batch
    output holds all of it), plus the token lists."""
    if isinstance(result, Importance):
        return result.values.nbytes + TOKEN_BYTES * len(result.tokens)
    if isinstance(result, LayerwiseResult):
        return result.nbytes() + TOKEN_BYTES * len(result.tokens)
    seen, total = set(), 0
    arrays = [result.attentions, result.hidden, result.mask, *(result.stages or {}).values()]
    if result.next_token_logits is not None:
        arrays.append(result.next_token_logits)
    for a in arrays:
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
    ids: tuple[int, ...] | None = None   # run these token ids instead of the text (the induction probe)
    job: str = "run"      # "run": one forward pass; "importance": every head's single-head ablation
    extra: dict[str, "Plan"] = field(default_factory=dict)   # other runs the answer needs: baseline, probe
    long: "LongRun | None" = None    # a text too long for the stacked graph: run layer by layer (see below)


@dataclass(frozen=True)
class Computed:
    """A plan's results: its own run and the extra runs the answer compares it with."""
    result: AttentionResult
    hit: bool
    extra: dict[str, AttentionResult]

    @property
    def tokens(self) -> list[str]:
        return self.result.tokens


PROBE_TOKENS = 50   # the induction probe: this many random tokens, repeated once


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
        self._progress: dict[str, RunProgress] = {}   # long runs under way, by job key

    # ---- start-up ---------------------------------------------------------------------------
    def load(self) -> None:
        """Build every configured model and open its session (exporting the graph on first start).
        Whatever stops a model from loading becomes one StartupError line naming the fix."""
        st = self.settings
        seen: set[str] = set()
        for entry in st.models:
            model_id = zoo.split_entry(entry)[0]
            try:
                spec = zoo.resolve(entry, st.model_dirs(), cache=st.cache)
                if spec.id in seen:
                    raise StartupError(f"ATTNSCOPE_MODELS names {spec.id!r} twice; give each model its own name")
                seen.add(spec.id)
                if model_id in st.max_tokens:  # ATTNSCOPE_MAX_TOKENS: up to the model's positions
                    spec = replace(spec, max_tokens=st.max_tokens[model_id])
                rt = Runtime(spec, providers=st.providers or None, threads=st.threads, cache_dir=st.cache)
                if not 2 <= spec.max_tokens <= rt.cfg.max_positions:
                    raise StartupError(f"ATTNSCOPE_MAX_TOKENS: {model_id}={spec.max_tokens}, but it takes 2 to "
                                       f"{rt.cfg.max_positions} tokens (its positions); fix: set a limit in that range")
                rt.session(stages=False)
                if self._run_bytes(rt, rt.spec.max_tokens) > st.layerwise_mb * 2**20:
                    rt.layerwise(st.checkpoint_every, st.layerwise_group_mb).open()   # long texts: their graphs too
            except zoo.ModelUnavailable as e:
                raise StartupError(f"model {model_id!r}: {e}") from None
            except KeyError as e:
                raise StartupError(f"ATTNSCOPE_MODELS: {e.args[0]}; or give NAME=PATH (a Hugging Face folder or a "
                                   f".gguf file) or NAME=hf:ORG/REPO") from None
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
                          source=rt.spec.source, architecture=rt.spec.architecture, layers=rt.cfg.n_layers,
                          heads=rt.cfg.n_heads, d_model=rt.cfg.d_model, d_head=rt.cfg.d_head,
                          max_tokens=rt.spec.max_tokens, pair=rt.spec.pair,
                          trained_tokens=rt.spec.trained_tokens, max_positions=rt.cfg.max_positions,
                          provider=rt.provider, kv_heads=rt.cfg.n_kv_heads, predictions=rt.cfg.lm_head,
                          head_roles=list(rt.spec.head_roles), explanation=rt.spec.explanation)
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
        L, H = rt.cfg.n_layers, rt.cfg.n_heads
        bad = [pair for pair in req.ablate if pair[0] >= L or pair[1] >= H]
        if bad:
            raise HTTPException(422, f"ablate {bad[:5]} out of range: this model has layers 0..{L - 1} and heads "
                                     f"0..{H - 1}")
        include = set(getattr(req, "include", ()))
        plan = Plan(req, rt, layers, heads, stages, self._key(req, rt, stages), "", binary)
        extra = {}
        if "effect" in include and req.ablate:
            intact = req.model_copy(update={"ablate": []})
            extra["baseline"] = replace(plan, request=intact, key=self._key(intact, rt, stages))
        if "scores" in include:
            extra["probe"] = self._probe_plan(plan)
        answer = [__version__, plan.key, req.model_dump(mode="json"), binary]
        etag = 'W/"' + hashlib.sha256(orjson.dumps(answer)).hexdigest()[:32] + '"'
        return self._plan_long(replace(plan, etag=etag, extra=extra))

    @staticmethod
    def _key(req, rt: Runtime, stages: bool, ids=None) -> str:
        """Content hash of everything that determines a model run (and of the model's weights and graph)."""
        run = [req.model, rt.cache_key(), req.engine, req.text, req.text_pair, req.causal,
               sorted(set(req.mask_tokens)), stages, sorted(map(tuple, req.ablate)),
               req.ablation if req.ablate else None, ids]
        return hashlib.sha256(orjson.dumps(run)).hexdigest()[:32]

    def plan_importance(self, req: ImportanceRequest, binary: bool) -> Plan:
        rt = self.runtime(req.model)
        if len(req.text) + len(req.text_pair or "") > self.settings.max_chars:
            raise HTTPException(413, f"text is over the {self.settings.max_chars}-character limit (ATTNSCOPE_MAX_CHARS)")
        self._refuse_long("importance", rt, req.text, req.text_pair, req.batch)
        material = ["importance", req.model, rt.cache_key(), req.text, req.text_pair, req.ablation]
        key = hashlib.sha256(orjson.dumps(material)).hexdigest()[:32]
        etag = 'W/"' + hashlib.sha256(orjson.dumps([__version__, key, req.model_dump(mode="json"), binary])
                                      ).hexdigest()[:32] + '"'
        return Plan(req, rt, list(range(rt.cfg.n_layers)), list(range(rt.cfg.n_heads)), False, key, etag, binary,
                    job="importance")

    def _probe_plan(self, plan: Plan) -> Plan:
        """The induction probe: PROBE_TOKENS random non-special tokens repeated twice, wrapped in the specials the
        tokenizer puts around any text (so [CLS] ... [SEP] for BERT), under this request's masks and ablations."""
        rt = plan.runtime
        n = min(PROBE_TOKENS, (rt.spec.max_tokens - 2) // 2)
        opening = rt.encode("a")
        first = opening.special.index(False)
        ids = tuple(opening.ids[:first] + stats.probe_ids(rt.cfg.vocab_size, n, set(rt.special_ids()))
                    + opening.ids[first + 1:])
        # the probe does not depend on the text: one run per model (and causal/ablation choice), cached
        req = plan.request.model_copy(update={"text": "", "text_pair": None, "mask_tokens": []})
        return replace(plan, request=req, stages=False, ids=ids, key=self._key(req, rt, False, ids))

    def _check_size(self, plan: Plan, tokens: int) -> None:
        """Once the token count is known: refuse an answer with more attention values than its wire form allows."""
        req = plan.request
        if plan.stages or "attention" not in getattr(req, "include", ()):
            return
        side = min(tokens, req.resolution or tokens)
        cells = len(plan.layers) * len(plan.heads) * (tokens * min(req.top_k, tokens) if req.top_k else side * side)
        limit = self.settings.max_binary_cells if plan.binary else self.settings.max_json_cells
        if cells > limit:
            raise HTTPException(422, f"this answer would hold {cells:,} attention values; the "
                                     f"{'binary' if plan.binary else 'JSON'} limit is {limit:,} "
                                     f"(ATTNSCOPE_MAX_{'BINARY' if plan.binary else 'JSON'}_CELLS). Ask for fewer "
                                     f"layers or heads, set resolution"
                                     + ("" if plan.binary else ", or ask for the binary form (Accept: "
                                        "application/vnd.attnscope.tensors)"))

    # ---- running ----------------------------------------------------------------------------
    async def run(self, plan: Plan) -> Computed:
        """The model's result for this plan, checked against the answer's size limit, and its extra runs."""
        result, hit = await (self._long_result(plan) if plan.long is not None else self._result(plan))
        self._check_size(plan, len(result.tokens))
        extra = {name: (await self._result(sub))[0] for name, sub in plan.extra.items()}
        return Computed(result, hit, extra)

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
    def _forward(plan: Plan) -> AttentionResult | Importance | LayerwiseResult:
        req, rt = plan.request, plan.runtime
        if plan.long is not None:
            return _forward_long(plan)
        if plan.job == "importance":
            t0 = time.perf_counter()
            try:
                values, baseline = head_importance(rt, req.text, ablation=req.ablation, batch=req.batch,
                                                   pair=req.text_pair)
            except ValueError as e:
                raise HTTPException(422, str(e)) from None
            return Importance(rt.encode(req.text, req.text_pair).tokens, values, baseline,
                              time.perf_counter() - t0, rt.cfg.lm_head)
        keep, mean = _head_masks(req, rt)
        options = dict(causal=req.causal, mask_tokens=[req.mask_tokens] if req.mask_tokens else None,
                       engine=req.engine, stages=plan.stages, head_mask=keep, head_mean=mean)
        try:
            if plan.ids is not None:
                [res] = rt.forward([rt.encode_ids(plan.ids)], **options)
            else:
                [res] = rt.run([req.text], [req.text_pair], **options)
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

    # ---- long inputs: layer by layer (model/layerwise.py) -------------------------------------------------
    def _run_bytes(self, rt: Runtime, tokens: int) -> int:
        """What the stacked graph's attention output holds for a text of this many tokens (float32)."""
        return rt.cfg.n_layers * rt.cfg.n_heads * tokens * tokens * 4

    def _long_encoding(self, rt: Runtime, text: str, pair: str | None) -> Encoding | None:
        """The text's tokens when it may be too long for the stacked graph (None when no text of this model can be:
        then it is not even tokenised here). A long run goes on with this encoding rather than tokenising again."""
        if self._run_bytes(rt, rt.spec.max_tokens) <= self.settings.layerwise_mb * 2**20:
            return None
        try:
            return rt.encode(text, pair)
        except ValueError as e:  # the runtime's word for bad input
            raise HTTPException(422, str(e)) from None

    def _plan_long(self, plan: Plan) -> Plan:
        """A text whose stacked attention would pass ATTNSCOPE_LAYERWISE_MB runs layer by layer. Decided here, where
        the token count is first known, so that what such a run cannot give is refused before any work."""
        req, rt = plan.request, plan.runtime
        enc = None if plan.ids is not None else self._long_encoding(rt, req.text, req.text_pair)
        T = None if enc is None else len(enc.ids)
        if T is None or self._run_bytes(rt, T) <= self.settings.layerwise_mb * 2**20:
            return plan
        why = (f"this text is {T} tokens: every layer's attention together is "
               f"{self._run_bytes(rt, T) / 2**30:.1f} GiB, so it runs layer by layer (ATTNSCOPE_LAYERWISE_MB)")
        if plan.stages:
            raise HTTPException(422, f"{why}, and the stages of one head come from the graph that holds every layer; "
                                     f"ask /api/attention for its probabilities, or shorten the text")
        if req.engine == "numpy":
            raise HTTPException(422, f"{why} on the onnx engine only; leave `engine` out")
        if "rollout" in req.include:
            raise HTTPException(422, f"{why}, and rollout multiplies every layer's full matrices; leave `rollout` "
                                     f"out of include, or shorten the text")
        self._check_size(plan, T)
        include = set(req.include)
        attention = "attention" in include and not req.top_k
        thumbnails = attention and bool(req.resolution) and T > req.resolution
        want = Want(tuple(plan.layers), tuple(plan.heads), attention=attention and not thumbnails,
                    top_k=req.top_k if "attention" in include and req.top_k else 0, duplicate="scores" in include,
                    resolution=req.resolution if thumbnails else 0)
        every, group_mb = self.settings.checkpoint_every, self.settings.layerwise_group_mb
        key = hashlib.sha256(orjson.dumps([plan.key, repr(want), every])).hexdigest()[:32]
        extra = dict(plan.extra)
        if "baseline" in extra:   # the same text intact: layer by layer too, asking nothing of its heads
            extra["baseline"] = replace(extra["baseline"], long=LongRun(Want(), every, group_mb, extra["baseline"].key,
                                                                        enc))
        return replace(plan, long=LongRun(want, every, group_mb, key, enc), extra=extra)

    def _refuse_long(self, what: str, rt: Runtime, text: str, pair: str | None, batch: int) -> None:
        """Jobs that run `batch` copies of a text through the stacked graph: refused where that would pass
        ATTNSCOPE_LAYERWISE_MB."""
        enc = self._long_encoding(rt, text, pair)
        T = None if enc is None else len(enc.ids)
        limit = self.settings.layerwise_mb * 2**20
        if T is not None and self._run_bytes(rt, T) * batch > limit:
            fits = limit // self._run_bytes(rt, T)
            fix = f"set batch to {fits} or less" if fits else "shorten the text"
            raise HTTPException(422, f"{what} runs {batch} copies of this {T}-token text through the graph that holds "
                                     f"every layer's attention: {self._run_bytes(rt, T) * batch / 2**30:.1f} GiB, over "
                                     f"ATTNSCOPE_LAYERWISE_MB ({self.settings.layerwise_mb} MB); {fix}")

    async def _long_result(self, plan: Plan) -> tuple[LayerwiseResult, bool]:
        """The layer-by-layer run's kept parts (cached under the run's own key, shared by every request on this
        text) and what this request asks of its heads: computed in the same pass on a first run, recomputed from the
        checkpoints later. Through the same queue, cache and sharing of identical runs as every run."""
        base = self.cache.get(plan.key)
        try:
            if base is not None and not _lacks(base, plan.long.want):
                result, hit = base, True
            else:
                job = replace(plan, key=plan.long.key, long=replace(plan.long, base=base, progress=self.watch(plan)))
                result, hit = await self._result(job)
                if base is None:
                    self.cache.put(plan.key, replace(result, asked=None))
        finally:
            if plan.long.key not in self._pending:   # the run is over (or never started): stop tracking it
                self._progress.pop(plan.long.key, None)
        return result, hit

    def watch(self, plan: Plan) -> "RunProgress | None":
        """The progress of the layer-by-layer run this plan needs, shared by every request waiting on that run
        (None: not a long run). What the run updates as it goes; gone from here once the run is over."""
        return None if plan.long is None else self._progress.setdefault(plan.long.key, plan.long.progress)


@dataclass
class RunProgress:
    """Blocks done of a layer-by-layer run, and how many it runs (all layers, or those a recompute needs)."""
    done: int = 0
    total: int = 0

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total


@dataclass(frozen=True)
class LongRun:
    """How a long text runs: what it asks of its heads, the checkpoint spacing, the key of run + asked parts."""
    want: Want
    checkpoint_every: int
    group_mb: float
    key: str
    encoding: Encoding = field(compare=False)  # the text's tokens, as the plan found them
    progress: RunProgress = field(default_factory=RunProgress, compare=False)
    base: LayerwiseResult | None = None    # the run's kept parts when cached: only what it lacks is computed


def _lacks(base: LayerwiseResult, want: Want) -> bool:
    """Whether a run's kept parts miss something `want` asks for (its heads' parts are never kept)."""
    thumbs = base.thumbnails.get(want.resolution, {})
    return bool(want.block_outputs()) or bool(want.resolution and any(l not in thumbs for l in want.layers))


def _head_masks(req, rt: Runtime) -> tuple[np.ndarray | None, np.ndarray | None]:
    """`ablate` and `ablation` as the runtime's head_mask and head_mean [1, L, H]; None, None keeps every head."""
    if not req.ablate:
        return None, None
    keep = np.ones((1, rt.cfg.n_layers, rt.cfg.n_heads), np.float32)
    for layer, head in req.ablate:
        keep[0, layer, head] = 0.0
    return keep, (1.0 - keep) if req.ablation == "mean" else np.zeros_like(keep)


def _forward_long(plan: Plan) -> LayerwiseResult:
    """A long text's run (in a worker thread): from scratch, or the asked parts from a cached run's checkpoints."""
    req, rt, run = plan.request, plan.runtime, plan.long
    lw = rt.layerwise(run.checkpoint_every, run.group_mb)
    try:
        if run.base is not None:
            return lw.recompute(run.base, run.want, run.progress.update)
        keep, mean = _head_masks(req, rt)
        return lw.forward(run.encoding, causal=req.causal, mask_tokens=req.mask_tokens or None,
                          head_mask=keep, head_mean=mean, want=run.want, progress=run.progress.update)
    except ValueError as e:  # the runtime's word for bad input
        raise HTTPException(422, str(e)) from None
