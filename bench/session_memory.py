"""onnxruntime memory arena and thread spinning, measured on MiniLM: speed, memory kept, and the cost to the
thread that runs next to it (the server's event loop and serialisation).

    .venv/bin/python bench/session_memory.py [--repeats 10]

Each configuration runs in a fresh process (RSS is per process):
  arena      - enable_cpu_mem_arena on (onnxruntime's default) / off / on with shrinkage after every run
  spin       - session.intra_op.allow_spinning 1 (default) / 0 / run: 1 with session.force_spinning_stop 1 (what the
               app uses: the threads spin while a run is under way and stop when it ends)
Threads: one per core, as a number (runtime/options.open_session; onnxruntime's 0 would pin them to cores).
It prints the median forward time at 128 and 512 tokens, the time of a fixed Python task (orjson of
a 512 x 512 matrix, ~2-5 ms) started right after a 128-token run vs when nothing ran before it (threads
that keep spinning after a run steal the core it needs), and RSS: after start, after ten 512-token runs,
after two 512-token runs at once (what two concurrent requests leave), then after ten 128-token runs.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = [("on", "1"), ("on", "0"), ("on", "run"), ("off", "1"), ("off", "0"), ("shrink", "1"), ("shrink", "0"),
           ("shrink", "run")]


def rss_mb() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def child(arena: str, spin: str, repeats: int) -> dict:
    import threading

    import numpy as np
    import onnxruntime as ort
    import orjson

    from attnscope.app.main import _return_big_frees_to_the_os
    from attnscope.runtime.options import cores
    from bench.common import runtime, session_feeds, text_of_tokens

    _return_big_frees_to_the_os()   # as the server does
    rt = runtime("minilm")
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = arena != "off"
    so.intra_op_num_threads = cores()
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin == "run" else spin)
    so.add_session_config_entry("session.force_spinning_stop", "1" if spin == "run" else "0")
    sess = ort.InferenceSession(str(rt.onnx_path(False)), so, providers=["CPUExecutionProvider"])
    ro = ort.RunOptions()
    if arena == "shrink":
        ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    feeds = {}
    for n in (128, 512):
        feeds[n] = session_feeds(rt, rt.encode(text_of_tokens(rt, n)), sess)

    def run(n):
        return sess.run(["hidden", "attentions"], feeds[n], ro)

    out = {"rss_start": rss_mb()}
    matrix = np.random.default_rng(0).random((512, 512), dtype=np.float32)

    def task_ms():
        t0 = time.perf_counter()
        orjson.dumps(matrix, option=orjson.OPT_SERIALIZE_NUMPY)
        return (time.perf_counter() - t0) * 1000
    for n in (128, 512):
        for _ in range(2):
            run(n)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(n)
            times.append((time.perf_counter() - t0) * 1000)
        out[f"ms_{n}"] = statistics.median(times)
        if n == 512:
            out["rss_512"] = rss_mb()
    after, quiet = [], []
    for _ in range(repeats):
        run(128)
        after.append(task_ms())
        time.sleep(0.3)
        quiet.append(task_ms())
    out["task_after_run_ms"], out["task_quiet_ms"] = statistics.median(after), statistics.median(quiet)
    for _ in range(2):
        threads = [threading.Thread(target=run, args=(512,)) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    out["rss_two_at_once"] = rss_mb()
    for _ in range(10):
        run(128)
    time.sleep(0.5)
    out["rss_after_small"] = rss_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.repeats)))
        return
    print(f"{'arena':<7}{'spin':>5} | {'128 ms':>7} {'512 ms':>7} | {'task after run':>14} {'quiet':>6} | "
          f"{'RSS start':>9} {'10x512':>7} {'2 at once':>9} {'then 10x128':>11}")
    for arena, spin in CONFIGS:
        res = subprocess.run([sys.executable, __file__, "--child", arena, spin, "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"{arena:<7}{spin:>5} | {r['ms_128']:7.1f} {r['ms_512']:7.1f} | {r['task_after_run_ms']:11.2f} ms "
              f"{r['task_quiet_ms']:6.2f} | {r['rss_start']:7.0f} MB {r['rss_512']:7.0f} {r['rss_two_at_once']:9.0f} "
              f"{r['rss_after_small']:11.0f}", flush=True)


if __name__ == "__main__":
    main()
