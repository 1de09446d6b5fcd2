"""The page's views in Jupyter (python/jupyter.py), carrying the page's ES modules as one (app/bundle.py, tested in
tests/test_bundle.py). The drawing itself: tests/browser/test_notebook_view.py."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from attnscope.app import bundle, pages, wire
from attnscope.python import jupyter
from attnscope.python.local import Model

TEXT = "The cat sat on the mat."
ROOT = pages.ROOT / "static" / "js"


def test_an_output_carries_the_page_modules_as_one_with_embed_js_as_its_entry():
    """The page's bundle of embed.js (app/bundle.py, tested in tests/test_bundle.py) reaches the views an output
    draws and the boot block's reader, and an output's script runs it after handing over its data."""
    order = [p.relative_to(ROOT).as_posix() for p in bundle.module_order(ROOT / "embed.js")]
    assert order[-1] == "embed.js" and {"boot.js", "api.js", "views/head.js", "views/lines.js", "views/model.js",
                                         "views/lens.js", "views/effects.js"} <= set(order)
    text, _ = pages.page_bundle("embed.js")
    script = jupyter.SCRIPT % {"id": '"x"', "data": '"x-data"', "bundle": text}
    assert script.index("globalThis.attnscopeOutput = ") < script.index(text) < script.index("mount(")


@pytest.fixture(scope="module")
def model(minilm):
    return Model(minilm)


def test_a_lens_view_carries_the_lens_as_the_page_fetches_it(runtimes):
    # the induction model: tiny-gpt predicts no next token, so it offers no lens (issue 51)
    tiny = Model(runtimes["induction"])
    v = tiny.show("the cat sat on the mat . the cat", view="lens", layer=1, head=0)
    lens = v.data()["answers"]["lens"]["json"]                        # the JSON form, as api.js fetches /api/lens
    assert lens["top_tokens"] == v.answers["lens"].top_tokens and lens["head_lens"]["layer"] == 1
    np.testing.assert_array_equal(np.asarray(lens["top_probs"], np.float32), v.answers["lens"]["top_probs"])
    assert lens["tokens"] == v.answers["attention"].tokens


def test_a_view_carries_the_answer_and_the_page_modules(model, monkeypatch):
    a = model.attention(TEXT)
    v = model.show(a, view="lines", layer=2, head=5, pin=3)
    assert v.state == {"view": "lines", "layer": 2, "head": 5, "pin": 3, "model": "minilm", "text": ""}
    data = v.data()
    back = jupyter.carried(data["answers"]["attention"]["packed"])
    np.testing.assert_array_equal(back["attention"], a["attention"].astype(np.float16))    # float16, as labelled
    assert back["tokens"] == a["tokens"] and data["info"]["id"] == "minilm"
    assert v.html().count(pages.page_bundle("embed.js")[0]) == 1
    assert data["boot"]["models"] == model.models() and data["boot"]["views"][0]["id"] == "head"
    # plotly.js once per kernel: the first output carries it, later ones use it
    monkeypatch.setattr(jupyter, "_plotly_sent", False)
    first, second = v._repr_html_(), model.show(TEXT)._repr_html_()
    assert first.count("plotly.js v") == 1 and second.count("plotly.js v") == 0
    assert "</script" not in jupyter._script_json(data).lower() and "https://" not in second


def test_a_view_of_what_it_cannot_draw_is_refused(model, tmp_path):
    a = model.attention(TEXT, layers=[1], heads=[0, 2])
    with pytest.raises(ValueError, match=r"layer 2, head 0: this answer holds layers \[1\] and heads \[0, 2\]"):
        model.show(a, layer=2)
    with pytest.raises(ValueError, match="view 'entropy': one of head, lines, model"):
        model.show(a, view="entropy")
    with pytest.raises(ValueError, match="no attention matrices"):
        model.show(model.attention(TEXT, include=["summary"]))
    with pytest.raises(TypeError, match="not Stages"):
        model.show(model.stages(TEXT, layer=0, head=0))
    with pytest.raises(ValueError, match="the logit lens draws from a lens answer too"):
        model.show(a, view="lens")
    page = model.show(a, head=2).save(tmp_path / "v.html").read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and page.count("plotly.js v") == 1


def test_an_effects_view_carries_the_maps_it_was_asked_for(local_smollm2):
    """The IOI texts of test_python_api (the same patching: the Runner's cache serves one of the two)."""
    from .test_python_api import IOI

    clean, corrupt = IOI
    v = local_smollm2.show(clean, view="effects", corrupt=corrupt, target="␣Mary", distractor="␣John")
    assert set(v.answers) == {"attention", "attribution", "patching"}
    assert {k: v.state[k] for k in ("text", "corrupt", "target", "distractor", "site", "direction")} == {
        "text": clean, "corrupt": corrupt, "target": "␣Mary", "distractor": "␣John", "site": "head_output",
        "direction": "denoise"}
    data = v.data()["answers"]
    dla = jupyter.carried(data["attribution"]["packed"])     # as the page fetches /api/attention
    assert dla["attribution"]["heads"] == v.answers["attribution"].parts["heads"]
    assert data["patching"]["json"]["recovery"] == json.loads(wire.to_json(v.answers["patching"].data))["recovery"]
    with pytest.raises(ValueError, match="the effects maps and a generation are of a text"):
        local_smollm2.show(v.answers["attention"], view="effects")


def test_a_generation_is_carried_with_the_rows_of_every_head(local_smollm2):
    v = local_smollm2.show("The quick brown fox. The quick", generate={"max_new_tokens": 2, "greedy": True})
    g, a = v.generation, v.answers["attention"]
    assert (g["layers"], g["heads"]) == (list(range(30)), list(range(9))) and len(g["steps"]) == 2
    T0 = len(a.tokens)
    assert [s["index"] for s in g["steps"]] == [T0, T0 + 1]
    assert np.shape(g["steps"][1]["attention"]) == (30, 9, T0 + 2)          # each token's row over every key so far
    assert v.data()["answers"]["generation"]["json"] is g
    with pytest.raises(ValueError, match="a generation are of a text"):
        local_smollm2.show(a, generate=2)


def test_a_client_shows_a_servers_answer_with_the_servers_models(live_server):
    from attnscope import Client

    api = Client(live_server)
    try:
        v = api.show(TEXT, model="minilm", view="model")
        assert v.info == next(m for m in api.models() if m["id"] == "minilm") and v.boot["models"] == api.models()
        assert v.state["view"] == "model" and v.answers["attention"]["attention"].shape[:2] == (6, 12)
    finally:
        api.close()


def test_a_256_token_minilm_view_is_at_most_12_mb_with_plotly_js(model):
    """Issue 50: a 256-token MiniLM output was 25.7 MB (plotly.js and base64 float32). Now its floats travel as float16
    (each within float16's rounding of the float32 answer), byte-shuffled, deflated and in base 85, and plotly.js
    packed the same way: the kernel's first output, plotly.js in it, stays <= 12 MB."""
    text = " ".join(f"In {1900 + i}, the council of {w} voted {i % 7} to {i % 5} on the river bridge's budget."
                    for i, w in enumerate(["Alder", "Birch", "Cedar", "Dover", "Elm", "Fenwick", "Grange"] * 6))
    a = model.attention(text)
    assert len(a.tokens) == 256
    out = model.show(a).html(plotly=True)
    assert len(out.encode("utf-8")) <= 12e6, len(out) / 1e6
    back = jupyter.carried(model.show(a).data()["answers"]["attention"]["packed"])["attention"]
    exact = a["attention"]
    assert back.dtype == np.float16
    np.testing.assert_array_equal(back, exact.astype(np.float16))
    assert np.all(np.abs(back.astype(np.float64) - exact) <= np.maximum(np.abs(exact) * 2.0 ** -11, 2.0 ** -25))
