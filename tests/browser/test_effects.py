"""The Effects view on SmolLM2 (issue 22's page): an Effects link with an indirect-object pair draws the direct
logit attribution and the patching recovery of every head (30 x 9, on a stated diverging scale, equal to the API's
numbers), a head's cell opens its pattern on both texts, a knockout shows the prediction before and after, every
choice is in the URL (a reload restores it), the next-token panel picks the target and distractor, a map exports,
and a model without an LM head is told so."""
from __future__ import annotations

import csv
import io
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Page, expect

from .conftest import plot_point, screenshot, wait_drawn

pytestmark = pytest.mark.browser
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
VIEW = "#view-effects"
MAP = VIEW + " [data-part=maps] [data-part={}] [data-part=plot]"

# the first heatmap of a Plotly plot: its z's shape, how many values are non-zero, its range and its colour bar
HEATMAP_JS = """(sel) => {
  const gd = document.querySelector(sel), t = gd.data[0], z = t.z;
  return {rows: z.length, cols: z[0].length, nonzero: z.flat().filter((v) => v !== null && v !== 0).length,
          zmin: t.zmin, zmid: t.zmid, zmax: t.zmax, title: t.colorbar.title.text,
          shown: [...gd.querySelectorAll('.colorbar .cbtitle text, .cbtitle text')].map((e) => e.textContent).join(' '),
          z};
}"""


def goto(page: Page, base: str, **state) -> None:
    page.goto(base + "/?" + urlencode({"model": "smollm2", "view": "effects", **state}))
    wait_drawn(page, "effects", timeout=120_000)


def heatmap(page: Page, sel: str) -> dict:
    return page.evaluate(HEATMAP_JS, sel)


def flat(rows) -> list[float]:
    return [v for r in rows for v in r]


