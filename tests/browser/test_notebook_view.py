"""The page's head view in a notebook: docs/notebooks/explore_heads.ipynb executed headless (nbclient, a real kernel:
tests/test_notebooks.py), its View output written as a page (what a notebook's HTML export holds) and opened in
Chromium with nothing but file: reachable. The view draws the carried answer's numbers, and its head control draws
another head."""
from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from playwright.sync_api import Page

from attnscope.app import wire
from attnscope.python import jupyter

from ..test_notebooks import execute, value

pytestmark = pytest.mark.browser

EMBED = ".attnscope-embed"


def carried(html: str) -> dict:
    """The answer an output carries, decoded by the Python side of the wire form."""
    blob = re.search(r'<script type="application/json" id="[^"]+-data">(.*?)</script>', html, re.S).group(1)
    return jupyter.carried(json.loads(blob)["answers"]["attention"]["packed"])


def drawn(page: Page, renders: int) -> dict:
    page.wait_for_function(f"document.querySelector('{EMBED}')?.dataset.renders === '{renders}'", timeout=30_000)
    return page.evaluate(f"""() => {{
      const root = document.querySelector('{EMBED}'), plot = root.querySelector('.view:not([hidden]) .js-plotly-plot');
      return {{ view: root.dataset.view, layer: Number(root.dataset.layer), head: Number(root.dataset.head),
               error: root.querySelector('.error').hidden ? null : root.querySelector('.error').textContent,
               type: plot.data[0].type, z: plot.data[0].z, title: plot.layout.title.text }};
    }}""")


def test_explore_heads_notebook_draws_the_head_view_offline(page: Page, console_errors, tmp_path, monkeypatch):
    out = execute("explore_heads", tmp_path, monkeypatch)
    layer, head, mass = value(out["stats"])
    assert 0 <= layer < 6 and 0 <= head < 12 and 0.5 < mass <= 1.0
    html = out["view"]["text/html"]
    assert html.count("plotly.js v") == 1                     # the kernel's first View carries plotly.js
    path = tmp_path / "explore_heads.html"
    path.write_text(jupyter.page([html]), encoding="utf-8")
    answer = carried(html)
    outside = []
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
               else (outside.append(r.request.url), r.abort()))
    page.goto(path.as_uri())

    shown = drawn(page, 1)
    assert (shown["view"], shown["layer"], shown["head"], shown["error"], shown["type"]) == ("head", layer, head, None,
                                                                                           "heatmap")
    li, hi = answer["layers"].index(layer), answer["heads"].index(head)
    assert shown["z"] == answer["attention"][li, hi].astype(float).tolist()       # every cell, exactly
    assert f"head {head}" in shown["title"]

    other = (head + 1) % 12
    page.select_option(f"{EMBED} select[name=head]", str(other))
    shown = drawn(page, 2)
    assert (shown["layer"], shown["head"], shown["error"]) == (layer, other, None)
    assert shown["z"] == answer["attention"][li, answer["heads"].index(other)].astype(float).tolist()
    assert shown["z"] != answer["attention"][li, hi].astype(float).tolist()
    assert outside == [] and console_errors == []


def test_a_saved_lens_view_draws_the_lens_and_its_head_lens_offline(page: Page, console_errors, runtimes, tmp_path):
    """The logit lens of the induction model (tiny-gpt predicts no next token: no lens, issue 51) from a View saved as
    a page: the grid names each cell's top token of the carried lens, the head lens is of the head asked; another
    head (not carried: layer 0's) leaves the head lens empty, not wrong."""
    from attnscope.python.local import Model

    v = Model(runtimes["induction"]).show("the cat sat on the mat . the cat", view="lens", layer=1, head=0)
    lens = v.answers["lens"]
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page.goto(v.save(tmp_path / "lens.html").as_uri())
    page.wait_for_function(f"document.querySelector('{EMBED}')?.dataset.renders === '1'", timeout=30_000)
    grid = page.evaluate(f"""() => {{
      const root = document.querySelector('{EMBED}'), plot = root.querySelector('.lens-plot');
      return {{ error: root.querySelector('.error').hidden, z: plot.data[0].z,
               head: root.querySelector('.head-lens').dataset.head,
               promoted: [...root.querySelectorAll('.head-lens tr[data-position="0"] .promoted .tok')]
                 .map((t) => t.title) }};
    }}""")
    assert grid["error"] and grid["head"] == "0"
    carried = v.data()["answers"]["lens"]["json"]                 # the JSON form, as the page fetches /api/lens
    assert grid["z"] == [[p[0] for p in row] for row in carried["top_probs"]]
    np.testing.assert_array_equal(np.float32(grid["z"]), lens["top_probs"][:, :, 0])   # shortest reprs: the float32s
    assert len(grid["promoted"]) == len(lens.head_lens["promoted_tokens"][0])
    page.select_option(f"{EMBED} select[name=layer]", "0")
    page.wait_for_function(f"document.querySelector('{EMBED}')?.dataset.renders === '2'", timeout=30_000)
    assert page.evaluate(f"document.querySelector('{EMBED} .head-lens').textContent") == ""
    assert console_errors == []


