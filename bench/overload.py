"""Overload, abandoned requests and a big JSON answer against the real server (`attnscope serve`), loopback only.

    .venv/bin/python bench/overload.py [--seconds 20] [--inflight 1 2]

For each ATTNSCOPE_MAX_INFLIGHT given (default: the server's default), on a fresh server:
  single   - one client, one 512-token text after another (summaries only): the single-run rate
  overload - 64 clients of 512-token texts that give up after 2 s (as wrk's default timeout does), 503s
             retried after 0.1 s: answers/s that arrived in time (goodput), given up, 503s
  abandon  - 30 clients send 512-token texts at once and hang up after 0.3 s: how long the server stays busy
             after they are gone, and its CPU seconds meanwhile (work nobody receives)
  big JSON - one client repeats the largest JSON answer allowed (5 layers x 6 heads x 512 x 512 = 7.9 M
             values, ~85 MB); /healthz asked every 50 ms meanwhile: p50/p99/max
Every text is distinct (a counter in it), so the result cache never answers for the model.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.common import server  # noqa: E402
from bench.slowloris import percentile  # noqa: E402

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
_count = 0


def text512() -> dict:
    """A body with a new 512-token text (600 words, truncated to the model's 512 tokens)."""
    global _count
    _count += 1
    return {"text": f"run {_count} {time.time_ns()} " + " ".join(WORDS[(i * 7 + _count) % len(WORDS)]
                                                               for i in range(600)), "include": ["summary"]}


def idle(url: str, timeout: float = 300) -> float:
    """Seconds until /healthz shows no run in flight or waiting."""
    t0 = time.monotonic()
    while True:
        h = httpx.get(url + "/healthz", timeout=30).json()
        if h["running"] == 0 and h["waiting"] == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"still busy: {h}")
        time.sleep(0.02)


def single(url: str, seconds: float) -> float:
    n, t0 = 0, time.monotonic()
    with httpx.Client(base_url=url, timeout=60) as http:
        while time.monotonic() - t0 < seconds:
            assert http.post("/api/attention", json=text512()).status_code == 200
            n += 1
    return n / (time.monotonic() - t0)


def overload(url: str, seconds: float, clients: int = 64, give_up: float = 2.0) -> dict:
    counts = {"ok": 0, "gave_up": 0, "s503": 0, "other": 0}

    async def client(http, stop):
        while time.monotonic() < stop:
            try:
                r = await http.post("/api/attention", json=text512(), timeout=give_up)
            except httpx.TimeoutException:
                counts["gave_up"] += 1
                continue
            if r.status_code == 200:
                counts["ok"] += 1
            elif r.status_code == 503:
                counts["s503"] += 1
                await asyncio.sleep(0.1)
            else:
                counts["other"] += 1

    async def main():
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=url, limits=limits) as http:
            stop = time.monotonic() + seconds
            await asyncio.gather(*(client(http, stop) for _ in range(clients)))
    busy, done = [], threading.Event()

    def sample():                          # is a model run under way? (the slot should never idle)
        with httpx.Client(base_url=url, timeout=30) as http:
            while not done.is_set():
                busy.append(http.get("/healthz").json()["running"] > 0)
                time.sleep(0.1)
    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.monotonic()
    try:
        asyncio.run(main())
    finally:
        done.set()
        sampler.join()
    counts["seconds"] = time.monotonic() - t0
    counts["busy"] = sum(busy) / max(len(busy), 1)
    counts["drain_s"] = idle(url)
    return counts


def abandon(url: str, pid: int, clients: int = 30, after: float = 0.3) -> dict:
    proc = psutil.Process(pid)

    async def hang_up(http, body):
        try:
            await http.post("/api/attention", json=body, timeout=after)
        except httpx.TimeoutException:
            pass

    async def main():
        async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=clients)) as http:
            await asyncio.gather(*(hang_up(http, text512()) for _ in range(clients)))
    asyncio.run(main())
    cpu0 = sum(proc.cpu_times()[:2])
    busy = idle(url)
    return {"busy_after_s": busy, "cpu_after_s": sum(proc.cpu_times()[:2]) - cpu0}


