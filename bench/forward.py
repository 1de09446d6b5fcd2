"""Forward-pass times: our onnxruntime path vs transformers (eager), for MiniLM and SmolLM2.

    .venv/bin/python bench/forward.py                 # MiniLM at 32/128/512, SmolLM2 at 128/512 tokens
    .venv/bin/python bench/forward.py --models smollm2 --repeats 5
    .venv/bin/python bench/forward.py --repeats 30 --threads 4

For each length, one text that tokenises to exactly that many tokens is run through
  onnx          model.runtime.Runtime.run(engine="onnx"): the fast graph (no teaching stages),
                end to end (tokenising, mask, session, trimming; for SmolLM2 also the top-10 next
                tokens and every token's log-probability);
  numpy         the same Runtime.run(engine="numpy"), the NumPy reference (MiniLM only);
  transformers  BertModel / LlamaForCausalLM (attn_implementation="eager", float32, SmolLM2 read from the
                same GGUF) forward on the same ids, output_attentions=True (Llama: logits for every
                position, as our graph computes log-probs for every position), under
                torch.inference_mode with torch.set_num_threads equal to onnxruntime's threads
                (the model call only, so the ratios are, if anything, kind to transformers).
Times are the median after warm-up, onnx and transformers timed in turns (so that both see the same
machine load); ratios > 1 mean onnxruntime is faster. For SmolLM2 the table
also counts the FLOPs of the served graph (every matmul, the full T x T attention and the LM head over
all positions) and sets onnxruntime's rate against this machine's own sgemm rate, measured in the same run with the
same threads: onnxruntime's MatMul of two 4096 x 4096 float32 matrices in a session with the served graph's options
(the best of 5). Not part of the tests.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_ms, runtime, text_of_tokens, wait_until_idle  # noqa: E402

LENGTHS = {"minilm": [32, 128, 512], "smollm2": [128, 512]}


def forward_flops(cfg, T: int) -> float:
    """Multiply-adds x 2 of one forward of the served graph at T tokens (Llama-family config)."""
    D, H, Hkv, dh, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff, cfg.vocab_size
    projections = 2 * T * D * (2 * H * dh + 2 * Hkv * dh)          # q, o and k, v
    attention = 2 * 2 * H * T * T * dh                              # q k^T and p v, the full T x T
    mlp = 3 * 2 * T * D * F                                         # gate, up, down
    lm_head = 2 * T * D * V + 2 * D * V                              # log-sum-exp rows, next-token logits
    return cfg.n_layers * (projections + attention + mlp) + lm_head


def sgemm_gflops(threads: int, n: int = 4096, repeats: int = 5) -> float:
    """GFLOP/s of onnxruntime's MatMul of two n x n float32 matrices, in a session opened as the served graph's
    (runtime/options.open_session) with `threads` intra-op threads: the best of `repeats`."""
    import numpy as np
    from onnx import TensorProto, helper

    from attnscope.graphs.builder import IR_VERSION, OPSET
    from attnscope.runtime.options import open_session

    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "sgemm",
                              [helper.make_tensor_value_info(x, f, [n, n]) for x in "ab"],
                              [helper.make_tensor_value_info("c", f, [n, n])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = IR_VERSION
    sess = open_session(proto.SerializeToString(), ["CPUExecutionProvider"], threads)
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((n, n), dtype=np.float32) for x in "ab"}
    sess.run(None, feeds)
    best = min(_seconds(lambda: sess.run(None, feeds)) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(a, b, repeats: int, warmup: int, stat=statistics.median, quiet: float = 0) -> tuple[float, float]:
    """Seconds of a() and of b() (median, or stat), timed in turns (a, pause, b, pause, ...): on a shared
    machine both see the same load. The pauses let onnxruntime's spinning threads go quiet before torch.
    quiet > 0: before each timed call, wait up to that many seconds for no other process to be running."""
    times = ([], [])
    for i in range(warmup + repeats):
        for fn, got in zip((a, b), times):
            if quiet and i >= warmup:
                wait_until_idle(quiet)
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                got.append(time.perf_counter() - t0)
            time.sleep(0.2)
    return stat(times[0]), stat(times[1])


def load_transformers(model_id: str, zoo):
    import torch
    import transformers

    if model_id == "minilm":
        return transformers.BertModel.from_pretrained(str(zoo.minilm_dir()), attn_implementation="eager").eval()
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(zoo.smollm2_path().parent), gguf_file=zoo.SMOLLM2_FILE, attn_implementation="eager",
        dtype=torch.float32).eval()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per cell (median reported); default 10")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs first; default 2")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="onnxruntime intra-op threads, and torch's; default: the CPUs available")
    ap.add_argument("--models", nargs="+", default=list(LENGTHS), choices=list(LENGTHS))
    ap.add_argument("--lengths", type=int, nargs="+", help="token counts (default: 32 128 512 MiniLM, 128 512 SmolLM2)")
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="onnx and transformers: median (default) or, on a busy shared machine, the fastest run")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="on a shared machine: before each timed call wait up to S seconds for other processes "
                         "to stop running")
    args = ap.parse_args(argv)

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)

    from attnscope.sources import zoo

    for model_id in args.models:
        rt = runtime(model_id, providers=["CPUExecutionProvider"], threads=args.threads)
        rt.session(False)  # export (first time only) and open the fast graph before timing
        hf = load_transformers(model_id, zoo)
        decoder = rt.cfg.lm_head
        print(f"\n{rt.spec.title} forward, batch 1, {args.stat} of {args.repeats} after {args.warmup} warm-up; "
              f"{args.threads} threads (onnxruntime intra-op = torch); onnxruntime on "
              f"{rt.session(False).get_providers()[0]}", flush=True)
        rows = []
        for n in args.lengths or LENGTHS[model_id]:
            text = text_of_tokens(rt, n)
            enc = rt.encode(text)
            ids = torch.tensor([enc.ids])
            kw = {} if decoder else {"token_type_ids": torch.tensor([enc.type_ids]), "attention_mask": torch.ones_like(ids)}

            def hf_forward():
                with torch.inference_mode():
                    hf(input_ids=ids, output_attentions=True, **kw)

            t_numpy = None if decoder else median_ms(lambda: rt.run(text, engine="numpy"), args.repeats, args.warmup) / 1e3
            t_onnx, t_hf = interleaved(lambda: rt.run(text, engine="onnx"), hf_forward, args.repeats, args.warmup,
                                       min if args.stat == "min" else statistics.median, args.wait_quiet)
            rows.append((n, t_onnx, t_numpy, t_hf))

        if decoder:
            sgemm = sgemm_gflops(args.threads)
            print(f"this machine's sgemm: {sgemm:.0f} GFLOP/s (onnxruntime MatMul, 4096^3 float32, {args.threads} "
                  f"threads, best of 5, measured now)")
            head = (f"{'tokens':>6} | {'onnx ms':>9} | {'transformers ms':>15} | {'transformers/onnx':>17} | "
                    f"{'GFLOP':>7} | {'onnx GFLOP/s':>12} | {'of sgemm':>8}")
            print(head + "\n" + "-" * len(head))
            for n, t_onnx, _, t_hf in rows:
                gflop = forward_flops(rt.cfg, n) / 1e9
                rate = gflop / t_onnx
                print(f"{n:>6} | {t_onnx * 1e3:>9.1f} | {t_hf * 1e3:>15.1f} | {t_hf / t_onnx:>16.2f}x | {gflop:>7.1f} | "
                      f"{rate:>12.0f} | {rate / sgemm:>7.0%}")
        else:
            head = (f"{'tokens':>6} | {'onnx ms':>9} | {'numpy ms':>9} | {'transformers ms':>15} | "
                    f"{'transformers/onnx':>17} | {'numpy/onnx':>10}")
            print(head + "\n" + "-" * len(head))
            for n, t_onnx, t_numpy, t_hf in rows:
                print(f"{n:>6} | {t_onnx * 1e3:>9.2f} | {t_numpy * 1e3:>9.2f} | {t_hf * 1e3:>15.2f} | "
                      f"{t_hf / t_onnx:>16.2f}x | {t_numpy / t_onnx:>9.2f}x")
        rt = hf = None  # free the models before the next one loads


if __name__ == "__main__":
    main()
