"""The page at 1280x720: the visualisation is the page. The text and model in one bar, the controls and the folding
panels beside the view, so the active view's picture starts on screen (its bounding box) after a load, after a model
switch and while a generation streams. And every tab on every model the suite serves either draws its figure or says,
in the model's capability record's words, why that model cannot do it, without a request answering 4xx/5xx and
without a console error. (Gemma 3's family and a tiny BART: tests/browser/test_local_layers.py, test_encdec_page.py.)"""
from __future__ import annotations

from urllib.parse import urlencode

import httpx
import numpy as np
import pytest
from playwright.sync_api import Page, expect

from .conftest import (EXAMPLE, PLOT_BOX_JS, SMALL_SCREEN, assert_plot_on_screen, assert_plot_seen, screenshot,
                       wait_drawn)

pytestmark = pytest.mark.browser
TEXT = "When Mary and John went to the store, John gave a drink to"
TEXT_B = "When John and Mary went to the store, Mary gave a drink to"    # the Compare view's B
CORRUPT = TEXT    # patched into itself: a zero map, but drawn (a corrupt text of the same token count in every vocabulary)
# views that draw from a file or a job the user brings (a corpus result, an atlas job): opened, they draw their form
BRING_THEIR_OWN = {"corpus", "atlas"}
FIGURE = ".js-plotly-plot .main-svg, .lines-svg, .thumb-grid canvas, .stage-table"


def failed_requests(page: Page) -> list[str]:
    seen: list[str] = []
    page.on("response", lambda r: seen.append(f"{r.status} {r.request.method} {r.url}") if r.status >= 400 else None)
    return seen


def test_view_on_screen_after_load_and_model_switch(page: Page, live_server, console_errors):
    page.set_viewport_size(SMALL_SCREEN)
    page.goto("/?" + urlencode({"text": TEXT}))
    wait_drawn(page)
    first = assert_plot_on_screen(page)
    screenshot(page, "layout-minilm", full_page=False)
    # the tabs grouped by the question each view answers, every view once
    groups = page.locator("#tabs .tab-group")
    assert [groups.nth(i).get_attribute("aria-label") for i in range(groups.count())] == [
        "Where heads look", "Why", "What they do", "Over a corpus"]
    assert [groups.nth(i).locator("a").evaluate_all("as => as.map(a => a.dataset.view)")
            for i in range(groups.count())] == [["head", "lines", "model", "summary", "entropy", "compare"],
                                                 ["stages", "circuits"], ["effects", "lens", "cache"], ["corpus", "atlas"]]
    for model in ("induction", "tiny-gpt"):
        page.select_option("#model", model)
        page.wait_for_function("(m) => location.search.includes('model=' + m)", arg=model)
        wait_drawn(page)
        box = assert_plot_on_screen(page)
        assert box["view"] == first["view"]
    # the panels fold: Generate is folded, its reason on it, for a model that cannot generate
    page.select_option("#model", "minilm")
    wait_drawn(page)
    expect(page.locator("#generate")).not_to_have_attribute("open", "")
    expect(page.locator("#gen-summary")).to_contain_text("an encoder: it predicts no next token")
    assert console_errors == []


# once the Generate panel says it is running with at least 3 new tokens: the picture's box (PLOT_BOX_JS) then, kept
# in window.whileGenerating.box (null: no picture, which assert_plot_seen reports). A MutationObserver runs after every
# change of the panel's state, however busy the page.
MEASURE_WHILE_GENERATING_JS = f"""() => {{
  const panel = document.getElementById('generate');
  new MutationObserver((_, observer) => {{
    if (panel.dataset.state !== 'running' || Number(panel.dataset.tokens) < 3) return;
    window.whileGenerating = {{ box: ({PLOT_BOX_JS})() }};
    observer.disconnect();
  }}).observe(panel, {{ attributes: true, attributeFilter: ['data-state', 'data-tokens'] }});
}}"""


