"""The OpenAPI says what the server takes: one request schema per served model, and schemathesis' CLI with every
check (`schemathesis run --checks all`, nothing configured) against a live server (bench/schemathesis_live.py).

The only schema-valid requests it may find refused (ST202) break a rule JSON Schema cannot state, each listed once with
its reason in tests/unstatable.py (a token index past the text's last token: the count depends on the text). Every
other failure fails this test.
"""
from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from bench.schemathesis_live import run
from tests.unstatable import KEPT_AFTER_DELETE, unstatable


@pytest.fixture(scope="module")
def spec():
    with TestClient(create_app(Settings(models=["minilm", "tiny-gpt"]))) as c:
        yield c.get("/openapi.json").json()


def test_each_model_has_its_own_request_schema(spec):
    """A layer tiny-gpt lacks (it has 4) is out of its schema; MiniLM's takes it. The operation takes one of them."""
    schemas = spec["components"]["schemas"]
    body = spec["paths"]["/api/attention"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    union = schemas[body["$ref"].rsplit("/", 1)[-1]]
    assert [v["$ref"].rsplit("/", 1)[-1] for v in union["oneOf"]] == ["AttentionRequest.minilm",
                                                                      "AttentionRequest.tiny-gpt"]
    tiny, minilm = schemas["AttentionRequest.tiny-gpt"]["properties"], schemas["AttentionRequest.minilm"]["properties"]
    assert tiny["model"]["const"] == "tiny-gpt" and "model" in schemas["AttentionRequest.tiny-gpt"]["required"]
    assert tiny["layers"]["anyOf"][0]["items"]["maximum"] == 3 and minilm["layers"]["anyOf"][0]["items"]["maximum"] == 5
    assert tiny["layers"]["anyOf"][0]["minItems"] == 1
    assert tiny["ablate"]["items"]["prefixItems"][0]["maximum"] == 3 and minilm["ablate"]["items"]["prefixItems"][1][
        "maximum"] == 11
    assert tiny["text_pair"] == {"type": "null", "description": "tiny-gpt takes a single text: leave it out"}
    assert minilm["decoder_text"] == {"type": "null", "description": "encoder-decoders only; minilm is an encoder: "
                                                                     "leave it out"}
    assert schemas["StagesRequest.tiny-gpt"]["properties"]["attention"]["type"] == "null"
    assert "attribution" not in tiny["include"]["items"]["enum"]   # it reads next-token logits: tiny-gpt has none
    assert "attribution" in schemas["AttentionRequest"]["properties"]["include"]["items"]["enum"]   # the generic one
    assert minilm["mask_tokens"]["items"]["maximum"] == 255 and minilm["mask_tokens"]["maxItems"] == 512
    assert schemas["StagesRequest.tiny-gpt"]["properties"]["head"]["maximum"] == 3
    importance = schemas["ImportanceRequest.minilm"]["properties"]
    assert importance["text_pair"]["pattern"] == r"\S" and importance["batch"]["maximum"] == 64
    assert isinstance(importance["batch"]["maximum"], int)        # an integer's bounds are written as integers


@pytest.mark.slow
def test_schemathesis_every_check_against_a_live_server():
    done = run("minilm,tiny-gpt,induction", max_examples=30, seed=1, timeout=900)
    report = done.stdout
    assert "generated" in report, report[-3000:]
    # a cancelled job stays listed (tests/unstatable.py KEPT_AFTER_DELETE): the only resource ST301 may find
    kept = re.findall(r"^- ST301 Deleted resource still available\n\n.*\n\n\s+The resource was deleted with "
                      r"`DELETE (\S+)`\n\n\[200\] OK:\n\n\s+`(.*)`$", report, re.M)
    assert all(KEPT_AFTER_DELETE.fullmatch(path) and '"state":"cancelled"' in body for path, body in kept)
    failures = [f for f in re.findall(r"^- (ST\d+ [^\n]+)", report, re.M) if not f.startswith("ST301")]
    assert set(failures) <= {"ST202 Schema-valid request rejected"}, report[-6000:]
    assert report.count("- ST301") == len(kept), report[-6000:]
    refusals = [r for r in re.findall(r"^\[(\d+)\][^\n]*\n\n\s+`(.*)`$", report, re.M) if r[0] != "200"]
    assert len(refusals) == len(failures), report[-6000:]
    for status, body in refusals:
        assert status == "422" and unstatable(json.loads(body)["detail"]), f"a schema-valid request refused: {body}"
