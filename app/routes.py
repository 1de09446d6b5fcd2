"""REST API routes. One pass per request: validate into a plan (service), run (service -> model runtime),
build the payload (pure functions), encode (wire codec), respond."""
from __future__ import annotations

import asyncio
import time
from typing import Annotated, Callable

import anyio
import numpy as np
from fastapi import APIRouter, Depends, Header, HTTPException, Path, Request, Response
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


SLICE = 1 << 20  # bytes per write: the server then buffers at most about this much per connection


class BuffersResponse(Response):
    """Sends a list of buffers under one Content-Length, a slice of at most SLICE bytes per write (no joining
    copy; uvicorn waits for a slow reader to drain before each write). `release` runs when it is sent or the
    client has gone: it gives back the answer's share of the server's sending budget."""

    def __init__(self, buffers: list, media_type: str, headers: dict[str, str], release=None):
        self.buffers, self.release = buffers, release
        super().__init__(None, media_type=media_type, headers=headers)
        self.headers["content-length"] = str(sum(len(b) for b in buffers))

    async def __call__(self, scope, receive, send):
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            slices = [memoryview(b)[i:i + SLICE] for b in self.buffers for i in range(0, len(b), SLICE)]
            self.buffers = None
            for i, piece in enumerate(slices):
                await send({"type": "http.response.body", "body": piece, "more_body": i < len(slices) - 1})
            if not slices:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if self.release is not None:
                await self.release()


def _cast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return to_float16(a) if dtype == np.float16 else np.ascontiguousarray(a, dtype)


def _encode(build: Callable, plan: Plan, computed: Computed, started: float) -> list:
    """Payload (pure functions) -> wire form, as a list of buffers. Runs in a worker thread, in pieces that each
    hold the GIL briefly: statistics and serialisation of a long text take up to a second, and the event loop
    must stay free. timing_ms is written last, so its total covers the serialisation."""
    body = payload.rounded(build(plan, computed), plan.request.precision)

    def timing() -> dict:
        return payload.timed({}, computed.result, started)
    if plan.binary:
        return wire.binary_chunks(body, plan.request.dtype, cast=_cast, late=timing)
    return wire.json_chunks(body, late=timing)


def _answer_bytes(plan: Plan, tokens: int) -> int:
    """About how many bytes an answer over `tokens` tokens will be: its share of the sending budget."""
    req = plan.request
    if plan.job == "importance":
        return 16 * plan.runtime.cfg.n_layers * plan.runtime.cfg.n_heads + 100 * tokens
    if plan.stages:
        n = min(req.limit or tokens, tokens)
        return 8 * n * (n + plan.runtime.cfg.d_head) * (4 if plan.binary else 12)
    side = min(tokens, req.resolution or tokens)
    cells = len(plan.layers) * len(plan.heads) * (2 * tokens * min(req.top_k, tokens) if req.top_k else side * side) \
        if "attention" in req.include else 0    # top_k: its keys and weights
    per = (4 if req.dtype == "float32" or req.top_k else 2) if plan.binary else (req.precision or 9) + 3
    return cells * per + 64 * tokens * len(plan.layers) * len(plan.heads) + 100 * tokens


def _most_tokens(plan: Plan) -> int:
    """More tokens than the text can make: the model's limit, or one per UTF-8 byte (and specials) below it."""
    req = plan.request
    return min(plan.runtime.spec.max_tokens, len(req.text.encode()) + len((req.text_pair or "").encode()) + 4)


async def _until_gone(request: Request) -> None:
    """Returns when the client has gone (the body is read by then, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _while_connected(request: Request, work):
    """Await `work` unless the client goes first: then it is cancelled (a queued run nobody waits for is
    dropped) and None is returned."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_until_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return task.result() if not task.cancelled() else None


CLIENT_GONE = 499  # nginx's code for "client closed the request"; nobody receives it


