"""The REST API: one router per OpenAPI tag, each analysis' route made from its registry entry (analyses/registry.py).

Every analysis route is the same few lines: parse the headers, plan (the analysis' module validates the request once
into its plan, on the service's planning context), then run, encode and respond (app/sending.py). The models, health and corpus-job routes are the
server's own. Annotations are evaluated here (no `from __future__ import
annotations`): FastAPI reads each route's request model from them.
"""
import time
from typing import Annotated, Literal

import anyio

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse

from ..analyses.base import Analysis
from ..analyses.registry import ANALYSES
from ..graphs.builder import built
from . import __version__, wire
from .schemas import Error, Health, Job, ModelInfo
from .service import AttentionService


async def get_service(request: Request) -> AttentionService:
    """The service every route shares (app.state.service), injected (the analysis routes read it off the request:
    add_analysis). A coroutine, so FastAPI calls it on the event loop: a plain function dependency is run in a worker
    thread, a hand-off each way on every request (~0.3 ms)."""
    return request.app.state.service


Service = Annotated[AttentionService, Depends(get_service)]

ERRORS = {
    400: {"model": Error, "description": "The body is not valid JSON"},
    404: {"model": Error, "description": "Unknown model"},
    413: {"model": Error, "description": "Request body or text over its limit"},
    422: {"model": Error, "description": "Invalid option: the message says what is allowed"},
    503: {"model": Error, "description": "Too many model runs waiting, or the model still loading (the server "
          "answers while its models load: GET /healthz); retry after `Retry-After` seconds"},
    507: {"model": Error, "description": "The run needs more memory than onnxruntime's runs may hold "
          "(ATTNSCOPE_ARENA_MB) or the device has free; the message says what to change"},
}
BINARY = {wire.BINARY: {"schema": {"type": "string", "format": "binary"}}}
NDJSON = {"schema": {"type": "string", "description": "newline-delimited JSON objects"}}
NOT_MODIFIED = {"description": "Not modified (If-None-Match)"}
FORMS = ("JSON by default; the binary tensor form when `Accept` names application/vnd.attnscope.tensors: b'ATSC', "
         "uint32 header length, JSON header, 8-aligned little-endian tensors.")
STREAMS = {   # an analysis' NDJSON form (Accept: application/x-ndjson): what it streams, and an example
    "layers": ('{"progress": {"layer": 1, "layers": 30}}\n{"progress": {"layer": 2, "layers": 30}}\n...\n'
               '{"result": {"model": "smollm2", "tokens": ["..."], "attention": [[[[0.1]]]]}}\n',
               "`Accept: application/x-ndjson`: progress while a long text runs layer by layer, one JSON object per "
               "line: `{\"progress\": {\"layer\": i, \"layers\": n}}` after each layer (n: the layers this run goes "
               "through), then `{\"result\": ...}`. A short text gives the result line alone."),
    "runs": ('{"progress": {"runs": 64, "runs_total": 270, "eta_s": 6.2}}\n{"progress": {"runs": 128, '
             '"runs_total": 270, "eta_s": 4.4}}\n...\n{"result": {"model": "smollm2", "...": "..."}}\n',
             "`Accept: application/x-ndjson`: its progress while it runs, one JSON object per line, "
             "`{\"progress\": {\"runs\": done, \"runs_total\": n, \"eta_s\": seconds left or null}}` as its runs "
             "(one per head, or per head and position) go, then `{\"result\": ...}`. A client that goes away (or "
             "cancels) stops the runs before the next batch, when no other request waits for them."),
}
STREAM_END = (" A refusal that comes once the stream has begun is the line `{\"error\": {\"status\", \"detail\"}}` "
              "(refusals found before it come as usual, with their status). With `Prefer: return=minimal` (RFC 7240) "
              "the last line is `{\"done\": {\"status\": 200, \"tokens\": n}}` instead of the result: the run is "
              "cached, so the same request with the binary Accept then fetches the answer as tensors (what the "
              "page does). A long text's binary answer is also kept on disk (ATTNSCOPE_KEPT_MB): asked again, even "
              "after a restart, it is sent from there (`X-Cache: kept`) and the stream's only line is `{\"done\": "
              "{\"status\": 200, \"tokens\": n, \"kept\": true}}`.")
