"""The page's circuit tools (docs/qk-page.md): "why does this head attend here?" on a SmolLM2 head-view cell draws the
QK attribution's top pairs as bars equal to POST /api/qk's, each named in words; the logit lens view draws its grid
and head lens for SmolLM2 (equal to POST /api/lens) and tells MiniLM it has no unembedding; the circuits view draws
both maps (equal to POST /api/circuits) and a click on a head makes it the page's; the lesson's page on the
induction head's "why" opens, and its sentence's numbers are the API's. No console errors anywhere."""
from __future__ import annotations

import csv
import io
import re
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Page, expect

from .conftest import open_app, plot_point, screenshot, wait_drawn

pytestmark = pytest.mark.browser
TEXT = "The cat sat on the mat. The cat"               # SmolLM2: 9 tokens; the second "cat" is the last
HEAD_PLOT = "#view-head [data-part=plot]"
WHY = "#view-head [data-part=why]"
LESSON_TEXT = "Harry Potter met Ron Weasley at school. Then Harry Potter"

# a Plotly plot's first trace: what it draws
TRACE_JS = """(sel) => { const t = document.querySelector(sel).data[0];
  return {x: t.x, y: t.y, z: t.z, text: t.text, colors: t.marker?.color}; }"""


def label(tok: str) -> str:
    """A token as the page writes it (dom.js tokenLabel)."""
    return "∅" if tok == "" else re.sub(r"\s", "␣", tok)


def component_at(c: dict, tok: str) -> str:
    """A component of the residual stream at a token, in the page's words (why.js componentAt)."""
    t = f"“{label(tok)}”"
    return {"embed": f"embedding of {t}", "pos_embed": f"position embedding at {t}",
            "type_embed": f"segment embedding at {t}", "bias": f"biases at {t}"}.get(c["kind"], f"{c['name']} output at {t}")


def pair_words(ans: dict, p: dict) -> str:
    return (f"{component_at(ans['components'][p['query']], ans['tokens'][ans['query']])} × "
            f"{component_at(ans['components'][p['key']], ans['tokens'][ans['key']])}")


