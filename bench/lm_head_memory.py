"""Peak memory of SmolLM2's LM head outputs (next-token logits, every token's log-probability) at long inputs.

    .venv/bin/python bench/lm_head_memory.py                  # 1024 and 4096 tokens
    .venv/bin/python bench/lm_head_memory.py --tokens 4096

The LM head part of the served graph (graphs/steps.py, lm_outputs) is built on its own, with the final
hidden states as an input, and run in a fresh process per variant; the peak resident memory a run adds
over the opened session (sampled every millisecond; no memory arena) is reported for
  chunked   the graph as served: log-sum-exp over model.transformer.VOCAB_CHUNK (4096) vocabulary rows
            at a time, the target logit as one dot product per token, so no [T, V] array exists;
  one pass  the same graph with the whole vocabulary in one chunk: [T, V] logits and their exp
            (each T x 49152 x 4 bytes).
Not part of the tests.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(tokens: int, chunk: int) -> dict:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import attnscope.graphs.builder as B
    import attnscope.graphs.steps as E
    import attnscope.model.transformer as T
    from attnscope.sources import zoo
    from attnscope.sources.gguf import load_gguf
    from bench.common import CACHE

    m = load_gguf(zoo.smollm2_path(), cache=CACHE)
    T.VOCAB_CHUNK = E.VOCAB_CHUNK = chunk
    g = B.Graph()
    g.op("Identity", "hidden_in", out="hidden")
    E.lm_outputs(g, m, g.param(m.wte, "wte"))              # a graph input, fed at the run (graphs hold no weights)
    inputs = [helper.make_tensor_value_info("hidden_in", TensorProto.FLOAT, ["batch", "tokens", m.cfg.d_model]),
              helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
              helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in T.LM_OUTPUTS]
    proto = helper.make_model(helper.make_graph(g.nodes, "lm_head", inputs + g.inputs, outputs, g.inits),
                              opset_imports=[helper.make_opsetid("", B.OPSET)])
    proto.ir_version = B.IR_VERSION
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    so.enable_cpu_mem_arena = False   # an arena would hold on to memory from start-up and hide the run's own
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"hidden_in": rng.standard_normal((1, tokens, m.cfg.d_model)).astype(np.float32),
             "input_ids": rng.integers(0, m.cfg.vocab_size, (1, tokens)), "lengths": np.array([tokens]),
             **g.feeds}                                       # the weight: the model's own array, not a copy
    del m, proto
    ctypes.CDLL("libc.so.6").malloc_trim(0)   # hand freed start-up memory back, so that reuse cannot hide a peak
    sess.run(None, feeds | {"hidden_in": feeds["hidden_in"][:, :8], "input_ids": feeds["input_ids"][:, :8],
                            "lengths": np.array([8])})                                       # warm
    before, peak = _rss(), [0]
    done = threading.Event()

    def watch():                      # the resident set, sampled every millisecond during the run
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    sess.run(None, feeds)
    done.set()
    watcher.join()
    return {"added_mb": (peak[0] - before) / 2**20}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return
    import model.transformer as T

    V = 49152
    print("SmolLM2 LM head, batch 1, onnxruntime 2 threads: peak memory a run adds (fresh process each)")
    head = f"{'tokens':>6} | {'[T, V] float32 MB':>17} | {'chunked MB':>10} | {'one pass MB':>11} | {'one pass/chunked':>16}"
    print(head + "\n" + "-" * len(head))
    for n in args.tokens:
        got = {}
        for name, chunk in (("chunked", T.VOCAB_CHUNK), ("one pass", V)):
            out = subprocess.run([sys.executable, __file__, "--child", str(n), str(chunk)], capture_output=True,
                                 text=True, check=True).stdout
            got[name] = json.loads(out.strip().splitlines()[-1])["added_mb"]
        print(f"{n:>6} | {n * V * 4 / 2**20:>17.0f} | {got['chunked']:>10.0f} | {got['one pass']:>11.0f} | "
              f"{got['one pass'] / max(got['chunked'], 1):>15.1f}x")


if __name__ == "__main__":
    main()
