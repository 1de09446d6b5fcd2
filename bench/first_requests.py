"""A fresh server's slow first requests (issue 37): how long `attnscope serve` takes to answer /healthz, then its
first /api/circuits on SmolLM2, a per-position /api/patching (the README's IOI pair: 30 layers x 9 heads x 14
positions = 3,780 rows), a per-(layer, head) one and an /api/attention sent while those run (it waits for a run slot
behind them). schemathesis' read timeout is 10 s: each of these should answer within it.

    .venv/bin/python bench/first_requests.py [--models smollm2,tiny-gpt] [--repeats 2]

Prints seconds to ready, then each request's status and seconds, for the first round (a fresh server) and a repeat
with new inputs (nothing cached but the per-model work), all on the same fresh server; then the machine's float32
matrix product rate at that time (on a shared machine the times scale with it).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench.common import server, sgemm_gflops  # noqa: E402

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
NAMES = [("Mary", "John"), ("Anna", "Peter"), ("Sarah", "David"), ("Emma", "James")]


def timed(url: str, path: str, body: dict, out: dict, key: str, delay: float = 0.0) -> None:
    time.sleep(delay)
    t0 = time.perf_counter()
    r = httpx.post(url + path, json=body, timeout=600)
    out[key] = (r.status_code, time.perf_counter() - t0, "" if r.status_code == 200 else r.text[:200])


def round_of(url: str, model: str, k: int) -> dict:
    """At once: a circuits request, a per-position patching, a per-(layer, head) patching 0.2 s later and an
    attention request 0.3 s later."""
    a, b = NAMES[k % len(NAMES)]
    clean, corrupt = (t.replace("Mary", a).replace("John", b) for t in (CLEAN, CORRUPT))
    out: dict = {}
    patching = {"model": model, "clean": clean, "corrupt": corrupt, "target": f"␣{a}", "distractor": f"␣{b}"}
    threads = [threading.Thread(target=timed, args=(url, "/api/circuits", {"model": model, "precision": 4 + k},
                                                    out, "circuits")),
               threading.Thread(target=timed, args=(url, "/api/patching", patching | {"per_position": True}, out,
                                                    "patching per position")),
               threading.Thread(target=timed, args=(url, "/api/patching", patching, out, "patching per head", 0.2)),
               threading.Thread(target=timed, args=(url, "/api/attention", {
                   "model": "tiny-gpt", "text": f"{a} and {b} went to the store ({k})"}, out, "attention behind them",
                   0.3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,tiny-gpt")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    model = args.models.split(",")[0]
    with tempfile.TemporaryDirectory() as jobs:
        t0 = time.perf_counter()
        with server({"ATTNSCOPE_MODELS": args.models, "ATTNSCOPE_DEFAULT_MODEL": model,
                     "ATTNSCOPE_JOBS_DIR": jobs}, timeout=600) as (url, _pid):
            print(f"server ready (/healthz 200) after {time.perf_counter() - t0:.1f} s, serving {args.models}")
            for k in range(args.repeats):
                out = round_of(url, model, k)
                print(f"round {k + 1} ({'a fresh server' if k == 0 else 'new inputs'}):")
                for name, (status, seconds, text) in out.items():
                    print(f"  {name:<24} {status}  {seconds:6.2f} s  {text}")
    print(f"this machine now: float32 matrix products at {sgemm_gflops():.0f} GFLOP/s (NumPy, 2048 x 2048)")


if __name__ == "__main__":
    main()
