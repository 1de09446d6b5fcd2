"""The Python API a notebook uses: attnscope.load(...)(text) -> numpy results, and Plotly figures of them."""
from __future__ import annotations

import numpy as np
import pytest

import attnscope
from attnscope.analysis import statistics as stats

from .conftest import CACHE


def test_load_run_and_summaries():
    rt = attnscope.load("minilm", cache_dir=CACHE)
    r = rt("The cat sat on the mat.")
    assert r.tokens[0] == "[CLS]" and r.token_ids[0] == 101 and len(r.token_ids) == len(r.tokens)
    assert r.attentions.shape == (6, 12, len(r.tokens), len(r.tokens))
    np.testing.assert_allclose(r.attentions.sum(-1), 1.0, atol=1e-6)
    s = r.summary()
    assert set(s) == set(stats.HEAD_STATS) and s["first_token_mass"].shape == (6, 12)
    np.testing.assert_allclose(s["first_token_mass"], r.attentions[..., 0].mean(-1), atol=1e-7)
    np.testing.assert_allclose(r.entropy(), stats.entropy(r.attentions))
    [same] = rt.run(["The cat sat on the mat."])
    np.testing.assert_array_equal(same.attentions, r.attentions)


def test_figures_show_the_numbers(runtimes):
    r = runtimes["tiny-gpt"]("The cat sat on the mat.")
    fig = attnscope.figures.head(r, 0, 1)
    np.testing.assert_allclose(np.array(fig.data[0].z), r.attentions[0, 1])
    assert fig.data[0].zmin == 0 and fig.data[0].zmax == 1
    grid = attnscope.figures.model_grid(r)
    assert len(grid.data) == r.attentions.shape[0] * r.attentions.shape[1]


def test_client_is_exported():
    assert attnscope.Client.__module__ == "attnscope.python.client"


# ---- one Python API, in-process and remote (python/api.py) ------------------------------------------------------
IOI = ("When Mary and John went to the store, John gave a drink to",
       "When Mary and John went to the store, Mary gave a drink to")


def same(a, b, path="answer"):
    """The two sides' answers: every field equal (arrays to the bit), but the timing."""
    a, b = getattr(a, "data", a), getattr(b, "data", b)
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            if k not in ("timing_ms", "tokens_per_second"):
                same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert np.asarray(a).dtype == np.asarray(b).dtype, path
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


@pytest.fixture(scope="module")
def smollm2_sides(local_smollm2, live_server_smollm2):
    """SmolLM2 in this process (the suite's Runtime: no second load) and on the suite's SmolLM2 server."""
    remote = attnscope.Client(live_server_smollm2, model="smollm2")
    yield local_smollm2, remote
    remote.close()


def test_every_analysis_is_the_same_in_process_and_remote_on_smollm2(smollm2_sides):
    local, remote = smollm2_sides
    text = "The cat sat on the mat. The cat"
    calls = [("attention", (text,), {"layers": [3], "heads": [0, 4]}),
             ("stages", (text, 3, 4), {}),
             ("attribution", (IOI[0], "␣Mary", "␣John"), {}),
             ("knockout", (IOI[0], [13], [1]), {}),
             ("qk", (text, 1, 0, 8, 2), {"top": 5}),
             ("lens", (text,), {"top": 3, "head_lens": (17, 4)}),
             ("patching", IOI + ("␣Mary", "␣John"), {}),
             ("path_patching", IOI + ("␣Mary", "␣John"), {"senders": [(10, 0), (14, 3)], "receivers": [(23, 3)]}),
             ("circuits", (), {})]
    got = {}
    for name, args, kwargs in calls:
        a, b = getattr(local, name)(*args, **kwargs), getattr(remote, name)(*args, **kwargs)
        assert type(a) is type(b)
        same(a, b, name)
        fig = a.figure()
        assert len(fig.data) >= 1, name
        assert a._repr_html_().startswith("<div><b>")
        got[name] = a
    # named axes: the asked layers and heads, the token positions, and the values at them
    x = got["attention"].to_xarray()
    assert x["attention"].dims == ("layer", "head", "query", "key")
    T = len(got["attention"].tokens)
    assert list(x["layer"].values) == [3] and list(x["head"].values) == [0, 4] and list(x["query"].values) == list(range(T))
    assert list(x.key_token.values) == got["attention"].tokens
    np.testing.assert_array_equal(x["attention"].sel(layer=3, head=4).values, got["attention"]["attention"][0, 1])
    assert x["mean_entropy"].dims == ("layer", "head")
    df = got["attention"].to_pandas()
    assert list(df.columns[:4]) == ["layer", "head", "query", "key"] and len(df) == 2 * T * T
    row = df[(df["head"] == 4) & (df["query"] == T - 1) & (df["key"] == 2)]
    assert float(row.attention.iloc[0]) == pytest.approx(float(got["attention"]["attention"][0, 1, T - 1, 2]))
    p = got["patching"].to_xarray()
    assert p["recovery"].dims == ("layer", "head") and p.sizes == {"layer": 30, "head": 9}
    assert got["patching"].top_heads(1)[0][:2] == tuple(int(i) for i in np.unravel_index(
        np.argmax(np.abs(got["patching"]["recovery"])), (30, 9)))
    d = got["attribution"].to_xarray()
    assert d["heads"].dims == ("layer", "head") and d["mlps"].dims == ("layer",)
    assert float(d["heads"].sel(layer=23, head=3)) == got["attribution"].parts["heads"][23][3]
    assert (23, 3) in [(l, h) for l, h, _ in got["attribution"].top_heads(5)]
    c = got["circuits"].to_xarray()
    assert c["composition_k"].dims == ("writer", "reader") and c.writer.values[9 + 4] == "L1H4"
    lens = got["lens"].to_xarray()
    assert lens["top_probs"].dims == ("row", "position", "rank") and lens.row.values[0] == "embed"
    assert got["path_patching"].patched != got["path_patching"].clean          # the paths carry something
    assert got["qk"].to_pandas().shape == (5, 3)


