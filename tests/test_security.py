"""Issue 50: safe on a researcher's laptop. Each finding of the probe reproduced against a real server, then held:
cross-site requests refused (finding 1), deeply nested JSON a 400 (finding 3), jobs that can be deleted and a disk
budget counted while bytes arrive (finding 4), MCP over HTTP locked to its host (finding 2), a Client that fails
clearly (finding 5), and the smaller ones (finding 6): HEAD and weak ETags, surrogates at upload, the field of a 422,
MCP tools' arguments, MCP over stdio answering malformed lines."""
from __future__ import annotations

import http.server
import json
import socketserver
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.common import server

JOB = {"model": "tiny-gpt", "corpus": "bundled", "options": {"texts": 1, "seed": 777}}
JOB_TEXT = b'{"model":"tiny-gpt","corpus":"bundled","options":{"texts":1,"seed":777}}'
FORM_JOB = '{"model":"tiny-gpt","corpus":{"format":"text","data":"the cat sat=on the mat"},"options":{"seed":778}}'


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """A real server on tiny-gpt whose jobs are queued, never run, in a fresh folder with a small disk budget."""
    jobs = tmp_path_factory.mktemp("security-jobs")
    with server({"ATTNSCOPE_MODELS": "tiny-gpt", "ATTNSCOPE_MAX_JOBS_RUNNING": "0", "ATTNSCOPE_MAX_JOBS_QUEUED": "1000",
                 "ATTNSCOPE_JOBS_DIR": str(jobs), "ATTNSCOPE_MAX_JOBS_DISK_MB": "2",
                 "ATTNSCOPE_MAX_UPLOAD_BYTES": "1500000"}) as (url, _pid):
        yield url, jobs


def _jobs_with_seed(http: httpx.Client, seed: int) -> list[dict]:
    return [j for j in http.get("/api/jobs").json() if j["options"].get("seed") == seed]


# ---- finding 1: cross-site request forgery --------------------------------------------------------------------------
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_a_post_without_a_json_content_type_is_415(tiny_server, content_type):
    url, _ = tiny_server
    headers = {"Content-Type": content_type} if content_type else {}
    with httpx.Client(base_url=url, timeout=30) as http:
        r = http.post("/api/jobs", content=JOB_TEXT, headers={**headers, "Origin": "http://evil.example"})
        assert r.status_code in (403, 415), r.text
        r = http.post("/api/jobs", content=JOB_TEXT, headers=headers)
        assert r.status_code == 415, r.text
        assert "application/json" in r.json()["detail"]
        r = http.post("/api/attention", content=b'{"model": "tiny-gpt", "text": "hi"}', headers=headers)
        assert r.status_code == 415, r.text
        assert _jobs_with_seed(http, 777) == []
        assert http.get("/healthz").json()["status"] == "ok"


def test_a_post_or_delete_from_another_origin_is_403(tiny_server):
    url, _ = tiny_server
    host = url.removeprefix("http://")
    with httpx.Client(base_url=url, timeout=30) as http:
        for origin in ("http://evil.example", "null", f"http://{host}.evil.example", "http://127.0.0.1:1",
                       f"https://evil.example:{host.split(':')[1]}"):
            r = http.post("/api/jobs", json=JOB, headers={"Origin": origin})
            assert r.status_code == 403, (origin, r.text)
            assert "Origin" in r.json()["detail"]
            r = http.post("/api/attention", json={"model": "tiny-gpt", "text": "hi"}, headers={"Origin": origin})
            assert r.status_code == 403, (origin, r.text)
            assert http.delete("/api/jobs/0123456789abcdef", headers={"Origin": origin}).status_code == 403
        assert _jobs_with_seed(http, 777) == []
        # the server's own origin (what the page sends), or none (curl, the Client): as before
        r = http.post("/api/attention", json={"model": "tiny-gpt", "text": "hi"}, headers={"Origin": url})
        assert r.status_code == 200, r.text
        r = http.post("/api/attention", json={"model": "tiny-gpt", "text": "hi"},
                      headers={"Content-Type": "application/json; charset=utf-8"})
        assert r.status_code == 200, r.text


class _Page(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.html)))
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args):
        pass


