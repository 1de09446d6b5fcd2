"""Head importance (every head's single-head ablation effect) on SmolLM2: batched along the batch axis versus
one forward pass per head, in one run.

    .venv/bin/python bench/importance.py [--model smollm2] [--tokens 64] [--batch 16]

Prints the time of each, the speed-up of batching, and the largest difference between the two (they must agree).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.common import runtime, text_of_tokens  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args(argv)

    from attnscope.runtime.interventions import head_importance

    rt = runtime(args.model)
    rt.session(False)
    text = text_of_tokens(rt, args.tokens)
    head_importance(rt, text, batch=args.batch)                  # warm-up: graph open, arena sized
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    t0 = time.perf_counter()
    batched, base = head_importance(rt, text, batch=args.batch)
    t_batched = time.perf_counter() - t0
    time.sleep(0.5)
    t0 = time.perf_counter()
    single, _ = head_importance(rt, text, batch=1)
    t_single = time.perf_counter() - t0
    print(f"{rt.spec.title}: {L * H} heads, {args.tokens} tokens, {L * H + 1} forward passes "
          f"(the first keeps every head); baseline mean token log-prob {base:.4f}")
    print(f"one run per head : {t_single:7.2f} s")
    print(f"batches of {args.batch:<5} : {t_batched:7.2f} s   speed-up {t_single / t_batched:.2f}x")
    print(f"largest |difference| between the two: {np.abs(batched - single).max():.2e}")
    top = np.dstack(np.unravel_index(np.argsort(batched, axis=None)[:5], batched.shape))[0]
    print("most important heads (largest drop in mean log-prob): " +
          ", ".join(f"L{l}H{h} {batched[l, h]:+.4f}" for l, h in top))


if __name__ == "__main__":
    main()
