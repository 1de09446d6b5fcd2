"""Browser timings in headless chromium: submit -> first drawn heatmap (head view), and the full model
view (72 thumbnails), at 128 and 512 tokens; plus the bytes each view fetched.

    .venv/bin/python bench/browser.py [--repeats 3]

Starts its own uvicorn on 127.0.0.1 with the result cache off, so every submit runs the model.
"Drawn" is the page's own signal: the visible view has rendered the state in the URL and nothing
is loading (the same condition the browser tests wait on).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright  # noqa: E402

from bench.common import CHROMIUM_ARGS, DRAWN_JS, WIDEST_ENV, runtime, server, text_of_tokens  # noqa: E402

API_BYTES = """() => performance.getEntriesByType('resource').filter(e => e.name.includes('/api/'))
  .reduce((s, e) => s + e.transferSize, 0)"""


def timed(page, action, view: str) -> tuple[float, int]:
    page.evaluate("performance.clearResourceTimings()")
    t0 = time.perf_counter()
    action()
    page.wait_for_function(DRAWN_JS, arg=view, timeout=60_000)
    return time.perf_counter() - t0, page.evaluate(API_BYTES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rt = runtime("minilm")
    texts = {n: text_of_tokens(rt, n) for n in (128, 512)}
    rows = []
    with server({"ATTNSCOPE_CACHE_MB": "0", "ATTNSCOPE_MODELS": "minilm", **WIDEST_ENV}) as (url, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                    args=CHROMIUM_ARGS)
        for n, text in texts.items():
            head, model = [], []
            for rep in range(args.repeats):
                page = browser.new_page(viewport={"width": 1366, "height": 900})
                page.goto(f"{url}/?view=head&layer=2&head={rep}")
                page.wait_for_function(DRAWN_JS, arg="head", timeout=60_000)
                page.fill("#text", text)
                head.append(timed(page, lambda: page.get_by_role("button", name="Run").click(), "head"))
                model.append(timed(page, lambda: page.locator('#tabs a[data-view="model"]').click(), "model"))
                page.close()
            rows.append((n, "head view: submit -> heatmap", head))
            rows.append((n, "model view: click -> 72 thumbnails", model))
        browser.close()
    print(f"{'tokens':>6} | {'what':<36} | {'median s':>8} | {'max s':>6} | {'KB fetched':>10}")
    print("-" * 78)
    for n, what, runs in rows:
        secs = [s for s, _ in runs]
        print(f"{n:>6} | {what:<36} | {statistics.median(secs):8.2f} | {max(secs):6.2f} | {runs[0][1] / 1e3:10.0f}")


if __name__ == "__main__":
    main()
