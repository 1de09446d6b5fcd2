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


class ApiError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


def _refused(resp) -> ApiError:
    try:
        detail = json.loads(resp.read() or b"{}").get("detail", resp.reason)
    except ValueError:
        detail = resp.reason
    return ApiError(resp.status, detail)


class Client(Analyses):
    def __init__(self, base_url: str = "http://127.0.0.1:8000", timeout: float = 120, model: str | None = None):
        """model: the model a call without `model=` asks for (None: the server's default)."""
        url = urllib.parse.urlsplit(base_url)
        self.host, self.port, self.timeout, self.model_id = url.hostname, url.port or 80, timeout, model
        self._conn: http.client.HTTPConnection | None = None

    def _request(self, method: str, path: str, body: dict | None = None, accept: str = BINARY):
        """The response to one request (status 200 or 202), its body not yet read; ApiError otherwise."""
        for attempt in (0, 1):  # one retry on a connection the server closed while idle
            conn = self._conn or http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._conn = conn
            try:
                conn.request(method, path, None if body is None else json.dumps(body),
                             {"Content-Type": "application/json", "Accept": accept})
                resp = conn.getresponse()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            if resp.status not in (200, 202, 204):
                raise _refused(resp)
            return resp
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, body: dict | None = None):
        return json.loads(self._request(method, path, body, "application/json").read())

    def _post(self, path: str, body: dict) -> dict:
        """POST in the binary form, read straight into one buffer, decoded (the arrays view the buffer)."""
        resp = self._request("POST", path, body)
        buf = _buffer(int(resp.getheader("Content-Length")))
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = resp.readinto(view[got:])
            if not n:
                raise ConnectionError("the answer ended early")
            got += n
        return from_binary(buf)

    def _lines(self, path: str, body: dict):
        """An NDJSON stream's lines as they come, on a connection of its own (closed when the stream ends or the
        iterator is dropped: the server then stops at the end of the step under way)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", "Accept": NDJSON})
            resp = conn.getresponse()
            if resp.status != 200:
                raise _refused(resp)
            for raw in resp:
                line = json.loads(raw)
                if "error" in line:
                    raise ApiError(line["error"]["status"], line["error"]["detail"])
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
        self._request("DELETE", f"/api/jobs/{job_id}", accept="application/json").read()

    def _job_result(self, job_id: str) -> dict:
        return self._json("GET", f"/api/jobs/{job_id}/result?format=json")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