def test_view_on_screen_while_generating(page: Page, live_server_smollm2, console_errors):
    page.set_viewport_size(SMALL_SCREEN)
    page.goto(live_server_smollm2 + "/?" + urlencode({"model": "smollm2", "text": TEXT, "max_new_tokens": 12,
                                                      "greedy": 1}))
    wait_drawn(page)
    assert_plot_on_screen(page)
    expect(page.locator("#generate")).to_have_attribute("open", "")
    # the picture is measured in the page when the panel first says "running" with 3 tokens or more: a poll from
    # here can miss that moment altogether on a busy core (seen: the main thread drew from 4 tokens to the end)
    page.evaluate(MEASURE_WHILE_GENERATING_JS)
    page.locator("#gen-run").click()     # the page scrolls to it (the side panel scrolls with the page: issue 51)
    box = page.wait_for_function("() => window.whileGenerating", timeout=60_000).json_value()["box"]
    assert_plot_seen(page, box=box)      # the head view grows where it is seen: still 200 px of it on screen
    screenshot(page, "layout-generating", full_page=False)
    expect(page.locator("#generate")).to_have_attribute("data-state", "done", timeout=60_000)
    wait_drawn(page)
    page.evaluate("scrollTo(0, 0)")
    assert_plot_on_screen(page)
    assert console_errors == []


def open_every_tab(page: Page, base: str, model: str, failed: list[str]) -> dict[str, str]:
    """Open each tab of `model` (a click, as a user would); returns view -> "figure" or the reason shown."""
    info = next(m for m in httpx.get(base + "/api/models").json() if m["id"] == model)
    caps = info["capabilities"]
    # where direct logit attribution is refused, the effects tab draws its patching map (a corrupt text given)
    corrupt = {} if caps["features"]["attribution"] else {"corrupt": CORRUPT}
    page.goto(base + "/?" + urlencode({"model": model, "text": TEXT, "text_b": TEXT_B, **corrupt}))
    wait_drawn(page)
    seen = {}
    for view in page.locator("#tabs a").evaluate_all("(as) => as.map((a) => a.dataset.view)"):
        tab = page.locator(f'#tabs a[data-view="{view}"]')
        refused = not caps["features"][view]
        tab.click(force=refused)               # a disabled tab (aria-disabled) still opens, to say why
        wait_drawn(page, view, timeout=60_000)
        box = page.locator(f"#view-{view}")
        if refused:
            reason = caps["short"][view]
            expect(tab).to_have_attribute("aria-disabled", "true")
            expect(tab).to_have_attribute("title", f"Not for {info['title']}: {reason}")
            expect(box.locator(".note.refused")).to_contain_text(reason)
            assert box.locator(".js-plotly-plot").count() == 0
            seen[view] = reason
            continue
        expect(tab).not_to_have_attribute("aria-disabled", "true")
        if view == "effects":                    # a target picked in the next-token panel, as the view asks
            page.locator("#predictions button.pick").first.click()
            wait_drawn(page, view, timeout=60_000)
        if view not in BRING_THEIR_OWN:
            expect(box.locator(FIGURE).first).to_be_attached(timeout=30_000)
        seen[view] = "figure"
    assert failed == [], failed
    return seen


def test_every_tab_on_every_model(page: Page, live_server, console_errors):
    failed = failed_requests(page)
    for model in ("minilm", "tiny-gpt", "induction"):
        seen = open_every_tab(page, live_server, model, failed)
        if model == "minilm":                  # an encoder: no next token, no unembedding
            assert seen["effects"] == "an encoder: it predicts no next token"
            assert seen["lens"] == "no unembedding: no tokens can be read out of its stream"
        assert seen["head"] == seen["model"] == "figure"
    assert console_errors == []


def test_every_tab_on_smollm2(page: Page, live_server_smollm2, console_errors):
    failed = failed_requests(page)
    seen = open_every_tab(page, live_server_smollm2, "smollm2", failed)
    assert {v for v, s in seen.items() if s != "figure"} == set()
    assert console_errors == []


