"""The page a newcomer meets (issue 51), the rest of it: honest about length, no developer words in what a visitor
reads, nothing cut off. Each test is named after the defect it reproduced (seen failing before its fix). One page
per server for the module (browser time is the suite's budget)."""
from __future__ import annotations

from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from .conftest import wait_drawn

pytestmark = pytest.mark.browser
# a 3,000-word article (the issue's): every test model cuts it
ARTICLE = " ".join(("The committee met on Tuesday to discuss the budget, and after a long debate the members agreed "
                    "that the new library would open in spring. ").split() * 120)
ARTICLE = " ".join(ARTICLE.split()[:3000])
# ~300 SmolLM2 tokens in under the page's long-text length: one quick stacked run, over the patching-style limit (256)
MEDIUM = " ".join(["cat", "dog", "sun"] * 100)


@pytest.fixture(scope="module")
def tab(browser):
    """One page for the module; its console errors in tab.errors."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(f"pageerror: {e}"))
    yield page
    context.close()


def visit(page, base: str, view: str | None = None, **state) -> None:
    page.goto(base + "/?" + urlencode({**state, **({"view": view} if view else {})}))
    wait_drawn(page, view, timeout=120_000)


def test_long_text_was_cut_silently(tab, live_server):
    """3,000 words: each model says on screen how much it read of about how much, and which served model reads more."""
    for model, limit, more in (("minilm", 256, "Tiny GPT (teaching) reads 512 tokens"),
                               ("tiny-gpt", 512, "No served model reads more"),
                               ("induction", 256, "Tiny GPT (teaching) reads 512 tokens")):
        visit(tab, live_server, model=model, text=ARTICLE)
        note = tab.locator("#length-note")
        expect(note).to_be_visible()
        expect(note).to_contain_text(f"Read {limit} of about ")
        expect(note).to_contain_text(more)
        assert int(note.get_attribute("data-read")) == limit
        assert 2_500 < int(note.get_attribute("data-total")) < 9_000, note.inner_text()   # ~3,300 words' tokens
        box = note.bounding_box()
        assert box and box["y"] + box["height"] < 720, box                       # on the first screen
    # a text it reads whole says nothing
    visit(tab, live_server, model="minilm", text="The cat sat on the mat.")
    expect(tab.locator("#length-note")).to_be_hidden()
    assert tab.errors == []


def test_tabs_refused_at_this_length_in_developer_words(tab, live_server_smollm2):
    """~300 tokens on SmolLM2: the logit lens and effects take at most 256. Their tabs are disabled before they are
    asked, in plain words; opened, the view says so and asks the server nothing. A refusal the server does send is
    shown without its setting and endpoint names, and the status line still says something."""
    asked = []
    tab.on("request", lambda r: asked.append(r.url) if "/api/lens" in r.url or "/api/patching" in r.url else None)
    visit(tab, live_server_smollm2, model="smollm2", text=MEDIUM)
    for view in ("lens", "effects"):
        a = tab.locator(f'#tabs a[data-view="{view}"]')
        expect(a).to_have_attribute("aria-disabled", "true")
        title = a.get_attribute("title")
        assert title.startswith("Not at this length: this text is ") and "at most 256" in title, title
    expect(tab.locator('#tabs a[data-view="stages"]')).not_to_have_attribute("aria-disabled", "true")
    tab.locator('#tabs a[data-view="lens"]').dispatch_event("click")    # (a disabled tab still opens its reason)
    wait_drawn(tab, "lens", timeout=60_000)
    expect(tab.locator("#view-lens .note.refused")).to_contain_text("not available at this length")
    assert asked == []
    # the API's words (the messages) in the box a visitor reads: no setting, no endpoint
    detail = ("this text is 3240 tokens: every layer's attention together is 10.6 GiB, so it runs layer by layer "
              "(ATTNSCOPE_LAYERWISE_MB), and the stages of one head come from the graph that holds every layer; ask "
              "/api/attention for its probabilities, or shorten the text")
    tab.route("**/api/stages", lambda route: route.fulfill(status=422, json={"detail": detail}))
    tab.locator('#tabs a[data-view="stages"]').click()
    error = tab.locator("#error")
    expect(error).to_be_visible(timeout=60_000)
    shown = error.inner_text()
    assert "ATTNSCOPE_" not in shown and "/api/" not in shown and "ask for its probabilities" in shown, shown
    assert tab.locator("#status").inner_text().strip(), "the status line was blanked"
    tab.unroute("**/api/stages")
