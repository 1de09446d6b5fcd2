"""The API's details from the numerical audit (issue 15): rounding, special tokens, normalised entropy, what the
schema says about thumbnails, offsets and index ranges, token limits and their warnings, and the statistics
next-token and cross-sentence mass."""
from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from attnscope.analyses import payloads as payload
from attnscope.app.errors import StartupError
from attnscope.app.main import create_app
from attnscope.app.service import AttentionService
from attnscope.app.settings import Settings
from attnscope.analysis import statistics as stats
from attnscope.sources import zoo

TEXT = "The animal didn't cross the street because it was too tired."
LONG = "the quick brown fox jumps over the lazy dog " * 40          # 360 words: past 256 tokens


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as c:
        yield c


def post(client, path="/api/attention", **body):
    body.setdefault("model", "minilm")
    body.setdefault("text", TEXT)
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def floats(node, path=""):
    """(path, value) of every float in a decoded JSON answer."""
    if isinstance(node, float):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from floats(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from floats(v, f"{path}[{i}]")


# ---- precision ------------------------------------------------------------------------------------------
def test_rounded_reaches_nested_dicts_lists_and_numpy_scalars():
    out = payload.rounded({"summary": {"a": np.array([[0.123456]], np.float32)}, "x": np.float32(0.98765),
                           "rows": [0.55555, {"y": 1.23456}], "tokens": ["a"], "n": 3, "flag": True}, 2)
    assert out["summary"]["a"].tolist() == [[pytest.approx(0.12, abs=1e-7)]]
    assert out["x"] == 0.99 and out["rows"] == [0.56, {"y": 1.23}]
    assert out["tokens"] == ["a"] and out["n"] == 3 and out["flag"] is True


@pytest.mark.parametrize("path, body", [
    ("/api/attention", {"text_pair": "It was late.", "include": ["attention", "entropy", "summary", "rollout"]}),
    ("/api/attention", {"resolution": 4, "layers": [0, 3]}),
    ("/api/stages", {"layer": 1, "head": 2}),
])
def test_precision_rounds_every_float_of_the_answer(client, path, body):
    j = post(client, path, precision=3, **body)
    seen = 0
    for where, v in floats(j):
        if where.startswith(".timing_ms"):          # request timing: always milliseconds with 3 decimals
            continue
        seen += 1
        assert v == round(v, 3) or abs(v) > 1e37, (where, v)   # the mask's float32 minimum is exempt
    assert seen > 50
    if "text_pair" in body:
        assert set(j["summary"]) == set(stats.HEAD_STATS) | set(stats.PAIR_STATS) | set(stats.RUN_STATS)


# ---- special tokens -------------------------------------------------------------------------------------
def test_typed_special_tokens_are_flagged(client):
    text = "hello [SEP] world \N{GRINNING FACE} [UNK] x"
    j = post(client, text=text, text_pair="b [CLS]", include=["summary"])
    rows = list(zip(j["tokens"], j["token_ids"], j["special"], j["segments"]))
    assert rows[2] == ("[SEP]", 102, True, 0)                  # typed into the text: special, in sentence A
    assert rows[4] == ("[UNK]", 100, False, 0)                 # stands for the emoji: real text
    assert rows[5] == ("[UNK]", 100, True, 0)                  # typed "[UNK]"
    assert rows[9] == ("[CLS]", 101, True, 1)                  # typed into the pair
    assert [r[2] for r in rows if r[3] == -1] == [True, True, True]    # the tokenizer's own


# ---- normalised entropy ---------------------------------------------------------------------------------
def test_normalized_entropy_never_exceeds_one_in_float32():
    for n in range(2, 65):                                      # float32 rounding put 14 of these above 1 before
        p = np.full((1, n), np.float32(1) / np.float32(n), np.float32)
        ne = stats.normalized_entropy(p, np.array([n]))
        assert 1 - 1e-6 <= ne[0] <= 1.0, n


def test_normalized_entropy_within_0_1_in_answers(client):
    j = post(client, text=LONG, include=["entropy"])
    ne = np.array(j["normalized_entropy"])
    assert ne.min() >= 0.0 and ne.max() <= 1.0


# ---- what the schema says -------------------------------------------------------------------------------
def test_thumbnail_rows_sum_to_one_over_key_block_width_as_documented(client):
    j = post(client, text=LONG, layers=[0], heads=[2], resolution=8)
    cells, blocks = np.array(j["attention"][0][0]), np.array(j["blocks"])
    width = np.diff(blocks, axis=1)[:, 0]
    np.testing.assert_allclose(cells.sum(-1), 1 / width.mean(), rtol=0.1)   # about 1/(key block width)
    np.testing.assert_allclose((cells * width[None, :]).sum(-1), 1.0, atol=1e-5)   # x width: exactly 1
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert "1/(key block width)" in schema["AttentionRequest"]["properties"]["resolution"]["description"]
    assert "1/(key block width)" in schema["AttentionResponse"]["properties"]["attention"]["description"]
    assert "rows sum to 1 (block means" not in json.dumps(schema)


def test_offsets_are_code_points_and_the_schema_says_so_with_utf16(client):
    text = "\N{GRINNING FACE} cat sat"
    j = post(client, text=text, include=["summary"])
    for tok, (a, b), special in zip(j["tokens"], j["offsets"], j["special"]):
        if not special and tok != "[UNK]":
            assert text[a:b] == tok                            # Python indexes code points
    assert j["offsets"][2] == [2, 5]                           # "cat": after the emoji (1 code point, 2 UTF-16 units)
    doc = client.get("/openapi.json").json()["components"]["schemas"]["AttentionResponse"]["properties"]["offsets"]
    assert "code points" in doc["description"] and "UTF-16" in doc["description"]


def test_openapi_bounds_indices_by_the_largest_served_model(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    models = client.get("/api/models").json()
    L, H = max(m["layers"] for m in models), max(m["heads"] for m in models)
    att, stg = schema["AttentionRequest"]["properties"], schema["StagesRequest"]["properties"]
    assert att["layers"]["anyOf"][0]["items"]["maximum"] == L - 1 == stg["layer"]["maximum"]
    assert att["heads"]["anyOf"][0]["items"]["maximum"] == H - 1 == stg["head"]["maximum"]
    assert "each of which checks its own" in att["heads"]["description"]
    # the largest index the schema allows is accepted by the largest model; one past it is refused
    assert post(client, layers=[L - 1], heads=[H - 1], include=["summary"])["heads"] == [H - 1]
    r = client.post("/api/attention", json={"text": TEXT, "heads": [H]})
    assert r.status_code == 422 and f"this model has {H} heads" in r.json()["detail"]
    assert att["text"]["pattern"] == r"\S"


# ---- token limits -----------------------------------------------------------------------------------------
def test_minilm_limit_is_its_trained_length(client):
    cfg = json.loads((zoo.minilm_dir() / "sentence_bert_config.json").read_text())
    info = {m["id"]: m for m in client.get("/api/models").json()}["minilm"]
    assert info["max_tokens"] == info["trained_tokens"] == cfg["max_seq_length"] == 256
    assert info["max_positions"] == 512
    j = post(client, text=LONG, include=["summary"])
    assert len(j["tokens"]) == 256 and j["truncated"] is True and j["warnings"] == []
    assert post(client, include=["summary"])["warnings"] == []


@pytest.mark.slow
def test_raised_limit_answers_carry_a_warning():
    with TestClient(create_app(Settings(models=["minilm"], max_tokens={"minilm": 512}))) as c:
        assert c.get("/api/models").json()[0]["max_tokens"] == 512
        j = post(c, text=LONG, include=["summary"])
        T = len(j["tokens"])
        assert 256 < T <= 512 and j["truncated"] is False
        [warning] = j["warnings"]
        assert f"{T} tokens is more than the 256" in warning and "untrained" in warning
        assert post(c, "/api/stages", text=LONG, layer=0, head=2, limit=4)["warnings"] == [warning]


def test_limit_past_the_positions_refuses_to_start():
    svc = AttentionService(Settings(models=["tiny-gpt"], max_tokens={"tiny-gpt": 513}))
    with pytest.raises(StartupError, match=r"ATTNSCOPE_MAX_TOKENS: tiny-gpt=513, but it takes 2 to 512 tokens"):
        svc.load()


# ---- next-token and cross-sentence mass -----------------------------------------------------------------
def test_next_token_mass_by_hand():
    T = 6
    p = np.eye(T, k=1)
    p[-1, -1] = 1.0                                  # the last query has no next token
    s = stats.head_stats(p)
    assert s["next_token_mass"] == pytest.approx(1.0)              # averaged over the T-1 queries that have one
    assert s["previous_token_mass"] == pytest.approx(0.0)
    assert stats.head_stats(np.eye(T, k=-1) + np.eye(T)[0] * (np.arange(T) == 0)[:, None])["next_token_mass"] == 0
    assert "next_token_mass" in stats.STAT_INFO and "next_token_mass" in stats.HEAD_STATS


def test_cross_sentence_mass_by_hand():
    segments = [-1, 0, 0, -1, 1, 1, -1]              # [CLS] a a [SEP] b b [SEP]
    assert stats.sentences(segments).tolist() == [0, 0, 0, 0, 1, 1, 1]
    T = len(segments)
    uniform = np.full((T, T), 1 / T)
    s = stats.head_stats(uniform, segments=segments)
    assert s["cross_sentence_mass"] == pytest.approx((4 * 3 / T + 3 * 4 / T) / T)
    assert "cross_sentence_mass" not in stats.head_stats(uniform, segments=[-1, 0, 0, -1])
    assert "cross_sentence_mass" not in stats.HEAD_STATS and "cross_sentence_mass" in stats.STAT_INFO


def test_next_token_and_cross_sentence_mass_in_answers(client):
    j = post(client, text_pair="It was late.", layers=[1], include=["attention", "summary"])
    p = np.array(j["attention"][0])                  # [H, T, T]
    T = p.shape[-1]
    np.testing.assert_allclose(j["summary"]["next_token_mass"][0], p[:, np.arange(T - 1), np.arange(1, T)].mean(-1),
                               atol=1e-6)
    s = stats.sentences(j["segments"])
    other = s[:, None] != s[None, :]
    np.testing.assert_allclose(j["summary"]["cross_sentence_mass"][0], (p * other).sum(-1).mean(-1), atol=1e-6)


def test_precision_keeps_the_masks_minus_infinity(client):
    """Rounding float32's lowest value (the additive mask) must not overflow to -inf, i.e. JSON null."""
    j = client.post("/api/stages", json={"model": "tiny-gpt", "text": "a b c", "layer": 0, "head": 0,
                                         "precision": 1}).json()
    mask = np.array(j["mask"], dtype=float)
    assert not np.isnan(mask).any() and mask.min() < -3e38 and mask.max() == 0
