"""The page at real lengths (issue 15): a ~250-token paragraph at 1400 x 900 and at phone width; honest colours
(a fixed 0–1 scale), masked cells drawn as masked with a what-if banner, drafts never lost, sentence pairs told
apart, the summary's ranking, and the warning past the length a model was trained on."""
from __future__ import annotations

import json
import struct
import zlib
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Page, expect

from attnscope.analysis import statistics as stats

from .conftest import open_app, plot_point, screenshot, wait_drawn

pytestmark = pytest.mark.browser
HEAD_PLOT = "#view-head [data-part=plot]"
PARA = ("Attention heads in small encoders often specialise: some look at the previous token, some at the next one, "
        "and many park their weight on the separator when they have nothing better to do. Researchers who study these "
        "patterns usually start from a single sentence, but real documents are longer, and the picture changes as the "
        "text grows. A head that tracks syntax in a short clause may spread its attention thinly over a paragraph, "
        "while another head that looked idle becomes the one that links a pronoun to the noun it refers to. To see "
        "this, one needs the whole matrix at a readable size, the exact numbers under the mouse, and colours that mean "
        "the same thing in every head. Otherwise a weight of one percent can look like a bright stripe, and a "
        "position artefact can pass for a finding. The same care applies to masks: a causal what-if must look "
        "different from a head that simply ignores the future, and hidden tokens must be marked as hidden rather than "
        "drawn as quiet zeros. Finally, a draft typed into the box should never vanish because a control changed. "
        "Each of these is a small thing; together they decide whether the picture can be trusted.")   # 245 tokens
TEXT = "The cat sat on the mat because it was tired."
PAIR = ("The quick brown fox jumped over the lazy dog.", "It was very tired afterwards.")


def label(tok: str) -> str:
    """A token as the page labels it (whitespace made visible)."""
    return "∅" if tok == "" else "".join("␣" if c.isspace() else c for c in tok)


def pixel(page, x: float, y: float) -> tuple[int, int, int]:
    """RGB of the screen pixel at page coordinates (x, y): a 1 x 1 screenshot, decoded by hand (no PIL)."""
    png = page.screenshot(clip={"x": int(x), "y": int(y), "width": 1, "height": 1})
    pos, data, kind = 8, b"", 0
    while pos < len(png):
        n, tag = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + n]
        if tag == b"IHDR":
            kind = body[9]                                   # colour type: 2 RGB, 6 RGBA
        elif tag == b"IDAT":
            data += body
        pos += 12 + n
    raw = zlib.decompress(data)
    assert kind in (2, 6)
    return tuple(raw[1:4])                                   # one pixel: every PNG filter leaves it as it is


def luminance(rgb) -> float:
    r, g, b = rgb
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def plot_js(page, expr: str):
    return page.evaluate(f"(() => {{ const gd = document.querySelector('{HEAD_PLOT}'); return {expr}; }})()")


@pytest.fixture(scope="session")
def big_viewport():
    return {"width": 1400, "height": 900}


