"""The FastAPI application: `uvicorn attnscope.app.main:app` or `attnscope serve`."""
from __future__ import annotations

import ctypes
import inspect
import os
import sys
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from fastapi.staticfiles import StaticFiles

from . import __version__
from . import errors, openapi as published, pages, routers
from .middleware import SECURITY_HEADERS, BodyLimit, HeadAsGet, SameOrigin, SecurityHeaders, StartupFailure
from .service import AttentionService
from .settings import Settings, get_settings, setup_logging
from .wire import BINARY

DESCRIPTION = """
Attention matrices, entropy and the steps of scaled dot-product attention for real transformer models,
computed by onnxruntime from graphs exported from a NumPy reference implementation.

Every answer is a pure function of the request: results are cached and carry an ETag.
Large tensors can be fetched in a compact binary form (`Accept: application/vnd.attnscope.tensors`).
"""


TRIM_BYTES = 8 << 20   # free memory a heap keeps at its top (M_TRIM_THRESHOLD)


def _return_big_frees_to_the_os() -> None:
    """glibc raises its mmap threshold after every large free (up to 32 MB), after which arrays of a few MB live
    in per-thread heaps that fragment and never shrink: a server's RSS creeps up by GBs under load. A fixed 1 MB
    threshold (what MALLOC_MMAP_THRESHOLD_=1048576 would set) hands them straight back. A fixed threshold also fixes
    the heaps' trim threshold at glibc's 128 kB, which gave back, to be faulted in again, the few hundred kB
    temporaries of every answer (MiniLM's last layer at 128 tokens: 160 page faults, its statistics 1.9 ms against
    1.4): up to TRIM_BYTES free at the top of a heap are kept (what MALLOC_TRIM_THRESHOLD_ would set). glibc only;
    an explicit MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ wins."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            libc.mallopt(-3, 1 << 20)      # M_MMAP_THRESHOLD
        if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
            libc.mallopt(-1, TRIM_BYTES)   # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


# No OpenTelemetry spans, metrics or logs (FastAPI's own, where its version has them): an offline tool exports
# nothing, and the checks for a configured provider took 0.2 ms of every answer (bench/ab.py).
_NO_TELEMETRY = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                 if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def create_app(settings: Settings | None = None, background: bool = False) -> FastAPI:
    """The app. background=False: it loads every model before it answers (a program that embeds it, a test's
    TestClient); True: it answers at once, /healthz and the page saying which models are still loading, while they
    load in order (the served app below: `attnscope serve`, uvicorn)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        _return_big_frees_to_the_os()
        # A worker thread that serialises a big answer holds the GIL between its pieces; the event loop asks for
        # it and, by default, waits 5 ms before the holder is told to let go. 1 ms keeps /healthz prompt.
        sys.setswitchinterval(0.001)
        setup_logging()
        if background:
            app.state.service.start()
        else:
            app.state.service.load()
        yield
        app.state.service.close()

    app = FastAPI(title="attnscope", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # /docs is ours: same Swagger UI, without the CDN (app/pages.py)
                  **_NO_TELEMETRY)
    app.state.service = AttentionService(settings)
    generic_openapi = app.openapi

    def openapi() -> dict:  # one request schema per served model: kept once every model is loaded
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = published.per_model(published.with_job_request(generic_openapi()), app.state.service.models(),
                                     settings.max_mask_tokens, settings.max_new_tokens)
        if app.state.service.loaded.is_set():
            app.openapi_schema = schema
        return schema

    app.openapi = openapi
    errors.install(app, SECURITY_HEADERS)
    app.include_router(routers.models)
    for router in routers.analysis_routers():      # one per OpenAPI tag, made from the analyses' registry
        app.include_router(router)
    app.include_router(routers.jobs)
    app.include_router(routers.health)
    app.include_router(pages.router)
    pages.page_bundle()    # the page's script, built at start: a module app/bundle.py cannot read stops it here
    app.mount("/static", StaticFiles(directory=pages.ROOT / "static"), name="static")
    app.mount("/vendor/swagger", StaticFiles(directory=pages.SWAGGER_DIR), name="swagger")
    # level 4: most of the saving at a fraction of level 9's time; tensors are binary floats, not worth it
    app.add_middleware(GZipMiddleware, minimum_size=1000, compresslevel=4,
                       exclude_content_types=DEFAULT_EXCLUDED_CONTENT_TYPES + (BINARY, "application/octet-stream"))
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Content-Type", "Accept", "If-None-Match"])
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       limits={"/api/jobs": settings.max_upload_bytes})   # an uploaded corpus
    app.add_middleware(SameOrigin, cors_origins=settings.cors_origins)   # before any body is read
    app.add_middleware(HeadAsGet)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(StartupFailure)
    return app


app = create_app(background=True)
