"""The steps view complete for one head (issue 14): every number of x, Q, K, V, the output and the head's
contribution; the click readout written out term by term; PNG and SVG of a step; the classroom layout at
1280x720; the guided lesson; head roles in the head menu and the induction model's explanation."""
from __future__ import annotations

from urllib.parse import urlencode

import httpx
import numpy as np
import pytest
from playwright.sync_api import Page, expect

from .conftest import ARTIFACTS, screenshot, wait_drawn

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TEXT = "the cat sat on the mat and then the cat slept"      # 12 tokens with tiny-gpt's [CLS]


@pytest.fixture
def teach(live_server):
    """The suite's server, whose models include tiny-gpt and the induction circuit (tests/conftest.py)."""
    return live_server


def open_at(page: Page, base: str, view: str | None = None, **params) -> None:
    if view:
        params["view"] = view
    page.goto(f"{base}/?{urlencode(params)}")
    wait_drawn(page, view)


def stages_api(base: str, **body) -> dict:
    r = httpx.post(f"{base}/api/stages", json={"model": "tiny-gpt", "text": TEXT, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def table_values(page: Page, key: str) -> np.ndarray:
    """[token][number] from a vector step's cells (one column per token)."""
    cells = page.locator(f"#view-stages [data-stage={key}] td[data-value]").evaluate_all(
        "tds => tds.map(td => [Number(td.dataset.t), Number(td.dataset.d), Number(td.dataset.value)])")
    n, dims = max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1
    out = np.full((n, dims), np.nan)
    for t, d, v in cells:
        out[t, d] = v
    return out


def fits_in(page: Page, selector: str) -> bool:
    """The element lies inside its scroll box and the viewport (a cell scrolled to, nothing clipping it)."""
    return page.locator(selector).evaluate("""el => {
      const r = el.getBoundingClientRect(), box = el.closest('.table-scroll').getBoundingClientRect();
      return r.width > 0 && r.left >= box.left - 0.5 && r.right <= box.right + 0.5 && r.top >= box.top - 0.5
        && r.bottom <= box.bottom + 0.5 && r.right <= innerWidth + 1 && r.bottom <= innerHeight + 1;
    }""")


def test_every_number_of_one_head_and_how_it_was_computed(page: Page, console_errors, teach):
    page.set_viewport_size({"width": 1400, "height": 900})
    open_at(page, teach, "stages", model="tiny-gpt", text=TEXT, layer=0, head=0)
    ref = stages_api(teach, layer=0, head=0, limit=12)
    T, dh, D = len(ref["tokens"]), 32, 128
    assert T == 12
    expect(page.locator("#view-stages [data-stage]")).to_have_count(11)
    # every number of x, Q, K, V, the output and the contribution, as the API gives them
    for key, dims in (("x", D), ("q", dh), ("k", dh), ("v", dh), ("ctx", dh), ("contribution", D)):
        expect(page.locator(f"#view-stages [data-stage={key}] td[data-value]")).to_have_count(T * dims)
        np.testing.assert_allclose(table_values(page, key), ref[key], rtol=1e-6, atol=1e-7, err_msg=key)
    # ... each reachable: the last number of the last token's query and value scrolls into view, whole
    for key in ("q", "k", "v", "ctx"):
        last = f"#view-stages [data-stage={key}] td[data-t='{T - 1}'][data-d='{dh - 1}']"
        page.locator(last).scroll_into_view_if_needed()
        assert fits_in(page, last), key
    page.evaluate("scrollTo(0, 0)")
    screenshot(page, "steps-1400x900")

    # a score: its dot product with all 32 terms, summing to the model's number
    panel = page.locator("#view-stages [data-part=readout]")
    expect(panel).to_be_hidden()
    page.locator("#view-stages [data-stage=scores] td[data-q='5'][data-k='4']").click()
    expect(panel).to_be_visible()
    expect(panel.locator("h3")).to_contain_text("q₅ · k₄")
    expect(panel.locator(".term")).to_have_count(dh)
    assert np.dot(np.array(ref["q"][5], np.float64), ref["k"][4]) == pytest.approx(ref["scores"][5][4], rel=1e-5)
    expect(panel.locator(".result strong").first).to_have_text(f"{ref['scores'][5][4]:.4f}".replace("-", "−"))
    screenshot(page, "steps-readout-score", full_page=False)
    # a softmax weight: exp(s - max) / sum, the sum's terms over the visible keys
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    page.locator("#view-stages [data-stage=probs] td[data-q='5'][data-k='4']").click()
    expect(panel.locator(".terms").first).to_contain_text("exp(")
    expect(panel.locator(".result strong").first).to_have_text(f"{ref['probs'][5][4]:.4f}")
    # an output number: the weighted sum over the keys the query sees (6 of them, causal)
    page.locator("#view-stages [data-stage=ctx] td[data-t='5'][data-d='3']").click()
    expect(panel.locator(".term")).to_have_count(6)
    ctx = sum(ref["probs"][5][j] * ref["v"][j][3] for j in range(6))
    assert ctx == pytest.approx(ref["ctx"][5][3], abs=1e-5)
    # keyboard: the cell has the focus; arrows move, Enter explains
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    expect(panel.locator("h3")).to_contain_text("out₆[3]")
    # the head menu names the roles of tiny-gpt's wired heads
    assert page.locator("#head option").all_inner_texts()[:4] == [
        "head 0 · previous-token", "head 1 · first-token", "head 2 · self", "head 3 · uniform"]
    expect(page.locator("#view-stages [data-part=note]")).to_contain_text("previous-token head")
    # ... in the server's words (the boot block's roles), not a list of the page's own
    expect(page.locator("#view-stages [data-part=note]")).to_contain_text(
        "a previous-token head: it puts its weight on the token just before (key i−1)")
    assert console_errors == []


def test_png_and_svg_of_a_step(page: Page, console_errors, teach, tmp_path):
    open_at(page, teach, "stages", model="tiny-gpt", text=TEXT, layer=1, head=0, step=5)
    expect(page.locator("#view-stages [data-stage]")).to_have_count(5)      # steps 1 to 5 revealed
    with page.expect_download() as dl:
        page.locator("#view-stages [data-stage=scores] button[data-export=png]").click()
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    data = path.read_bytes()
    assert dl.value.suggested_filename == "attnscope-tiny-gpt-L1H0-step5-scores.png"
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "steps-export-scores.png").write_bytes(data)
    with page.expect_download() as dl:
        page.locator("#view-stages [data-stage=q] button[data-export=svg]").click()
    svg = dl.value.path().read_text()
    assert svg.startswith("<svg") and "Queries Q = x W_Q" in svg and svg.count("<rect") > 32 * 12
    # the view's own export buttons: the step shown (here the scores)
    with page.expect_download() as dl:
        page.locator("#export-png").click()
    assert dl.value.suggested_filename == "attnscope-tiny-gpt-L1H0-step5-scores.png"
    assert console_errors == []


def test_present_mode_fits_a_12_token_step_at_1280x720(page: Page, console_errors, teach):
    page.set_viewport_size({"width": 1280, "height": 720})
    open_at(page, teach, "stages", model="tiny-gpt", text=TEXT, layer=0, head=0, step=9, present=1)
    expect(page.locator("#input-form")).to_be_hidden()
    expect(page.locator("#tabs")).to_be_hidden()
    bar = page.locator("#present-bar")
    expect(bar).to_be_visible()
    expect(bar.get_by_role("button", name="Exit presentation (Esc)")).to_be_visible()
    expect(bar).to_contain_text("Step 9 of 11")
    assert page.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)") >= 20
    expect(page.locator("#view-stages [data-stage]")).to_have_count(1)
    no_sideways = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    table_fits = """() => { const t = document.querySelector('#view-stages .stage-table'), box = t.parentElement;
      return t.scrollWidth <= box.clientWidth && t.getBoundingClientRect().right <= innerWidth; }"""
    assert page.evaluate(no_sideways)
    assert page.evaluate(table_fits)
    assert page.locator("#view-stages .stage-table td[data-value]").count() == 144
    screenshot(page, "present-softmax-1280x720", full_page=False)
    # arrow keys step through all 11 steps; no step scrolls the page sideways, every matrix fits whole
    for _ in range(8):
        page.keyboard.press("ArrowLeft")
    wait_drawn(page, "stages")
    expect(bar).to_contain_text("Step 1 of 11")
    for k in range(1, 12):
        if k > 1:
            page.keyboard.press("ArrowRight")
            wait_drawn(page, "stages")
        expect(bar).to_contain_text(f"Step {k} of 11")
        assert f"step={k}" in page.url
        assert page.evaluate(no_sideways), k
        if page.locator("#view-stages .stage.matrix").count():
            assert page.evaluate(table_fits), k
        if k in (2, 5, 10):
            screenshot(page, f"present-step{k}-1280x720", full_page=False)
    page.keyboard.press("ArrowRight")                      # the last step: nothing further
    expect(bar.locator(".present-next")).to_be_disabled()
    # a readout is large in the classroom too; Escape closes it, then leaves the classroom layout
    page.locator("#view-stages td[data-t='4'][data-d='0']").click()
    expect(page.locator("#view-stages [data-part=readout]")).to_be_visible()
    screenshot(page, "present-readout-1280x720", full_page=False)
    page.locator("body").press("Escape")
    expect(page.locator("#view-stages [data-part=readout]")).to_be_hidden()
    page.locator("body").press("Escape")
    wait_drawn(page, "stages")
    assert "present=" not in page.url
    expect(page.locator("#input-form")).to_be_visible()
    # and back in through the header's button
    page.get_by_role("button", name="Present").click()
    wait_drawn(page, "stages")
    assert "present=1" in page.url
    assert console_errors == []


