"""The sessions a server opens at start, opened optimizing each graph against opened from its saved optimized form
(runtime/options.OptimizedGraphs), in one run, alternating, on the same graphs and weights.

    .venv/bin/python bench/optimized_graphs.py [--models minilm smollm2 gemma3] [--rounds 2]

For each model, Runtime.prepare() is run once (which saves every optimized form it lacks, in the benches' graph
cache) while every session it opens is recorded (graph and options); then each recorded session is opened again, in
turn: with optimized=None (onnxruntime optimizes the graph, as before the cache) and from the saved form. Printed:
seconds for all of a model's sessions each way, best of the rounds, their ratio, and whether every output of the
served graph is the same bit for bit both ways.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.common import runtime, session_feeds  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["minilm", "smollm2", "gemma3"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)

    from attnscope.runtime import options, sessions
    opened = []
    real = options.open_session

    def recording(graph, providers, threads, **kw):
        opened.append((graph, providers, threads, kw))
        return real(graph, providers, threads, **kw)
    sessions.open_session = recording
    print(f"{'model':<10}{'sessions':>9}{'optimizing':>12}{'saved form':>12}{'ratio':>7}   served graph's outputs")
    for model_id in args.models:
        opened.clear()
        rt = runtime(model_id, stop_early_mb=1024)
        rt.prepare()
        calls = list(opened)
        best = {"optimizing": float("inf"), "saved": float("inf")}
        for _ in range(args.rounds):
            for way in ("optimizing", "saved"):
                t0 = time.perf_counter()
                for graph, providers, threads, kw in calls:
                    real(graph, providers, threads, **(kw | {"optimized": None} if way == "optimizing" else kw))
                best[way] = min(best[way], time.perf_counter() - t0)
        graph, providers, threads, kw = next(c for c in calls if c[0] == rt.onnx_path())
        a = real(graph, providers, threads, **(kw | {"optimized": None}))
        b = real(graph, providers, threads, **kw)
        enc = rt.encode("The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun.")
        same = all(np.array_equal(x, y) for x, y in zip(a.run(None, session_feeds(rt, enc, a)),
                                                       b.run(None, session_feeds(rt, enc, b))))
        print(f"{model_id:<10}{len(calls):>9}{best['optimizing']:>11.2f}s{best['saved']:>11.2f}s"
              f"{best['saved'] / best['optimizing']:>6.2f}x   {'the same bits' if same else 'DIFFERENT'}")
    sessions.open_session = real


if __name__ == "__main__":
    main()
