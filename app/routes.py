"""REST API routes. One pass per request: validate into a plan (service), run (service -> model runtime),
build the payload (pure functions), encode (wire codec), respond."""
from __future__ import annotations

import asyncio
import time
from typing import Annotated, Callable

import anyio
import numpy as np
import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Path, Response
from fastapi.responses import FileResponse, StreamingResponse

from .. import __version__
from ..model.runtime import to_float16
from . import payload, wire
from .deps import get_service
from .schemas import (AttentionRequest, AttentionResponse, Error, Health, ImportanceRequest, ImportanceResponse,
                      ModelInfo, StagesRequest, StagesResponse)
from .service import AttentionService, Computed, Plan

router = APIRouter()
Service = Annotated[AttentionService, Depends(get_service)]

ERRORS = {
    400: {"model": Error, "description": "The body is not valid JSON"},
    404: {"model": Error, "description": "Unknown model"},
    413: {"model": Error, "description": "Request body or text over its limit"},
    422: {"model": Error, "description": "Invalid option: the message says what is allowed"},
    503: {"model": Error, "description": "Too many model runs waiting; retry after `Retry-After` seconds"},
}
BINARY_DOC = {"content": {wire.BINARY: {"schema": {"type": "string", "format": "binary"}}},
              "description": "Sent when `Accept` names application/vnd.attnscope.tensors: "
                             "b'ATSC', uint32 header length, JSON header, 8-aligned little-endian tensors"}


@router.get("/api/models", response_model=list[ModelInfo], tags=["models"], summary="The model zoo")
def list_models(svc: Service):
    return svc.models()


class BuffersResponse(Response):
    """Sends a list of buffers one after another under one Content-Length (no joining copy)."""

    def __init__(self, buffers: list, media_type: str, headers: dict[str, str]):
        self.buffers = buffers
        super().__init__(None, media_type=media_type, headers=headers)
        self.headers["content-length"] = str(sum(len(b) for b in buffers))

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for i, buf in enumerate(self.buffers):
            await send({"type": "http.response.body", "body": buf, "more_body": i < len(self.buffers) - 1})


def _cast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return to_float16(a) if dtype == np.float16 else np.ascontiguousarray(a, dtype)


def _encode(build: Callable, plan: Plan, computed: Computed, started: float) -> bytes | list:
    """Payload (pure functions) -> wire form. Runs in a worker thread: statistics and serialisation of a
    long text take up to a second, and the event loop must stay free."""
    body = payload.timed(payload.rounded(build(plan, computed), plan.request.precision), computed.result, started)
    if plan.binary:
        return wire.binary_chunks(body, plan.request.dtype, cast=_cast)
    return wire.to_json(body)


async def _answer(svc: AttentionService, plan: Plan, build: Callable, if_none_match: str | None,
                  started: float) -> Response:
    if if_none_match == plan.etag:
        return Response(status_code=304, headers={"ETag": plan.etag})
    computed = await svc.run(plan)
    body = await anyio.to_thread.run_sync(_encode, build, plan, computed, started, limiter=svc.render_slots())
    headers = {"ETag": plan.etag, "X-Cache": "hit" if computed.hit else "miss", "Cache-Control": "private, max-age=3600",
               "Vary": "Accept"}
    if plan.binary:
        return BuffersResponse(body, wire.BINARY, headers)
    return Response(body, media_type="application/json", headers=headers)


PROGRESS_DOC = {
    "schema": {"type": "string", "description": "newline-delimited JSON objects"},
    "example": '{"progress": {"layer": 1, "layers": 30}}\n{"progress": {"layer": 2, "layers": 30}}\n...\n'
               '{"result": {"model": "smollm2", "tokens": ["..."], "attention": [[[[0.1]]]]}}\n'}
ATTENTION_200 = {
    "content": {**BINARY_DOC["content"], wire.NDJSON: PROGRESS_DOC},
    "description": "JSON (AttentionResponse) by default. `Accept: application/vnd.attnscope.tensors`: the binary "
                   "form (b'ATSC', uint32 header length, JSON header, 8-aligned little-endian tensors). "
                   "`Accept: application/x-ndjson`: progress while a long text runs layer by layer, one JSON object "
                   "per line: `{\"progress\": {\"layer\": i, \"layers\": n}}` after each layer (n: the layers "
                   "this run goes through), then `{\"result\": AttentionResponse}`, or `{\"error\": {\"status\", "
                   "\"detail\"}}` for a refusal that comes once the stream has begun (refusals found before it come "
                   "as usual, with their status). A short text gives the result line alone. The run is cached: "
                   "repeat the request with the binary Accept to fetch the same answer as tensors."}


