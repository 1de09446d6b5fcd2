"""A server's start (issue 39): how soon `attnscope serve` answers /healthz (it listens at once; the models load in
the background), when each model is ready, how many graphs it built while loading (every graph its features run:
none is built by a request), and the server's RSS once every model is loaded.

    .venv/bin/python bench/startup.py [--models smollm2,tiny-gpt] [--repeats 3] [--cold]

--cold: an empty graph cache each time (every graph exported; SmolLM2's weights de-quantised again: slow).
Prints one line per start, then the machine's float32 matrix product rate at that time (the times scale with it).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.common import CACHE, ROOT, free_port  # noqa: E402
from bench.first_requests import sgemm_gflops  # noqa: E402


def start(models: str, cache: str) -> str:
    port, ready = free_port(), {}
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as jobs:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSCOPE_")} | {
            "ATTNSCOPE_MODELS": models, "ATTNSCOPE_CACHE": cache, "ATTNSCOPE_JOBS_DIR": jobs}
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--log-level", "warning"], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        try:
            first = None
            while True:
                try:
                    h = httpx.get(url + "/healthz", timeout=1).json()
                except httpx.HTTPError:
                    if proc.poll() is not None:
                        return "the server exited"
                    time.sleep(0.01)
                    continue
                now = time.monotonic() - t0
                first = first if first is not None else now
                for model in h["models"]:
                    ready.setdefault(model, now)
                if h["status"] == "ok":
                    break
                time.sleep(0.05)
            rss = psutil.Process(proc.pid).memory_info().rss / 2**20
            each = ", ".join(f"{m} {s:.1f} s" for m, s in ready.items())
            return (f"/healthz after {first:.2f} s; ready: {each}; {h['graphs_built']} graphs built; "
                    f"RSS {rss:.0f} MB")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,tiny-gpt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    args = ap.parse_args(argv)
    for k in range(args.repeats):
        with tempfile.TemporaryDirectory() as cold:
            print(f"start {k + 1} ({'cold' if args.cold else 'warm'} cache, {args.models}): "
                  f"{start(args.models, cold if args.cold else str(CACHE))}", flush=True)
    print(f"this machine now: float32 matrix products at {sgemm_gflops():.0f} GFLOP/s (NumPy, 2048 x 2048)")


if __name__ == "__main__":
    main()
