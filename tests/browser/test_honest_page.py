"""The page a newcomer meets (issue 51), the rest of it: honest about length, no developer words in what a visitor
reads, nothing cut off. Each test is named after the defect it reproduced (seen failing before its fix). One page
per server for the module (browser time is the suite's budget)."""
from __future__ import annotations

import re
import math
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import expect

from .conftest import EXAMPLE, wait_drawn

pytestmark = pytest.mark.browser
# a 3,000-word article (the issue's): every test model cuts it
ARTICLE = " ".join(("The committee met on Tuesday to discuss the budget, and after a long debate the members agreed "
                    "that the new library would open in spring. ").split() * 120)
ARTICLE = " ".join(ARTICLE.split()[:3000])
# ~300 SmolLM2 tokens in under the page's long-text length: one quick stacked run, over the patching-style limit (256)
MEDIUM = " ".join(["cat", "dog", "sun"] * 100)


# Every visible control's text against its box: a menu's longest choice, a field's value or placeholder, a text box's
# lines, any other element's text (scrollWidth > clientWidth), Plotly's titles, ticks and colour bars inside their
# plot, and the page no wider than the window. Returns what is cut, in words.
CUT_JS = """() => {
  const canvas = document.createElement("canvas"), g = canvas.getContext("2d");
  const textWidth = (el, text) => { const cs = getComputedStyle(el); g.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`; return g.measureText(text).width; };
  const visible = (el) => { if (!el.getClientRects().length) return false; const cs = getComputedStyle(el); if (cs.visibility === "hidden") return false;
    for (let e = el; e; e = e.parentElement) { if (e.hidden || (e.tagName === "DETAILS" && !e.open && !(el.closest("summary")))) return false; } return true; };
  const name = (el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}${el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\s+/).join(".") : ""}`;
  const pad = (el) => { const cs = getComputedStyle(el); return parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight) + parseFloat(cs.borderLeftWidth) + parseFloat(cs.borderRightWidth); };
  const cut = [];
  for (const el of document.querySelectorAll("select, input, textarea, button, a, label, summary, legend, .chip, th, td, .tab-group-label, h2, p, li, span")) {
    if (!visible(el) || el.closest(".js-plotly-plot, .lines-svg, svg, .visually-hidden")) continue;
    const box = el.getBoundingClientRect();
    if (el.tagName === "SELECT") {
      const longest = Math.max(0, ...[...el.options].map((o) => textWidth(el, o.text)));
      const room = box.width - pad(el) - 18;          // the arrow
      if (longest > room + 1) cut.push(`${name(el)}: longest choice ${Math.round(longest)} px in ${Math.round(room)} px`);
    } else if (el.tagName === "INPUT" && ["text", "number", "search", ""].includes(el.type)) {
      const t = el.value || el.placeholder || "";
      const w = textWidth(el, t) + (el.type === "number" ? 18 : 0), room = box.width - pad(el);
      if (w > room + 1) cut.push(`${name(el)}: "${t.slice(0, 30)}" ${Math.round(w)} px in ${Math.round(room)} px`);
    } else if (el.tagName === "TEXTAREA") {
      if (el.scrollHeight > el.clientHeight + 2) cut.push(`${name(el)}: ${el.scrollHeight} px of text in ${el.clientHeight} px`);
      const t = el.value ? "" : el.placeholder || "";
      if (t && textWidth(el, t) > el.clientWidth - pad(el) + 1) cut.push(`${name(el)}: placeholder "${t}" wider than its box`);
    } else {
      const cs = getComputedStyle(el);
      const clips = cs.overflowX !== "visible" || cs.textOverflow === "ellipsis";
      if (el.scrollWidth > el.clientWidth + 1 && (clips || el.tagName !== "SPAN") && el.clientWidth > 0 && cs.display !== "inline")
        cut.push(`${name(el)}: "${el.textContent.trim().slice(0, 40)}" ${el.scrollWidth} px in ${el.clientWidth} px`);
    }
  }
  // Plotly's titles, axis titles, tick labels and colour bars: inside their plot's own box
  for (const gd of document.querySelectorAll(".js-plotly-plot")) {
    if (!visible(gd)) continue;
    const r = gd.getBoundingClientRect();
    for (const t of gd.querySelectorAll(".main-svg text")) {
      if (!t.textContent.trim() || !t.getClientRects().length) continue;
      const b = t.getBoundingClientRect();
      if (b.width === 0) continue;
      if (b.left < r.left - 1 || b.right > r.right + 1 || b.top < r.top - 1 || b.bottom > r.bottom + 1)
        cut.push(`plot ${gd.id || gd.parentElement.dataset.part || ""} text "${t.textContent.slice(0, 30)}" outside its plot (${Math.round(b.left - r.left)},${Math.round(b.top - r.top)} ${Math.round(b.width)}x${Math.round(b.height)} in ${Math.round(r.width)}x${Math.round(r.height)})`);
    }
  }
  // the line view's SVG labels: inside their SVG
  for (const svg of document.querySelectorAll(".view:not([hidden]) svg.lines-svg, .view:not([hidden]) .lines-svg svg")) {
    const r = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll("text")) {
      const b = t.getBoundingClientRect();
      if (!t.textContent.trim() || b.width === 0) continue;
      if (b.left < r.left - 1 || b.right > r.right + 1 || b.top < r.top - 1 || b.bottom > r.bottom + 1)
        cut.push(`lines svg text "${t.textContent.slice(0, 20)}" outside its svg`);
    }
  }
  // the page itself: nothing sideways past the window
  if (document.documentElement.scrollWidth > innerWidth + 1) cut.push(`page: ${document.documentElement.scrollWidth} px wide in ${innerWidth}`);
  return [...new Set(cut)];
}"""
SIZES = ({"width": 1280, "height": 720}, {"width": 1440, "height": 900})


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
    """3,000 words: each model says on screen how much it read of how much (the whole text's tokens, counted by the
    server: the banner's total was once an estimate from the characters read), and which served model reads more."""
    for model, limit, more in (("minilm", 256, "Tiny GPT (teaching) reads 512 tokens"),
                               ("tiny-gpt", 512, "No served model reads more"),
                               ("induction", 256, "Tiny GPT (teaching) reads 512 tokens")):
        visit(tab, live_server, model=model, text=ARTICLE)
        note = tab.locator("#length-note")
        expect(note).to_be_visible()
        expect(note).to_contain_text(more)
        assert int(note.get_attribute("data-read")) == limit
        whole = httpx.post(live_server + "/api/attention", json={"model": model, "text": ARTICLE, "include": []},
                           timeout=60).json()["text_tokens"]
        assert int(note.get_attribute("data-total")) == whole and 2_500 < whole < 9_000, note.inner_text()
        expect(note).to_contain_text(f"Read {limit} of {whole:,} tokens.")
        assert "about" not in note.inner_text().split(".")[0]
        box = note.bounding_box()
        assert box and box["y"] + box["height"] < 720, box                       # on the first screen
    # a text it reads whole says nothing
    visit(tab, live_server, model="minilm", text="The cat sat on the mat.")
    expect(tab.locator("#length-note")).to_be_hidden()
    assert tab.errors == []


