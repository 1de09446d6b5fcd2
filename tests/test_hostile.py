"""Untrusted input and hostile conditions: a hostile string corpus through every endpoint, every limit,
back-pressure (503 + Retry-After, nothing leaked, cancelled and vanished clients), a prompt /healthz during
long runs, security headers on every route (errors and 413s included), CORS off and on, and error bodies
without tracebacks or paths."""
from __future__ import annotations

import asyncio
import json
import re
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from attnscope.app.bundle import bundle
from attnscope.app.main import create_app
from attnscope.app.pages import PLOTLY_JS
from attnscope.app.middleware import CSP
from attnscope.analyses import checks
from attnscope.analyses.attention import AttentionRequest
from attnscope.app.settings import Settings, default_inflight
from attnscope.app.wire import BINARY, from_binary

from .conftest import run_in_fresh_loop

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The cat sat on the mat."

# ---- the corpus --------------------------------------------------------------------------------------------
HOSTILE = {
    "control": "\x01\x02\x07\x08\x0b\x0c\x0e\x1b[31mred\x1b[0m\x7f\x85 tail",
    "nul": "a\x00b\x00\x00c",
    "only-nul": "\x00",
    "lone-high": "left \ud800 right",
    "lone-low": "\udfff",
    "reversed-pair": "\udc00\ud800",
    "word-100k": "a" * 100_000,
    "rtl": "\u202eevil\u202c \u200f\u05e9\u05dc\u05d5\u05dd\u200e \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u2067x\u2069",
    "zwj-emoji": "\U0001F469\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 \U0001F3F3\ufe0f\u200d\U0001F308 "
                 "\U0001F9D1\U0001F3FD\u200d\U0001F4BB " * 40,
    "combining-flood": "e" + "\u0301" * 5000 + " Z\u0351\u0352\u0353" * 200,
    "no-spaces-20k": "x" * 20_000,
    "markup": "<script>alert(1)</script></script><img src=x onerror=alert(1)>{{7*7}}${7*7}<!--",
    "long-unicode": "\u6f22\u5b57\u304b\u306a\u30ab\u30ca\ud55c\uad6d\uc5b4" * 1_400,
    "zero-width": "\u200b\u200c\u200d\ufeff" * 500 + "visible",
    "unicode-space": "\u3000\u00a0\u2028\u2029\u0085",
    "noncharacters": "\uffff\ufffe\U0010ffff\U0001fffe \ue000\U000f0000",
    "json-in-text": '{"text": "x"}\\" \' ` \\u0000 %s %n',
}
# What the plain request {"text": s} must get; every variant gets 2xx or 4xx with a message.
EXPECTED = {"lone-high": (422, "lone UTF-16 surrogate (U+D800 at character 5)"),
            "lone-low": (422, "lone UTF-16 surrogate (U+DFFF at character 0)"),
            "reversed-pair": (422, "lone UTF-16 surrogate (U+DC00 at character 0)"),
            "word-100k": (413, "the limit is 20000 (ATTNSCOPE_MAX_CHARS)"),
            "unicode-space": (422, "text is empty"),
            "long-unicode": (422, "the JSON limit is 8,000,000 (ATTNSCOPE_MAX_JSON_CELLS)")}  # 512 tokens, 72 heads
LEAKS = re.compile(r"Traceback|File \"|/work/|/home/|/usr/|site-packages|\.py\b")


def variants(s: str) -> list[tuple[str, dict, dict]]:
    """(path, body, headers) for the string in every place a text goes, on every endpoint."""
    binary = {"Accept": BINARY}
    return [
        ("/api/attention", {"text": s}, {}),
        ("/api/attention", {"text": TEXT, "text_pair": s, "layers": [5]}, {}),
        ("/api/attention", {"text": s, "text_pair": s, "heads": [0], "mask_tokens": [1]}, {}),
        ("/api/attention", {"model": "tiny-gpt", "text": s, "mask_tokens": [1, 2]}, {}),
        ("/api/attention", {"text": s, "layers": [0]}, binary),
        ("/api/attention", {"text": s, "include": ["summary", "rollout"], "mask_tokens": [0, 3]}, {}),
        ("/api/stages", {"text": s, "layer": 0, "head": 0, "limit": 8}, {}),
        ("/api/stages", {"text": s, "text_pair": s, "layer": 5, "head": 11, "mask_tokens": [1], "limit": 8}, {}),
        ("/api/stages", {"model": "tiny-gpt", "text": s, "layer": 3, "head": 3, "mask_tokens": [1]}, binary),
        ("/api/attention", {"model": s, "text": TEXT}, {}),
        ("/api/attention", {"text": TEXT, s[:200]: 1}, {}),
    ]


