"""GGUF models served from their blocks (issue 49): for each zoo GGUF model, in processes of their own, prints
  - the first load (a fresh cache: the file's blocks re-laid out for MatMulNBits and cached) and a warm load, seconds;
  - the cache's size on disk next to the GGUF file's and the float32 weights' (the cache holds no float32 copy);
  - the RSS after a warm load and after the first request, and the peak (VmHWM), next to the float32 weights;
  - the time of all heads' summaries at 128 tokens (median of 3 fresh texts) and its ratio to the FLOP bound:
    2 x parameters x 128 tokens at this machine's sgemm rate, measured in the same run (NumPy, 4096 x 4096 float32);
  - greedy generation's time a token (32 tokens, after a first generation that opens the decoding session: its
    time is printed too) and the RSS after it;
and the same in a process that de-quantises every weight to float32 at load, with the blocks' ratios to it.

    python bench/quantized.py                      # smollm2 gemma3
    python bench/quantized.py --models smollm2
    python bench/quantized.py --l8b                # an 8B Q4_K_M file of random blocks (~11 GB on disk)
    python bench/quantized.py --l8b --warm --memory-mb 12000   # the same, warm, layer by layer (a smaller budget)

--l8b: a Q4_K_M GGUF of random blocks in Llama 3.1 8B's shape (bench/checkpoints.llama_gguf: Q4_K, and Q6_K where
llama.cpp's Q4_K_M puts it; 4.9 GB, written once under --folder, set-up time printed), served from its blocks by
the Python API in a process of its own: load (first: the blocks re-laid out and cached; then warm), the summaries of
all 1,024 heads at 128 tokens (median of 3 fresh texts) as a ratio to the FLOP bound (2 x the multiplied parameters,
the embedding lookup left out, x 128 tokens at the sgemm rate measured in the serving process before and after
each request: the median), the peak RSS (VmHWM).
And in another process its first two layers against transformers' Llama on gguf's de-quantisation of those layers
(float32; the embedding's rows of the text's tokens only): the largest attention and residual-stream differences.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import sgemm_gflops  # noqa: E402
from bench.checkpoints import llama_gguf  # noqa: E402

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
rss_after = status('VmRSS:')
from attnscope.runtime.generation import Generator, Sampling
ids = rt.encode("The history of the printing press begins with").ids
steps = []
for tokens in (1, 32):                                       # the first opens the decoding session
    t = time.perf_counter()
    for _ in Generator(rt, ids, Sampling(greedy=True), tokens):
        pass
    steps.append((time.perf_counter() - t) / tokens)
print(json.dumps(dict(load_s=load_s, rss_load=rss_load, rss_after=rss_after, hwm=status('VmHWM:'),
                      params=params, tokens=n, summaries_s=statistics.median(times[1:]), first_s=times[0],
                      quantised=sum(isinstance(w, Blocks) for w in sd.values()), tensors=len(sd),
                      first_generation_s=steps[0], token_s=steps[1], rss_generated=status('VmRSS:'))))
"""