def test_effects_maps_head_patterns_and_knockout(page: Page, live_server_smollm2, console_errors):
    base = live_server_smollm2
    goto(page, base, text=CLEAN, corrupt=CORRUPT, target="␣Mary", distractor="␣John")
    metric = {"target": "␣Mary", "distractor": "␣John"}
    dla_ref = httpx.post(base + "/api/attention", json={"model": "smollm2", "text": CLEAN, "include": ["attribution"],
                         **metric}, timeout=120).json()["attribution"]
    patch_ref = httpx.post(base + "/api/patching", json={"model": "smollm2", "clean": CLEAN, "corrupt": CORRUPT, **metric},
                           timeout=120).json()

    # both maps: 30 layers x 9 heads, non-empty, diverging round 0 on a symmetric range, the unit on the colour bar
    dla, rec = heatmap(page, MAP.format("dla")), heatmap(page, MAP.format("patching"))
    for got in (dla, rec):
        assert (got["rows"], got["cols"]) == (30, 9) and got["nonzero"] > 200
        assert got["zmid"] == 0 and got["zmin"] == -got["zmax"] and got["zmax"] > 0
    assert dla["title"] == "DLA (logit units)" and "DLA (logit units)" in dla["shown"]
    # the bar's title in a word (issue 51: the whole definition ran off the plot); the definition is the hover's
    assert rec["title"] == "recovery" and "recovery" in rec["shown"]
    assert flat(dla["z"]) == pytest.approx(flat(dla_ref["heads"]), abs=1e-6)
    assert flat(rec["z"]) == pytest.approx(flat(patch_ref["recovery"]), abs=1e-6)
    assert max(abs(v) for r in dla["z"] for v in r) == pytest.approx(dla["zmax"])
    notes = page.locator(f"{VIEW} [data-part=maps] [data-part=note]")
    expect(notes.nth(0)).to_contain_text("all parts sum to")
    expect(notes.nth(1)).to_contain_text("The texts differ at 9 “␣John” → “␣Mary”")
    # the next-token panel marks the target and the distractor
    panel = page.locator("#predictions")
    expect(panel.locator('button.pick.target[data-token="␣Mary"]')).to_have_count(1)
    expect(panel.locator('button.pick.distractor[data-token="␣John"]')).to_have_count(1)
    screenshot(page, "effects-maps")

    # a head's cell opens its pattern on both texts: the head that recovers most
    layer, head = max(((l, hd) for l in range(30) for hd in range(9)), key=lambda x: patch_ref["recovery"][x[0]][x[1]])
    expect(page.locator("#effects-open-head")).to_have_text("Show layer 0, head 0 on both texts")   # closed
    plot = MAP.format("patching")
    page.locator(plot).scroll_into_view_if_needed()
    page.mouse.click(*plot_point(page, plot, head, layer))
    wait_drawn(page, "effects", timeout=120_000)
    assert "open_head=1" in page.url and f"layer={layer}" in page.url and f"head={head}" in page.url
    patterns = page.locator(f"{VIEW} [data-part=patterns]")
    expect(patterns).to_be_visible()
    expect(patterns).to_have_attribute("data-layer", str(layer))
    expect(patterns).to_have_attribute("data-head", str(head))
    expect(patterns.locator("h3").first).to_have_text(f"Layer {layer}, head {head} on both texts")
    for which, text in (("clean", CLEAN), ("corrupt", CORRUPT)):
        got = heatmap(page, f"{VIEW} [data-part=patterns] [data-part={which}] [data-part=plot]")
        ref = httpx.post(base + "/api/attention", json={"model": "smollm2", "text": text, "layers": [layer],
                         "heads": [head], "include": ["attention"]}, timeout=120).json()["attention"][0][0]
        assert (got["rows"], got["cols"]) == (14, 14)
        assert flat(got["z"]) == pytest.approx(flat(ref), abs=1e-6)

    # knockout: the last token (the query) stops reading both names in every layer
    chips = page.locator(f"{VIEW} .knockout-chips .chip")
    expect(chips).to_have_count(14)
    expect(page.locator("#knockout-run")).to_be_disabled()
    for i in (13, 1, 3):
        chips.nth(i).click()
        wait_drawn(page, "effects", timeout=120_000)
    assert "queries=13" in page.url and ("keys=1%2C3" in page.url or "keys=1,3" in page.url)
    expect(chips.nth(13)).to_have_class("chip query")
    page.locator("#knockout-run").click()
    wait_drawn(page, "effects", timeout=120_000)
    assert "knockout=1" in page.url
    result = page.locator(f"{VIEW} .knockout-result")
    expect(result.locator("table.before")).to_be_visible()
    expect(result.locator("table.after")).to_be_visible()
    ko_ref = httpx.post(base + "/api/knockout", json={"model": "smollm2", "text": CLEAN, "queries": [13], "keys": [1, 3],
                        "layers": [0, 29]}, timeout=120).json()["effect"]
    assert float(result.get_attribute("data-kl")) == pytest.approx(ko_ref["kl"], abs=1e-9) and ko_ref["kl"] > 0
    assert result.locator("table.before th.tok").first.inner_text() == "␣Mary"
    assert result.locator("table.after th.tok").first.inner_text() == ko_ref["next_tokens_after"][0]["token"]
    expect(result.locator("p.note")).to_contain_text("KL(before ‖ after)")
    screenshot(page, "effects-head-and-knockout")

    # the link restores everything: texts, target, distractor, site, the open head and the knockout
    url = page.url
    page.goto(url)
    wait_drawn(page, "effects", timeout=120_000)
    expect(page.locator("#effects-corrupt")).to_have_value(CORRUPT)
    expect(page.locator("#effects-target")).to_have_value("␣Mary")
    expect(page.locator("#effects-distractor")).to_have_value("␣John")
    expect(page.locator("#effects-site")).to_have_value("head_output")
    expect(patterns).to_have_attribute("data-head", str(head))
    assert heatmap(page, f"{VIEW} [data-part=patterns] [data-part=corrupt] [data-part=plot]")["rows"] == 14
    assert float(result.get_attribute("data-kl")) == pytest.approx(ko_ref["kl"], abs=1e-9)

    # the DLA map's own CSV: a row per layer, a column per head
    with page.expect_download() as dl:
        page.locator(f'{VIEW} [data-part=dla] button[data-export="csv"]').click()
    rows = list(csv.reader(io.StringIO(open(dl.value.path(), encoding="utf-8").read())))
    assert rows[0] == ["layer"] + [f"head {h}" for h in range(9)] and len(rows) == 31
    assert float(rows[1 + layer][1 + head]) == pytest.approx(dla_ref["heads"][layer][head], abs=1e-6)

    page.locator("#effects-close-head").click()
    wait_drawn(page, "effects", timeout=120_000)
    assert "open_head" not in page.url
    expect(page.locator(f"{VIEW} [data-part=patterns] [data-part=grid]")).to_be_hidden()

    # the next-token panel picks: shift+click makes "␣the" the distractor, a click makes it the target (a swap)
    panel.locator('button.pick[data-token="␣the"]').click(modifiers=["Shift"])
    wait_drawn(page, "effects", timeout=120_000)
    assert "distractor=%E2%90%A3the" in page.url and "target=%E2%90%A3Mary" in page.url
    expect(page.locator("#effects-distractor")).to_have_value("␣the")
    # the residual stream is patched per position: a layer x position map, the tokens along its axis
    page.select_option("#effects-site", "residual")
    wait_drawn(page, "effects", timeout=120_000)
    assert "site=residual" in page.url
    res = heatmap(page, MAP.format("patching"))
    assert (res["rows"], res["cols"]) == (30, 14) and res["nonzero"] > 0 and res["zmin"] == -res["zmax"]
    ticks = page.locator(f"{VIEW} [data-part=maps] [data-part=patching] .xtick text").all_text_contents()
    assert ticks[9] == "9 ␣John"
    expect(page.locator(f"{VIEW} [data-part=maps] [data-part=patching] h3")).to_contain_text("residual stream")
    screenshot(page, "effects-residual")
    assert console_errors == []


