"""Long inputs on SmolLM2: the price of looking (forward time against a plain graph) and the server's peak memory.

    .venv/bin/python bench/long_input.py                              # 2048 tokens: forward ratio, then the server
    .venv/bin/python bench/long_input.py --tokens 4096 --no-forward   # the server at 4096 tokens
    .venv/bin/python bench/long_input.py --no-server --repeats 5
    .venv/bin/python bench/long_input.py --no-server --repeats 5 --group-mb 256       # the heads in bigger groups

forward, at --tokens tokens, batch 1, the same onnxruntime threads, runs interleaved (min and median):
  plain      graphs.stacked.build_graph(attentions=False): the same model returning hidden states and LM outputs only,
             in one onnxruntime session with the served graph's options; what running SmolLM2 costs
  layerwise  Runtime.layerwise().forward asking what the model view asks: every layer's rows (entropy, max
             weight, the numbers behind the head summaries) and 64 x 64 thumbnails of all heads (runtime/layerwise.py)
  rows only  the same without thumbnails (what an entropy or summary view needs)
  ratio      layerwise / plain: the price of looking (issue 24 asks <= 1.3 at 2048 tokens)
The layer-by-layer runs compute each layer's heads in groups of at most --group-mb MB of attention (the app's
ATTNSCOPE_LAYERWISE_GROUP_MB, default runtime.options.GROUP_MB): compare the default with 256 to see what the
groups' size does.
It also prints how long the layer-by-layer graphs take to build and open (they are built in memory, per process).

server: a real uvicorn (bench.common.server) serving smollm2 alone, 2 threads; POST /api/attention, binary float16:
  thumbnails  every layer x head at resolution 64 (270 heads), with entropy and summaries
  one head    the full matrix of layer 15, head 0 (recomputed from the run's checkpoint)
and the server's peak RSS, VmHWM from /proc/PID/status (the issue asks <= 4 GiB), after start-up and after the
requests. The graph cache is warmed first, so start-up does not include exporting the stacked graph.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnscope.runtime.options import GROUP_MB  # noqa: E402
from bench.common import CACHE, runtime, server, session_feeds, text_of_tokens  # noqa: E402

GiB = 2**30


def vm_hwm(pid: int) -> int:
    """Peak resident set size of a process, in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/PID/status")


def plain_session(rt):
    """The model without attention outputs, opened as the served graph is (runtime.options.open_session)."""
    from attnscope.graphs.stacked import build_graph
    from attnscope.runtime.options import open_session

    proto = build_graph(rt.model, attentions=False)
    return open_session(proto.SerializeToString(), ["CPUExecutionProvider"], rt.threads)


def forward(args) -> None:

    from attnscope.runtime.layerwise import Want

    rt = runtime("smollm2", providers=["CPUExecutionProvider"], threads=args.threads)
    text = text_of_tokens(rt, args.tokens)
    enc = rt.encode(text)
    T = len(enc.ids)
    lw = rt.layerwise(group_mb=args.group_mb)
    t0 = time.perf_counter()
    lw.open()
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    plain = plain_session(rt)
    plain_built = time.perf_counter() - t0
    feeds = session_feeds(rt, enc, plain)
    runs = {"plain": lambda: plain.run(None, feeds),
            "layerwise": lambda: lw.forward(enc, want=Want(resolution=64)),
            "rows only": lambda: lw.forward(enc)}
    print(f"\nSmolLM2 forward at {T} tokens, batch 1, {args.threads} threads, {args.repeats} runs each after one "
          f"warm-up, interleaved; layer-by-layer graphs built and opened in {built:.2f} s "
          f"(the plain graph: {plain_built:.1f} s)", flush=True)
    times = {name: [] for name in runs}
    for name, fn in runs.items():
        fn()
    for _ in range(args.repeats):
        for name, fn in runs.items():
            time.sleep(0.3)   # let the other session's threads go quiet
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    base_min, base_med = min(times["plain"]), statistics.median(times["plain"])
    head = f"{'run':>10} | {'min s':>7} | {'median s':>8} | {'/plain (min)':>12} | {'/plain (median)':>15}"
    print(head + "\n" + "-" * len(head))
    for name, ts in times.items():
        print(f"{name:>10} | {min(ts):>7.2f} | {statistics.median(ts):>8.2f} | {min(ts) / base_min:>11.2f}x | "
              f"{statistics.median(ts) / base_med:>14.2f}x", flush=True)


