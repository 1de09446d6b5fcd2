"""The fast modes' error against float32 (issue 38), per model: the same runtime, the same texts, once with float32
matrix products and once with each fast mode (model/precision.py COMPUTE_DTYPES), compared as NDIF judges reduced
precision:

  attention   the largest |p_mode - p_float32| over every layer, head, query and key of each text
  top-1       the share of next-token predictions whose most probable token is the same (every prefix of each text:
              the next token after each of its tokens, from the served graph's own LM head, in the mode)
  TV          the total-variation distance 1/2 sum_v |p_mode(v) - p_float32(v)| of those next-token distributions:
              the mean and the largest
  forward     one forward of a --tokens-token text (the stacked graph, every layer's attention out), the mode's
              time over float32's (the median of 3 runs after a warm-up, both here, now)

    python bench/precision.py                                   # the CPU: float16, on minilm, smollm2, gemma3, l1b
    python bench/precision.py --models smollm2 --modes float16
    python bench/precision.py --cuda                            # a GPU (onnxruntime-gpu): float16, bfloat16, tf32

l1b is a random checkpoint of Llama 3.2 1B's shapes in bfloat16 (bench/checkpoints.py, written once into
--checkpoints: 2.5 GB). On the CPU only float16 runs (onnxruntime's CPU provider multiplies in float32 and has no
bfloat16 MatMul); `measure` is what bench/gpu.py prints for every mode on a GPU.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXTS = ("The cat sat on the mat because it was tired.",
         "When Mary and John went to the store, John gave a drink to",
         "The capital of France is Paris, and the capital of Italy is",
         "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)")


def _distribution(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def measure(base, fast, texts=TEXTS, predictions: int | None = None) -> dict:
    """The fast runtime against the float32 one (two Runtimes of one model) over `texts`: the largest attention
    difference, and for a model with an LM head the top-1 agreement and the total-variation distances of the
    next-token distributions after each token (the last `predictions` of each text; None: all)."""
    worst, agree, tvs = 0.0, [], []
    for text in texts:
        ids = base.encode(text).ids
        [a], [b] = base.forward([base.encode_ids(ids)]), fast.forward([fast.encode_ids(ids)])
        worst = max(worst, float(np.abs(a.attentions - b.attentions).max()))
        if a.next_token_logits is None:
            continue
        first = 1 if predictions is None else max(1, len(ids) - predictions + 1)
        for n in range(first, len(ids) + 1):
            if n == len(ids):
                la, lb = a.next_token_logits, b.next_token_logits
            else:
                [ra], [rb] = base.forward([base.encode_ids(ids[:n])]), fast.forward([fast.encode_ids(ids[:n])])
                la, lb = ra.next_token_logits, rb.next_token_logits
            agree.append(int(np.argmax(la)) == int(np.argmax(lb)))
            tvs.append(0.5 * float(np.abs(_distribution(la) - _distribution(lb)).sum()))
    out = {"attention": worst}
    if agree:
        out |= {"top1": float(np.mean(agree)), "predictions": len(agree), "tv_mean": float(np.mean(tvs)),
                "tv_max": float(np.max(tvs))}
    return out


def forward_ratio(base, fast, tokens: int) -> tuple[float, float]:
    """Seconds of one forward of a `tokens`-token text, the fast runtime's and float32's (medians of 3)."""
    from bench.common import text_of_tokens
    enc = base.encode(text_of_tokens(base, tokens))

    def median(rt) -> float:
        rt.forward([enc])
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            rt.forward([enc])
            times.append(time.perf_counter() - t0)
        return float(np.median(times))
    return median(fast), median(base)


def line(model: str, mode: str, m: dict) -> str:
    s = f"{model:<8} {mode:<9} attention {m['attention']:.2e}"
    if "top1" in m:
        s += (f"  top-1 {m['top1']:.3f} ({m['predictions']} predictions)  TV mean {m['tv_mean']:.2e} max "
              f"{m['tv_max']:.2e}")
    if "forward" in m:
        (fast, base), n = m["forward"], m["tokens"]
        s += f"  forward at {n} tokens {fast * 1e3:.0f} vs float32 {base * 1e3:.0f} ms ({fast / base:.2f}x)"
    return s


def runtimes(model: str, checkpoints: Path, providers):
    """The float32 runtime of `model` and a maker of its fast-mode ones (its weights shared)."""
    from attnscope.runtime import Runtime
    from attnscope.sources import zoo
    from attnscope.sources.resolve import resolve
    from bench.common import CACHE

    if model == "l1b":
        from bench.checkpoints import llama
        spec = resolve(f"l1b={llama(checkpoints / 'l1b-bfloat16', 'l1b', 'bfloat16')}")
    else:
        spec = zoo.get(model)
    base = Runtime(spec, providers, cache_dir=CACHE)
    return base, base.with_compute_dtype         # the fast ones share its weights


def main() -> None:
    from bench.common import CACHE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm,smollm2,gemma3,l1b")
    ap.add_argument("--modes", default=None, help="default: float16 on the CPU; float16,bfloat16,tf32 with --cuda")
    ap.add_argument("--cuda", action="store_true", help="the CUDA provider (onnxruntime-gpu)")
    ap.add_argument("--predictions", type=int, default=None, help="the next tokens after each text's last N tokens "
                    "(a run each; default: after every token)")
    ap.add_argument("--tokens", type=int, default=128, help="the timed text's length (0: no timing)")
    ap.add_argument("--checkpoints", type=Path, default=CACHE / "checkpoints",
                    help="where the random l1b checkpoint is (written once if missing)")
    args = ap.parse_args()
    import onnxruntime as ort
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if args.cuda else ["CPUExecutionProvider"]
    modes = (args.modes or ("float16,bfloat16,tf32" if args.cuda else "float16")).split(",")
    print(f"onnxruntime {ort.__version__}, {providers[0]}; texts: {len(TEXTS)}, the next-token predictions after "
          f"{'every token' if args.predictions is None else f'the last {args.predictions} tokens'} of each", flush=True)
    for model in args.models.split(","):
        base, make = runtimes(model, args.checkpoints, providers)
        for mode in modes:
            t0 = time.perf_counter()
            fast = make(mode)
            m = measure(base, fast, predictions=args.predictions)
            if args.tokens:
                m |= {"forward": forward_ratio(base, fast, args.tokens), "tokens": args.tokens}
            print(line(model, mode, m), f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
            del fast
            gc.collect()
        del base, make
        gc.collect()


if __name__ == "__main__":
    main()
