"""Hostile connections, a cache that cannot lie, and the smaller refusals (issue 17).

Against the real server (`attnscope serve`, started by bench.common.server with default settings): slow
clients of three kinds are closed within their timeouts while /healthz stays prompt; request-line, header and
Host limits answer 414/431/400. On dedicated servers: the open-connection cap, the send timeout, and a
read-only graph cache. In process: an answer of known length in one write, the JSON form written in pieces,
Accept quality values, huge and fractional numbers, timing_ms covering serialisation, and the graph cache's
temporary files and checksum.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient

from attnscope.app import sending, wire
from attnscope.app.main import create_app
from attnscope.app.middleware import CSP
from attnscope.app.server import Limits
from attnscope.app.settings import Settings
from attnscope.sources import zoo
from attnscope.runtime import Runtime
from bench.common import free_port, wait_until_up
from bench.slowloris import attack, percentile

from .conftest import PROVIDERS, in_thread

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The cat sat on the mat."
BINARY = wire.BINARY


def raw(url: str, data: bytes, read_for: float = 5.0) -> bytes:
    """Send raw bytes on a new connection; return everything the server sends until it closes (or time)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=read_for) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def status_and_detail(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)["detail"]


# ---- slow clients, against the real default server ---------------------------------------------------------
@pytest.mark.slow
def test_slow_clients_are_closed_within_their_timeouts_and_healthz_stays_prompt(live_server):
    """Four clients of each kind (endless header line, stalled body, idle before any request), each replaced
    when closed, for 12 s: each is closed by the 10 s default timeouts (408 when it had begun a request)."""
    got = in_thread(attack, live_server, 4, 12.0)
    for kind in ("header", "body", "idle"):
        lives = got["lives"][kind]
        assert len(lives) >= 4, (kind, lives)
        assert max(lives) < 10 + 2.5, (kind, lives)
    assert all(age < 12.5 for _, age in got["open_ages"])
    answers = {kind: a for kind, a in got["answers"]}
    assert answers["header"] == answers["body"] == "HTTP/1.1 408 Request Timeout" and answers["idle"] == "(closed)"
    lat = got["latencies"]
    assert len(lat) > 50 and percentile(lat, 0.99) < 500, sorted(lat)[-5:]   # bench/slowloris.py: p99 < 100 ms


