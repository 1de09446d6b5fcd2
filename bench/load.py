"""Load test: wrk against a uvicorn this script starts on 127.0.0.1 (default settings), then stops.

    .venv/bin/python bench/load.py                      # 60 s at 16 connections, after a 30 s warm-up
    .venv/bin/python bench/load.py --duration 20 --connections 8 --warmup 10

A mixed load (weights below): the page, /healthz, /api/models, attention as JSON for one layer, as binary
for all layers, summaries only, and stages, on 200 distinct texts (100 short, 100 of 512 tokens), so the
result cache sees hits and misses. The warm-up runs the same mix, in rounds until the idle RSS stops growing
(at least two, at most four: the cache fills to its bound); the server's RSS is read when it is idle after the
warm-up and again after the measured run.

Prints requests/s, p50/p99 latency, errors (non-2xx other than the documented 503, plus socket errors and
timeouts), 503s separately, and RSS. Exit status 1 when there were errors, a 5xx other than 503, or RSS grew
by more than 10 %. Not part of the test suite; needs wrk (apt-get install wrk). Loopback only.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench.common import WIDEST_ENV, server  # noqa: E402

BINARY = "application/vnd.attnscope.tensors"
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health "
         "person art war history party result change morning reason research girl guy moment air teacher force "
         "education river mountain animal street because tired quickly slowly bright dark green").split()


def texts(n: int, seed: int) -> tuple[list[str], list[str]]:
    """n short texts (8-30 words) and n long ones (600 words: truncated to the model's 512 tokens)."""
    rng = random.Random(seed)
    short = [" ".join(rng.choices(WORDS, k=rng.randint(8, 30))) + f" ({i})." for i in range(n)]
    long = [f"Text {i}: " + " ".join(rng.choices(WORDS, k=600)) for i in range(n)]
    return short, long


def mix(short: list[str], long: list[str]) -> list[tuple[int, str, str, str | None, str | None]]:
    """(weight, method, path, JSON body, Accept) for every request in the load."""
    out: list[tuple[int, str, str, str | None, str | None]] = [
        (2, "GET", "/healthz", None, None), (2, "GET", "/api/models", None, None), (1, "GET", "/", None, None)]

    def post(weight, path, body, accept=None):
        out.append((weight, "POST", path, json.dumps(body), accept))
    for i, (s, l) in enumerate(zip(short, long)):
        layer, head = i % 6, i % 12
        post(6, "/api/attention", {"text": s, "layers": [layer]})                       # JSON, one layer
        post(1, "/api/attention", {"text": l, "layers": [layer], "precision": 4})
        post(3, "/api/attention", {"text": s}, BINARY)                                  # binary, all layers
        post(1, "/api/attention", {"text": l, "dtype": "float16"}, BINARY)
        post(2, "/api/attention", {"text": s, "include": ["summary"]})                  # summaries only
        post(2, "/api/attention", {"text": l, "include": ["summary"]})
        post(3, "/api/stages", {"model": "tiny-gpt" if i % 2 else "minilm", "text": s, "layer": layer % 4,
                                "head": head % 4})
        post(1, "/api/stages", {"text": l, "layer": layer, "head": head, "limit": 32})
    return out


def lua(requests, seed: int) -> str:
    """A wrk script: weighted random choice among pre-formatted requests; counts statuses; prints one line."""
    rows = ",\n".join(f"  {{{w}, {_lua(m)}, {_lua(p)}, {_lua(b)}, {_lua(a)}}}" for w, m, p, b, a in requests)
    return (Path(__file__).with_name("load.lua").read_text()
            .replace("-- REQUESTS --", rows).replace("-- SEED --", str(seed)))


def _lua(value: str | None) -> str:
    if value is None:
        return "nil"
    assert "]==]" not in value and value.isascii()
    return f"[==[{value}]==]"


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def wait_idle(url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(url + "/healthz", timeout=10).json()
        if health["running"] == 0 and health["waiting"] == 0:
            return health
        if time.monotonic() > deadline:
            raise RuntimeError(f"server still busy after the load: {health}")
        time.sleep(0.2)


def run_wrk(url: str, script: Path, seconds: int, connections: int) -> dict[str, float]:
    cmd = ["timeout", str(seconds + 60), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "60s",
           "-s", str(script), url]
    out = subprocess.run(cmd, capture_output=True, text=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
    return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=int, default=60, help="measured seconds (default 60)")
    ap.add_argument("--connections", type=int, default=16, help="concurrent connections (default 16)")
    ap.add_argument("--warmup", type=int, default=30, help="warm-up seconds before measuring (default 30)")
    ap.add_argument("--texts", type=int, default=100, help="short texts and long texts, each (default 100)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2

    short, long = texts(args.texts, args.seed)
    requests = mix(short, long)
    with server(WIDEST_ENV) as (url, pid), tempfile.TemporaryDirectory() as tmp:
        settings = httpx.get(url + "/healthz").json()
        script = Path(tmp) / "load.lua"
        script.write_text(lua(requests, args.seed))
        print(f"server pid {pid} on {url}; {len(requests)} distinct requests "
              f"({2 * args.texts} texts), weights in bench/load.py; wrk -t1 -c{args.connections}")
        print(f"RSS after start: {rss_mb(pid):.0f} MB")
        previous = rss_mb(pid)
        for round_ in range(1, 5 if args.warmup else 0):
            # until the idle RSS stops growing: the result cache fills to its bound (a result is up to ~400 MB
            # of teaching stages), and its filling is not what the RSS check is about
            w = run_wrk(url, script, args.warmup, args.connections)
            wait_idle(url)
            now = rss_mb(pid)
            print(f"warm-up {round_} ({args.warmup} s): {w['requests']:.0f} requests, {w['rps']:.1f} req/s, "
                  f"errors {w['errors']:.0f}, 503 {w['s503']:.0f}; idle RSS {now:.0f} MB")
            if round_ >= 2 and now <= previous * 1.05:
                break
            previous = now
        before = rss_mb(pid)
        print(f"RSS after warm-up (idle): {before:.0f} MB")
        r = run_wrk(url, script, args.duration, args.connections)
        health = wait_idle(url)
        after = rss_mb(pid)
    growth = (after - before) / before * 100
    print(f"load {args.duration} s at {args.connections} connections: {r['requests']:.0f} requests, "
          f"{r['rps']:.1f} req/s, {r['mb_read']:.0f} MB read")
    print(f"latency p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms")
    print(f"errors {r['errors']:.0f} (non-2xx other than 503: {r['non2xx']:.0f}, of them 5xx: {r['s5xx']:.0f}; "
          f"socket errors/timeouts: {r['socket']:.0f}); 503 (busy, documented) {r['s503']:.0f}; "
          f"304 {r['s304']:.0f}")
    print(f"RSS idle after warm-up {before:.0f} MB -> idle after load {after:.0f} MB ({growth:+.1f} %); "
          f"run limits: {settings['max_inflight']} in flight, {settings['max_queue']} queued; "
          f"after the load: {health['running']} running, {health['waiting']} waiting")
    ok = r["errors"] == 0 and r["s5xx"] == 0 and growth <= 10
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
