"""Masking and re-running, permalinks and history, exports, keyboard use, errors, presentation mode."""
from __future__ import annotations

import csv
import io
import json

import pytest
from playwright.sync_api import Page, expect

from .conftest import open_app, screenshot, wait_drawn

pytestmark = pytest.mark.browser
TEXT = "The cat sat on the mat because it was tired."


def test_mask_token_reruns_every_view(page: Page, console_errors, api):
    open_app(page, "head", text=TEXT, layer=2, head=1)
    page.get_by_label("masks it as a key").check()
    assert "click=mask" in page.url
    sent = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/api/attention") else None)
    page.locator('#chips .chip[data-index="3"]').click()
    wait_drawn(page, "head")
    assert sent and all(body["mask_tokens"] == [3] for body in sent)
    assert any(body.get("layers") == [2] and body.get("heads") == [1] for body in sent)
    assert "mask_tokens=3" in page.url
    expect(page.locator('#chips .chip[data-index="3"]')).to_have_class("chip masked")
    expect(page.locator("#token-info")).to_contain_text("1 masked")
    # pin row 5 with the keyboard shortcut "p": the masked column is 0 there, as in the API
    page.locator('#chips .chip[data-index="5"]').press("p")
    wait_drawn(page, "head")
    ref = api(text=TEXT, layers=[2], heads=[1], include=["attention"], mask_tokens=[3])
    assert ref["mask_tokens"] == [3]
    att = ref["attention"][0][0]
    rows = dict(page.locator("#view-head [data-part=pinned] tr[data-key]").evaluate_all(
        "rs => rs.map(r => [Number(r.dataset.key), Number(r.dataset.weight)])"))
    assert rows[3] == 0.0
    for k, w in rows.items():
        assert w == pytest.approx(att[5][k], abs=1e-6)
    for q in range(len(att)):              # every other row puts 0 on the masked key
        if q != 3:
            assert att[q][3] == 0.0
    # every view follows the mask
    for view in ("model", "entropy", "stages"):
        page.locator(f'#tabs a[data-view="{view}"]').click()
        wait_drawn(page, view)
        assert "mask_tokens=3" in page.url
    assert page.locator("#view-stages [data-stage=masked] td[data-q='5'][data-k='3']").inner_text() == "−∞"
    assert page.locator("#view-stages [data-stage=probs] td[data-q='5'][data-k='3']").inner_text() == "0.0000"
    # unmask
    page.get_by_role("button", name="Unmask all").click()
    wait_drawn(page, "stages")
    assert "mask_tokens=" not in page.url
    assert console_errors == []


def test_permalink_restores_state_and_history(page: Page, console_errors, context):
    open_app(page, "head", text=TEXT)
    page.select_option("#layer", "4")
    wait_drawn(page, "head")
    page.select_option("#head", "9")
    wait_drawn(page, "head")
    page.get_by_label("Hide [CLS] / [SEP]").check()
    wait_drawn(page, "head")
    page.locator('#chips .chip[data-index="6"]').click()           # pin
    wait_drawn(page, "head")
    page.get_by_label("masks it as a key").check()
    page.locator('#chips .chip[data-index="2"]').click()           # mask
    wait_drawn(page, "head")
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.get_by_role("button", name="Copy permalink").click()
    expect(page.locator("#status")).to_contain_text("Permalink copied")
    link = page.evaluate("navigator.clipboard.readText()")
    assert link == page.url
    for part in ("layer=4", "head=9", "hide_special=1", "pin=6", "mask_tokens=2", "view=head", "text=The+cat"):
        assert part in link

    fresh = context.new_page()
    errors = []
    fresh.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    fresh.goto(link)
    wait_drawn(fresh, "head")
    expect(fresh.locator("#text")).to_have_value(TEXT)
    expect(fresh.locator("#layer")).to_have_value("4")
    expect(fresh.locator("#head")).to_have_value("9")
    expect(fresh.locator("#hide-special")).to_be_checked()
    expect(fresh.locator("input[name=click][value=mask]")).to_be_checked()
    expect(fresh.locator('#chips .chip[data-index="2"]')).to_have_class("chip masked")
    expect(fresh.locator("#view-head [data-part=pinned]")).to_have_attribute("data-pin", "6")
    a = page.locator("#view-head [data-part=pinned] tr[data-key]").evaluate_all("rs => rs.map(r => r.dataset.weight)")
    b = fresh.locator("#view-head [data-part=pinned] tr[data-key]").evaluate_all("rs => rs.map(r => r.dataset.weight)")
    assert a == b and len(a) > 5
    fresh.close()
    assert errors == []

    # back / forward walk the history of states
    page.go_back()                     # before the mask
    wait_drawn(page, "head")
    expect(page.locator('#chips .chip[data-index="2"]')).not_to_have_class("chip masked")
    page.go_back()                     # before the click mode
    page.go_back()                     # before the pin
    wait_drawn(page, "head")
    expect(page.locator("#view-head [data-part=pinned]")).to_have_attribute("data-pin", "")
    page.go_forward()
    wait_drawn(page, "head")
    expect(page.locator("#view-head [data-part=pinned]")).to_have_attribute("data-pin", "6")
    # tabs are links holding the whole state
    href = page.locator('#tabs a[data-view="entropy"]').get_attribute("href")
    assert "view=entropy" in href and "layer=4" in href and "pin=6" in href
    assert console_errors == []