def child(model_id: str, cache: Path, in_memory: int = 0) -> dict:
    """One process: load, then summaries; in_memory: sources/gguf.F32_IN_MEMORY_BYTES there (0: the blocks)."""
    out = subprocess.run([sys.executable, "-c", CHILD, model_id, str(cache), str(in_memory)], capture_output=True,
                         text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{model_id}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


L8B_SERVE = r"""
import json, sys, time, statistics
t0 = time.perf_counter()
path, cache, memory_mb = sys.argv[1], sys.argv[2], float(sys.argv[3])
from attnscope.app.settings import Settings
from attnscope.python.local import Model
from attnscope.model.weights import state_dict
from bench.checkpoints import text
from bench.common import sgemm_gflops
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
m = Model(settings=Settings(models=[f"l8b={path}"], default_model="l8b", cache=cache,
                            **({"memory_mb": memory_mb} if memory_mb else {})))
rt = m.runtime
load_s, rss_load, hwm_load = time.perf_counter() - t0, status('VmRSS:'), status('VmHWM:')
sd = state_dict(rt.model)
multiplied = sum(int(w.size) for name, w in sd.items() if name != "wte")
times, rates = [], [sgemm_gflops(4096, 3)]                 # the machine's rate next to each request (shared)
for i in range(4):                                           # a fresh text each time (the result cache)
    t = text(128 + 7 * i)[7 * i:]
    s = time.perf_counter()
    a = m.attention(text=t, include=["summary"])
    times.append(time.perf_counter() - s)
    rates.append(sgemm_gflops(4096, 3))
print(json.dumps(dict(load_s=load_s, rss_load=rss_load, hwm_load=hwm_load, hwm=status('VmHWM:'), multiplied=multiplied,
                      rates=rates,
                      tokens=len(rt.encode(t).ids), times=times, whole=rt.capabilities.stacked,
                      layouts=len(set(rt.layerwise().layouts)))))
"""
L8B_CHECK = r"""
import gc, json, sys
import numpy as np, torch
path, cache, shape = sys.argv[1], sys.argv[2], sys.argv[3]
from attnscope.runtime.layerwise import Layerwise, Want
from attnscope.runtime.runtime import Runtime
from attnscope.sources import resolve
from bench.checkpoints import SHAPES, dequantised_llama, text
torch.set_num_threads(2)
rt = Runtime(resolve(f"l8b={path}", cache=cache), cache_dir=cache)
enc = rt.encode(text(128))
H = rt.cfg.n_heads
lw = Layerwise(rt, graphs=rt.layerwise()).forward(enc, want=Want((0, 1), tuple(range(H)), attention=True))
ours = [lw.asked.attention[i].reshape(H, len(enc.ids), -1) for i in (0, 1)]
stream = np.array(lw.checkpoints[2].array[0])                   # x entering layer 2: after the first two
del lw, rt
gc.collect()
ids = sorted(set(enc.ids))
ref = dequantised_llama(path, dict(SHAPES[shape], rope_scaling=None), layers=2, ids=ids, dtype="float32")
kept = {}
ref.model.layers[1].register_forward_hook(lambda mod, args, out: kept.setdefault("x", out[0] if isinstance(out, tuple) else out))
with torch.no_grad():
    out = ref(torch.tensor([[ids.index(i) for i in enc.ids]]), output_attentions=True)
theirs = [out.attentions[i][0].numpy() for i in (0, 1)]
print(json.dumps(dict(attention=max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs)),
                      stream=float(np.abs(stream - kept["x"][0].numpy()).max()),
                      stream_scale=float(np.abs(stream).max()),
                      peaked=float(np.mean([a.max(-1).mean() for a in theirs])))))
"""


def run(script: str, *args) -> dict:
    """A child process (the bench's folder on its path): its last line's JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(Path(__file__).resolve().parents[1])]))
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                         timeout=7200, env=env)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def l8b(folder: Path, memory_mb: float, shape: str = "l8b", warm: bool = False) -> None:
    """The 8B Q4_K_M file: set-up, serving, speed against the FLOP bound, memory, and the first two layers against
    transformers (see the module's docstring). shape: another of bench/checkpoints.SHAPES ("tiny": a dry run); warm:
    the cached blocks kept, served warm only, no check."""
    path = folder / f"{shape}-q4_k_m.gguf"
    t0 = time.perf_counter()
    fresh = not path.is_file()
    folder.mkdir(parents=True, exist_ok=True)
    llama_gguf(path, shape)
    print(f"{shape} Q4_K_M GGUF: {path.stat().st_size / 2**30:.2f} GiB, "
          + (f"written in {time.perf_counter() - t0:.0f} s" if fresh else "already written"), flush=True)
    cache = folder / f"{shape}-q4_k_m-cache"
    for f in () if warm else cache.glob("*.safetensors"):
        f.unlink()
    for start in ("warm",) if warm else ("first", "warm"):
        r = run(L8B_SERVE, path, cache, memory_mb)
        gflops = statistics.median(r["rates"])        # sgemm before and after each request, in the serving process
        bound = 2 * r["multiplied"] * r["tokens"] / (gflops * 1e9)
        median = statistics.median(r["times"][1:])
        print(f"  sgemm (NumPy, 4096^3 float32) around the requests: "
              f"{', '.join(f'{g:.0f}' for g in r['rates'])} GFLOP/s, median {gflops:.0f}", flush=True)
        gb = lambda b: f"{b / 2**30:.2f} GiB = {b / 1e9:.2f} GB"   # noqa: E731 - both units: the issue's GB is 1e9
        print(f"  {start} load {r['load_s']:.0f} s (peak RSS {gb(r['hwm_load'])}, RSS {gb(r['rss_load'])}); run "
              f"{'whole' if r['whole'] else 'layer by layer'}, {r['layouts']} layer layouts; summaries of all heads, "
              f"{r['tokens']} tokens: {median:.1f} s (first {r['times'][0]:.1f} s; all "
              f"{', '.join(f'{t:.1f}' for t in r['times'])}); FLOP bound {bound:.1f} s "
              f"({r['multiplied'] / 1e9:.2f}e9 multiplied parameters): {bound / median:.0%} of it; peak RSS "
              f"{gb(r['hwm'])}", flush=True)
    size = sum(f.stat().st_size for f in cache.glob('*.safetensors'))
    print(f"  blocks cache {size / 2**30:.2f} GiB = {size / 1e9:.2f} GB", flush=True)
    if warm:
        return
    c = run(L8B_CHECK, path, cache, shape)
    print(f"  first two layers against transformers (float32, gguf's de-quantisation): attention {c['attention']:.1e} "
          f"(mean row max {c['peaked']:.2f}), stream after layer 1 {c['stream']:.1e} (|x| up to "
          f"{c['stream_scale']:.1f})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    ap.add_argument("--l8b", action="store_true", help="the 8B Q4_K_M file instead of the zoo's")
    ap.add_argument("--folder", type=Path, default=Path.home() / ".cache" / "attnscope-bench",
                    help="where the 8B file and its blocks are written (~11 GB)")
    ap.add_argument("--memory-mb", type=float, default=0, help="the 8B server's memory budget (0: the default)")
    ap.add_argument("--shape", default="l8b", help="with --l8b: another shape of bench/checkpoints.py (tiny: a dry run)")
    ap.add_argument("--warm", action="store_true", help="with --l8b: keep the cached blocks, serve warm only, no check")
    args = ap.parse_args()
    if args.l8b:
        return l8b(args.folder, args.memory_mb, args.shape, args.warm)
    from attnscope.sources import zoo

    gflops = sgemm_gflops(4096, 3)
    print(f"sgemm (NumPy, 4096^3 float32): {gflops:.0f} GFLOP/s")
    for model_id in args.models:
        gguf_file = zoo.smollm2_path() if model_id == "smollm2" else zoo.gemma3_path()
        with tempfile.TemporaryDirectory(prefix="attnscope-quantized-") as tmp:
            cold = child(model_id, Path(tmp))
            cached = sum(p.stat().st_size for p in Path(tmp).glob("*.safetensors"))
            warm = child(model_id, Path(tmp))
            dense = child(model_id, Path(tmp), 1 << 40)     # every weight de-quantised to float32 at load
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
        print(f"  greedy generation: {warm['token_s'] * 1e3:.1f} ms a token (32 tokens; the first generation, "
              f"which opens the decoding session, {warm['first_generation_s']:.2f} s), RSS after it "
              f"{mb(warm['rss_generated'])}")
        print(f"  the same de-quantised to float32 in memory at load: RSS after requests {mb(dense['rss_after'])}, "
              f"summaries {dense['summaries_s'] * 1e3:.0f} ms: {bound / dense['summaries_s']:.0%} of the FLOP bound; "
              f"the blocks take {warm['summaries_s'] / dense['summaries_s']:.2f}x as long; generation "
              f"{dense['token_s'] * 1e3:.1f} ms a token: the blocks take {warm['token_s'] / dense['token_s']:.2f}x as "
              f"long; RSS after it {mb(dense['rss_generated'])}")


if __name__ == "__main__":
    main()
