"""Slow clients against the real server (`attnscope serve`, default settings), loopback only, bounded in time.

    .venv/bin/python bench/slowloris.py [--clients 50] [--duration 60]

Three kinds of client, `--clients` of each, each reconnecting as soon as the server closes it, for
`--duration` seconds:
  header - sends a request line, then one header line that never ends (256 bytes every 100 ms)
  body   - sends a POST's headers announcing 100 kB, then one byte of body a second
  idle   - connects and sends nothing
Meanwhile one client asks /healthz every 50 ms. Prints /healthz p50/p99/max, how long the server let each
kind of connection live (max, and how many were still open past 20 s), what it answered them, and the
server's RSS and CPU. Exit status 1 unless /healthz p99 < 100 ms and every connection was closed within 20 s.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

KINDS = ("header", "body", "idle")


async def one(host: str, port: int, kind: str) -> tuple[float, bytes]:
    """One slow connection, until the server closes it: (seconds it lived, the first bytes it answered)."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()

    async def feed():
        if kind == "header":
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            while True:
                writer.write(b"a" * 256)
                await writer.drain()
                await asyncio.sleep(0.1)
        if kind == "body":
            writer.write(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n{")
            while True:
                await writer.drain()
                await asyncio.sleep(1)
                writer.write(b" ")
        await asyncio.sleep(3600)          # idle
    feeding = asyncio.ensure_future(feed())
    answer = b""
    try:
        while chunk := await reader.read(65536):
            answer += chunk[:200] if len(answer) < 200 else b""
    except ConnectionError:
        pass
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        writer.close()
    return time.monotonic() - started, answer


async def loris(url: str, kind: str, clients: int, seconds: float, lives: dict, answers: Counter,
                open_ages: list) -> None:
    """`clients` slow connections of one kind, each replaced when closed, until `seconds` have passed."""
    host, port = url.split("//")[1].split(":")
    stop = time.monotonic() + seconds

    async def client():
        while time.monotonic() < stop:
            opened = time.monotonic()
            task = asyncio.ensure_future(one(host, int(port), kind))
            done, _ = await asyncio.wait({task}, timeout=max(0.0, stop - time.monotonic()))
            if not done:                   # still open when the run ends: count its age so far
                open_ages.append((kind, time.monotonic() - opened))
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return
            life, answer = task.result()
            lives[kind].append(life)
            answers[kind, answer.split(b"\r\n", 1)[0].decode("latin-1") or "(closed)"] += 1
    await asyncio.gather(*(client() for _ in range(clients)))


def probe(url: str, stop: threading.Event, latencies: list, every: float = 0.05) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = http.get("/healthz")
            latencies.append((time.perf_counter() - t0) * 1000 if r.status_code == 200 else float("inf"))
            time.sleep(every)


def attack(url: str, clients: int, seconds: float, kinds=KINDS) -> dict:
    """Run the slow clients and the /healthz probe; return what was measured."""
    lives, answers, open_ages, latencies = defaultdict(list), Counter(), [], []
    stop = threading.Event()
    prober = threading.Thread(target=probe, args=(url, stop, latencies))
    prober.start()

    async def main():
        await asyncio.gather(*(loris(url, k, clients, seconds, lives, answers, open_ages) for k in kinds))
    try:
        asyncio.run(main())
    finally:
        stop.set()
        prober.join()
    return {"lives": lives, "answers": answers, "open_ages": open_ages, "latencies": latencies}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv=None) -> int:
    import psutil

    from bench.common import server

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50, help="slow clients of each kind (default 50)")
    ap.add_argument("--duration", type=float, default=60, help="seconds (default 60)")
    args = ap.parse_args(argv)
    with server() as (url, pid):
        proc = psutil.Process(pid)
        quiet = [httpx.get(url + "/healthz").elapsed.total_seconds() * 1000 for _ in range(20)]
        cpu0, rss0 = proc.cpu_times(), proc.memory_info().rss / 2**20
        t0 = time.monotonic()
        got = attack(url, args.clients, args.duration)
        wall = time.monotonic() - t0
        cpu1, rss1 = proc.cpu_times(), proc.memory_info().rss / 2**20
        alive = httpx.get(url + "/healthz", timeout=10).status_code
    lat = got["latencies"]
    print(f"server pid {pid} on {url}: {args.clients} clients of each kind for {args.duration:g} s "
          f"(/healthz quiet: median {statistics.median(quiet):.1f} ms)")
    print(f"/healthz under attack: {len(lat)} probes, p50 {percentile(lat, .5):.1f} ms, "
          f"p99 {percentile(lat, .99):.1f} ms, max {max(lat):.1f} ms; afterwards {alive}")
    worst = 0.0
    for kind in KINDS:
        lives = got["lives"][kind]
        still = [age for k, age in got["open_ages"] if k == kind]
        worst = max([worst, *lives, *still])
        said = ", ".join(f"{n} x {a!r}" for (k, a), n in sorted(got["answers"].items()) if k == kind)
        print(f"  {kind:<6}: {len(lives)} connections closed by the server, lived median "
              f"{statistics.median(lives) if lives else float('nan'):.1f} s, max {max(lives, default=0):.1f} s; "
              f"{len(still)} open at the end (oldest {max(still, default=0):.1f} s); answers: {said}")
    print(f"server: RSS {rss0:.0f} -> {rss1:.0f} MB, CPU {(cpu1.user + cpu1.system - cpu0.user - cpu0.system):.1f} s "
          f"in {wall:.0f} s")
    ok = percentile(lat, .99) < 100 and worst <= 20 and alive == 200
    print(f"every connection closed within {worst:.1f} s; " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
