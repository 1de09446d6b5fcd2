"""The model grid's numbers (issue 48): under each head's thumbnail, its sink, local-window and value-weighted
first-token masses from the run's summary and, once the retrieval box is ticked, its retrieval score from the needle
probe; each equal to the API's own answer, and none shown that the answers do not hold.

The model is a tiny random Llama-shaped checkpoint folder made here (2 layers x 2 heads, an LM head, so the
retrieval probe runs: its walks take seconds, SmolLM2's minutes on this machine)."""
from __future__ import annotations

import tempfile
from urllib.parse import urlencode

import httpx
import numpy as np
import pytest

from .conftest import tiny_llama, wait_drawn

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TEXT = "The cat sat on the mat, and then the cat slept by the door until the sun went down."
NUMBERS = ("first_token_mass", "local_mass", "value_weighted_first_token_mass")   # the summary's, in the grid


@pytest.fixture(scope="module")
def grid_server(tmp_path_factory):
    from bench.common import server

    folder = tiny_llama(tmp_path_factory.mktemp("grid") / "grid", heads=2, positions=1024)
    with tempfile.TemporaryDirectory() as jobs, server({"ATTNSCOPE_MODELS": f"grid={folder}",
                                                        "ATTNSCOPE_DEFAULT_MODEL": "grid", "ATTNSCOPE_JOBS_DIR": jobs},
                                                       timeout=300) as (url, _pid):
        yield url


def shown(page) -> dict[tuple[int, int], dict[str, str]]:
    """(layer, head) -> the numbers under its thumbnail, as the page wrote them (data-* attributes) and its text."""
    return {(int(c["layer"]), int(c["head"])): c for c in page.evaluate("""() =>
      [...document.querySelectorAll('#view-model .thumb-nums')].map((el) => ({ ...el.dataset, text: el.textContent }))""")}


def test_the_grid_shows_every_heads_numbers_as_the_api_gives_them(browser, grid_server):
    context = browser.new_context(viewport={"width": 1366, "height": 900}, base_url=grid_server)
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    try:
        summary = httpx.post(grid_server + "/api/attention", json={"model": "grid", "text": TEXT,
                                                                  "include": ["summary"]}, timeout=120).json()["summary"]
        page.goto("/?" + urlencode({"model": "grid", "view": "model", "text": TEXT}))
        wait_drawn(page, "model", timeout=60_000)
        cells = shown(page)
        assert sorted(cells) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        for (l, hd), c in cells.items():
            for name in NUMBERS:
                np.testing.assert_allclose(float(c[_key(name)]), summary[name][l][hd], rtol=1e-6, atol=1e-7,
                                           err_msg=f"{name} of L{l}H{hd}")
            assert c["text"].startswith("sink ") and "local " in c["text"] and "value-weighted sink " in c["text"]
            assert "retrieval" not in c and "retrieval" not in c["text"]      # not asked: not shown, never made up
        assert np.allclose(summary["local_mass"], 1)          # a text under 64 tokens lies within the local window
        page.locator("#grid-retrieval").check()
        wait_drawn(page, "model", timeout=180_000)
        probe = httpx.post(grid_server + "/api/retrieval", json={"model": "grid", "controls": 1}, timeout=300).json()
        cells = shown(page)
        for (l, hd), c in cells.items():
            np.testing.assert_allclose(float(c[_key("retrieval")]), probe["scores"][l][hd], rtol=1e-6, atol=1e-7)
            assert "retrieval " in c["text"]
        page.locator("#grid-retrieval").uncheck()
        wait_drawn(page, "model", timeout=60_000)
        assert all("retrieval" not in c for c in shown(page).values())
        assert errors == []
    finally:
        context.close()


def _key(name: str) -> str:
    """The dataset key the page writes a number under: data-first-token-mass -> firstTokenMass."""
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)
