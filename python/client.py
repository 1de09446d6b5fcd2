"""A small client for the REST API with no dependencies beyond the standard library and NumPy: every analysis of
python/api.py (the in-process Model's methods, with the same answers).

    from attnscope import Client
    api = Client("http://127.0.0.1:8000")
    ans = api.attention("The cat sat on the mat.", layers=[2])     # binary form, decoded, typed (analyses/answers.py)
    ans["tokens"], ans["attention"].shape                            # [...], (1, 12, 9, 9)
    api.patching(clean, corrupt, "␣Mary", "␣John", model="smollm2").top_heads()

It asks for the binary tensor form and reads the answer straight into one buffer, which the arrays
then view without copying: for a 512-token text's 72 matrices (76 MB) that is several times faster
than a general-purpose HTTP client that reads in small chunks and joins them.
"""
from __future__ import annotations

import http.client
import json
import mmap
import os
import socket
import threading
import time
import urllib.parse

from ..app.wire import BINARY, NDJSON, from_binary
from .api import Analyses


def _buffer(n: int):
    """A writable buffer of n bytes. Large ones are anonymous memory on transparent huge pages where the OS
    offers them: faulting in 76 MB as 2 MB pages instead of 4 KB ones halves the time to receive a 512-token
    answer (49 -> 23 ms here). The arrays decoded from it keep it alive."""
    if n >= 4 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)
        return m
    return bytearray(n)


class _Connection(http.client.HTTPConnection):
    """http.client's connection, but a request's head and body go out in one write: http.client sends them apart,
    and the head alone woke the server, which parsed it and slept again until the body came (0.15 ms of MiniLM's
    last-layer answer at 128 tokens, against two writes in turns to one server). A streamed (chunked) body goes as
    http.client sends it."""

    def _send_output(self, message_body=None, encode_chunked=False):
        if not isinstance(message_body, bytes) or encode_chunked:
            return super()._send_output(message_body, encode_chunked)
        self._buffer.extend((b"", message_body))                   # the head's blank line, then the body
        message = b"\r\n".join(self._buffer)
        del self._buffer[:]
        self.send(message)


class ApiError(Exception):
    """Every way a call fails: the server's refusal (its status and message), an answer that is not what was asked
    (its status, what is wrong), or no answer in time or at all (status 0)."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


MAX_ERROR_BYTES = 1 << 16      # a refusal's body: read this much at most
MAX_LINE_BYTES = 1 << 24       # a line of an NDJSON stream


def _refused(resp) -> ApiError:
    """The server's refusal: its `detail` when the body is the API's {"detail": "..."}, else the start of the body
    or the status line's reason. The body is read up to MAX_ERROR_BYTES."""
    raw = resp.read(MAX_ERROR_BYTES)
    try:
        obj = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("detail"), str):
        detail = obj["detail"]
    elif obj not in (None, {}):
        detail = json.dumps(obj)[:500]
    else:
        detail = resp.reason or "no message"
    return ApiError(resp.status, detail)


class _Watchdog:
    """One daemon thread that shuts the socket of every call whose deadline passes (_Deadline), for the whole process:
    a thread started per call (threading.Timer) cost ~0.5 ms of every answer after an idle pause (a thread made, and
    woken again to end). Arming a deadline later than the one the thread sleeps towards, and disarming one, wake
    nothing: the thread wakes when its time comes, fires what is due and sleeps towards the next deadline."""

    def __init__(self):
        self._changed = threading.Condition()
        self._armed: dict[object, tuple[float, object]] = {}    # token -> (end, callback)
        self._wake = float("inf")                               # when the thread next wakes (monotonic)
        self._thread: threading.Thread | None = None
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:      # a child process has no such thread: it starts its own
        self._changed, self._armed, self._wake, self._thread = threading.Condition(), {}, float("inf"), None

    def arm(self, end: float, fire) -> object:
        token = object()
        with self._changed:
            self._armed[token] = (end, fire)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="attnscope-client-deadlines", daemon=True)
                self._thread.start()
            elif end < self._wake:
                self._changed.notify()
        return token

    def disarm(self, token) -> None:
        with self._changed:
            self._armed.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [self._armed.pop(t)[1] for t, (end, _) in list(self._armed.items()) if end <= now]
                if not due:
                    self._wake = min((end for end, _ in self._armed.values()), default=float("inf"))
                    self._changed.wait(None if self._wake == float("inf") else self._wake - now)
                    continue
            for fire in due:
                try:
                    fire()
                except Exception:  # noqa: BLE001 - one call's shutdown going wrong must not stop every later deadline
                    pass


