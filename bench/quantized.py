"""GGUF models served from their blocks (issue 49): for each zoo GGUF model, in processes of their own, prints
  - the first load (a fresh cache: the file's blocks re-laid out for MatMulNBits and cached) and a warm load, seconds;
  - the cache's size on disk next to the GGUF file's and the float32 weights' (the cache holds no float32 copy);
  - the RSS after a warm load and after the first request, and the peak (VmHWM), next to the float32 weights;
  - the time of all heads' summaries at 128 tokens (median of 3 fresh texts) and its ratio to the FLOP bound:
    2 x parameters x 128 tokens at this machine's sgemm rate, measured in the same run (NumPy, 4096 x 4096 float32).

    python bench/quantized.py                      # smollm2 gemma3
    python bench/quantized.py --models smollm2

Not done here (issue 49, left open): the 8B Q4_K_M file of random blocks in Llama 3.1 8B's shape.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import sgemm_gflops  # noqa: E402

TOKENS = 128
CHILD = r"""
import json, sys, time, statistics
t0 = time.perf_counter()
from attnscope.python.local import load
from attnscope.model.weights import state_dict
from attnscope.model.quantized import Blocks
model_id, cache = sys.argv[1], sys.argv[2]
import attnscope.sources.gguf as gguf_source
gguf_source.F32_IN_MEMORY_BYTES = int(sys.argv[3])            # 0: served from the blocks, whatever the model's size
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
m = load(model_id, cache_dir=cache)
rt = m.runtime
load_s, rss_load = time.perf_counter() - t0, status('VmRSS:')
sd = state_dict(rt.model)
params = sum(int(w.size) for w in sd.values())
words = "the of river stone light green market seven quiet number table winter cloud paper music garden".split()
rng = __import__('random').Random(0)
times = []
for i in range(4):                                           # a fresh text each time (the result cache)
    text = " ".join(rng.choice(words) for _ in range(400))
    enc = rt.encode(text)
    text = text[:enc.offsets[""" + str(TOKENS) + r""" - 1][1]]
    n = len(rt.encode(text).ids)
    t = time.perf_counter()
    m.attention(text=text, include=["summary"])
    times.append(time.perf_counter() - t)
print(json.dumps(dict(load_s=load_s, rss_load=rss_load, rss_after=status('VmRSS:'), hwm=status('VmHWM:'),
                      params=params, tokens=n, summaries_s=statistics.median(times[1:]), first_s=times[0],
                      quantised=sum(isinstance(w, Blocks) for w in sd.values()), tensors=len(sd))))
"""


def child(model_id: str, cache: Path, in_memory: int = 0) -> dict:
    """One process: load, then summaries; in_memory: sources/gguf.F32_IN_MEMORY_BYTES there (0: the blocks)."""
    out = subprocess.run([sys.executable, "-c", CHILD, model_id, str(cache), str(in_memory)], capture_output=True,
                         text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{model_id}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    args = ap.parse_args()
    from attnscope.sources import zoo
    from attnscope.sources.gguf import F32_IN_MEMORY_BYTES

    gflops = sgemm_gflops(4096, 3)
    print(f"sgemm (NumPy, 4096^3 float32): {gflops:.0f} GFLOP/s")
    for model_id in args.models:
        gguf_file = zoo.smollm2_path() if model_id == "smollm2" else zoo.gemma3_path()
        with tempfile.TemporaryDirectory(prefix="attnscope-quantized-") as tmp:
            cold = child(model_id, Path(tmp))
            cached = sum(p.stat().st_size for p in Path(tmp).glob("*.safetensors"))
            warm = child(model_id, Path(tmp))
            dense = child(model_id, Path(tmp), F32_IN_MEMORY_BYTES)     # the default for a model this small
        f32 = 4 * warm["params"]
        bound = 2 * warm["params"] * warm["tokens"] / (gflops * 1e9)
        mb = lambda b: f"{b / 2**20:,.0f} MB"   # noqa: E731
        print(f"{model_id}: {warm['params'] / 1e6:.0f}M parameters, {warm['quantised']} of {warm['tensors']} tensors "
              f"in blocks; GGUF {mb(gguf_file.stat().st_size)}, cache {mb(cached)}, float32 weights {mb(f32)}")
        print(f"  load: first {cold['load_s']:.1f} s (blocks re-laid out and cached), warm {warm['load_s']:.1f} s")
        print(f"  RSS: after load {mb(warm['rss_load'])}, after requests {mb(warm['rss_after'])}, peak "
              f"{mb(warm['hwm'])} ({warm['hwm'] / f32:.2f}x the float32 weights)")
        print(f"  summaries of all heads, {warm['tokens']} tokens: {warm['summaries_s'] * 1e3:.0f} ms (first request "
              f"{warm['first_s'] * 1e3:.0f} ms); FLOP bound {bound * 1e3:.1f} ms: {bound / warm['summaries_s']:.0%} "
              f"of it")
        print(f"  the same de-quantised in memory at load (the default for float32 weights <= "
              f"{F32_IN_MEMORY_BYTES / 2**30:.0f} GiB): RSS after requests {mb(dense['rss_after'])}, summaries "
              f"{dense['summaries_s'] * 1e3:.0f} ms: {bound / dense['summaries_s']:.0%} of the FLOP bound; the blocks "
              f"take {warm['summaries_s'] / dense['summaries_s']:.2f}x as long")


if __name__ == "__main__":
    main()
