"""The models researchers study: random checkpoints of Llama 3.2 1B's and Llama 3.1 8B's exact published shapes
(bench/checkpoints.py: transformers' LlamaConfig, weights drawn wide enough that attention is peaked), served by path
through the app, against transformers eager in float32 on the same weights (a bfloat16 weight widened to float32 is
exact, so the bf16 folder and its widened float32 copy are the same model and must give the same answers).

l1b: 1.24B parameters, 2.5 GB in bfloat16, 4.9 GB in float32: no graph could hold it before weights left the graph
(protobuf stops at 2 GB). l8b's full 16 GB checkpoint is bench/big_models.py's; here its first two layers (the very
same weights: each tensor is drawn from a seed of its own name). Marked own_process: transformers' float32 copy of
l1b (5 GB) and ours are held at once.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope.app.wire import BINARY, from_binary
from bench.checkpoints import llama, text, widened

from .conftest import serving

pytestmark = [pytest.mark.own_process, pytest.mark.slow]
TOKENS = 512                                      # the attention parity's text, BOS included


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("big")
    bf16 = llama(root / "l1b-bf16", "l1b", "bfloat16")
    return {"l1b-bf16": bf16, "l1b-f32": widened(bf16, root / "l1b-f32")}


@pytest.fixture(scope="module")
def client(folders):
    yield from serving(folders)


@pytest.fixture(scope="module")
def hf(folders):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folders["l1b-f32"], dtype=torch.float32, attn_implementation="eager")


def test_l1b_is_served_in_its_own_precision(client, folders):
    """The bf16 folder is served as bf16 (half the f32 bytes), the f32 one as f32; both whole (one run holds them)."""
    models = {m["id"]: m for m in client.get("/api/models").json()}
    bf16, f32 = models["l1b-bf16"]["capabilities"], models["l1b-f32"]["capabilities"]
    assert bf16["dtype"] == "bfloat16" and f32["dtype"] == "float32" and bf16["compute_dtype"] == "float32"
    assert bf16["parameters"] == f32["parameters"] == 1_235_814_400
    assert bf16["weights_bytes"] * 2 == f32["weights_bytes"]
    assert bf16["features"]["stacked"] and f32["features"]["stacked"]
    assert not bf16["features"]["importance"] and "ATTNSCOPE_WORK_TFLOP" in bf16["reasons"]["importance"]


@pytest.mark.parametrize("model", ["l1b-bf16", "l1b-f32"])
def test_l1b_attention_and_next_token_equal_transformers(client, hf, model):
    """Every head's attention probabilities at 512 tokens and the next-token distribution, within 1e-4 of
    transformers eager (float32, its published RoPE scaling: llama3, factor 32), on peaked rows."""
    body = {"model": model, "text": text(TOKENS - 1), "include": ["attention", "predictions"]}
    parts = []
    for first in range(0, 16, 4):                 # 4 layers per answer (the binary form's cell limit); one run
        r = client.post("/api/attention", json=body | {"layers": list(range(first, first + 4))},
                        headers={"Accept": BINARY})
        assert r.status_code == 200, r.text[:300]
        parts.append(from_binary(r.content))
    ids = parts[0]["token_ids"]
    assert len(ids) == TOKENS
    ours = np.concatenate([p["attention"] for p in parts])                    # [16, 32, T, T]
    with torch.inference_mode():
        out = hf(torch.tensor([ids]), output_attentions=True)
    ref = torch.stack(out.attentions)[:, 0].numpy()
    assert ref.max(-1).mean() >= 0.5                                           # peaked: the comparison means something
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    p = torch.softmax(out.logits[0, -1].double(), -1).numpy()
    for t in parts[0]["next_tokens"]:
        assert abs(t["prob"] - p[t["id"]]) < 1e-4, t
    assert parts[0]["next_tokens"][0]["id"] == int(p.argmax())


def test_l1b_generates_what_transformers_generates(client, hf):
    """16 greedy tokens, the key/value cache on the decoding graph (weights bound at every step), equal to
    transformers' generate."""
    prompt = text(24)
    r = client.post("/api/generate", json={"model": "l1b-bf16", "text": prompt, "greedy": True,
                                           "max_new_tokens": 16})
    assert r.status_code == 200, r.text[:300]
    done = json.loads(r.text.splitlines()[-1])["done"]
    ids = client.post("/api/attention", json={"model": "l1b-bf16", "text": prompt, "include": []}).json()["token_ids"]
    with torch.inference_mode():
        theirs = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=16, pad_token_id=0)
    assert done["ids"] == theirs[0, len(ids):].tolist()


