"""Local (sliding-window) layers in the page: a small random Gemma 3 checkpoint (tests/test_gemma.py's, window 6 on
layer 0, layer 1 global) served by path. The layer picker marks the local layer; its head view says it is local and
draws the keys past the window as masked, exactly like the causal mask's future keys (white, no weight), while the
global layer's view colours them; the model view marks the local row."""
from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Page, expect

from tests.test_checkpoints import TEXT
from tests.test_gemma import WINDOW, build

from .conftest import SMALL_SCREEN, assert_plot_on_screen, assert_plot_seen, screenshot, wait_drawn
from .test_layout import failed_requests, open_every_tab

# the heatmap's cells as drawn: null where the cell is masked (the plot's background shows through)
CELLS_JS = """() => {
  const plot = document.querySelector('#view-head .head-plot');
  const trace = plot.data[plot.data.length - 1];
  return trace.z;
}"""


@pytest.fixture(scope="module")
def gemma_server():
    from bench.common import server

    with tempfile.TemporaryDirectory() as root:
        folder = build("gemma3_text", Path(root) / "gemma3")
        with server({"ATTNSCOPE_MODELS": f"gemma={folder}", "ATTNSCOPE_DEFAULT_MODEL": "gemma"}) as (url, _pid):
            yield url


def goto(page: Page, base: str, **state) -> None:
    page.goto(base + "/?" + urlencode({"model": "gemma", "text": TEXT, **state}))
    wait_drawn(page, state.get("view"), timeout=60_000)


def test_local_layer_draws_its_window_as_part_of_the_mask(page: Page, gemma_server, console_errors):
    goto(page, gemma_server, view="head", layer=0, head=1)
    view = page.locator("#view-head")
    expect(view).to_have_attribute("data-window", str(WINDOW))
    assert page.locator("#layer option").all_inner_texts() == ["layer 0 (local)", "layer 1"]
    expect(view.locator("p.note")).to_contain_text("Layer 0 is a local layer (sliding window)")
    expect(view.locator("p.note")).to_contain_text("Global layers (every earlier token): 1.")
    expect(view.locator("p.legend")).to_contain_text(f"the sliding window of {WINDOW} keys included")
    z = page.evaluate(CELLS_JS)
    T = len(z)
    assert T > 3 * WINDOW
    for i in range(T):
        for j in range(T):
            assert (z[i][j] is None) == (j > i or i - j >= WINDOW), (i, j)   # future keys and the far past alike
    screenshot(page, "gemma-local-layer")

    goto(page, gemma_server, view="head", layer=1, head=1)
    expect(page.locator("#view-head")).to_have_attribute("data-window", "0")
    z = page.evaluate(CELLS_JS)
    assert all((z[i][j] is None) == (j > i) for i in range(T) for j in range(T))       # global: the causal mask only
    assert "local layer" not in page.locator("#view-head p.note").inner_text()

    goto(page, gemma_server, view="model")
    rows = page.locator("#view-model .row-head")
    expect(rows.nth(0)).to_have_text("L0 · local")
    expect(rows.nth(1)).to_have_text("L1")
    expect(page.locator("#view-model p.note")).to_contain_text("sliding-window layers")
    assert console_errors == []


def test_gemma3_family_tabs_and_layout(page: Page, gemma_server, console_errors):
    """Gemma 3's family at 1280x720: every tab draws or says why in the capability record's words (QK-norm and
    post-norms make Why?, the head lens, attribution and circuits inexact; a model folder runs no corpus job), no
    request fails; the lens draws without the head lens; the head view is on screen after load and while generating,
    and its tokens carry the one space mark."""
    page.set_viewport_size(SMALL_SCREEN)
    failed = failed_requests(page)
    seen = open_every_tab(page, gemma_server, "gemma", failed)
    assert seen["circuits"] == "not exact with QK-norm and post-norms"
    assert seen["atlas"] == "not a zoo model: corpus jobs run zoo models"
    assert {v for v, s in seen.items() if s != "figure"} == {"circuits", "atlas"}
    page.locator('#tabs a[data-view="lens"]').click()
    wait_drawn(page, "lens")
    expect(page.locator('#view-lens .note.refused[data-feature="head_lens"]')).to_contain_text("not exact with post-norms")
    expect(page.locator("#view-lens [data-part=plot] .main-svg").first).to_be_attached()

    goto(page, gemma_server, view="head", max_new_tokens=6, greedy=1)
    assert_plot_on_screen(page)
    chips = page.locator("#chips .chip .tok").all_inner_texts()
    assert any(t.startswith("␣") for t in chips) and not any("▁" in t for t in chips), chips
    page.locator("#gen-run").click()
    page.wait_for_function("() => Number(document.getElementById('generate').dataset.tokens) >= 2", timeout=60_000)
    assert_plot_seen(page, 150)          # (the click scrolled the page to Generate, below Gemma 3's longer notes)
    expect(page.locator("#generate")).not_to_have_attribute("data-state", "running", timeout=60_000)
    screenshot(page, "layout-gemma3", full_page=False)
    assert failed == [] and console_errors == []
