"""REST API routes: thin wrappers that validate, call the service and pick the wire form."""
from __future__ import annotations

import time
from typing import Annotated

import anyio

from fastapi import APIRouter, Depends, Header, Path, Response
from fastapi.responses import FileResponse

from . import transport
from .deps import get_service
from .schemas import AttentionRequest, AttentionResponse, Error, Health, ModelInfo, StagesRequest, StagesResponse
from .service import AttentionService

router = APIRouter()
Service = Annotated[AttentionService, Depends(get_service)]

ERRORS = {
    400: {"model": Error, "description": "The body is not valid JSON"},
    404: {"model": Error, "description": "Unknown model"},
    413: {"model": Error, "description": "Request body or text over its limit"},
    422: {"model": Error, "description": "Invalid option: the message says what is allowed"},
    503: {"model": Error, "description": "Too many model runs waiting; retry after `Retry-After` seconds"},
}
BINARY_DOC = {"content": {transport.BINARY: {"schema": {"type": "string", "format": "binary"}}},
              "description": "Sent when `Accept` names application/vnd.attnscope.tensors: "
                             "b'ATSC', uint32 header length, JSON header, 8-aligned little-endian tensors"}


@router.get("/api/models", response_model=list[ModelInfo], tags=["models"], summary="The model zoo")
def list_models(svc: Service):
    return svc.models()


async def _respond(req: AttentionRequest | StagesRequest, svc: AttentionService, accept: str | None,
                   if_none_match: str | None) -> Response:
    """Validate, answer 304 for a known ETag, compute (or reuse), build the payload, pick the wire form."""
    started = time.perf_counter()
    binary, stages = transport.wants_binary(accept), isinstance(req, StagesRequest)
    svc.validate(req)
    etag = svc.etag(req, "binary" if binary else "json")
    if if_none_match == etag:
        return Response(status_code=304, headers={"ETag": etag})
    computed, hit = await svc.compute(req, stages=stages)
    # statistics and serialisation take up to a second for 512 tokens: in a worker thread, a bounded number at once
    body = await anyio.to_thread.run_sync(_body, svc, computed, req, stages, binary, started,
                                          limiter=svc.render_slots())
    headers = {"ETag": etag, "X-Cache": "hit" if hit else "miss", "Cache-Control": "private, max-age=3600",
               "Vary": "Accept"}
    if binary:
        return transport.BuffersResponse(body, transport.BINARY, headers)
    return Response(body, media_type="application/json", headers=headers)


def _body(svc: AttentionService, computed, req: AttentionRequest | StagesRequest, stages: bool, binary: bool,
          started: float) -> bytes | list:
    payload = svc.stages_payload(computed, req) if stages else svc.attention_payload(computed, req, binary)
    payload["timing_ms"] = svc.timing(computed, started)
    if binary:
        return transport.binary_chunks(payload, getattr(req, "dtype", "float32"))
    return transport.to_json(payload, getattr(req, "precision", None))


@router.post("/api/attention", response_model=AttentionResponse, tags=["attention"],
             summary="Attention weights, entropy and per-head statistics for a text",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def attention(req: AttentionRequest, svc: Service, accept: Annotated[str | None, Header()] = None,
                    if_none_match: Annotated[str | None, Header()] = None):
    """Weights are [layer][head][query][key]; `entropy` is [layer][head][query] in nats. JSON by default;
    the binary tensor form when `Accept` names application/vnd.attnscope.tensors."""
    return await _respond(req, svc, accept, if_none_match)


@router.post("/api/stages", response_model=StagesResponse, tags=["attention"],
             summary="Every step from Q and K to the probabilities, for one layer and head",
             responses={**ERRORS, 200: BINARY_DOC, 304: {"description": "Not modified (If-None-Match)"}})
async def stages(req: StagesRequest, svc: Service, accept: Annotated[str | None, Header()] = None,
                 if_none_match: Annotated[str | None, Header()] = None):
    """Q, K, raw scores Q.K^T, scaled scores, the additive mask, masked scores and softmax probabilities,
    exactly as the model computed them."""
    return await _respond(req, svc, accept, if_none_match)


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
    from . import __version__
    return Health(status="ok", models={m.id: m.provider for m in svc.models()}, version=__version__, **svc.runs())
