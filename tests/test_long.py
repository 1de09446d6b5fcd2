"""Long inputs (issue 12): the layer-by-layer run equals the stacked graph, recomputing a head gives the first run's
numbers, the API answers the same either way, streams progress as NDJSON, and the memory settings hold.

Everything here runs on the small models with ATTNSCOPE_LAYERWISE_MB=0 (every text layer by layer), except one
SmolLM2 test at a few hundred tokens, where the real model's layers and RoPE are compared across all 270 heads.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.analyses.attention import LayerwisePlan
from attnscope.app.service import AttentionService
from attnscope.app.settings import Settings
from attnscope.app.wire import BINARY, NDJSON, from_binary
from attnscope.analysis import statistics as stats
from attnscope.analysis import thumbnails
from attnscope.runtime.results import footprint
from attnscope.runtime.layerwise import ROWS, Layerwise, Want, _walk

from .conftest import run_in_fresh_loop

TEXT = "The quick brown fox jumps over the lazy dog. " * 5 + "Then it naps by the old red barn near the river."
ATOL = 1e-5


def everything(rt, **kw) -> Want:
    cfg = rt.cfg
    return Want(tuple(range(cfg.n_layers)), tuple(range(cfg.n_heads)), **kw)


def assert_rows_equal(res, A, atol=ATOL):
    """A layer-by-layer run's kept rows against the stats functions of attentions A [L, H, T, T]: its own (the
    reductions in the graph are the stats functions), or the stacked graph's (whose probabilities differ from the
    layer-by-layer graphs' in the last float32 bits, which entropy's log p multiplies: pass a wider atol)."""
    for name, expected in stats.head_rows(A).items():
        if name == "distance":   # sums of up to T terms |i - j| p_ij: compare relative to their size
            np.testing.assert_allclose(res.rows[name], expected, rtol=1e-5, atol=atol * 10, err_msg=name)
        else:
            np.testing.assert_allclose(res.rows[name], expected, atol=atol, rtol=0, err_msg=name)
    np.testing.assert_allclose(res.rows["entropy"], stats.entropy(A), atol=atol, rtol=0)
    np.testing.assert_allclose(res.rows["max_weight"], A.max(-1), atol=atol, rtol=0)


# ---- the run ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_id, causal, options", [
    ("tiny-gpt", None, {}),
    ("tiny-gpt", False, {"mask_tokens": [3, 7]}),              # non-causal: the general distance output
    ("minilm", None, {"mask_tokens": [5]}),                    # post-norm encoder, LayerNorm, segment embeddings
    ("tiny-gpt", None, {"ablate": (2, 1), "mean": True}),      # the head-mask inputs reach each layer
    ("minilm", None, {"group_mb": 1e-9}),                      # one head at a time, asked in reverse order
    ("tiny-gpt", None, {"fused": True}),                       # each block one graph (a GPU's walk)
    ("minilm", None, {"mask_tokens": [5], "fused": True}),
])
def test_layerwise_run_equals_the_stacked_graph(runtimes, model_id, causal, options):
    rt = runtimes[model_id]
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    keep = mean = None
    if "ablate" in options:
        keep = np.ones((1, L, H), np.float32)
        keep[0, options["ablate"][0], options["ablate"][1]] = 0.0
        mean = 1.0 - keep
    masked = options.get("mask_tokens")
    [full] = rt.run([TEXT], causal=causal, mask_tokens=[masked] if masked else None, head_mask=keep, head_mean=mean)
    A, T = full.attentions, len(full.tokens)
    lw = rt.layerwise(group_mb=options.get("group_mb", 256))
    if "fused" in options:
        lw = Layerwise(rt, group_mb=256, graphs=lw, fused=True)
    want = everything(rt, attention=True, top_k=5, duplicate=True, resolution=7)
    order = list(range(H))[::-1] if "group_mb" in options else list(range(H))
    res = lw.forward(rt.encode(TEXT), causal=causal, mask_tokens=masked, head_mask=keep, head_mean=mean,
                     want=replace(want, heads=tuple(order)))
    assert res.tokens == full.tokens and res.causal == full.causal
    assert lw.groups(T) == (H if "group_mb" in options else 1)
    A = A[:, order]                    # the asked heads, in the order asked (the rows and thumbnails keep all heads)
    res.rows = {name: value[:, order] for name, value in res.rows.items()}
    res.thumbnails = {r: {layer: t[order] for layer, t in by.items()} for r, by in res.thumbnails.items()}
    got = np.stack([res.asked.attention[layer] for layer in range(L)])
    np.testing.assert_allclose(got, A, atol=ATOL, rtol=0)
    thumbs = np.stack([res.thumbnails[7][layer] for layer in range(L)])
    np.testing.assert_allclose(thumbs, thumbnails.downsample(A, 7), atol=ATOL, rtol=0)
    assert_rows_equal(res, got)
    assert_rows_equal(res, A, atol=5e-5)
    keys = stats.TextKeys.of(full.encoding, rt.cfg, full.value_norms[:, order])   # the stacked graph's norms
    for name in ("local", "value_weighted_first"):                                 # the run's rows, fused too
        np.testing.assert_allclose(res.rows[name], stats.ROWS[name].numpy(A, keys), atol=5e-5, rtol=1e-5, err_msg=name)
    np.testing.assert_array_equal(res.visible, stats.visible_keys(full.mask))
    np.testing.assert_allclose(stats.normalize_entropy(res.rows["entropy"], res.visible),
                               stats.row_stats(A, full.mask)["normalized_entropy"], atol=ATOL)
    keys, weights = thumbnails.top_keys(got, 5)        # the same ranking rule (ties to the lower key) on the same numbers
    np.testing.assert_array_equal(np.stack([res.asked.top_keys[layer] for layer in range(L)]), keys)
    np.testing.assert_array_equal(np.stack([res.asked.top_weights[layer] for layer in range(L)]), weights)
    duplicate = np.einsum("lhqk,qk->lhq", A, stats.same_token_keys(full.token_ids).astype(np.float32))
    np.testing.assert_allclose(np.stack([res.asked.duplicate[layer] for layer in range(L)]), duplicate, atol=ATOL)
    np.testing.assert_allclose(res.hidden, full.hidden, atol=ATOL, rtol=0)
    if full.token_logprobs is not None:
        np.testing.assert_allclose(res.next_token_logits, full.next_token_logits, atol=1e-4, rtol=0)
        np.testing.assert_allclose(res.token_logprobs[1:], full.token_logprobs[1:], atol=1e-4)
    assert T > 7 and res.seconds > 0


@pytest.mark.parametrize("resolution", [8, 16, 7, 10])      # R divides T (equal blocks: a reshape) or not
def test_thumbnails_are_downsample_with_equal_and_uneven_blocks(runtimes, resolution):
    from bench.common import text_of_tokens

    rt = runtimes["tiny-gpt"]
    text = text_of_tokens(rt, 64)
    [full] = rt.run([text])
    lw = rt.layerwise()
    first = lw.forward(rt.encode(text), want=Want(resolution=resolution))
    later = lw.recompute(first, Want((1, 2), resolution=resolution + 1))   # another resolution, from checkpoints
    for res, R, layers in ((first, resolution, range(4)), (later, resolution + 1, (1, 2))):
        for layer in layers:
            np.testing.assert_allclose(res.thumbnails[R][layer], thumbnails.downsample(full.attentions[layer], R),
                                       atol=ATOL, rtol=0)


def test_kept_run_holds_no_full_matrices(runtimes):
    """What a run keeps grows as L H T and T D, never as L H T^2."""
    rt = runtimes["minilm"]
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    res = rt.layerwise().forward(rt.encode(TEXT * 4), want=Want(resolution=16))
    T = len(res.tokens)
    assert T > 150
    biggest = max(int(np.prod(a.shape)) for a in [*res.rows.values(), *res.checkpoints.values(),
                                                  *res.thumbnails[16].values()])
    assert biggest <= max(H * T, T * rt.cfg.d_model, H * 16 * 16)
    assert res.asked is None and footprint(res) < L * H * T * T * 4 / 4


@pytest.mark.parametrize("group_mb, fused, opaque", [
    (8, False, False), (1e-9, False, False),          # one group of heads, one head a run
    (8, True, False),                                 # each block one graph
    (8, True, True), (8, False, True),                # kept tensors as a GPU holds them: no NumPy view, only host()
])
def test_a_long_run_fetches_what_its_answer_holds(runtimes, group_mb, fused, opaque, monkeypatch):
    """What leaves the device is what the answer holds (issue 38): a layer-by-layer run keeps the residual stream,
    q, k, v, the heads' outputs and its checkpoints where its sessions compute (runtime/tensors.Held: a GPU's
    memory), so the bytes the session wrapper counts as fetched are exactly the answer's parts -- every head's rows,
    the two asked heads of layer 2, the final outputs -- and never a block's intermediates (which would add L x (4 T
    D + ...) floats) nor the checkpoints (L x T x D); a head recomputed later from a checkpoint fetches its matrix
    alone. A generation step likewise fetches its logits and attention rows, never the key/value cache. Each
    block runs as one graph (fused, a GPU's default) or three plus one per group of heads. opaque: every kept or
    placed tensor is an OrtValue without its NumPy view, as in a GPU's memory, so a GPU's walk and generation run
    their own code here: nothing reads a kept tensor but through Held.host (counted), and the numbers are the same."""
    from attnscope.runtime import layerwise, sessions, tensors
    from attnscope.runtime.generation import Generator, Sampling

    [full] = runtimes["tiny-gpt"].run([TEXT])                   # the stacked graph's numbers, for comparison
    smol = runtimes["smollm2"]
    prompt = smol.encode(TEXT).ids[:12]
    [greedy] = smol.forward([smol.encode_ids(prompt)])         # its first greedy token
    if opaque:
        for module, name in ((sessions, "empty"), (layerwise, "hold")):
            made = getattr(module, name)
            monkeypatch.setattr(module, name, lambda *a, made=made: tensors.Held(made(*a).value, None,
                                                                                 *a[2:] if made is sessions.empty else ()))

    rt = runtimes["tiny-gpt"]
    cfg, lw = rt.cfg, Layerwise(rt, 1, group_mb, graphs=rt.layerwise(), fused=fused)
    L, H, D, V = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.vocab_size

    def fetched(sessions) -> int:
        return sum(s.fetched for s in sessions)

    enc = rt.encode(TEXT)
    T = len(enc.ids)
    before, runs = fetched(lw._sessions.values()), sum(s.runs for s in lw._sessions.values())
    res = lw.forward(enc, want=Want((2,), (1, 0), attention=True))
    groups = 1 if fused else lw.groups(T) + 2
    assert sum(s.runs for s in lw._sessions.values()) - runs == 1 + L * groups + 1     # embed, the blocks, final
    rows = sum(L * H * (T - 1 if name in ("previous", "next") else T) for name in res.rows)
    final = T * D + ((V + T) if cfg.lm_head else 0)   # hidden [T, D] (an LM head's: next-token logits, log-probs)
    assert fetched(lw._sessions.values()) - before == 4 * (rows + 2 * T * T + final)
    assert set(res.checkpoints) == set(range(L)) and res.asked.attention[2].shape == (2, T, T)
    assert [((c.array is None) == opaque, c.shape) for c in res.checkpoints.values()] == [(True, (1, T, D))] * L
    np.testing.assert_allclose(res.asked.attention[2], full.attentions[2][[1, 0]], atol=ATOL, rtol=0)
    np.testing.assert_allclose(res.hidden, full.hidden, atol=ATOL, rtol=0)
    before = fetched(lw._sessions.values())
    again = lw.recompute(res, Want((3,), (0,), attention=True))            # from layer 3's checkpoint, where it is
    assert fetched(lw._sessions.values()) - before == 4 * T * T
    np.testing.assert_allclose(again.asked.attention[3][0], full.attentions[3][0], atol=ATOL, rtol=0)
    assert footprint(res) >= 4 * L * T * D                                 # the checkpoints count where they are
    assert sum(s.resized for s in lw._sessions.values()) == 0             # every output sized once, by the walk

    rt = smol                                                   # tiny-gpt has no LM head
    cfg, decode = rt.cfg, rt.session(decode=True)
    L, H, V, before, n = cfg.n_layers, cfg.n_heads, cfg.vocab_size, decode.fetched, len(prompt)
    gen = Generator(rt, prompt, Sampling(greedy=True), max_new_tokens=3)
    assert len(list(gen)) == 3                                  # the prompt's step, then one step per token
    assert decode.fetched - before == 4 * (4 * V + L * H * (n + (n + 1) + (n + 2) + (n + 3)))
    assert gen._cache.length == n + 3 and all(type(k).__name__ == "Held" for k in gen._cache.keys)
    assert all((k.array is None) == opaque for k in gen._cache.keys)
    assert gen.new_ids[0] == greedy.next_tokens[0].id


@pytest.mark.parametrize("every, fused", [(1, False), (3, False), (3, True)])
def test_recompute_equals_first_run(runtimes, every, fused):
    """A head asked later is recomputed from the run's checkpoint(s): bit for bit what the first run returned, and
    what the stacked graph computes; thumbnails at a new resolution equal stats.downsample."""
    rt = runtimes["tiny-gpt"]
    lw = Layerwise(rt, every, graphs=rt.layerwise(), fused=fused)
    enc = rt.encode(TEXT)
    first = lw.forward(enc, want=Want((1,), (0, 2), attention=True, top_k=3))
    assert sorted(first.checkpoints) == list(range(0, rt.cfg.n_layers, every))
    done = []
    later = lw.recompute(first, Want((1, 3), (2, 0), attention=True, top_k=3, resolution=5),
                         progress=lambda i, n: done.append((i, n)))
    np.testing.assert_array_equal(later.asked.attention[1], first.asked.attention[1][::-1])   # heads (2, 0)
    np.testing.assert_array_equal(later.asked.top_keys[1], first.asked.top_keys[1][::-1])
    [full] = rt.run([TEXT])
    np.testing.assert_allclose(later.asked.attention[3], full.attentions[3][[2, 0]], atol=ATOL, rtol=0)
    np.testing.assert_allclose(later.thumbnails[5][3], thumbnails.downsample(full.attentions[3], 5), atol=ATOL, rtol=0)
    assert done and done[-1][0] == done[-1][1] and [i for i, _ in done] == list(range(1, len(done) + 1))
    assert first.asked.attention.keys() == {1} and later.rows is first.rows   # the kept rows are shared, not copied


@pytest.mark.parametrize("model_id", ["tiny-gpt", "minilm"])
def test_rows_and_a_tile_asked_alone_equal_the_stacked_graph(runtimes, model_id):
    """Rows and a tile asked after a run (runtime/blocks.exact_qkv: k and v up to the last key they read, q at their
    queries alone) equal the stacked graph's matrices, for queries out of order and inside the tile, causal or not."""
    rt = runtimes[model_id]
    enc = rt.encode(TEXT)
    T = len(enc.ids)
    lw = Layerwise(rt, graphs=rt.layerwise())
    first = lw.forward(enc, want=Want((1,), ()))
    queries, tile = (T // 2, 2, T // 2 - 1), ((T // 2 - 3, T // 2 + 1), (0, T))
    later = lw.recompute(first, Want((1,), (1, 0), queries=queries, tile=tile))
    [full] = rt.run([TEXT])
    A = full.attentions[1][[1, 0]]
    np.testing.assert_allclose(later.asked.rows[1], A[:, list(queries)], atol=ATOL, rtol=0)
    np.testing.assert_allclose(later.asked.tile[1], A[:, T // 2 - 3:T // 2 + 1], atol=ATOL, rtol=0)


def test_walk_runs_each_asked_layer_from_its_nearest_checkpoint():
    # (layer, start from its checkpoint): layers 1 and 2 from checkpoint 0, then 5 from checkpoint 3
    assert _walk([1, 2, 5], [0, 3]) == [(0, True), (1, False), (2, False), (3, True), (4, False), (5, False)]
    assert _walk([0, 3], [0, 1, 2, 3]) == [(0, True), (3, True)]
    assert _walk([2, 3], [0, 1, 2, 3]) == [(2, True), (3, True)]     # a checkpoint, when reached, is always used
    assert _walk([2, 3], [0]) == [(0, True), (1, False), (2, False), (3, False)]
    assert _walk([], [0]) == []


def test_pooling_matrix_is_downsample():
    rng = np.random.default_rng(0)
    p = rng.random((3, 100, 100))
    for size in (7, 64, 100, 128):
        pool = thumbnails.pooling_matrix(100, size).astype(np.float64)
        np.testing.assert_allclose(pool.T @ p @ pool, thumbnails.downsample(p, size), rtol=2e-7)   # 1/n in float32


def test_top_keys_orders_heaviest_first_ties_to_the_lower_key():
    p = np.array([[0.1, 0.4, 0.1, 0.4, 0.0]])
    keys, weights = thumbnails.top_keys(p, 4)
    assert keys.tolist() == [[1, 3, 0, 2]] and weights.tolist() == [[0.4, 0.4, 0.1, 0.1]]
    assert thumbnails.top_keys(p, 9)[0].shape == (1, 5)


# ---- the API ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clients():
    """(stacked, layer by layer): the same app with the default threshold and with every text layer by layer."""
    with TestClient(create_app(Settings())) as stacked, TestClient(create_app(Settings(layerwise_mb=0))) as layered:
        yield stacked, layered


def assert_same_answer(a: dict, b: dict, atol=ATOL):
    assert a.keys() == b.keys()
    for key in a.keys() - {"timing_ms"}:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            assert_same_answer(x, y, atol)
        elif isinstance(x, list) and x and not isinstance(np.asarray(x, dtype=object).flat[0], str) \
                and key not in ("tokens", "offsets", "next_tokens", "next_tokens_before", "blocks"):
            np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float), atol=atol, rtol=1e-5, err_msg=key)
        elif isinstance(x, float):
            assert x == pytest.approx(y, abs=atol, rel=1e-5), key
        else:
            assert x == y, key


@pytest.mark.parametrize("body", [
    {"text": TEXT},
    {"text": TEXT, "resolution": 9, "layers": [1, 4], "heads": [0, 11, 3]},
    {"model": "tiny-gpt", "text": TEXT, "top_k": 4, "heads": [0, 2]},
    {"model": "tiny-gpt", "text": TEXT, "include": ["attention", "entropy", "summary", "scores", "predictions"],
     "layers": [1]},
    {"model": "tiny-gpt", "text": TEXT, "ablate": [[0, 1]], "mask_tokens": [2, 5],
     "include": ["effect", "summary", "predictions"]},
])
def test_api_answers_the_same_layer_by_layer(clients, body):
    stacked, layered = clients
    a, b = (c.post("/api/attention", json=body) for c in clients)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert_same_answer(a.json(), b.json())


def test_binary_top_keys_are_int32(clients):
    _, layered = clients
    r = layered.post("/api/attention", json={"model": "tiny-gpt", "text": TEXT, "top_k": 3, "dtype": "float16"},
                     headers={"Accept": BINARY})
    ans = from_binary(r.content)
    T = len(ans["tokens"])
    assert ans["top_keys"].dtype == np.int32 and ans["top_keys"].shape == (4, 4, T, 3)
    assert ans["top_weights"].dtype == np.float16 and "attention" not in ans
    assert (ans["top_keys"][..., 0] <= np.arange(T)).all()     # causal: the heaviest key is never in the future


def test_second_head_is_recomputed_from_the_cached_run(clients):
    _, layered = clients
    body = {"model": "tiny-gpt", "text": TEXT + " Once more.", "layers": [2], "heads": [1]}
    first = layered.post("/api/attention", json=body)
    again = layered.post("/api/attention", json={**body, "heads": [1, 3]})
    assert first.headers["x-cache"] == "miss" and again.headers["x-cache"] == "miss"   # the head was not kept...
    assert layered.post("/api/attention", json=body).headers["x-cache"] == "hit"     # ...the answer was
    np.testing.assert_array_equal(np.array(again.json()["attention"])[:, :1], np.array(first.json()["attention"]))


def progress_lines(response) -> tuple[list[dict], dict]:
    lines = [json.loads(line) for line in response.text.splitlines()]
    return lines[:-1], lines[-1]


def test_ndjson_streams_progress_by_layer_then_the_answer(clients):
    stacked, layered = clients
    body = {"text": TEXT + " Progress.", "resolution": 8}
    r = layered.post("/api/attention", json=body, headers={"Accept": NDJSON})
    assert r.status_code == 200 and r.headers["content-type"].startswith(NDJSON)
    progress, last = progress_lines(r)
    layers = [p["progress"]["layer"] for p in progress]
    assert progress and all(p["progress"]["layers"] == 6 for p in progress)
    assert layers == sorted(set(layers)) and layers[-1] == 6 and 1 <= layers[0]
    assert_same_answer(last["result"], stacked.post("/api/attention", json=body).json())
    # a short text (the stacked graph) gives the answer line alone; a refusal found before the stream is plain HTTP
    progress, last = progress_lines(stacked.post("/api/attention", json=body, headers={"Accept": NDJSON}))
    assert progress == [] and last["result"]["tokens"]
    bad = layered.post("/api/attention", json={"text": TEXT, "include": ["rollout"]}, headers={"Accept": NDJSON})
    assert bad.status_code == 422 and "rollout" in bad.json()["detail"]


def test_ndjson_minimal_ends_with_done_and_the_binary_answer_comes_from_the_cache(clients):
    """The page's way: progress lines with `Prefer: return=minimal` (no JSON answer), then the same body with the
    binary Accept, answered from the run the stream made."""
    _, layered = clients
    body = {"text": TEXT + " Minimal.", "resolution": 8, "dtype": "float16"}
    r = layered.post("/api/attention", json=body, headers={"Accept": NDJSON, "Prefer": "return=minimal"})
    progress, last = progress_lines(r)
    assert progress and progress[-1]["progress"] == {"layer": 6, "layers": 6}
    binary = layered.post("/api/attention", json=body, headers={"Accept": BINARY})
    ans = from_binary(binary.content)
    assert last == {"done": {"status": 200, "tokens": len(ans["tokens"])}}
    assert binary.headers["x-cache"] == "hit" and ans["attention"].shape == (6, 12, 8, 8)


def test_ndjson_is_in_the_openapi(clients):
    doc = clients[0].get("/openapi.json").json()
    content = doc["paths"]["/api/attention"]["post"]["responses"]["200"]["content"]
    assert {"application/json", BINARY, NDJSON} <= content.keys()
    assert '"progress"' in content[NDJSON]["example"]


def test_too_big_for_json_is_refused_naming_the_binary_form_which_serves_it():
    settings = Settings(layerwise_mb=0, max_json_cells=1_000, models=["tiny-gpt"])
    with TestClient(create_app(settings)) as client:
        body = {"model": "tiny-gpt", "text": TEXT, "layers": [1], "heads": [2]}
        r = client.post("/api/attention", json=body)
        assert r.status_code == 422
        assert "JSON limit is 1,000" in r.json()["detail"] and BINARY in r.json()["detail"]
        r = client.post("/api/attention", json=body, headers={"Accept": BINARY})
        assert r.status_code == 200
        T = len(from_binary(r.content)["tokens"])
        assert from_binary(r.content)["attention"].shape == (1, 1, T, T) and T * T > 1_000
        # the page's way to it: progress without the answer (no JSON to refuse), then the binary form
        stream = client.post("/api/attention", json=body, headers={"Accept": NDJSON, "Prefer": "return=minimal"})
        assert stream.status_code == 200 and progress_lines(stream)[1] == {"done": {"status": 200, "tokens": T}}
        # with the answer, the stream is refused like the JSON form
        r = client.post("/api/attention", json=body, headers={"Accept": NDJSON})
        assert r.status_code == 422 and "JSON limit is 1,000" in r.json()["detail"]


def test_what_a_long_run_cannot_give_is_refused_before_it_runs(clients):
    _, layered = clients
    for path, body, words in [
        ("/api/attention", {"text": TEXT, "include": ["rollout"]}, "leave `rollout` out"),
        ("/api/attention", {"text": TEXT, "engine": "numpy"}, "onnx engine only"),
        ("/api/stages", {"text": TEXT, "layer": 0, "head": 0}, "stages of one head"),
        ("/api/importance", {"text": TEXT}, "ATTNSCOPE_LAYERWISE_MB"),
    ]:
        r = layered.post(path, json=body)
        assert r.status_code == 422 and words in r.json()["detail"], (path, r.text)
        assert "layer by layer" in r.json()["detail"] or "copies" in r.json()["detail"]


# ---- the settings that bound memory -----------------------------------------------------------------------------
def service(**settings) -> AttentionService:
    svc = AttentionService(Settings(models=["minilm"], **settings))
    svc.load()
    return svc


def test_layerwise_threshold_decides_the_path():
    from attnscope.analyses.attention import AttentionRequest

    req = AttentionRequest(text=TEXT)                             # ~60 tokens: 6 x 12 x 60^2 x 4 bytes ~ 1 MB
    assert not isinstance(service(layerwise_mb=2).plans.attention(req, False), LayerwisePlan)
    assert isinstance(service(layerwise_mb=0.5).plans.attention(req, False), LayerwisePlan)


def test_preferring_layerwise_walks_when_the_stacked_run_would_fetch_every_layer():
    """ATTNSCOPE_PREFER_LAYERWISE (a GPU's default): an answer of fewer layers than all, which the cut graphs cannot
    give (next tokens need the whole model), runs layer by layer: the same answer, the statistics computed in the
    graph and only the asked layer's matrices fetched; what the walk cannot give (rollout) and an answer of every
    layer still run stacked."""
    from attnscope.analyses.attention import AttentionRequest
    from attnscope.app.wire import to_json

    walking, plain = service(prefer_layerwise=True), service()
    req = AttentionRequest(text=TEXT * 4, layers=[2], include=["attention", "entropy", "summary", "predictions"])
    assert isinstance(walking.plans.attention(req, False), LayerwisePlan)
    assert not isinstance(plain.plans.attention(req, False), LayerwisePlan)
    for stacked in (req.model_copy(update={"include": ["attention", "rollout"]}), AttentionRequest(text=TEXT),
                    req.model_copy(update={"include": ["attention", "entropy", "summary"]})):   # a cut graph's
        assert not isinstance(walking.plans.attention(stacked, False), LayerwisePlan)

    def answer(svc, req=req):
        plan = svc.plans.attention(req, False)
        return json.loads(to_json(plan.payload(run_in_fresh_loop(plan.compute(svc.runner)))))
    def fetched(svc) -> int:
        rt = svc.runtimes["minilm"]
        return sum(s.fetched for s in [*rt._sessions.values(), *rt.layerwise()._sessions.values()])
    assert fetched(walking) == fetched(plain) == 0
    assert_same_answer(answer(walking), answer(plain))
    L, H, T = 6, 12, len(walking.runtimes["minilm"].encode(req.text).ids)
    assert fetched(plain) > L * H * T * T * 4 > 2 * fetched(walking)     # rows, checkpoints, layer 2, the ends
    # every layer, but no matrix: statistics, or thumbnails or top-k keys of every head (computed in the graph)
    for i, kind in enumerate(({"include": ["entropy", "summary", "predictions"]}, {"resolution": 8}, {"top_k": 3})):
        every = req.model_copy(update={"layers": None, "text": f"{i} {req.text}"} | kind)     # a text not yet run
        assert isinstance(walking.plans.attention(every, False), LayerwisePlan), kind
        before = fetched(walking), fetched(plain)
        assert_same_answer(answer(walking, every), answer(plain, every))
        walked, ran = fetched(walking) - before[0], fetched(plain) - before[1]
        assert ran > L * H * T * T * 4 > 2 * walked, kind


def test_a_light_answer_is_built_on_the_event_loop_and_a_heavy_one_in_a_worker_thread():
    """Plan.light: MiniLM's last layer at 128 tokens (196,608 probabilities) is built on the event loop, saving two
    thread hand-offs of a ~30 ms answer; more probabilities read (two layers; every layer's summaries), rollout or a
    second run (an ablation's effect) keep it in a worker thread, so that the event loop stays free."""
    import threading

    from attnscope.app import sending
    from attnscope.analyses.attention import AttentionRequest

    svc = service()
    text = TEXT * 2
    plans = {name: svc.plans.attention(AttentionRequest(text=text, **fields), True) for name, fields in {
        "last layer": {"layers": [5]}, "two layers": {"layers": [4, 5]}, "summaries": {"include": ["summary"]},
        "rollout": {"layers": [5], "include": ["attention", "rollout"]},
        "effect": {"layers": [5], "ablate": [[0, 1]], "include": ["attention", "effect"]}}.items()}
    assert len(plans["last layer"].encoding.ids) == 128
    assert {name: plan.light for name, plan in plans.items()} == {
        "last layer": True, "two layers": False, "summaries": False, "rollout": False, "effect": False}
    built_in = []                        # the thread that ran sending.encode

    async def on_loop(plan) -> bool:
        """Whether the plan's answer was built in the event loop's own thread."""
        computed = await plan.compute(svc.runner)
        body = await svc.sending._encode(plan, computed, 0.0)
        layers = from_binary(b"".join(bytes(b) for b in body))["attention"].shape[0]
        assert layers == len(plan.layers)
        return built_in[-1] == threading.get_ident()

    real = sending.encode
    sending.encode = lambda *args: (built_in.append(threading.get_ident()), real(*args))[1]
    try:
        assert run_in_fresh_loop(on_loop(plans["last layer"])) is True
        assert run_in_fresh_loop(on_loop(plans["two layers"])) is False
    finally:
        sending.encode = real


def test_cache_and_checkpoints_follow_the_settings():
    from attnscope.analyses.attention import AttentionRequest

    svc = service(layerwise_mb=0, checkpoint_every=4, cache_mb=1)
    results = []
    for i in range(4):
        plan = svc.plans.attention(AttentionRequest(text=f"{i} " + TEXT * 2, resolution=8), False)
        results.append(run_in_fresh_loop(plan.compute(svc.runner)).result)
    assert sorted(results[0].checkpoints) == [0, 4]       # 6 layers, every 4th kept (within half the cache: 384 KB)
    assert all(footprint(r) > 300_000 for r in results) and svc.runner.cache.bytes <= 2**20   # each ~0.4 MB, the cache 1 MB


def test_checkpoints_are_spaced_so_a_long_run_stays_cached_and_heads_asked_later_recompute_a_few_blocks():
    """A run's every-layer checkpoints that would pass half the result cache are kept further apart (checkpoint_spacing):
    otherwise its kept parts pass the cache, nothing is kept, and each head asked later runs the whole walk again.
    MiniLM at 128 tokens with a 1 MB cache: 6 checkpoints of 192 KB would pass 0.5 MB, so every 3rd layer's is kept;
    the run is cached, and a head of layer 5 asked next runs blocks 3-5 from it (no embedding, no final run), equal
    to the stacked graph's matrix."""
    from attnscope.analyses.attention import AttentionRequest

    svc = service(layerwise_mb=0, cache_mb=1)
    rt = svc.runtimes["minilm"]
    text = TEXT * 2
    plan = svc.plans.attention(AttentionRequest(text=text, include=["summary"]), False)
    T, (L, D) = len(plan.encoding.ids), (rt.cfg.n_layers, rt.cfg.d_model)
    assert T == 128 and L * T * D * 4 > 2**20 / 2                      # every layer's: more than half the cache
    first = run_in_fresh_loop(plan.compute(svc.runner)).result
    assert plan.every == 3 and sorted(first.checkpoints) == [0, 3]
    assert footprint(first) <= 2**20 and svc.runner.cache.get(plan.key) is not None    # kept
    lw = rt.layerwise(plan.every, svc.settings.layerwise_group_mb)
    embeds = lw._sessions["embed"].runs
    head = svc.plans.attention(AttentionRequest(text=text, layers=[5], heads=[1]), False)
    asked = run_in_fresh_loop(head.compute(svc.runner)).result.asked.attention[5]
    assert lw._sessions["embed"].runs == embeds                        # recomputed from the checkpoint of layer 3
    [full] = rt.run([text])
    np.testing.assert_allclose(asked[0], full.attentions[5][1], atol=ATOL, rtol=0)


def test_smollm2_reads_4096_tokens_by_default():
    from attnscope.sources import zoo

    assert zoo.get("smollm2").max_tokens >= 4096


# ---- SmolLM2 ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_layer_by_layer_equals_the_stacked_graph(runtimes):
    """All 30 layers x 9 heads at ~300 tokens: full matrices, 64 x 64 thumbnails, rows and outputs of the layer-by-
    layer run equal those of the stacked graph (an unbounded run) to 1e-5."""
    from bench.common import text_of_tokens

    rt = runtimes["smollm2"]
    text = text_of_tokens(rt, 300)
    [full] = rt.run([text])
    A = full.attentions
    res = rt.layerwise().forward(rt.encode(text), want=everything(rt, attention=True, resolution=64))
    got = np.stack([res.asked.attention[layer] for layer in range(rt.cfg.n_layers)])
    assert got.shape == A.shape == (30, 9, 300, 300)
    assert float(np.abs(got - A).max()) <= ATOL
    thumbs = np.stack([res.thumbnails[64][layer] for layer in range(30)])
    assert float(np.abs(thumbs - thumbnails.downsample(A, 64)).max()) <= ATOL
    even = rt.layerwise().recompute(res, Want(tuple(range(30)), resolution=60))      # 300 = 60 x 5: equal blocks
    thumbs = np.stack([even.thumbnails[60][layer] for layer in range(30)])
    assert float(np.abs(thumbs - thumbnails.downsample(A, 60)).max()) <= ATOL
    assert_rows_equal(res, got)                  # the reductions in the graph: the stats functions, to 1e-5
    assert_rows_equal(res, A, atol=5e-5)         # against the stacked graph (entropy: its log p widens 1e-5 a bit)
    assert set(res.rows) == set(ROWS)
    np.testing.assert_allclose(res.token_logprobs[1:], full.token_logprobs[1:], atol=1e-4)
    assert [t.id for t in res.next_tokens] == [t.id for t in full.next_tokens]


def english_of_tokens(rt, n: int) -> str:
    """English from the standard library's own documentation (offline, always installed), up to n tokens: its words
    of 9+ letters, which run at ~7 characters a token, as technical prose does."""
    import importlib
    import inspect
    import re

    docs = []
    for name in ("argparse", "collections", "json", "textwrap", "functools", "itertools", "pathlib", "subprocess",
                 "logging", "unittest", "email", "zipfile", "tarfile", "shutil", "inspect", "typing", "dataclasses",
                 "asyncio", "csv", "pickle", "random", "statistics", "decimal", "fractions", "difflib", "doctest"):
        module = importlib.import_module(name)
        for obj in [module] + [getattr(module, a) for a in dir(module) if not a.startswith("_")]:
            if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj):
                docs += [" ".join(p.split()) for p in (inspect.getdoc(obj) or "").split("\n\n")]
    pieces = [w + " " for w in re.findall(r"\b[a-z]{9,}\b", " ".join(docs))]
    pieces *= 10                          # the longest prefix of whole pieces within n tokens, by bisection: a
    lo, hi = 0, len(pieces)               # prefix's token count grows with its pieces (a piece ends in a space)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(rt.encode("".join(pieces[:mid])).ids) > n:
            hi = mid - 1
        else:
            lo = mid
    return "".join(pieces[:lo]).strip()


@pytest.mark.slow
def test_a_4000_token_english_text_is_served_by_default(runtimes, live_server_smollm2):
    """Default settings: a ~4,000-token English text for SmolLM2 is served (the character limit follows the models'
    token limits: 40,960 with SmolLM2), summaries and predictions computed layer by layer. The text is long words, at
    ~7 characters a token, the shape that the old 20,000-character default refused (a prose text of 4,000 tokens, at
    ~4.5, ran the same path and was dropped from the suite for its 30 s)."""
    import httpx

    text = english_of_tokens(runtimes["smollm2"], 4000)
    r = httpx.post(f"{live_server_smollm2}/api/attention", timeout=300,
                   json={"model": "smollm2", "text": text, "include": ["summary", "predictions"]})
    assert r.status_code == 200, r.text[:300]
    j = r.json()
    assert 3900 <= len(j["tokens"]) <= 4000 and j["truncated"] is False
    assert np.asarray(j["summary"]["previous_token_mass"]).shape == (30, 9) and len(j["next_tokens"]) == 10
    assert len(text) > 25_000              # the shape of the text: refused by the old 20,000-character default
