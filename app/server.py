"""The embedded HTTP server: uvicorn (httptools + uvloop) with connection hygiene it does not have by itself.

`attnscope serve` runs this; so do the tests and the benches (bench.common.server). uvicorn's own options cover
the keep-alive timeout and the backlog, but its httptools parser has no limit on the request line or the
headers (a client streaming an endless header line made it take 170 MB and a full core) and no timeout before
or during a request (an idle connection, unfinished headers and a stalled body stayed open for good). The
protocol below adds, per connection:

- a request target over ATTNSCOPE_MAX_URL_BYTES -> 414; more than ATTNSCOPE_MAX_HEADERS header fields or more
  than ATTNSCOPE_MAX_HEADER_BYTES of them -> 431 (counted on the raw bytes too, so one endless line is cut);
- ATTNSCOPE_TIMEOUT_HEADERS from the connection (or a request's first byte) to the end of its headers, and
  ATTNSCOPE_TIMEOUT_BODY from there to the end of its body -> 408 and closed; an idle connection before any
  request is closed when the first runs out;
- ATTNSCOPE_TIMEOUT_SEND: a client that takes no byte of an answer for that long is dropped;
- ATTNSCOPE_MAX_CONNECTIONS open connections: one more closes the oldest connection that is still sending
  its request or idle (a request being answered is never cut); when there is none, the newcomer gets 503;
- a Host header that names neither a loopback name, ATTNSCOPE_HOST nor an entry of ATTNSCOPE_ALLOWED_HOSTS
  -> 400 (a page elsewhere cannot reach a local server through DNS rebinding). IP literals pass when the
  server listens on every address (0.0.0.0 or ::): rebinding needs a name.

An answer of known length leaves in one write (_OneWrite).

Refusals are JSON {"detail": ...} with the app's security headers, and close the connection. Why uvicorn
and not another server: see README "Serving" (measured with bench/slowloris.py and bench/load.py).
"""
from __future__ import annotations

import ipaddress
import logging
import resource
import sys
import time
from dataclasses import dataclass

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .middleware import SECURITY_HEADERS
from .settings import Settings

log = logging.getLogger("attnscope")
LOOPBACK = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}
WILDCARD = {"0.0.0.0", "::", ""}
REASONS = {400: "Bad Request", 408: "Request Timeout", 414: "URI Too Long", 431: "Request Header Fields Too Large",
           503: "Service Unavailable"}


@dataclass(frozen=True)
class Limits:
    max_connections: int
    max_url_bytes: int
    max_header_bytes: int
    max_headers: int
    timeout_headers: float
    timeout_body: float
    timeout_send: float
    hosts: frozenset[str]        # lower-case names without port; "*" = any
    ip_literals: bool            # any IP address literal passes (server on 0.0.0.0 / ::)

    @classmethod
    def from_settings(cls, st: Settings, host: str) -> "Limits":
        hosts = {h.strip().lower().strip("[]") for h in [*LOOPBACK, host, *st.allowed_hosts] if h.strip()}
        return cls(max_connections=open_connection_cap(st.max_connections), max_url_bytes=st.max_url_bytes,
                   max_header_bytes=st.max_header_bytes, max_headers=st.max_headers,
                   timeout_headers=st.timeout_headers, timeout_body=st.timeout_body, timeout_send=st.timeout_send,
                   hosts=frozenset(hosts - WILDCARD), ip_literals=host in WILDCARD)

    def host_allowed(self, value: bytes | None) -> bool:
        if value is None or "*" in self.hosts:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = value.decode("latin-1").strip().lower()
        if name.startswith("["):                      # [::1]:8000
            name = name[1:name.find("]")] if "]" in name else name
        elif name.count(":") == 1:                    # example.org:8000
            name = name.split(":", 1)[0]
        name = name.rstrip(".")
        if name in self.hosts or name.endswith(".localhost"):
            return True
        if self.ip_literals:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                pass
        return False


