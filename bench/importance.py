"""Head importance (every head's single-head ablation effect) on SmolLM2 through the intervention mechanism (a trace,
then each head's edit run from its own layer, in batches) versus one full forward pass of the served graph per head
(its head mask knocking that head out), in one run.

    .venv/bin/python bench/importance.py [--model smollm2] [--tokens 64] [--batch 16]

Prints the time of each, the speed-up, and the largest difference between the two (they must agree); then the most
any exact method of this kind could reach: an edit at layer l must recompute layers >= l and, for the mean token
log-prob, the LM head at every position, so its FLOPs (bench/forward.py's count) bound the speed-up, at the plain
runs' own rate and at this machine's sgemm rate measured in the same run (the fastest the matmuls could go).
"""
from __future__ import annotations

import argparse
from dataclasses import replace
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.common import runtime, text_of_tokens  # noqa: E402
from bench.forward import forward_flops, sgemm_gflops  # noqa: E402


def edit_flops(cfg, T: int) -> float:
    """FLOPs of importance done the reusing way: one intact forward (the trace), then for every head an edit run
    of the layers from its own up, and the LM head over every position."""
    whole, no_blocks = forward_flops(cfg, T), forward_flops(replace(cfg, n_layers=0), T)
    block = (whole - no_blocks) / cfg.n_layers
    return whole + cfg.n_heads * sum((cfg.n_layers - layer) * block + no_blocks for layer in range(cfg.n_layers))


def per_head_forward(rt, enc) -> np.ndarray:
    """The plain way: one full forward pass of the served graph per head, that head knocked out. [L, H]"""
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    intact = rt.forward([enc], top_k=0)[0]
    out = np.empty((L, H))
    for layer in range(L):
        for head in range(H):
            keep = np.ones((1, L, H), np.float32)
            keep[0, layer, head] = 0
            r = rt.forward([enc], head_mask=keep, head_mean=np.zeros_like(keep), top_k=0)[0]
            out[layer, head] = np.mean(r.token_logprobs[1:]) - np.mean(intact.token_logprobs[1:])
    return out


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
    enc = rt.encode(text)
    head_importance(rt, enc, batch=args.batch)                   # warm-up: graphs open, arenas sized
    rt.forward([enc], top_k=0)
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    t0 = time.perf_counter()
    ours, base = head_importance(rt, enc, batch=args.batch)
    t_ours = time.perf_counter() - t0
    time.sleep(0.5)
    t0 = time.perf_counter()
    plain = per_head_forward(rt, enc)
    t_plain = time.perf_counter() - t0
    print(f"{rt.spec.title}: {L * H} heads, {len(enc.ids)} tokens; baseline mean token log-prob {base:.4f}")
    print(f"one forward pass per head (served graph, head mask) : {t_plain:7.2f} s")
    print(f"interventions (prefix reused, batches of {args.batch:<3})     : {t_ours:7.2f} s   "
          f"speed-up {t_plain / t_ours:.2f}x")
    print(f"largest |difference| between the two: {np.abs(ours - plain).max():.2e}")
    T, flops = len(enc.ids), forward_flops(rt.cfg, len(enc.ids))
    plain_flops, edits = L * H * flops, edit_flops(rt.cfg, T)
    rate = sgemm_gflops(rt.threads) * 1e9       # the same intra-op threads as the runs
    print(f"FLOPs: per-head forwards {plain_flops / 1e12:.2f} T, reusing {edits / 1e12:.2f} T; the most an exact "
          f"reusing method can gain: {plain_flops / edits:.2f}x at the plain runs' rate "
          f"({plain_flops / t_plain / 1e9:.0f} GFLOP/s), {t_plain / (edits / rate):.2f}x at this machine's sgemm rate "
          f"({rate / 1e9:.0f} GFLOP/s); ours ran at {edits / t_ours / 1e9:.0f} GFLOP/s")
    top = np.dstack(np.unravel_index(np.argsort(ours, axis=None)[:5], ours.shape))[0]
    print("most important heads (largest drop in mean log-prob): " +
          ", ".join(f"L{l}H{h} {ours[l, h]:+.4f}" for l, h in top))


if __name__ == "__main__":
    main()