def _send(http, path: str, body: dict, headers: dict):
    # json.dumps escapes everything to ASCII, so lone surrogates travel as the "\ud800" escapes a client sends
    return http.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json",
                                                                        **headers})


def check_answer(r, where: str) -> None:
    """2xx with a well-formed answer, or 4xx with a message; never a 5xx, a traceback or a path."""
    assert r.status_code < 500, f"{where}: {r.status_code} {r.text[:300]}"
    assert r.status_code < 300 or 400 <= r.status_code < 500, where
    if r.status_code >= 400:
        detail = r.json()["detail"]
        assert isinstance(detail, str) and len(detail) > 10, where
        assert not LEAKS.search(r.text), f"{where}: {r.text[:300]}"
        return
    j = from_binary(r.content) if r.headers["content-type"] == BINARY else orjson.loads(r.content)  # strict UTF-8
    n = len(j["tokens"])
    assert 2 <= n <= 512 and len(j["offsets"]) == len(j["special"]) == len(j["segments"]) == n, where
    assert r.headers["x-content-type-options"] == "nosniff"


@pytest.fixture(scope="module")
def client():
    """MiniLM up to its 512 positions (by default it stops at the 256 it was trained on): the limits at their widest."""
    with TestClient(create_app(Settings(max_tokens={"minilm": 512}))) as c:
        yield c


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_strings_everywhere_in_process(client, name):
    s = HOSTILE[name]
    status, message = EXPECTED.get(name, (200, None))
    r = _send(client, "/api/attention", {"text": s}, {})
    assert r.status_code == status, r.text[:300]
    if message:
        assert message in r.json()["detail"]
    for path, body, headers in variants(s):
        check_answer(_send(client, path, body, headers), f"{name} {path} {list(body)}")
    r = client.get(f"/api/models/{quote(s[:200], safe='', errors='surrogatepass')}/onnx")
    assert r.status_code in (404, 422) and not LEAKS.search(r.text)


def test_hostile_answers_are_what_they_should_be(client):
    """Spot checks on the content: truncation flagged, markup returned as data, control characters dropped."""
    j = _send(client, "/api/attention", {"text": HOSTILE["long-unicode"], "layers": [0], "heads": [0]}, {}).json()
    assert j["truncated"] is True and len(j["tokens"]) == 512
    j = _send(client, "/api/attention", {"text": HOSTILE["markup"], "include": ["summary"]}, {}).json()
    assert "<" in j["tokens"] and "script" in j["tokens"]
    j = _send(client, "/api/attention", {"text": HOSTILE["nul"], "include": ["summary"]}, {}).json()
    assert j["tokens"][0] == "[CLS]" and all("\x00" not in t for t in j["tokens"])
    j = _send(client, "/api/attention", {"text": HOSTILE["no-spaces-20k"], "include": ["summary"]}, {}).json()
    assert j["tokens"] == ["[CLS]", "[UNK]", "[SEP]"] and j["offsets"][1] == [0, 20_000]


def test_hostile_strings_on_the_live_server(live_server):
    """The whole corpus through uvicorn, 4 clients at once; the server stays healthy and idle afterwards."""
    jobs = [(name, *v) for name, s in HOSTILE.items() for v in variants(s)]
    with httpx.Client(base_url=live_server, timeout=120) as http, ThreadPoolExecutor(4) as pool:
        built = http.get("/healthz").json()["graphs_built"]
        answers = list(pool.map(lambda job: (job[0], job[1], _send(http, *job[1:])), jobs))
        for name, path, r in answers:
            check_answer(r, f"live {name} {path}")
        health = http.get("/healthz").json()
        assert 0 <= health["cache_bytes"] <= health["cache_max_bytes"] == 768 * 2**20
        assert health["runs_computed"] > 0
        assert health | {"models": None, "version": None, "cache_bytes": None, "runs_computed": None} == {
            "status": "ok", "models": None, "version": None, "running": 0, "waiting": 0,
            "max_inflight": default_inflight(), "max_queue": 32, "jobs_skipped": [], "cache_bytes": None,
            "cache_max_bytes": 768 * 2**20, "loading": {}, "graphs_built": built,   # no request built a graph
            "runs_computed": None, "kept_hits": 0}                 # the test server keeps no answers on disk


