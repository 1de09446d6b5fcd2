"""The first screen of each zoo model, as a newcomer meets it: a fresh browser (a first visit: "How to read it" open),
`/?model=ID`, at 1280x720 and 1440x900, saved at half scale into docs/first-screen/{model}-{width}x{height}.png.
Prints, per screen, the head the page opened, where the picture starts (px from the top of the window) and how much
of it is on the first screen.

    python bench/first_screen.py                      # a server of its own, every zoo model (Gemma 3 included)
    python bench/first_screen.py --url http://127.0.0.1:8000 --models minilm,smollm2
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import CHROMIUM_ARGS, ROOT, server  # noqa: E402

ZOO = ("minilm", "smollm2", "tiny-gpt", "induction", "gemma3")
SIZES = ((1280, 720), (1440, 900))
OUT = ROOT / "docs" / "first-screen"
DRAWN = """() => { const v = document.querySelector('.view:not([hidden])');
  return !!v && v.dataset.state === location.search && document.getElementById('view-area').getAttribute('aria-busy') === 'false'; }"""
BOX = """() => { const el = document.querySelector('.view:not([hidden]) .js-plotly-plot');
  const r = el.getBoundingClientRect(); return [Math.round(r.top), Math.round(Math.min(r.bottom, innerHeight) - r.top)]; }"""


def shoot(url: str, models: list[str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'model':10} {'window':9} {'head':7} {'picture top':>11} {'on screen':>9}  file")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                    args=CHROMIUM_ARGS)
        for model in models:
            for w, h in SIZES:
                context = browser.new_context(viewport={"width": w, "height": h}, device_scale_factor=0.5)
                page = context.new_page()
                page.goto(f"{url}/?model={model}")
                page.wait_for_function(DRAWN, timeout=180_000)
                page.wait_for_timeout(300)                       # Plotly's last paint
                q = {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}
                top, seen = page.evaluate(BOX)
                path = out / f"{model}-{w}x{h}.png"
                page.screenshot(path=str(path))
                print(f"{model:10} {w}x{h:<5} L{q.get('layer')}H{q.get('head'):<4} {top:>11} {seen:>9}  "
                      f"{path.relative_to(ROOT)}")
                context.close()
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start one serving --models)")
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    models = args.models.split(",")
    with (contextlib.nullcontext((args.url, None)) if args.url
          else server({"ATTNSCOPE_MODELS": ",".join(models)}, timeout=600)) as (url, _pid):
        shoot(url, models, args.out)


if __name__ == "__main__":
    main()
