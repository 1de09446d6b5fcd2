"""Browser timings in headless chromium: the first picture of a page load after a warm start (the HTML received ->
the first view drawn, in a fresh browser context each time: no cached scripts; goal <= 1.5 s), then submit -> first
drawn heatmap (head view), and the full model view (72 thumbnails), at 128 and 512 tokens; plus the bytes each view
fetched.

    .venv/bin/python bench/browser.py [--repeats 3] [--first-only] [--url http://127.0.0.1:8000]

--url measures the first picture of a server already running (e.g. another version of the page), and nothing else.

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


# When the page drew its first picture (ms after the navigation started), recorded by the page's own "drawn" signal.
FIRST_PICTURE_JS = """() => new Promise((resolve) => {
  const drawn = () => { const v = document.querySelector('.view:not([hidden])');
    return !!v && v.dataset.state === location.search && Number(v.dataset.renders) > 0
      && document.getElementById('view-area').getAttribute('aria-busy') === 'false'; };
  const done = () => { const nav = performance.getEntriesByType('navigation')[0];
    const scripts = performance.getEntriesByType('resource').filter((e) => e.initiatorType === 'script'
      || e.initiatorType === 'link' || e.name.endsWith('.js'));
    resolve({ html: nav.responseEnd, drawn: performance.now(), scripts: scripts.length,
              scripts_done: Math.max(0, ...scripts.map((e) => e.responseEnd)) }); };
  if (drawn()) return done();
  new MutationObserver((_, obs) => { if (drawn()) { obs.disconnect(); done(); } })
    .observe(document.body, { attributes: true, subtree: true, attributeFilter: ['data-state', 'aria-busy'] });
})"""


def first_picture(browser, url: str, repeats: int) -> list[dict]:
    """Page loads of `url` in fresh contexts (nothing cached in the browser), after one load that warms the server
    (its result cache): per load the HTML's arrival, the scripts' last byte and the first picture, in ms."""
    out = []
    for rep in range(repeats + 1):
        ctx = browser.new_context(viewport={"width": 1280, "height": 720})
        page = ctx.new_page()
        page.goto(url + "/", wait_until="commit")
        t = page.evaluate(FIRST_PICTURE_JS)
        if rep:
            out.append(t)
        ctx.close()
    return out


def report_first(runs: list[dict], label: str) -> None:
    after = [r["drawn"] - r["html"] for r in runs]
    scripts = [r["scripts_done"] - r["html"] for r in runs]
    print(f"first picture ({label}): median {statistics.median(after) / 1000:.2f} s after the HTML "
          f"(max {max(after) / 1000:.2f} s; scripts in by {statistics.median(scripts) / 1000:.2f} s, "
          f"{runs[0]['scripts']} script requests) over {len(runs)} fresh loads; goal <= 1.5 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-only", action="store_true", help="only the first picture of a page load")
    ap.add_argument("--url", help="measure the first picture of this running server only")
    args = ap.parse_args()
    launch = {"executable_path": os.environ.get("CHROMIUM", "/usr/bin/chromium"), "args": CHROMIUM_ARGS}
    if args.url:
        with sync_playwright() as p:
            browser = p.chromium.launch(**launch)
            report_first(first_picture(browser, args.url.rstrip("/"), max(args.repeats, 5)), args.url)
            browser.close()
        return
    with server({"ATTNSCOPE_MODELS": "minilm"}) as (url, _), sync_playwright() as p:   # a warm start: graphs cached
        browser = p.chromium.launch(**launch)
        report_first(first_picture(browser, url, max(args.repeats, 5)), "MiniLM, the example text")
        browser.close()
    if args.first_only:
        return
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