# ---- limits ------------------------------------------------------------------------------------------------
def test_text_and_pair_count_together(client):
    r = _send(client, "/api/attention", {"text": "a" * 15_000, "text_pair": "b" * 6_000}, {})
    assert r.status_code == 413
    assert r.json()["detail"].startswith("text is 21000 characters; the limit is 20000 (ATTNSCOPE_MAX_CHARS)")


def test_tokens_are_truncated_to_the_model_maximum_and_flagged(client):
    words = " ".join(f"w{i}" for i in range(700))
    j = _send(client, "/api/attention", {"text": words, "layers": [0], "heads": [0]}, {}).json()
    assert j["truncated"] is True and len(j["tokens"]) == 512 and len(j["attention"][0][0]) == 512
    j = _send(client, "/api/attention", {"text": words, "text_pair": words, "include": ["summary"]}, {}).json()
    assert j["truncated"] is True and len(j["tokens"]) == 512 and set(j["segments"]) == {-1, 0, 1}
    j = _send(client, "/api/attention", {"text": "short", "layers": [0]}, {}).json()
    assert j["truncated"] is False


def test_mask_tokens_limit_names_the_setting(client):
    r = _send(client, "/api/attention", {"text": TEXT, "mask_tokens": list(range(513))}, {})
    assert r.status_code == 422 and "the limit is 512 (ATTNSCOPE_MAX_MASK_TOKENS)" in r.json()["detail"]


def test_answer_size_limits_name_the_setting(client):
    words = " ".join(f"w{i}" for i in range(700))
    r = _send(client, "/api/attention", {"text": words}, {})  # 6 x 12 x 512 x 512 = 18.9 M values as JSON
    assert r.status_code == 422 and "limit is 8,000,000 (ATTNSCOPE_MAX_JSON_CELLS)" in r.json()["detail"]
    assert _send(client, "/api/attention", {"text": words}, {"Accept": BINARY}).status_code == 200
    with TestClient(create_app(Settings(models=["tiny-gpt"], max_binary_cells=100))) as c:
        r = _send(c, "/api/attention", {"model": "tiny-gpt", "text": TEXT}, {"Accept": BINARY})
        assert r.status_code == 422 and "limit is 100 (ATTNSCOPE_MAX_BINARY_CELLS)" in r.json()["detail"]


