"""The page's head view in a notebook: docs/notebooks/explore_heads.ipynb executed headless (nbclient, a real kernel:
tests/test_notebooks.py), its View output written as a page (what a notebook's HTML export holds) and opened in
Chromium with nothing but file: reachable. The view draws the carried answer's numbers, and its head control draws
another head."""
from __future__ import annotations

import base64
import json
import re

import pytest
from playwright.sync_api import Page

from attnscope.app import jupyter, wire

from ..test_notebooks import execute, value

pytestmark = pytest.mark.browser

EMBED = ".attnscope-embed"


def carried(html: str) -> dict:
    """The answer an output carries, decoded by the Python side of the wire form."""
    blob = re.search(r'<script type="application/json" id="[^"]+-data">(.*?)</script>', html, re.S).group(1)
    return wire.from_binary(base64.b64decode(json.loads(blob)["answers"]["attention"]["binary"]))


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