@pytest.mark.browser
def test_a_page_from_another_origin_cannot_start_a_job_in_chromium(tiny_server, page):
    """The probe's attack: a page on another origin (here another loopback port) posts the job by a form whose
    enctype is text/plain (no preflight), and by fetch (no-cors text/plain, and cors JSON: preflighted, refused)."""
    url, _ = tiny_server
    fields = FORM_JOB
    name, value = fields.split("=")          # a text/plain form sends name=value: the '=' inside the upload's text
    html = f"""<!doctype html><html><body>
<form id="f" method="POST" action="{url}/api/jobs" enctype="text/plain" target="sink">
<input name='{name}' value='{value}'></form><iframe name="sink"></iframe>
<script>
window.results = [];
async function go() {{
  for (const init of [{{mode: "no-cors", headers: {{"Content-Type": "text/plain"}}}},
                      {{mode: "cors", headers: {{"Content-Type": "application/json"}}}}]) {{
    try {{ const r = await fetch("{url}/api/jobs", {{method: "POST", body: {fields!r}, ...init}});
           window.results.push(r.type + " " + r.status); }}
    catch (e) {{ window.results.push("refused " + e.message); }}
  }}
  document.getElementById("f").submit();
  window.submitted = true;
}}
go();
</script></body></html>"""
    handler = type("Page", (_Page,), {"html": html.encode()})
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        posted = []
        page.on("response", lambda r: posted.append(r.status) if r.url.startswith(url + "/api/jobs") else None)
        page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        page.wait_for_function("window.submitted === true", timeout=15_000)
        deadline = time.monotonic() + 10
        while len(posted) < 2 and time.monotonic() < deadline:   # the no-cors fetch and the form
            page.wait_for_timeout(100)
        assert posted and all(s in (403, 415) for s in posted), posted
        assert any(r.startswith("refused") for r in page.evaluate("window.results"))
    finally:
        evil.shutdown()
    with httpx.Client(base_url=url, timeout=30) as http_:
        assert _jobs_with_seed(http_, 778) == []


