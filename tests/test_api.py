"""The REST API through TestClient (in-process, lifespan run) and a real uvicorn: values, errors, transport."""
from __future__ import annotations

import concurrent.futures as cf

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.app.wire import BINARY, from_binary
from attnscope.analysis import statistics as stats
from .conftest import PROVIDERS

TEXT = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as c:
        yield c


def post(client, body, **kw):
    return client.post("/api/attention", json=body, **kw)


# ---- values ---------------------------------------------------------------------------------
def test_attention_equals_runtime(client, runtimes):
    r = post(client, {"text": TEXT, "text_pair": "It was late."})
    assert r.status_code == 200
    j = r.json()
    [ref] = runtimes["minilm"].run([TEXT], ["It was late."])
    assert j["tokens"] == ref.tokens and j["segments"] == ref.encoding.segments
    att = np.array(j["attention"], np.float32)
    assert att.shape == ref.attentions.shape == (6, 12, len(ref.tokens), len(ref.tokens))
    np.testing.assert_allclose(att, ref.attentions, atol=1e-6, rtol=0)
    assert j["layers"] == list(range(6)) and j["heads"] == list(range(12))
    assert j["provider"] == PROVIDERS[0] and j["truncated"] is False
    assert set(j["summary"]) == set(stats.HEAD_STATS) | set(stats.PAIR_STATS) | set(stats.RUN_STATS)   # a pair's too
    np.testing.assert_allclose(j["summary"]["first_token_mass"], ref.attentions[..., 0].mean(-1), atol=1e-6)


def test_entropy_is_minus_sum_p_log_p_of_returned_rows(client):
    j = post(client, {"text": TEXT, "layers": [1, 3], "heads": [0, 5, 11]}).json()
    p = np.array(j["attention"], np.float64)
    assert p.shape[:2] == (2, 3)
    expected = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(-1)
    np.testing.assert_allclose(j["entropy"], expected, atol=1e-5)
    np.testing.assert_allclose(np.array(j["normalized_entropy"]), expected / np.log(p.shape[-1]), atol=1e-5)
    np.testing.assert_allclose(j["max_weight"], p.max(-1), atol=1e-7)


def test_precision_rounds(client, runtimes):
    j = post(client, {"text": TEXT, "layers": [2], "heads": [4], "precision": 3}).json()
    [ref] = runtimes["minilm"].run([TEXT])
    att = np.array(j["attention"])
    np.testing.assert_allclose(att, ref.attentions[[2]][:, [4]], atol=5e-4 + 1e-9)
    assert np.all(np.round(att, 3) == att)