GENERATE_200 = {
    "content": {wire.NDJSON: NDJSON | {
        "example": '{"token": {"index": 4, "id": 314, "token": "␣jumps", "text": " jumps", "probability": 0.61, '
                   '"sampling_probability": 0.61, "candidates": [{"token": "␣jumps", "id": 314, "probability": 0.61, '
                   '"sampling_probability": 0.61}]}}\n...\n{"done": {"model": "smollm2", "tokens": ["␣jumps", '
                   '"..."], "stop_reason": "max_new_tokens", "seed": 7, "...": "..."}}\n'}},
    "description": "NDJSON, one object per line, each sent when its step is done: `{\"token\": GeneratedToken}` per "
                   "new token, then `{\"done\": GenerateDone}`; or `{\"error\": {\"status\", \"detail\"}}` for a "
                   "refusal that comes once the stream has begun (503 when the run queue is full as the prompt's run "
                   "is admitted). Schemas: components GeneratedToken and GenerateDone."}


def _minimal(prefer: str | None) -> bool:
    """`Prefer: return=minimal` (RFC 7240): a progress stream ends with `done` instead of the answer."""
    return "return=minimal" in (prefer or "").replace(" ", "").lower()


def _answer_200(a: Analysis) -> dict:
    """The OpenAPI 200 of an analysis: JSON, the binary tensor form, and its NDJSON stream where it has one."""
    if a.stream is None:
        return {"content": BINARY, "description": FORMS}
    example, words = STREAMS[a.stream]
    return {"content": BINARY | {wire.NDJSON: NDJSON | {"example": example}}, "description": f"{FORMS} {words}"
            f"{STREAM_END}"}


def _openapi_example(a: Analysis) -> dict:
    """The request body's example in the OpenAPI: the analysis' own (analyses/registry.py)."""
    return {"requestBody": {"content": {"application/json": {"example": a.example}}}}


def _header(name: str, words: str) -> dict:
    return {"name": name, "in": "header", "required": False, "description": words, "schema": {"type": "string"}}


HEADERS = [   # what an analysis route reads of its request's headers, documented as header parameters
    _header("accept", f"`{wire.BINARY}` for the binary tensor form, `{wire.NDJSON}` for progress lines where the "
                      "analysis streams them; JSON otherwise"),
    _header("prefer", "`return=minimal` (RFC 7240): a progress stream ends with `done` instead of the answer"),
    _header("if-none-match", "an answer's ETag: 304 Not Modified when the answer would be the same")]


def add_analysis(router: APIRouter, a: Analysis) -> None:
    """POST /api/{name}: the analysis' route, made from its registry entry. Its one parameter FastAPI reads is the
    body (the analysis' request model); the service and the headers are read off the request: resolving them as
    dependencies took 0.2-0.3 ms of every answer after an idle pause (MiniLM's 128-token answers take 9-25 ms)."""
    if a.stream == "tokens":                    # a generation: NDJSON lines, one per step
        async def lines(req: a.request, request: Request):
            started, svc = time.perf_counter(), request.app.state.service
            return svc.sending.generation(a.plan(svc.context, req, False), svc.runner, started)
        router.post(a.path, tags=[a.tag], summary=a.summary, description=a.description, name=a.name,
                    response_class=StreamingResponse, openapi_extra=_openapi_example(a),
                    responses={**ERRORS, 200: GENERATE_200})(lines)
        return

    async def answer(req: a.request, request: Request):
        started, svc, headers = time.perf_counter(), request.app.state.service, request.headers
        accept = headers.get("accept")
        if a.stream and wire.accepts(accept, wire.NDJSON):
            minimal = _minimal(headers.get("prefer"))   # the answer is fetched next, in binary form; its limit holds
            return svc.sending.stream(a.plan(svc.context, req, minimal), svc.runner, started, minimal)
        plan = a.plan(svc.context, req, wire.accepts_binary(accept))
        return await svc.sending.respond(request, plan, svc.runner, headers.get("if-none-match"), started)
    router.post(a.path, response_model=a.response, tags=[a.tag], summary=a.summary, description=a.description,
                name=a.name, openapi_extra=_openapi_example(a) | {"parameters": HEADERS},
                responses={**ERRORS, 200: _answer_200(a), 304: NOT_MODIFIED})(answer)


