"""Each view on the default model: it draws, reacts to its controls, and shows the API's numbers."""
from __future__ import annotations

import math
import shutil
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import Page, expect

from .conftest import EXAMPLE, ROOT, open_app, plot_point, screenshot, update_docs_screenshot, wait_drawn

pytestmark = pytest.mark.browser
TEXT = "The cat sat on the mat because it was tired."
HEAD_PLOT = "#view-head [data-part=plot]"


def pinned_weights(page) -> dict[int, float]:
    rows = page.locator("#view-head [data-part=pinned] tr[data-key]")
    return {int(k): float(w) for k, w in rows.evaluate_all("rs => rs.map(r => [r.dataset.key, r.dataset.weight])")}


def test_head_view_type_pick_hover_pin(page: Page, console_errors, api):
    open_app(page)
    expect(page.locator(f"{HEAD_PLOT} .main-svg").first).to_be_visible()
    expect(page.locator("#text")).to_have_value(EXAMPLE)
    assert page.locator("#chips .chip").count() == len(api(layers=[0], heads=[0], include=["summary"])["tokens"])

    # type a new text and submit
    page.fill("#text", TEXT)
    page.get_by_role("button", name="Run").click()
    wait_drawn(page, "head")
    assert "text=The+cat+sat" in page.url
    # pick layer and head
    page.select_option("#layer", "3")
    wait_drawn(page, "head")
    page.select_option("#head", "7")
    wait_drawn(page, "head")
    expect(page.locator("#view-head")).to_have_attribute("data-layer", "3")
    expect(page.locator("#view-head")).to_have_attribute("data-head", "7")
    ref = api(text=TEXT, layers=[3], heads=[7], include=["attention"])
    tokens, att = ref["tokens"], ref["attention"][0][0]
    chips = page.locator("#chips .chip .tok").all_inner_texts()
    assert chips == [t.replace(" ", "␣") for t in tokens]

    # hover a cell with the real mouse: the readout gives the exact weight
    page.locator(HEAD_PLOT).scroll_into_view_if_needed()
    page.mouse.move(*plot_point(page, HEAD_PLOT, 5, 2))
    readout = page.locator("#view-head [data-part=readout]")
    expect(readout).to_have_attribute("data-key", "5")
    assert readout.get_attribute("data-query") == "2"
    assert float(readout.get_attribute("data-weight")) == pytest.approx(att[2][5], abs=1e-6)
    assert f"{att[2][5]:.4f}"[:5] in readout.inner_text()          # shown with 4+ decimals
    tip = page.locator("#view-head [data-part=tip]")
    expect(tip).to_contain_text(f"query 2 “{tokens[2]}” → key 5 “{tokens[5]}”")
    expect(tip).to_contain_text("weight")

    # pin by clicking a token chip: its weights listed, equal to the API's
    page.locator('#chips .chip[data-index="4"]').click()
    wait_drawn(page, "head")
    assert "pin=4" in page.url
    expect(page.locator("#view-head [data-part=pinned]")).to_have_attribute("data-pin", "4")
    expect(page.locator('#chips .chip[data-index="4"]')).to_have_attribute("aria-pressed", "true")
    got = pinned_weights(page)
    assert sorted(got) == list(range(len(tokens)))
    for k, w in got.items():
        assert w == pytest.approx(att[4][k], abs=1e-6)
    # pin by clicking a heatmap row
    page.locator(HEAD_PLOT).evaluate("e => e.scrollIntoView()")
    page.mouse.click(*plot_point(page, HEAD_PLOT, 1, 6))
    wait_drawn(page, "head")
    expect(page.locator("#view-head [data-part=pinned]")).to_have_attribute("data-pin", "6")
    assert pinned_weights(page)[1] == pytest.approx(att[6][1], abs=1e-6)
    # the README's picture: the example sentence, "it" pinned in a head that links it to "animal"
    page.set_viewport_size({"width": 1366, "height": 1330})
    open_app(page, "head", text=EXAMPLE, layer=3, head=1, pin=10)
    assert pinned_weights(page)[2] > 0.5
    screenshot(page, "head", full_page=False)
    if update_docs_screenshot():
        shutil.copy(ROOT / "test-artifacts" / "head.png", ROOT / "docs" / "screenshot.png")
    assert console_errors == []


