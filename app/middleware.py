"""ASGI middleware: request-body limit, security headers, and a one-line start-up failure."""
from __future__ import annotations

import sys

import orjson

from .errors import StartupError, TooLarge

CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer"),
                    (b"cross-origin-opener-policy", b"same-origin")]
_SECURITY_NAMES = {name for name, _ in SECURITY_HEADERS}


class SecurityHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":  # exactly one of each, whoever set them before
                message["headers"] = [(k, v) for k, v in message.get("headers", [])
                                      if k.lower() not in _SECURITY_NAMES] + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyLimit:
    """Refuse bodies over max_bytes with 413, whether announced by Content-Length or streamed; `limits`: a path's
    own limit instead (POST /api/jobs carries an uploaded corpus: ATTNSCOPE_MAX_UPLOAD_BYTES). A body is read whole
    before the app sees it, except at the paths in `limits`: their route streams the body to a file itself (app/
    routes.py create_job), and the body's pieces are counted as they come, a 413 (TooLarge) once past the limit."""

    def __init__(self, app, max_bytes: int, limits: dict[str, int] | None = None):
        self.app, self.max_bytes, self.limits = app, max_bytes, limits or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.limits.get(scope["path"], self.max_bytes)
        setting = "ATTNSCOPE_MAX_UPLOAD_BYTES" if scope["path"] in self.limits else "ATTNSCOPE_MAX_BODY_BYTES"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await self._refuse(send, limit, setting)
        if scope["path"] in self.limits:
            received = 0

            async def counted():
                nonlocal received
                message = await receive()
                received += len(message.get("body", b""))
                if received > limit:
                    raise TooLarge(f"request body over the {limit:,}-byte limit ({setting})")
                return message

            return await self.app(scope, counted, send)
        pieces, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            pieces.append(message.get("body", b""))
            size += len(pieces[-1])
            more = message.get("more_body", False)
            if size > limit:
                return await self._refuse(send, limit, setting)
        body, sent = b"".join(pieces), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send, limit: int, setting: str):
        detail = {"detail": f"request body over the {limit:,}-byte limit ({setting})"}
        body = orjson.dumps(detail)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})  # SecurityHeaders, outside this, adds the rest
        await send({"type": "http.response.body", "body": body})


class StartupFailure:
    """A StartupError reaches the server as its own line (what is wrong, the command that fixes it) instead of
    the traceback Starlette hands over; the server then exits non-zero."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def send_plain(message):
            error = sys.exc_info()[1]  # Starlette sends the failure from inside its `except` block
            if message["type"] == "lifespan.startup.failed" and isinstance(error, StartupError):
                message = {**message, "message": f"attnscope: cannot start: {error}"}
            await send(message)

        await self.app(scope, receive, send_plain)
