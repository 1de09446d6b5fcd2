"""Untrusted text stays text (XSS), the page works offline, and nothing breaks the CSP."""
from __future__ import annotations

from urllib.parse import urlencode

import pytest
from playwright.sync_api import Page, expect

from .conftest import plot_point, screenshot, wait_drawn

pytestmark = pytest.mark.browser
PAYLOADS = ["<img src=x onerror=alert(1)>", "<script>alert(1)</script>", '"><svg onload=alert(1)>']
VIEWS = ["head", "lines", "model", "summary", "entropy", "stages"]


def _injected(page) -> list[str]:
    """Elements a payload would create if it were parsed as HTML anywhere in the page."""
    return page.evaluate("""() => [
      ...document.querySelectorAll('img[src="x"], img[onerror], svg[onload], script:not([src]):not(#boot), [onerror], [onload]')
    ].map(e => e.outerHTML.slice(0, 80))""")


def test_xss_payloads_shown_literally_everywhere(page: Page, console_errors, dialogs):
    text, pair = f"{PAYLOADS[0]} and {PAYLOADS[1]}", PAYLOADS[2]
    page.goto("/?" + urlencode({"text": text, "text_pair": pair, "view": "head"}))
    wait_drawn(page, "head")
    expect(page.locator("#text")).to_have_value(text)
    expect(page.locator("#text-pair")).to_have_value(pair)
    chips = "".join(page.locator("#chips .chip .tok").all_inner_texts())
    assert "<" in chips and ">" in chips and '"' in chips     # the brackets are tokens, shown as text
    for view in VIEWS:
        page.locator(f'#tabs a[data-view="{view}"]').click()
        wait_drawn(page, view)
        assert _injected(page) == [], view
    # Plotly tick labels show the characters, not markup
    page.locator('#tabs a[data-view="head"]').click()
    wait_drawn(page, "head")
    ticks = page.locator("#view-head .xtick text").all_text_contents()
    assert "<" in ticks and ">" in ticks
    assert page.locator("#view-head .xtick a, #view-head .xtick img").count() == 0
    # each payload on its own, typed into the text box
    for payload in PAYLOADS:
        page.fill("#text", payload)
        page.get_by_role("button", name="Run").click()
        wait_drawn(page, "head")
        expect(page.locator("#text")).to_have_value(payload)
        assert page.evaluate("document.title").startswith("Head view · " + payload)
        assert _injected(page) == []
    assert dialogs == []
    assert console_errors == []


def test_hover_and_export_of_payload_tokens(page: Page, console_errors, dialogs):
    """The hover box, the tick labels (Plotly pseudo-HTML) and the pinned list show the token strings as text."""
    page.goto("/?" + urlencode({"text": "<b>bold</b> <a href=x>link</a>", "pin": 1}))
    wait_drawn(page, "head")
    page.locator("#view-head [data-part=plot]").evaluate("e => e.scrollIntoView()")
    k = page.locator("#chips .chip .tok").all_inner_texts().index("<")
    page.mouse.move(*plot_point(page, "#view-head [data-part=plot]", k, 1))
    tip = page.locator("#view-head [data-part=tip]")
    expect(tip).to_be_visible()
    assert f"key {k} “<”" in tip.inner_text()
    assert page.locator("#view-head [data-part=tip] a, #view-head [data-part=tip] b, #view-head .xtick a").count() == 0
    expect(page.locator("#view-head [data-part=pinned] tr[data-key] td.tok").first).to_have_text("[CLS]")
    assert page.locator("#view-head [data-part=pinned] b").count() == 0
    assert dialogs == []
    assert console_errors == []


def test_offline_page_loads_and_draws(page: Page, console_errors, live_server):
    outside = []

    def route(r):
        if r.request.url.startswith(live_server) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()
    page.route("**/*", route)
    response = page.goto("/")
    assert response.ok
    wait_drawn(page, "head")
    expect(page.locator("#view-head .main-svg").first).to_be_visible()
    for view in VIEWS[1:]:
        page.locator(f'#tabs a[data-view="{view}"]').click()
        wait_drawn(page, view)
    assert outside == []
    foreign = page.evaluate("""() => [...document.querySelectorAll('script[src], link[href], img[src], iframe')]
      .map(e => e.src || e.href).filter(u => !u.startsWith(location.origin) && !u.startsWith('data:'))""")
    assert foreign == []
    assert console_errors == []


def test_no_csp_violations_in_any_view(page: Page, console_errors, csp_violations):
    response = page.goto("/?text=The+cat+sat+on+the+mat.&pin=2")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-eval" not in csp and "unsafe-inline" not in csp.split("style-src")[0]
    wait_drawn(page, "head")
    page.locator("#view-head [data-part=plot]").hover()
    for view in VIEWS:
        page.locator(f'#tabs a[data-view="{view}"]').click()
        wait_drawn(page, view)
        page.locator(f"#view-{view}").hover(position={"x": 200, "y": 200})
        if view in ("head", "model", "lines"):
            with page.expect_download():
                page.locator("#export-png").click()
    page.get_by_role("button", name="Large text").click()
    wait_drawn(page, "stages")
    page.locator("#causal").check()
    wait_drawn(page, "stages")
    screenshot(page, "stages-large")
    assert csp_violations() == []
    assert console_errors == []
