"""The page at 32k tokens (issue 48): a head drawn as its pooled overview on a log scale, a dragged box drawn as the
exact tile (equal to the API's exact rows), the token strip virtualised (only the rows in view are in the page), each
head's numbers in the model grid, a long run's progress with the time left, and a reload that restores the finished
run from the answers kept on disk without running the model again (the text, too long for an address, named in it
and kept in the tab: static/js/state.js).

Gemma 3 at 32,768 tokens takes ~20 min on this 2-core machine, far too long for the suite: the model here is a tiny
random Llama-shaped checkpoint folder made by the test (2 layers, 1 head of 16 dimensions, d_model 32, the mistral-style
byte-level tokenizer of tests/test_checkpoints.py, max_position_embeddings 32,768), so the 32k run takes seconds. Its
q and k projections are drawn wide (N(0, 1)), so rows are peaked (one key takes most of a row among 32k): a tile
equal to the rows means something."""
from __future__ import annotations

import re
import tempfile
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import numpy as np
import pytest
from playwright.sync_api import expect

from .conftest import plot_point, tiny_llama, wait_drawn

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TOKENS = 32_000
PLOT = "#view-head [data-part=overview] .js-plotly-plot"
# what the progress bar said while it was visible
PROGRESS_SEEN = """window.__progress = [];
new MutationObserver(() => {
  const box = document.getElementById('run-progress');
  if (box && !box.hidden) window.__progress.push(document.getElementById('run-progress-label').textContent);
}).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });"""


@pytest.fixture(scope="module")
def long_folder(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("long32k") / "long", peaked=True)


@pytest.fixture(scope="module")
def long_server(long_folder):
    from bench.common import server

    with tempfile.TemporaryDirectory() as jobs, tempfile.TemporaryDirectory() as kept, \
            server({"ATTNSCOPE_MODELS": f"long={long_folder}", "ATTNSCOPE_DEFAULT_MODEL": "long",
                    "ATTNSCOPE_JOBS_DIR": jobs, "ATTNSCOPE_KEPT_DIR": kept, "ATTNSCOPE_KEPT_MB": "256"}, timeout=300) as (url, _pid):
        yield url


@pytest.fixture(scope="module")
def text(long_folder):
    from ..test_rope_scaling import long_text
    return long_text(long_folder, TOKENS)


def health(url: str) -> dict:
    return httpx.get(url + "/healthz", timeout=30).json()


