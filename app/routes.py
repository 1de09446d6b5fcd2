"""REST API routes, thin: parse (schemas), plan (app/plans.py), then run, encode and respond (app/sending.py)."""
from __future__ import annotations

import time
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse

from ..graphs.builder import built
from . import __version__
from . import wire
from .deps import get_service
from .schemas import (AttentionRequest, AttentionResponse, CircuitsRequest, CircuitsResponse, Error, GenerateRequest,
                      Health, ImportanceRequest, ImportanceResponse, Job, KnockoutRequest,
                      KnockoutResponse, LensRequest,
                      LensResponse, ModelInfo, PatchingRequest, PatchingResponse, PathPatchingRequest,
                      PathPatchingResponse, QKRequest, QKResponse,
                      StagesRequest, StagesResponse)
from .service import AttentionService

router = APIRouter()
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
BINARY_DOC = {"content": {wire.BINARY: {"schema": {"type": "string", "format": "binary"}}},
              "description": "Sent when `Accept` names application/vnd.attnscope.tensors: "
                             "b'ATSC', uint32 header length, JSON header, 8-aligned little-endian tensors"}


@router.get("/api/models", response_model=list[ModelInfo], tags=["models"], summary="The model zoo")
def list_models(svc: Service):
    return svc.models()


def _minimal(prefer: str | None) -> bool:
    """`Prefer: return=minimal` (RFC 7240): a progress stream ends with `done` instead of the answer."""
    return "return=minimal" in (prefer or "").replace(" ", "").lower()


def streamed_200(example: str, description: str) -> dict:
    """The OpenAPI 200 of an endpoint that answers JSON, the binary tensor form, or progress lines (NDJSON)."""
    ndjson = {"schema": {"type": "string", "description": "newline-delimited JSON objects"}, "example": example}
    return {"content": {**BINARY_DOC["content"], wire.NDJSON: ndjson}, "description": description}


ATTENTION_200 = streamed_200(
    '{"progress": {"layer": 1, "layers": 30}}\n{"progress": {"layer": 2, "layers": 30}}\n...\n'
    '{"result": {"model": "smollm2", "tokens": ["..."], "attention": [[[[0.1]]]]}}\n',
    "JSON (AttentionResponse) by default. `Accept: application/vnd.attnscope.tensors`: the binary "
    "form (b'ATSC', uint32 header length, JSON header, 8-aligned little-endian tensors). "
    "`Accept: application/x-ndjson`: progress while a long text runs layer by layer, one JSON object "
    "per line: `{\"progress\": {\"layer\": i, \"layers\": n}}` after each layer (n: the layers "
    "this run goes through), then `{\"result\": AttentionResponse}`, or `{\"error\": {\"status\", "
    "\"detail\"}}` for a refusal that comes once the stream has begun (refusals found before it come "
    "as usual, with their status). A short text gives the result line alone. With `Prefer: "
    "return=minimal` (RFC 7240) the last line is `{\"done\": {\"status\": 200, \"tokens\": n}}` "
    "instead of the result. The run is cached: repeat the request with the binary Accept to fetch "
    "the same answer as tensors (what the page does).")


@router.post("/api/attention", response_model=AttentionResponse, tags=["attention"],
             summary="Attention weights, entropy and per-head statistics for a text",
             responses={**ERRORS, 200: ATTENTION_200, 304: {"description": "Not modified (If-None-Match)"}})
