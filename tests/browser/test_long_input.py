"""A long input (600 words, cut at MiniLM's 256-token limit) draws in the head, model and line views, the page
stays responsive, and no view transfers more than 4 MB."""
from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect

from .conftest import open_app, screenshot, wait_drawn

pytestmark = pytest.mark.browser
LONG = "word " * 600
API_BYTES = """() => performance.getEntriesByType('resource').filter(e => e.name.includes('/api/'))
  .reduce((s, e) => s + e.decodedBodySize, 0)"""


def _responsive(page) -> float:
    t = time.perf_counter()
    assert page.evaluate("1 + 1") == 2
    return time.perf_counter() - t


def _timed_draw(page, action, view: str) -> tuple[float, int]:
    """Run action, wait until view has drawn; seconds taken and /api/ bytes fetched meanwhile."""
    page.evaluate("performance.clearResourceTimings()")
    t = time.perf_counter()
    action()
    wait_drawn(page, view, timeout=20_000)
    return time.perf_counter() - t, page.evaluate(API_BYTES)


def test_long_input_head_model_and_lines(page: Page, console_errors, api):
    open_app(page, "head", layer=1, head=2)
    page.fill("#text", LONG)
    head_s, head_bytes = _timed_draw(page, lambda: page.get_by_role("button", name="Run").click(), "head")
    assert _responsive(page) < 0.5
    expect(page.locator("#chips .chip")).to_have_count(256)
    expect(page.locator("#token-info")).to_contain_text("truncated")
    assert 250_000 < head_bytes < 320_000                 # one float32 256 x 256 matrix and the token list
    expect(page.locator("#view-head .main-svg").first).to_be_visible()
    print(f"\n256 tokens: head view drawn {head_s:.2f} s after submit, {head_bytes / 1e6:.2f} MB")
    assert head_s < 8                                     # generous: the 1.5 s target is measured by the benchmarks

    # pinned row of a long text: the top weights listed match the API
    page.locator('#chips .chip[data-index="200"]').click()
    wait_drawn(page, "head")
    ref = api(text=LONG, layers=[1], heads=[2], include=["attention"])["attention"][0][0][200]
    rows = page.locator("#view-head [data-part=pinned] tr[data-key]").evaluate_all(
        "rs => rs.map(r => [Number(r.dataset.key), Number(r.dataset.weight)])")
    assert len(rows) == 40
    assert [w for _, w in rows] == pytest.approx(sorted(ref, reverse=True)[:40], abs=1e-6)   # the largest 40
    for k, w in rows:
        assert w == pytest.approx(ref[k], abs=1e-6)
    screenshot(page, "head-256", full_page=False)

    model_s, model_bytes = _timed_draw(page, lambda: page.locator('#tabs a[data-view="model"]').click(), "model")
    assert _responsive(page) < 0.5
    expect(page.locator("#view-model a.thumb")).to_have_count(72)
    expect(page.locator("#view-model [data-part=note]")).to_contain_text("block")
    assert model_bytes < 4_000_000
    print(f"256 tokens: model view drawn {model_s:.2f} s after the click, {model_bytes / 1e6:.2f} MB")
    screenshot(page, "model-256", full_page=False)

    page.evaluate("performance.clearResourceTimings()")
    page.locator('#tabs a[data-view="lines"]').click()
    wait_drawn(page, "lines", timeout=20_000)
    assert _responsive(page) < 0.5
    assert page.evaluate(API_BYTES) < 4_000_000
    expect(page.locator("#view-lines input[type=checkbox]:checked")).to_have_count(1)
    expect(page.locator("#view-lines input[type=checkbox]:disabled")).to_have_count(0)   # 1 of 3 allowed
    for hd in (5, 7):
        page.locator(f'#view-lines input[data-head="{hd}"]').check()
        wait_drawn(page, "lines")
    expect(page.locator("#view-lines input[type=checkbox]:disabled")).to_have_count(9)   # limit reached
    assert page.locator("#view-lines .overview path").count() > 0

    page.evaluate("performance.clearResourceTimings()")
    page.locator('#tabs a[data-view="stages"]').click()
    wait_drawn(page, "stages", timeout=20_000)
    stage_bytes = page.evaluate(API_BYTES)
    assert stage_bytes < 100_000                          # only the tokens shown travel (limit), not 1.3 MB
    print(f"256 tokens: steps view {stage_bytes / 1e6:.3f} MB")
    assert console_errors == []


def test_model_view_128_tokens(page: Page, console_errors):
    text = " ".join(f"w{i}" for i in range(60))             # about 128 word pieces
    open_app(page, "head", text="short")
    page.evaluate("performance.clearResourceTimings()")
    t = time.perf_counter()
    page.goto("/?" + f"view=model&text={text.replace(' ', '+')}")
    wait_drawn(page, "model")
    print(f"\nmodel view, {page.locator('#chips .chip').count()} tokens: {time.perf_counter() - t:.2f} s incl. page load")
    expect(page.locator("#view-model a.thumb")).to_have_count(72)
    assert page.evaluate(API_BYTES) < 1_000_000
    assert console_errors == []
