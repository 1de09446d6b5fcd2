"""Browser timings in headless chromium: the first picture of a page load after a warm start (the HTML received ->
the first picture on screen, in a fresh browser context each time: no cached scripts; goal <= 1.5 s; and when Plotly's
figure replaced it), then submit -> first drawn heatmap (head view), and the full model view (72 thumbnails), at 128
and 512 tokens; plus the bytes each view fetched.

    .venv/bin/python bench/browser.py [--repeats 3] [--first-only] [--before REV] [--url http://127.0.0.1:8000]

--before REV also serves the page at git revision REV (e.g. main) and loads the two in turns: before and after in one
run, under the same load. --url measures the first picture of a server already running, and nothing else. The load
average is printed before and after (this machine is shared: compare numbers taken at the same load).

Starts its own uvicorn on 127.0.0.1 with the result cache off, so every submit runs the model.
"Drawn" is the page's own signal: the visible view has rendered the state in the URL and nothing
is loading (the same condition the browser tests wait on).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright  # noqa: E402

from bench.common import CHROMIUM_ARGS, DRAWN_JS, ROOT, WIDEST_ENV, runtime, server, text_of_tokens  # noqa: E402

API_BYTES = """() => performance.getEntriesByType('resource').filter(e => e.name.includes('/api/'))
  .reduce((s, e) => s + e.transferSize, 0)"""


def timed(page, action, view: str) -> tuple[float, int]:
    page.evaluate("performance.clearResourceTimings()")
    t0 = time.perf_counter()
    action()
    page.wait_for_function(DRAWN_JS, arg=view, timeout=60_000)
    return time.perf_counter() - t0, page.evaluate(API_BYTES)


# A page load's times (ms after the navigation started): the HTML's arrival, its first picture (the page's own
# performance mark "attnscope:first-picture": a head view's canvas sketch, or the first figure; a page without the
# mark counts its first drawn view) and when the view was drawn with Plotly (the page's "drawn" signal, as the tests).
FIRST_PICTURE_JS = """() => new Promise((resolve) => {
  const out = {};
  const drawn = () => { const v = document.querySelector('.view:not([hidden])');
    return !!v && v.dataset.state === location.search && Number(v.dataset.renders) > 0
      && document.getElementById('view-area').getAttribute('aria-busy') === 'false'; };
  const check = () => {
    const mark = performance.getEntriesByName('attnscope:first-picture')[0];
    if (mark && out.picture === undefined) { out.picture = mark.startTime; out.how = mark.detail; }
    if (out.drawn === undefined && drawn()) out.drawn = performance.now();
    if (out.drawn === undefined || out.done) return;
    out.done = true;
    const nav = performance.getEntriesByType('navigation')[0];
    const scripts = performance.getEntriesByType('resource').filter((e) => new URL(e.name).pathname.endsWith('.js'));
    const ours = scripts.filter((e) => !e.name.includes('/vendor/'));
    resolve({ html: nav.responseEnd, picture: out.picture ?? out.drawn, how: out.how ?? 'figure', drawn: out.drawn,
              scripts: scripts.length, scripts_done: Math.max(0, ...ours.map((e) => e.responseEnd)) });
  };
  new PerformanceObserver(check).observe({ type: 'mark', buffered: true });
  new MutationObserver(check).observe(document.body, { attributes: true, subtree: true,
                                                       attributeFilter: ['data-state', 'aria-busy'] });
  check();
})"""


def first_picture(browser, urls: list[str], repeats: int) -> dict[str, list[dict]]:
    """Page loads of each url in fresh contexts (nothing cached in the browser), taking turns (a shared machine's
    load falls on each alike), after one load each that warms its server (its result cache): per load the times of
    FIRST_PICTURE_JS, in ms."""
    out: dict[str, list[dict]] = {u: [] for u in urls}
    for rep in range(repeats + 1):
        for url in urls:
            ctx = browser.new_context(viewport={"width": 1280, "height": 720})
            page = ctx.new_page()
            page.goto(url + "/", wait_until="commit")
            t = page.evaluate(FIRST_PICTURE_JS)
            if rep:
                out[url].append(t)
            ctx.close()
    return out


def report_first(runs: list[dict], label: str) -> None:
    med = lambda key: statistics.median(r[key] - r["html"] for r in runs) / 1000   # noqa: E731
    how = sorted({r["how"] for r in runs})
    print(f"first picture ({label}): median {med('picture'):.2f} s after the HTML "
          f"(max {max(r['picture'] - r['html'] for r in runs) / 1000:.2f} s; drawn as {'/'.join(how)}); "
          f"Plotly's figure at {med('drawn'):.2f} s; our scripts in by {med('scripts_done'):.2f} s, "
          f"{runs[0]['scripts']} script requests; {len(runs)} fresh loads; goal <= 1.5 s")


def load_average() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def version(rev: str):
    """A server of the page at git revision `rev` (a copy of the repository at that commit, run from a temporary
    folder), for before/after timings in one run; yields its URL."""
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "attnscope"
        pkg.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive, check=True)
        with server({"ATTNSCOPE_MODELS": "minilm", "PYTHONPATH": tmp}) as (url, _):
            yield url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-only", action="store_true", help="only the first picture of a page load")
    ap.add_argument("--url", action="append", help="measure the first picture of this running server only "
                    "(repeatable: the servers take turns)")
    ap.add_argument("--before", metavar="REV", help="also measure the page at this git revision (e.g. main), "
                    "in turns with this one")
    args = ap.parse_args()
    launch = {"executable_path": os.environ.get("CHROMIUM", "/usr/bin/chromium"), "args": CHROMIUM_ARGS}
    repeats = max(args.repeats, 5)
    with contextlib.ExitStack() as stack:
        urls = {u.rstrip("/"): u for u in args.url or []}
        if args.before:
            urls[stack.enter_context(version(args.before))] = f"at {args.before}, MiniLM, the example text"
        if not args.url:               # a warm start: graphs cached
            url, _ = stack.enter_context(server({"ATTNSCOPE_MODELS": "minilm"}))
            urls[url] = "this version, MiniLM, the example text"
        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(**launch)
        print(f"{load_average()} before the first-picture loads")
        for url, runs in first_picture(browser, list(urls), repeats).items():
            report_first(runs, urls[url])
        print(f"{load_average()} after")
        browser.close()
    if args.first_only or args.url:
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
