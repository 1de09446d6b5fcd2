"""The KV cache tab (issue 52) on the induction model: its policy and budget chooser writes the URL; the kept-keys map
of the page's head equals what /api/generate's token lines say the policy evicted (rebuilt here from their `evicted`
lists); the KL curves and the table of where the policies part equal /api/kv_compare's rows; choosing another policy
redraws the map from that policy's generation. Small prompt, 4 new tokens: a few seconds."""
from __future__ import annotations

import json
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import expect

from .conftest import screenshot, wait_drawn

pytestmark = pytest.mark.browser
TEXT = "the cat sat on the mat and the dog sat on the rug and the cat sat on the"
STATE = {"model": "induction", "text": TEXT, "view": "cache", "kv_steps": 4, "layer": 1, "head": 0}
PLOT_JS = "(sel) => { const el = document.querySelector(sel); return el.data.map((t) => ({z: t.z, y: t.y, x: t.x})); }"


def compare(base: str, budget: int) -> dict:
    body = {"model": "induction", "text": TEXT, "max_new_tokens": 4, "policies": ["streaming", "h2o", "snapkv"],
            "budgets": [budget], "sinks": 4, "snapkv_window": min(32, budget // 2)}
    r = httpx.post(base + "/api/kv_compare", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def kept(base: str, kv_cache: dict, layer: int, kv_head: int) -> list[list]:
    """keys x steps, rebuilt from /api/generate's lines: 1 kept, 0 evicted, None past the step's query."""
    body = {"model": "induction", "text": TEXT, "max_new_tokens": 4, "greedy": True, "kv_cache": kv_cache}
    lines = [json.loads(x) for x in httpx.post(base + "/api/generate", json=body, timeout=120).text.splitlines()]
    steps = [x["token"] for x in lines if "token" in x]
    last, gone, columns = steps[-1]["index"], set(), []
    for s in steps:
        gone |= set(s["kv_cache"]["evicted"][layer][kv_head])
        columns.append([None if k >= s["index"] else 0 if k in gone else 1 for k in range(last)])
    return [list(row) for row in zip(*columns)]


def test_cache_tab_draws_the_apis_values(page, live_server, console_errors):
    page.goto("/?" + urlencode(STATE | {"kv_policy": "h2o", "kv_budget": 8}))
    wait_drawn(page, "cache", timeout=60_000)
    expect(page.locator("#kv-policy")).to_have_value("h2o")
    info = next(m for m in httpx.get(live_server + "/api/models").json() if m["id"] == "induction")
    kv_head = 0 // (info["heads"] // info["kv_heads"])
    drawn = page.evaluate(PLOT_JS, "#view-cache [data-part=map] .js-plotly-plot, #view-cache [data-part=map]")
    assert drawn[0]["z"] == kept(live_server, {"policy": "h2o", "budget": 8, "recent": 4}, 1, kv_head)
    assert any(0 in column for column in drawn[0]["z"])                  # the policy evicted something

    answer = compare(live_server, 8)
    rows = [r for r in answer["rows"] if r["policy"] != "full"]
    curves = page.evaluate(PLOT_JS, "#view-cache [data-part=curve]")
    assert [c["y"] for c in curves] == [r["kl"] for r in rows]
    cells = page.locator("#view-cache .cache-parts-table td[data-policy]")
    assert cells.count() == 3 * len(answer["answer_tokens"])
    for i in range(cells.count()):
        cell, (step, r) = cells.nth(i), divmod(i, 3)
        r = rows[r]
        assert cell.get_attribute("data-policy") == r["policy"] and cell.get_attribute("data-top") == r["top_tokens"][step]
        assert float(cell.get_attribute("data-kl")) == pytest.approx(r["kl"][step], rel=1e-6, abs=1e-9)
        assert ("parted" in cell.get_attribute("class")) == (not r["top1"][step])

    page.select_option("#kv-policy", "streaming")                       # the chooser: the URL, then the redraw
    page.wait_for_function("() => location.search.includes('kv_policy=streaming')")
    wait_drawn(page, "cache", timeout=60_000)
    drawn = page.evaluate(PLOT_JS, "#view-cache [data-part=map]")
    assert drawn[0]["z"] == kept(live_server, {"policy": "streaming", "sinks": 4, "window": 4}, 1, kv_head)
    screenshot(page, "cache-view")
    assert console_errors == []
