"""onnxruntime session options measured: graph optimisation level x intra-op threads, and the graph
with teaching-stage outputs vs without, for MiniLM at 128 and 512 tokens.

    .venv/bin/python bench/session_options.py [--repeats 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxruntime as ort  # noqa: E402

from bench.common import runtime, session_feeds, text_of_tokens  # noqa: E402

LEVELS = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    rt = runtime("minilm")
    encs = {n: rt.encode(text_of_tokens(rt, n)) for n in (128, 512)}

    def measure(sess, feed, outputs):
        for _ in range(2):
            sess.run(outputs, feed)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sess.run(outputs, feed)
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    print(f"{'graph':<8} | {'level':<9} | {'threads':>7} | {'128 tok ms':>10} | {'512 tok ms':>10}")
    print("-" * 58)
    for stages in (False, True):
        for level_name, level in LEVELS.items():
            for threads in (1, 2):
                if stages and (level_name != "all"):
                    continue
                so = ort.SessionOptions()
                so.graph_optimization_level, so.intra_op_num_threads, so.log_severity_level = level, threads, 3
                sess = ort.InferenceSession(str(rt.onnx_path(stages)), so, providers=["CPUExecutionProvider"])
                outs = ["hidden", "attentions"] + (["q", "k", "scores", "scaled", "masked"] if stages else [])
                ms = [measure(sess, session_feeds(rt, encs[n], sess), outs) for n in (128, 512)]
                print(f"{'stages' if stages else 'fast':<8} | {level_name:<9} | {threads:>7} | {ms[0]:10.2f} | "
                      f"{ms[1]:10.2f}")
    print("\nThe app uses the fast graph at level 'all' with one intra-op thread per core, given as a number "
          "(runtime/options.open_session).")


if __name__ == "__main__":
    main()