def test_head_view_at_250_tokens(page: Page, console_errors, api, big_viewport):
    page.set_viewport_size(big_viewport)
    open_app(page, "head", text=PARA, layer=1, head=8)
    ref = api(text=PARA, layers=[1], heads=[8], include=["attention"])
    tokens, att = ref["tokens"], ref["attention"][0][0]
    T = len(tokens)
    assert 240 <= T <= 260
    # the plot spans the panel's width: the element and its data area
    panel = page.locator("#view-area").bounding_box()["width"]
    assert page.locator(HEAD_PLOT).bounding_box()["width"] >= 0.75 * panel
    assert plot_js(page, "gd._fullLayout.xaxis._length") >= 0.75 * panel
    screenshot(page, "real-head-250", full_page=False)

    # hovering a cell shows both tokens and the exact weight, never a row/column number or a tick label
    q, k = 120, 117
    page.locator(HEAD_PLOT).scroll_into_view_if_needed()
    page.mouse.move(*plot_point(page, HEAD_PLOT, k, q))
    tip = page.locator("#view-head [data-part=tip]")
    expect(tip).to_be_visible()
    expect(tip).to_have_attribute("data-query", str(q))
    text = tip.inner_text()
    assert f"query {q} “{label(tokens[q])}”" in text and f"key {k} “{label(tokens[k])}”" in text
    assert "row" not in text and "column" not in text
    readout = page.locator("#view-head [data-part=readout]")
    assert float(readout.get_attribute("data-weight")) == pytest.approx(att[q][k], abs=1e-6)

    # with the fixed scale (the default) a 0.013 weight is dark, a weight near 1 bright
    assert plot_js(page, "gd.data[gd.data.length - 1].zmax") == 1
    small = min(((abs(w - 0.013), (a, b)) for a, row in enumerate(att) for b, w in enumerate(row)
                 if 30 < a < T - 30 and 30 < b < T - 30 and abs(a - b) > 3))[1]
    assert att[small[0]][small[1]] == pytest.approx(0.013, abs=0.004)
    page.mouse.move(0, 0)
    expect(tip).to_be_hidden()
    assert luminance(pixel(page, *plot_point(page, HEAD_PLOT, small[1], small[0]))) < 0.25
    big = max((w, (a, b)) for a, row in enumerate(att) for b, w in enumerate(row))[1]
    assert luminance(pixel(page, *plot_point(page, HEAD_PLOT, big[1], big[0]))) > 0.6

    # zooming to <= 40 tokens brings every token's label back
    lo, hi = 100, 135
    x0, y0 = plot_point(page, HEAD_PLOT, lo - 0.3, lo - 0.3)
    x1, y1 = plot_point(page, HEAD_PLOT, hi + 0.3, hi + 0.3)
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
    page.mouse.move(x1, y1, steps=5)
    page.mouse.up()
    page.wait_for_function(f"""() => {{ const gd = document.querySelector('{HEAD_PLOT}');
      const t = gd._fullLayout.xaxis.tickvals || []; return t.length > 0 && t[0] >= {lo - 1} && t.length <= 40; }}""")
    page.wait_for_timeout(200)
    for ax in ("x", "y"):
        r = plot_js(page, f"gd._fullLayout.{ax}axis.range")
        shown = list(range(int(-(-min(r) // 1)), int(max(r) // 1) + 1))      # the positions inside the range
        assert 30 <= len(shown) <= 40
        ticks = page.locator(f"#view-head .{ax}tick text").all_text_contents()
        assert sorted(ticks) == sorted(label(tokens[i]) for i in shown), ax
    screenshot(page, "real-head-zoomed", full_page=False)

    # per-head scaling is an option, kept in the URL, and names the head's maximum
    page.select_option("#scale", "head")
    wait_drawn(page, "head")
    assert "scale=head" in page.url
    top = max(max(r) for r in att)
    assert plot_js(page, "gd.data[gd.data.length - 1].zmax") == pytest.approx(top, abs=1e-6)
    expect(page.locator("#view-head [data-part=legend]")).to_contain_text(f"scaled to its maximum {top:.3f}")
    with page.expect_download() as d:                          # exports follow the page's choice
        page.locator("#export-json").click()
    scale = json.loads(open(d.value.path(), encoding="utf-8").read())["colour_scale"]
    assert scale["mode"] == "per head" and scale["zmax"] == pytest.approx(top, abs=1e-6)
    assert console_errors == []


def test_draft_runs_when_a_control_changes_and_is_never_lost(page: Page, console_errors, api):
    open_app(page, "head", text=TEXT, layer=0, head=0)
    new = "A completely different sentence about birds."
    sent = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/api/attention") else None)
    page.fill("#text", new)                                   # typed, not run
    expect(page.locator("#draft-note")).to_be_visible()
    page.select_option("#layer", "2")                          # changing a control runs the new text
    wait_drawn(page, "head")
    assert "layer=2" in page.url and "text=A+completely" in page.url
    assert sent and all(body["text"] == new for body in sent)
    expect(page.locator("#text")).to_have_value(new)
    expect(page.locator("#draft-note")).to_be_hidden()
    chips = page.locator("#chips .chip .tok").all_inner_texts()
    assert chips == [label(t) for t in api(text=new, layers=[0], heads=[0], include=["summary"])["tokens"]]

    # a click on a token names a token of the text already run: the new draft stays, visibly pending
    draft = "Another draft, not run yet."
    page.fill("#text", draft)
    page.locator('#chips .chip[data-index="2"]').click()
    wait_drawn(page, "head")
    assert "pin=2" in page.url and "text=A+completely" in page.url
    expect(page.locator("#text")).to_have_value(draft)
    expect(page.locator("#draft-note")).to_be_visible()
    # back and forward do not overwrite it either
    page.go_back()
    wait_drawn(page, "head")
    expect(page.locator("#text")).to_have_value(draft)
    # Ctrl+Enter from the second box runs both
    page.fill("#text-pair", "It flew away.")
    page.locator("#text-pair").press("Control+Enter")
    wait_drawn(page, "head")
    assert "text=Another+draft" in page.url and "text_pair=It+flew+away." in page.url
    expect(page.locator("#draft-note")).to_be_hidden()
    page.fill("#text", TEXT)
    page.locator("#text").press("Control+Enter")
    wait_drawn(page, "head")
    assert "text=The+cat" in page.url
    assert console_errors == []


def test_masked_cells_drawn_as_masked_with_a_what_if_banner(page: Page, console_errors, api):
    open_app(page, "head", text=TEXT, layer=2, head=3)
    expect(page.locator("#whatif")).to_be_hidden()
    expect(page.locator("#view-head [data-part=note]")).to_contain_text("the model's own weights")
    page.locator("#causal").check()
    wait_drawn(page, "head")
    banner = page.locator("#whatif")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("What-if")
    expect(banner).to_contain_text("trained without a causal mask")
    assert "model's own weights" not in page.locator("#view-head [data-part=note]").inner_text()
    expect(page.locator("#view-head [data-part=legend]")).to_contain_text("white: masked")
    # masked cells are not drawn as weights: white, unlike a near-zero weight (dark)
    assert plot_js(page, "gd.data[gd.data.length - 1].z[1][5]") is None
    att = api(text=TEXT, layers=[2], heads=[3], include=["attention"], causal=True)["attention"][0][0]
    assert att[1][5] == 0.0
    page.locator(HEAD_PLOT).scroll_into_view_if_needed()
    assert pixel(page, *plot_point(page, HEAD_PLOT, 5, 1)) == (255, 255, 255)
    low = min((w, b) for b, w in enumerate(att[8][:9]))[1]           # the row's smallest visible weight
    assert luminance(pixel(page, *plot_point(page, HEAD_PLOT, low, 8))) < 0.3
    page.mouse.move(*plot_point(page, HEAD_PLOT, 5, 1))
    expect(page.locator("#view-head [data-part=tip]")).to_contain_text("masked")
    screenshot(page, "real-causal-head", full_page=False)
    # every view: the banner stays; thumbnails leave masked blocks white; the steps table marks them
    page.locator('#tabs a[data-view="model"]').click()
    wait_drawn(page, "model")
    expect(banner).to_be_visible()
    rgb = page.evaluate("""() => { const c = document.querySelector('#view-model a.thumb[data-layer="2"][data-head="3"] canvas');
      return Array.from(c.getContext('2d').getImageData(c.width - 1, 0, 1, 1).data.slice(0, 3)); }""")
    assert rgb == [255, 255, 255]
    page.locator('#tabs a[data-view="stages"]').click()
    wait_drawn(page, "stages")
    assert "masked-cell" in page.locator("#view-stages [data-stage=probs] td[data-q='0'][data-k='1']").get_attribute("class")
    # masked tokens are a what-if too
    page.locator("#causal").uncheck()
    wait_drawn(page, "stages")
    expect(banner).to_be_hidden()
    page.goto("/?" + urlencode({"text": TEXT, "mask_tokens": "3", "view": "head"}))
    wait_drawn(page, "head")
    expect(banner).to_contain_text("Token 3 is hidden as keys")
    assert plot_js(page, "gd.data[gd.data.length - 1].z[5][3]") is None
    assert console_errors == []


def test_sentence_pairs_divider_filters_and_summary(page: Page, console_errors, api):
    open_app(page, "head", text=PAIR[0], text_pair=PAIR[1], layer=3, head=1)
    ref = api(text=PAIR[0], text_pair=PAIR[1], layers=[3], include=["attention", "summary"])
    s = stats.sentences(ref["segments"]).tolist()
    A, B = [i for i, x in enumerate(s) if x == 0], [i for i, x in enumerate(s) if x == 1]
    shapes = plot_js(page, "gd.layout.shapes.filter(s => s.line.dash === 'dash').map(s => [s.x0, s.y0, s.xref, s.yref])")
    assert [B[0] - 0.5, 0, "x", "paper"] in shapes and [0, B[0] - 0.5, "paper", "y"] in shapes
    legend = page.locator("#view-head [data-part=legend]")
    expect(legend).to_contain_text(f"sentence A: tokens 0–{A[-1]}")
    expect(legend).to_contain_text(f"sentence B: tokens {B[0]}–{B[-1]}")
    expect(page.locator("#pairs-field")).to_be_visible()
    page.select_option("#pairs", "ab")
    wait_drawn(page, "head")
    assert "pairs=ab" in page.url
    z = plot_js(page, "gd.data[gd.data.length - 1].z")
    assert len(z) == len(A) and len(z[0]) == len(B)
    assert z[2][1] == pytest.approx(ref["attention"][0][1][A[2]][B[1]], abs=1e-6)
    screenshot(page, "real-pair-ab", full_page=False)
    # the line view follows the filter: within each sentence, a query's lines stay in its sentence
    page.locator('#tabs a[data-view="lines"]').click()
    wait_drawn(page, "lines")
    page.select_option("#pairs", "within")
    wait_drawn(page, "lines")
    expect(page.locator("#view-lines svg line.divider")).to_have_count(2)
    page.locator(f'#view-lines .tok-label[data-side="q"][data-index="{A[3]}"]').hover()
    others = page.locator("#view-lines [data-part=focus] .w").evaluate_all(
        "ws => ws.map(w => [Number(w.dataset.other), Number(w.dataset.weight)])")
    assert others and all(s[o] == 0 for o, w in others if w > 0)
    page.select_option("#pairs", "ab")
    wait_drawn(page, "lines")
    page.locator(f'#view-lines .tok-label[data-side="q"][data-index="{A[3]}"]').hover()
    others = page.locator("#view-lines [data-part=focus] .w").evaluate_all("ws => ws.map(w => Number(w.dataset.other))")
    assert others and all(s[o] == 1 for o in others)

    # the summary: cross-sentence mass, a sortable ranking beside the map
    page.locator('#tabs a[data-view="summary"]').click()
    wait_drawn(page, "summary")
    page.select_option("#stat", "cross_sentence_mass")
    wait_drawn(page, "summary")
    full = api(text=PAIR[0], text_pair=PAIR[1], include=["summary"])["summary"]["cross_sentence_mass"]
    cells = page.locator("#view-summary td[data-value]").evaluate_all(
        "cs => cs.map(c => [Number(c.dataset.layer), Number(c.dataset.head), Number(c.dataset.value)])")
    assert len(cells) == 72
    assert all(v == pytest.approx(full[l][hd], abs=1e-6) for l, hd, v in cells)
    assert [v for _, _, v in cells] == sorted((v for _, _, v in cells), reverse=True)     # largest first
    plot_box = page.locator("#view-summary [data-part=plot]").bounding_box()
    rank_box = page.locator("#view-summary [data-part=rank]").bounding_box()
    assert rank_box["x"] >= plot_box["x"] + plot_box["width"] - 1                       # beside the map
    page.locator('#view-summary button.sort[data-sort="layer"]').click()
    wait_drawn(page, "summary")
    assert "sort=layer" in page.url
    rows = page.locator("#view-summary td[data-value]").evaluate_all("cs => cs.map(c => Number(c.dataset.layer))")
    assert rows == sorted(rows)
    screenshot(page, "real-summary-pair", full_page=False)
    assert console_errors == []


def test_summary_next_token_mass_fixed_scale_and_distance(page: Page, console_errors, api, big_viewport):
    page.set_viewport_size(big_viewport)
    open_app(page, "summary", text=PARA, stat="next_token_mass")
    ref = api(text=PARA, include=["summary"])["summary"]
    best = max((v, (l, hd)) for l, row in enumerate(ref["next_token_mass"]) for hd, v in enumerate(row))
    first = page.locator("#view-summary td[data-value]").first
    assert (int(first.get_attribute("data-layer")), int(first.get_attribute("data-head"))) == best[1] == (1, 8)
    gd = "document.querySelector('#view-summary [data-part=plot]')"
    assert page.evaluate(f"{gd}.data[0].zmax") == 1                                  # masses: fixed 0–1
    page.select_option("#stat", "last_token_mass")
    wait_drawn(page, "summary")
    assert page.evaluate(f"{gd}.data[0].zmax") == 1
    assert max(max(r) for r in ref["last_token_mass"]) < 0.5                          # so nothing is bright
    page.select_option("#scale", "head")
    wait_drawn(page, "summary")
    assert page.evaluate(f"{gd}.data[0].zmax") == pytest.approx(max(max(r) for r in ref["last_token_mass"]), abs=1e-6)
    # mean distance, and divided by the longest possible distance
    page.select_option("#stat", "mean_distance")
    wait_drawn(page, "summary")
    T = page.locator("#chips .chip").count()
    page.get_by_label("Divide by the longest possible distance").check()
    wait_drawn(page, "summary")
    assert "dist_norm=1" in page.url
    cells = page.locator("#view-summary td[data-value]").evaluate_all(
        "cs => cs.map(c => [Number(c.dataset.layer), Number(c.dataset.head), Number(c.dataset.value)])")
    assert all(v == pytest.approx(ref["mean_distance"][l][hd] / (T - 1), abs=1e-6) for l, hd, v in cells)
    assert all(0 <= v <= 1 for _, _, v in cells)
    screenshot(page, "real-summary", full_page=False)

    # model view: hover a thumbnail for its head, block tokens and value
    page.locator('#tabs a[data-view="model"]').click()
    wait_drawn(page, "model")
    thumb = page.locator('#view-model a.thumb[data-layer="1"][data-head="8"]')
    thumb.scroll_into_view_if_needed()
    box = thumb.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.52, box["y"] + box["height"] * 0.5)
    tip = page.locator("#view-model [data-part=tip]")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("layer 1 · head 8")
    expect(tip).to_contain_text("queries: tokens")
    expect(tip).to_contain_text("keys: tokens")
    expect(tip).to_contain_text("share of the block's attention")
    screenshot(page, "real-model", full_page=False)
    assert console_errors == []


def test_phone_width(page: Page, console_errors):
    page.set_viewport_size({"width": 390, "height": 844})
    open_app(page, "head", text=PARA, layer=1, head=8)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390               # nothing sticks out
    box = page.locator(HEAD_PLOT).bounding_box()
    assert box["width"] >= 340 and plot_js(page, "gd._fullLayout.xaxis._length") >= 240
    screenshot(page, "phone-head")
    page.locator('#tabs a[data-view="summary"]').click()
    wait_drawn(page, "summary")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    plot = page.locator("#view-summary [data-part=plot]").bounding_box()
    rank = page.locator("#view-summary [data-part=rank]").bounding_box()
    assert plot["width"] >= 340 and rank["y"] >= plot["y"] + plot["height"] - 1         # the ranking below
    screenshot(page, "phone-summary")
    page.locator('#tabs a[data-view="model"]').click()
    wait_drawn(page, "model")
    expect(page.locator("#view-model [data-part=cue]")).to_be_visible()
    assert page.evaluate("(() => { const s = document.querySelector('#view-model [data-part=scroller]'); "
                         "return s.scrollWidth > s.clientWidth; })()")
    screenshot(page, "phone-model", full_page=False)
    assert console_errors == []


@pytest.mark.slow
def test_warning_past_the_trained_length(page: Page, console_errors):
    """MiniLM raised to its 512 positions (ATTNSCOPE_MAX_TOKENS): a longer text runs, and the page says the
    positions past 256 are untrained."""
    from bench.common import server

    long = PARA + " " + PARA
    with server({"ATTNSCOPE_MODELS": "minilm", "ATTNSCOPE_MAX_TOKENS": "minilm=512"}) as (url, _pid):
        page.goto(url + "/?" + urlencode({"text": long, "view": "summary"}))
        wait_drawn(page, "summary")
        warning = page.locator("#warnings")
        expect(warning).to_be_visible()
        expect(warning).to_contain_text("more than the 256 all-MiniLM-L6-v2 was trained on")
        expect(page.locator("#text-hint")).to_contain_text("trained on 256")
        page.goto(url + "/?" + urlencode({"text": PARA, "view": "summary"}))
        wait_drawn(page, "summary")
        expect(warning).to_be_hidden()
    assert console_errors == []
