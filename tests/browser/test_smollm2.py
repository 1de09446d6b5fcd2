"""SmolLM2 in the page: the head view, the next-token panel, surprisal under the chips, key/value groups in the
model view, knocking a head out from the model view, and the compare view of that knock-out."""
from __future__ import annotations

from urllib.parse import urlencode

import httpx
from playwright.sync_api import Page, expect

from .conftest import screenshot, wait_drawn

TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy"


def goto(page: Page, base: str, **state) -> None:
    page.goto(base + "/?" + urlencode({"model": "smollm2", "text": TEXT, **state}))
    wait_drawn(page, state.get("view"), timeout=120_000)


def test_smollm2_head_view_and_next_token_panel(page: Page, live_server_smollm2, console_errors):
    goto(page, live_server_smollm2, view="head", layer=3, head=1)
    expect(page.locator("#view-head .main-svg").first).to_be_visible()
    panel = page.locator("#predictions")
    expect(panel).to_be_visible()
    expect(panel).to_have_attribute("data-top", "␣dog")                    # " dog" at 0.994 (RECIPES 9)
    bars = panel.locator("table.next-tokens tr")
    assert bars.count() == 10
    first = float(bars.first.locator("td.num").inner_text())
    assert first > 0.9
    # surprisal under each chip but the first (it has no prediction)
    chips = page.locator("#chips .chip")
    assert chips.first.get_attribute("style") is None
    assert "--surprisal" in (chips.nth(5).get_attribute("style") or "")
    ref = httpx.post(live_server_smollm2 + "/api/attention", json={"model": "smollm2", "text": TEXT,
                     "include": ["predictions"], "layers": [0], "heads": [0]}, timeout=120).json()
    assert ref["next_tokens"][0]["token"] == "␣dog" and abs(ref["next_tokens"][0]["prob"] - first) < 1e-4
    screenshot(page, "smollm2-head-and-next-token")
    assert console_errors == []


def test_knocking_a_head_out_in_the_model_view_changes_the_next_token_panel(page: Page, live_server_smollm2,
                                                                              console_errors):
    goto(page, live_server_smollm2, view="model")
    heads = page.locator("#view-model .col-head")
    expect(heads.nth(0)).to_contain_text("kv0")                             # 9 query heads, 3 key/value groups
    expect(heads.nth(8)).to_contain_text("kv2")
    before = page.locator("#predictions tr").first.locator("td.num").inner_text()
    # an induction-style head of SmolLM2 matters for " dog" on the repeat: knock out a few of layer 4's heads
    for hd in (0, 1, 2):
        page.locator(f'#view-model a.thumb[data-layer="4"][data-head="{hd}"]').click(modifiers=["Shift"])
        wait_drawn(page, "model", timeout=120_000)
    assert "ablate=4.0%2C4.1%2C4.2" in page.url or "ablate=4.0,4.1,4.2" in page.url
    expect(page.locator('#view-model a.thumb[data-layer="4"][data-head="1"]')).to_have_class("thumb ablated")
    expect(page.locator("#ablation-bar")).to_be_visible()
    panel = page.locator("#predictions")
    expect(panel.locator("table.before")).to_be_visible()                   # intact bars beside the ablated ones
    after = panel.locator("table.after tr").first.locator("td.num").inner_text()
    assert panel.locator("p.note").inner_text().startswith("With L4H0, L4H1, L4H2 knocked out")
    assert after != before or panel.locator("table.after tr").first.get_attribute("data-token-id") != \
        panel.locator("table.before tr").first.get_attribute("data-token-id")
    screenshot(page, "smollm2-knocked-out")
    # the compare view shows what the knock-out changed in a later layer
    page.locator('#tabs a[data-view="compare"]').click()
    wait_drawn(page, "compare", timeout=120_000)
    assert float(page.locator("#view-compare").get_attribute("data-max-diff")) == 0   # layer 0 runs before layer 4
    page.select_option("#layer", "10")
    wait_drawn(page, "compare", timeout=120_000)
    assert float(page.locator("#view-compare").get_attribute("data-max-diff")) > 1e-3  # a later layer moved
    screenshot(page, "smollm2-compare")
    # restoring every head brings the intact prediction back
    page.locator("#clear-ablate").click()
    wait_drawn(page, "compare", timeout=120_000)
    expect(page.locator("#predictions table.before")).to_have_count(0)
    assert page.locator("#predictions tr").first.locator("td.num").inner_text() == before
    assert console_errors == []


def test_smollm2_steps_name_its_family(page: Page, live_server_smollm2, console_errors):
    """Llama's facts, from the boot block: pre-norm RMSNorm, RoPE on queries and keys, no q/k/v biases, and
    query heads that share keys and values."""
    goto(page, live_server_smollm2, view="stages", layer=2, head=4, step=4)
    text = lambda key: page.locator(f"#view-stages [data-stage={key}] .explain").inner_text()  # noqa: E731
    assert "the residual stream after the block's RMSNorm" in text("x")
    assert "rotated by the token's position (RoPE)" in text("q") and "plus a bias" not in text("q")
    assert "Query heads 3–5 share these keys (grouped-query attention)" in text("k")
    assert "share these values" in text("v")
    assert console_errors == []