def test_compare_difference_fitted_to_its_largest_value(page: Page, live_server, api, console_errors):
    """The Compare view's A − B map is drawn on ± its largest |A − B| (the API's own matrices), not on ±1, unless
    "fixed" is chosen; its numbers are shown to 4 significant digits."""
    state = {"view": "compare", "text": TEXT, "text_b": TEXT_B, "layer": 2, "head": 3}
    page.goto("/?" + urlencode(state))
    wait_drawn(page, "compare")
    a, b = (np.array(api(text=t, layers=[2], heads=[3], include=["attention"])["attention"][0][0]) for t in (TEXT, TEXT_B))
    n = min(len(a), len(b))
    largest = float(np.abs(a[:n, :n] - b[:n, :n]).max())
    assert 0.05 < largest < 0.9                          # a map ±1 would draw washed out
    plot = page.locator("#view-compare [data-part=d]")
    rng = plot.evaluate("(gd) => [gd.data[0].zmin, gd.data[0].zmax, gd.data[0].zmid]")
    assert rng[1] == pytest.approx(largest, abs=1e-6) and rng[0] == -rng[1] and rng[2] == 0
    note = page.locator("#view-compare [data-part=note]").inner_text()
    assert f"Largest |A − B| = {float(f'{largest:.4g}'):g}" in note and "fitted symmetric scale" in note
    expect(page.locator("#signed-field")).to_be_visible()
    page.select_option("#signed", "fixed")
    wait_drawn(page, "compare")
    assert "signed=fixed" in page.url
    assert plot.evaluate("(gd) => [gd.data[0].zmin, gd.data[0].zmax]") == [-1, 1]
    assert console_errors == []


def test_marks_have_a_legend(page: Page, live_server_smollm2, console_errors):
    """Every mark on the token strip has a legend: the one space mark (␣, the same in every model), the surprisal
    underline of a decoder's tokens, the pinned token."""
    page.goto(live_server_smollm2 + "/?" + urlencode({"model": "smollm2", "text": TEXT, "pin": 3}))
    wait_drawn(page)
    legend = page.locator("#chips-legend")
    expect(legend.locator('[data-mark="space"]')).to_contain_text("␣ a space (in every model's tokens)")
    expect(legend.locator('[data-mark="surprisal"]')).to_contain_text("surprisal, −log p(token | the tokens before)")
    expect(legend.locator('[data-mark="pinned"]')).to_contain_text("pinned query")
    chips = page.locator("#chips .chip .tok").all_inner_texts()
    assert chips[1] == "␣Mary" and not any("▁" in t or "Ġ" in t for t in chips)
    assert console_errors == []


def test_first_screen_measured_head_examples_and_coloured_text(page: Page, live_server, api, console_errors):
    """A fresh visit shows the head with the clearest pattern on the text, measured from the answer's own per-head
    statistics (sharp rows, little weight on the sinks or the query itself); the text coloured by the last query's
    weights, as the API gives them; the Examples menu holds the model's example texts, a choice runs it."""
    page.set_viewport_size(SMALL_SCREEN)
    page.goto("/")
    page.wait_for_function("() => location.search.includes('layer=')")
    wait_drawn(page, "head")
    ans = api(text=EXAMPLE, include=["summary"])       # every head's statistics, as the page's first request
    s, T = ans["summary"], len(ans["tokens"])
    sink = np.maximum.reduce([np.array(s[k]) for k in ("first_token_mass", "last_token_mass", "diagonal_mass")])
    score = (1 - np.array(s["mean_entropy"]) / np.log(T)) * (1 - sink)
    layer, head = np.unravel_index(np.argmax(score), score.shape)
    assert f"layer={layer}&head={head}" in page.url
    assert_plot_on_screen(page)
    # the text view: every token coloured by the last query's weight on it
    row = api(text=EXAMPLE, layers=[int(layer)], heads=[int(head)], include=["attention"])["attention"][0][0][-1]
    text = page.locator("#view-head [data-part=text]")
    expect(text).to_have_attribute("data-query", str(T - 1))
    weights = text.locator(".ct").evaluate_all("(s) => s.map((e) => Number(e.dataset.weight))")
    np.testing.assert_allclose(weights, row, atol=1e-6)
    text.locator('.ct[data-index="2"]').click()                 # a click pins that query: its row colours the text
    wait_drawn(page, "head")
    assert "pin=2" in page.url
    expect(text).to_have_attribute("data-query", "2")
    # the examples of an encoder with sentence pairs
    labels = page.locator("#examples option").all_inner_texts()[1:]
    assert labels == ["Induction: a text that repeats", "Garden path: the old man the boat",
                      "Coreference: what was too tired?", "Sentence pair: a question and its answer"]
    page.select_option("#examples", "pair")
    wait_drawn(page, "head")
    expect(page.locator("#text")).to_have_value("Where did the cat sleep?")
    expect(page.locator("#text-pair")).to_have_value("The cat slept on the warm mat.")
    assert "text_pair=The+cat+slept" in page.url and "pin=" not in page.url
    assert console_errors == []