@pytest.mark.parametrize("model", ["minilm", "tiny-gpt"])
def test_causal_puts_exact_zero_above_diagonal(client, model):
    j = post(client, {"model": model, "text": TEXT, "causal": True}).json()
    att = np.array(j["attention"])
    T = att.shape[-1]
    assert j["causal"] is True
    assert np.all(att[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)
    np.testing.assert_allclose(att.sum(-1), 1.0, atol=1e-6)


def test_decoder_is_causal_by_default_and_can_be_lifted(client):
    assert post(client, {"model": "tiny-gpt", "text": TEXT}).json()["causal"] is True
    j = post(client, {"model": "tiny-gpt", "text": TEXT, "causal": False}).json()
    assert j["causal"] is False and np.array(j["attention"])[0, 0, 0, 1] > 0


def test_masked_tokens_get_zero_as_keys(client):
    j = post(client, {"text": TEXT, "mask_tokens": [2, 5]}).json()
    att = np.array(j["attention"])
    assert j["mask_tokens"] == [2, 5]
    for k in (2, 5):
        others = [i for i in range(att.shape[-2]) if i != k]
        assert np.all(att[..., others, k] == 0.0)
    np.testing.assert_allclose(att.sum(-1), 1.0, atol=1e-6)
    plain = np.array(post(client, {"text": TEXT}).json()["attention"])
    assert not np.allclose(plain, att)  # the model really re-ran with the mask


def test_numpy_engine_agrees(client):
    a = post(client, {"text": TEXT, "layers": [5]}).json()
    b = post(client, {"text": TEXT, "layers": [5], "engine": "numpy"}).json()
    assert b["provider"] == "numpy"
    np.testing.assert_allclose(a["attention"], b["attention"], atol=1e-5)


def test_summary_only_has_no_matrices(client):
    j = post(client, {"text": TEXT, "include": ["summary"]}).json()
    assert j.get("attention") is None and j.get("entropy") is None
    assert np.array(j["summary"]["mean_entropy"]).shape == (6, 12)


def test_resolution_block_averages(client, runtimes):
    text = " ".join(["word"] * 60)
    j = post(client, {"text": text, "layers": [0], "heads": [0], "resolution": 8}).json()
    att = np.array(j["attention"])[0, 0]
    [ref] = runtimes["minilm"].run([text])
    assert att.shape == (8, 8) and len(j["blocks"]) == 8
    (a, b), (c, d) = j["blocks"][2], j["blocks"][5]
    np.testing.assert_allclose(att[2, 5], ref.attentions[0, 0, a:b, c:d].mean(), atol=1e-6)
    assert j["blocks"][0][0] == 0 and j["blocks"][-1][1] == len(ref.tokens)


def test_binary_transport_matches_json(client):
    body = {"text": TEXT, "layers": [0, 4]}
    j = post(client, body).json()
    r = post(client, body, headers={"Accept": BINARY})
    assert r.status_code == 200 and r.headers["content-type"] == BINARY
    b = from_binary(r.content)
    assert b["tokens"] == j["tokens"] and b["summary"] == j["summary"]
    np.testing.assert_array_equal(b["attention"], np.array(j["attention"], np.float32))
    np.testing.assert_array_equal(b["entropy"], np.array(j["entropy"], np.float32))
    r16 = post(client, body | {"dtype": "float16"}, headers={"Accept": BINARY})
    b16 = from_binary(r16.content)
    assert b16["attention"].dtype == np.float16 and len(r16.content) < len(r.content)
    np.testing.assert_allclose(b16["attention"], b["attention"], atol=1e-3)


def test_json_is_default_for_json_clients(client):
    r = post(client, {"text": "hi"}, headers={"Accept": "*/*"})
    assert r.headers["content-type"] == "application/json"


def test_etag_and_not_modified(client):
    body = {"text": "An ETag test.", "layers": [0]}
    r1 = post(client, body)
    etag = r1.headers["etag"]
    assert post(client, body, headers={"If-None-Match": etag}).status_code == 304
    r2 = post(client, body)
    assert r2.headers["x-cache"] == "hit" and r2.headers["etag"] == etag
    assert post(client, body | {"layers": [1]}).headers["etag"] != etag


def test_stages_are_what_the_model_computed(client, runtimes):
    body = {"model": "tiny-gpt", "text": "The cat sat on the mat", "layer": 1, "head": 2}
    j = client.post("/api/stages", json=body).json()
    [ref] = runtimes["tiny-gpt"].run(["The cat sat on the mat"], stages=True)
    for name in ("q", "k", "scores", "scaled", "masked"):
        np.testing.assert_allclose(j[name], ref.stages[name][1, 2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(j["probs"], ref.attentions[1, 2], atol=1e-7)
    q, k = np.array(j["q"]), np.array(j["k"])
    np.testing.assert_allclose(j["scores"], q @ k.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(j["scaled"], np.array(j["scores"]) * j["scale"], rtol=1e-6, atol=1e-6)
    assert j["scale"] == pytest.approx(1 / np.sqrt(runtimes["tiny-gpt"].cfg.d_head))
    mask = np.array(j["mask"])
    assert np.all(mask[np.triu_indices(len(j["tokens"]), 1)] < -1e38) and np.all(np.tril(mask) == 0)
    assert np.all(np.array(j["probs"])[np.triu_indices(len(j["tokens"]), 1)] == 0.0)


def test_every_page_view_is_a_capability_feature():
    """The page's tabs are features of the capability record, by their view ids (the page disables by it): each
    view needs features the runtime decides (runtime/capabilities.py FEATURES, what a model can do), and a feature
    named as a view is that view's own analysis (stages, circuits, lens, summary), never a tab of the runtime's."""
    from attnscope.app.pages import VIEW_NEEDS, VIEWS
    from attnscope.runtime.capabilities import FEATURES
    assert list(VIEW_NEEDS) == [v for v, _ in VIEWS] and len(FEATURES) == len(set(FEATURES))
    assert {f for needs in VIEW_NEEDS.values() for f in needs} <= set(FEATURES)
    assert all(VIEW_NEEDS[f] == (f,) for f in set(FEATURES) & set(VIEW_NEEDS))


def test_models_onnx_and_health(client):
    models = client.get("/api/models").json()
    assert [m["id"] for m in models] == ["minilm", "tiny-gpt", "induction"]   # the suite's ATTNSCOPE_MODELS
    caps = models[0].pop("capabilities")   # MiniLM: 22.6M float32 weights (the bias vectors included), every feature
    assert caps["parameters"] == 22_565_376 and caps["weights_bytes"] == 4 * caps["parameters"]
    assert caps["dtype"] == caps["compute_dtype"] == "float32" and caps["reasons"] == {}
    # by size every feature; by kind (an encoder, no LM head, no unembedding) no next token and what reads one, each
    # refused in a few words for the page
    no_lm, no_unembedding = "an encoder: it predicts no next token", "no unembedding: no tokens can be read out of its stream"
    assert caps["short"] == {"effects": no_lm, "lens": no_unembedding, "head_lens": no_unembedding,
                             "attribution": no_lm, "patching": no_lm, "knockout": no_lm, "predictions": no_lm,
                             "generate": no_lm, "cache": no_lm}
    assert caps["features"] == {"stacked": True, "numpy": True, "circuits": True, "importance": True,
                                "head": True, "lines": True, "model": True, "summary": True, "entropy": True,
                                "stages": True, "compare": True, "corpus": True, "effects": False, "lens": False, "cache": False,
                                "atlas": True, "why": True, "head_lens": False, "attribution": False,
                                "patching": False, "knockout": False, "predictions": False, "generate": False,
                                "jobs": True}
    assert models[0] | {"description": ""} == {"id": "minilm", "title": "all-MiniLM-L6-v2", "description": "",
                                                 "kind": "encoder", "source": "zoo", "architecture": "bert",
                                                 "layers": 6, "heads": 12, "d_model": 384,
                                                 "d_head": 32, "max_tokens": 256, "trained_tokens": 256,
                                                 "max_positions": 512, "pair": True,
                                                 "provider": PROVIDERS[0], "kv_heads": 12,
                                                 "predictions": False, "unembedding": False, "chat": False, "head_roles": [], "explanation": "",
                                                 "local_layers": [], "sliding_window": 0}
    assert [r["role"] for r in models[1]["head_roles"]][:2] == ["previous-token", "first-token"]
    r = client.get("/api/models/tiny-gpt/onnx")
    assert r.status_code == 200 and r.content[:2] == b"\x08\x08"  # ir_version 8, the first protobuf field
    import onnx
    graph = onnx.load_from_string(r.content).graph
    assert [o.name for o in graph.output] == ["hidden", "attentions", "value_norms"]   # and each key's ||v_j W_O^h||
    assert client.get("/healthz").json()["models"] == dict.fromkeys(["minilm", "tiny-gpt",
                                                                      "induction"], PROVIDERS[0])


# ---- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body, status, message", [
    ({"model": "gpt-5", "text": "hi"}, 404, "unknown model 'gpt-5'; available: minilm, tiny-gpt"),
    ({"text": ""}, 422, "text is empty"),
    ({"text": "   \n\t"}, 422, "text is empty"),
    ({"text": "hi", "layers": [6]}, 422, "layers [6] out of range: this model has 6 layers (0..5)"),
    ({"text": "hi", "heads": [0, 12]}, 422, "heads [12] out of range: this model has 12 heads (0..11)"),
    ({"text": "hi", "layers": []}, 422, "layers is empty"),
    ({"text": "hi", "layers": [-1]}, 422, "layers.0: Input should be greater than or equal to 0"),
    ({"text": "hi", "mask_tokens": [9]}, 422, "mask_tokens index 9 is out of range: this text has 3 tokens (0..2)"),
    ({"text": "hi", "resolution": 0}, 422, "resolution: Input should be greater than or equal to 1"),
    ({"text": "hi", "causal": "yes"}, 422, "causal: Value error, must be true or false"),
    ({"text": "hi", "layers": [True]}, 422, "must be a JSON integer"),
    ({"text": "hi", "engine": "tensorflow"}, 422, "engine: Input should be 'onnx' or 'numpy'"),
    ({"text": "hi", "colour": "red"}, 422, "colour: Extra inputs are not permitted"),
    ({"text": "hi", "include": ["everything"]}, 422, "include.0: Input should be"),
    ({"model": "tiny-gpt", "text": "hi", "text_pair": "there"}, 422, "takes a single text, not a sentence pair"),
    ({}, 422, "text: Field required"),
    ({"text": "x" * 20_001}, 413, "text is 20001 characters; the limit is 20000"),
])
def test_errors_say_what_to_change(client, body, status, message):
    r = post(client, body)
    assert r.status_code == status, r.text
    assert message in r.json()["detail"]


def test_stages_errors(client):
    r = client.post("/api/stages", json={"text": "hi", "layer": 6, "head": 0})
    assert r.status_code == 422 and "layers [6] out of range" in r.json()["detail"]
    r = client.post("/api/stages", json={"text": "hi", "layer": 0})
    assert r.status_code == 422 and "head: Field required" in r.json()["detail"]


def test_malformed_json_and_oversized_body(client):
    r = client.post("/api/attention", content=b'{"text": "hi"', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["detail"] == "the request body is not valid JSON"
    r = client.post("/api/attention", content=b'{"text": "caf\xe9"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "send UTF-8 JSON" in r.json()["detail"]
    r = client.post("/api/attention", content=b'{"text": "' + b"a" * 1_000_001 + b'"}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "1,000,000-byte limit" in r.json()["detail"]
    assert client.get("/healthz").status_code == 200


def test_unknown_model_onnx_is_404(client):
    r = client.get("/api/models/nope/onnx")
    assert r.status_code == 404 and "available: minilm, tiny-gpt" in r.json()["detail"]


def test_json_answer_size_limit_names_the_way_out():
    with TestClient(create_app(Settings(models=["tiny-gpt"], max_json_cells=500))) as c:
        r = post(c, {"model": "tiny-gpt", "text": TEXT})
        assert r.status_code == 422
        assert "limit is 500" in r.json()["detail"] and "resolution" in r.json()["detail"]
        assert post(c, {"model": "tiny-gpt", "text": TEXT, "layers": [0], "heads": [0]}).status_code == 200
        assert post(c, {"model": "tiny-gpt", "text": TEXT, "resolution": 4}).status_code == 200


def test_error_bodies_leak_no_paths(client):
    for body in ({"text": ""}, {"model": "x", "text": "a"}, {"text": "a", "layers": [99]}):
        assert "/" not in post(client, body).json()["detail"].replace("0..", "")


# ---- a real server ------------------------------------------------------------------------------
def _texts(n):
    return [f"Request number {i}: " + " ".join(["alpha", "beta", "gamma", "delta"][: 1 + i % 4]) * (1 + i % 3)
            for i in range(n)]


def test_concurrent_requests_equal_sequential(live_server):
    """16 different texts at once through uvicorn give exactly what the same requests give one by one."""
    texts = _texts(16)
    bodies = [{"text": t, "layers": [0, 5], "heads": [1, 7], "causal": i % 2 == 0} for i, t in enumerate(texts)]
    with httpx.Client(timeout=60) as http, cf.ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(lambda b: http.post(f"{live_server}/api/attention", json=b), bodies))
    assert all(r.status_code == 200 for r in concurrent), [r.text for r in concurrent if r.status_code != 200]
    with TestClient(create_app(Settings(cache_mb=0))) as fresh:   # no cache: every request really runs
        for body, r in zip(bodies, concurrent):
            one = post(fresh, body)
            assert one.headers["x-cache"] == "miss"
            a, b = r.json(), one.json()
            for key in ("tokens", "attention", "entropy", "summary", "causal"):
                assert a[key] == b[key], key


def test_live_server_errors_leave_it_healthy(live_server):
    with httpx.Client(timeout=30) as http:
        assert http.post(f"{live_server}/api/attention", content=b"\xff\xfe", headers={
            "Content-Type": "application/json"}).status_code == 400
        assert http.post(f"{live_server}/api/attention", json={"text": "hi", "layers": [99]}).status_code == 422
        assert http.get(f"{live_server}/healthz").json()["status"] == "ok"


def test_stages_limit_trims_to_the_first_tokens(client):
    text = " ".join(["word"] * 100)
    full = client.post("/api/stages", json={"text": text, "layer": 0, "head": 0}).json()
    part = client.post("/api/stages", json={"text": text, "layer": 0, "head": 0, "limit": 10}).json()
    assert len(part["tokens"]) == len(full["tokens"]) == 102
    assert np.array(part["probs"]).shape == (10, 10) and np.array(part["q"]).shape == (10, 32)
    np.testing.assert_array_equal(np.array(part["scores"]), np.array(full["scores"])[:10, :10])


def test_openapi_describes_every_field_and_error(client):
    spec = client.get("/openapi.json").json()
    undocumented = [f"{name}.{prop}" for name, schema in spec["components"]["schemas"].items()
                    if name in {"ModelInfo", "AttentionRequest", "StagesRequest", "AttentionResponse",
                                "StagesResponse", "Health", "Error"}
                    for prop, p in schema.get("properties", {}).items() if "description" not in p]
    assert undocumented == []
    for path in ("/api/attention", "/api/stages"):
        op = spec["paths"][path]["post"]
        assert {"400", "404", "413", "422", "503"} <= set(op["responses"])
        assert "examples" in spec["components"]["schemas"][op["requestBody"]["content"]["application/json"]
                                                           ["schema"]["$ref"].split("/")[-1]]


def test_float16_conversion_is_bit_exact():
    from attnscope.runtime.sessions import to_float16
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.random(10_000), rng.random(10_000) * 1e-5, [0, 1, 6.1e-5, 5.96e-8, 1e-9, 65504, 70000]])
    x = x.astype(np.float32).reshape(-1, 1)
    with np.errstate(over="ignore"):  # 70000 -> inf, on both sides
        expected = x.astype(np.float16)
    assert np.array_equal(to_float16(x).view(np.uint16), expected.view(np.uint16))