def _download(page, button):
    with page.expect_download() as d:
        page.locator(button).click()
    return d.value


def test_exports_csv_json_png_svg(page: Page, console_errors, api, tmp_path):
    open_app(page, "head", text=TEXT, layer=1, head=2)
    ref = api(text=TEXT, layers=[1], heads=[2], include=["attention"])
    att = ref["attention"][0][0]

    dl = _download(page, "#export-csv")
    assert dl.suggested_filename == "attnscope-minilm-L1H2.csv"
    rows = list(csv.reader(io.StringIO(open(dl.path(), encoding="utf-8").read())))
    assert rows[0][1:] == [f"{i}:{t}" for i, t in enumerate(ref["tokens"])]
    for q, row in enumerate(rows[1:]):
        for k, v in enumerate(row[1:]):
            assert float(v) == pytest.approx(att[q][k], abs=1e-6)

    dl = _download(page, "#export-json")
    data = json.loads(open(dl.path(), encoding="utf-8").read())
    assert data["layer"] == 1 and data["head"] == 2 and data["tokens"] == ref["tokens"]
    assert data["attention"][3][4] == pytest.approx(att[3][4], abs=1e-6)

    dl = _download(page, "#export-png")
    assert dl.suggested_filename.endswith(".png")
    assert open(dl.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    dl = _download(page, "#export-svg")
    assert dl.suggested_filename.endswith(".svg")
    assert b"<svg" in open(dl.path(), "rb").read(2000)

    # Plotly's own modebar has the camera button too, and no "Share chart" (an upload to Plotly Cloud)
    page.locator("#view-head .plot").hover()
    assert page.locator('#view-head .modebar-btn[data-title^="Share"]').count() == 0
    with page.expect_download() as d:
        page.locator('#view-head .modebar-btn[data-title="Download plot as a PNG"]').click()
    assert d.value.suggested_filename.endswith(".png")

    # the model view exports its canvas grid; the line view its SVG
    page.locator('#tabs a[data-view="model"]').click()
    wait_drawn(page, "model")
    expect(page.locator("#export-svg")).to_be_disabled()
    assert open(_download(page, "#export-png").path(), "rb").read(4) == b"\x89PNG"
    page.locator('#tabs a[data-view="lines"]').click()
    wait_drawn(page, "lines")
    assert b"<svg" in open(_download(page, "#export-svg").path(), "rb").read(300)
    assert open(_download(page, "#export-png").path(), "rb").read(4) == b"\x89PNG"
    lines_csv = list(csv.reader(io.StringIO(open(_download(page, "#export-csv").path(), encoding="utf-8").read())))
    assert lines_csv[0] == ["layer", "head", "query_index", "query_token", "key_index", "key_token", "weight"]
    assert console_errors == []


def test_keyboard_chips_and_thumbnails(page: Page, console_errors):
    open_app(page, "head", text=TEXT)
    # Tab from the text box reaches the controls, then the chips toolbar (one tab stop)
    page.locator("#text").focus()
    seen = []
    for _ in range(12):
        page.keyboard.press("Tab")
        seen.append(page.evaluate("document.activeElement.id || document.activeElement.className"))
        if "chip" in seen[-1]:
            break
    assert "layer" in seen and "head" in seen and "chip" in seen[-1]
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"                                        # visible focus
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.dataset.index") == "2"
    page.keyboard.press("Enter")                                    # pins (default click mode)
    wait_drawn(page, "head")
    assert "pin=2" in page.url
    assert page.evaluate("document.activeElement.dataset.index") == "2"   # focus kept after redraw
    page.keyboard.press("m")                                        # masks
    wait_drawn(page, "head")
    assert "mask_tokens=2" in page.url
    # a thumbnail is a link: focus it and press Enter
    page.locator('#tabs a[data-view="model"]').focus()
    page.keyboard.press("Enter")
    wait_drawn(page, "model")
    page.locator('#view-model a.thumb[data-layer="2"][data-head="4"]').focus()
    page.keyboard.press("Enter")
    wait_drawn(page, "head")
    assert "layer=2" in page.url and "head=4" in page.url
    # every interactive element has an accessible name
    unnamed = page.evaluate("""() => [...document.querySelectorAll('button, select, input, textarea, a[href]')]
      .filter(e => !e.hidden && e.offsetParent !== null)
      .filter(e => !(e.getAttribute('aria-label') || e.labels?.length || e.textContent.trim() || e.title))
      .map(e => e.outerHTML.slice(0, 80))""")
    assert unnamed == []
    assert console_errors == []


def test_api_error_shown_in_live_region(page: Page, console_errors):
    page.goto("/?text=" + "a" * 20_001)
    err = page.locator("#error")
    expect(err).to_be_visible()
    expect(err).to_have_attribute("role", "alert")
    expect(err).to_contain_text("20000")
    # the browser logs the 413 response itself; nothing else may go wrong
    assert [e for e in console_errors if "status of 413" not in e] == []
    # fixing the text clears the error
    page.fill("#text", "short text")
    page.get_by_role("button", name="Run").click()
    wait_drawn(page, "head")
    expect(err).to_be_hidden()


def test_large_text_presentation_mode(page: Page, console_errors):
    open_app(page, "summary", text=TEXT)
    small = page.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)")
    page.get_by_role("button", name="Large text").click()
    wait_drawn(page, "summary")
    assert "large=1" in page.url
    expect(page.get_by_role("button", name="Large text")).to_have_attribute("aria-pressed", "true")
    assert page.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)") > small
    screenshot(page, "summary-large")
    assert console_errors == []