def test_generation_and_atlas_jobs_are_the_same_in_process_and_remote(smollm2_sides):
    local, remote = smollm2_sides
    gens = [side.generate("The quick brown fox", max_new_tokens=4, greedy=True, seed=1) for side in (local, remote)]
    streamed = [[t["token"] for t in g] for g in gens]             # an iterator of the new tokens, as they come
    assert streamed[0] == streamed[1] and len(streamed[0]) == 4
    same(gens[0].tokens, gens[1].tokens, "tokens")
    same({k: v for k, v in gens[0].done.items() if k != "timing_ms"},
         {k: v for k, v in gens[1].done.items() if k != "timing_ms"}, "done")
    assert gens[0].text == gens[0].done["text"] and gens[0].to_pandas().shape[0] == 4
    atlases = []
    for side in (local, remote):
        job = side.atlas(model="tiny-gpt", texts=12)
        assert job.state in ("queued", "running", "done") and job.progress()["texts_total"] == 12
        atlases.append(job.result(timeout=120))
        assert job.state == "done" and job.id in {j["id"] for j in side.jobs()}
    assert atlases[0].data["stats"].keys() == atlases[1].data["stats"].keys()
    assert atlases[0].data["texts"] == atlases[1].data["texts"] and atlases[0].data["tokens"] == atlases[1].data["tokens"]
    # each side's job ran in a worker process of its own (the server's, this process's), whose onnxruntime may sum in
    # another order: each statistic is a mean over rows of sums of at most T float32 terms of size <= 1 (a probability,
    # or p log p), each row within T * 2^-24 of its exact value, so the two within 2 T 2^-24 <= 2^-14 for T <= 512
    # (tiny-gpt's limit); measured: 1e-10 apart (a mean entropy of 2.5e-8)
    for name, values in atlases[0].data["stats"].items():
        np.testing.assert_allclose(values, atlases[1].data["stats"][name], rtol=0, atol=2**-14, err_msg=name)
    x = atlases[0].to_xarray()
    assert x["induction_mass"].dims == ("layer", "head") and x.sizes == {"layer": 4, "head": 4}
    assert len(atlases[0].figure().data) == 1
    for side in (local, remote):                                     # a bigger one, cancelled
        job = side.atlas(model="tiny-gpt", texts=400)
        assert job.cancel()["state"] in ("cancelled", "cancelling")
        assert job.wait(60)["state"] == "cancelled"


def test_minilm_in_process_and_remote(minilm, live_server):
    local, remote = attnscope.Model(minilm), attnscope.Client(live_server, model="minilm")
    text = "The cat sat on the mat because it was tired."
    for name, args in (("attention", (text,)), ("stages", (text, 2, 5)), ("qk", (text, 2, 5, 6, 2))):
        a, b = getattr(local, name)(*args), getattr(remote, name)(*args)
        same(a, b, name)
        assert len(a.figure().data) >= 1
    x = a.to_xarray()
    assert x["query_sums"].dims == ("query_component",) and x.query_component.values[0] == "embed"
    from attnscope.python.client import ApiError
    with pytest.raises(ApiError, match="layers \\[9\\] out of range") as e:
        local.attention(text, layers=[9])
    assert e.value.status == 422
    local.close()
    remote.close()
