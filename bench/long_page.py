"""The page on a long SmolLM2 text (issue 12), in headless chromium: how long after the run completes the model view
is drawn, then the head view (click a thumbnail -> its T x T image), a zoom to 64 tokens (-> labelled), and the
line view (top-k keys).

    .venv/bin/python bench/long_page.py [--tokens 2048 4096] [--repeats 1] [--log]

Starts its own uvicorn on 127.0.0.1 with SmolLM2 (its result cache on: the page streams a run's progress, then
fetches the answers from that cache). "Run done" is when the page has read the run's progress stream to its end
(api.js logs it); "drawn" is when the view's container counted a new render (the page's own signal, as in the
browser tests). Each repeat uses a different text, so each runs the model once.
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

from bench.common import CHROMIUM_ARGS, DRAWN_JS, WORDS, server  # noqa: E402

# performance.now() of every render of every view, recorded by the page itself
RENDERS = """window.__renders = [];
new MutationObserver((ms) => { for (const m of ms) window.__renders.push([m.target.dataset.view, performance.now()]); })
  .observe(document, { subtree: true, attributes: true, attributeFilter: ['data-renders'] });"""
API_JS = "import('/bundle/main.js').then((b) => b.modules['api.js'])"     # the page's own api.js (its log)
RUN_DONE = API_JS + ".then((api) => Math.max(...api.log.filter((e) => e.stream).map((e) => e.end)))"
HEAD_PLOT = "#view-head [data-part=plot]"
LAYER, HEAD = 3, 2


def text_of(n_tokens: int, shift: int) -> str:
    """About n_tokens SmolLM2 tokens (these words are one token each but one: ~1.04 tokens a word)."""
    n = int(n_tokens / 1.043)
    return " ".join(WORDS[(i + shift) % len(WORDS)] for i in range(n))


def plot_point(page, x: float, y: float) -> tuple[float, float]:
    return tuple(page.evaluate("""([sel, x, y]) => {
      const gd = document.querySelector(sel), fl = gd._fullLayout, r = gd.getBoundingClientRect();
      return [r.left + fl.xaxis._offset + fl.xaxis.l2p(x), r.top + fl.yaxis._offset + fl.yaxis.l2p(y)]; }""",
                               [HEAD_PLOT, x, y]))


def timed(page, action, wait) -> float:
    t0 = time.perf_counter()
    action()
    wait()
    return time.perf_counter() - t0


def one(browser, url: str, n_tokens: int, rep: int, log: bool = False) -> dict:
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.add_init_script(RENDERS)
    page.goto(f"{url}/?model=smollm2&view=model&layer={LAYER}&head={HEAD}&text=short")
    page.wait_for_function(DRAWN_JS, arg="model", timeout=120_000)
    page.fill("#text", text_of(n_tokens, rep))
    out = {}
    out["submit -> model view (run included)"] = timed(
        page, lambda: page.get_by_role("button", name="Run").click(),
        lambda: page.wait_for_function(DRAWN_JS, arg="model", timeout=600_000))
    drawn = max(t for v, t in page.evaluate("window.__renders") if v == "model")
    out["run done -> model view drawn"] = (drawn - page.evaluate(RUN_DONE)) / 1000
    out["tokens"] = page.locator("#chips .chip").count()
    out["click thumbnail -> head view image"] = timed(
        page, lambda: page.locator(f'#view-model a.thumb[data-layer="{LAYER}"][data-head="{HEAD}"]').click(),
        lambda: page.wait_for_function(DRAWN_JS, arg="head", timeout=120_000))
    assert page.locator(HEAD_PLOT).get_attribute("data-drawn") == "image"

    lo, hi = out["tokens"] // 2, out["tokens"] // 2 + 63
    page.locator(HEAD_PLOT).scroll_into_view_if_needed()
    x0, y0 = plot_point(page, lo + 0.2, lo + 0.2)
    x1, y1 = plot_point(page, hi - 0.2, hi - 0.2)

    def drag():
        page.mouse.move(x0, y0)
        page.mouse.down()
        page.mouse.move(x1, y1, steps=4)
        page.mouse.up()
    out["zoom to 64 tokens -> labelled"] = timed(page, drag, lambda: page.wait_for_function(
        f"""() => {{ const t = document.querySelector('{HEAD_PLOT}')._fullLayout.xaxis.tickvals || [];
          return t.length > 40 && t[0] >= {lo - 4}; }}""", timeout=60_000))
    out["tab -> line view (top-k)"] = timed(
        page, lambda: page.locator('#tabs a[data-view="lines"]').click(),
        lambda: page.wait_for_function(DRAWN_JS, arg="lines", timeout=120_000))
    assert page.locator("#view-lines").get_attribute("data-top-k") == "8"
    if log:                                              # the page's requests: what, how long, when it ended
        for e in page.evaluate(API_JS + """.then((api) => api.log.map((e) => [
            Object.entries(e.body).filter(([k]) => k !== 'text' && k !== 'model').map(([k, v]) => `${k}=${v}`).join(' '),
            e.stream ? 'progress stream' : `${(e.bytes / 1e6).toFixed(2)} MB`, e.ms, e.end]))"""):
            print(f"  {e[0]:<60} {e[1]:>16} {e[2] / 1000:7.2f} s, ended at {e[3] / 1000:7.2f} s")
        print("  renders:", [(v, round(t / 1000, 2)) for v, t in page.evaluate("window.__renders")])
    page.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--log", action="store_true", help="print the page's requests and renders")
    args = ap.parse_args()
    env = {"ATTNSCOPE_MODELS": "smollm2", "ATTNSCOPE_DEFAULT_MODEL": "smollm2",
           "ATTNSCOPE_MAX_CHARS": str(max(20_000, 7 * max(args.tokens)))}
    rows = []
    with server(env) as (url, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), args=CHROMIUM_ARGS)
        for n in args.tokens:
            runs = [one(browser, url, n, rep, args.log) for rep in range(args.repeats)]
            rows += [(runs[0]["tokens"], what, [r[what] for r in runs]) for what in runs[0] if what != "tokens"]
        browser.close()
    print(f"{'tokens':>6} | {'what':<38} | {'median s':>8} | {'max s':>6}")
    print("-" * 68)
    for n, what, secs in rows:
        print(f"{n:>6} | {what:<38} | {statistics.median(secs):8.2f} | {max(secs):6.2f}")


if __name__ == "__main__":
    main()