def test_request_line_header_and_host_limits_on_the_live_server(live_server):
    port = live_server.rsplit(":", 1)[1]
    cases = [
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414, "ATTNSCOPE_MAX_URL_BYTES"),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 17_000 + b"\r\n\r\n", 431,
         "ATTNSCOPE_MAX_HEADER_BYTES"),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
         431, "ATTNSCOPE_MAX_HEADERS"),
        # one header line that never ends, sent as fast as the socket takes it: cut off, not accumulated
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: " + b"c" * 2_000_000, 431,
         "ATTNSCOPE_MAX_HEADER_BYTES"),
        (b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\n\r\n", 400, "ATTNSCOPE_ALLOWED_HOSTS"),
        (b"GET /healthz HTTP/1.1\r\nHost: evil.example:" + port.encode() + b"\r\n\r\n", 400, "ATTNSCOPE_ALLOWED_HOSTS"),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1.evil.example\r\n\r\n", 400, "ATTNSCOPE_ALLOWED_HOSTS"),
    ]
    for request, status, setting in cases:
        answer = raw(live_server, request)
        assert status_and_detail(answer)[0] == status, answer[:300]
        assert setting in status_and_detail(answer)[1]
        assert b"connection: close" in answer and f"content-security-policy: {CSP}".encode() in answer
    answer = raw(live_server, b"GET /?text=" + b"a+" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Connection: close\r\n\r\n")               # the page's URL for 20,000 characters
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    for host in (b"127.0.0.1", b"localhost", b"LocalHost:" + port.encode(), b"[::1]:" + port.encode(),
                 b"app.localhost", b"127.0.0.1:" + port.encode()):
        answer = raw(live_server, b"GET /healthz HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 "), (host, answer[:200])
    assert httpx.get(live_server + "/healthz", headers={"Host": "evil.example"}).status_code == 400
    assert httpx.get(live_server + "/healthz").status_code == 200


def test_host_allow_list_rules():
    limits = Limits.from_settings(Settings(allowed_hosts=["Attn.Example.org", "10.0.0.5"]), "127.0.0.1")
    for ok in (None, b"localhost", b"127.0.0.1:8000", b"[::1]:8000", b"attn.example.org", b"ATTN.example.org.:443",
               b"10.0.0.5", b"x.localhost"):
        assert limits.host_allowed(ok), ok
    for bad in (b"example.org", b"10.0.0.6", b"attn.example.org.evil", b"", b"[::2]", b"localhost.evil"):
        assert not limits.host_allowed(bad), bad
    assert Limits.from_settings(Settings(), "my-box").host_allowed(b"my-box:8000")
    everywhere = Limits.from_settings(Settings(), "0.0.0.0")
    assert everywhere.host_allowed(b"192.168.1.20:8000") and everywhere.host_allowed(b"[fe80::1]")
    assert not everywhere.host_allowed(b"rebind.example")
    assert Limits.from_settings(Settings(allowed_hosts=["*"]), "127.0.0.1").host_allowed(b"anything.example")


def test_an_answer_of_known_length_leaves_in_one_write():
    """app/server._OneWrite: uvicorn writes an answer's head, then each piece of its body; an answer with a
    Content-Length goes to the socket in one writev, head and pieces; a chunked stream's pieces, and the answer to a
    HEAD request, go as they are written. uvicorn's own protocol with ours over it, on a real socket; the transport
    is recorded where it meets the socket."""
    import asyncio

    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from attnscope.app.server import protocol

    pieces = [b"a" * 10, b"b" * 200_000, b"c" * 30]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        known = scope["path"] == "/known"
        head = [(b"content-length", str(sum(map(len, pieces))).encode())] if known else []
        await send({"type": "http.response.start", "status": 200, "headers": head})
        for i, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": i < len(pieces) - 1})

    calls = []

    class Recorded:                    # the connection's transport, each call recorded, then done
        def __init__(self, transport):
            self._transport = transport

        def write(self, data):
            calls.append(("write", [bytes(data)]))
            self._transport.write(data)

        def writelines(self, items):
            calls.append(("writelines", [bytes(d) for d in items]))
            self._transport.writelines(items)

        def __getattr__(self, name):
            return getattr(self._transport, name)

    limits = Limits.from_settings(Settings(), "127.0.0.1")

    class Proto(protocol(limits)):
        def connection_made(self, transport):
            super().connection_made(Recorded(transport))

    async def exchange(method: str, path: str) -> bytes:
        config, state = Config(app=app, lifespan="off"), ServerState()
        server = await asyncio.get_running_loop().create_server(
            lambda: Proto(config=config, server_state=state, app_state={}), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        server.close()
        return got

    got = asyncio.run(exchange("GET", "/known"))
    assert [kind for kind, _ in calls] == ["writelines"]             # one write: head, then the three pieces
    head, *body = calls[0][1]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n") and body == pieces
    assert got == b"".join(calls[0][1])

    calls.clear()
    got = asyncio.run(exchange("GET", "/chunked"))                 # a stream: each piece as it is written
    assert [kind for kind, _ in calls] == ["write"] * 4 and b"transfer-encoding: chunked" in calls[0][1][0]
    assert got.endswith(b"0\r\n\r\n") and all(piece in got for piece in pieces)

    calls.clear()
    got = asyncio.run(exchange("HEAD", "/known"))                  # no body goes out: the head at once
    assert [kind for kind, _ in calls] == ["write"] and got == calls[0][1][0]
    assert b"content-length: 200040" in got


@pytest.fixture
def serve(tmp_path):
    """Start `attnscope serve` with extra environment; yields (url, stderr file); always stopped."""
    procs = []

    def start(env: dict, as_nobody: bool = False):
        port = free_port()
        log = tmp_path / f"stderr-{port}.txt"
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
        with open(log, "w") as err:
            proc = subprocess.Popen([*prefix, sys.executable, "-m", "attnscope", "serve", "--host", "127.0.0.1",
                                     "--port", str(port), "--log-level", "warning"], cwd=ROOT, stderr=err,
                                    env={**os.environ, **env})
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(url, proc, timeout=120)
        except RuntimeError:
            raise AssertionError(log.read_text()[-3000:]) from None
        return url, log
    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_connection_cap_closes_the_oldest_waiting_and_slow_readers_are_dropped(serve):
    url, log = serve({"ATTNSCOPE_MODELS": "minilm", "ATTNSCOPE_MAX_CONNECTIONS": "6",
                      "ATTNSCOPE_TIMEOUT_SEND": "2"})
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    idle = [socket.create_connection((host, port)) for _ in range(6)]
    time.sleep(0.3)
    with httpx.Client(base_url=url, timeout=10) as http:        # the 7th connection
        assert http.get("/healthz").status_code == 200
    idle[0].settimeout(5)
    answer = idle[0].recv(4096)                                # the oldest idle one made room
    assert answer.startswith(b"HTTP/1.1 503 ") and b"ATTNSCOPE_MAX_CONNECTIONS" in answer
    assert idle[0].recv(4096) == b""
    for s in idle:
        s.close()

    # a client that asks for 76 MB and reads nothing is dropped after ATTNSCOPE_TIMEOUT_SEND
    body = json.dumps({"text": " ".join(f"w{i}" for i in range(600))}).encode()
    s = socket.create_connection((host, port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    s.sendall(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: "
              + BINARY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(8)                                              # the run, then 2 s of not reading
    received = 0
    s.settimeout(10)
    try:
        while chunk := s.recv(1 << 20):
            received += len(chunk)
    except ConnectionResetError:
        pass
    s.close()
    assert 0 < received < 70_000_000, received
    assert "ATTNSCOPE_TIMEOUT_SEND" in log.read_text()
    assert httpx.get(url + "/healthz", timeout=10).status_code == 200


# ---- the JSON form in pieces; Accept; numbers; timing --------------------------------------------------------
def test_json_pieces_are_the_json_form_byte_for_byte():
    rng = np.random.default_rng(0)
    big = rng.random((3, 4, 200, 200), dtype=np.float32)
    payload = {"tokens": ["a", "\u00e9", "</script>"], "attention": big, "strided": big[:, :, ::3, 1::2],
               "rows": rng.random((700, 3), dtype=np.float32), "scalar": np.float32(0.1), "none": None,
               "summary": {"entropy": rng.random((3, 4), dtype=np.float32)}, "flat": rng.random(300_000)}
    late = {"timing_ms": {"model": 1.5, "total": 2.25}}
    pieces = wire.json_chunks(payload, lambda: late, cells=5_000)
    assert b"".join(pieces) == wire.to_json({**payload, **late})
    assert len(pieces) > 10 and max(map(len, pieces)) < 6 * 2**20
    assert json.loads(b"".join(pieces))["timing_ms"] == late["timing_ms"]
    assert b"".join(wire.json_chunks({"a": 1})) == b'{"a":1}' and b"".join(wire.json_chunks({})) == b"{}"


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(models=["tiny-gpt"]))) as c:
        yield c


def test_accept_quality_zero_means_not_binary(client):
    assert wire.accepts_binary(BINARY) and wire.accepts_binary(f"application/json;q=0.5, {BINARY};q=0.9")
    for no in (f"{BINARY};q=0", f"{BINARY}; q=0.0", f"{BINARY};Q=0", f"{BINARY};q=nope", "*/*", None,
               f"{BINARY}x", f"application/json, {BINARY};q=0"):
        assert not wire.accepts_binary(no), no
    body = {"model": "tiny-gpt", "text": TEXT, "layers": [0]}
    r = client.post("/api/attention", json=body, headers={"Accept": f"{BINARY};q=0"})
    assert r.headers["content-type"] == "application/json" and r.json()["layers"] == [0]
    r = client.post("/api/attention", json=body, headers={"Accept": f"{BINARY};q=0.1"})
    assert r.headers["content-type"] == BINARY


def test_huge_and_fractional_numbers_are_422_with_a_message(client):
    huge = b'{"model": "tiny-gpt", "text": "hi", "layers": [' + b"9" * 5000 + b"]}"
    r = client.post("/api/attention", content=huge, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "more digits" in r.json()["detail"] and "8191" in r.json()["detail"]
    r = client.post("/api/attention", json={"model": "tiny-gpt", "text": "hi", "layers": [10 ** 40]})
    assert r.status_code == 422 and "less than or equal to 8191" in r.json()["detail"]
    for body in ({"heads": [1.5]}, {"layers": [0.5]}, {"mask_tokens": [1e-9]}, {"precision": 3.25}, {"layers": [True]},
                 {"heads": ["1"]}, {"precision": "3"}):
        r = client.post("/api/attention", json={"model": "tiny-gpt", "text": "hi", **body})
        assert r.status_code == 422 and "must be a JSON integer" in r.json()["detail"], (body, r.text)
    r = client.post("/api/stages", json={"model": "tiny-gpt", "text": "hi", "layer": 0, "head": 1.5})
    assert r.status_code == 422 and "head: Value error, must be a JSON integer" in r.json()["detail"]


def test_integers_written_as_floats_are_integers(client):
    """JSON Schema's "integer" takes 4.0 (a number without a fractional part), so the API does: the same answer as 4
    (issue 37: schemathesis' ST202 on ten operations)."""
    body = {"model": "tiny-gpt", "text": "The cat sat on the mat and the cat slept.", "layers": [1, 3], "heads": [0, 2],
            "mask_tokens": [2], "precision": 3}
    want = client.post("/api/attention", json=body).json()
    floats = body | {"layers": [1.0, 3.0], "heads": [0.0, 2.0], "mask_tokens": [2.0], "precision": 3.0}
    got = client.post("/api/attention", json=floats)
    assert got.status_code == 200, got.text
    got = got.json()
    assert (got["layers"], got["heads"]) == ([1, 3], [0, 2]) and got["attention"] == want["attention"]
    assert all(round(v, 3) == v for row in got["attention"][0][0] for v in row)
    st = client.post("/api/stages", json={"model": "tiny-gpt", "text": "hi there", "layer": 1.0, "head": 2.0})
    assert st.status_code == 200 and (st.json()["layer"], st.json()["head"]) == (1, 2), st.text


def test_timing_covers_serialisation(client, monkeypatch):
    """timing_ms.total is taken after the tensors are converted and the JSON is written (0.3 s made slow)."""
    encode_json, cast = wire.json_chunks, sending._cast

    def slow_json(payload, late=None, **kw):
        time.sleep(0.3)
        return encode_json(payload, late, **kw)

    def slow_cast(a, dtype):
        time.sleep(0.3)
        return cast(a, dtype)
    monkeypatch.setattr(wire, "json_chunks", slow_json)
    monkeypatch.setattr(sending, "_cast", slow_cast)
    j = client.post("/api/attention", json={"model": "tiny-gpt", "text": TEXT + " json"}).json()
    assert j["timing_ms"]["total"] >= 300 and list(j)[-1] == "timing_ms"
    r = client.post("/api/attention", json={"model": "tiny-gpt", "text": TEXT + " f16", "dtype": "float16"},
                    headers={"Accept": BINARY})
    assert wire.from_binary(r.content)["timing_ms"]["total"] >= 300


# ---- a cache that cannot lie ---------------------------------------------------------------------------------
HANG_IN_EXPORT = """
import sys, time
import onnx.checker
onnx.checker.check_model = lambda *a, **k: time.sleep(120)   # the .tmpPID file is on disk by then
from attnscope.sources import zoo
from attnscope.runtime import Runtime
Runtime(zoo.get("tiny-gpt"), cache_dir=sys.argv[1]).onnx_path()
"""


def test_export_killed_half_way_leaves_no_temporary_file(tmp_path):
    cache = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-c", HANG_IN_EXPORT, str(cache)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size > 0 for p in cache.glob("*.tmp*")):   # created, then written: wait for both
        assert child.poll() is None and time.monotonic() < deadline, "the export never wrote its temporary file"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    [left] = list(cache.glob("*.tmp*"))
    assert left.name.endswith(f".tmp{child.pid}") and left.stat().st_size > 0
    busy = cache / f"other.tmp{os.getpid()}"                    # a live process's export is left alone
    busy.write_bytes(b"in progress")
    rt = Runtime(zoo.get("tiny-gpt"), cache_dir=cache)           # "restart"
    path = rt.onnx_path()
    assert sorted(p.name for p in cache.iterdir()) == sorted([path.name, path.name + ".sha256", busy.name])
    onnx.checker.check_model(str(path), full_check=True)


def _flip_scale_bits(path: Path) -> None:
    """Flip the lowest exponent bit of every layer's score scale (graphs hold no weights: their constants are what
    a flipped bit can corrupt): the file still parses, each scale doubles or halves, the numbers are wrong."""
    proto = onnx.load(str(path))
    scales = [t for t in proto.graph.initializer if t.name.startswith("scale") and len(t.raw_data) == 4]
    assert scales
    for t in scales:
        raw = bytearray(t.raw_data)
        raw[2] ^= 1 << 7                                        # float32 exponent's lowest bit: x2 or x0.5
        t.raw_data = bytes(raw)
    onnx.save(proto, str(path))


def test_bit_flipped_graph_is_detected_and_rebuilt(tmp_path, caplog):
    from attnscope.runtime.sessions import Session

    rt = Runtime(zoo.get("tiny-gpt"), cache_dir=tmp_path)
    path = rt.onnx_path()
    _flip_scale_bits(path)
    onnx.load(str(path))                                        # still a well-formed graph ...
    ids = np.array([rt.encode(TEXT).ids])
    feeds = rt.feeds(ids, np.zeros_like(ids), rt.build_mask([ids.shape[1]], True), [ids.shape[1]])
    lie = Session(path, PROVIDERS, 0, rt.weights).run(["attentions"], feeds)[0]
    truth = rt.run(TEXT, engine="numpy")[0].attentions
    assert np.abs(lie[:, 0] - truth).max() > 1e-3                # ... that lies
    fresh = Runtime(zoo.get("tiny-gpt"), cache_dir=tmp_path)     # a restart
    [res] = fresh.run(TEXT)
    assert f"cached graph {path.name} does not match its checksum; rebuilding" in caplog.text
    np.testing.assert_allclose(res.attentions, truth, atol=1e-5, rtol=0)
    assert fresh.onnx_path() == path and not list(tmp_path.glob("*.tmp*"))


def _read_only_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) | stat.S_IROTH | stat.S_IXOTH)


@pytest.mark.slow
def test_read_only_cache_with_only_the_main_graph_serves_stages(serve):
    """A cache folder nobody may write, holding only the main graph: the stages graph is built in a temporary
    folder, /api/stages answers, nothing is written to the cache and no traceback is printed. (As root, the
    server runs as `nobody`: root may write anywhere.)"""
    cache = Path(tempfile.mkdtemp(prefix="attnscope-ro-test-"))
    try:
        Runtime(zoo.get("tiny-gpt"), cache_dir=cache).onnx_path(stages=False)
        before = sorted(p.name for p in cache.iterdir())
        _read_only_tree(cache)
        as_nobody = os.geteuid() == 0
        assert not as_nobody or shutil.which("setpriv"), "running as root needs setpriv (util-linux; make test installs it)"
        url, log = serve({"ATTNSCOPE_MODELS": "tiny-gpt", "ATTNSCOPE_CACHE": str(cache)}, as_nobody)
        r = httpx.post(url + "/api/stages", json={"model": "tiny-gpt", "text": TEXT, "layer": 1, "head": 2}, timeout=60)
        assert r.status_code == 200 and len(r.json()["q"]) == len(r.json()["tokens"])
        r = httpx.get(url + "/api/models/tiny-gpt/onnx", params={"stages": "true"}, timeout=60)
        assert r.status_code == 200 and "q" in [o.name for o in onnx.load_from_string(r.content).graph.output]
        assert httpx.post(url + "/api/attention", json={"model": "tiny-gpt", "text": TEXT}).status_code == 200
        text = log.read_text()
        assert "cannot write the graph cache" in text and "Traceback" not in text
        assert sorted(p.name for p in cache.iterdir()) == before
    finally:
        for p in [cache, *cache.rglob("*")]:
            p.chmod(0o755)
        shutil.rmtree(cache)


# ---- run slots and the sending budget ------------------------------------------------------------------------
def test_run_slots_serve_oldest_first_and_newest_first_when_backed_up():
    import asyncio

    from attnscope.analyses.runs import RunSlots

    async def main():
        slots, order = RunSlots(1), []
        await slots.acquire()                                   # held

        async def waiter(i):
            await slots.acquire()
            order.append(i)
        tasks = [asyncio.create_task(waiter(i)) for i in range(4)]
        await asyncio.sleep(0)
        tasks[2].cancel()                                       # a waiter that went away is skipped
        await asyncio.sleep(0)
        for _ in range(3):
            slots.release()
            await asyncio.sleep(0)
        assert order == [3, 1, 0], order                        # backed up (3 waiting > 1): newest; then oldest
        slots.release()
        assert slots.free == 1 and not slots._waiters
        await asyncio.gather(*tasks, return_exceptions=True)

        # ... except that a waiter that has waited `patience` goes first
        slots.patience = 0.05
        await slots.acquire()
        order.clear()
        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0.1)
        tasks.append(asyncio.create_task(waiter(3)))
        await asyncio.sleep(0)
        for _ in range(4):
            slots.release()
            await asyncio.sleep(0)
        assert order == [0, 1, 2, 3], order
        await asyncio.gather(*tasks)
        slots.release()
        slots.patience = 5.0

        # a waiter cancelled just after it was handed the slot passes it on
        await slots.acquire()
        t = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        slots.release()
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        assert slots.free == 1
    in_thread(asyncio.run, main())


def test_sending_budget_bounds_bytes_for_all_clients_together():
    import asyncio

    from attnscope.app.sending import ByteBudget

    async def main():
        budget, held = ByteBudget(100), []
        assert await budget.acquire(60) == 60
        late = asyncio.create_task(budget.acquire(50))          # would go over: waits
        await asyncio.sleep(0.01)
        assert not late.done() and budget.used == 60
        await budget.release(60)
        assert await late == 50 and budget.used == 50
        await budget.release(50)
        assert await budget.acquire(500) == 500                 # larger than the budget: goes alone
        held.append(asyncio.create_task(budget.acquire(1)))
        await asyncio.sleep(0.01)
        assert not held[0].done()
        held[0].cancel()
        await budget.release(500)
        assert budget.used == 0
    in_thread(asyncio.run, main())