_WATCHDOG = _Watchdog()


class _Deadline:
    """A call's total time: when it passes, the connection's socket is shut, so that whatever read is under way ends
    (a socket timeout bounds each read, not the call: a server sending a byte a second never trips it). The
    process's one _Watchdog thread keeps the time."""

    def __init__(self, seconds: float):
        self.seconds, self.end, self.passed = seconds, time.monotonic() + seconds, False
        self._token = None
        self.sock: socket.socket | None = None     # the request's socket (an answer with Connection: close reads
        #                                            it after http.client has set conn.sock to None)

    def left(self) -> float:
        return max(0.001, self.end - time.monotonic())

    def arm(self, conn: http.client.HTTPConnection) -> None:
        self.disarm()
        self._token = _WATCHDOG.arm(self.end, lambda: self._fire(conn))

    def _fire(self, conn) -> None:
        if self._token is None:           # disarmed as it came due: the call is over
            return
        self.passed = True
        sock = conn.sock or self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def disarm(self) -> None:
        if self._token is not None:
            _WATCHDOG.disarm(self._token)
            self._token = None

    def error(self) -> ApiError:
        return ApiError(0, f"no complete answer within the client's timeout of {self.seconds:g} s "
                           f"(Client(timeout=...))")


class Client(Analyses):
    def __init__(self, base_url: str = "http://127.0.0.1:8000", timeout: float = 120, model: str | None = None,
                 max_bytes: int = 1 << 32):
        """model: the model a call without `model=` asks for (None: the server's default). timeout: seconds for a
        whole call (a stream's: between lines). max_bytes: the largest answer taken; a bigger Content-Length is an
        ApiError before any memory is reserved. Every failure is an ApiError (status 0: no answer)."""
        url = urllib.parse.urlsplit(base_url)
        self.host, self.port, self.timeout, self.model_id = url.hostname, url.port or 80, timeout, model
        self.max_bytes = max_bytes
        self._conn: http.client.HTTPConnection | None = None

    def _call(self, method: str, path: str, body: dict | None, accept: str, read):
        """One request and read(response) of its answer (status 200, 202 or 204), all within the timeout; an
        ApiError otherwise. One retry on a connection the server closed while idle."""
        deadline = _Deadline(self.timeout)
        for attempt in (0, 1):
            conn = self._conn or _Connection(self.host, self.port, timeout=self.timeout)
            self._conn = conn
            conn.timeout = deadline.left()
            if conn.sock is not None:
                conn.sock.settimeout(conn.timeout)
            deadline.arm(conn)
            sent, resp = False, None
            try:
                conn.request(method, path, None if body is None else json.dumps(body),
                             {"Content-Type": "application/json", "Accept": accept})
                deadline.sock = conn.sock         # the answer's reader keeps it once the connection lets it go
                resp = conn.getresponse()
                sent = True
                if resp.status not in (200, 202, 204):
                    error = _refused(resp)
                    if not resp.isclosed():           # a refusal's body left unread: the connection is spent
                        self._drop()
                    raise error
                out = read(resp)
                if deadline.passed:
                    raise deadline.error()
                return out
            except ApiError:
                if deadline.passed or (resp is not None and not resp.isclosed()):
                    self._drop()                      # an answer left part-read: the connection is spent
                if deadline.passed:
                    raise deadline.error() from None
                raise
            except (OSError, http.client.HTTPException, ValueError) as e:
                self._drop()
                if deadline.passed:
                    raise deadline.error() from None
                if attempt or sent or not isinstance(e, (ConnectionError, http.client.HTTPException)):
                    raise ApiError(0, f"no complete answer from {self.host}:{self.port} ({type(e).__name__}: "
                                      f"{e}); is the server running?") from None
            finally:
                deadline.disarm()
        raise AssertionError("unreachable")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _length(self, resp) -> int | None:
        """The answer's Content-Length, checked against max_bytes; None when it has none (chunked)."""
        value = resp.getheader("Content-Length")
        if value is None:
            return None
        if not value.strip().isdigit():
            raise ApiError(resp.status, f"the answer's Content-Length is not a number: {value[:40]!r}")
        n = int(value)
        if n > self.max_bytes:
            raise ApiError(resp.status, f"the answer's Content-Length ({n:,} bytes) is over the client's limit of "
                                        f"{self.max_bytes:,} (Client(max_bytes=...))")
        return n

    def _body(self, resp) -> bytes:
        """The whole answer, at most max_bytes (chunked or not)."""
        n = self._length(resp)
        data = resp.read(self.max_bytes + 1 if n is None else n)
        if n is None and len(data) > self.max_bytes:
            raise ApiError(resp.status, f"the answer is over the client's limit of {self.max_bytes:,} bytes")
        if n is not None and len(data) < n:
            raise ApiError(resp.status, "the answer ended early")
        return data

    def _request(self, method: str, path: str, body: dict | None = None, accept: str = BINARY) -> bytes:
        """The answer's body (status 200, 202 or 204); ApiError otherwise."""
        return self._call(method, path, body, accept, self._body)

    def _json(self, method: str, path: str, body: dict | None = None):
        def read(resp):
            data = self._body(resp)
            try:
                return json.loads(data)
            except (ValueError, RecursionError):
                raise ApiError(resp.status, f"the answer is not JSON ({data[:80]!r})") from None
        return self._call(method, path, body, "application/json", read)

    def _post(self, path: str, body: dict) -> dict:
        """POST in the binary form, read straight into one buffer, decoded (the arrays view the buffer)."""
        def read(resp):
            n = self._length(resp)
            if n is None:
                buf = bytearray(self._body(resp))
            else:
                buf = _buffer(n)
                view, got = memoryview(buf), 0
                while got < n:
                    k = resp.readinto(view[got:])
                    if not k:
                        raise ApiError(resp.status, f"the answer ended early ({got:,} of {n:,} bytes)")
                    got += k
            try:
                return from_binary(buf)
            except Exception as e:  # noqa: BLE001 - whatever a malformed answer makes the decoder raise
                raise ApiError(resp.status, f"the answer is not the binary tensor form ({type(e).__name__}: "
                                            f"{str(e)[:120]})") from None
        return self._call("POST", path, body, BINARY, read)

    def _lines(self, path: str, body: dict):
        """An NDJSON stream's lines as they come, on a connection of its own (closed when the stream ends or the
        iterator is dropped: the server then stops at the end of the step under way). The timeout bounds the wait
        for each line; a line is at most MAX_LINE_BYTES."""
        conn = _Connection(self.host, self.port, timeout=self.timeout)
        try:
            try:
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", "Accept": NDJSON})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise ApiError(0, f"no answer from {self.host}:{self.port} ({type(e).__name__}: {e}); is the "
                                  f"server running?") from None
            if resp.status != 200:
                raise _refused(resp)
            while True:
                try:
                    raw = resp.readline(MAX_LINE_BYTES + 1)
                except (OSError, http.client.HTTPException) as e:
                    raise ApiError(0, f"the stream broke off ({type(e).__name__}: {e})") from None
                if not raw:
                    return
                if len(raw) > MAX_LINE_BYTES:
                    raise ApiError(resp.status, f"a line of the stream is over {MAX_LINE_BYTES:,} bytes")
                try:
                    line = json.loads(raw)
                except (ValueError, RecursionError):
                    raise ApiError(resp.status, f"a line of the stream is not JSON ({raw[:80]!r})") from None
                if not isinstance(line, dict):
                    raise ApiError(resp.status, f"a line of the stream is not a JSON object ({raw[:80]!r})")
                if "error" in line:
                    error = line["error"] if isinstance(line["error"], dict) else {}
                    raise ApiError(error.get("status", resp.status), str(error.get("detail", line["error"])))
                yield line
        finally:
            conn.close()

    def models(self) -> list[dict]:
        """GET /api/models."""
        return self._json("GET", "/api/models")

    def _job_post(self, body: dict) -> dict:
        return self._json("POST", "/api/jobs", body)

    def _job_list(self) -> list[dict]:
        return self._json("GET", "/api/jobs")

    def _job_get(self, job_id: str) -> dict:
        return self._json("GET", f"/api/jobs/{job_id}")

    def _job_cancel(self, job_id: str) -> dict:
        return self._json("POST", f"/api/jobs/{job_id}/cancel")

    def _job_delete(self, job_id: str) -> None:
        self._request("DELETE", f"/api/jobs/{job_id}", accept="application/json")

    def _job_result(self, job_id: str) -> dict:
        return self._json("GET", f"/api/jobs/{job_id}/result?format=json")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
