"""API end-to-end time vs the in-process onnxruntime forward, and bytes on the wire per view.

    .venv/bin/python bench/api.py [--repeats 10]

A real uvicorn on 127.0.0.1 with the result cache off (ATTNSCOPE_CACHE_MB=0), so every request runs
the model. End-to-end = request sent to response parsed (json.loads or wire.from_binary).
The in-process forward is Runtime.run on the same text (tokenise + mask + onnxruntime), measured in
this process while the server is idle. Ratios below 1.5x / 2x are the targets of the speed issue.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import orjson  # noqa: E402

from attnscope.python.client import Client  # noqa: E402
from attnscope.app.wire import BINARY, from_binary  # noqa: E402
from bench.common import WIDEST_ENV, median_ms, runtime, server, text_of_tokens  # noqa: E402


# What each page view asks for (static/js): the head view one matrix, the model view thumbnails, ...
VIEWS = {
    "head (1 layer, 1 head, f32)": ({"layers": [3], "heads": [5], "include": ["attention", "entropy"]}, True),
    "line (1 layer, 4 heads, f16)": ({"layers": [3], "heads": [0, 1, 2, 3], "include": ["attention"],
                                      "dtype": "float16"}, True),
    "model (all, resolution 48, f16)": ({"resolution": 48, "include": ["attention"], "dtype": "float16"}, True),
    "summary (no matrices)": ({"include": ["summary"]}, False),
    "entropy (1 layer, all heads)": ({"layers": [3], "include": ["entropy"]}, False),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()

    rt = runtime("minilm")
    rt.session()
    texts = {n: text_of_tokens(rt, n) for n in (128, 512)}
    forward = {n: median_ms(lambda t=t: rt.run([t]), args.repeats) for n, t in texts.items()}

    cases = [(128, "1 layer", {"layers": [3]}, False), (128, "1 layer", {"layers": [3]}, True),
             (128, "all 6 layers", {}, False), (128, "all 6 layers", {}, True),
             (512, "1 layer", {"layers": [3]}, True), (512, "all 6 layers", {}, True),
             (512, "all 6, matrices only", {"include": ["attention"]}, True),
             (512, "all 6 layers f16", {"dtype": "float16"}, True)]
    with server({"ATTNSCOPE_CACHE_MB": "0", "ATTNSCOPE_MODELS": "minilm", **WIDEST_ENV}) as (url, _), \
            httpx.Client(base_url=url, timeout=120) as http:
        def call(body, binary):
            r = http.post("/api/attention", json=body, headers={"Accept": BINARY} if binary else {})
            r.raise_for_status()
            return (from_binary(r.content) if binary else orjson.loads(r.content)), r

        client = Client(url)

        print(f"in-process onnxruntime forward: 128 tokens {forward[128]:.1f} ms, 512 tokens {forward[512]:.1f} ms")
        print("e2e = request sent to response parsed (json.loads / from_binary), by httpx and by app.client (the\n"
              "project's stdlib client for the binary form). Ratios are over the in-process forward time.\n")
        print(f"{'tokens':>6} | {'what':<20} | {'form':<6} | {'MB':>6} | {'httpx ms':>8} | {'ratio':>6} | "
              f"{'app.client ms':>13} | {'ratio':>6}")
        print("-" * 90)
        for n, what, extra, binary in cases:
            body = {"text": texts[n], **extra}
            size = len(call(body, binary)[1].content) / 1e6
            ms = median_ms(lambda: call(body, binary), args.repeats)
            own = f"{median_ms(lambda: client.attention(**body), args.repeats):13.1f}" if binary else f"{'-':>13}"
            own_ratio = f"{float(own) / forward[n]:5.2f}x" if binary else f"{'-':>6}"
            print(f"{n:>6} | {what:<20} | {'binary' if binary else 'JSON':<6} | {size:6.2f} | {ms:8.1f} | "
                  f"{ms / forward[n]:5.2f}x | {own} | {own_ratio}")
        client.close()

        print("\nbytes on the wire per view, 512 tokens (gzip accepted, as a browser does):")
        for view, (extra, binary) in VIEWS.items():
            _, r = call({"text": texts[512], **extra}, binary)
            print(f"  {view:<34} {r.num_bytes_downloaded / 1e6:7.3f} MB")
        r = http.post("/api/stages", json={"text": texts[512], "layer": 3, "head": 5, "limit": 64})
        print(f"  {'stages (first 64 tokens, JSON)':<34} {r.num_bytes_downloaded / 1e6:7.3f} MB")


if __name__ == "__main__":
    main()