def test_hide_special_renormalises_rows(page: Page, console_errors, api):
    open_app(page, "head", text=TEXT, layer=2, head=5, pin=3)
    ref = api(text=TEXT, layers=[2], heads=[5], include=["attention"])
    row, special = ref["attention"][0][0][3], ref["special"]
    page.get_by_label("Hide [CLS] / [SEP]").check()
    wait_drawn(page, "head")
    assert "hide_special=1" in page.url
    expect(page.locator("#view-head [data-part=note]")).to_contain_text("renormalised")
    kept = [k for k in range(len(row)) if not special[k]]
    mass = sum(row[k] for k in kept)
    rows = page.locator("#view-head [data-part=pinned] tr[data-key]").evaluate_all(
        "rs => rs.map(r => [Number(r.dataset.key), Number(r.dataset.weight), Number(r.dataset.raw)])")
    assert [k for k, _, _ in rows] == kept
    for k, w, raw in rows:
        assert raw == pytest.approx(row[k], abs=1e-6)
        assert w == pytest.approx(row[k] / mass, abs=1e-5)
    ticks = page.locator(f"{HEAD_PLOT} .xtick text").all_text_contents()
    assert "[CLS]" not in ticks and "[SEP]" not in ticks
    # answers are cached in memory: going back to a head or a view fetches nothing
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/api/" in r.url else None)
    page.select_option("#head", "6")
    wait_drawn(page, "head")
    assert len(sent) == 1
    page.select_option("#head", "5")
    wait_drawn(page, "head")
    page.locator('#tabs a[data-view="summary"]').click()
    wait_drawn(page, "summary")
    page.go_back()
    wait_drawn(page, "head")
    assert len(sent) == 2          # the summary's head-finding scores; back at the head view, nothing
    assert console_errors == []


def test_model_view_thumbnail_opens_head(page: Page, console_errors, api):
    open_app(page, "model", text=TEXT)
    thumbs = page.locator("#view-model a.thumb")
    expect(thumbs).to_have_count(72)
    ref = api(text=TEXT, include=["attention"])
    for l, hd in [(0, 0), (3, 7), (5, 11)]:
        mx = max(max(r) for r in ref["attention"][l][hd])
        got = float(page.locator(f'#view-model a.thumb[data-layer="{l}"][data-head="{hd}"]').get_attribute("data-max"))
        assert got == pytest.approx(mx, abs=2e-3)      # float16 thumbnails
    screenshot(page, "model")
    page.locator('#view-model a.thumb[data-layer="3"][data-head="7"]').click()
    wait_drawn(page, "head")
    assert "view=head" in page.url and "layer=3" in page.url and "head=7" in page.url
    expect(page.locator("#layer")).to_have_value("3")
    expect(page.locator("#head")).to_have_value("7")
    expect(page.locator("#view-head")).to_have_attribute("data-layer", "3")
    expect(page.locator("#tabs a[aria-current=page]")).to_have_text("Head")
    # back returns to the model view
    page.go_back()
    wait_drawn(page, "model")
    assert console_errors == []


def test_summary_view_stat_and_click(page: Page, console_errors, api):
    open_app(page, "summary", text=TEXT)
    expect(page.locator("#stat-field")).to_be_visible()
    page.select_option("#stat", "previous_token_mass")
    wait_drawn(page, "summary")
    assert "stat=previous_token_mass" in page.url
    ref = api(text=TEXT, include=["summary"])["summary"]["previous_token_mass"]
    cells = page.locator("#view-summary td[data-value]").evaluate_all(
        "cs => cs.map(c => [Number(c.dataset.layer), Number(c.dataset.head), Number(c.dataset.value)])")
    assert len(cells) == 72
    for l, hd, v in cells:
        assert v == pytest.approx(ref[l][hd], abs=1e-6)
    screenshot(page, "summary")
    plot = "#view-summary [data-part=plot]"
    page.locator(plot).scroll_into_view_if_needed()
    page.mouse.click(*plot_point(page, plot, 5, 4))       # head 5 (x), layer 4 (y)
    wait_drawn(page, "head")
    assert "layer=4" in page.url and "head=5" in page.url
    assert console_errors == []


def test_entropy_view_matches_api(page: Page, console_errors, api):
    open_app(page, "entropy", text=TEXT, layer=2, head=3)
    ref = api(text=TEXT, layers=[2], include=["entropy"])
    rows = page.locator("#view-entropy tr[data-query]").evaluate_all(
        "rs => rs.map(r => [Number(r.dataset.query), Number(r.dataset.entropy), Number(r.dataset.normalized)])")
    assert len(rows) == len(ref["tokens"])
    for q, e, ne in rows:
        assert e == pytest.approx(ref["entropy"][0][3][q], abs=1e-6)
        assert ne == pytest.approx(ref["normalized_entropy"][0][3][q], abs=1e-6)
        assert 0 <= ne <= 1 + 1e-6 and 0 <= e <= math.log(len(ref["tokens"])) + 1e-5
    assert page.locator("#view-entropy .scatterlayer .trace").count() == 2
    page.get_by_label("Show every head of layer 2").check()
    wait_drawn(page, "entropy")
    assert "all_heads=1" in page.url
    assert page.locator("#view-entropy .scatterlayer .trace").count() == 24
    screenshot(page, "entropy")
    assert console_errors == []


