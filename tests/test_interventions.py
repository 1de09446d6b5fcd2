"""Head ablation (zero and mean) against transformers with a forward pre-hook on the output projection, the
answer's effect fields, head-finding scores through the API, and batched head importance."""
from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.runtime.interventions import head_importance

from .conftest import CACHE, ablation_hooks

import torch  # noqa: E402  (the test set-up installs torch and transformers: never skipped)
import transformers  # noqa: E402

TEXT = "The animal didn't cross the street because it was too tired, so the animal slept."
ABLATE = [(0, 3), (1, 7), (1, 2), (3, 0)]


@pytest.fixture(scope="module")
def hf_minilm():
    from attnscope.sources import zoo
    torch.set_num_threads(2)
    return transformers.BertModel.from_pretrained(str(zoo.minilm_dir()), attn_implementation="eager").eval()


def hf_ablated(model, ids, type_ids, heads, mode):
    """transformers' BERT with the heads knocked out by pre-hooks on attention.output.dense (conftest)."""
    dh = model.config.hidden_size // model.config.num_attention_heads
    with ablation_hooks(lambda l: model.encoder.layer[l].attention.output.dense, dh, heads, mode), torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([type_ids]), output_attentions=True)
    return np.stack([a[0].numpy() for a in out.attentions]), out.last_hidden_state[0].numpy()


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("engine", ["onnx", "numpy"])
def test_minilm_ablation_matches_transformers_hooks(runtimes, hf_minilm, mode, engine):
    rt = runtimes["minilm"]
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    keep = np.ones((1, L, H), np.float32)
    for l, h in ABLATE:
        keep[0, l, h] = 0
    mean = 1 - keep if mode == "mean" else np.zeros_like(keep)
    [res] = rt.run(TEXT, head_mask=keep, head_mean=mean, engine=engine)
    [intact] = rt.run(TEXT)
    att, hidden = hf_ablated(hf_minilm, res.token_ids, res.encoding.type_ids, ABLATE, mode)
    np.testing.assert_allclose(res.attentions, att, atol=1e-4, rtol=0)
    np.testing.assert_allclose(res.hidden, hidden, atol=1e-4, rtol=0)
    # the ablation did something: later layers' attention moved, the first layer's did not
    np.testing.assert_allclose(res.attentions[0], intact.attentions[0], atol=1e-6)
    assert np.abs(res.attentions[2:] - intact.attentions[2:]).max() > 1e-3


def test_mean_ablation_equals_a_plain_numpy_rewrite(runtimes):
    """The mean-ablated run equals re-running the NumPy blocks by hand with the head's context vectors replaced by
    their average over the text's positions."""
    rt = runtimes["tiny-gpt"]
    l_abl, h_abl = 1, 2
    enc = rt.encode("the cat sat on the mat while the dog barked")
    keep = np.ones((1, rt.cfg.n_layers, rt.cfg.n_heads), np.float32)
    keep[0, l_abl, h_abl] = 0
    [res] = rt.forward([enc], head_mask=keep, head_mean=1 - keep, engine="onnx")
    # by hand: pre-norm blocks, MultiHeadAttention's own projections, the head's context replaced by its mean
    model, ids = rt.model, np.array([enc.ids])
    T = ids.shape[1]
    mask = rt.build_mask([T], True)
    x = model.embed(ids)
    dh = rt.cfg.d_head
    for i, block in enumerate(model.blocks):
        h = block.ln1(x)
        attn = block.attn
        q, k, v = (h @ attn._projection(j)[0].T + attn._projection(j)[1] for j in range(3))
        q, k, v = (t.reshape(1, T, rt.cfg.n_heads, dh).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ctx = p @ v                                                   # [1, H, T, dh]
        if i == l_abl:
            ctx[:, h_abl] = ctx[:, h_abl].mean(axis=1, keepdims=True)
        a = ctx.transpose(0, 2, 1, 3).reshape(1, T, -1) @ attn.params["out_proj.weight"].T + attn.params["out_proj.bias"]
        x = x + a
        x = x + block.mlp(block.ln2(x))
        np.testing.assert_allclose(res.attentions[i], p[0], atol=1e-5)
    np.testing.assert_allclose(res.hidden, model.ln_f(x)[0], atol=1e-4)


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(models=["minilm", "induction"], cache=CACHE))) as c:
        yield c


