"""The Generate control on SmolLM2 (issue 26's page): 16 greedy tokens stream into the page; the token strip and
the head view grow a token (a query row and a key column) at a time, and the grown matrix equals the final text's
own; the sampling panel draws the last step's candidates before and after the sampling settings; the final text,
its prompt and the settings are in the URL, and reopening that link shows the text without generating again; nothing
is logged as an error."""
from __future__ import annotations

import json
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import pytest
from playwright.sync_api import expect

from .conftest import screenshot, wait_drawn

pytestmark = pytest.mark.browser
PROMPT = "The cat sat"
N = 16
SETTINGS = {"max_new_tokens": N, "greedy": True, "temperature": 1, "top_k": 0, "top_p": 1}

# every render of the head view from now on: the chips, the heatmap's size, the URL it drew, and the heatmap itself
# (nulls are masked cells: a causal model's future keys)
WATCH_JS = """() => {
  window.__renders = [];
  const view = document.getElementById('view-head');
  new MutationObserver(() => {
    const z = view.querySelector('[data-part=plot]').data.at(-1).z;
    window.__renders.push({chips: document.querySelectorAll('#chips .chip').length, rows: z.length, cols: z[0].length,
                           search: location.search, z});
  }).observe(view, {attributes: true, attributeFilter: ['data-renders']});
}"""
ENDED_JS = """() => new URLSearchParams(location.search).has('prompt')
  && document.getElementById('generate').dataset.state === 'done'"""


@pytest.fixture
def page_errors(browser, live_server_smollm2):
    """A page on the SmolLM2 server and the console errors, page errors and failed requests it logs (a context of
    its own: the `page` fixture's base_url would start the MiniLM server too, which this test never uses)."""
    context = browser.new_context(base_url=live_server_smollm2, viewport={"width": 1366, "height": 900})
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"requestfailed: {r.url} {r.failure}"))
    yield page, errors
    context.close()