def post(base: str, path: str, **body) -> dict:
    r = httpx.post(base + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def goto(page: Page, base: str, view: str, **state) -> None:
    page.goto(base + "/?" + urlencode({"model": "smollm2", "text": TEXT, "view": view, **state}))
    wait_drawn(page, view, timeout=120_000)


def trace(page: Page, sel: str) -> dict:
    return page.evaluate(TRACE_JS, sel)


def assert_bars(page: Page, ref: dict) -> None:
    """The why chart draws ref's top pairs: their values, their words, orange for positive and purple for negative."""
    got = trace(page, f"{WHY} [data-part=plot]")
    assert got["x"] == pytest.approx([p["value"] for p in ref["top"]], abs=1e-12)
    assert got["y"] == [pair_words(ref, p) for p in ref["top"]]
    assert len({c for c, p in zip(got["colors"], ref["top"]) if p["value"] >= 0}) <= 1
    assert len(set(got["colors"])) == len({p["value"] >= 0 for p in ref["top"]})


def test_why_draws_the_qk_attribution_of_a_smollm2_cell(page: Page, live_server_smollm2, console_errors):
    base = live_server_smollm2
    layer, head, q, k = 4, 1, 8, 2                        # the second "cat" (query) and "sat", after the first (key)
    goto(page, base, "head", layer=layer, head=head, pin=q)
    expect(page.locator(WHY)).to_be_hidden()
    # a click on a cell of the pinned row asks why the head attends there
    page.locator(HEAD_PLOT).scroll_into_view_if_needed()
    page.mouse.click(*plot_point(page, HEAD_PLOT, k, q))
    wait_drawn(page, "head", timeout=120_000)
    assert f"why={q}%2C{k}" in page.url and f"pin={q}" in page.url
    why = page.locator(WHY)
    expect(why).to_have_attribute("data-drawn", "1")
    ref = post(base, "/api/qk", model="smollm2", text=TEXT, layer=layer, head=head, query=q, key=k)
    assert ref["tokens"][q] == ref["tokens"][1] == "␣cat" and len(ref["tokens"]) == 9
    assert len(ref["top"]) == 12
    assert_bars(page, ref)
    expect(why.locator("h3")).to_have_text(f"Why does query {q} “{label(ref['tokens'][q])}” attend to key {k} "
                                           f"“{label(ref['tokens'][k])}”?")
    note = why.locator("[data-part=note]")
    expect(note).to_contain_text(f"The top 12 pairs explain {100 * ref['explained']:.1f} % of the score's absolute mass")
    expect(note).to_contain_text(f"{ref['score']:.4f}".replace("-", "−"))
    expect(note).to_contain_text(f"the model's own scaled score is {ref['scaled']:.4f}".replace("-", "−"))
    assert ref["score"] == pytest.approx(ref["scaled"], abs=1e-3)
    expect(page.locator(f'#view-head [data-part=pinned] tr.why[data-key="{k}"]')).to_have_count(1)
    screenshot(page, "why-smollm2")

    # the pinned list's "Why?" of another key: the chart follows (the link names the cell)
    page.locator('#view-head [data-part=pinned] button[data-why-key="0"]').click()
    wait_drawn(page, "head", timeout=120_000)
    assert f"why={q}%2C0" in page.url
    assert_bars(page, post(base, "/api/qk", model="smollm2", text=TEXT, layer=layer, head=head, query=q, key=0))
    page.locator("#why-close").click()
    wait_drawn(page, "head", timeout=120_000)
    assert "why=" not in page.url and f"pin={q}" in page.url
    expect(why).to_be_hidden()
    assert console_errors == []


def test_lens_view_draws_the_grid_and_the_head_lens(page: Page, live_server_smollm2, console_errors):
    base = live_server_smollm2
    goto(page, base, "lens", layer=3, head=2)
    ref = post(base, "/api/lens", model="smollm2", text=TEXT, top=5, head_lens=[3, 2])
    R, T = len(ref["rows"]), len(ref["tokens"])
    assert (R, T) == (31, 9) and ref["rows"][0] == "embed" and ref["rows"][-1] == "L29"
    plot = "#view-lens [data-part=plot]"
    got = trace(page, plot)
    assert (len(got["z"]), len(got["z"][0])) == (R, T)
    # the last row (the model's own prediction) at the last position: its top token and probability
    expect(page.locator(plot)).to_have_attribute("data-last-top", ref["top_tokens"][-1][-1][0])
    assert got["z"][-1][-1] == pytest.approx(ref["top_probs"][-1][-1][0], abs=1e-12)
    assert got["text"][-1][-1] == label(ref["top_tokens"][-1][-1][0])[:8]
    assert [r[0] for r in got["z"]] == pytest.approx([ref["top_probs"][r][0][0] for r in range(R)], abs=1e-12)
    # the head lens of (3, 2): a row per position, its promoted and suppressed tokens
    rows = page.locator("#view-lens [data-part=heads] tbody tr")
    expect(rows).to_have_count(T)
    hl = ref["head_lens"]
    expect(rows.nth(T - 1).locator("td.promoted .tok").first).to_contain_text(label(hl["promoted_tokens"][-1][0]))
    expect(rows.nth(T - 1).locator("td.suppressed .tok").first).to_contain_text(label(hl["suppressed_tokens"][-1][0]))
    screenshot(page, "lens-smollm2")
    # colour by the actual next token: none after the last position
    page.select_option("#lens-colour", "next")
    wait_drawn(page, "lens", timeout=120_000)
    assert "lens=next" in page.url
    got = trace(page, plot)
    assert all(row[-1] is None for row in got["z"])
    assert got["z"][-1][:-1] == pytest.approx(ref["next_probs"][-1][:-1], abs=1e-12)
    # a click on a row makes its layer the page's: the head lens follows
    page.locator(plot).scroll_into_view_if_needed()
    page.mouse.click(*plot_point(page, plot, 2, ref["rows"].index("L7")))
    wait_drawn(page, "lens", timeout=120_000)
    assert "layer=7" in page.url
    expect(page.locator("#view-lens [data-part=heads]")).to_have_attribute("data-layer", "7")
    assert console_errors == []


def test_lens_view_tells_a_model_without_an_unembedding(page: Page, console_errors):
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/api/lens" in r.url else None)
    open_app(page, "lens", model="minilm", text="the cat sat")
    # the tab is disabled with the capability record's reason; opened, the view says it and asks nothing
    expect(page.locator('#tabs a[data-view="lens"]')).to_have_attribute("aria-disabled", "true")
    note = page.locator("#view-lens .note.refused")
    expect(note).to_contain_text("no unembedding: no tokens can be read out of its stream")
    expect(note.locator("a").first).to_be_visible()
    assert page.locator("#view-lens .js-plotly-plot").count() == 0 and sent == []
    assert console_errors == []


def test_circuits_view_draws_both_maps_and_a_click_picks_a_head(page: Page, live_server, console_errors):
    open_app(page, "circuits", model="tiny-gpt", text="the cat sat")
    ref = post(live_server, "/api/circuits", model="tiny-gpt")
    L, H = ref["layers"], ref["heads"]
    ov_plot = "#view-circuits [data-part=copying] [data-part=plot]"
    comp_plot = "#view-circuits [data-part=composition] [data-part=plot]"
    ov = trace(page, ov_plot)
    assert ov["z"] == ref["ov_copying"]
    comp = trace(page, comp_plot)
    names = [f"L{f // H}H{f % H}" for f in range(L * H)]
    assert comp["x"] == names and comp["y"] == names
    for w in range(L * H):                          # K-composition (the default), left out where it cannot be
        for r in range(L * H):
            assert comp["z"][w][r] == (ref["composition_k"][w][r] if r // H > w // H else None)
    hover = page.evaluate(f"document.querySelector('{comp_plot}').data[0].hovertemplate")
    assert hover.startswith("%{y} → %{x}, K-composition")
    screenshot(page, "circuits-tiny-gpt")
    # the view's CSV: the copying map (a row per layer), then the composition map shown (a row per writer)
    with page.expect_download() as dl:
        page.locator("#export-csv").click()
    rows = list(csv.reader(io.StringIO(open(dl.value.path(), encoding="utf-8").read())))
    assert rows[0] == ["ov_copying"] and rows[1] == ["layer"] + [f"head {h}" for h in range(H)]
    assert rows[2 + L + 1] == ["composition_k"] and rows[2 + L + 2][1:] == names
    assert float(rows[2 + L + 3][1 + H]) == pytest.approx(ref["composition_k"][0][H], abs=1e-7)
    # a head of the copying map becomes the page's head
    page.locator(ov_plot).scroll_into_view_if_needed()
    page.mouse.click(*plot_point(page, ov_plot, 2, 1))
    wait_drawn(page, "circuits")
    assert "layer=1" in page.url and "head=2" in page.url
    # Q-composition: a cell's reader becomes the page's head
    page.select_option("#circuits-composition", "q")
    wait_drawn(page, "circuits")
    assert "composition=q" in page.url
    assert trace(page, comp_plot)["z"][1][H + 3] == ref["composition_q"][1][H + 3]
    page.mouse.click(*plot_point(page, comp_plot, 3 * H, 1))          # writer L0H1, reader L3H0
    wait_drawn(page, "circuits")
    assert "layer=3" in page.url and "head=0" in page.url
    assert console_errors == []


def test_the_lesson_asks_why_the_induction_head_attends_to_met(page: Page, api, console_errors):
    open_app(page, "head", model="induction", text=LESSON_TEXT, layer=1, head=0, lesson=8)
    page.locator("#lesson").get_by_role("link", name="Next ▶").click()
    wait_drawn(page, "head")
    lesson = page.locator("#lesson")
    expect(lesson).to_contain_text("Lesson · 9 of 9")
    expect(lesson.locator("h2")).to_have_text("Induction, part 3: why the head looks at “met”")
    assert "why=11%2C3" in page.url and "pin=11" in page.url
    ref = api("/api/qk", model="induction", text=LESSON_TEXT, layer=1, head=0, query=11, key=3)
    assert (ref["tokens"][11], ref["tokens"][3]) == ("potter", "met")
    expect(page.locator(WHY)).to_have_attribute("data-drawn", "1")
    assert_bars(page, ref)
    # the sentence's numbers are the answer's: the key side's largest part is L0H0's output at "met"
    k = max(range(len(ref["components"])), key=lambda i: abs(ref["key_sums"][i]))
    assert ref["components"][k]["name"] == "L0H0"
    expect(page.locator(WHY)).to_have_attribute("data-key-component", "L0H0")
    text = lesson.locator(".lesson-text").inner_text()
    assert f"{ref['key_sums'][k]:.1f}" in text and f"{ref['score']:.1f}" in text
    screenshot(page, "lesson-9-why")
    assert console_errors == []