def test_knocked_out_heads_bar_and_the_servers_ablation_modes(page: Page, console_errors):
    """The ablation menu lists the server's modes (boot.ablations, from the API's schema); the state takes only
    those; a head is restored from the bar."""
    open_app(page, "head", text=TEXT, ablate="1.2,0.3", ablation="mean")
    bar = page.locator("#ablation-bar")
    expect(bar).to_be_visible()
    boot = page.evaluate("JSON.parse(document.getElementById('boot').textContent).ablations")
    assert [a["id"] for a in boot] == ["zero", "mean"]
    assert page.locator("#ablation option").evaluate_all("os => os.map(o => [o.value, o.textContent])") == \
        [["zero", "zeros"], ["mean", "their mean over the text"]]
    expect(page.locator("#ablation")).to_have_value("mean")
    expect(bar.locator("button.chip-ablated")).to_have_text(["L0H3 ×", "L1H2 ×"])
    bar.get_by_role("button", name="Restore layer 0 head 3").click()
    wait_drawn(page, "head")
    assert "ablate=1.2" in page.url and "ablation=mean" in page.url
    page.select_option("#ablation", "zero")
    wait_drawn(page, "head")
    assert "ablation=" not in page.url                  # the default is left out of the URL
    open_app(page, "head", text=TEXT, ablate="1.2", ablation="nonsense")
    expect(page.locator("#ablation")).to_have_value("zero")
    assert "ablation=" not in page.url
    page.get_by_role("button", name="Restore all heads").click()
    wait_drawn(page, "head")
    expect(bar).to_be_hidden()
    assert "ablate=" not in page.url
    assert console_errors == []