def test_limits_are_configurable_from_the_environment(monkeypatch):
    for name, value in {"MAX_CHARS": "40", "MAX_BODY_BYTES": "3000", "MAX_MASK_TOKENS": "2", "MODELS": "tiny-gpt",
                        "MAX_JSON_CELLS": "100"}.items():
        monkeypatch.setenv(f"ATTNSCOPE_{name}", value)
    with TestClient(create_app(Settings())) as c:
        body = {"model": "tiny-gpt", "text": "word " * 7, "layers": [0], "heads": [0]}
        assert _send(c, "/api/attention", body, {}).status_code == 200
        assert "limit is 40 (ATTNSCOPE_MAX_CHARS)" in _send(c, "/api/attention", body | {"text": "x" * 41}, {}).text
        assert "limit is 2 (ATTNSCOPE_MAX_MASK_TOKENS)" in _send(c, "/api/attention", body | {
            "mask_tokens": [1, 2, 3]}, {}).text
        assert "limit is 100 (ATTNSCOPE_MAX_JSON_CELLS)" in _send(c, "/api/attention", body | {"heads": None}, {}).text
        r = c.post("/api/attention", content=b" " * 3001, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "3,000-byte limit (ATTNSCOPE_MAX_BODY_BYTES)" in r.json()["detail"]


def test_every_setting_is_documented():
    readme = (ROOT / "README.md").read_text()
    missing = [f"ATTNSCOPE_{name.upper()}" for name in Settings.model_fields
               if f"ATTNSCOPE_{name.upper()}" not in readme]
    assert not missing, f"settings not in the README: {missing}"


def test_streamed_body_over_the_limit_is_413(live_server):
    """No Content-Length (chunked): the limit still holds, with the security headers, and the server is fine."""
    def chunks():
        for _ in range(40):
            yield b"a" * 50_000
    r = httpx.post(f"{live_server}/api/attention", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=30)
    assert r.status_code == 413 and "1,000,000-byte limit (ATTNSCOPE_MAX_BODY_BYTES)" in r.json()["detail"]
    assert r.headers.get_list("content-security-policy") == [CSP]
    assert httpx.get(f"{live_server}/healthz", timeout=10).status_code == 200


# ---- back-pressure ---------------------------------------------------------------------------------------
class Gate:
    """Holds model runs in their worker thread until opened."""

    def __init__(self, svc):
        self.event, self.started = threading.Event(), 0
        run = svc.runner._execute

        def held(*args):
            self.started += 1
            assert self.event.wait(30), "gate never opened"
            return run(*args)
        svc.runner._execute = held


def _idle(svc) -> None:
    assert svc.runner.counts()["running"] == 0 and svc.runner.counts()["waiting"] == 0
    assert svc.runner._slots.free == svc.settings.max_inflight and not svc.runner._pending


def test_busy_is_503_with_retry_after_and_nothing_leaks():
    app = create_app(Settings(models=["tiny-gpt"], max_inflight=1, max_queue=2))
    svc = app.state.service
    svc.load()
    gate = Gate(svc)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as http:
            tasks = [asyncio.create_task(http.post("/api/attention", json={"model": "tiny-gpt", "text": f"t {i}"}))
                     for i in range(6)]
            for _ in range(100):
                await asyncio.sleep(0.02)
                if gate.started == 1 and svc.runner.counts()["waiting"] == 2 and sum(t.done() for t in tasks) == 3:
                    break
            health = await http.get("/healthz")  # answers while the run is held
            assert health.json()["running"] == 1 and health.json()["waiting"] == 2
            busy = [t.result() for t in tasks if t.done()]
            assert [r.status_code for r in busy] == [503] * 3
            for r in busy:
                assert r.headers["retry-after"] == "1"
                assert "ATTNSCOPE_MAX_INFLIGHT, ATTNSCOPE_MAX_QUEUE" in r.json()["detail"]
                assert r.headers.get_list("x-frame-options") == ["DENY"]
            held = [t for t in tasks if not t.done()]
            gate.event.set()
            done = [await t for t in held]
            assert [r.status_code for r in done] == [200] * 3
    try:
        run_in_fresh_loop(main())
    finally:
        gate.event.set()
    _idle(svc)


def test_cancelled_requests_leak_nothing_and_do_not_fail_others():
    """A request cancelled while waiting or while its run is in flight (a client gone, a server that cancels):
    counts and slots come back, a request sharing the same run still gets it (and it is cached), and a queued
    run that nobody waits for any more is dropped without being started."""
    app = create_app(Settings(models=["tiny-gpt"], max_inflight=1, max_queue=4))
    svc = app.state.service
    svc.load()
    gate = Gate(svc)
    shared, other = (svc.plans.attention(AttentionRequest(model="tiny-gpt", text=t), binary=False)
                     for t in ("shared run", "queued run"))

    async def main():
        owner = asyncio.create_task(shared.compute(svc.runner))
        await asyncio.sleep(0.05)
        follower = asyncio.create_task(shared.compute(svc.runner))
        waiter = asyncio.create_task(other.compute(svc.runner))
        await asyncio.sleep(0.05)
        assert svc.runner.counts()["running"] == 1 and svc.runner.counts()["waiting"] == 1
        owner.cancel()
        waiter.cancel()
        await asyncio.sleep(0.05)
        assert svc.runner.counts()["waiting"] == 0, "the queued run nobody waits for is still queued"
        gate.event.set()
        done = await follower
        assert done.hit is True and done.result.tokens[0] == "[CLS]"
        for task in (owner, waiter):
            with pytest.raises(asyncio.CancelledError):
                await task
        for _ in range(100):
            if not svc.runner._pending:
                break
            await asyncio.sleep(0.02)
    try:
        run_in_fresh_loop(main())
    finally:
        gate.event.set()
    _idle(svc)
    assert gate.started == 1
    assert svc.runner.cache.get(shared.run.key) is not None and svc.runner.cache.get(other.run.key) is None   # the runs
    # the plans named (an attention-only request runs a graph that stops at its last layer: a key of its own)
    assert not svc.runner._waiters and not svc.runner._started


def test_clients_that_hang_up_leak_nothing_on_the_live_server(live_server):
    """Ten runs whose clients give up after 50 ms: the server finishes the run already under way, drops the
    queued ones (they are not cached), and idles; a retry is answered. The runs are MiniLM's 256 tokens on the NumPy
    reference (~0.2 s each, well past the 50 ms; the ONNX graph would finish one before the hang-ups are seen)."""
    tag = uuid.uuid4().hex[:8]
    bodies = [{"text": " ".join(f"{tag}{k}w{i}" for i in range(600)), "include": ["summary"], "engine": "numpy"}
              for k in range(10)]

    def hang_up(body):
        try:
            httpx.post(f"{live_server}/api/attention", json=body, timeout=0.05)
        except httpx.TimeoutException:
            pass
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(hang_up, bodies))
    deadline = time.monotonic() + 60
    while True:
        health = httpx.get(f"{live_server}/healthz", timeout=10).json()
        if health["running"] == 0 and health["waiting"] == 0:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.1)
    cached = [httpx.post(f"{live_server}/api/attention", json=b, timeout=60).headers["x-cache"] for b in bodies]
    assert cached.count("hit") <= 2 * health["max_inflight"], cached   # only runs that had started