def test_lesson_pages_open_and_the_head_menu_lists_roles(page: Page, console_errors, teach):
    page.set_viewport_size({"width": 1400, "height": 900})
    open_at(page, teach, "head", text="short")
    page.get_by_role("link", name="Lesson").click()
    wait_drawn(page, "stages")
    lesson = page.locator("#lesson")
    expect(lesson).to_contain_text("Lesson · 1 of 9")
    expect(lesson.locator("h2")).to_have_text("Query and key: dot products")
    assert "lesson=1" in page.url and "model=tiny-gpt" in page.url and "step=5" in page.url
    expect(page.locator("#view-stages [data-stage]")).to_have_count(1)      # the page's one step: the scores
    expect(page.locator("#view-stages [data-stage=scores]")).to_be_visible()
    screenshot(page, "lesson-1")
    titles = ["Query and key: dot products", "Scaling", "Masking", "Softmax", "Weights × values", "Heads differ",
              "Induction, part 1: the previous-token head", "Induction, part 2: the induction head"]
    views = ["stages"] * 5 + ["model", "head", "head"]
    for k in range(2, 9):
        lesson.get_by_role("link", name="Next ▶").click()
        wait_drawn(page, views[k - 1])
        expect(lesson.locator("h2")).to_have_text(titles[k - 1])
        assert f"lesson={k}" in page.url
        expect(lesson.locator(".warn")).to_have_count(0)      # every page's model is served
    # the induction model: its explanation in the page, its roles in the head menu
    assert "model=induction" in page.url and "layer=1" in page.url
    explanation = page.locator("#model-explanation")
    expect(explanation).to_be_visible()
    expect(explanation).to_contain_text("K-composition")
    assert page.locator("#head option").all_inner_texts() == ["head 0 · induction"]
    screenshot(page, "lesson-8-induction")
    # each page is a link: opening one cold gives the same view
    url = page.url
    page.goto(url)
    wait_drawn(page, "head")
    expect(lesson.locator("h2")).to_have_text(titles[7])
    lesson.get_by_role("link", name="◀ Previous").click()
    wait_drawn(page, "head")
    assert page.locator("#head option").all_inner_texts() == ["head 0 · previous-token"]
    # the lesson in the classroom layout: arrows walk the pages
    page.goto(page.url + "&present=1")
    wait_drawn(page, "head")
    expect(page.locator("#present-bar")).to_contain_text("Lesson 7 of 9")
    page.keyboard.press("ArrowLeft")
    wait_drawn(page, "model")
    expect(page.locator("#present-bar")).to_contain_text("Lesson 6 of 9 · Heads differ")
    screenshot(page, "lesson-6-present", full_page=False)
    page.keyboard.press("Escape")                          # out of the classroom layout, still in the lesson
    wait_drawn(page, "model")
    assert "present=" not in page.url and "lesson=6" in page.url
    lesson.get_by_role("link", name="Leave the lesson").click()
    wait_drawn(page, "model")
    expect(lesson).to_be_hidden()
    assert "lesson=" not in page.url
    assert console_errors == []


