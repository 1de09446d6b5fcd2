"""REST API routes. One pass per request: validate into a plan (service), run (service -> model runtime),
build the payload (pure functions), encode (wire codec), respond."""
from __future__ import annotations

import time
from typing import Annotated, Callable

import anyio
import numpy as np
from fastapi import APIRouter, Depends, Header, Path, Response
from fastapi.responses import FileResponse

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


@router.post("/api/attention", response_model=AttentionResponse, tags=["attention"],
             summary="Attention weights, entropy and per-head statistics for a text",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def attention(req: AttentionRequest, svc: Service, accept: Annotated[str | None, Header()] = None,
                    if_none_match: Annotated[str | None, Header()] = None):
    """Weights are [layer][head][query][key]; `entropy` is [layer][head][query] in nats. JSON by default;
    the binary tensor form when `Accept` names application/vnd.attnscope.tensors."""
    started = time.perf_counter()
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
             summary="Every step of one head, from the layer input x to its contribution through W_O",
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
