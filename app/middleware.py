"""ASGI middleware: same-origin state changes, request-body limit, security headers, and a one-line start-up
failure."""
from __future__ import annotations

import sys
from urllib.parse import urlsplit

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


STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _json_type(value: bytes | None) -> bool:
    """application/json (any parameters) or a +json type: what a browser cannot send cross-site without a
    preflight (a form sends only text/plain, urlencoded and multipart)."""
    media = (value or b"").split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def _origin_host(origin: str) -> str | None:
    """An Origin's host[:port], its scheme's default port left out, lower-cased; None for an opaque one ("null")."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return host if port is None or str(port) == _DEFAULT_PORTS[parts.scheme] else f"{host}:{port}"


def _host(value: str) -> str:
    value = value.strip().lower()
    for port in _DEFAULT_PORTS.values():
        if value.endswith(f":{port}") and not value.endswith("]"):
            return value.removesuffix(f":{port}")
    return value


class SameOrigin:
    """Cross-site request forgery: every state-changing request (POST, PUT, PATCH, DELETE) sends a JSON content type
    (415 otherwise; one without a body, such as POST /api/jobs/{id}/cancel, may send none: a browser's form always
    names its type, and its fetch sends an Origin) and, when it sends an `Origin`, the server's own (its `Host`,
    or one of ATTNSCOPE_CORS_ORIGINS) (403 otherwise). A page on another site can then start nothing: its form posts
    text/plain, urlencoded or multipart, and its fetch of JSON is preflighted, which CORS refuses."""

    def __init__(self, app, cors_origins: list[str] | None = None):
        self.app, self.cors = app, [o.rstrip("/").lower() for o in cors_origins or []]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in STATE_CHANGING:
            return await self.app(scope, receive, send)
        headers = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1").strip()
            own = _host(headers.get(b"host", b"").decode("latin-1"))
            if not ("*" in self.cors or text.rstrip("/").lower() in self.cors or _origin_host(text) == own):
                return await _answer(send, 403, f"refused: this request's Origin ({text[:100]}) is not this server's "
                                     f"own; a page on another site cannot change state here (ATTNSCOPE_CORS_ORIGINS "
                                     f"lists the origins allowed)")
        has_body = headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers
        typed = b"content-type" in headers      # a form always sends one, even empty: a bodiless POST may omit it
        if (has_body or typed) and not _json_type(headers.get(b"content-type")):
            return await _answer(send, 415, "send the body as JSON with Content-Type: application/json")
        await self.app(scope, receive, send)


async def _answer(send, status: int, detail: str) -> None:
    """A refusal before the app: {"detail": ...} (SecurityHeaders, outside, adds the rest)."""
    body = orjson.dumps({"detail": detail})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class HeadAsGet:
    """HEAD on every GET route (RFC 9110): the GET's status and headers, no body. A route that takes no GET answers
    HEAD as it answers GET (405)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def no_body(message):
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, no_body)


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
