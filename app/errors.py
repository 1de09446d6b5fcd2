"""Errors, mapped to HTTP once: every refusal is a JSON body {"detail": "..."} that says what to change.

The service and the plans raise their own errors (below) and the runtime its InputError; none of them knows HTTP.
STATUS maps each to its status code, here and nowhere else; the handlers shape every refusal the same way, and the
NDJSON stream (app/sending.py) writes a refusal that comes once the stream has begun with the same `refusal`.
A 500 is a bug: logged, and answered without paths or tracebacks.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..runtime import InputError
from ..runtime.errors import OutOfMemory
from ..analyses.errors import (BadBody, Busy, Conflict, DiskFull, Invalid, Loading, QueueFull, Refused,
                               TooLarge, UnknownJob, UnknownModel)
from ..analyses.schemas import MAX_INDEX


class StartupError(Exception):
    """The app cannot start: the message is one line saying what is wrong and the command that fixes it."""


STATUS = {Invalid: 422, UnknownModel: 404, UnknownJob: 404, TooLarge: 413, Refused: 422, InputError: 422, Conflict: 409,
          QueueFull: 429, Busy: 503, Loading: 503, DiskFull: 507, OutOfMemory: 507, BadBody: 400}


def refusal(exc: Exception) -> tuple[int, str, dict[str, str] | None] | None:
    """(status, detail, headers) of a service or runtime error; None for anything else (a bug)."""
    for kind, status in STATUS.items():
        if isinstance(exc, kind):
            return status, str(exc), getattr(exc, "headers", None)
    return None


def _clip(text: str, limit: int = 80) -> str:
    """Echo client-supplied text safely: lone surrogates escaped (they cannot be encoded), long names cut."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "…"


LOCATIONS = ("body", "query", "path", "header", "cookie")


def _field(loc) -> str:
    """The field's dotted name: the location FastAPI puts first (body, query, ...) left out, a field of that name
    (QK attribution's `query`) kept."""
    loc = tuple(loc)
    parts = [_clip(str(p)) for p in (loc[1:] if loc and loc[0] in LOCATIONS else loc)]
    return ".".join(parts) or "body"


def _too_many_digits(error: BaseException | None) -> bool:
    """Python refuses to read integers of more than 4,300 digits (sys.get_int_max_str_digits): a ValueError."""
    return isinstance(error, ValueError) and "integer string conversion" in str(error)


NESTED = ("the request body is JSON nested too deeply (Python reads about 1,000 levels of arrays and objects; a "
          "request needs a few)")


def _nested(error: BaseException | None) -> bool:
    """JSON nested deeper than Python's recursion limit: a RecursionError, never a 500 (issue 50)."""
    return isinstance(error, RecursionError)


def _allowed(request: Request) -> list[str]:
    """The methods the app's routes take at the request's path (a path with several routes: GET and POST /api/jobs)."""
    from starlette.routing import Match
    methods = set()

    def walk(routes):
        for route in routes:
            if hasattr(route, "original_router"):          # FastAPI's wrapper of an included router
                walk(route.original_router.routes)
            elif getattr(route, "methods", None) and route.matches(request.scope)[0] != Match.NONE:
                methods.update(route.methods)
    walk(request.app.routes)
    return sorted(methods)


def invalid(errors: list[dict]) -> dict:
    """A request that fails its schema's checks: the 422's body, a line naming the fields and what each needs
    (`detail`), and each error (the routes' answer, and the in-process API's ApiError)."""
    errors = [{"field": _field(e.get("loc", ())), "message": _clip(e.get("msg", "invalid"), 300)} for e in errors]
    return {"detail": "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5]), "errors": errors[:20]}


def install(app: FastAPI, security_headers: list[tuple[bytes, bytes]]) -> None:
    """`security_headers` go on the 500 answer, which Starlette sends from outside every middleware."""
    headers_500 = {k.decode(): v.decode() for k, v in security_headers}

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            return JSONResponse({"detail": "the request body is not valid JSON"}, 400)
        return JSONResponse(invalid(exc.errors()), 422)

    @app.exception_handler(Invalid)
    async def invalid_body(_: Request, exc: Invalid):       # a body a service reads itself (POST /api/jobs)
        if exc.not_json:
            return JSONResponse({"detail": "the request body is not valid JSON"}, 400)
        return JSONResponse(invalid(exc.errors), 422)

    async def refused(_: Request, exc: Exception):
        status, detail, headers = refusal(exc)
        return JSONResponse({"detail": _clip(detail, 1000)}, status, headers=headers)

    for kind in STATUS:
        if kind is not Invalid:
            app.add_exception_handler(kind, refused)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):   # the framework's own: 404 routes, 405, bodies
        detail = exc.detail if isinstance(exc.detail, str) else "request refused"
        status = exc.status_code
        if status == 405:                      # Allow: every route's methods at this path, not the first route's
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(_allowed(request))}
        if status == 400 and detail == "There was an error parsing the body":  # FastAPI's words
            if _nested(exc.__cause__):
                detail = NESTED
            elif _too_many_digits(exc.__cause__):
                status, detail = 422, ("a number in the body has more digits than JSON numbers may have here "
                                       f"(4,300): indices are at most {MAX_INDEX}; send a plain integer")
            else:
                detail = "the request body could not be read: send UTF-8 JSON with Content-Type: application/json"
        return JSONResponse({"detail": _clip(detail, 1000)}, status, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception):  # a bug: say so without leaking paths or tracebacks
        logging.getLogger("attnscope").exception("unhandled error")
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); please report it"}, 500,
                            headers=headers_500)