@router.post("/api/attention", response_model=AttentionResponse, tags=["attention"],
             summary="Attention weights, entropy and per-head statistics for a text",
             responses={**ERRORS, 200: ATTENTION_200, 304: {"description": "Not modified (If-None-Match)"}})
async def attention(req: AttentionRequest, svc: Service, accept: Annotated[str | None, Header()] = None,
                    if_none_match: Annotated[str | None, Header()] = None):
    """Weights are [layer][head][query][key]; `entropy` is [layer][head][query] in nats. JSON by default;
    the binary tensor form when `Accept` names application/vnd.attnscope.tensors; progress lines then the JSON
    answer when it names application/x-ndjson.

    Long texts (SmolLM2 reads 4096 tokens by default) run layer by layer: ask for `resolution` thumbnails of
    every head, the full matrices of a few heads, or `top_k` keys per query; `rollout` and the NumPy engine are
    refused there."""
    started = time.perf_counter()
    if wire.accepts(accept, wire.NDJSON):
        plan = svc.plan(req, False)
        return StreamingResponse(_progress_lines(svc, plan, payload.attention, started), media_type=wire.NDJSON,
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    plan = svc.plan(req, wire.accepts_binary(accept))
    return await _answer(svc, plan, payload.attention, if_none_match, started)


@router.post("/api/importance", response_model=ImportanceResponse, tags=["interventions"],
             summary="Rank heads by importance: each head's single-head ablation effect on one text",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def importance(req: ImportanceRequest, svc: Service, accept: Annotated[str | None, Header()] = None,
                     if_none_match: Annotated[str | None, Header()] = None):
    """Knocks out every head in turn (batches of `batch` heads share one forward pass, the batch axis carrying
    the head masks) and reports what each head alone changes: the text's mean token log-prob for models with
    an LM head, the sentence embedding otherwise."""
    started = time.perf_counter()
    plan = svc.plan_importance(req, wire.accepts_binary(accept))
    return await _answer(svc, plan, payload.importance, if_none_match, started)


@router.post("/api/stages", response_model=StagesResponse, tags=["attention"],
             summary="Every step from Q and K to the probabilities, for one layer and head",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def stages(req: StagesRequest, svc: Service, accept: Annotated[str | None, Header()] = None,
                 if_none_match: Annotated[str | None, Header()] = None):
    """Q, K, raw scores Q.K^T, scaled scores, the additive mask, masked scores and softmax probabilities,
    exactly as the model computed them."""
    started = time.perf_counter()
    plan = svc.plan(req, wire.accepts_binary(accept))
    return await _answer(svc, plan, payload.stages, if_none_match, started)


@router.get("/api/models/{model_id}/onnx", tags=["models"], summary="Download the exported ONNX graph",
            response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The .onnx file"},
                       404: ERRORS[404], 422: ERRORS[422]})
def model_onnx(model_id: Annotated[str, Path(examples=["tiny-gpt"])], svc: Service, stages: bool = False):
    """The graph the app runs (open it in Netron). `stages=true` adds the teaching outputs (q, k, scores, ...)."""
    rt = svc.runtime(model_id)
    return FileResponse(rt.onnx_path(stages), media_type="application/octet-stream",
                        filename=f"{model_id}{'-stages' if stages else ''}.onnx")


@router.get("/healthz", response_model=Health, tags=["health"], summary="Readiness, loaded models and model runs")
async def healthz(svc: Service):
    """Answers only once every configured model is loaded (the server does not listen before), and on the event
    loop itself, so it stays prompt while long runs are in flight."""
    return Health(status="ok", models={m.id: m.provider for m in svc.models()}, version=__version__, **svc.runs())


async def _progress_lines(svc: AttentionService, plan: Plan, build: Callable, started: float, every: float = 0.1):
    """The NDJSON form: a progress line whenever another layer is done (the last one always), then the answer or
    the refusal. A client that goes away stops the lines, never the run: it is shared and cached like any other."""
    progress = svc.watch(plan)
    run = asyncio.ensure_future(svc.run(plan))
    shown = None
    try:
        while True:
            done, _ = await asyncio.wait({run}, timeout=every)
            if progress is not None and progress.total and (progress.done, progress.total) != shown:
                shown = (progress.done, progress.total)
                yield orjson.dumps({"progress": {"layer": shown[0], "layers": shown[1]}}) + b"\n"
            if done:
                break
        try:
            computed = run.result()
            body = await anyio.to_thread.run_sync(_encode, build, plan, computed, started, limiter=svc.render_slots())
        except HTTPException as e:
            yield orjson.dumps({"error": {"status": e.status_code, "detail": e.detail}}) + b"\n"
            return
        yield b'{"result":' + body + b"}\n"
    finally:
        if not run.done():
            run.cancel()