def analysis_routers() -> list[APIRouter]:
    """One router per OpenAPI tag, each with its analyses' routes, in the registry's order."""
    routers: dict[str, APIRouter] = {}
    for a in ANALYSES.values():
        add_analysis(routers.setdefault(a.tag, APIRouter()), a)
    return list(routers.values())


# ---- the server's own routes: models, their graphs, corpus jobs, health ---------------------------------------------
models = APIRouter(tags=["models"])
jobs = APIRouter(tags=["jobs"])
health = APIRouter(tags=["health"])


@models.get("/api/models", response_model=list[ModelInfo], summary="The model zoo")
def list_models(svc: Service):
    return svc.models()


@models.get("/api/models/{model_id}/onnx", summary="Download the exported ONNX graph", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The .onnx file"},
                       404: ERRORS[404], 422: ERRORS[422]})
def model_onnx(model_id: Annotated[str, Path(examples=["tiny-gpt"])], svc: Service, stages: bool = False):
    """The graph the app runs (open it in Netron). `stages=true` adds the teaching outputs (q, k, scores, ...)."""
    return FileResponse(svc.graph_file(model_id, stages), media_type="application/octet-stream",
                        filename=f"{model_id}{'-stages' if stages else ''}.onnx")


JOB_ERRORS = {404: {"model": Error, "description": "Unknown job"},
              409: {"model": Error, "description": "The job is not in a state that allows this (cancelling a "
                    "finished job; the result of one not done)"},
              422: ERRORS[422]}
JobId = Annotated[str, Path(pattern="^[0-9a-f]{16}$", description="a job id from POST or GET /api/jobs",
                            examples=["3f2a9c1d0b7e4a65"])]


# POST /api/jobs reads its body itself (a corpus of up to ATTNSCOPE_MAX_UPLOAD_BYTES): streamed to a file, then
# parsed, checked and counted in a worker thread, so that uploads never hold up the event loop (/healthz). Its body
# is JobRequest all the same: the OpenAPI says so (app/openapi.py adds the schema).
JOB_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/JobRequest"}}}}}
FLUSH_BYTES = 1 << 20          # an upload's body is written to its file in pieces of about this size


@jobs.post("/api/jobs", response_model=Job, status_code=202, openapi_extra=JOB_BODY,
             summary="Start a corpus job: a head atlas (per-head statistics and top examples) over a corpus",
             responses={**ERRORS, 200: {"model": Job, "description": "The same job already queued, running or done"},
                        202: {"model": Job, "description": "Queued (a new job, or a stopped one resumed)"},
                        413: {"model": Error, "description": "The body over ATTNSCOPE_MAX_UPLOAD_BYTES, or a corpus "
                              "over ATTNSCOPE_MAX_JOB_TEXTS texts"},
                        422: {"model": Error, "description": "Invalid option, a malformed upload, an upload with no "
                              "text, a model outside the zoo"},
                        429: {"model": Error, "description": "ATTNSCOPE_MAX_JOBS_QUEUED jobs are waiting"},
                        507: {"model": Error, "description": "The jobs folder would pass its disk budget "
                              "(ATTNSCOPE_MAX_JOBS_DISK_MB)"}})
