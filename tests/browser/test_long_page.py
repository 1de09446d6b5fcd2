"""The page at ~2048 tokens on SmolLM2 (issue 12), from one run: the progress bar while it runs, the model view from
64 x 64 block thumbnails, the head view's whole T x T matrix drawn as one image (hover names both tokens and the
weight, masked cells white, a zoomed 64-token window labels every token), and the line view from each query's top
keys (top_k). How fast each view draws is printed by bench/long_page.py, not asserted here."""
from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
from playwright.sync_api import Page, expect

from attnscope.app.wire import from_binary
from bench.common import WORDS

from .conftest import plot_point, screenshot, wait_drawn
from .test_real_lengths import label, pixel

pytestmark = [pytest.mark.browser, pytest.mark.slow]
HEAD_PLOT = "#view-head [data-part=plot]"
BINARY, NDJSON = "application/vnd.attnscope.tensors", "application/x-ndjson"
LONG = " ".join(WORDS[i % len(WORDS)] for i in range(1960))          # about 2050 SmolLM2 tokens
LAYER, HEAD = 3, 2
# what the progress bar said while it was visible
PROGRESS_SEEN = """window.__progress = [];
new MutationObserver(() => {
  const box = document.getElementById('run-progress');
  if (box && !box.hidden) window.__progress.push(document.getElementById('run-progress-label').textContent);
}).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });"""


def plot_js(page, expr: str):
    return page.evaluate(f"(() => {{ const gd = document.querySelector('{HEAD_PLOT}'); return {expr}; }})()")


def drag_zoom(page, lo: float, hi: float) -> None:
    """Drag a box over positions lo..hi on both axes of the head view."""
    x0, y0 = plot_point(page, HEAD_PLOT, lo, lo)
    x1, y1 = plot_point(page, HEAD_PLOT, hi, hi)
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
    page.mouse.move(x1, y1, steps=5)
    page.mouse.up()


