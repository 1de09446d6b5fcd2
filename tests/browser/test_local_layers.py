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

from .conftest import screenshot, wait_drawn

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