def test_l1b_patching_qk_and_lens_work(client):
    """The analyses that read every layer's sites, through the layer graphs: patching the one position where two
    texts differ, at layer 0, recovers the clean metric exactly (the runs are then the same); QK attribution's table
    sums to the score the run computed; the lens' last row is the model's own next-token distribution."""
    clean, corrupt = "the cat sat on the mat", "the dog sat on the mat"
    r = client.post("/api/patching", json={"model": "l1b-bf16", "clean": clean, "corrupt": corrupt, "site": "residual",
                                           "target": "m", "distractor": "h"})
    assert r.status_code == 200, r.text[:300]
    p = r.json()
    assert abs(p["clean"] - p["corrupt"]) > 1e-3
    differ = [i for i, (a, b) in enumerate(zip(clean, corrupt)) if a != b]
    for position in differ:                                   # byte tokens: position i + 1 after the BOS
        np.testing.assert_allclose(p["patched"][0][position + 1], p["clean"], atol=1e-4)
    q = client.post("/api/qk", json={"model": "l1b-bf16", "text": clean, "layer": 5, "head": 7, "query": 20,
                                     "key": 3}).json()
    assert abs(q["score"] - q["scaled"]) < 1e-3 * max(1.0, abs(q["scaled"])), q
    lens = client.post("/api/lens", json={"model": "l1b-bf16", "text": clean, "top": 3}).json()
    a = client.post("/api/attention", json={"model": "l1b-bf16", "text": clean, "include": ["predictions"]}).json()
    assert lens["rows"][0] == "embed" and len(lens["rows"]) == 17
    assert lens["top_ids"][-1][-1][0] == a["next_tokens"][0]["id"]


def test_every_graph_kind_runs_a_model_over_2_gb(client):
    """l1b in float32 (4.9 GB: no graph can hold it) through each kind of graph the app builds for a decoder: the
    stacked graph (above), a graph cut after the first block, the teaching stages, the decoding step (above), and the
    layer graphs of a long text (a layer-by-layer run, ATTNSCOPE_LAYERWISE_MB) -- their answers agreeing."""
    body = {"model": "l1b-f32", "text": text(40)}
    whole = client.post("/api/attention", json=body | {"include": ["attention", "predictions"]}).json()
    cut = client.post("/api/attention", json=body | {"layers": [0], "include": ["attention"]}).json()
    np.testing.assert_array_equal(cut["attention"][0], whole["attention"][0])
    st = client.post("/api/stages", json=body | {"layer": 3, "head": 9}).json()
    np.testing.assert_allclose(st["probs"], whole["attention"][3][9], atol=1e-6)


def test_l1b_layer_by_layer_equals_the_whole_graph(folders):
    """A run too big for the stacked graph (here: forced by a tiny ATTNSCOPE_LAYERWISE_MB) walks the layer graphs."""
    for c in serving({"l1b-f32": folders["l1b-f32"]}, layerwise_mb=1):
        body = {"model": "l1b-f32", "text": text(40), "layers": [2, 11], "include": ["attention"]}
        lw = c.post("/api/attention", json=body).json()
    for c in serving({"l1b-f32": folders["l1b-f32"]}):
        whole = c.post("/api/attention", json=body).json()
    np.testing.assert_allclose(lw["attention"], whole["attention"], atol=2e-6)


@pytest.fixture(scope="module")
def l8b_cut(tmp_path_factory) -> Path:
    """Llama 3.1 8B's shapes (4096 wide, 32 heads over 8 key/value heads of 128, 14336 MLP, untied 128256-token
    head), its first two layers: the same weights as the full checkpoint's."""
    return llama(tmp_path_factory.mktemp("l8b") / "l8b-2", "l8b", "bfloat16", layers=2)


def test_l8b_first_layers_equal_transformers(l8b_cut):
    from transformers import LlamaForCausalLM

    for c in serving({"l8b-2": l8b_cut}):
        a = c.post("/api/attention", json={"model": "l8b-2", "text": text(127), "include": ["attention"]},
                   headers={"Accept": BINARY})
        assert a.status_code == 200, a.text[:300]
        ours = from_binary(a.content)
    hf = LlamaForCausalLM.from_pretrained(l8b_cut, dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        ref = torch.stack(hf(torch.tensor([ours["token_ids"]]), output_attentions=True).attentions)[:, 0].numpy()
    assert ref.max(-1).mean() >= 0.5
    np.testing.assert_allclose(ours["attention"], ref, atol=1e-4, rtol=0)
