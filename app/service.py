"""The service: the served models, loaded once at start-up, and the server-wide parts every request shares.

    svc.plans       validates a request into its plan (app/plans.py)
    svc.runner      the result cache and the run queue (app/runs.py)
    svc.sending     the sending budget and the encoding threads (app/sending.py)
    svc.jobs        the corpus jobs' queue (app/jobs.py)

It knows nothing of HTTP: its refusals are app/errors.py's.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import anyio

from ..runtime import Runtime
from ..runtime.encdec import EncoderDecoderRuntime
from ..sources import ModelUnavailable, resolve, split_entry
from .errors import BadBody, Refused, StartupError
from .jobs import Jobs
from .plans import Planner
from .runs import Runner
from .schemas import Job, JobRequest, ModelInfo
from .sending import Sending
from .settings import Settings

log = logging.getLogger("attnscope")


class AttentionService:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.runtimes: dict[str, Runtime] = {}
        self.runner = Runner(settings.max_inflight, settings.max_queue, settings.cache_mb * 2**20)
        self.sending = Sending(settings.max_sending_mb * 2**20, settings.max_renders)
        self.plans = Planner(self.runtimes, settings)
        self.jobs = Jobs(settings)
        self._job_posts = None

    def load(self) -> None:
        """Build every configured model and open its session (exporting the graph on first start).
        Whatever stops a model from loading becomes one StartupError line naming the fix."""
        st = self.settings
        seen: set[str] = set()
        for entry in st.models:
            model_id = split_entry(entry)[0]
            try:
                spec = resolve(entry, st.model_dirs(), cache=st.cache)
                if spec.id in seen:
                    raise StartupError(f"ATTNSCOPE_MODELS names {spec.id!r} twice; give each model its own name")
                seen.add(spec.id)
                if model_id in st.max_tokens:  # ATTNSCOPE_MAX_TOKENS: up to the model's positions
                    spec = replace(spec, max_tokens=st.max_tokens[model_id])
                kind = EncoderDecoderRuntime if spec.kind == "encoder-decoder" else Runtime
                rt = kind(spec, providers=st.providers or None, threads=st.threads, cache_dir=st.cache,
                          stop_early_mb=st.stop_early_mb, memory_mb=st.memory_mb, work_tflop=st.work_tflop)
                if not 2 <= spec.max_tokens <= rt.cfg.max_positions:
                    raise StartupError(f"ATTNSCOPE_MAX_TOKENS: {model_id}={spec.max_tokens}, but it takes 2 to "
                                       f"{rt.cfg.max_positions} tokens (its positions); fix: set a limit in that range")
                caps = rt.capabilities
                if caps.stacked:
                    rt.session(stages=False)
                if not (caps.stacked and self.plans.fits_stacked(rt, rt.spec.max_tokens)):
                    rt.layerwise(st.checkpoint_every, st.layerwise_group_mb).open()   # long texts: their graphs too
            except ModelUnavailable as e:
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
        self.plans.precompute()
        self.jobs.open()

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

        from fastapi.exceptions import RequestValidationError
        from pydantic import ValidationError

        from .errors import _too_many_digits
        try:
            obj = json.loads(body.read_bytes())
        except ValueError as e:
            if _too_many_digits(e):
                raise Refused("a number in the body has more digits than JSON numbers may have here (4,300); send "
                              "a plain integer") from None
            if isinstance(e, UnicodeDecodeError):
                raise BadBody("the request body could not be read: send UTF-8 JSON with Content-Type: "
                              "application/json") from None
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error",
                                           "input": {}}]) from None
        try:
            req = JobRequest.model_validate(obj)
        except ValidationError as e:
            raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
        return self.jobs.submit(self.plans.job(req, self.jobs.stage_upload))

    def close(self) -> None:
        """At shutdown: running jobs stop between chunks (interrupted; POST them again to resume)."""
        self.jobs.close()

    @property
    def max_chars(self) -> int:
        return self.plans.max_chars

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
                          capabilities=rt.capabilities.record())
                for i, rt in self.runtimes.items()]