def serve(args) -> None:
    import httpx
    import numpy as np

    from attnscope.app.wire import BINARY, from_binary

    rt = runtime("smollm2", providers=["CPUExecutionProvider"], threads=args.threads)
    rt.onnx_path()                            # warm the graph cache: start-up then only opens it
    text = text_of_tokens(rt, args.tokens)
    rt = None
    env = {"ATTNSCOPE_MODELS": "smollm2", "ATTNSCOPE_THREADS": str(args.threads), "ATTNSCOPE_CACHE": str(CACHE),
           "ATTNSCOPE_MAX_CHARS": str(max(20_000, len(text) + 1)), "ATTNSCOPE_MAX_INFLIGHT": "1"}
    t0 = time.perf_counter()
    with server(env, timeout=900) as (url, pid):
        started = time.perf_counter() - t0
        at_start = vm_hwm(pid)
        print(f"\nserver (smollm2 only, {args.threads} threads) up in {started:.1f} s; VmHWM after start-up "
              f"{at_start / GiB:.2f} GiB", flush=True)
        rows = []
        with httpx.Client(base_url=url, timeout=3600, headers={"Accept": BINARY}) as http:
            asks = [("thumbnails, 270 heads @64", {"resolution": 64}),
                    ("one head, full matrix", {"layers": [15], "heads": [0]})]
            for name, body in asks if not args.thumbnails_only else asks[:1]:
                t = time.perf_counter()
                r = http.post("/api/attention", json={"model": "smollm2", "text": text, "dtype": "float16", **body})
                seconds = time.perf_counter() - t
                if r.status_code != 200:
                    raise SystemExit(f"{name}: {r.status_code} {r.text[:300]}")
                ans = from_binary(r.content)
                shape = ans["attention"].shape
                rows.append((name, len(ans["tokens"]), shape, len(r.content), seconds, r.headers.get("x-cache"),
                             vm_hwm(pid)))
                assert np.isfinite(ans["attention"]).all()
        head = (f"{'request':>26} | {'tokens':>6} | {'attention shape':>20} | {'MB':>6} | {'s':>6} | {'cache':>5} | "
                f"{'VmHWM GiB':>9}")
        print(head + "\n" + "-" * len(head))
        for name, T, shape, size, seconds, cache, hwm in rows:
            print(f"{name:>26} | {T:>6} | {str(tuple(shape)):>20} | {size / 2**20:>6.1f} | {seconds:>6.1f} | "
                  f"{cache or '':>5} | {hwm / GiB:>9.2f}")
        peak = vm_hwm(pid)
        print(f"server peak RSS (VmHWM) {peak / GiB:.2f} GiB: {'within' if peak <= 4 * GiB else 'OVER'} 4 GiB",
              flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048, help="text length in SmolLM2 tokens; default 2048")
    ap.add_argument("--repeats", type=int, default=3, help="timed forward runs of each kind; default 3")
    ap.add_argument("--group-mb", type=float, default=GROUP_MB, help=f"heads are computed in groups of at most this many MB of attention (ATTNSCOPE_LAYERWISE_GROUP_MB; default {GROUP_MB})")
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))),
                    help="onnxruntime intra-op threads; default 2")
    ap.add_argument("--no-forward", dest="forward", action="store_false", help="skip the forward-time comparison")
    ap.add_argument("--no-server", dest="server", action="store_false", help="skip the server's memory")
    ap.add_argument("--thumbnails-only", action="store_true", help="server: ask the thumbnails only")
    args = ap.parse_args(argv)
    if args.forward:
        forward(args)
    if args.server:
        serve(args)


if __name__ == "__main__":
    main()