def test_healthz_is_prompt_while_long_runs_are_in_flight(live_server):
    """Model runs happen in worker threads: six 512-token runs (stages and attention, ~0.3-2 s each) keep
    both run slots busy, and /healthz still answers within a fraction of one run's time."""
    tag = uuid.uuid4().hex[:8]

    def job(k):
        text = " ".join(f"{tag}{k}w{i}" for i in range(600))
        if k % 2:
            return "/api/stages", {"text": text, "layer": 0, "head": 0, "limit": 8}
        return "/api/attention", {"text": text, "include": ["summary"]}
    codes, latencies, busy = [], [], 0
    with ThreadPoolExecutor(6) as pool, httpx.Client(base_url=live_server, timeout=120) as http:
        futures = [pool.submit(lambda j=job(k): http.post(*j[:1], json=j[1]).status_code) for k in range(6)]
        while not all(f.done() for f in futures):
            started = time.perf_counter()
            health = http.get("/healthz").json()
            latencies.append(time.perf_counter() - started)
            busy += health["running"] > 0
            time.sleep(0.05)
        codes = [f.result() for f in futures]
    assert codes == [200] * 6
    assert busy >= 5, "the runs finished before /healthz could be asked while they ran"
    assert statistics.median(latencies) < 0.25 and max(latencies) < 1.0, sorted(latencies)[-5:]


# ---- security headers --------------------------------------------------------------------------------------
SECURITY = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "x-frame-options": "DENY",
            "referrer-policy": "no-referrer", "cross-origin-opener-policy": "same-origin"}


def test_csp_allows_no_inline_script_and_no_other_origin():
    directives = dict((d.split()[0], d.split()[1:]) for d in CSP.split("; "))
    assert directives["script-src"] == ["'self'"] and directives["default-src"] == ["'self'"]
    assert directives["frame-ancestors"] == ["'none'"] and directives["object-src"] == ["'none'"]
    assert not re.search(r"https?:|\*|unsafe-eval", CSP)
    assert "'unsafe-inline'" not in directives["script-src"]


def _requests(c) -> list[tuple[str, httpx.Response, int]]:
    """One request for every route and every kind of answer: (label, response, expected status)."""
    static = sorted(p for p in (ROOT / "static").rglob("*") if p.is_file())[0].relative_to(ROOT)
    body = {"text": TEXT, "layers": [0]}
    etag = _send(c, "/api/attention", body, {}).headers["etag"]
    json_ct = {"Content-Type": "application/json"}
    return [
        ("page", c.get("/"), 200),
        ("static", c.get(f"/{static}"), 200),
        ("plotly", c.get("/vendor/plotly.min.js"), 200),
        ("page script", c.get("/bundle/main.js"), 200),
        ("models", c.get("/api/models"), 200),
        ("onnx", c.get("/api/models/tiny-gpt/onnx"), 200),
        ("onnx 404", c.get("/api/models/nope/onnx"), 404),
        ("onnx 422", c.get("/api/models/tiny-gpt/onnx?stages=maybe"), 422),
        ("healthz", c.get("/healthz"), 200),
        ("openapi", c.get("/openapi.json"), 200),
        ("docs", c.get("/docs"), 200),
        ("no route", c.get("/nope"), 404),
        ("wrong method", c.delete("/api/models"), 405),
        ("attention", _send(c, "/api/attention", body, {}), 200),
        ("attention binary", _send(c, "/api/attention", body, {"Accept": BINARY}), 200),
        ("attention gzip", _send(c, "/api/attention", body, {"Accept-Encoding": "gzip"}), 200),
        ("not modified", _send(c, "/api/attention", body, {"If-None-Match": etag}), 304),
        ("stages", _send(c, "/api/stages", {"text": TEXT, "layer": 0, "head": 0}, {}), 200),
        ("bad json", c.post("/api/attention", content=b"{", headers=json_ct), 400),
        ("body 413", c.post("/api/attention", content=b" " * 1_000_001, headers=json_ct), 413),
        ("text 413", _send(c, "/api/attention", {"text": "a" * 20_001}, {}), 413),
        ("422", _send(c, "/api/attention", {"text": "\ud800"}, {}), 422),
        ("unknown model", _send(c, "/api/attention", {"model": "x", "text": TEXT}, {}), 404),
    ]


