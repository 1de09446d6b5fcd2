"""An encoder-decoder in the page: a tiny random BART (tests/test_encdec.py's, weights wide enough that attention is
peaked) served by path from a live server of its own. BertViz's three views: cross-attention in the head view (decoder
tokens as rows, encoder tokens as columns), decoder self-attention after a change of the Attention control (causal),
encoder self-attention in the line view; each drawn matrix against the API's answer, the tabs and controls that do
not apply hidden, no console errors. One server, one page load per view."""
from __future__ import annotations

import html
from urllib.parse import urlencode

import httpx
import numpy as np
import pytest
from playwright.sync_api import Page, expect

from attnscope.app.pages import VIEWS

from .conftest import SMALL_SCREEN, assert_plot_on_screen, screenshot, wait_drawn
from .test_layout import failed_requests, open_every_tab

pytestmark = pytest.mark.browser
TEXT = "The quick brown fox jumps over the lazy dog."
DECODER_TEXT = "the fox jumps"
HEAD_PLOT = "#view-head [data-part=plot]"


@pytest.fixture(scope="module")
def bart_server(tmp_path_factory):
    from bench.common import server
    from tests.test_encdec import build

    folder = build("bart", tmp_path_factory.mktemp("encdec-page") / "bart")
    with server({"ATTNSCOPE_MODELS": f"bart={folder}", "ATTNSCOPE_DEFAULT_MODEL": "bart"}) as (url, _pid):
        yield url