def test_a_saved_effects_view_draws_the_direct_logit_attribution_offline(page: Page, console_errors, local_smollm2,
                                                                         tmp_path):
    """SmolLM2's direct logit attribution of " Mary" on the IOI text, drawn from a saved View: the map is the carried
    answer's, L23H3 among its largest cells (the patching map draws from its JSON answer as the lens does)."""
    v = local_smollm2.show("When Mary and John went to the store, John gave a drink to", view="effects",
                           target="␣Mary", distractor="␣John")
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page.goto(v.save(tmp_path / "effects.html").as_uri())
    page.wait_for_function(f"document.querySelector('{EMBED}')?.dataset.renders === '1'", timeout=30_000)
    maps = page.evaluate(f"""() => [...document.querySelectorAll('{EMBED} .effects-maps .js-plotly-plot')]
      .map((p) => p.data[0].z)""")
    heads = np.asarray(v.answers["attribution"].parts["heads"], np.float32)
    assert len(maps) == 1 and np.array_equal(np.float32(maps[0]), heads)
    assert (23, 3) in [(l, h) for l, h, _ in v.answers["attribution"].top_heads(5)]
    assert console_errors == []


def test_a_saved_generation_grows_the_head_view_offline(page: Page, console_errors, local_smollm2, tmp_path):
    """SmolLM2's greedy continuation of a repeated text drawn as the page draws a generation: the head view's matrix
    is the prompt's grown by each new token's row (the rows the generation carried), for the head in the control."""
    v = local_smollm2.show("The quick brown fox. The quick", generate=3, layer=1, head=0)
    steps, T0 = v.generation["steps"], len(v.answers["attention"].tokens)
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page.goto(v.save(tmp_path / "generation.html").as_uri())
    for renders, head in ((1, 0), (2, 4)):
        if renders > 1:
            page.select_option(f"{EMBED} select[name=head]", str(head))
        shown = drawn(page, renders)
        assert shown["head"] == head and shown["error"] is None and len(shown["z"]) == T0 + 3
        for k, step in enumerate(steps):                        # each new token's row: what the stream carried
            row = np.float32(step["attention"][1][head])
            assert np.array_equal(np.float32(shown["z"][T0 + k][:T0 + k + 1]), row)
    assert console_errors == []


def test_notebook_view_opened_on_l0h0_and_offered_effects_for_an_encoder(page: Page, console_errors, runtimes,
                                                                          live_server, tmp_path):
    """A notebook's view of a text opens where the page's fresh visit does (the clearest head: first.js clearestHead),
    not on layer 0, head 0; and offers the views the model can do (its capability record), as the page's tabs do:
    no Effects for MiniLM, an encoder that predicts no next token. A view it cannot do is refused with the reason."""
    from attnscope.python.local import Model

    from .conftest import EXAMPLE, wait_drawn

    page.goto(live_server + "/")                                 # the page's fresh visit: MiniLM on the example text
    wait_drawn(page)
    fresh = page.evaluate("() => Object.fromEntries(new URLSearchParams(location.search))")
    assert (fresh["model"], fresh["text"]) == ("minilm", EXAMPLE)
    m = Model(runtimes["minilm"])
    v = m.show(EXAMPLE)
    assert (v.state["layer"], v.state["head"]) == (int(fresh["layer"]), int(fresh["head"])) != (0, 0)
    with pytest.raises(ValueError, match="not available for all-MiniLM-L6-v2: an encoder: it predicts no next token"):
        m.show(EXAMPLE, view="effects")
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page.goto(v.save(tmp_path / "minilm.html").as_uri())
    shown = drawn(page, 1)
    assert (shown["view"], shown["layer"], shown["head"], shown["error"]) == ("head", v.state["layer"],
                                                                             v.state["head"], None)
    offered = page.evaluate(f"[...document.querySelectorAll('{EMBED} select[name=view] option')].map((o) => o.value)")
    assert offered == ["head", "lines", "model"]
    assert console_errors == []
