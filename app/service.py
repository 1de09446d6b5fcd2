"""The service: the served models, loaded once at start-up, and the server-wide parts every request shares.

    svc.context     what planning reads: analysis.plan(svc.context, req, binary) validates a request into its plan
                    (analyses/: the analysis' own module); svc.plans.attention(req, binary) the same by name
    svc.runner      the result cache and the run queue (analyses/runs.py)
    svc.sending     the sending budget and the encoding threads (app/sending.py)
    svc.jobs        the corpus jobs' queue (app/jobs.py)

It knows nothing of HTTP: its refusals are analyses/errors.py's, which app/errors.py maps to statuses.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import anyio

from ..runtime import Runtime
from ..runtime.encdec import EncoderDecoderRuntime
from ..runtime.options import check_compute_dtype, check_providers, default_providers
from ..runtime.sessions import open_helpers
from ..sources import ModelSpec, ModelUnavailable, resolve, split_entry
from ..analyses import checks
from ..analyses.atlas import JobRequest, plan as plan_job
from ..analyses.base import Context
from ..analyses.errors import BadBody, Invalid, Refused
from ..analyses.registry import ANALYSES, Plans
from ..analyses.runs import Runner
from .errors import StartupError
from .jobs import Jobs
from .pages import capability_record
from .schemas import Job, ModelInfo
from .kept import KeptAnswers
from .sending import Sending
from .settings import Settings

log = logging.getLogger("attnscope")


class AttentionService:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.runtimes: dict[str, Runtime] = {}       # the loaded models (replaced, never changed, as each loads)
        self.states: dict[str, str] = {}             # every configured model -> its state while it loads, then "ready"
        self.loaded = threading.Event()              # every model is loaded
        self.runner = Runner(settings.max_inflight, settings.max_queue, settings.cache_mb * 2**20)
        self.sending = Sending(settings.max_sending_mb * 2**20, settings.max_renders,
                               KeptAnswers(settings.kept_folder(), settings.kept_mb * 2**20))
        self.context = Context(self.runtimes, settings, self.states)   # what planning reads
        self.plans = Plans(self.context)             # svc.plans.<analysis>(req, binary)
        self.jobs = Jobs(settings)
        self._job_posts = None

    def load(self) -> None:
        """Build every configured model and open every graph its features run (exporting on first start), here and
        now: what a program that embeds the app (a test's TestClient) wants. Whatever stops a model from loading
        becomes one StartupError line naming the fix."""
        specs = self.resolve()
        open_helpers(self.settings.arena_mb, self.settings.providers, self.settings.place_threads)
        for spec in specs:
            self._load_one(spec)
        self._all_loaded()
        self.jobs.open()

    def start(self) -> None:
        """What the server does at start: check the configuration (an unknown model or provider stops the server
        before it listens), take over the jobs folder, then load the models one after another in a background
        thread while the server answers: /healthz and the page at once (each model's state: waiting, loading,
        building its graphs), a request for a model still loading 503 (errors.Loading). A model that fails to load
        stops the server with its one line, as at start."""
        specs = self.resolve()
        self.jobs.open()
        threading.Thread(target=self._load_in_background, args=(specs,), daemon=True, name="attnscope-load").start()

    def resolve(self) -> list[ModelSpec]:
        """Each ATTNSCOPE_MODELS entry as a spec (its files found, its config read; nothing loaded yet), its id
        unique, its token limit applied; the providers checked. Each configured model is then "waiting"."""
        st = self.settings
        if st.providers:
            try:
                check_providers(st.providers)
            except ValueError as e:
                raise StartupError(f"{e}; fix: set ATTNSCOPE_PROVIDERS to available ones, or leave it empty for the "
                                   f"default") from None
        try:
            check_compute_dtype(st.compute_dtype, st.providers or default_providers())
        except ValueError as e:
            raise StartupError(f"ATTNSCOPE_COMPUTE_DTYPE (serve --compute-dtype): {e}; fix: set it to float32 or float16, or run on a GPU "
                               f"with onnxruntime-gpu") from None
        specs, seen = [], set()
        for entry in st.models:
            model_id = split_entry(entry)[0]
            try:
                spec = resolve(entry, st.model_dirs(), cache=st.cache)
            except ModelUnavailable as e:
                raise StartupError(f"model {model_id!r}: {e}") from None
            except KeyError as e:
                raise StartupError(f"ATTNSCOPE_MODELS: {e.args[0]}; or give NAME=PATH (a Hugging Face folder or a "
                                   f".gguf file) or NAME=hf:ORG/REPO") from None
            if spec.id in seen:
                raise StartupError(f"ATTNSCOPE_MODELS names {spec.id!r} twice; give each model its own name")
            seen.add(spec.id)
            if model_id in st.max_tokens:  # ATTNSCOPE_MAX_TOKENS: up to the model's positions
                spec = replace(spec, max_tokens=st.max_tokens[model_id])
            specs.append(spec)
        self.states.update({spec.id: "waiting" for spec in specs})
        self.context.specs = {spec.id: spec for spec in specs}
        return specs

    def _load_one(self, spec: ModelSpec) -> None:
        """One model: its weights and tokenizer, then every graph its features run (Runtime.prepare), its state
        updated at each step; then it is served."""
        st, model_id = self.settings, spec.id
        self.states[model_id] = "loading its weights and tokenizer"
        try:
            kind = EncoderDecoderRuntime if spec.kind == "encoder-decoder" else Runtime
            options = {} if kind is EncoderDecoderRuntime else {"stacked_mb": st.layerwise_mb,
                                                                "prepack_mb": st.prepack_mb}
            rt = kind(spec, providers=st.providers or None, threads=st.threads, cache_dir=st.cache,
                      stop_early_mb=st.stop_early_mb, memory_mb=st.memory_mb, work_tflop=st.work_tflop,
                      compute_dtype=st.compute_dtype, **options)
            if not 2 <= spec.max_tokens <= rt.cfg.max_positions:
                raise StartupError(f"ATTNSCOPE_MAX_TOKENS: {model_id}={spec.max_tokens}, but it takes 2 to "
                                   f"{rt.cfg.max_positions} tokens (its positions); fix: set a limit in that range")

            def step(done: int, total: int, name: str) -> None:
                self.states[model_id] = f"building its graphs ({done} of {total}: {name})"
            if isinstance(rt, EncoderDecoderRuntime):
                self.states[model_id] = "building its graph"
                rt.session()
                rt.weights.place()           # on a GPU: copied there now, not in the first request
            else:
                rt.prepare(st.checkpoint_every, st.layerwise_group_mb, step)
        except ModelUnavailable as e:
            raise StartupError(f"model {model_id!r}: {e}") from None
        except ValueError as e:  # the runtime's word for a bad option (e.g. an unknown execution provider)
            raise StartupError(f"model {model_id!r}: {e}; fix: set ATTNSCOPE_PROVIDERS to available ones, or "
                               f"leave it empty for the default") from None
        except OSError as e:
            raise StartupError(f"model {model_id!r}: cannot write its ONNX graph ({e}); fix: point "
                               f"ATTNSCOPE_CACHE at a writable folder") from None
        self.runtimes = self.context.runtimes = {**self.runtimes, model_id: rt}
        self.states[model_id] = "ready"
        log.info("%s ready on %s (%s)", model_id, rt.provider, rt.compute_dtype)

    def _all_loaded(self) -> None:
        for analysis in ANALYSES.values():      # what a first request would otherwise wait for
            if analysis.warm is not None:
                analysis.warm(self.context)
        self.loaded.set()

    def _load_in_background(self, specs: list[ModelSpec]) -> None:
        started = time.perf_counter()
        try:
            # onnxruntime's import, its capped arena and the float16 cast: here, not before the port opens
            open_helpers(self.settings.arena_mb, self.settings.providers, self.settings.place_threads)
            for spec in specs:
                self._load_one(spec)
            self._all_loaded()
            log.info("every model loaded in %.1f s", time.perf_counter() - started)
        except StartupError as e:
            self._stop(str(e))
        except Exception as e:  # noqa: BLE001 - a bug: say so in the same one line, without a traceback's paths
            log.exception("loading the models failed")
            self._stop(f"loading the models failed ({type(e).__name__}); please report it")

    @staticmethod
    def _stop(line: str) -> None:
        """A model that cannot load stops the server as a failed start does: its one line, exit status 3 (the port
        is already open, so the lifespan's failure can no longer say it)."""
        sys.stderr.write(f"attnscope: cannot start: {line}\n")
        sys.stderr.flush()
        os._exit(3)

    @property
    def loading(self) -> dict[str, str]:
        """The models not loaded yet -> their state (empty once every model is served)."""
        return {m: state for m, state in self.states.items() if state != "ready"}

    def job_posts(self):
        """The worker threads that read posted jobs: one at a time. Reading an upload is CPU work under the GIL (JSON,
        counting its texts); eight at once made the event loop wait for the GIL: /healthz took 50 ms, 218 ms before
        the bodies left the event loop. Called on the event loop (anyio makes the limiter there)."""
        if self._job_posts is None:
            self._job_posts = anyio.CapacityLimiter(1)
        return self._job_posts

    def post_job(self, body: Path) -> tuple[Job, bool]:
        """POST /api/jobs, in a worker thread: the body (a file) read as JSON and checked as a JobRequest, planned
        and submitted; (the job, True when queued now)."""
        import json

        from pydantic import ValidationError

        from .errors import NESTED, _too_many_digits
        try:
            obj = json.loads(body.read_bytes())
        except RecursionError:      # nested deeper than Python reads (issue 50): the framework's 400 (app/errors.py)
            raise BadBody(NESTED) from None
        except ValueError as e:
            if _too_many_digits(e):
                raise Refused("a number in the body has more digits than JSON numbers may have here (4,300); send "
                              "a plain integer") from None
            if isinstance(e, UnicodeDecodeError):
                raise BadBody("the request body could not be read: send UTF-8 JSON with Content-Type: "
                              "application/json") from None
            raise Invalid([], not_json=True) from None
        try:
            req = JobRequest.model_validate(obj)
        except ValidationError as e:
            raise Invalid([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
        return self.jobs.submit(plan_job(self.context, req, self.jobs.stage_upload))

    def close(self) -> None:
        """At shutdown: running jobs stop between chunks (interrupted; POST them again to resume)."""
        self.jobs.close()

    @property
    def max_chars(self) -> int:
        return self.context.max_chars

    def graph_file(self, model_id: str, stages: bool) -> Path:
        """The exported graph the model runs (GET /api/models/{id}/onnx), opened when it loaded; a graph its
        capabilities did not let it build is refused, never built here."""
        rt = checks.runtime(self.context, model_id)
        if not isinstance(rt, EncoderDecoderRuntime):
            what = f"the {'stages ' if stages else ''}graph (GET /api/models/{{id}}/onnx)"
            checks.capable(rt, "stacked", what)
            if stages:
                checks.capable(rt, "stages", what)
        return rt.onnx_path(stages)

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=i, title=rt.spec.title, description=rt.spec.description, kind=rt.spec.kind,
                          source=rt.spec.source, architecture=rt.spec.architecture, layers=rt.cfg.n_layers,
                          heads=rt.cfg.n_heads, d_model=rt.cfg.d_model, d_head=rt.cfg.d_head,
                          max_tokens=rt.spec.max_tokens, pair=rt.spec.pair,
                          trained_tokens=rt.spec.trained_tokens, max_positions=rt.cfg.max_positions,
                          provider=rt.provider, kv_heads=rt.cfg.n_kv_heads, predictions=rt.cfg.lm_head,
                          unembedding=rt.cfg.has_unembedding,
                          chat=bool(rt.generation and rt.generation.chat_template),
                          local_layers=list(rt.cfg.local_layers), sliding_window=rt.cfg.sliding_window,
                          head_roles=list(rt.spec.head_roles), explanation=rt.spec.explanation,
                          capabilities=capability_record(rt.capabilities))
                for i, rt in list(self.runtimes.items())]