async def _answer(svc: AttentionService, request: Request, plan: Plan, build: Callable, if_none_match: str | None,
                  started: float) -> Response:
    """Run, build and send one answer. A big answer first reserves its bytes of the server's sending budget,
    sized for the most tokens its text can make, before its run: requests beyond the budget wait holding
    nothing (not a 76 MB result each), and give up when their client does. The reservation shrinks to the
    real size after the run and is returned when the last byte is handed over or the client has gone."""
    if if_none_match == plan.etag:
        return Response(status_code=304, headers={"ETag": plan.etag})
    reserved = _answer_bytes(plan, _most_tokens(plan))
    if reserved < SLICE:                                # small answers need no reservation
        reserved = 0
    elif await _while_connected(request, svc.sending.acquire(reserved)) is None:
        return Response(status_code=CLIENT_GONE)

    async def release():
        if reserved:
            await svc.sending.release(reserved)
    try:
        computed = await _while_connected(request, svc.run(plan))
        if computed is None:
            await release()
            return Response(status_code=CLIENT_GONE)
        size = _answer_bytes(plan, len(computed.tokens))
        if reserved > size:                             # the text made fewer tokens than it could have
            await svc.sending.release(reserved - size)
            reserved = size
        body = await anyio.to_thread.run_sync(_encode, build, plan, computed, started, limiter=svc.render_slots())
    except BaseException:
        await release()
        raise
    headers = {"ETag": plan.etag, "X-Cache": "hit" if computed.hit else "miss", "Cache-Control": "private, max-age=3600",
               "Vary": "Accept"}
    return BuffersResponse(body, wire.BINARY if plan.binary else "application/json", headers, release)


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
                   "as usual, with their status). A short text gives the result line alone. With `Prefer: "
                   "return=minimal` (RFC 7240) the last line is `{\"done\": {\"status\": 200, \"tokens\": n}}` "
                   "instead of the result. The run is cached: repeat the request with the binary Accept to fetch "
                   "the same answer as tensors (what the page does)."}


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
        minimal = "return=minimal" in (prefer or "").replace(" ", "").lower()
        plan = svc.plan(req, minimal)   # minimal: the answer is fetched next, in binary form; its size limit holds
        return StreamingResponse(_progress_lines(svc, plan, payload.attention, started, minimal),
                                 media_type=wire.NDJSON, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                                                  "Vary": "Accept, Prefer"})
    plan = svc.plan(req, wire.accepts_binary(accept))
    return await _answer(svc, request, plan, payload.attention, if_none_match, started)


@router.post("/api/importance", response_model=ImportanceResponse, tags=["interventions"],
             summary="Rank heads by importance: each head's single-head ablation effect on one text",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def importance(req: ImportanceRequest, svc: Service, request: Request, accept: Annotated[str | None, Header()] = None,
                     if_none_match: Annotated[str | None, Header()] = None):
    """Knocks out every head in turn (batches of `batch` heads share one forward pass, the batch axis carrying
    the head masks) and reports what each head alone changes: the text's mean token log-prob for models with
    an LM head, the sentence embedding otherwise."""
    started = time.perf_counter()
    plan = svc.plan_importance(req, wire.accepts_binary(accept))
    return await _answer(svc, request, plan, payload.importance, if_none_match, started)


@router.post("/api/stages", response_model=StagesResponse, tags=["attention"],
             summary="Every step of one head, from the layer input x to its contribution through W_O",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def stages(req: StagesRequest, svc: Service, request: Request,
                 accept: Annotated[str | None, Header()] = None,
                 if_none_match: Annotated[str | None, Header()] = None):
    """Q, K, raw scores Q.K^T, scaled scores, the additive mask, masked scores and softmax probabilities,
    exactly as the model computed them."""
    started = time.perf_counter()
    plan = svc.plan(req, wire.accepts_binary(accept))
    return await _answer(svc, request, plan, payload.stages, if_none_match, started)


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


async def _progress_lines(svc: AttentionService, plan: Plan, build: Callable, started: float, minimal: bool,
                          every: float = 0.1):
    """The NDJSON form: a progress line whenever another layer is done (the last one always), then the answer
    (`{"done": ...}` alone when `minimal`) or the refusal. A client that goes away stops the lines; its run is
    shared and cached like any other (one already under way finishes, one still queued is dropped)."""
    progress = svc.watch(plan)
    run = asyncio.ensure_future(svc.run(plan))
    shown, reserved = None, 0
    try:
        while True:
            done, _ = await asyncio.wait({run}, timeout=every)
            if progress is not None and progress.total and (progress.done, progress.total) != shown:
                shown = (progress.done, progress.total)
                yield wire.to_json({"progress": {"layer": shown[0], "layers": shown[1]}}) + b"\n"
            if done:
                break
        try:
            computed = run.result()
            if minimal:
                yield wire.to_json({"done": {"status": 200, "tokens": len(computed.tokens)}}) + b"\n"
                return
            reserved = await svc.sending.acquire(_answer_bytes(plan, len(computed.tokens)))
            body = await anyio.to_thread.run_sync(_encode, build, plan, computed, started, limiter=svc.render_slots())
        except HTTPException as e:
            yield wire.to_json({"error": {"status": e.status_code, "detail": e.detail}}) + b"\n"
            return
        yield b'{"result":'
        for chunk in body:
            yield chunk
        yield b"}\n"
    finally:
        if not run.done():
            run.cancel()
        if reserved:
            await svc.sending.release(reserved)