def test_stages_view_causal_toggle_and_steps(page: Page, console_errors, api):
    text = "the cat sat on the mat"
    open_app(page, "stages", text=text, layer=1, head=4)
    stage = "#view-stages [data-stage={}] td[data-q='{}'][data-k='{}']"
    expect(page.locator("#view-stages")).to_have_attribute("data-causal", "false")
    assert "−∞" not in page.locator("#view-stages [data-stage=masked]").inner_text()
    # causal on: the encoder as a what-if
    page.locator("#causal").check()
    wait_drawn(page, "stages")
    assert "causal=1" in page.url
    expect(page.locator("#view-stages")).to_have_attribute("data-causal", "true")
    expect(page.locator("#view-stages [data-part=note]")).to_contain_text("What-if")
    ref = api("/api/stages", text=text, layer=1, head=4, causal=True)
    T = len(ref["tokens"])
    assert page.locator(stage.format("masked", 0, 1)).inner_text() == "−∞"
    assert page.locator(stage.format("probs", 0, 1)).inner_text() == "0.0000"
    for q in range(T):
        for k in range(T):
            got = float(page.locator(stage.format("probs", q, k)).get_attribute("data-value"))
            assert got == pytest.approx(ref["probs"][q][k], abs=1e-6)
        assert float(page.locator(stage.format("scores", q, 0)).get_attribute("data-value")) == pytest.approx(
            ref["scores"][q][0], rel=1e-5, abs=1e-5)
    expect(page.locator("#view-stages [data-stage=scaled] .explain")).to_contain_text("1/√32")
    # the stepper reveals one step at a time (5: the scores, 6: scaled, 9: softmax)
    page.locator("#view-stages button[data-step='5']").click()
    wait_drawn(page, "stages")
    expect(page.locator("#view-stages [data-stage=scores]")).to_be_visible()
    expect(page.locator("#view-stages [data-stage=scaled]")).to_have_count(0)
    page.get_by_role("button", name="Next step ▶").click()
    wait_drawn(page, "stages")
    expect(page.locator("#view-stages [data-stage=scaled]")).to_be_visible()
    expect(page.locator("#view-stages [data-stage=probs]")).to_have_count(0)
    page.get_by_role("button", name="All steps").click()
    wait_drawn(page, "stages")
    # the causal teaching model: causal by default, toggle off as a what-if
    page.select_option("#model", "tiny-gpt")
    wait_drawn(page, "stages")
    expect(page.locator("#causal")).to_be_checked()
    expect(page.locator("#view-stages")).to_have_attribute("data-causal", "true")
    screenshot(page, "stages")
    page.locator("#causal").uncheck()
    wait_drawn(page, "stages")
    expect(page.locator("#view-stages")).to_have_attribute("data-causal", "false")
    # a model switch opens the new model's clearest head on the text (issue 51), as a fresh visit does
    q = parse_qs(urlparse(page.url).query)
    layer, head = int(q["layer"][0]), int(q["head"][0])
    ref = api("/api/stages", model="tiny-gpt", text=text, layer=layer, head=head, causal=False)
    assert float(page.locator(stage.format("probs", 0, 2)).get_attribute("data-value")) == pytest.approx(
        ref["probs"][0][2], abs=1e-6)
    assert console_errors == []


def test_line_view_hover_focuses_token(page: Page, console_errors, api):
    open_app(page, "lines", text=TEXT, layer=4)
    svg = page.locator("#view-lines svg.lines-svg")
    expect(svg).to_be_visible()
    assert page.locator("#view-lines .overview path").count() > 20
    expect(page.locator("#view-lines input[type=checkbox]:checked")).to_have_count(12)
    ref = api(text=TEXT, layers=[4], include=["attention"])
    i = ref["tokens"].index("it")
    page.locator(f'#view-lines .tok-label[data-side="q"][data-index="{i}"]').hover()
    aside = page.locator("#view-lines [data-part=focus]")
    expect(aside).to_have_attribute("data-focus", f"q{i}")
    items = aside.locator(".w").evaluate_all(
        "ws => ws.map(w => [Number(w.dataset.head), Number(w.dataset.other), Number(w.dataset.weight)])")
    assert len(items) == 12 * 5
    for hd, k, w in items:
        assert w == pytest.approx(ref["attention"][0][hd][i][k], abs=2e-3)   # float16
    assert page.locator("#view-lines .focus-lines line").count() >= 12
    screenshot(page, "lines")
    # keep only two heads
    page.get_by_role("button", name="Only the current head").click()
    wait_drawn(page, "lines")
    assert "heads=0" in page.url
    page.locator('#view-lines input[data-head="9"]').check()
    wait_drawn(page, "lines")
    expect(page.locator("#view-lines")).to_have_attribute("data-heads", "0,9")
    assert console_errors == []