def test_effect_of_knocking_out_the_induction_head(client):
    body = {"model": "induction", "text": "the quick brown fox saw a bird . the quick",
            "include": ["predictions", "effect"], "ablate": [[1, 0]]}
    j = client.post("/api/attention", json=body).json()
    assert j["effect"]["next_tokens_before"][0]["token"] == "brown"      # intact: the induction completion
    assert j["next_tokens"][0]["token"] != "brown"                         # ablated: gone
    assert j["effect"]["kl"] > 1 and j["ablate"] == [[1, 0]]
    intact = client.post("/api/attention", json={**body, "ablate": [], "include": ["predictions"]}).json()
    change = [a - b for a, b in zip(j["token_logprobs"][1:], intact["token_logprobs"][1:])]
    np.testing.assert_allclose(j["effect"]["token_logprob_change"][1:], change, atol=1e-4)
    assert j["effect"]["token_logprob_change"][0] is None
    assert client.post("/api/attention", json={**body, "ablate": []}).json().get("effect") is None  # nothing to compare


def test_effect_on_an_encoder_is_the_embedding_cosine(client, runtimes):
    j = client.post("/api/attention", json={"text": TEXT, "include": ["effect"], "ablate": [[0, 3]],
                                           "ablation": "mean"}).json()
    rt = runtimes["minilm"]
    keep = np.ones((1, 6, 12), np.float32)
    keep[0, 0, 3] = 0
    [a] = rt.run(TEXT, head_mask=keep, head_mean=1 - keep)
    [b] = rt.run(TEXT)
    ea, eb = a.hidden.mean(0).astype(np.float64), b.hidden.mean(0).astype(np.float64)
    assert j["effect"]["cosine"] == pytest.approx(ea @ eb / np.linalg.norm(ea) / np.linalg.norm(eb), abs=1e-6)
    assert j["effect"]["cosine"] < 1


def test_ablation_out_of_range_is_a_clear_422(client):
    r = client.post("/api/attention", json={"text": TEXT, "ablate": [[6, 0]]})
    assert r.status_code == 422 and "ablate [[6, 0]] out of range" in r.json()["detail"]
    r = client.post("/api/attention", json={"text": TEXT, "ablate": [[1]]})
    assert r.status_code == 422


def test_scores_find_the_constructed_heads(client):
    j = client.post("/api/attention", json={"model": "induction", "text": "a b c d", "include": ["scores"]}).json()
    s = {k: np.array(v) for k, v in j["scores"].items()}
    assert s["previous_token"][0, 0] > 0.99 and s["induction"][1, 0] > 0.99
    assert s["induction"][0, 0] < 0.01 and s["previous_token"][1, 0] < 0.5


def test_importance_batches_give_the_same_numbers(runtimes):
    rt = runtimes["tiny-gpt"]
    one, base1 = head_importance(rt, TEXT, batch=1)
    many, base2 = head_importance(rt, TEXT, batch=16)
    np.testing.assert_allclose(one, many, atol=1e-6)
    # each value is what a single ablation run gives
    keep = np.ones((1, 4, 4), np.float32)
    keep[0, 1, 0] = 0
    [a] = rt.run(TEXT, head_mask=keep, head_mean=np.zeros_like(keep))
    [b] = rt.run(TEXT)
    ea, eb = a.hidden.mean(0).astype(np.float64), b.hidden.mean(0).astype(np.float64)
    assert one[1, 0] == pytest.approx(1 - ea @ eb / np.linalg.norm(ea) / np.linalg.norm(eb), abs=1e-6)


def test_importance_endpoint(client):
    j = client.post("/api/importance", json={"model": "induction", "text": "the quick brown fox . the quick"}).json()
    assert j["measure"] == "mean_logprob_change" and np.array(j["importance"]).shape == (2, 1)
    assert j["importance"][1][0] != 0 and j["tokens"][0] == "[CLS]"
