"""A long wait says what is happening and can be cancelled (issue 39): the Effects view's patching of SmolLM2's 270
heads shows its runs done of all and the time left in the progress bar; Cancel stops it, on the page and on the
server (which stops before its next batch instead of running the rest)."""
from __future__ import annotations

import re
import time
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Page, expect

from .conftest import screenshot, wait_drawn

pytestmark = pytest.mark.browser
# an indirect-object pair of its own: no other test runs this patching, so it is not in the server's cache
CLEAN = "When Anna and Paul went to the park, Paul gave a ball to"
CORRUPT = "When Anna and Paul went to the park, Anna gave a ball to"


def test_effects_patching_shows_its_runs_and_time_left_and_cancel_stops_it(page: Page, live_server_smollm2,
                                                                          console_errors):
    base = live_server_smollm2
    page.goto(base + "/?" + urlencode({"model": "smollm2", "view": "effects", "text": CLEAN, "corrupt": CORRUPT,
                                       "target": "␣Anna", "distractor": "␣Paul"}))
    label = page.locator("#run-progress-label")
    expect(label).to_have_text(re.compile(r"Running the model: \d+ of 270 runs · about \d+ (s|min \d+ s) left"),
                               timeout=60_000)
    screenshot(page, "effects-progress", full_page=False)
    page.locator("#run-cancel").click()
    wait_drawn(page, "effects", timeout=30_000)
    expect(page.locator("#view-effects [data-part=maps] [data-part=patching]")).to_contain_text(
        "Cancelled: the runs stopped. Press Run to start them again.")
    cancelled = time.monotonic()
    while (h := httpx.get(base + "/healthz").json())["running"] or h["waiting"]:
        assert time.monotonic() - cancelled < 10, h      # stopped before its next batch, not ~20 s later
        time.sleep(0.1)
    # the one request that failed is the cancelled stream (the browser reports an aborted request as failed)
    assert console_errors == [f"requestfailed: {base}/api/patching net::ERR_ABORTED"]
