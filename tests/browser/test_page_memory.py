"""What the page keeps that is not in the URL (each view's page memory, main.js) and the global listeners that
reach a view through its hooks: the steps view's readout and Escape, the model view's scroll cue on resize, the
head view's zoom across heads, an opened corpus file across views."""
from __future__ import annotations

from playwright.sync_api import Page, expect

from .conftest import open_app, plot_point, wait_drawn

TEXT = "the cat sat on the mat and then the cat slept"
LONGER = ("The quick brown fox jumps over the lazy dog while the small cat watches from the warm window and the "
          "old farmer walks slowly back to the red barn before the evening rain begins to fall on the quiet fields.")
HEAD_PLOT = "#view-head [data-part=plot]"


def tab(page: Page, view: str) -> None:
    page.locator(f'#tabs a[data-view="{view}"]').click()
    wait_drawn(page, view)


def test_steps_readout_is_kept_across_views_and_escape_reaches_only_the_view_shown(page: Page, console_errors):
    open_app(page, "stages", model="tiny-gpt", text=TEXT, layer=0, head=0, step=9)
    panel = page.locator("#view-stages [data-part=readout]")
    page.locator("#view-stages [data-stage=probs] td[data-q='3'][data-k='2']").click()
    expect(panel).to_be_visible()
    expect(panel).to_have_attribute("data-cell", "probs:3:2")
    tab(page, "head")
    page.locator("body").press("Escape")                 # the steps view is not shown: its readout stays open
    tab(page, "stages")
    expect(panel).to_be_visible()
    expect(panel).to_have_attribute("data-cell", "probs:3:2")
    expect(page.locator("#view-stages td.selected")).to_have_count(1)
    page.locator("body").press("Escape")
    expect(panel).to_be_hidden()
    expect(page.locator("#view-stages td.selected")).to_have_count(0)
    page.select_option("#head", "1")                      # closed stays closed on the next render
    wait_drawn(page, "stages")
    expect(panel).to_be_hidden()
    assert console_errors == []


def test_model_view_scroll_cue_follows_the_window(page: Page, console_errors):
    page.set_viewport_size({"width": 390, "height": 844})
    open_app(page, "model", text=TEXT)
    cue = page.locator("#view-model [data-part=cue]")
    expect(cue).to_be_visible()
    renders = page.locator("#view-model").get_attribute("data-renders")
    page.set_viewport_size({"width": 1900, "height": 1000})     # every head fits: no cue, and no new render
    expect(cue).to_be_hidden()
    page.set_viewport_size({"width": 390, "height": 844})
    expect(cue).to_be_visible()
    assert page.locator("#view-model").get_attribute("data-renders") == renders
    assert console_errors == []


def test_head_view_zoom_is_kept_across_heads(page: Page, console_errors):
    open_app(page, "head", text=LONGER, layer=1, head=0)
    x0, y0 = plot_point(page, HEAD_PLOT, 3.2, 3.2)
    x1, y1 = plot_point(page, HEAD_PLOT, 12.8, 12.8)
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
    page.mouse.move(x1, y1, steps=5)
    page.mouse.up()
    zoomed = "document.querySelector('#view-head [data-part=plot]')._fullLayout.xaxis.range"
    page.wait_for_function(f"() => {{ const r = {zoomed}; return Math.abs(r[1] - r[0]) < 12; }}")
    before = page.evaluate(zoomed)
    page.select_option("#head", "5")
    wait_drawn(page, "head")
    assert page.evaluate(zoomed) == before
    assert console_errors == []