def drag(page, x0, y0, x1, y1) -> None:
    """Drag a box in the overview from data point (x0, y0) to (x1, y1): keys across, queries down."""
    a, b = plot_point(page, PLOT, x0, y0), plot_point(page, PLOT, x1, y1)
    page.mouse.move(*a)
    page.mouse.down()
    page.mouse.move((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, steps=5)
    page.mouse.move(*b, steps=5)
    page.mouse.up()


def test_32k_overview_zoomed_tile_virtual_strip_and_a_reload_that_does_not_run_again(browser, long_server, text):
    context = browser.new_context(viewport={"width": 1440, "height": 900}, base_url=long_server)
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.add_init_script(PROGRESS_SEEN)
    address = "/?" + urlencode({"model": "long", "view": "head", "layer": 1, "head": 0, "text": text})
    try:
        page.goto(address)
        wait_drawn(page, "head", timeout=300_000)
        # the text is too long for an address the server takes: the address names it (state.js), the tab keeps it
        query = parse_qs(urlparse(page.url).query)
        assert "text" not in query and len(query["textref"][0]) < 40, page.url[:200]
        T = int(page.locator("#length-note").get_attribute("data-read"))
        assert T >= TOKENS
        assert any(" left" in p for p in page.evaluate("window.__progress")), page.evaluate("window.__progress")
        # the overview: 512 x 512 blocks of the whole head, on a log scale
        plot = page.locator(PLOT)
        expect(plot).to_have_attribute("data-drawn", "overview")
        shape = page.evaluate(f"""() => {{ const gd = document.querySelector('{PLOT}'), t = gd.data[0];
          return [t.name, t.z.length, t.z[0].length, t.zmax, t.zmin]; }}""")
        assert shape == ["overview", 512, 512, 0, -6], shape
        # the strip: every token reachable, few in the page
        chips = page.locator("#chips")
        expect(chips).to_have_attribute("data-virtual", "1")
        assert page.locator("#chips .chip").count() < 1_000
        chips.evaluate("(el) => { el.scrollTop = el.scrollHeight; }")
        expect(page.locator(f'#chips .chip[data-index="{T - 1}"]')).to_be_attached()
        assert page.locator("#chips .chip").count() < 1_000
        # where query 20,000 looks (the API's exact row): a key far back, most of its row
        def exact_rows(queries):
            r = httpx.post(long_server + "/api/attention", json={"model": "long", "text": text, "layers": [1],
                                                                 "heads": [0], "include": [], "queries": queries},
                           timeout=120)
            return np.array(r.json()["rows"][0][0])
        peak = int(exact_rows([20_000])[0].argmax())
        # a box over about 2,000 x 2,000 tokens round it: too big for the exact weights, it says so; a box inside it
        # over about 100 queries from 20,000 and 150 keys round that peak: their exact tile, drawn cell by cell
        plot.evaluate("(el) => el.scrollIntoView({ block: 'center' })")
        status = page.locator("#view-head .overview-status")
        lo = max(peak - 75, 0)
        drag(page, max(lo - 1_000, 0), 19_000, lo + 1_150, 21_000)
        expect(status).to_contain_text("zoom in to at most 400 of each")
        drag(page, lo, 20_000, lo + 150, 20_100)
        box = page.locator("#view-head [data-part=overview]")
        expect(box).to_have_attribute("data-tile", re.compile(r"^\d+,\d+,\d+,\d+$"), timeout=60_000)
        q0, q1, k0, k1 = map(int, box.get_attribute("data-tile").split(","))
        assert abs(q0 - 20_000) <= 10 and abs(q1 - 20_100) <= 10 and abs(k0 - lo) <= 10 and abs(k1 - lo - 150) <= 10
        tile = page.evaluate(f"""() => {{ const t = document.querySelector('{PLOT}').data.find((d) => d.name === 'tile');
          return {{x0: t.x[0], y0: t.y[0], rows: t.customdata}}; }}""")
        assert (tile["x0"], tile["y0"]) == (k0, q0)
        drawn = np.array(tile["rows"])
        assert drawn.shape == (q1 - q0, k1 - k0)
        queries = [q0, q0 + 37, q1 - 1, 20_000]           # rows through the tile's box, the peak's among them
        rows = exact_rows(queries)
        assert rows.shape == (4, T) and rows[3].max() > 0.3                    # peaked: one key takes much of a row
        np.testing.assert_allclose(drawn[[q - q0 for q in queries]], rows[:, k0:k1], atol=1e-6, rtol=0)
        assert drawn[20_000 - q0].max() > 0.3                                  # the peak is in the tile, drawn
        # the model grid: each head's sink mass under its thumbnail
        page.locator('#tabs a[data-view="model"]').click()
        wait_drawn(page, "model", timeout=120_000)
        expect(page.locator("#view-model .thumb-nums")).to_have_count(2)
        expect(page.locator("#view-model .thumb-nums").first).to_contain_text("sink ")
        # a reload of the head: the finished runs come from the disk, nothing runs again
        page.goto(address)
        wait_drawn(page, "head", timeout=120_000)
        before = health(long_server)
        seen = []
        page.on("response", lambda resp: seen.append(resp.headers.get("x-cache"))
                if resp.url.endswith("/api/attention") and "tensors" in (resp.request.headers.get("accept") or "")
                else None)
        page.reload()
        wait_drawn(page, "head", timeout=120_000)
        after = health(long_server)
        expect(page.locator(PLOT)).to_have_attribute("data-drawn", "overview")
        assert after["runs_computed"] == before["runs_computed"], (before, after)
        assert after["kept_hits"] >= before["kept_hits"] + 2 and seen and set(seen) == {"kept"}, (seen, before, after)
        assert errors == []
    finally:
        context.close()