async def create_job(request: Request, svc: Service, response: Response):
    """The corpus is checked and counted now, and the job queued; GET /api/jobs/{id} follows it. Its id is a hash
    of what it computes: posting the same request again answers the job as it stands, or resumes a cancelled,
    failed or interrupted one from its finished chunks. An upload is kept only when its job is queued."""
    length = request.headers.get("content-length", "")
    announced, token = int(length) if length.isdigit() else 0, object()
    used = await anyio.to_thread.run_sync(svc.jobs.disk_used)
    svc.jobs.receiving(token, announced, used)     # counted with every body being received, as its bytes arrive
    try:
        body = await anyio.to_thread.run_sync(svc.jobs.incoming)
        try:
            with body.open("wb") as f:
                pieces, held, received = [], 0, 0
                async for piece in request.stream():
                    pieces.append(piece)
                    held += len(piece)
                    received += len(piece)
                    svc.jobs.receiving(token, max(announced, received), used)
                    if held >= FLUSH_BYTES:
                        await anyio.to_thread.run_sync(f.write, b"".join(pieces))
                        pieces, held = [], 0
                await anyio.to_thread.run_sync(f.write, b"".join(pieces))
            svc.jobs.received(token)                    # from here its staged upload is what counts
            job, queued = await anyio.to_thread.run_sync(svc.post_job, body, limiter=svc.job_posts())
        finally:
            body.unlink(missing_ok=True)
    finally:
        svc.jobs.received(token)
    response.status_code = 202 if queued else 200
    return job


@jobs.get("/api/jobs", response_model=list[Job], summary="Every job, newest first")
def list_jobs(svc: Service):
    """Including those a previous run of the server left (kept under ATTNSCOPE_JOBS_DIR)."""
    return svc.jobs.list()


@jobs.get("/api/jobs/{job_id}", response_model=Job, summary="A job's state and progress",
            responses=JOB_ERRORS)
def get_job(job_id: JobId, svc: Service):
    """Texts done of the total, the rate in this run and the time left at that rate."""
    return svc.jobs.get(job_id)


@jobs.post("/api/jobs/{job_id}/cancel", response_model=Job, summary="Cancel a queued or running job",
           responses=JOB_ERRORS)
def cancel_job(job_id: JobId, svc: Service):
    """A queued job is cancelled at once; a running one stops after the chunk under way (state cancelling, then
    cancelled), keeping its finished chunks: POST the same request to resume it. No body (Content-Type:
    application/json all the same, as every POST)."""
    return svc.jobs.cancel(job_id)


@jobs.delete("/api/jobs/{job_id}", status_code=204, response_class=Response,
             summary="Delete a job: its record, partial sums, results and upload",
             responses={404: JOB_ERRORS[404], 422: JOB_ERRORS[422],
                        204: {"description": "Deleted: a GET is now 404"}})
def delete_job(job_id: JobId, svc: Service):
    """A queued job leaves the queue; a running one stops after the chunk under way, and its files go then. Its
    upload goes when no other job needs it. The disk budget (ATTNSCOPE_MAX_JOBS_DISK_MB) is freed at once."""
    svc.jobs.delete(job_id)
    return Response(status_code=204)


@jobs.get("/api/jobs/{job_id}/result", summary="Download a finished job's result",
            response_class=FileResponse,
            responses={**JOB_ERRORS, 200: {"description": "The atlas (schema: docs/atlas.md)", "content": {
                "application/json": {"example": {"model": "tiny-gpt", "layers": 4, "heads": 4, "texts": 200,
                                                 "stats": {"induction_mass": [[0.01, 0.2, 0.0, 0.05]]},
                                                 "examples": [[{"top": [], "deciles": [[]]}]]}},
                "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}}}}})
def job_result(job_id: JobId, svc: Service,
               format: Annotated[Literal["json", "parquet"], Query(description="json or parquet")] = "json"):
    """JSON: the whole atlas; Parquet: one row per head (statistics as columns, examples as lists of structs)."""
    path = svc.jobs.result(job_id, format)
    media = "application/json" if format == "json" else "application/vnd.apache.parquet"
    return FileResponse(path, media_type=media, filename=f"atlas-{job_id}.{format}")


@health.get("/healthz", response_model=Health, summary="Readiness, loaded models and model runs")
async def healthz(svc: Service):
    """Answers from the moment the server listens (the models load in the background: `loading` says what each
    is doing until `status` is ok), on the event loop itself, so it stays prompt while long runs are in flight."""
    return Health(status="ok" if svc.loaded.is_set() else "loading", models={m.id: m.provider for m in svc.models()},
                  loading=svc.loading, graphs_built=built(), version=__version__, jobs_skipped=svc.jobs.skipped,
                  kept_hits=svc.sending.kept.hits, **svc.runner.counts())