def test_first_picture_before_plotly_then_the_figure(page: Page, live_server, api, console_errors):
    """The page's script is one request (app/bundle.py), each module in it exporting what the browser reads in the
    module itself; plotly.js held back, the first picture is already there: a canvas of the measured head's matrix,
    every cell the colour scale.js gives the API's weight, and the page not yet counted as drawn (the tests' signal);
    plotly.js let through, Plotly's figure takes the canvas's place."""
    held = []
    page.route("**/vendor/plotly.min.js", lambda route: held.append(route))   # answered when the test says so
    page.set_viewport_size(SMALL_SCREEN)
    page.goto("/")
    page.wait_for_function("() => performance.getEntriesByName('attnscope:first-picture').length > 0")
    assert page.evaluate("() => [window.Plotly === undefined, document.getElementById('view-area').ariaBusy, "
                         "document.getElementById('view-head').dataset.renders]") == [True, "true", "0"]
    sketch = page.locator("#view-head [data-part=plot] canvas.plot-sketch")
    expect(sketch).to_be_visible()
    layer, head = (int(page.locator(f"#{k}").input_value()) for k in ("layer", "head"))
    weights = np.array(api(text=EXAMPLE, layers=[layer], heads=[head], include=["attention"])["attention"][0][0])
    painted, expected = sketch.evaluate("""(c, w) => import('/bundle/main.js').then(({ modules }) => {
      const [px, py, pw, ph, nr, nc] = c.dataset.area.split(' ').map(Number), g = c.getContext('2d');
      const k = c.width / c.clientWidth, rgb = (s) => s.match(/\\d+/g).map(Number);
      const at = (a, b) => [...g.getImageData(Math.floor((px + (b + 0.5) * pw / nc) * k),
                                              Math.floor((py + (a + 0.5) * ph / nr) * k), 1, 1).data.slice(0, 3)];
      return [w.map((r, a) => r.map((_, b) => at(a, b))), w.map((r) => r.map((v) => rgb(modules['scale.js'].color(v))))];
    })""", weights.tolist())
    assert np.abs(np.array(painted) - np.array(expected)).max() <= 1
    assert len(set(map(tuple, np.array(expected).reshape(-1, 3)))) >= 2       # a pattern, not one flat colour
    for route in held:
        route.continue_()
    wait_drawn(page, "head")
    expect(sketch).to_have_count(0)
    expect(page.locator("#view-head [data-part=plot] .main-svg").first).to_be_visible()
    assert page.evaluate("() => performance.getEntriesByName('attnscope:first-picture').map((m) => m.detail)") == ["sketch"]
    # one request for our code; each bundled module exports what the browser reads in the module itself
    ours = page.evaluate("() => performance.getEntriesByType('resource').map((e) => new URL(e.name).pathname)"
                         ".filter((p) => p.startsWith('/static/js/') || p.startsWith('/bundle/'))")
    assert ours == ["/bundle/main.js"]
    differ = page.evaluate("""() => import('/bundle/main.js').then(async ({ modules }) => {
      const names = Object.keys(modules).filter((n) => n !== 'main.js'), bad = [];
      for (const n of names) {
        const own = Object.keys(await import('/static/js/' + n)).sort().join(), ours = Object.keys(modules[n]).sort().join();
        if (own !== ours) bad.push([n, own, ours]);
      }
      return [names.length, bad];
    })""")
    assert differ[0] > 40 and differ[1] == []
    assert console_errors == []
