"""The attention service: loaded runtimes, a result cache, bounded concurrency, and answer payloads.

Routes call this; it calls model.runtime and model.stats. Results are a pure function of
(model, input, options), so they are cached by content hash and carry an ETag derived from the request.
"""
from __future__ import annotations

import asyncio
import hashlib
import sys
import threading
import time
from collections import OrderedDict

import anyio
import numpy as np
import orjson

from model import stats, zoo
from model.runtime import AttentionResult, Runtime

from . import __version__
from .errors import ApiError, StartupError
from .schemas import AttentionRequest, ModelInfo, RunOptions, StagesRequest
from .settings import Settings


def nbytes(result: AttentionResult) -> int:
    arrays = [result.attentions, result.hidden, result.mask, *(result.stages or {}).values()]
    return sum(a.nbytes for a in arrays)


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


class AttentionService:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.runtimes: dict[str, Runtime] = {}
        self.cache = ResultCache(settings.cache_mb * 2**20)
        self._slots: asyncio.Semaphore | None = None
        self._render: anyio.CapacityLimiter | None = None
        self._waiting = self._running = 0
        self._pending: dict[str, asyncio.Future] = {}

    # ---- start-up ---------------------------------------------------------------------------
    def load(self) -> None:
        """Build every configured model and open its session (exporting the graph on first start).
        Whatever stops a model from loading becomes one StartupError line naming the fix."""
        for model_id in self.settings.models:
            try:
                rt = Runtime(zoo.get(model_id), providers=self.settings.providers or None,
                             threads=self.settings.threads)
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
            print(f"attnscope: {model_id} ready on {rt.session().get_providers()[0]}", file=sys.stderr)

    def runtime(self, model_id: str) -> Runtime:
        rt = self.runtimes.get(model_id)
        if rt is None:
            shown = model_id if len(model_id) <= 64 else model_id[:64] + "…"
            raise ApiError(404, f"unknown model {shown!r}; available: {', '.join(self.runtimes)}")
        return rt

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=i, title=rt.spec.title, description=rt.spec.description, kind=rt.spec.kind,
                          layers=rt.cfg.n_layers, heads=rt.cfg.n_heads, d_model=rt.cfg.d_model,
                          d_head=rt.cfg.d_head, max_tokens=rt.spec.max_tokens, pair=rt.spec.pair,
                          provider=rt.session().get_providers()[0])
                for i, rt in self.runtimes.items()]

    # ---- running ----------------------------------------------------------------------------
    def key(self, opts: RunOptions, stages: bool) -> str:
        """Content hash of everything that determines a model run (and of the model's weights and graph)."""
        rt = self.runtime(opts.model)
        material = [opts.model, rt.cache_key(), opts.engine, opts.text, opts.text_pair, opts.causal,
                    sorted(set(opts.mask_tokens)), stages]
        return hashlib.sha256(orjson.dumps(material)).hexdigest()[:32]

    def check(self, opts: RunOptions) -> Runtime:
        rt = self.runtime(opts.model)
        chars = len(opts.text) + len(opts.text_pair or "")
        if chars > self.settings.max_chars:
            raise ApiError(413, f"text is {chars} characters; the limit is {self.settings.max_chars} "
                                f"(ATTNSCOPE_MAX_CHARS). The model reads at most {rt.spec.max_tokens} tokens anyway")
        if len(opts.mask_tokens) > self.settings.max_mask_tokens:
            raise ApiError(422, f"mask_tokens has {len(opts.mask_tokens)} entries; the limit is "
                                f"{self.settings.max_mask_tokens} (ATTNSCOPE_MAX_MASK_TOKENS)")
        return rt

    async def compute(self, opts: RunOptions, stages: bool = False) -> tuple[AttentionResult, bool]:
        """The (cached) run for these options; returns (computed, cache_hit)."""
        rt = self.check(opts)
        key = self.key(opts, stages)
        hit = self.cache.get(key)
        if hit is not None:
            return hit, True
        run = self._pending.get(key)
        if run is not None:                                     # the same run is under way: share it
            return await asyncio.shield(run), True
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.max_inflight)
        # admitted runs (waiting or running) are counted the moment they are admitted, so a burst cannot slip
        # past the bound before the first of it takes a slot
        if self._waiting + self._running >= self.settings.max_inflight + self.settings.max_queue:
            raise ApiError(503, f"busy: {self._running} model runs in flight and "
                                f"{self._waiting} waiting (ATTNSCOPE_MAX_INFLIGHT, ATTNSCOPE_MAX_QUEUE); "
                                f"retry shortly", headers={"Retry-After": "1"})
        # The run is a task of its own: a request that goes away (cancelled) neither cancels a run that other
        # requests share nor leaks a slot or a count, and the result is still cached for its retry.
        self._waiting += 1
        run = asyncio.ensure_future(self._queued_run(rt, opts, stages, key))
        self._pending[key] = run
        run.add_done_callback(lambda done: self._run_done(key, done))
        return await asyncio.shield(run), False

    async def _queued_run(self, rt: Runtime, opts: RunOptions, stages: bool, key: str) -> AttentionResult:
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            computed = await anyio.to_thread.run_sync(self._run, rt, opts, stages)
        finally:
            self._running -= 1
            self._slots.release()
        self.cache.put(key, computed)
        return computed

    def _run_done(self, key: str, run: asyncio.Future) -> None:
        if self._pending.get(key) is run:
            del self._pending[key]
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

    @staticmethod
    def _run(rt: Runtime, opts: RunOptions, stages: bool) -> AttentionResult:
        try:
            [res] = rt.run([opts.text], [opts.text_pair], causal=opts.causal,
                           masked_keys=[opts.mask_tokens] if opts.mask_tokens else None,
                           engine=opts.engine, stages=stages)
        except ValueError as e:  # the runtime's word for bad input
            raise ApiError(422, str(e)) from None
        return res

    # ---- answers ----------------------------------------------------------------------------
    def etag(self, opts: RunOptions, fmt: str) -> str:
        material = [__version__, self.key(opts, isinstance(opts, StagesRequest)), opts.model_dump(mode="json"), fmt]
        return 'W/"' + hashlib.sha256(orjson.dumps(material)).hexdigest()[:32] + '"'

    @staticmethod
    def _tokens(r: AttentionResult) -> dict:
        e = r.encoding
        return {"model": r.model, "engine": r.engine, "provider": r.provider, "causal": r.causal,
                "truncated": e.truncated, "tokens": e.tokens, "offsets": [list(o) for o in e.offsets],
                "special": e.special, "segments": e.segments, "masked_tokens": r.masked_keys}

    @staticmethod
    def _select(name: str, asked: list[int] | None, n: int) -> list[int]:
        if asked is None:
            return list(range(n))
        if not asked:
            raise ApiError(422, f"{name} is empty: leave it out for all {n}, or list indices 0..{n - 1}")
        bad = [i for i in asked if i >= n]
        if bad:
            raise ApiError(422, f"{name} {bad} out of range: this model has {n} {name} (0..{n - 1})")
        return list(dict.fromkeys(asked))

    def validate(self, opts: RunOptions) -> Runtime:
        """Every check that needs only the request and the model, so bad input fails before a model run."""
        rt = self.check(opts)
        stages = isinstance(opts, StagesRequest)
        self._select("layers", [opts.layer] if stages else opts.layers, rt.cfg.n_layers)
        self._select("heads", [opts.head] if stages else opts.heads, rt.cfg.n_heads)
        return rt

    def attention_payload(self, r: AttentionResult, req: AttentionRequest, binary: bool) -> dict:
        """The asked layers x heads; entropy and summaries are computed on that selection only."""
        L, H, T = r.attentions.shape[:3]
        layers, heads = self._select("layers", req.layers, L), self._select("heads", req.heads, H)
        sel = np.ix_(layers, heads)
        out = self._tokens(r) | {"layers": layers, "heads": heads}
        everything = layers == list(range(L)) and heads == list(range(H))
        probs = r.attentions if everything else r.attentions[sel]            # [l, h, T, T]; no copy for all
        if "attention" in req.include:
            side = min(T, req.resolution or T)
            cells = len(layers) * len(heads) * side * side
            limit = self.settings.max_binary_cells if binary else self.settings.max_json_cells
            if cells > limit:
                raise ApiError(422, f"this answer would hold {cells:,} attention values; the "
                                    f"{'binary' if binary else 'JSON'} limit is {limit:,} "
                                    f"(ATTNSCOPE_MAX_{'BINARY' if binary else 'JSON'}_CELLS). Ask for fewer layers or "
                                    f"heads, set resolution"
                                    + ("" if binary else ", or ask for the binary form (Accept: "
                                       "application/vnd.attnscope.tensors)"))
            att = probs
            if req.resolution and T > req.resolution:
                att = stats.downsample(att, req.resolution).astype(np.float32)
                edges = np.linspace(0, T, req.resolution + 1).astype(int)
                out["blocks"] = [[int(a), int(b)] for a, b in zip(edges[:-1], edges[1:])]
            out["attention"] = att
        rows = stats.row_stats(probs, r.mask) if "entropy" in req.include else None
        if rows is not None:
            out |= rows
        if "summary" in req.include:
            out["summary"] = stats.head_stats(probs, rows["entropy"] if rows else None)
        if "rollout" in req.include:
            out["rollout"] = stats.rollout(r.attentions).astype(np.float32)
        return out

    def stages_payload(self, r: AttentionResult, req: StagesRequest) -> dict:
        rt = self.runtime(req.model)
        l, h = req.layer, req.head
        n = req.limit or len(r.tokens)
        st = {name: v[l, h, :n, :] if name in ("q", "k") else v[l, h, :n, :n] for name, v in r.stages.items()}
        return self._tokens(r) | {"layer": l, "head": h, "d_head": rt.cfg.d_head,
                                  "scale": float(1.0 / (np.sqrt(rt.cfg.d_head) * rt.cfg.temperature)),
                                  **st, "mask": r.mask[:n, :n], "probs": r.attentions[l, h, :n, :n]}

    @staticmethod
    def timing(r: AttentionResult, started: float) -> dict[str, float]:
        return {"model": round(r.seconds * 1000, 3), "total": round((time.perf_counter() - started) * 1000, 3)}