def stream(base: str) -> tuple[list[dict], dict]:
    """The same generation from the API: its token lines and its last line (greedy: the page's must be the same)."""
    tokens, done = [], None
    body = {"model": "smollm2", "text": PROMPT, **SETTINGS, "include": ["candidates"]}
    with httpx.stream("POST", base + "/api/generate", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            msg = json.loads(line) if line.strip() else {}
            tokens += [msg["token"]] if "token" in msg else []
            done = msg.get("done", done)
    return tokens, done


def test_generate_streams_into_the_strip_the_head_view_and_the_sampling_panel(page_errors, live_server_smollm2):
    page, errors = page_errors
    base = live_server_smollm2
    ref_tokens, ref = stream(base)           # also builds SmolLM2's decoding graph before the page's timing
    assert len(ref_tokens) == N and ref["stop_reason"] == "max_new_tokens"
    final_ref = httpx.post(base + "/api/attention", json={"model": "smollm2", "text": ref["sequence"], "layers": [0],
                           "heads": [0], "include": ["attention"]}, timeout=120).json()

    start = "/?" + urlencode({"model": "smollm2", "view": "head", "text": PROMPT, "max_new_tokens": N, "greedy": 1})
    page.goto(start)
    wait_drawn(page, "head", timeout=120_000)
    T0 = page.locator("#chips .chip").count()
    assert T0 == len(ref["prompt_tokens"]) == 3
    expect(page.locator("#gen-max")).to_have_value(str(N))
    expect(page.locator("#gen-greedy")).to_be_checked()
    before = page.evaluate("location.search")
    generates = []
    page.on("request", lambda r: generates.append(r.post_data_json) if r.url.endswith("/api/generate") else None)
    page.evaluate(WATCH_JS)
    page.locator("#gen-run").click()
    page.wait_for_function(ENDED_JS, timeout=60_000)
    wait_drawn(page, "head", timeout=60_000)

    # one request: the page's text, the settings, each token's attention row of the head the view draws
    assert len(generates) == 1
    sent = generates[0]
    assert {k: sent[k] for k in SETTINGS} == SETTINGS and sent["text"] == PROMPT
    assert sent["include"] == ["candidates", "attention"] and sent["layers"] == [0] and sent["heads"] == [0]
    assert "interventions" not in sent

    # while it streamed (the URL still the prompt's), the strip and the heatmap grew together, a token at a time
    renders = page.evaluate("window.__renders")
    streamed = [r for r in renders if r["search"] == before]
    sizes = [r["rows"] for r in streamed]
    assert len(set(sizes)) >= 2 and all(T0 < n <= T0 + N for n in sizes), sizes
    assert sizes == sorted(sizes) and all(r["rows"] == r["cols"] == r["chips"] for r in streamed), sizes
    # the grown matrix (the prompt's, a streamed row appended per token) is the final text's own, to 1e-5
    grown = streamed[-1]["z"]
    full = final_ref["attention"][0][0]
    n = len(grown)
    assert max(abs((g if g is not None else 0.0) - f) for gr, fr in zip(grown, full[:n]) for g, f in zip(gr, fr[:n])) < 1e-5
    assert all(g is None for i, row in enumerate(grown) for g in row[i + 1:])       # causal: the future masked

    # at the end the page's text is prompt + continuation: every view shows it, and the link says how it was made
    q = parse_qs(urlparse(page.url).query)
    assert q["text"] == [ref["sequence"]] and q["prompt"] == [PROMPT]
    assert q["max_new_tokens"] == [str(N)] and q["greedy"] == ["1"] and "seed" not in q     # greedy: no seed
    expect(page.locator("#text")).to_have_value(ref["sequence"])
    T = len(final_ref["tokens"])
    assert T == T0 + N
    expect(page.locator("#chips .chip")).to_have_count(T)
    expect(page.locator("#chips .chip.generated")).to_have_count(N)
    final = page.evaluate("window.__renders").pop()
    assert final["search"] == page.evaluate("location.search") and final["rows"] == final["cols"] == T
    assert [r["token"] for r in ref_tokens] == final_ref["tokens"][T0:]
    gen = page.locator("#generate")
    expect(gen).to_have_attribute("data-tokens", str(N))
    expect(gen.locator(".gen-status")).to_contain_text(f"{N} new tokens (as many as asked for)")
    expect(gen.locator(".gen-sequence")).to_have_text(ref["sequence"])

    # the sampling panel: the last step's ten candidates, before and after the settings, the chosen one marked
    last = ref_tokens[-1]
    sampling = page.locator("#sampling")
    expect(sampling).to_be_visible()
    expect(sampling).to_have_attribute("data-step", str(N - 1))
    bars = page.evaluate("""() => document.querySelector('#sampling [data-part=plot]').data
      .map((t) => ({type: t.type, name: t.name, y: t.y, n: t.x.length}))""")
    assert [b["type"] for b in bars] == ["bar", "bar"] and all(b["n"] == 10 for b in bars)
    assert bars[0]["y"] == pytest.approx([c["probability"] for c in last["candidates"]], abs=1e-9)
    assert bars[1]["y"] == pytest.approx([c["sampling_probability"] for c in last["candidates"]], abs=1e-9)
    expect(sampling.locator("table tbody tr")).to_have_count(10)
    expect(sampling.locator("tr.chosen th.tok")).to_have_text(last["token"].replace(" ", "␣") + " ◀")
    expect(sampling.locator("[data-part=note]")).to_contain_text("Greedy: the most probable token is taken")
    screenshot(page, "generate")

    # the link reopens the final text and its settings; nothing is generated again
    page.goto(page.url)
    wait_drawn(page, "head", timeout=60_000)
    expect(page.locator("#chips .chip")).to_have_count(T)
    expect(gen).to_have_attribute("data-state", "idle")
    expect(page.locator("#gen-output")).to_contain_text(f"This text continues the prompt “{PROMPT}”")
    assert len(generates) == 1
    assert errors == []
