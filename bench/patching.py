"""Activation patching of all of SmolLM2's heads at head_output on a ~20-token pair: the intervention mechanism (each
head's row starts at its own layer from the corrupt run's residual stream, rows in batches) versus one full forward
pass per head (the same edit, every row from the embeddings, one at a time), in one run.

    .venv/bin/python bench/patching.py [--model smollm2] [--batch 16]

Prints both times, the speed-up, and the largest difference between the two answers (the same numbers).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.common import runtime  # noqa: E402

CLEAN = "After the meeting, when Mary and John went to the store, John gave a drink to"
CORRUPT = "After the meeting, when Mary and John went to the store, Mary gave a drink to"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args(argv)

    from attnscope.analysis.effects import Metric
    from attnscope.runtime.patching import patch

    rt = runtime(args.model)
    clean, corrupt = rt.encode(CLEAN), rt.encode(CORRUPT)
    metric = Metric(rt.vocabulary.token_id("␣Mary"), rt.vocabulary.token_id("␣John"))
    patch(rt, clean, corrupt, metric, batch=args.batch)            # warm-up: graphs open, arenas sized
    t0 = time.perf_counter()
    ours = patch(rt, clean, corrupt, metric, batch=args.batch)
    t_ours = time.perf_counter() - t0
    time.sleep(0.5)
    t0 = time.perf_counter()
    plain = patch(rt, clean, corrupt, metric, reuse=False)
    t_plain = time.perf_counter() - t0
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    print(f"{rt.spec.title}: {L * H} heads patched at head_output, {len(clean.ids)} tokens; metric "
          f"{metric.name}: clean {ours.clean:.4f}, corrupt {ours.corrupt:.4f}")
    print(f"one full forward pass per head           : {t_plain:7.2f} s")
    print(f"prefix reused, batches of {args.batch:<3}            : {t_ours:7.2f} s   speed-up {t_plain / t_ours:.2f}x")
    print(f"largest |difference| between the two     : {np.abs(ours.patched - plain.patched).max():.2e}")
    top = np.argsort(-ours.recovery.ravel())[:5]
    print("top recovery: " + ", ".join(f"L{i // H}H{i % H} {ours.recovery.ravel()[i]:.3f}" for i in top))


if __name__ == "__main__":
    main()