async def attention(req: AttentionRequest, svc: Service, request: Request,
                    accept: Annotated[str | None, Header()] = None, prefer: Annotated[str | None, Header()] = None,
                    if_none_match: Annotated[str | None, Header()] = None):
    """Weights are [layer][head][query][key]; `entropy` is [layer][head][query] in nats. JSON by default;
    the binary tensor form when `Accept` names application/vnd.attnscope.tensors; progress lines then the JSON
    answer when it names application/x-ndjson.

    Long texts (SmolLM2 reads 4096 tokens by default) run layer by layer: ask for `resolution` thumbnails of
    every head, the full matrices of a few heads, or `top_k` keys per query; `rollout` and the NumPy engine are
    refused there."""
    started = time.perf_counter()
    if wire.accepts(accept, wire.NDJSON):
        minimal = _minimal(prefer)
        plan = svc.plans.attention(req, minimal)   # minimal: the answer is fetched next, in binary form; its limit holds
        return svc.sending.stream(plan, svc.runner, started, minimal)
    plan = svc.plans.attention(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


MANY_RUNS_200 = streamed_200(
    '{"progress": {"runs": 64, "runs_total": 270, "eta_s": 6.2}}\n{"progress": {"runs": 128, '
    '"runs_total": 270, "eta_s": 4.4}}\n...\n{"result": {"model": "smollm2", "...": "..."}}\n',
    "JSON by default; the binary tensor form when `Accept` names application/vnd.attnscope.tensors. "
    "`Accept: application/x-ndjson`: its progress while it runs, one JSON object per line, "
    "`{\"progress\": {\"runs\": done, \"runs_total\": n, \"eta_s\": seconds left or null}}` as its "
    "runs (one per head, or per head and position) go, then `{\"result\": ...}` or `{\"error\": "
    "{\"status\", \"detail\"}}`; with `Prefer: return=minimal` the last line is `{\"done\": "
    "{\"status\": 200, \"tokens\": n}}` and the answer is fetched next from the cache (what the page "
    "does). A client that goes away (or cancels) stops the runs before the next batch, when no other "
    "request waits for them.")


@router.post("/api/importance", response_model=ImportanceResponse, tags=["interventions"],
             summary="Rank heads by importance: each head's single-head ablation effect on one text",
             responses={**ERRORS, 200: MANY_RUNS_200, 304: {"description": "Not modified (If-None-Match)"}})
async def importance(req: ImportanceRequest, svc: Service, request: Request, accept: Annotated[str | None, Header()] = None,
                     prefer: Annotated[str | None, Header()] = None,
                     if_none_match: Annotated[str | None, Header()] = None):
    """Knocks out every head in turn (one run of the text keeps every layer's values; each head's ablated run then
    starts at its own layer, `batch` heads at once along the batch axis) and reports what each head alone changes: the text's mean token log-prob for models with
    an LM head, the sentence embedding otherwise."""
    started = time.perf_counter()
    if wire.accepts(accept, wire.NDJSON):                  # its progress, then the answer (or `done`)
        minimal = _minimal(prefer)
        return svc.sending.stream(svc.plans.importance(req, minimal), svc.runner, started, minimal)
    plan = svc.plans.importance(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


@router.post("/api/patching", response_model=PatchingResponse, tags=["interventions"],
             summary="Activation patching: each head's value from one text put into the other's run",
             responses={**ERRORS, 200: MANY_RUNS_200, 304: {"description": "Not modified (If-None-Match)"}})
async def patching(req: PatchingRequest, svc: Service, request: Request, accept: Annotated[str | None, Header()] = None,
                   prefer: Annotated[str | None, Header()] = None,
                   if_none_match: Annotated[str | None, Header()] = None):
    """Patches `site` of every (layer, head) -- or (layer, head, position) -- from the clean run into the corrupt
    one (denoise) or back (noise), and reports the metric at the last position and its recovery,
    (patched - corrupt) / (clean - corrupt). Each patched run reuses the unpatched layers below its site."""
    started = time.perf_counter()
    if wire.accepts(accept, wire.NDJSON):                  # its progress, then the answer (or `done`)
        minimal = _minimal(prefer)
        return svc.sending.stream(svc.plans.patching(req, minimal), svc.runner, started, minimal)
    plan = svc.plans.patching(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


@router.post("/api/path_patching", response_model=PathPatchingResponse, tags=["interventions"],
             summary="Path patching: sender heads' corrupt outputs along their direct paths into receivers' inputs",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def path_patching(req: PathPatchingRequest, svc: Service, request: Request,
                        accept: Annotated[str | None, Header()] = None,
                        if_none_match: Annotated[str | None, Header()] = None):
    """Wang et al. 2023's path patching: the clean run with the senders' outputs taken from the corrupt run and every
    other head frozen at its clean output; the receivers' `receiver_input` read there is put into the clean run (or,
    without receivers, that run's logits read), and the metric at the last position reported with its recovery.
    Without `senders`, each head alone: a [layer][head] map."""
    started = time.perf_counter()
    plan = svc.plans.path_patching(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


@router.post("/api/knockout", response_model=KnockoutResponse, tags=["interventions"],
             summary="Attention knockout: queries stop reading keys in a range of layers; the prediction's change",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def knockout(req: KnockoutRequest, svc: Service, request: Request, accept: Annotated[str | None, Header()] = None,
                   if_none_match: Annotated[str | None, Header()] = None):
    """In layers `layers` every head's `queries` stop reading `keys` (each such row's other weights renormalised by
    the softmax); the answer is the next-token prediction before and after, and each token's log-prob change."""
    started = time.perf_counter()
    plan = svc.plans.knockout(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


@router.post("/api/qk", response_model=QKResponse, tags=["circuits"],
             summary="QK attribution: why a head attends to a key, split into query-side x key-side components",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def qk(req: QKRequest, svc: Service, request: Request, accept: Annotated[str | None, Header()] = None,
             if_none_match: Annotated[str | None, Header()] = None):
    """Head `head` of `layer`'s scaled score at (`query`, `key`), the `scaled` step of /api/stages, as a table of
    contributions: each part of the residual stream on the query side (the token embedding, each earlier head's
    output, each earlier MLP's output, the constant terms) with each part on the key side. The block's norm is
    linear once its scale is frozen at the run's value, and RoPE rotates each part at its own position, so the table
    sums to the score exactly. One run of the text serves every head and cell of it."""
    started = time.perf_counter()
    plan = svc.plans.qk(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


@router.post("/api/lens", response_model=LensResponse, tags=["circuits"],
             summary="Logit lens: the residual stream after each block read as next-token predictions; a head's "
             "promoted and suppressed tokens",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def lens(req: LensRequest, svc: Service, request: Request, accept: Annotated[str | None, Header()] = None,
               if_none_match: Annotated[str | None, Header()] = None):
    """Every row is the stream after the embeddings or after a block, through the final norm and the unembedding
    (the last row is the model's own prediction). With `head_lens` [layer, head]: that head's output at each position
    through the final norm (its scale frozen at the run's value) and the unembedding, its direct effect on the
    logits, as the tokens it promotes and suppresses most. Models with an unembedding only."""
    started = time.perf_counter()
    plan = svc.plans.lens(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


@router.post("/api/circuits", response_model=CircuitsResponse, tags=["circuits"],
             summary="Weight-space circuits: each head's OV copying score, and Q-, K- and V-composition between heads",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def circuits(req: CircuitsRequest, svc: Service, request: Request,
                   accept: Annotated[str | None, Header()] = None,
                   if_none_match: Annotated[str | None, Header()] = None):
    """From the weights alone (Elhage et al. 2021), norms' weights folded in: how much each head copies the tokens
    it attends to, and how much each head's output feeds each later head's queries, keys and values (grouped-query
    aware: a head's keys and values are its key/value head's)."""
    started = time.perf_counter()
    plan = svc.plans.circuits(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


GENERATE_200 = {
    "content": {wire.NDJSON: {
        "schema": {"type": "string", "description": "newline-delimited JSON objects"},
        "example": '{"token": {"index": 4, "id": 314, "token": "␣jumps", "text": " jumps", "probability": 0.61, '
                   '"sampling_probability": 0.61, "candidates": [{"token": "␣jumps", "id": 314, "probability": 0.61, '
                   '"sampling_probability": 0.61}]}}\n...\n{"done": {"model": "smollm2", "tokens": ["␣jumps", '
                   '"..."], "stop_reason": "max_new_tokens", "seed": 7, "...": "..."}}\n'}},
    "description": "NDJSON, one object per line, each sent when its step is done: `{\"token\": GeneratedToken}` per "
                   "new token, then `{\"done\": GenerateDone}`; or `{\"error\": {\"status\", \"detail\"}}` for a "
                   "refusal that comes once the stream has begun (503 when the run queue is full as the prompt's run "
                   "is admitted). Schemas: components GeneratedToken and GenerateDone."}


@router.post("/api/generate", tags=["generation"], summary="Generate text token by token, streamed with each "
             "token's probabilities and attention", response_class=StreamingResponse,
             responses={**ERRORS, 200: GENERATE_200})
async def generate(req: GenerateRequest, svc: Service):
    """Each new token costs one position (a key/value cache), and each step waits for a run slot like any other
    run, so generations take turns with the rest. Heads in `interventions.ablate` stay knocked out in every step.
    The stream stops when the client goes away, at the end of the step under way."""
    started = time.perf_counter()
    plan = svc.plans.generate(req)
    return svc.sending.generation(plan, svc.runner, started)


@router.post("/api/stages", response_model=StagesResponse, tags=["attention"],
             summary="Every step of one head, from the layer input x to its contribution through W_O",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def stages(req: StagesRequest, svc: Service, request: Request,
                 accept: Annotated[str | None, Header()] = None,
                 if_none_match: Annotated[str | None, Header()] = None):
    """Q, K, raw scores Q.K^T, scaled scores, the additive mask, masked scores and softmax probabilities,
    exactly as the model computed them."""
    started = time.perf_counter()
    plan = svc.plans.stages(req, wire.accepts_binary(accept))
    return await svc.sending.respond(request, plan, svc.runner, if_none_match, started)


@router.get("/api/models/{model_id}/onnx", tags=["models"], summary="Download the exported ONNX graph",
            response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The .onnx file"},
                       404: ERRORS[404], 422: ERRORS[422]})
def model_onnx(model_id: Annotated[str, Path(examples=["tiny-gpt"])], svc: Service, stages: bool = False):
    """The graph the app runs (open it in Netron). `stages=true` adds the teaching outputs (q, k, scores, ...)."""
    return FileResponse(svc.plans.graph_file(model_id, stages), media_type="application/octet-stream",
                        filename=f"{model_id}{'-stages' if stages else ''}.onnx")


JOB_ERRORS = {404: {"model": Error, "description": "Unknown job"},
              409: {"model": Error, "description": "The job is not in a state that allows this (cancelling a "
                    "finished job; the result of one not done)"},
              422: ERRORS[422]}
JobId = Annotated[str, Path(pattern="^[0-9a-f]{16}$", description="a job id from POST or GET /api/jobs",
                            examples=["3f2a9c1d0b7e4a65"])]


# POST /api/jobs reads its body itself (a corpus of up to ATTNSCOPE_MAX_UPLOAD_BYTES): streamed to a file, then
# parsed, checked and counted in a worker thread, so that uploads never hold up the event loop (/healthz). Its body
# is JobRequest all the same: the OpenAPI says so (app/main.py adds the schema).
JOB_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/JobRequest"}}}}}
FLUSH_BYTES = 1 << 20          # an upload's body is written to its file in pieces of about this size


@router.post("/api/jobs", response_model=Job, status_code=202, tags=["jobs"], openapi_extra=JOB_BODY,
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
    await anyio.to_thread.run_sync(svc.jobs.check_disk, int(length) if length.isdigit() else 0)
    body = await anyio.to_thread.run_sync(svc.jobs.incoming)
    try:
        with body.open("wb") as f:
            pieces, held = [], 0
            async for piece in request.stream():
                pieces.append(piece)
                held += len(piece)
                if held >= FLUSH_BYTES:
                    await anyio.to_thread.run_sync(f.write, b"".join(pieces))
                    pieces, held = [], 0
            await anyio.to_thread.run_sync(f.write, b"".join(pieces))
        job, queued = await anyio.to_thread.run_sync(svc.post_job, body, limiter=svc.job_posts())
    finally:
        body.unlink(missing_ok=True)
    response.status_code = 202 if queued else 200
    return job


@router.get("/api/jobs", response_model=list[Job], tags=["jobs"], summary="Every job, newest first")
def list_jobs(svc: Service):
    """Including those a previous run of the server left (kept under ATTNSCOPE_JOBS_DIR)."""
    return svc.jobs.list()


@router.get("/api/jobs/{job_id}", response_model=Job, tags=["jobs"], summary="A job's state and progress",
            responses=JOB_ERRORS)
def get_job(job_id: JobId, svc: Service):
    """Texts done of the total, the rate in this run and the time left at that rate."""
    return svc.jobs.get(job_id)


@router.delete("/api/jobs/{job_id}", response_model=Job, tags=["jobs"], summary="Cancel a queued or running job",
               responses=JOB_ERRORS)
def cancel_job(job_id: JobId, svc: Service):
    """A queued job is cancelled at once; a running one stops after the chunk under way (state cancelling, then
    cancelled), keeping its finished chunks: POST the same request to resume it."""
    return svc.jobs.cancel(job_id)


@router.get("/api/jobs/{job_id}/result", tags=["jobs"], summary="Download a finished job's result",
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


@router.get("/healthz", response_model=Health, tags=["health"], summary="Readiness, loaded models and model runs")
async def healthz(svc: Service):
    """Answers from the moment the server listens (the models load in the background: `loading` says what each
    is doing until `status` is ok), on the event loop itself, so it stays prompt while long runs are in flight."""
    return Health(status="ok" if svc.loaded.is_set() else "loading", models={m.id: m.provider for m in svc.models()},
                  loading=svc.loading, graphs_built=built(), version=__version__, jobs_skipped=svc.jobs.skipped,
                  **svc.runner.counts())