# every text the status line and the run's progress label show, in turn (installed before the page's scripts run;
# the bar itself appears only after PROGRESS_AFTER_MS, and a fast first layer replaces its estimate before then)
PROGRESS_LABELS_JS = """
window.progressLabels = [];
new MutationObserver(() => {
  for (const id of ["status", "run-progress-label"]) {
    const t = document.getElementById(id)?.textContent;
    if (t && !window.progressLabels.includes(t)) window.progressLabels.push(t);
  }
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


@pytest.mark.slow
@pytest.mark.parametrize("server,model,title,reads", [
    ("live_server_smollm2", "smollm2", "SmolLM2-135M-Instruct", 8_192), ("live_server_gemma3", "gemma3", "Gemma 3 270M", 32_768)])
def test_long_text_read_whole_says_so(tab, request, server, model, title, reads):
    """The same 3,000 words on the zoo models that read all of it (SmolLM2 8,192 tokens, Gemma 3 32,768): before the
    long run the page says about how many tokens and how long, then layer by layer with the time left (the issue: 40 s
    behind a bar with no estimate); the banner says on screen that all of it was read, how many tokens that is, and
    how many the model reads (one long run each)."""
    base = request.getfixturevalue(server)
    tab.add_init_script(PROGRESS_LABELS_JS)
    tab.goto(base + "/?" + urlencode({"model": model, "text": ARTICLE}))
    wait_drawn(tab, None, timeout=600_000)
    labels = tab.evaluate("window.progressLabels")
    assert any(re.fullmatch(r"Running .+ on about [\d,]+ tokens: about \d+ (s|min \d+ s)( and .+)?…", t) for t in labels), labels
    assert any(re.fullmatch(r"Running the model: layer \d+ of \d+ · about \d+ (s|min \d+ s) left", t) for t in labels), labels
    note = tab.locator("#length-note")
    expect(note).to_be_visible()
    read, total = int(note.get_attribute("data-read")), int(note.get_attribute("data-total"))
    assert read == total and 2_500 < read < 9_000, note.inner_text()
    expect(note).to_contain_text(f"Read all {read:,} tokens of the text ({title} reads up to {reads:,}).")
    box = note.bounding_box()
    assert box and box["y"] + box["height"] < 720, box                           # on the first screen
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
    expect(tab.locator("#hide-special-field")).to_be_hidden()                # SmolLM2's run has no special token
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
    assert [e for e in tab.errors if "status of 422" not in e] == []             # the refusal routed above
    tab.errors.clear()


IOI = "When Mary and John went to the store, John gave a drink to"


@pytest.mark.parametrize("server,models,views", [
    ("live_server", ("minilm", "tiny-gpt", "induction"), (("head", {}), ("lines", {"large": "1"}),
                                                          ("summary", {"large": "1"}), ("compare", {"large": "1"}))),
    ("live_server_smollm2", ("smollm2",), (("head", {}), ("lens", {"large": "1"}),
                                          ("head", {"text": IOI, "layer": 1, "head": 2, "pin": 13, "why": "13,9",
                                                    "large": "1"}))),
    ("live_server_gemma3", ("gemma3",), (("head", {}), ("effects", {"layer": 5})))])
def test_text_was_cut_off(tab, request, server, models, views):
    """Menus narrower than their choices (the model, Examples, the pair's placeholder, Statistic, Differences, Gemma
    3's "layer 2 (local" and "head 0 · prev"), a one-row text box showing half a second line, a strip that did not wrap,
    tick labels under Large text outside their plot, the line view's captions and the Why chart's axis title cut with
    Large text, Gemma 3's patching colour-bar title: on every zoo model, Gemma 3 included (its own server: its head
    and effects views), at both window sizes, Large text on and off (the head view; the others with Large text, where they
    were cut)."""
    base, cut = request.getfixturevalue(server), {}
    for size in SIZES:
        tab.set_viewport_size(size)
        for model in models:
            for view, extra in views:
                for large in (False, True) if not extra else (None,):
                    state = {**extra, **({"large": "1"} if large else {})}
                    visit(tab, base, view, model=model, **state)
                    if found := tab.evaluate(CUT_JS):
                        cut[f"{model} {view} {size['width']}x{size['height']} {state}"] = found
    tab.set_viewport_size(SIZES[0])
    assert cut == {}, cut
    assert tab.errors == []


def test_generate_hid_in_the_side_panels_own_scroll_box(tab, live_server_smollm2):
    """SmolLM2 at 1280x720, Generate opened: scrolling the page reaches its button (no box of its own scrolls)."""
    visit(tab, live_server_smollm2, model="smollm2")
    was_open = tab.evaluate("() => { const d = document.getElementById('generate'), was = d.open; d.open = true; return was; }")
    run = tab.locator("#gen-run")
    expect(run).to_be_visible()
    boxes = tab.evaluate("""() => [...document.querySelectorAll('.side-panel, .side-panel *')].filter((e) => {
      const cs = getComputedStyle(e);
      return /(auto|scroll)/.test(cs.overflowY) && e.scrollHeight > e.clientHeight + 1 && e.contains(document.getElementById('gen-run'));
    }).map((e) => e.className)""")
    assert boxes == [], boxes
    assert [c for c in tab.evaluate(CUT_JS) if "gen" in c or "seed" in c.lower()] == []   # the Seed field was cut
    tab.mouse.wheel(0, 5_000)
    tab.wait_for_function("() => { const r = document.getElementById('gen-run').getBoundingClientRect(); "
                          "return r.top >= 0 && r.bottom <= innerHeight; }", timeout=5_000)
    tab.evaluate("(was) => { document.getElementById('generate').open = was; }", was_open)


def test_corpus_tab_was_a_dead_end_and_atlas_said_queued_for_good(tab, live_server):
    """The Corpus tab starts a job here (the Atlas follows it), and shows the command line as code, not as text in
    backticks. The Atlas' note after Start said the job's state ("queued") and kept saying it after the job was done:
    it says the job started and leaves its state to the list, kept current. (This server queues jobs and never runs
    them: the job stays queued.)"""
    visit(tab, live_server, "corpus", model="minilm")
    view = tab.locator("#view-corpus")
    assert "`" not in view.inner_text() and "`" not in tab.locator("#view-help").inner_text()
    expect(view.locator("code")).to_have_text("attnscope corpus texts.txt --model minilm")
    tab.locator("#corpus-start").click()
    wait_drawn(tab, "atlas")
    rows = tab.locator("#view-atlas .atlas-job[data-state=queued]")
    expect(rows.first).to_be_visible()
    tab.locator("#atlas-start").click()
    note = tab.locator("#atlas-form-note")
    expect(note).to_contain_text("started")
    assert "queued" not in note.inner_text()
    assert tab.errors == []


def test_compare_hid_knockout_and_drew_a_blank_map_before_the_knocked_head(tab, live_server):
    """Compare's empty state asked for knocked-out heads without saying how (Shift+click, said only in a closed help);
    after a knock-out at layer 2 it drew layer 1 as a blank map with '1n' ticks and no word why."""
    visit(tab, live_server, "compare", model="tiny-gpt", text=EXAMPLE)
    note = tab.locator("#view-compare .note")
    expect(note).to_contain_text("hold Shift and click a head's picture")
    expect(note.locator("a")).to_have_attribute("href", re.compile(r"view=model"))
    visit(tab, live_server, "compare", model="tiny-gpt", text=EXAMPLE, layer=1, head=0, ablate="2.1")
    expect(note).to_contain_text("Layer 1 is not after the knocked-out head (L2H1)")
    expect(note.locator("a")).to_have_text("Show layer 3")
    ticks = tab.locator("#view-compare [data-part=d] .cbaxis text, #view-compare [data-part=d] .colorbar text")
    labels = [t.text_content() or "" for t in ticks.all()]
    assert labels and not any(t.rstrip().endswith("n") for t in labels), labels
    assert tab.errors == []


def test_no_first_orientation(browser, live_server):
    """A first visit said what rows and columns mean only in a hover tooltip, with "How to read it" closed; the Lesson
    began with dot products without saying what a query and a key are. A second visit keeps the help closed."""
    context = browser.new_context(viewport=SIZES[0], base_url=live_server)
    page = context.new_page()
    try:
        page.goto("/")
        wait_drawn(page, "head")
        line = page.locator("#orientation")
        expect(line).to_be_visible()
        expect(line).to_have_text(re.compile(r"^Rows: the token looking.*Columns: the tokens it looks at.*Bright: a strong"))
        assert page.locator("#view-help-box").evaluate("(d) => d.open")
        box = line.bounding_box()
        assert box["y"] + box["height"] <= SIZES[0]["height"], box                 # on the first screen
        page.goto("/?lesson=1")
        wait_drawn(page)
        lesson = page.locator("#lesson")
        expect(lesson.locator("h2")).to_contain_text("Query and key")
        text = lesson.locator(".lesson-text").inner_text()
        assert text.index("query") < text.index("dot product") and text.index("key") < text.index("dot product"), text
        page.goto("/")                                                      # the same browser again
        wait_drawn(page, "head")
        assert not page.locator("#view-help-box").evaluate("(d) => d.open")
    finally:
        context.close()


def test_smaller_defects(tab, live_server):
    """Entropy autoscaled to its largest value (0-0.006: noise as spikes); "Computed over all 14 tokens" for the
    induction score, taken from a random probe; "Hide [CLS] / [SEP]" offered on a model whose run has neither;
    weights written 0.000002049 beside 3.331e-7."""
    visit(tab, live_server, "entropy", model="minilm", text=EXAMPLE, layer=0, head=2)
    rng = tab.locator("#view-entropy [data-part=plot]").evaluate("(gd) => gd._fullLayout.yaxis.range")
    T = int(tab.evaluate("() => document.querySelectorAll('#chips .chip').length"))
    assert rng[0] == 0 and rng[1] == pytest.approx(1.05 * math.log(T), rel=1e-6), (rng, T)
    visit(tab, live_server, "summary", model="minilm", text=EXAMPLE, stat="induction")
    note = tab.locator("#view-summary .note").first
    expect(note).to_contain_text("on a probe of random tokens repeated twice, not on this text")
    expect(tab.locator("#hide-special-field")).to_be_visible()
    expect(tab.locator("#hide-special-label")).to_have_text("Hide [CLS] / [SEP]")
    # the pinned row's weights, in one format (an exponent below 1e-4)
    visit(tab, live_server, model="minilm", text=EXAMPLE, layer=0, head=2, pin=5)
    cells = [t.strip() for t in tab.locator("#view-head table td.num").all_inner_texts()]
    weights = [c for c in cells if re.fullmatch(r"[0-9.e−]+", c) and "." in c]
    assert weights and not [c for c in weights if c.startswith("0.0000")], cells
    assert tab.errors == []


# every text of the visible view's Plotly figures, by its font size: those under 10 px
# the size a reader sees: the computed font size times the SVG's scale on screen (a plot drawn at one size and then
# scaled down by a viewBox or a transform keeps its computed font size)
SMALL_TEXT_JS = """() => [...document.querySelectorAll('.view:not([hidden]) svg text')]
  .filter((t) => t.textContent.trim() && t.getClientRects().length)
  .map((t) => { const m = t.getScreenCTM();
                return [t.textContent, parseFloat(getComputedStyle(t).fontSize) * Math.sqrt(Math.abs(m.a * m.d - m.b * m.c))]; })
  .filter(([, px]) => px < 10).map(([text, px]) => `${text} ${px.toFixed(1)}px`)"""


def test_46_token_head_view_shrank_its_labels(tab, live_server):
    """At 46 tokens the head view's row labels were ~8 px (the plot fitted to the window); now the rows get 13 px and
    the page scrolls: no text under 10 px."""
    words = ("When Mary and John went to the store , John gave a drink to Mary . Then the cat sat on the mat and the "
             "dog slept by the door while rain fell on the roof of the old house near the river").split()
    visit(tab, live_server, "head", model="minilm", text=" ".join(words) + " today")
    assert tab.locator("#chips .chip").count() == 46
    assert tab.evaluate(SMALL_TEXT_JS) == []
    assert tab.evaluate(CUT_JS) == []          # the "Last query ... reads" strip did not wrap past ~25 tokens
    assert tab.errors == []


def test_key_labels_below_the_fold_at_1440(tab, live_server):
    """At 1440x900 the head view's picture ran to 90 % of the window's height below its top: its key labels (the x
    axis) were below the first screen. Where the first screen has room, the picture ends there."""
    tab.set_viewport_size(SIZES[1])
    try:
        visit(tab, live_server, "head", model="minilm", text=EXAMPLE)
        bottoms = tab.evaluate("""() => [...document.querySelectorAll('#view-head .xtick text')]
          .map((t) => t.getBoundingClientRect().bottom)""")
        assert bottoms and max(bottoms) <= 900, bottoms
    finally:
        tab.set_viewport_size(SIZES[0])


def test_minilm_heads_9_to_11_hid_behind_sideways_scrolling_at_1280(tab, live_server):
    """At 1280x720 MiniLM's model view drew its 12 heads 88 px wide each: heads 9-11 lay past the panel's right edge,
    reached only by scrolling the grid sideways. The heads now share the panel's width: every thumbnail in view, no
    sideways scrolling, no "scroll sideways" cue; each still at least 44 px."""
    visit(tab, live_server, "model", model="minilm", text=EXAMPLE)
    scroller = tab.locator("#view-model .thumb-scroll")
    sizes = scroller.evaluate("(s) => [s.scrollWidth, s.clientWidth, s.getBoundingClientRect().right]")
    assert sizes[0] <= sizes[1] + 1, sizes
    for hd in (9, 10, 11):
        box = tab.locator(f'#view-model a.thumb[data-layer="0"][data-head="{hd}"]').bounding_box()
        assert box["x"] + box["width"] <= sizes[2] + 1 and box["width"] >= 44, (hd, box, sizes)
    expect(tab.locator("#view-model .scroll-cue")).to_be_hidden()
    assert tab.errors == []


# The numbers a heatmap writes in its cells, as a reader sees them: each number's text box on screen against its cell
# (the mean distance between neighbouring rows' and columns' centres less the trace's gap, times the SVG's scale on screen). A number
# taller or wider than its cell runs into its neighbours: the font size alone (11 px) did not show it. Returns
# {count, cut: numbers that do not fit, in words}.
CELL_TEXT_JS = """() => {
  const out = {count: 0, cut: []};
  for (const gd of document.querySelectorAll('.view:not([hidden]) .js-plotly-plot')) {
    const tr = (gd._fullData || []).find((t) => t.type === 'heatmap' && t.texttemplate);
    const labels = [...gd.querySelectorAll('.heatmap-label text')].filter((t) => t.textContent.trim() && t.getClientRects().length);
    if (!tr || !labels.length) continue;
    out.count += labels.length;
    const m = gd.querySelector('.main-svg').getScreenCTM(), s = Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
    const boxes = labels.map((t) => [t.textContent, t.getBoundingClientRect()]);
    const pitch = (key) => { const c = [...new Set(boxes.map(([, b]) => Math.round(key(b))))].sort((a, b) => a - b);
      return c.length > 1 ? (c[c.length - 1] - c[0]) / (c.length - 1) : Infinity; };   // rows (columns) evenly spaced
    const cellW = pitch((b) => b.left + b.width / 2) - (tr.xgap || 0) * s, cellH = pitch((b) => b.top + b.height / 2) - (tr.ygap || 0) * s;
    for (const [text, b] of boxes)
      if (b.height > cellH + 0.5 || b.width > cellW + 0.5)
        out.cut.push(`"${text}" ${b.width.toFixed(1)}x${b.height.toFixed(1)} px in a ${cellW.toFixed(1)}x${cellH.toFixed(1)} px cell`);
  }
  out.cut = [...new Set(out.cut)];
  return out;
}"""


def test_head_summary_put_270_numbers_in_350_px(tab, live_server_smollm2):
    """SmolLM2's Head summary (30 layers x 9 heads) wrote its 270 numbers at 11 px in a map of ~350 px: 12 px a row, a
    cell 10 px tall under a 13 px line of text (digits ~8 px high, each row's numbers against the next's); with Large
    text 15 px numbers in 17 x 10 px cells, unreadable. Now every number fits its cell at 10 px or more, at 1280x720 and
    1440x900, Large text on and off: the map grows (the page scrolls) and makes room beside or above the ranking."""
    try:
        for size in SIZES:
            tab.set_viewport_size(size)
            for large in (False, True):
                visit(tab, live_server_smollm2, "summary", model="smollm2", text=EXAMPLE, **({"large": "1"} if large else {}))
                where = (size["width"], "large" if large else "normal")
                cells = tab.evaluate(CELL_TEXT_JS)
                assert cells["count"] == 270, (where, cells["count"])          # every number written, none left out
                assert cells["cut"] == [], (where, cells["cut"][:5], len(cells["cut"]))
                assert tab.evaluate(SMALL_TEXT_JS) == [], where
    finally:
        tab.set_viewport_size(SIZES[0])
    assert tab.errors == []


def test_effects_pointed_to_the_next_token_panel_above(tab, live_server_smollm2):
    """The effects view asked for a target from "the next-token panel above", a panel on the left: it names the panel
    without saying where it is."""
    visit(tab, live_server_smollm2, "effects", model="smollm2", text=EXAMPLE)
    text = tab.locator("#view-effects").inner_text()
    assert "Next token panel" in text and "panel above" not in text, text
    assert tab.errors == []