def probe(url: str, seconds: float, every: float = 0.05) -> list[float]:
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as http:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            s = time.perf_counter()
            http.get("/healthz")
            latencies.append((time.perf_counter() - s) * 1000)
            time.sleep(every)
    return latencies


def big_json(url: str, seconds: float) -> dict:
    """The repeating client is curl in a process of its own: a Python one would hold this process's GIL while
    it copies 85 MB, and the /healthz timings would measure that instead of the server. For scale, /healthz
    is also timed while two processes spin on the CPU (what the serialising thread and curl take from the
    2 cores, without the server doing anything): on a shared machine that floor can be far above 50 ms."""
    body = text512() | {"layers": [0, 1, 2, 3, 4], "heads": [0, 1, 2, 3, 4, 5], "include": ["attention"]}
    stop, sizes = threading.Event(), []

    def repeat():
        cmd = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "-H",
               "Content-Type: application/json", "--data-binary", json.dumps(body), url + "/api/attention"]
        while not stop.is_set():
            code, size = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.split()
            assert code == "200", code
            sizes.append(int(size))
    quiet = probe(url, seconds / 2)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        floor = probe(url, seconds / 2)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    worker = threading.Thread(target=repeat)
    worker.start()
    try:
        latencies = probe(url, seconds)
    finally:
        stop.set()
        worker.join()
    return {"quiet": percentile(quiet, .99), "floor": percentile(floor, .99), "p50": percentile(latencies, .5),
            "p99": percentile(latencies, .99), "max": max(latencies), "answers": len(sizes),
            "mb": sizes[0] / 1e6 if sizes else 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20, help="seconds of each timed part (default 20)")
    ap.add_argument("--inflight", type=int, nargs="*", default=[0], help="ATTNSCOPE_MAX_INFLIGHT (0: default)")
    args = ap.parse_args(argv)
    ok = True
    for inflight in args.inflight:
        env = {"ATTNSCOPE_MODELS": "minilm"} | ({"ATTNSCOPE_MAX_INFLIGHT": str(inflight)} if inflight else {})
        with server(env) as (url, pid):
            limits = httpx.get(url + "/healthz").json()
            print(f"server pid {pid}: max_inflight {limits['max_inflight']}, max_queue {limits['max_queue']}",
                  flush=True)
            proc = psutil.Process(pid)
            cpu = lambda: sum(proc.cpu_times()[:2])  # noqa: E731
            c0, rate = cpu(), single(url, args.seconds / 2)
            c1 = cpu()
            print(f"  single   : {rate:.2f} answers/s, one client, one 512-token text after another "
                  f"({(c1 - c0) / (rate * args.seconds / 2):.2f} server CPU s per answer)", flush=True)
            o = overload(url, args.seconds)
            c2, good = cpu(), o["ok"] / o["seconds"]
            after = single(url, args.seconds / 2)   # the machine may be shared: the single rate again, after
            rate = (rate + after) / 2
            print(f"  overload : 64 clients giving up after 2 s: {good:.2f} answers/s in time ({good / rate:.2f}x "
                  f"the single rate, {after:.2f}/s when measured again after), {o['gave_up']} given up, "
                  f"{o['s503']} x 503, {o['other']} other; a run under way {o['busy']:.0%} of the time; "
                  f"{(c2 - c1) / max(o['ok'], 1):.2f} server CPU s per answer; idle {o['drain_s']:.2f} s after "
                  f"the clients stopped", flush=True)
            a = abandon(url, pid)
            print(f"  abandon  : 30 clients hung up after 0.3 s: server busy {a['busy_after_s']:.2f} s more, "
                  f"{a['cpu_after_s']:.2f} CPU s", flush=True)
            b = big_json(url, args.seconds)
            print(f"  big JSON : {b['answers']} answers of {b['mb']:.0f} MB; /healthz p50 {b['p50']:.1f} ms, "
                  f"p99 {b['p99']:.1f} ms, max {b['max']:.1f} ms (p99 idle: {b['quiet']:.1f} ms; p99 while two "
                  f"processes spin, the machine's floor: {b['floor']:.1f} ms)", flush=True)
            ok &= good >= rate and a["busy_after_s"] <= 1 and b["p99"] < 50 and o["other"] == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
