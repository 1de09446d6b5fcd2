"""The Python API in-process: the server's own service, with no server.

    m = attnscope.load("smollm2")             # a Model: every analysis of the registry, answered here
    m.qk("The cat sat on the mat. The cat", layer=1, head=0, query=7, key=2).top
    m("The cat sat.")                          # the Runtime's own call (an AttentionResult), as before; m.runtime

Each call is what the route does, without HTTP: the request checked by its analysis' request model, planned by its
analysis' module, computed through its Runner (the result cache, run slots), its payload built and encoded in the
binary wire form by app/sending.encode, then decoded (app/wire.py) -- exactly what python/client.py decodes from the
server. The service's coroutines run on an event loop of the Model's own, in a thread, so a notebook's running loop
is never in the way.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, ValidationError

from ..analyses.errors import Invalid
from ..analyses.registry import ANALYSES
from ..app import wire
from ..app.errors import invalid, refusal
from ..app.settings import Settings
from .api import Analyses
from .client import ApiError

BY_PATH = {a.path: a for a in ANALYSES.values()}   # the registry's analyses by their route


def _request(path: str, body: dict) -> BaseModel:
    try:
        return BY_PATH[path].request.model_validate(body)
    except ValidationError as e:
        raise ApiError(422, invalid([{**err, "loc": ("body", *err["loc"])} for err in e.errors()])["detail"]) from None


class Model(Analyses):
    """One served model (or several, as settings name them), in this process. `runtime` is model_id's Runtime; the
    Runtime's own attributes (run, cfg, model: the NumPy model, ...) are the Model's too, as load() gave it before."""

    def __init__(self, runtime=None, *, settings: Settings | None = None):
        """From a Runtime already built (Model(rt)), or from settings naming the models to load (load() does)."""
        from ..app.service import AttentionService

        if settings is None:
            settings = Settings(models=[runtime.spec.id], default_model=runtime.spec.id, cache=runtime.cache_dir,
                                compute_dtype=runtime.compute_dtype)
        self.settings = settings
        self.service = svc = AttentionService(settings)
        if runtime is not None:
            svc.runtimes[runtime.spec.id] = runtime
        else:
            svc.load()
        self.model_id = settings.default_model if settings.default_model in svc.runtimes else next(iter(svc.runtimes))
        self._jobs_open = False
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="attnscope-model").start()

    # ---- the Runtime, as load() gave it before -----------------------------------------------------------------------
    @property
    def runtime(self):
        return self.service.runtimes[self.model_id]

    def __call__(self, *args, **kwargs):
        return self.runtime(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("service", "settings", "model_id"):
            raise AttributeError(name)
        return getattr(self.runtime, name)

    def __repr__(self) -> str:
        return f"<attnscope.Model {self.model_id!r} in-process: {', '.join(self.service.runtimes)}>"

    def models(self) -> list[dict]:
        """GET /api/models: each served model's description and capabilities."""
        return [m.model_dump(mode="json") for m in self.service.models()]

    def _boot(self) -> dict:
        from ..app.pages import architectures, boot_block

        svc = self.service
        return boot_block(self.models(), default_model=svc.settings.default_model, max_chars=svc.max_chars,
                          max_new_tokens=svc.settings.max_new_tokens,
                          architectures=architectures(svc.runtimes.values()))

    # ---- the route's path, without HTTP ------------------------------------------------------------------------------
    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _refused(self, e: Exception):
        answer = refusal(e)
        if answer is None:
            raise e
        raise ApiError(answer[0], answer[1]) from None

    def _post(self, path: str, body: dict) -> dict:
        from ..app.sending import encode

        req = _request(path, body)
        started = time.perf_counter()
        try:
            plan = BY_PATH[path].plan(self.service.context, req, True)
            computed = self._run(plan.compute(self.service.runner))
        except Exception as e:  # noqa: BLE001 - a refusal becomes the API's ApiError; anything else propagates
            self._refused(e)
        return wire.from_binary(b"".join(encode(plan, computed, started)))

    def _lines(self, path: str, body: dict) -> Iterator[dict]:
        """A generation's lines, each as the NDJSON stream carries it (JSON), made one step at a time."""
        req = _request(path, body)
        try:
            plan = BY_PATH[path].plan(self.service.context, req, False)
        except Exception as e:  # noqa: BLE001
            self._refused(e)
        lines = plan.lines(self.service.runner, time.perf_counter())
        try:
            while True:
                try:
                    line = self._run(lines.__anext__())
                except StopAsyncIteration:
                    return
                except Exception as e:  # noqa: BLE001
                    self._refused(e)
                yield json.loads(wire.to_json(line))
        finally:
            if self._loop.is_running():          # a generation stopped early (or ended): its steps end here
                self._run(lines.aclose())

    # ---- corpus jobs: the service's Jobs ---------------------------------------------------------------------------
    def _jobs(self):
        if not self._jobs_open:
            self.service.jobs.open()
            self._jobs_open = True
        return self.service.jobs

    def _job_post(self, body: dict) -> dict:
        jobs = self._jobs()
        path = jobs.incoming()
        try:
            path.write_text(json.dumps(body))
            job, _ = self.service.post_job(path)
        except Exception as e:  # noqa: BLE001
            if isinstance(e, Invalid):
                raise ApiError(400 if e.not_json else 422, e.args[0] if e.not_json else invalid(e.errors)["detail"]
                               ) from None
            self._refused(e)
        finally:
            path.unlink(missing_ok=True)
        return job.model_dump(mode="json")

    def _job_list(self) -> list[dict]:
        return [job.model_dump(mode="json") for job in self._jobs().list()]

    def _job_get(self, job_id: str) -> dict:
        try:
            return self._jobs().get(job_id).model_dump(mode="json")
        except Exception as e:  # noqa: BLE001
            self._refused(e)

    def _job_cancel(self, job_id: str) -> dict:
        try:
            return self._jobs().cancel(job_id).model_dump(mode="json")
        except Exception as e:  # noqa: BLE001
            self._refused(e)

    def _job_delete(self, job_id: str) -> None:
        try:
            self._jobs().delete(job_id)
        except Exception as e:  # noqa: BLE001
            self._refused(e)

    def _job_result(self, job_id: str) -> dict:
        try:
            return json.loads(Path(self._jobs().result(job_id, "json")).read_text())
        except Exception as e:  # noqa: BLE001
            self._refused(e)

    def close(self) -> None:
        """Stop running jobs between chunks, and this Model's event loop."""
        if self._jobs_open:
            self.service.close()
        self._loop.call_soon_threadsafe(self._loop.stop)


def load(model_id: str, *, folder: str | Path | None = None, cache_dir: str | Path | None = None,
         providers=None, threads: int = 0, compute_dtype: str | None = None) -> Model:
    """A zoo model, ready to run in this process: `load("minilm")("The cat sat.")` (the Runtime's call, as before)
    and every analysis (`load("smollm2").patching(...)`). `folder` overrides where its files come from; any other
    model (a folder, a GGUF file, hf:ORG/REPO): Model(settings=Settings(models=["NAME=PATH"])). compute_dtype: what
    its matrix products run in, "float32" (exact) or a fast mode ("float16"; on a GPU "bfloat16" or "tf32"),
    labelled in every answer; default ATTNSCOPE_COMPUTE_DTYPE, as the server's."""
    from ..runtime.runtime import load as runtime
    from ..app.settings import get_settings

    settings = get_settings()            # the graph cache: ATTNSCOPE_CACHE, as the server's
    rt = runtime(model_id, folder=folder, cache_dir=cache_dir or settings.cache, providers=providers, threads=threads,
                 compute_dtype=compute_dtype or settings.compute_dtype)
    return Model(rt)