def test_effects_path_patching_form(page: Page, live_server_smollm2, console_errors):
    """Receiver heads typed in the form (L23H3's query) draw a third map, each head the sender of paths to it, equal
    to POST /api/path_patching's; the receivers are in the URL (another input is another map's minutes on CI: the
    API's tests cover key and value)."""
    base = live_server_smollm2
    goto(page, base, text=CLEAN, corrupt=CORRUPT, target="␣Mary", distractor="␣John")
    expect(page.locator(MAP.format("path"))).to_have_count(0)
    page.fill("#effects-receivers", "L23H3")
    page.locator("#view-effects form[data-part=controls] button[type=submit]").click()
    wait_drawn(page, "effects", timeout=120_000)
    assert "receivers=23.3" in page.url
    ref = httpx.post(base + "/api/path_patching", json={"model": "smollm2", "clean": CLEAN, "corrupt": CORRUPT,
                     "target": "␣Mary", "distractor": "␣John", "receivers": [[23, 3]], "receiver_input": "query"},
                     timeout=120).json()
    got = heatmap(page, MAP.format("path"))
    assert (got["rows"], got["cols"]) == (30, 9) and got["zmid"] == 0
    assert flat(got["z"]) == pytest.approx(flat(ref["recovery"]), abs=1e-6)
    assert all(v == pytest.approx(1.0, abs=1e-4) for v in flat(got["z"][23:]))     # no path from layer 23 up
    expect(page.locator(f"{VIEW} [data-part=maps] [data-part=path] h3")).to_have_text("Path patching into L23H3 (query)")
    page.goto(page.url)                                                          # the link restores the form
    wait_drawn(page, "effects", timeout=120_000)
    expect(page.locator("#effects-receivers")).to_have_value("23.3")
    expect(page.locator("#effects-receiver-input")).to_have_value("query")
    assert heatmap(page, MAP.format("path"))["z"] == got["z"]
    screenshot(page, "effects-path-patching")
    assert console_errors == []


def test_effects_without_an_lm_head_says_so(page: Page, live_server_smollm2, console_errors):
    goto(page, live_server_smollm2, model="tiny-gpt", text="the cat sat on the mat", target="␣the")
    # the tab is disabled with the capability record's reason, and opened it says so where the maps would be
    expect(page.locator('#tabs a[data-view="effects"]')).to_have_attribute("aria-disabled", "true")
    note = page.locator(f"{VIEW} .note.refused")
    expect(note).to_contain_text("no LM head: it predicts no next token")
    expect(note.locator("a")).to_have_text("SmolLM2-135M-Instruct")
    expect(page.locator("#effects-corrupt")).to_be_hidden()
    assert page.locator(f"{VIEW} .js-plotly-plot").count() == 0
    assert console_errors == []


def test_typed_target_says_which_token_it_became(page: Page, live_server_smollm2, console_errors):
    """"Mary" and " Mary" are both SmolLM2 tokens, and they answer differently: a typed "Mary" is shown as the token it
    became (its rank among the next tokens, the API's), with " Mary" offered; one click uses it. A text that is no
    single token is refused with its pieces named."""
    goto(page, live_server_smollm2, text=CLEAN, target="Mary")
    typed = page.locator(f"{VIEW} [data-part=maps] [data-part=dla] .typed-target")
    r = httpx.post(live_server_smollm2 + "/api/attention", json={"model": "smollm2", "text": CLEAN, "target": "Mary",
                                                                  "include": ["attribution"]}, timeout=120)
    target = r.json()["attribution"]["target"]
    assert (target["token"], target["typed"], target["other"]["token"]) == ("Mary", "Mary", "␣Mary")
    assert target["other"]["rank"] == 1 < target["rank"]          # " Mary" is the answer; "Mary" far down
    expect(typed).to_have_attribute("data-token", "Mary")
    expect(typed).to_contain_text(f"Target “Mary” (id {target['id']}): rank {target['rank']} among the next tokens")
    expect(typed).to_contain_text("“␣Mary” is a token too: rank 1 among the next tokens")
    typed.locator("button.use-other").click()
    wait_drawn(page, "effects", timeout=120_000)
    assert "target=%E2%90%A3Mary" in page.url
    expect(typed).to_have_attribute("data-token", "␣Mary")
    expect(typed).to_contain_text("“Mary” is a token too")
    assert console_errors == []
    goto(page, live_server_smollm2, text=CLEAN, target="Maryland Johnson")
    expect(page.locator(f"{VIEW} [data-part=maps] [data-part=dla] [data-part=note]")).to_contain_text(
        "is not one token: it splits into 3, ['Mary', 'land', '␣Johnson']")
    assert console_errors and all("status of 422" in e for e in console_errors)   # the refusal itself, only
