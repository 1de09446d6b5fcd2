"""No request builds an ONNX graph (issue 39): a served model's graphs are all built while it loads, and the served
requests of every endpoint, on every model of the suite's live server, build none (graphs.builder counts every graph
made, /healthz shows the count). The attend graphs a layer-by-layer run may ask for are many combinations of outputs:
those opened at start serve the rest through a superset, with the same numbers."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from attnscope.graphs.builder import built
from attnscope.runtime.layerwise import Layerwise, Want, superset

TEXT = "the quick brown fox saw a bird . the quick brown fox"
ATOL = 1e-5        # two graphs that compute the same probabilities with the same nodes (tests/test_long.py's bound)


def _requests(model: dict) -> list[tuple[str, dict]]:
    """A request of every kind the model takes, and a few it refuses (a refusal builds nothing either)."""
    m, L, H = model["id"], model["layers"], model["heads"]
    text = TEXT if model["kind"] != "encoder" else "The cat sat on the mat. The cat sat."
    out = [("/api/attention", {"model": m, "text": text}),
           ("/api/attention", {"model": m, "text": text, "layers": [0], "heads": [0]}),          # a cut graph
           ("/api/attention", {"model": m, "text": text, "layers": [L - 1], "include": ["attention", "scores"]}),
           ("/api/attention", {"model": m, "text": text, "causal": model["kind"] != "decoder", "mask_tokens": [1],
                               "ablate": [[0, 0]], "include": ["summary", "effect", "rollout"]}),
           ("/api/attention", {"model": m, "text": text, "engine": "numpy", "layers": [0]}),
           ("/api/attention", {"model": m, "text": text, "top_k": 3, "resolution": 4}),
           ("/api/stages", {"model": m, "text": text, "layer": L - 1, "head": H - 1}),
           ("/api/importance", {"model": m, "text": text}),
           ("/api/qk", {"model": m, "text": text, "layer": L - 1, "head": 0, "query": 3, "key": 1}),
           ("/api/lens", {"model": m, "text": text, "head_lens": [0, 0]}),
           ("/api/circuits", {"model": m}),
           ("/api/knockout", {"model": m, "text": text, "queries": [4], "keys": [1]})]
    if model["predictions"]:
        out += [("/api/patching", {"model": m, "clean": "a b c a b", "corrupt": "a b c d b", "target": "c",
                                   "site": site}) for site in ("head_output", "pattern", "residual", "value")]
        out += [("/api/attention", {"model": m, "text": "a b c a b", "include": ["attribution"], "target": "c"}),
                ("/api/generate", {"model": m, "text": "a b c a", "max_new_tokens": 3, "seed": 1})]
    return out


def test_no_request_builds_a_graph(live_server):
    """Every endpoint on every served model, after start: the count of graphs this server built does not move."""
    with httpx.Client(base_url=live_server, timeout=120) as c:
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["loading"] == {}
        before = health["graphs_built"]
        assert before > 0                                    # the models' graphs: built at start
        answered, refused = 0, []
        for model in c.get("/api/models").json():
            for path, body in _requests(model):
                r = c.post(path, json=body)
                assert r.status_code in (200, 422), (model["id"], path, body, r.text)
                answered += r.status_code == 200
                refused += [(model["id"], path)] if r.status_code == 422 else []
            for stages in ("false", "true"):
                assert c.get(f"/api/models/{model['id']}/onnx?stages={stages}").status_code == 200
        assert c.get("/healthz").json()["graphs_built"] == before
    # what a model cannot do is refused before any work: the logit lens and knockout need an LM head
    assert refused == [("minilm", "/api/lens"), ("minilm", "/api/knockout"), ("tiny-gpt", "/api/lens"),
                       ("tiny-gpt", "/api/knockout")]
    assert answered == 3 * 12 + 6 - 4                          # 12 requests a model, 6 more with an LM head


def test_no_request_builds_a_graph_on_smollm2(live_server_smollm2):
    """SmolLM2's server: its cut graphs (1, 2, 4, 8, 16, 30 blocks), stages and decoding graphs were built at start;
    the requests that run them build none (its layer-by-layer graphs are the other models' test's: the same code,
    and its traced runs take seconds here)."""
    text = "When Mary and John went to the store, John gave a drink to"
    with httpx.Client(base_url=live_server_smollm2, timeout=120) as c:
        before = c.get("/healthz").json()["graphs_built"]
        for body in ({"layers": [0]}, {"layers": [5]}, {"layers": [20], "include": ["attention"]},
                     {"include": ["summary", "predictions"]}, {"top_k": 4, "resolution": 8}):
            assert c.post("/api/attention", json={"model": "smollm2", "text": text, **body}).status_code == 200
        for path, body in (("/api/stages", {"layer": 29, "head": 8}), ("/api/generate", {"max_new_tokens": 2,
                                                                                         "seed": 3})):
            r = c.post(path, json={"model": "smollm2", "text": text, **body})
            assert r.status_code == 200, (path, r.text)
        assert c.get("/api/models/smollm2/onnx?stages=true").status_code == 200
        assert c.get("/healthz").json()["graphs_built"] == before


def test_a_superset_attend_graph_gives_the_exact_graphs_numbers(runtimes):
    """After open() (a server's start) a combination of outputs no graph was opened for is served by its superset:
    no graph is built, and every output equals the exact graph's (built on first use when not opened)."""
    rt = runtimes["tiny-gpt"]
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    want = Want(tuple(range(L)), tuple(range(H)), attention=True, top_k=3, duplicate=True, resolution=5)
    enc = rt.encode(TEXT)
    exact = Layerwise(rt).forward(enc, causal=False, want=want)          # graphs built for exactly these outputs
    opened = Layerwise(rt)
    opened.open()
    assert superset(("attend", ("entropy", "duplicate"), False)) in opened.needed()
    n = built()
    served = opened.forward(enc, causal=False, want=want)
    assert built() == n                                                   # nothing built for the run
    for name in exact.rows:
        np.testing.assert_allclose(served.rows[name], exact.rows[name], atol=ATOL, rtol=0, err_msg=name)
    for part in ("attention", "top_weights", "duplicate"):
        for layer in range(L):
            np.testing.assert_allclose(getattr(served.asked, part)[layer], getattr(exact.asked, part)[layer],
                                       atol=ATOL, rtol=0, err_msg=part)
    for layer in range(L):
        np.testing.assert_array_equal(served.asked.top_keys[layer], exact.asked.top_keys[layer])
        np.testing.assert_allclose(served.thumbnails[5][layer], exact.thumbnails[5][layer], atol=ATOL, rtol=0)
    np.testing.assert_allclose(served.hidden, exact.hidden, atol=ATOL, rtol=0)


@pytest.mark.parametrize("outputs", [("thumbnail", "thumbnail_even"), ("no such output",)])
def test_superset_refuses_what_no_graph_computes(outputs):
    with pytest.raises(ValueError):
        superset(("attend", outputs, True))


def test_a_graph_that_does_not_fit_the_memory_budget_is_not_built_and_its_feature_answers_422():
    """tiny-gpt under a 20 MB budget: its 3 MB of weights run whole, but a run of its stages graph at the 512 tokens
    it takes would hold ~70 MB: the stages graph is not built, and /api/stages and its download answer 422 naming
    the limit, before any work."""
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    from .conftest import CACHE
    app = create_app(Settings(models=["tiny-gpt"], cache=CACHE, memory_mb=20))
    with TestClient(app) as c:
        rt = app.state.service.runtimes["tiny-gpt"]
        caps = c.get("/api/models").json()[0]["capabilities"]
        assert caps["features"]["stacked"] and not caps["features"]["stages"]
        assert "a run of the stages graph at 512 tokens holds" in caps["reasons"]["stages"]
        assert True not in rt._sessions and False in rt._sessions          # the served graph only
        for r in (c.post("/api/stages", json={"model": "tiny-gpt", "text": "The cat sat.", "layer": 0, "head": 0}),
                  c.get("/api/models/tiny-gpt/onnx?stages=true")):
            assert r.status_code == 422 and "ATTNSCOPE_MEMORY_MB" in r.json()["detail"], r.text
        assert c.post("/api/attention", json={"model": "tiny-gpt", "text": "The cat sat."}).status_code == 200


def test_the_weights_are_placed_at_start_each_array_once_and_no_run_places_one():
    """A served model's weights are placed on the device while it loads (Runtime.prepare: on a GPU copied there then,
    not inside the first request), each array once although graphs bind it by two names (the stacked graph's
    "blocks.1.attn.q.weight", the layer graphs' "block.attn.q.weight" of layer 1: on a GPU two names were two copies);
    then a plain run, a layer-by-layer walk, a generation and a patching place nothing more."""
    from attnscope.analysis.effects import Metric
    from attnscope.model.weights import block_arrays
    from attnscope.runtime import Runtime
    from attnscope.runtime.generation import Generator, Sampling
    from attnscope.runtime.patching import patch
    from attnscope.sources import zoo

    from .conftest import CACHE, PROVIDERS

    rt = Runtime(zoo.get("induction"), PROVIDERS, cache_dir=CACHE)
    w, L = rt.weights, rt.cfg.n_layers
    assert rt.prepare()[0].startswith("the weights") and w._placed
    every = {id(a): a for a in [*w.named.values(), *(a for layer in range(L)
                                                     for a in block_arrays(rt.model, layer).values())]}
    assert set(w._placed) == set(every)                                     # each array once
    assert w.place() == sum(a.nbytes for a in every.values())               # and nothing else
    name = next(n for n in w.named if n.startswith("blocks.1.") and n.endswith("weight"))
    assert w.value(name) is w.value("block." + name[len("blocks.1."):], 1)
    values, placed = dict(w._values), dict(w._placed)
    enc = rt.encode("a b c a b c")
    rt.forward([enc])
    rt.layerwise().forward(enc, want=Want((1,), (0,), attention=True))
    list(Generator(rt, enc.ids, Sampling(greedy=True), 2))
    patch(rt, enc, rt.encode("a b c d b c"), Metric(int(enc.ids[-1]), int(enc.ids[1])))
    assert w._values == values and w._placed == placed
