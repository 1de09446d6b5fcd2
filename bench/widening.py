"""Patching every head of l1b (Llama 3.2 1B's shape, random weights: bench/checkpoints.py) on a 14-token pair, from
its bfloat16 folder and from its float32 copy, in one run (issue 49: bf16 <= 1.3x f32). A patching request's batches
read every layer again; from bf16 the blocks' weights are widened once per layer for the request
(runtime/tensors.Weights.widening), not at each run. --cast also times bf16 the old way (a Cast in every run).
--gguf: the zoo's SmolLM2 (GGUF Q4_1 blocks) instead, its blocks de-quantised once per weight for the request
(runtime/capabilities.Capabilities.widened) against the blocks' own products in every run (MatMulNBits).

    python bench/widening.py [--folder DIR] [--cast]
    python bench/widening.py --gguf [--rounds 2]

Each model runs in a process of its own (its RSS is its own); each patches twice, the second timed (the first opens
its graphs and sizes its arenas). The folders are written once (l1b: 2.5 GB bf16 + 4.9 GB f32).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.checkpoints import llama, text, widened  # noqa: E402
from bench.common import CACHE  # noqa: E402

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
from attnscope.analysis.effects import Metric
from attnscope.runtime import interventions
from attnscope.runtime.patching import patch
from attnscope.runtime.runtime import Runtime
from attnscope.sources import resolve
model, cache, cast, texts = sys.argv[1], sys.argv[2], sys.argv[3] == "1", json.loads(sys.argv[5])
if cast:                                   # the old way: the Cast (or the blocks' products) in each run
    init = interventions.Interventions.__init__
    def narrow(self, *a, **k):
        init(self, *a, **k)
        self.wide = ""
    interventions.Interventions.__init__ = narrow
rt = Runtime(resolve(model, cache=cache), cache_dir=cache)
clean, corrupt = (rt.encode(t) for t in texts)
at = next(i for i, (a, b) in enumerate(zip(clean.ids, corrupt.ids)) if a != b)   # where the texts differ
metric = Metric(clean.ids[at], corrupt.ids[at])
times, cpu = [], []
for _ in range(2):
    t0, c0 = time.perf_counter(), time.process_time()
    r = patch(rt, clean, corrupt, metric)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
hwm = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]
print(json.dumps(dict(tokens=len(clean.ids), rows=int(r.patched.size), first=times[0], second=times[1], hwm=hwm,
                      cpu=cpu[1],
                      storage=rt.capabilities.precision.storage, patched=r.patched.ravel()[:8].tolist())))
"""


def child(model: str, cast: bool, texts: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(CACHE), "1" if cast else "0",
                          str(Path(__file__).resolve().parents[1]), json.dumps(texts)], capture_output=True, text=True,
                         timeout=3600)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=CACHE / "checkpoints")
    ap.add_argument("--cast", action="store_true", help="also time bf16 with a Cast in every run (the old way)")
    ap.add_argument("--gguf", action="store_true", help="SmolLM2's GGUF blocks: de-quantised once against MatMulNBits "
                    "in every run")
    ap.add_argument("--rounds", type=int, default=1, help="f32 then bf16 (then the Cast) this many times, alternated "
                    "(a shared machine's load changes between them)")
    args = ap.parse_args()
    if args.gguf:
        name, kinds = "smollm2", {"blocks in every run": ("smollm2", True), "de-quantised once": ("smollm2", False)}
        texts = [f"When Mary and John went to the store, {who} gave a drink to" for who in ("John", "Mary")]
    else:
        bf16 = llama(args.folder / "l1b-bf16", "l1b", "bfloat16")
        f32 = widened(bf16, args.folder / "l1b-f32")
        name, kinds = "l1b", {"f32": (f"m={f32}", False), "bf16": (f"m={bf16}", False)} | (
            {"bf16, Cast each run": (f"m={bf16}", True)} if args.cast else {})
        t = text(13)                                       # 14 tokens of l1b's byte tokenizer
        texts = [t, t[:-1] + ("a" if t[-1] != "a" else "b")]
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind, (model, cast) in kinds.items():
            r = child(model, cast, texts)
            runs[kind].append(r)
            print(f"{name} {kind} ({r['storage']}): patching {r['rows']} heads on a {r['tokens']}-token pair: "
                  f"{r['second']:.1f} s wall, {r['cpu']:.1f} s CPU (first request {r['first']:.1f} s), peak RSS "
                  f"{r['hwm'] / 2**30:.1f} GiB", flush=True)
    first, *others = kinds
    diff = max(abs(a - b) for a, b in zip(runs[first][0]["patched"], runs[others[0]][0]["patched"]))
    print(f"largest difference of the first 8 patched metrics, {others[0]} vs {first}: {diff:.2e}")
    best = {kind: (min(r["second"] for r in rs), min(r["cpu"] for r in rs)) for kind, rs in runs.items()}
    for kind in others:
        print(f"{kind} / {first}, best of {args.rounds}: {best[kind][0] / best[first][0]:.2f}x wall, "
              f"{best[kind][1] / best[first][1]:.2f}x CPU" + ("" if args.gguf else " (target <= 1.3x)"))


if __name__ == "__main__":
    main()