def _assert_security_headers(label: str, r) -> None:
    for name, value in SECURITY.items():
        assert r.headers.get_list(name) == [value], f"{label}: {name} = {r.headers.get_list(name)}"


def test_security_headers_on_every_route_and_error(client):
    for label, r, status in _requests(client):
        assert r.status_code == status, f"{label}: {r.status_code} {r.text[:200]}"
        _assert_security_headers(label, r)


def test_security_headers_on_the_live_server(live_server):
    with httpx.Client(base_url=live_server, timeout=60) as http:
        for label, r, status in _requests(http):
            assert r.status_code == status, f"{label}: {r.status_code}"
            _assert_security_headers(label, r)


def test_page_has_no_inline_script_and_no_other_origin(client):
    html = client.get("/").text
    for attrs, inner in re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S):
        if attrs.strip() == 'type="application/json" id="boot"':   # data, not code: CSP does not run it
            json.loads(inner)
            assert "</" not in inner
            continue
        assert re.search(r'\bsrc="/[^/]', attrs) and not inner.strip(), f"inline or foreign script: {attrs!r}"
    assert not re.search(r'(?:src|href|action)="(?:https?:)?//', html), "a reference to another origin"
    assert not re.search(r"\son[a-z]+=", html), "an inline event handler"


def test_page_scripts_one_bundle_and_plotly_compressed_once(client):
    """The page's code is one script, the bundle of static/js/main.js (revalidated by its ETag); plotly.js is
    gzipped once and sent as such to a browser that takes gzip, byte for byte the file otherwise."""
    html = client.get("/").text
    assert re.findall(r'<script\b[^>]*\bsrc="([^"]+)"', html) == ["/bundle/main.js"]
    r = client.get("/bundle/main.js")
    assert r.text == bundle(ROOT / "static" / "js" / "main.js") and r.headers["content-type"].startswith("text/javascript")
    assert client.get("/bundle/main.js", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    gz = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    plain = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert gz.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert gz.content == plain.content == PLOTLY_JS.read_bytes()


def test_internal_errors_have_no_traceback_or_path(client, monkeypatch):
    svc = client.app.state.service

    def broken(*args, **kw):
        raise RuntimeError(f"boom in {ROOT}/app/service.py line 3")
    monkeypatch.setattr(checks, "cells", broken)
    with TestClient(client.app, raise_server_exceptions=False) as c:
        r = _send(c, "/api/attention", {"text": "an internal error " + uuid.uuid4().hex, "layers": [0]}, {})
    assert r.status_code == 500
    assert r.json() == {"detail": "internal error (RuntimeError); please report it"}
    _assert_security_headers("500", r)


# ---- CORS ---------------------------------------------------------------------------------------------------
PREFLIGHT = {"Origin": "https://a.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type"}


def test_cors_is_off_by_default(client):
    r = client.options("/api/attention", headers=PREFLIGHT)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    r = client.get("/api/models", headers={"Origin": "https://a.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_cors_allow_list_from_the_environment(monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CORS_ORIGINS", "https://a.example, https://b.example")
    monkeypatch.setenv("ATTNSCOPE_MODELS", "tiny-gpt")
    settings = Settings()
    assert settings.cors_origins == ["https://a.example", "https://b.example"]
    with TestClient(create_app(settings)) as c:
        r = c.options("/api/attention", headers=PREFLIGHT)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://a.example"
        assert "POST" in r.headers["access-control-allow-methods"]
        _assert_security_headers("preflight", r)
        r = c.options("/api/attention", headers=PREFLIGHT | {"Origin": "https://evil.example"})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        r = c.post("/api/attention", json={"model": "tiny-gpt", "text": TEXT}, headers={"Origin": "https://b.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://b.example"
        r = c.post("/api/attention", json={"model": "tiny-gpt", "text": TEXT},
                   headers={"Origin": "https://evil.example"})   # an origin not listed: refused (issue 50)
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
