"""The page a newcomer meets (issue 51): what is drawn is what the controls show, after every action. Each test is
named after the defect it reproduced (seen failing before its fix): a cancel left the new model's controls over the
old model's picture, a model switch kept the old model's head, a lesson link drew MiniLM under the lesson, and
tiny-gpt offered a logit lens while saying it predicts no next token."""
from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from playwright.sync_api import Page, expect

from .conftest import EXAMPLE, open_app, wait_drawn

pytestmark = pytest.mark.browser
# over the page's long-text length (matrix.js LONG_TEXT): SmolLM2 runs it layer by layer, streaming its progress
LONG = " ".join(["When Mary and John went to the store, John gave a drink to Mary."] * 30)


def shown(page) -> dict:
    """The state in the address: field -> value."""
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


def test_cancel_left_the_wrong_model_on_screen(page: Page, live_server_smollm2, console_errors):
    page.goto(live_server_smollm2 + "/?" + urlencode({"model": "tiny-gpt", "text": EXAMPLE, "layer": 2, "head": 3}))
    wait_drawn(page, "head")
    drawn = shown(page)
    # SmolLM2's streamed run of the long text never answers (as slow as Gemma 3 on an article, and no server time)
    page.route("**/api/attention", lambda route: None
               if "ndjson" in route.request.headers.get("accept", "") and '"smollm2"' in (route.request.post_data or "")
               else route.continue_())
    page.fill("#text", LONG)
    page.select_option("#model", "smollm2")
    page.locator("#run-cancel").click(timeout=10_000)             # the bar shows after a second
    wait_drawn(page, "head")
    # the last drawn state comes back whole: model, text, layer, head and the address; the edit stays in its box
    assert shown(page) == drawn
    expect(page.locator("#model")).to_have_value("tiny-gpt")
    expect(page.locator("#layer")).to_have_value("2")
    expect(page.locator("#head")).to_have_value("3")
    expect(page.locator("#model-desc")).to_contain_text("4-layer, 4-head")
    expect(page.locator("#text")).to_have_value(LONG)
    expect(page.locator("#draft-note")).to_be_visible()
    # said plainly: no refusal, no error box
    expect(page.locator("#status")).to_contain_text("Cancelled")
    expect(page.locator("#error")).to_be_hidden()
    assert "refused" not in page.locator("#status").inner_text()
    assert all("/api/attention" in e and "ERR_ABORTED" in e for e in console_errors), console_errors


def fresh_head(page, base: str, model: str) -> tuple[str, str]:
    """The head a fresh visit opens for model (first.js clearestHead on the example text)."""
    page.goto(base + "/?model=" + model)
    wait_drawn(page)
    st = shown(page)
    assert st["model"] == model and st["text"] == EXAMPLE
    return st["layer"], st["head"]


def test_model_switch_kept_the_old_layer_and_head(page: Page, live_server, live_server_smollm2, console_errors):
    # a head of tiny-gpt's on SmolLM2 (a blank triangle there); the induction model's one head on every other model
    for base, before, after in ((live_server_smollm2, "tiny-gpt", "smollm2"), (live_server, "induction", "minilm")):
        want = fresh_head(page, base, after)
        fresh_head(page, base, before)
        page.select_option("#model", after)
        page.wait_for_function("(m) => location.search.includes('model=' + m)", arg=after)
        wait_drawn(page)
        st = shown(page)
        assert (st["model"], st["text"]) == (after, EXAMPLE)
        assert (st["layer"], st["head"]) == want, (before, after)
        expect(page.locator("#layer")).to_have_value(want[0])
        expect(page.locator("#head")).to_have_value(want[1])
    assert console_errors == []


@pytest.mark.parametrize("link", ["/?lesson=1", "/?lesson=1&present=1"])
def test_lesson_link_showed_minilm_under_the_lesson(page: Page, console_errors, link):
    page.goto(link)
    wait_drawn(page)
    st = shown(page)
    assert (st.get("model"), st.get("view"), st.get("step"), st.get("lesson")) == ("tiny-gpt", "stages", "5", "1")
    assert st.get("text") == "the cat sat on the mat and then the cat slept"
    assert (st.get("layer"), st.get("head")) == ("0", "0")                 # the lesson's head, not a measured one
    assert ("present" in link) == (st.get("present") == "1")
    expect(page.locator("#model")).to_have_value("tiny-gpt")
    expect(page.locator("#lesson")).to_contain_text("Query and key: dot products")
    assert console_errors == []


def test_tiny_gpt_offered_a_lens_while_predicting_no_next_token(page: Page, console_errors):
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/api/lens" in r.url else None)
    open_app(page, "lens", model="tiny-gpt", text="the cat sat on the mat")
    # the lens tab says what Effects and Generate say, and the view asks nothing of the server
    reason = "predicts no next token"
    expect(page.locator('#tabs a[data-view="lens"]')).to_have_attribute("aria-disabled", "true")
    expect(page.locator('#tabs a[data-view="effects"]')).to_have_attribute("title", f"Not for Tiny GPT (teaching): no LM head: it {reason}")
    expect(page.locator('#tabs a[data-view="lens"]')).to_have_attribute("title", f"Not for Tiny GPT (teaching): no LM head: it {reason}")
    expect(page.locator("#view-lens .note.refused")).to_contain_text(reason)
    assert sent == []
    # its description matches the tokens it shows: a WordPiece tokenizer's [CLS] and ##pieces, no GPT-2 claim
    expect(page.locator("#chips .chip").first).to_contain_text("[CLS]")
    desc = page.locator("#model-desc")
    expect(desc).to_contain_text("[CLS]")
    expect(desc).to_contain_text("##")
    expect(desc).not_to_contain_text("GPT-2 style")
    expect(desc).to_contain_text(reason)
    assert console_errors == []
