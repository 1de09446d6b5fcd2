"""/docs, the REST API reference, renders every endpoint offline and under the CSP."""
from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser


def test_api_reference_renders_offline_under_csp(page: Page, console_errors, csp_violations, live_server):
    outside = []

    def only_own_origin(route):
        if route.request.url.startswith(live_server):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()
    page.route("**/*", only_own_origin)
    page.goto("/docs")
    for path in ("/api/models", "/api/attention", "/api/stages", "/api/models/{model_id}/onnx", "/healthz"):
        expect(page.locator(f'.opblock-summary-path[data-path="{path}"]')).to_be_visible(timeout=15_000)
    page.locator('.opblock-summary-path[data-path="/api/attention"]').click()
    expect(page.get_by_text("Attention weights, entropy and per-head statistics").first).to_be_visible()
    assert outside == [] and csp_violations() == [] and console_errors == []