def test_long_text_progress_model_head_zoom_and_lines(page: Page, live_server_smollm2, console_errors):
    url = live_server_smollm2
    page.add_init_script(PROGRESS_SEEN)
    bodies = []
    page.on("request", lambda r: bodies.append((r.headers.get("accept", ""), r.post_data_json))
            if r.url.endswith("/api/attention") and r.method == "POST" else None)
    page.goto(url + f"/?model=smollm2&view=model&layer={LAYER}&head={HEAD}&text=short")
    wait_drawn(page, "model", timeout=120_000)
    page.fill("#text", LONG)
    page.get_by_role("button", name="Run").click()
    wait_drawn(page, "model", timeout=180_000)                   # the one long run of this test
    tokens = httpx.post(url + "/api/attention", json={"model": "smollm2", "text": LONG, "include": []},
                        timeout=120).json()["tokens"]
    T = len(tokens)
    assert 1950 <= T <= 2150
    expect(page.locator("#chips .chip")).to_have_count(T)

    # the run took seconds: its progress was streamed (NDJSON, then the binary answer) and the bar counted layers
    assert any(a.startswith(NDJSON) for a, _ in bodies)
    assert int(page.locator("#run-progress").get_attribute("data-shown") or 0) >= 1
    seen = page.evaluate("window.__progress")
    # each layer done, and the time left from the layers so far (issue 51)
    assert any(re.fullmatch(r"Running the model: layer \d+ of 30 · about \d+ (s|min \d+ s) left", s) for s in seen), seen[-5:]
    expect(page.locator("#run-progress")).to_be_hidden()

    # model view: every head, from 64 x 64 blocks of about 32 tokens
    expect(page.locator("#view-model a.thumb")).to_have_count(30 * 9)
    assert page.evaluate("[...document.querySelectorAll('#view-model canvas.thumb-canvas')]"
                         ".every(c => c.width === 64 && c.height === 64)")
    expect(page.locator("#view-model [data-part=note]")).to_contain_text("block")
    screenshot(page, "long-model", full_page=False)

    # head view: the whole T x T matrix, as one image with a pixel per cell
    page.locator(f'#view-model a.thumb[data-layer="{LAYER}"][data-head="{HEAD}"]').click()
    wait_drawn(page, "head", timeout=60_000)
    assert page.locator(HEAD_PLOT).get_attribute("data-drawn") == "image"
    assert plot_js(page, "gd.data.map(d => d.type)") == ["heatmap", "image"]
    size = page.evaluate(f"""async () => {{ const img = new Image();
      img.src = document.querySelector('{HEAD_PLOT}').data[1].source; await img.decode();
      return [img.naturalWidth, img.naturalHeight]; }}""")
    assert size == [T, T]
    head_body = next(b for a, b in bodies if a.startswith(BINARY) and b.get("layers") == [LAYER] and "top_k" not in b)
    assert head_body["dtype"] == "float16"
    ref = from_binary(httpx.post(url + "/api/attention", json={**head_body, "include": ["attention"]},
                                 headers={"Accept": BINARY}, timeout=120).content)
    att = ref["attention"][0, 0].astype(np.float32)

    # hover: both tokens and the weight of the cell under the mouse (a screen pixel spans about two cells)
    page.locator(HEAD_PLOT).scroll_into_view_if_needed()
    tip, readout = page.locator("#view-head [data-part=tip]"), page.locator("#view-head [data-part=readout]")
    q = 1500
    k = int(att[q, :q - 100].argmax())
    page.mouse.move(*plot_point(page, HEAD_PLOT, k, q))
    expect(tip).to_be_visible()
    qi, ki = int(tip.get_attribute("data-query")), int(tip.get_attribute("data-key"))
    assert abs(qi - q) <= 3 and abs(ki - k) <= 3
    assert f"query {qi} “{label(tokens[qi])}”" in tip.inner_text() and f"key {ki} “{label(tokens[ki])}”" in tip.inner_text()
    assert float(readout.get_attribute("data-weight")) == pytest.approx(float(att[qi, ki]), rel=1e-6, abs=1e-9)
    # masked cells (a key after the query): white, and named masked; the lower triangle is coloured
    page.mouse.move(*plot_point(page, HEAD_PLOT, 1900, 100))
    expect(tip).to_contain_text("masked")
    page.mouse.move(0, 0)
    expect(tip).to_be_hidden()
    assert pixel(page, *plot_point(page, HEAD_PLOT, 1900, 100)) == (255, 255, 255)
    assert pixel(page, *plot_point(page, HEAD_PLOT, 100, 1900)) != (255, 255, 255)
    screenshot(page, "long-head", full_page=False)

    # zoom (drag a box) to a 64-token window: every token in it is labelled again, on both axes
    lo, hi = 1000, 1063
    drag_zoom(page, lo + 0.2, hi - 0.2)
    page.wait_for_function(f"""() => {{ const gd = document.querySelector('{HEAD_PLOT}');
      const t = gd._fullLayout.xaxis.tickvals || []; return t.length > 40 && t[0] >= {lo - 4}; }}""")
    page.wait_for_timeout(200)
    for ax in ("x", "y"):
        r = plot_js(page, f"gd._fullLayout.{ax}axis.range")
        shown = list(range(int(-(-min(r) // 1)), int(max(r) // 1) + 1))      # the positions inside the range
        assert 58 <= len(shown) <= 66, (ax, r)
        ticks = page.locator(f"#view-head .{ax}tick text").all_text_contents()
        assert sorted(ticks) == sorted(label(tokens[i]) for i in shown), ax
    screenshot(page, "long-head-zoomed", full_page=False)

    # line view: each query's top 8 keys (top_k), not T x T
    page.locator('#tabs a[data-view="lines"]').click()
    wait_drawn(page, "lines", timeout=60_000)
    expect(page.locator("#view-lines")).to_have_attribute("data-top-k", "8")
    assert any(b.get("top_k") == 8 and b.get("layers") == [LAYER] for _, b in bodies)
    expect(page.locator("#view-lines [data-part=note]")).to_contain_text("8 heaviest keys")
    assert page.locator("#view-lines .overview path").count() > 0
    q = 1200
    page.locator(f'#view-lines .tok-label[data-side="q"][data-index="{q}"]').hover()
    top = page.locator(f'#view-lines [data-part=focus] .w[data-head="{HEAD}"]').evaluate_all(
        "ws => ws.map(w => [Number(w.dataset.other), Number(w.dataset.weight)])")
    assert top and top[0][1] == pytest.approx(float(att[q].max()), rel=1e-3)     # its heaviest key first
    assert float(att[q, top[0][0]]) == pytest.approx(float(att[q].max()), rel=1e-3)
    # every progress stream read to its end, none reported failed: the stream is sent with Cache-Control: no-cache,
    # because Chromium reports a no-store fetch stream read to its end as aborted (microsoft/playwright#42742)
    assert page.evaluate("import('/bundle/main.js').then((b) => b.modules['api.js'].log.filter((e) => e.stream).length)") >= 1
    assert console_errors == []
