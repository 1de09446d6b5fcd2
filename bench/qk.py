"""QK attribution, the logit lens and the circuits against one forward pass, in one run: /api/qk, /api/lens and
/api/circuits answered by the app in process, and one forward pass of the served (stacked) graph, each on fresh
texts of the same token count (a text's trace is cached, so every timed answer is a new text), interleaved.

    .venv/bin/python bench/qk.py [--model smollm2] [--tokens 256] [--repeats 5]

Prints the medians and the ratios to the forward pass (issue 25: /api/qk at 256 tokens within 2x of one forward).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.common import CACHE, WORDS  # noqa: E402


def fresh_text(rt, n: int, rng: np.random.Generator) -> str:
    """A new text of random words, cut to at most n tokens (n, or one less where the next word takes two)."""
    words = list(rng.choice(WORDS, size=2 * n))
    lo, hi = 1, len(words)
    while lo < hi:                                   # the most words whose text is at most n tokens
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(rt.encode(" ".join(words[:mid])).ids) <= n else (lo, mid - 1)
    return " ".join(words[:lo])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    settings = Settings(models=[args.model], cache=CACHE, max_patching_tokens=max(256, args.tokens))
    rng = np.random.default_rng(0)
    with TestClient(create_app(settings)) as c:
        rt = c.app.state.service.runtimes[args.model]
        L, H = rt.cfg.n_layers, rt.cfg.n_heads

        def forward():
            rt.forward([rt.encode(fresh_text(rt, args.tokens, rng))])

        def post(path: str, body):
            def call():
                text = fresh_text(rt, args.tokens, rng)
                T = len(rt.encode(text).ids)
                r = c.post(path, json={"model": args.model, "text": text, **body(T)})
                assert r.status_code == 200, r.text
            return call

        kinds = {"forward pass (stacked graph)": forward,
                 "/api/qk, last layer": post("/api/qk", body=lambda T: {"layer": L - 1, "head": 0, "query": T - 1,
                                                                         "key": T // 2, "top": 20}),
                 "/api/qk, layer 2": post("/api/qk", body=lambda T: {"layer": 2, "head": 0, "query": T - 1, "key": 1}),
                 "/api/lens (+ one head)": post("/api/lens", body=lambda T: {"head_lens": [L - 1, 0]})}
        for fn in kinds.values():                    # warm-up: sessions open, arenas sized
            fn()
        times = {name: [] for name in kinds}
        for _ in range(args.repeats):                # interleaved: a noisy moment costs every kind alike
            for name, fn in kinds.items():
                time.sleep(0.2)
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert c.post("/api/circuits", json={"model": args.model}).status_code == 200
        t_circuits = time.perf_counter() - t0
        t0 = time.perf_counter()
        c.post("/api/circuits", json={"model": args.model})
        t_cached = time.perf_counter() - t0

    base = statistics.median(times["forward pass (stacked graph)"])
    print(f"{rt.spec.title}, {args.tokens} tokens (fresh texts), medians of {args.repeats}:")
    for name, values in times.items():
        m = statistics.median(values)
        print(f"  {name:30s} {m * 1000:8.1f} ms   {m / base:5.2f}x the forward pass")
    print(f"  /api/circuits ({L * H} heads)     {t_circuits * 1000:8.1f} ms first, {t_cached * 1000:.1f} ms cached")


if __name__ == "__main__":
    main()