def open_connection_cap(wanted: int) -> int:
    """Raise the open-file limit to its hard maximum where allowed, and keep the connection cap 64 files under
    it (graphs, static files, the model's own files): without the cap, stalled clients exhaust the
    descriptors and everyone is locked out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - 64))


def _refusal(status: int, detail: str) -> bytes:
    body = orjson.dumps({"detail": detail})
    head = [f"HTTP/1.1 {status} {REASONS[status]}".encode(), b"content-type: application/json",
            b"content-length: " + str(len(body)).encode(), b"connection: close"]
    head += [name + b": " + value for name, value in SECURITY_HEADERS]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class _OneWrite:
    """The connection's transport as one answer's cycle writes to it: an answer of known length (Content-Length) is
    held, head and body, until its last piece, then leaves in one writev. uvicorn writes the head alone as soon as
    the app starts the answer, then each piece: the head alone woke the client, which on a machine whose cores it
    shares with the server often ran on the event loop's core at once, the rest of the answer waiting its turn (the
    head's write took 0.35 ms of MiniLM's last-layer answer at 128 tokens, bench/answer.py). At most HOLD bytes are
    held: a bigger answer goes out in writes of what is held and the piece that would pass HOLD (sending.SLICE each,
    so at most ~2 MB a write), paced by uvicorn's flow control as before. A chunked answer (a stream of lines), an
    answer to HEAD and a 100 Continue are written as they come."""

    HOLD = 1 << 20   # sending.SLICE: a connection holds at most this much besides the transport's own buffer

    def __init__(self, transport, cycle):
        self._transport, self._cycle = transport, cycle
        self._held: list = []
        self._size = 0

    def write(self, data) -> None:
        c = self._cycle   # it counts a piece off expected_content_length before writing it: 0 at the last one
        if c.chunked_encoding is False and c.expected_content_length > 0 and c.scope["method"] != "HEAD" \
                and self._size + len(data) <= self.HOLD:
            self._held.append(data)
            self._size += len(data)
        else:
            self._flush(data)

    def _flush(self, data=None) -> None:
        """What is held, then `data`, in one write."""
        pieces, self._held, self._size = self._held + ([] if data is None else [data]), [], 0
        if len(pieces) == 1:
            self._transport.write(pieces[0])
        elif pieces:
            self._transport.writelines(pieces)

    def close(self) -> None:         # an answer cut short (the app failed): what is held goes first
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._size = [], 0
        self._transport.abort()

    def __getattr__(self, name):     # the rest is the transport's own (is_closing, get_extra_info, ...)
        return getattr(self._transport, name)


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the refusal is already chosen."""


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits and timeouts above. `limits` is set by `protocol()`."""

    limits: Limits

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._since = time.monotonic()
        self._phase = "idle"              # idle -> head -> body -> answer -> idle (keep-alive)
        self._refusal: tuple[int, str] | None = None
        self._timer = self._send_timer = None
        self._head_raw = self._url_len = self._header_bytes = self._header_count = 0
        self._arm(self.limits.timeout_headers, self._headers_timed_out)
        if len(self.connections) > self.limits.max_connections:
            self._make_room()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._send_timer is not None:
            self._send_timer.cancel()
        super().connection_lost(exc)

    # ---- the cap on open connections -----------------------------------------------------------
    def _make_room(self) -> None:
        waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpTools)
                   and c._phase in ("idle", "head", "body") and not c.transport.is_closing()]
        if waiting:
            oldest = min(waiting, key=lambda c: c._since)
            log.warning("%d connections open (ATTNSCOPE_MAX_CONNECTIONS): closing the oldest waiting one",
                        len(self.connections))
            oldest._refuse(503, "too many open connections (ATTNSCOPE_MAX_CONNECTIONS); this one was waiting "
                                "longest for its request")
        else:
            self._refuse(503, "too many open connections (ATTNSCOPE_MAX_CONNECTIONS); retry shortly")

    # ---- timers ------------------------------------------------------------------------------------
    def _arm(self, seconds: float, callback) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_timed_out(self) -> None:
        self._timer = None
        if self._phase == "idle":         # nothing asked: just close, as the keep-alive timeout does
            self.transport.close()
        else:
            self._refuse(408, f"the request headers did not arrive within {self.limits.timeout_headers:g} s "
                              f"(ATTNSCOPE_TIMEOUT_HEADERS)")

    def _body_timed_out(self) -> None:
        self._timer = None
        if self.cycle is not None and not self.cycle.response_started:
            self.cycle.disconnected = True    # the app's receive() gets http.disconnect and gives up
            self.cycle.message_event.set()
            self._refuse(408, f"the request body did not arrive within {self.limits.timeout_body:g} s "
                              f"(ATTNSCOPE_TIMEOUT_BODY)")
        else:
            self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.timeout_send, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        log.warning("a client read nothing for %g s (ATTNSCOPE_TIMEOUT_SEND): connection dropped",
                    self.limits.timeout_send)
        self.transport.abort()           # its unsent answer is freed now

    # ---- refusals ----------------------------------------------------------------------------------
    def _refuse(self, status: int, detail: str) -> None:
        self._disarm()
        self._phase = "closed"
        if not self.transport.is_closing():
            self.transport.write(_refusal(status, detail))
            self.transport.close()

    def _stop(self, status: int, detail: str):
        self._refusal = (status, detail)
        raise _Refused

    # ---- parsing -------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._phase == "closed":
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except (httptools.HttpParserError, _Refused):
            if self._refusal is not None:
                self._refuse(*self._refusal)
            else:
                self.logger.warning("Invalid HTTP request received.")
                self._refuse(400, "invalid HTTP request")
            return
        if self._phase == "head":         # headers still unfinished: one endless line never reaches on_header
            self._head_raw += len(data)
            if self._head_raw > self.limits.max_url_bytes + self.limits.max_header_bytes + 4096:
                self._refuse(431 if self._url_len < self.limits.max_url_bytes else 414,
                             f"request headers over {self.limits.max_header_bytes:,} bytes "
                             f"(ATTNSCOPE_MAX_HEADER_BYTES)")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase != "idle":         # a pipelined request: it gets its own header deadline
            self._arm(self.limits.timeout_headers, self._headers_timed_out)
        elif self._timer is None:         # after a keep-alive answer: the deadline starts with the first byte
            self._arm(self.limits.timeout_headers, self._headers_timed_out)
        self._phase = "head"
        self._head_raw = self._url_len = self._header_bytes = self._header_count = 0

    def on_url(self, url: bytes) -> None:
        self._url_len += len(url)
        if self._url_len > self.limits.max_url_bytes:
            self._stop(414, f"request target over {self.limits.max_url_bytes:,} bytes (ATTNSCOPE_MAX_URL_BYTES)")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._header_count > self.limits.max_headers:
            self._stop(431, f"more than {self.limits.max_headers} header fields (ATTNSCOPE_MAX_HEADERS)")
        if self._header_bytes > self.limits.max_header_bytes:
            self._stop(431, f"request headers over {self.limits.max_header_bytes:,} bytes "
                            f"(ATTNSCOPE_MAX_HEADER_BYTES)")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        host = next((v for k, v in self.headers if k == b"host"), None)
        if not self.limits.host_allowed(host):
            shown = host.decode("latin-1")[:100]
            self._stop(400, f"Host {shown!r} is not served here: allowed are loopback names, ATTNSCOPE_HOST and "
                            f"ATTNSCOPE_ALLOWED_HOSTS")
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:     # a request's cycle (not an upgrade): its answer of known length in one write
            self.cycle.transport = _OneWrite(self.transport, self.cycle)
        self._phase = "body"
        has_body = self.parser.get_method() not in (b"GET", b"HEAD") or any(
            k in (b"content-length", b"transfer-encoding") for k, _ in self.headers)
        if has_body:
            self._arm(self.limits.timeout_body, self._body_timed_out)
        else:
            self._disarm()

    def on_message_complete(self) -> None:
        self._disarm()
        self._phase = "answer"
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._phase == "answer" and not self.pipeline:   # else a pipelined request is already on its way
            self._phase = "idle"
        self._since = time.monotonic()
        super().on_response_complete()


def protocol(limits: Limits) -> type[GuardedHttpTools]:
    """A protocol class bound to these limits (uvicorn instantiates it per connection)."""
    return type("AttnscopeHttp", (GuardedHttpTools,), {"limits": limits})


def page_url(host: str, port: int) -> str:
    """The page's address for a server listening on host:port (every address: the loopback one)."""
    shown = "127.0.0.1" if host in WILDCARD else host
    return f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}/"


def serve(settings: Settings, host: str | None = None, port: int | None = None, log_level: str = "info") -> None:
    """Run the app with uvicorn and the guarded protocol until interrupted."""
    import uvicorn

    host = settings.host if host is None else host
    port = settings.port if port is None else port
    limits = Limits.from_settings(settings, host)
    print(f"attnscope: serving on {page_url(host, port)} (it answers at once; the models load in the background, "
          f"in order: /healthz says which are ready)", file=sys.stderr, flush=True)
    uvicorn.run("attnscope.app.main:app", host=host, port=port,
                http=protocol(limits), loop="auto", timeout_keep_alive=settings.timeout_idle,
                log_level=log_level, timeout_graceful_shutdown=10)
