"""What a change saves of an API answer, measured paired: two servers answer in turns, one on the working tree and one
on a base revision (a git worktree of it), each round the same fresh text to both, in alternating order, so a shared
VM's slow spells move both (its speed moves between runs of bench/answer.py more than most changes save).

    .venv/bin/python bench/ab.py --base HEAD~1 [--model minilm] [--tokens 128] [--layer -1] [--rounds 120]

Printed: each server's median answer, the median of each round's difference (working tree minus base) and of its
ratio, with their quartiles, and each server's own timing_ms (the run, and parsing to encoding). The client is the
working tree's attnscope.Client for both (a change to the client is measured by bench/answer.py against the raw
forward). The base's graphs are built into the same cache on its first start if its exporter differs.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnscope.python.client import Client  # noqa: E402
from bench.answer import fresh_text  # noqa: E402
from bench.common import ROOT, quartiles, runtime, server  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare with (git rev-parse's)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layer", type=int, default=-1, help="the layer asked (-1: the last)")
    ap.add_argument("--rounds", type=int, default=120)
    args = ap.parse_args(argv)

    rev = subprocess.run(["git", "rev-parse", "--verify", args.base], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    rt = runtime(args.model)
    layer = args.layer % rt.cfg.n_layers
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "attnscope"          # the package is the repository's root: importable by that name
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=ROOT, check=True)
        try:
            env = {"ATTNSCOPE_MODELS": args.model}
            with server(env | {"PYTHONPATH": tmp}) as (base_url, _), server(env) as (url, _):
                apis = {"base": Client(base_url), "tree": Client(url)}
                times = {name: [] for name in apis}
                inside = {name: [] for name in apis}
                for i in range(args.rounds + 5):
                    text = fresh_text(rt, args.tokens, 10**6 + i)
                    for name in (("base", "tree") if i % 2 else ("tree", "base")):
                        time.sleep(0.05)
                        t0 = time.perf_counter()
                        got = apis[name].attention(text, model=args.model, layers=[layer])
                        elapsed = time.perf_counter() - t0
                        if i >= 5:                              # the first rounds warm both servers up
                            times[name].append(elapsed * 1000)
                            inside[name].append((got["timing_ms"]["model"], got["timing_ms"]["total"]))
                for api in apis.values():
                    api.close()
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    diff = [t - b for t, b in zip(times["tree"], times["base"])]
    ratio = [t / b for t, b in zip(times["tree"], times["base"])]
    print(f"{rt.spec.title}, ~{args.tokens} tokens, layer {layer}, {args.rounds} rounds; base {args.base} ({rev[:10]}) "
          f"against the working tree")
    for name in times:
        run, total = (statistics.median(v) for v in zip(*inside[name]))
        print(f"  {name:>4}: answer {statistics.median(times[name]):6.2f} ms (the server's run {run:.2f} ms of "
              f"{total:.2f} ms from parsing to encoding)")
    (d1, d, d3), (r1, r, r3) = quartiles(diff), quartiles(ratio)
    print(f"  each round, tree - base: {d:+.2f} ms (quartiles {d1:+.2f} to {d3:+.2f}); tree / base: {r:.3f}x "
          f"({r1:.3f}-{r3:.3f}x)")


if __name__ == "__main__":
    main()