# ---- finding 3: deeply nested JSON ------------------------------------------------------------------------------
DEEP = [b"[" * 3000 + b"]" * 3000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
        b'{"model": "tiny-gpt", "options": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]


def test_deeply_nested_json_is_the_frameworks_400_on_every_body_the_server_reads(tiny_server):
    url, _ = tiny_server
    with httpx.Client(base_url=url, timeout=30) as http:
        for body in DEEP:
            framework = http.post("/api/attention", content=body, headers={"Content-Type": "application/json"})
            r = http.post("/api/jobs", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == framework.status_code == 400, (r.status_code, r.text[:200])
            assert r.json() == framework.json() and "nested too deeply" in r.json()["detail"]
        # an uploaded JSONL corpus whose line is nested deeper than Python reads: that line is refused, not a 500
        deep_line = "[" * 3000 + "]" * 3000
        r = http.post("/api/jobs", json={"model": "tiny-gpt", "corpus": {"format": "jsonl",
                                                                          "data": deep_line + "\n"}})
        assert r.status_code == 422 and "the corpus cannot be read" in r.json()["detail"], r.text[:300]
        assert http.get("/healthz").json()["status"] == "ok"


# ---- finding 4: jobs that can be deleted, and a disk budget counted while bytes arrive ------------------------------
def _upload(seed: int, size: int) -> dict:
    line = f"text {seed} " + "the cat sat on the mat and looked at the dog " * 2
    return {"model": "tiny-gpt", "corpus": {"format": "text", "data": (line + "\n") * (size // (len(line) + 1))},
            "options": {"seed": seed}}


def _files(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_filling_the_jobs_budget_then_deleting_the_jobs_frees_it(tiny_server):
    """With a 2 MB budget, uploads of 0.6 MB fill it (507); DELETE removes each job, its upload and its record (a GET
    is then 404), and the next upload is queued, with no hand work. Cancelling is its own verb."""
    url, folder = tiny_server
    with httpx.Client(base_url=url, timeout=60) as http:
        ids = []
        for seed in range(1000, 1010):
            r = http.post("/api/jobs", json=_upload(seed, 600_000))
            if r.status_code == 507:
                assert "ATTNSCOPE_MAX_JOBS_DISK_MB" in r.json()["detail"]
                break
            assert r.status_code == 202, r.text[:300]
            ids.append(r.json()["id"])
        assert 1 <= len(ids) < 10, "the budget never filled"
        r = http.post(f"/api/jobs/{ids[0]}/cancel", headers={"Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
        for job_id in ids:
            r = http.delete(f"/api/jobs/{job_id}")
            assert r.status_code == 204, r.text
            assert http.get(f"/api/jobs/{job_id}").status_code == 404
            assert http.delete(f"/api/jobs/{job_id}").status_code == 404
            assert not any(job_id in f for f in _files(folder))
        assert not any(f.startswith("uploads/") for f in _files(folder)), _files(folder)
        r = http.post("/api/jobs", json=_upload(seed, 600_000))
        assert r.status_code == 202, r.text[:300]
        assert http.delete(f"/api/jobs/{r.json()['id']}").status_code == 204
        assert http.get("/healthz").json()["status"] == "ok"


def test_chunked_uploads_are_counted_against_the_budget_while_they_arrive(tiny_server):
    """Four chunked uploads (no Content-Length) of 1.4 MB at once against a 2 MB budget: the bodies being received
    never hold much more than the budget, and those past it are refused with 507 (or their connection closed)."""
    import asyncio

    url, folder = tiny_server
    piece = b" " * 100_000

    async def body():
        yield b'{"model": "tiny-gpt", "corpus": {"format": "text", "data": "a b c\\n'
        for _ in range(14):
            yield piece
            await asyncio.sleep(0.05)
        yield b'"}}'

    async def one(http):
        try:
            r = await http.post("/api/jobs", content=body(), headers={"Content-Type": "application/json"})
            return r.status_code
        except httpx.TransportError:
            return "closed"

    peak = 0

    async def watch(done):
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sum(p.stat().st_size for p in (folder / "incoming").glob("*") if p.is_file()))
            await asyncio.sleep(0.01)

    async def main():
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            statuses = await asyncio.gather(*(one(http) for _ in range(4)))
        done.set()
        await watcher
        return statuses

    with ThreadPoolExecutor(1) as pool:       # a thread of its own: the browser tests' loop runs in this one
        statuses = pool.submit(asyncio.run, main()).result()
    assert peak <= 2 * 2**20 + 4 * 2**20 // 4, (peak, statuses)    # the budget, and a piece each at most
    assert sum(s == 507 or s == "closed" for s in statuses) >= 2, statuses
    with httpx.Client(base_url=url, timeout=30) as http:
        for job in http.get("/api/jobs").json():
            if job["corpus"].startswith("upload:"):
                assert http.delete(f"/api/jobs/{job['id']}").status_code == 204
        assert http.get("/healthz").json()["status"] == "ok"


def test_the_python_api_cancels_and_deletes_jobs_in_process_and_remote(tiny_server, runtimes, tmp_path):
    """AtlasJob.cancel() is POST .../cancel and .delete() is DELETE, the same through the Client and in process."""
    import attnscope
    from attnscope.app.settings import Settings
    from attnscope.python.client import ApiError

    url, _ = tiny_server
    local = attnscope.Model(runtimes["tiny-gpt"], settings=Settings(models=["tiny-gpt"], default_model="tiny-gpt",
                                                                     jobs_dir=tmp_path, max_jobs_running=0))
    remote = attnscope.Client(url)
    try:
        for side in (local, remote):
            job = side.atlas(model="tiny-gpt", texts=3, seed=4242)
            assert job.state == "queued" and job.cancel()["state"] == "cancelled"
            job.delete()
            with pytest.raises(ApiError) as e:
                side.job(job.id)
            assert e.value.status == 404
            assert job.id not in {j["id"] for j in side.jobs()}
    finally:
        local.close()
        remote.close()


def test_stopped_jobs_age_out_after_the_keep_days(tmp_path):
    """A finished, failed or cancelled job's files go ATTNSCOPE_JOBS_KEEP_DAYS after it stopped (at start, and when a
    job is posted); a younger one and a queued one stay."""
    from attnscope.app.jobs import Jobs, RECORD_VERSION
    from attnscope.app.settings import Settings
    from attnscope.corpus.job import write_json

    now = time.time()
    records = {"a" * 16: ("done", now - 3 * 86400), "b" * 16: ("cancelled", now - 2.5 * 86400),
               "c" * 16: ("failed", now - 1 * 86400), "d" * 16: ("queued", None)}
    for job_id, (state, finished) in records.items():
        (tmp_path / job_id).mkdir()
        write_json(tmp_path / job_id / "job.json", {
            "id": job_id, "kind": "atlas", "model": "tiny-gpt", "corpus": "bundled", "options": {}, "texts_total": 1,
            "texts_done": 0, "created": now - 4 * 86400, "state": state, "error": None, "finished": finished,
            "version": RECORD_VERSION})
        (tmp_path / job_id / "atlas.json").write_text("{}")
    jobs = Jobs(Settings(models=["tiny-gpt"], jobs_dir=tmp_path, jobs_keep_days=2, max_jobs_running=0))
    jobs.open()
    assert sorted(j.id for j in jobs.list()) == ["c" * 16, "d" * 16]
    assert sorted(p.name for p in tmp_path.iterdir() if len(p.name) == 16) == ["c" * 16, "d" * 16]
    jobs.settings.jobs_keep_days = 0.5
    jobs.expire()
    assert [j.id for j in jobs.list()] == ["d" * 16]       # interrupted at open: queued then, kept until it stops


# ---- finding 2: MCP over HTTP locked to its host, with a token beyond loopback ---------------------------------------
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}


def _mcp(host: str, url: str, *extra: str, env: dict | None = None):
    """`attnscope mcp --transport http --host HOST` (its tools answered by `url`), started; (process, port, log)."""
    import os
    import socket
    import subprocess
    import sys
    import tempfile

    from bench.common import free_port
    port, log = free_port(), tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "mcp", "--transport", "http", "--host", host,
                             "--port", str(port), "--grace", "1", "--url", url, *extra],
                            env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    return proc, port, log


def _initialize(port: int, headers: dict) -> int:
    with httpx.Client(timeout=30) as http, http.stream(
            "POST", f"http://127.0.0.1:{port}/mcp", json=INITIALIZE,
            headers={"Accept": "application/json, text/event-stream", **headers}) as r:
        return r.status_code


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("host", ["0.0.0.0", "127.1"])
def test_mcp_over_http_keeps_host_and_origin_checks_and_needs_a_token_beyond_loopback(tiny_server, host):
    url, _ = tiny_server
    if host == "0.0.0.0":                                    # no token: refused at start, saying how
        proc, _, log = _mcp(host, url)
        assert proc.wait(30) != 0
        log.seek(0)
        assert b"--token" in log.read() and b"ATTNSCOPE_MCP_TOKEN" in (log.seek(0) or log.read())
    token = "s3cret-token"
    proc, port, log = _mcp(host, url, env={"ATTNSCOPE_MCP_TOKEN": token})
    try:
        assert proc.poll() is None, (log.seek(0), log.read())
        auth = {"Authorization": f"Bearer {token}"}
        assert _initialize(port, auth) == 200
        assert _initialize(port, {**auth, "Origin": f"http://127.0.0.1:{port}"}) == 200
        assert _initialize(port, {**auth, "Host": f"evil.example:{port}"}) == 421
        assert _initialize(port, {**auth, "Origin": f"http://evil.example:{port}"}) == 403
        assert _initialize(port, {**auth, "Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}) \
            in (403, 421)
        assert _initialize(port, {}) == 401
        assert _initialize(port, {"Authorization": "Bearer wrong"}) == 401
    finally:
        _stop(proc)


# ---- finding 5: the remote Client fails clearly, within its time ------------------------------------------------------
class _Scripted(socketserver.ThreadingTCPServer):
    """A server on 127.0.0.1 that answers every request with `answer` (raw bytes), a byte a second when `trickle`."""
    daemon_threads, allow_reuse_address = True, True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        self.answer, self.trickle = b"", False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ScriptedHandler(socketserver.StreamRequestHandler):
    def handle(self):
        length = 0
        while (line := self.rfile.readline(65536)) not in (b"\r\n", b"\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        self.rfile.read(length)
        try:
            if self.server.trickle:
                for i in range(len(self.server.answer)):
                    self.wfile.write(self.server.answer[i:i + 1])
                    self.wfile.flush()
                    time.sleep(1)
            else:
                self.wfile.write(self.server.answer)
        except OSError:
            pass


@pytest.fixture
def scripted():
    srv = _Scripted()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _http(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}Connection: close\r\n".encode() + b"\r\n" + body


def test_the_client_has_a_total_deadline_per_call(scripted):
    """A server that sends its answer a byte a second: Client(timeout=3) raises its own error within 4 s (each
    socket read was bounded, not the call: 39 s before)."""
    from attnscope.python.client import ApiError, Client

    scripted.trickle = True
    scripted.answer = _http("200 OK", b"[]" * 50, "Content-Type: application/json", "Content-Length: 100")
    started = time.monotonic()
    with pytest.raises(ApiError) as e:
        Client(scripted.url, timeout=3).models()
    assert time.monotonic() - started < 4, time.monotonic() - started
    assert "3" in str(e.value) and "timeout" in str(e.value).lower()


CT = "Content-Type: application/json"
BAD_ANSWERS = [   # (what the server sends, the status the error carries, words of its message)
    (_http("422 Unprocessable Entity", b'[{"detail": "a list"}]', CT, "Content-Length: 22"), 422, "a list"),
    (_http("503 Service Unavailable", b"<html>busy</html>", "Content-Type: text/html", "Content-Length: 17"), 503,
     "Service Unavailable"),
    (_http("200 OK", b"5\r\nATSC!\r\n0\r\n\r\n", "Content-Type: application/vnd.attnscope.tensors",
           "Transfer-Encoding: chunked"), 200, "binary tensor form"),
    (_http("200 OK", b"ATSC\x08\x00\x00\x00{\"x\": 1}", "Content-Length: 16"), 200, "binary tensor form"),
    (_http("200 OK", b"ATSC\x04\x00\x00\x00\xff\xfe{}", "Content-Length: 12"), 200, "binary tensor form"),
    (_http("200 OK", b"ATSC", "Content-Length: 99999999999999"), 200, "Content-Length"),
    (_http("200 OK", b"ATSC", "Content-Length: 12"), 200, "ended"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", 200, "binary tensor form"),       # headers cut off: an empty answer
    (b"", 0, "is the server running"),                                      # closed before any answer
]


@pytest.mark.parametrize("answer,status,words", BAD_ANSWERS, ids=range(len(BAD_ANSWERS)))
def test_every_bad_answer_is_the_clients_own_error_with_the_status_and_message(scripted, answer, status, words):
    from attnscope.python.client import ApiError, Client

    scripted.answer = answer
    api = Client(scripted.url, timeout=10)
    started = time.monotonic()
    with pytest.raises(ApiError) as e:
        api.attention("the cat")
    assert time.monotonic() - started < 5
    assert e.value.status == status and words in str(e.value), str(e.value)
    with pytest.raises(ApiError):                      # the JSON calls too
        api.models()


def test_a_stream_line_over_the_limit_is_the_clients_error(scripted):
    from attnscope.python.client import ApiError, Client

    scripted.answer = _http("200 OK", b'{"token": "' + b"x" * 5_000_000, "Content-Type: application/x-ndjson")
    with pytest.raises(ApiError) as e:
        list(Client(scripted.url, timeout=10).generate("the cat", max_new_tokens=2))
    assert "line" in str(e.value)


def test_an_mcp_tool_over_a_remote_server_shows_the_agent_the_servers_message(scripted):
    """`attnscope mcp --url`: a bad answer reaches the agent as the Client's error, the server's message in it (the
    agent saw only "Error executing tool attention" before)."""
    import asyncio

    from mcp.server.mcpserver.exceptions import ToolError

    from attnscope.python.agents import server
    from attnscope.python.client import Client

    scripted.answer = _http("422 Unprocessable Entity", b'[{"detail": "layers out of range"}]', CT,
                            "Content-Length: 36")
    mcp = server(Client(scripted.url, timeout=10))

    async def call():
        try:
            return await mcp.call_tool("attention", {"text": "the cat"})
        except ToolError as e:
            return str(e)
    with ThreadPoolExecutor(1) as pool:
        said = pool.submit(asyncio.run, call()).result()
    assert "422" in str(said) and "layers out of range" in str(said), said


# ---- finding 6: the smaller ones -------------------------------------------------------------------------------------
def test_head_on_every_get_route_and_weak_or_list_etags_on_the_bundle(tiny_server):
    url, _ = tiny_server
    with httpx.Client(base_url=url, timeout=30) as http:
        for path in ("/", "/healthz", "/api/models", "/bundle/main.js", "/vendor/plotly.min.js", "/api/jobs"):
            get, head = http.get(path), http.head(path)
            assert head.status_code == get.status_code == 200, (path, head.status_code)
            assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"], path
        assert http.head("/api/attention").status_code == 405              # a POST route stays POST only
        etag = http.get("/bundle/main.js").headers["etag"]
        for sent in (etag, f"W/{etag}", "*", f'"nope", {etag}', f'"nope",W/{etag}'):
            assert http.get("/bundle/main.js", headers={"If-None-Match": sent}).status_code == 304, sent
        assert http.get("/bundle/main.js", headers={"If-None-Match": '"nope", W/"other"'}).status_code == 200


def test_an_upload_with_a_lone_surrogate_is_refused_at_upload(tiny_server):
    """A JSONL line (or a text upload) holding an unpaired surrogate was accepted, then the job failed with a
    TypeError: the upload's texts are checked for UTF-8 when it is posted."""
    url, _ = tiny_server
    with httpx.Client(base_url=url, timeout=30) as http:
        for corpus in ({"format": "jsonl", "data": '{"text": "a \\ud800 b"}\n'},
                       {"format": "text", "data": "a \ud800 b\n"}):
            r = http.post("/api/jobs", content=json.dumps({"model": "tiny-gpt", "corpus": corpus}).encode(),
                          headers={"Content-Type": "application/json"})         # \ud800 escaped: ASCII JSON
            assert r.status_code == 422, r.text[:300]
            assert any(w in r.json()["detail"] for w in ("surrogate", "unicode")), r.text[:300]
        assert http.get("/healthz").json()["status"] == "ok"


def test_a_422_names_the_field_even_one_called_query(tiny_server):
    url, _ = tiny_server
    body = {"model": "tiny-gpt", "text": "the cat sat", "layer": 0, "head": 0, "query": 99999, "key": 0}
    r = httpx.post(f"{url}/api/qk", json=body, timeout=30)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query", r.text
    assert r.json()["detail"].startswith("query: ")


def test_mcp_tools_refuse_unknown_arguments(scripted):
    """An argument a tool does not take is refused, naming it (it was silently ignored); the tools' input schemas
    say additionalProperties: false."""
    import asyncio

    from mcp.server.mcpserver.exceptions import ToolError

    from attnscope.python.agents import server
    from attnscope.python.client import Client

    mcp = server(Client(scripted.url, timeout=10))

    async def call():
        tools = await mcp.list_tools()
        try:
            await mcp.call_tool("attention", {"text": "the cat", "layerz": 1})
            return tools, None
        except ToolError as e:
            return tools, str(e)
    with ThreadPoolExecutor(1) as pool:
        tools, said = pool.submit(asyncio.run, call()).result()
    assert said is not None and "layerz" in said, said
    assert all(t.input_schema.get("additionalProperties") is False for t in tools), \
        [t.name for t in tools if t.input_schema.get("additionalProperties") is not False]


def test_mcp_tools_refuse_incomplete_arguments(scripted):
    """`head` without `layer` (it was ignored: the top heads came back) and several head_lens pairs (all but the
    first were ignored) are refused, saying what to send."""
    import asyncio

    from mcp.server.mcpserver.exceptions import ToolError

    from attnscope.python.agents import server
    from attnscope.python.client import Client

    mcp = server(Client(scripted.url, timeout=10))

    async def call(name, args):
        try:
            await mcp.call_tool(name, args)
        except ToolError as e:
            return str(e)
    with ThreadPoolExecutor(1) as pool:
        said = pool.submit(asyncio.run, call("attention", {"text": "the cat", "head": 1})).result()
        assert "head needs layer" in said, said
        said = pool.submit(asyncio.run, call("lens", {"text": "the cat", "head_lens": [[0, 1], [1, 0]]})).result()
        assert "one [layer, head] pair" in said, said


def test_mcp_over_stdio_answers_malformed_input_with_the_protocols_error(tiny_server):
    """Invalid UTF-8, a lone surrogate's escape, a batch array and 100k-deep nesting each get a JSON-RPC error line
    (its client waited forever before); the session then still answers."""
    import os
    import select
    import subprocess
    import sys

    url, _ = tiny_server
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "mcp", "--url", url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ))
    pending = b""

    def answer(line: bytes, timeout: float = 20) -> dict:
        nonlocal pending
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while b"\n" not in pending:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no answer to {line[:60]!r} in {timeout} s"
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, "the server closed its output"
            pending += chunk
        out, pending = pending.split(b"\n", 1)
        return json.loads(out)

    try:
        for bad in (b"\xff\xfe{", b'{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"x": "\\ud800"}}',
                    b'[{"jsonrpc": "2.0", "id": 8, "method": "ping"}]', b"[" * 100_000 + b"]" * 100_000,
                    b'{"jsonrpc": "2.0", "id": 9, "method": 5}'):
            got = answer(bad)
            assert got["jsonrpc"] == "2.0" and got["error"]["code"] in (-32700, -32600), (bad[:60], got)
        got = answer(json.dumps(INITIALIZE).encode())
        assert got["id"] == 1 and "result" in got, got
    finally:
        proc.kill()
        proc.wait()


def test_a_bodiless_post_may_omit_its_content_type_but_not_name_a_form_one(tiny_server):
    """POST /api/jobs/{id}/cancel has no body: curl -X POST without a type is served; a form's type (which a
    browser always sends, even with no fields) is 415, and another origin 403, as for every POST."""
    url, _ = tiny_server
    with httpx.Client(base_url=url, timeout=30) as http:
        job = http.post("/api/jobs", json={**JOB, "options": {"texts": 1, "seed": 4343}}).json()
        assert http.post(f"/api/jobs/{job['id']}/cancel", headers={
            "Content-Type": "application/x-www-form-urlencoded"}).status_code == 415
        assert http.post(f"/api/jobs/{job['id']}/cancel", headers={"Origin": "http://evil.example"}).status_code == 403
        r = http.post(f"/api/jobs/{job['id']}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
        assert http.delete(f"/api/jobs/{job['id']}").status_code == 204


def test_deleting_a_running_job_stops_it_and_removes_its_files(tmp_path):
    """A running job deleted: a GET is 404 at once, the job stops after its chunk, and its folder goes then."""
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    with TestClient(create_app(Settings(models=["tiny-gpt"], jobs_dir=tmp_path))) as c:
        r = c.post("/api/jobs", json={"model": "tiny-gpt", "corpus": "bundled", "options": {"texts": 400}})
        assert r.status_code == 202, r.text
        job_id, deadline = r.json()["id"], time.monotonic() + 60
        while c.get(f"/api/jobs/{job_id}").json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.delete(f"/api/jobs/{job_id}").status_code == 204
        assert c.get(f"/api/jobs/{job_id}").status_code == 404
        assert job_id not in {j["id"] for j in c.get("/api/jobs").json()}
        deadline = time.monotonic() + 60
        while (tmp_path / job_id).exists():
            assert time.monotonic() < deadline, sorted(p.name for p in (tmp_path / job_id).iterdir())
            time.sleep(0.1)
        r = c.post("/api/jobs", json={"model": "tiny-gpt", "corpus": "bundled", "options": {"texts": 400}})
        assert r.status_code == 202 and r.json()["progress"]["texts_done"] == 0 and r.json()["resumed_from"] == 0
        assert c.delete(f"/api/jobs/{job_id}").status_code == 204


def test_a_bad_answer_on_a_kept_alive_connection_leaves_the_next_call_a_clean_one(scripted, tiny_server):
    """An answer refused part-read (an absurd Content-Length) closes its connection: the client's next call does not
    read its leftovers. Against the real server: a refusal, then an answer, on one Client."""
    from attnscope.python.client import ApiError, Client

    scripted.answer = b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999\r\n\r\nATSC"
    api = Client(scripted.url, timeout=5)
    with pytest.raises(ApiError, match="Content-Length"):
        api.attention("the cat")
    assert api._conn is None
    url, _ = tiny_server
    api = Client(url, timeout=30, model="tiny-gpt")
    with pytest.raises(ApiError) as e:
        api.attention("the cat", layers=[99])
    assert e.value.status == 422 and "layers" in e.value.detail
    assert api.attention("the cat")["tokens"]
    api.close()
