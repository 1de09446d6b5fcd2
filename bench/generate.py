"""Greedy generation with SmolLM2 in one run: our key/value-cache step (graphs/decoding.py) against transformers'
generate with its cache (eager attention, the same threads), against recomputing the whole text every step (our
stacked graph), and against this machine's own limit for a step that reads every weight once: the weights' bytes
over the memory bandwidth a NumPy matrix-vector product of the same size reaches here.

    .venv/bin/python bench/generate.py [--tokens 64] [--threads 2]

Prints tokens/s for each, the ratios, and whether the three continuations are the same tokens.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.common import runtime  # noqa: E402

PROMPT = "The history of the printing press begins with"


def bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Bytes/s that a float32 matrix-vector product over `nbytes` of matrix reaches (the best of `repeats`)."""
    W = np.random.default_rng(0).random((nbytes // 4 // 1024, 1024), dtype=np.float32)
    x = np.ones(1024, np.float32)
    best = min(_timed(lambda: W @ x) for _ in range(repeats))
    return W.nbytes / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import torch
    import transformers

    from attnscope.runtime.generation import Generator, Sampling
    from attnscope.sources import zoo

    torch.set_num_threads(args.threads)
    rt = runtime("smollm2", threads=args.threads)
    ids, n = rt.encode(PROMPT).ids, args.tokens

    def ours() -> list[int]:
        gen = Generator(rt, ids, Sampling(greedy=True), n)
        for _ in gen:
            pass
        return gen.new_ids

    def recomputed() -> list[int]:
        seq = list(ids)
        for _ in range(n):
            seq.append(int(np.argmax(rt.forward([rt.encode_ids(seq)])[0].next_token_logits)))
        return seq[len(ids):]

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(zoo.smollm2_path().parent), gguf_file=zoo.SMOLLM2_FILE, attn_implementation="eager",
        dtype=torch.float32).eval()

    def theirs() -> list[int]:
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        return out[0, len(ids):].tolist()

    ours(), theirs()                                                      # warm-up: graphs open, arenas sized
    results = {}
    for name, fn in (("ours", ours), ("transformers", theirs), ("recomputed", recomputed)):
        time.sleep(0.5)                                                   # the previous runtime's threads settle
        t0 = time.perf_counter()
        results[name] = (fn(), time.perf_counter() - t0)
    weights = sum(a.nbytes for a in [rt.model.wte] + [p for b in rt.model.blocks for p in _arrays(b)])
    floor = weights / bandwidth(weights)
    rate = {k: n / t for k, (_, t) in results.items()}
    print(f"SmolLM2-135M, greedy, {len(ids)}-token prompt + {n} new tokens, {args.threads} threads "
          f"(prompt included in each time)")
    print(f"ours, key/value cache (graphs/decoding.py)   : {rate['ours']:7.1f} tokens/s")
    print(f"transformers generate, its cache, eager      : {rate['transformers']:7.1f} tokens/s   "
          f"ours {rate['ours'] / rate['transformers']:.2f}x")
    print(f"ours, the whole text recomputed every step   : {rate['recomputed']:7.1f} tokens/s   "
          f"ours {rate['ours'] / rate['recomputed']:.2f}x")
    print(f"this machine's limit: {weights / 2**20:.0f} MB of weights per step at {weights / floor / 1e9:.1f} GB/s "
          f"(a NumPy matrix-vector product of that size) = {1 / floor:.1f} tokens/s; ours reaches "
          f"{rate['ours'] * floor:.0%} of it")
    same = results["ours"][0] == results["transformers"][0] == results["recomputed"][0]
    print(f"the same {n} tokens from all three: {same}")


def _arrays(block) -> list[np.ndarray]:
    """A block's weight matrices and vectors (what a step reads)."""
    out = list(block.attn.params.values()) + [block.ln1.weight, block.ln2.weight]
    for layer in vars(block.mlp).values():
        if hasattr(layer, "weight"):
            out.append(layer.weight)
    return out


if __name__ == "__main__":
    main()