def step_sentence(page: Page, key: str) -> str:
    return page.locator(f"#view-stages [data-stage={key}] .explain").inner_text()


def test_step_sentences_follow_the_servers_architecture_facts(page: Page, console_errors, teach):
    """What the steps say about a family (pre- or post-norm, which norm, biases, positions) comes from the boot
    block's architectures, which the server takes from each served model's own configuration."""
    open_at(page, teach, "stages", model="tiny-gpt", text=TEXT, layer=1, head=0, step=3)
    boot = page.evaluate("JSON.parse(document.getElementById('boot').textContent).architectures")
    assert boot["gpt2"] == {"norm_first": True, "norm": "layer", "position": "learned", "qkv_bias": True,
                            "qk_norm": None, "output_norms": False, "parallel_residual": False, "rotary_dim": 32,
                            "d_head": 32}
    assert boot["bert"]["norm_first"] is False
    assert "the residual stream after the block's LayerNorm" in step_sentence(page, "x")     # GPT-2: pre-norm
    assert "plus a bias" in step_sentence(page, "q") and "RoPE" not in step_sentence(page, "k")
    # MiniLM (BERT): post-norm, so layer 0 reads the embeddings and later layers the layer before
    open_at(page, teach, "stages", model="minilm", text=TEXT, layer=0, head=0, step=3)
    assert "token, position and segment embeddings" in step_sentence(page, "x")
    assert "plus a bias" in step_sentence(page, "k")
    open_at(page, teach, "stages", model="minilm", text=TEXT, layer=2, head=0, step=1)
    assert "the output of the layer before" in step_sentence(page, "x")
    assert console_errors == []