@pytest.fixture(scope="module")
def answer(bart_server):
    """The API's answer for the page's text and decoder text, layer 1 head 2: all three attentions."""
    r = httpx.post(bart_server + "/api/attention", json={"model": "bart", "text": TEXT, "decoder_text": DECODER_TEXT,
                                                         "layers": [1], "heads": [2]}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def shown(token: str) -> str:
    """A token as the page shows it (dom.js tokenLabel)."""
    return "".join("␣" if c.isspace() else c for c in token)


def label(token: str) -> str:
    """A tick label as the head view writes it (tokenLabel, then plotlyText; these tokens are short)."""
    return html.escape(shown(token), quote=False)


def goto(page: Page, base: str, **state) -> None:
    page.goto(base + "/?" + urlencode({"model": "bart", "text": TEXT, "decoder_text": DECODER_TEXT, **state}))
    wait_drawn(page, state["view"])


def drawn_matrix(page: Page):
    """The head view's heatmap as Plotly holds it: z (null: masked) and both axes' labels."""
    return page.evaluate("""(sel) => { const gd = document.querySelector(sel), t = gd.data[gd.data.length - 1];
      return {z: t.z, x: gd.layout.xaxis.ticktext, y: gd.layout.yaxis.ticktext,
              xtitle: gd.layout.xaxis.title.text, ytitle: gd.layout.yaxis.title.text}; }""", HEAD_PLOT)


def test_encoder_decoder_head_view_cross_then_decoder(page: Page, bart_server, answer, console_errors):
    enc, dec = answer["tokens"], answer["decoder_tokens"]
    cross = np.array(answer["cross_attention"][0][0])                 # [decoder query, encoder key]
    assert cross.shape == (len(dec), len(enc)) and cross.max(-1).mean() >= 0.5   # peaked: a vacuous test otherwise
    goto(page, bart_server, view="head", layer=1, head=2, attention="cross")
    # the controls of an encoder-decoder: its decoder text and the Attention control; the rest hidden
    expect(page.locator("#decoder-text")).to_have_value(DECODER_TEXT)
    expect(page.locator("#attention")).to_have_value("cross")
    expect(page.locator("#attention-note")).to_contain_text("queries come from the decoder's tokens")
    for hidden in ("#causal-field", "#click-mode", "#generate", "#pair-field"):
        expect(page.locator(hidden)).to_be_hidden()
    # the tabs that read one stack's run: disabled, the capability record's reason on each
    assert page.locator('#tabs a:not([aria-disabled="true"])').all_inner_texts() == ["Head", "Lines", "Causal mask & steps"]
    refused = page.locator('#tabs a[aria-disabled="true"]')
    assert refused.count() == len(VIEWS) - 3 and all(t.startswith("Not for ") and t.endswith(   # every other view
        ": an encoder-decoder: Head, Lines and Steps show its three attentions")
        for t in refused.evaluate_all("(as) => as.map((a) => a.title)"))
    expect(page.locator("#predictions h2")).to_have_text(f"The decoder's next token after “{shown(dec[-1])}”")
    # cross-attention: decoder tokens down the side (queries), encoder tokens along the bottom (keys)
    m = drawn_matrix(page)
    assert m["y"] == [label(t) for t in dec] and m["x"] == [label(t) for t in enc]
    assert (m["ytitle"], m["xtitle"]) == ("decoder token (query)", "encoder token (key)")
    np.testing.assert_allclose(np.array(m["z"], float), cross, atol=1e-6)
    assert page.locator("#chips .chip .tok").all_inner_texts() == [shown(t) for t in dec]   # the queries
    expect(page.locator("#view-head [data-part=note]")).to_contain_text("keys and values from the encoder's output")
    # pin a decoder token: its row's weights over the encoder's tokens, as the API gives them
    q = int(np.argmax(cross.max(-1)))
    page.locator(f'#chips .chip[data-index="{q}"]').click()
    wait_drawn(page, "head")
    rows = page.locator("#view-head [data-part=pinned] tr[data-key]")
    listed = dict(rows.evaluate_all("rs => rs.map(r => [Number(r.dataset.key), Number(r.dataset.weight)])"))
    assert sorted(listed) == list(range(len(enc)))
    np.testing.assert_allclose([listed[k] for k in range(len(enc))], cross[q], atol=1e-6)
    assert page.locator("#view-head .why-button").count() == 0       # no QK attribution for encoder-decoders
    screenshot(page, "encdec-cross-attention")

    # the Attention control: decoder self-attention, decoder tokens on both axes, causal
    page.select_option("#attention", "decoder")
    wait_drawn(page, "head")
    assert "attention=decoder" in page.url and "pin=" not in page.url
    m = drawn_matrix(page)
    assert m["y"] == m["x"] == [label(t) for t in dec]
    z = np.array([[np.nan if v is None else v for v in row] for row in m["z"]], float)
    want = np.array(answer["decoder_attention"][0][0])
    upper = np.triu(np.ones_like(want, bool), 1)
    assert np.isnan(z[upper]).all() and (want[upper] == 0).all()      # the future: masked, weight exactly 0
    np.testing.assert_allclose(z[~upper], want[~upper], atol=1e-6)
    assert console_errors == []


def test_encoder_decoder_line_view_encoder(page: Page, bart_server, answer, console_errors):
    enc = answer["tokens"]
    goto(page, bart_server, view="lines", layer=1, head=2, heads="2", attention="encoder")
    view = page.locator("#view-lines")
    expect(view).to_have_attribute("data-attention", "encoder")
    left = view.locator('.tok-label[data-side="q"]').all_text_contents()
    right = view.locator('.tok-label[data-side="k"]').all_text_contents()
    assert left == right == [shown(t) for t in enc]
    # focus the heaviest query: its lines' weights are the API's encoder self-attention (float16 on the wire)
    att = np.array(answer["attention"][0][0])
    q = int(np.argmax(att.max(-1)))
    view.locator(f'.tok-label[data-side="q"][data-pos="{q}"]').hover()
    expect(view.locator("[data-part=focus]")).to_have_attribute("data-focus", f"q{q}")
    weights = view.locator("[data-part=focus] .w").evaluate_all(
        "ws => ws.map(w => [Number(w.dataset.other), Number(w.dataset.weight)])")
    assert weights and weights[0][0] == int(np.argmax(att[q]))
    for k, w in weights:
        assert w == pytest.approx(att[q, k], abs=1e-3)
    expect(view.locator("[data-part=note]")).to_contain_text("Encoder self-attention")
    assert console_errors == []


def test_encoder_decoder_steps_view_cross_attention(page: Page, bart_server, answer, console_errors):
    """The steps view of a cross-attention head: K and V one column per encoder token, Q per decoder token, the
    softmax step's cells the API's cross_attention."""
    nk, nq = min(len(answer["tokens"]), 32), min(len(answer["decoder_tokens"]), 32)   # 32: the most it shows
    goto(page, bart_server, view="stages", layer=1, head=2, n=32)
    view = page.locator("#view-stages")
    expect(view.locator("[data-part=note]")).to_contain_text("keys and values from the encoder's output")
    expect(view.locator('[data-stage="k"] h3')).to_contain_text("encoder output")
    assert view.locator('[data-stage="k"] td[data-d="0"]').count() == nk       # one column per source token
    assert view.locator('[data-stage="q"] td[data-d="0"]').count() == nq
    cells = view.locator('[data-stage="probs"] td[data-q]').evaluate_all(
        "ts => ts.map(t => [Number(t.dataset.q), Number(t.dataset.k), Number(t.dataset.value)])")
    probs = np.zeros((nq, nk))
    for q, k, w in cells:
        probs[q, k] = w
    assert len(cells) == probs.size
    np.testing.assert_allclose(probs, np.asarray(answer["cross_attention"][0][0])[:nq, :nk], atol=1e-5)
    assert console_errors == []


def test_encoder_decoder_tabs_and_layout(page: Page, bart_server, console_errors):
    """A tiny BART at 1280x720: its three views draw, every other tab says why, no request fails; the head view's
    picture starts on screen."""
    page.set_viewport_size(SMALL_SCREEN)
    failed = failed_requests(page)
    seen = open_every_tab(page, bart_server, "bart", failed)
    assert {v for v, s in seen.items() if s == "figure"} == {"head", "lines", "stages"}
    assert seen["model"] == "an encoder-decoder: Head, Lines and Steps show its three attentions"
    goto(page, bart_server, view="head", attention="cross")
    assert_plot_on_screen(page)
    screenshot(page, "layout-bart", full_page=False)
    assert failed == [] and console_errors == []
