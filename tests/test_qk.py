"""Why a head attends here, and what it writes (issue 25): QK attribution (/api/qk), the logit lens and a head's
logit lens (/api/lens), OV copying and composition scores (/api/circuits).

Independent references: /api/stages' `scaled` cell (the served graph's own score), transformers' SmolLM2 (its GGUF
loader) read through hooks, the NumPy reference forward pass (model/interventions.py) on random models of every
block kind, dense D x D and V x V matrices for the circuits, and the teaching models' construction.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from attnscope.analysis.circuits import composition, head_weights, ov_copying
from attnscope.analysis.qk import qk_attribution, stream_parts
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.interventions import forward
from attnscope.model.masks import causal_mask
from attnscope.model.transformer import LayerNorm, Transformer, TransformerConfig

from .conftest import CACHE
from .test_checkpoints import build_checkpoint
from .test_effects import IOI_CLEAN, _o_inputs

INDUCTION_TEXT = "Harry Potter met Ron Weasley at school. Then Harry Potter"   # the lesson's: [CLS] harry potter met ...


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """One app: SmolLM2, MiniLM, the teaching models and a GPT-2 checkpoint (learned positions) as `gpt2`."""
    folder = build_checkpoint("gpt2", tmp_path_factory.mktemp("qk") / "gpt2")
    settings = Settings(models=["smollm2", "minilm", "tiny-gpt", "induction", f"gpt2={folder}"], cache=CACHE,
                        max_patching_tokens=64)
    with TestClient(create_app(settings)) as c:
        yield c


def _qk(c, **body) -> dict:
    r = c.post("/api/qk", json=body)
    assert r.status_code == 200, r.text
    return r.json()


# ---- QK attribution: the table sums to the served model's own score ------------------------------------------------
@pytest.mark.parametrize("model,text", [("smollm2", IOI_CLEAN), ("gpt2", "the cat sat on the mat and the dog"),
                                        ("minilm", "The animal didn't cross the street because it was too tired.")])
def test_qk_table_sums_to_the_stages_score(client, model, text):
    info = {m["id"]: m for m in client.get("/api/models").json()}[model]
    L, H = info["layers"], info["heads"]
    for layer, head in [(0, 0), (L // 2, H - 1), (L - 1, H // 2)]:
        st = client.post("/api/stages", json={"model": model, "text": text, "layer": layer, "head": head}).json()
        T = len(st["tokens"])
        for query, key in [(T - 1, 1), (T // 2, T // 2), (2, T - 1)]:      # the last: masked in a causal model
            j = _qk(client, model=model, text=text, layer=layer, head=head, query=query, key=key, table=True, top=5)
            table = np.array(j["table"])
            assert table.shape == (len(j["components"]),) * 2
            assert table.sum() == pytest.approx(j["score"], abs=1e-9)
            assert np.sum(j["query_sums"]) == pytest.approx(j["score"], abs=1e-9)
            assert np.sum(j["key_sums"]) == pytest.approx(j["score"], abs=1e-9)
            assert j["score"] == pytest.approx(st["scaled"][query][key], abs=1e-4)
            assert j["scaled"] == pytest.approx(st["scaled"][query][key], abs=1e-4)
            assert j["probability"] == pytest.approx(st["probs"][query][key], abs=1e-6)
            assert j["visible"] == (st["mask"][query][key] > -1)
            values = [p["value"] for p in j["top"]]
            assert values == [table[p["query"], p["key"]] for p in j["top"]]
            assert np.all(np.diff(np.abs(values)) <= 0) and np.abs(values[0]) == pytest.approx(np.abs(table).max())
            assert 0 < j["explained"] <= 1
    names = [c["name"] for c in j["components"]]
    expected = {"smollm2": ["embed"], "gpt2": ["embed", "pos_embed"], "minilm": ["embed", "pos_embed", "type_embed"]}
    assert names[:len(expected[model])] == expected[model] and names[-1] == "bias"
    assert names[-3:-1] == [f"L{L - 2}H{H - 1}", f"L{L - 2} MLP"]
    assert j["components"][-2]["hook"] == f"blocks.{L - 2}.hook_mlp_out"


def test_qk_entries_equal_transformers_hooks(client, hf_smollm2):
    """SmolLM2: the embeddings x embeddings entry and earlier heads x embeddings entries, computed from transformers'
    own tensors (hidden states, o_proj inputs, its RMSNorm weight, q/k projections and rotary embedding)."""
    hf, (layer, head, query, key) = hf_smollm2, (3, 4, 13, 2)
    j = _qk(client, model="smollm2", text=IOI_CLEAN, layer=layer, head=head, query=query, key=key, table=True)
    names = [c["name"] for c in j["components"]]
    ids = client.post("/api/attention", json={"model": "smollm2", "text": IOI_CLEAN, "include": []}).json()["token_ids"]
    cfg = hf.config
    dh, group = cfg.head_dim, cfg.num_attention_heads // cfg.num_key_value_heads
    block = hf.model.layers[layer]
    with torch.inference_mode():
        hidden = hf(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[layer][0].double()
        z = _o_inputs(hf, ids)                                                        # [T, H * dh] per layer
        positions = torch.arange(len(ids))[None]
        cos, sin = hf.model.rotary_emb(hidden[None].float(), positions)
        g, eps = block.input_layernorm.weight.double(), cfg.rms_norm_eps

        def read(part: torch.Tensor, p: int, proj, h: int) -> torch.Tensor:          # part [D] at position p
            n = g * part / torch.sqrt(hidden[p].pow(2).mean() + eps)
            return n @ proj.weight[h * dh:(h + 1) * dh].double().T

        def rotated(q, k):
            qr, _ = apply_rotary_pos_emb(q[None, None, None].float(), q[None, None, None].float(),
                                         cos[:, query:query + 1], sin[:, query:query + 1])
            _, kr = apply_rotary_pos_emb(k[None, None, None].float(), k[None, None, None].float(),
                                         cos[:, key:key + 1], sin[:, key:key + 1])
            return float((qr.double().flatten() @ kr.double().flatten()) / np.sqrt(dh))

        def embed(p):
            return hf.model.embed_tokens.weight[ids[p]].double()

        def head_out(l, h, p):
            o = hf.model.layers[l].self_attn.o_proj.weight.double()
            return z[l][p, h * dh:(h + 1) * dh].double() @ o[:, h * dh:(h + 1) * dh].T

        k_embed = read(embed(key), key, block.self_attn.k_proj, head // group)
        checks = {("embed", "embed"): rotated(read(embed(query), query, block.self_attn.q_proj, head), k_embed)}
        for l, h in [(0, 3), (1, 5), (2, 8)]:
            q = read(head_out(l, h, query), query, block.self_attn.q_proj, head)
            checks[(f"L{l}H{h}", "embed")] = rotated(q, k_embed)
    table = np.array(j["table"])
    for (a, b), want in checks.items():
        assert table[names.index(a), names.index(b)] == pytest.approx(want, abs=1e-4), (a, b)
    assert max(abs(v) for v in checks.values()) > 0.01       # not vacuous


# ---- the NumPy reference on every block kind -----------------------------------------------------------------------
def _random(kind: str) -> Transformer:
    """Wide random weights (peaked attention), random biases and norm weights: nothing cancels by accident."""
    common = dict(vocab_size=500, max_positions=64, d_model=64, n_heads=4, n_layers=3, d_ff=96)
    cfg = {"bert": TransformerConfig(**common, type_vocab_size=2, embed_norm=True),
           "gpt2": TransformerConfig(**common, norm_first=True, causal=True, final_norm=True, mlp="gelu_tanh"),
           "llama": TransformerConfig(**common, norm_first=True, causal=True, final_norm=True, norm="rms",
                                      position="rope", mlp="swiglu", attention="gqa", n_kv_heads=2, qkv_bias=True,
                                      bias=False, lm_head=True)}[kind]
    model, rng = Transformer(cfg, seed=7), np.random.default_rng(7)
    for block in model.blocks:
        for name, value in block.attn.params.items():
            value[:] = rng.normal(0, 0.3, value.shape) if name.endswith("bias") else value * (12 if kind == "llama" else 8)
        for norm in (block.ln1, block.ln2):
            norm.weight[:] = rng.normal(1, 0.3, norm.weight.shape)
            if isinstance(norm, LayerNorm):
                norm.bias[:] = rng.normal(0, 0.3, norm.bias.shape)
    return model


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_qk_equals_the_numpy_reference_scores(kind):
    model = _random(kind)
    cfg, rng = model.cfg, np.random.default_rng(1)
    T = 12
    ids, types = rng.integers(0, cfg.vocab_size, T), rng.integers(0, 2, T)
    mask = (causal_mask(T, T) if cfg.causal else np.zeros((T, T), np.float32))[None, None]
    if kind == "bert":                                   # the reference runs without segments: compare without them
        types[:] = 0
    out = forward(model, ids[None], mask)
    residual = np.stack([out.cache[("residual", l)][0] for l in range(cfg.n_layers)])
    z = np.stack([out.cache[("head_output", l)][0] for l in range(cfg.n_layers)])
    for layer in range(cfg.n_layers):               # peaked attention: the parity means something
        assert out.cache[("pattern", layer)][0].max(axis=-1).mean() > 0.5
    for layer in range(cfg.n_layers):
        parts = stream_parts(model, ids, types, residual, z, layer, [3, T - 1])
        np.testing.assert_allclose(parts.sum(axis=0), residual[layer][[3, T - 1]], rtol=1e-5, atol=1e-5)
        for head in range(cfg.n_heads):
            for query, key in [(T - 1, 2), (5, 5), (4, 9)]:
                a = qk_attribution(model, ids, types, residual, z, layer, head, query, key)
                q, k = out.cache[("query", layer)][0, head, query], out.cache[("key", layer)][0, head, key]
                want = q.astype(np.float64) @ k / np.sqrt(cfg.d_head)
                # the cached q and k are float32: their dot product is exact to ~1e-7 of the sum of its terms'
                # sizes, which cancel (a BERT score of -1.59 is a sum of terms of total size 116: 2.1e-5 apart on
                # an AMD EPYC machine, 1.8e-7 of 116); so the bound scales with that sum, never below 1e-5
                conditioning = np.abs(q.astype(np.float64) * k).sum() / np.sqrt(cfg.d_head)
                assert a.score == pytest.approx(want, rel=1e-5, abs=max(1e-5, 1e-6 * conditioning))
                assert len(a.components) == a.table.shape[0]


# ---- the induction model: K-composition, in numbers ----------------------------------------------------------------
def test_induction_head_reads_the_previous_token_head_on_the_key_side(client):
    j = _qk(client, model="induction", text=INDUCTION_TEXT, layer=1, head=0, query=11, key=3)
    assert (j["tokens"][11], j["tokens"][3]) == ("potter", "met") and j["probability"] > 0.99
    names = [c["name"] for c in j["components"]]
    assert names[int(np.argmax(j["key_sums"]))] == "L0H0"
    assert (names[j["top"][0]["query"]], names[j["top"][0]["key"]]) == ("embed", "L0H0")   # my token x what L0H0 wrote
    c = client.post("/api/circuits", json={"model": "induction"}).json()
    k, q, v = (c[f"composition_{m}"][0][1] for m in "kqv")
    assert k > 10 * q and k > 10 * v, (q, k, v)
    assert c["composition_k"][1][0] == 0                   # a reader in an earlier layer: no composition


# ---- the lens ------------------------------------------------------------------------------------------------------
def test_head_lens_matches_the_teaching_models_construction(client):
    """tiny-gpt's layer-0 heads write into slots the tied unembedding does not read (no OV copying), and it predicts no
    next token, so it has no lens (issue 51). The induction head writes the attended token's code: at the second
    "potter" it promotes "met"."""
    assert client.post("/api/circuits", json={"model": "tiny-gpt"}).json()["ov_copying"][0] == [None] * 4
    j = client.post("/api/lens", json={"model": "induction", "text": INDUCTION_TEXT, "head_lens": [1, 0]}).json()
    hl = j["head_lens"]
    assert hl["promoted_tokens"][11][0] == "met" and hl["promoted_logits"][11][0] > 10
    assert j["top_tokens"][-1][11][0] == "met" and j["top_tokens"][1][11][0] == "potter"   # before the head: itself
    ov = client.post("/api/circuits", json={"model": "induction"}).json()["ov_copying"]
    assert ov[1][0] == pytest.approx(1.0, abs=1e-6)         # the induction head copies exactly


def test_logit_lens_last_row_is_the_models_prediction_and_head_lens_is_direct_attribution(client):
    text = IOI_CLEAN
    j = client.post("/api/lens", json={"model": "smollm2", "text": text, "head_lens": [17, 4], "top": 5}).json()
    T = len(j["tokens"])
    assert j["rows"] == ["embed"] + [f"L{l}" for l in range(30)] and len(j["hooks"]) == 31
    assert np.shape(j["top_probs"]) == (31, T, 5) and j["next_probs"][5][-1] == 0
    a = client.post("/api/attention", json={"model": "smollm2", "text": text, "include": ["predictions"]}).json()
    assert [t["id"] for t in a["next_tokens"][:5]] == j["top_ids"][-1][-1]
    np.testing.assert_allclose([t["prob"] for t in a["next_tokens"][:5]], j["top_probs"][-1][-1], atol=1e-5)
    np.testing.assert_allclose(np.log(np.maximum(j["next_probs"][-1][:-1], 1e-30)), a["token_logprobs"][1:],
                               atol=1e-4)
    hl = j["head_lens"]
    target = hl["promoted_tokens"][-1][0]
    d = client.post("/api/attention", json={"model": "smollm2", "text": text, "include": ["attribution"],
                                            "target": target}).json()["attribution"]
    assert d["heads"][17][4] == pytest.approx(hl["promoted_logits"][-1][0], abs=1e-4)


# ---- the circuits against dense matrices ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_circuits_equal_dense_computation(kind):
    """Composition from D x D matrices (TransformerLens' composition_scores), OV copying from the V x V circuit."""
    model = _random(kind)
    for block in model.blocks:                 # the circuits are of the weights only: any values will do
        block.ln1.weight[:] = np.random.default_rng(3).normal(1, 0.3, model.cfg.d_model)
    cfg, w = model.cfg, head_weights(model)
    c, copying = composition(model, w), ov_copying(model, w)
    n = cfg.n_layers * cfg.n_heads
    OV = [w.W_V[i] @ w.W_O[i] for i in range(n)]
    QK = [w.W_Q[i] @ w.W_K[i].T for i in range(n)]
    f = np.linalg.norm
    for a in range(n):
        for b in range(n):
            if b // cfg.n_heads <= a // cfg.n_heads:
                assert c.q[a, b] == c.k[a, b] == c.v[a, b] == 0
                continue
            assert c.q[a, b] == pytest.approx(f(OV[a] @ QK[b]) / (f(OV[a]) * f(QK[b])), abs=1e-6)
            assert c.k[a, b] == pytest.approx(f(OV[a] @ QK[b].T) / (f(OV[a]) * f(QK[b])), abs=1e-6)
            assert c.v[a, b] == pytest.approx(f(OV[a] @ OV[b]) / (f(OV[a]) * f(OV[b])), abs=1e-6)
    W_U = model.unembedding.astype(np.float64) * model.ln_f.weight
    if cfg.norm == "layer":
        W_U = W_U - W_U.mean(axis=1, keepdims=True)
    for i in range(n):
        eig = np.linalg.eigvals(model.wte.astype(np.float64) @ OV[i] @ W_U.T)   # [V, V]
        assert copying.flat[i] == pytest.approx(eig.sum().real / np.abs(eig).sum(), abs=1e-6)
    # the folded weights are the model's: a pre-norm head reads N(x) = C diag(g) x (the scale aside)
    attn, g = model.blocks[1].attn, model.blocks[1].ln1.weight.astype(np.float64)
    x = np.random.default_rng(0).normal(size=cfg.d_model)
    xn = (x - x.mean() if cfg.norm == "layer" else x) * g
    Wq = attn.projection("q_proj")[0][:cfg.d_head].astype(np.float64)
    np.testing.assert_allclose(x @ w.W_Q[cfg.n_heads], xn @ Wq.T, rtol=1e-10, atol=1e-10)


# ---- refusals ------------------------------------------------------------------------------------------------------
def test_bad_qk_lens_and_circuits_requests_get_clear_4xx(client):
    ok = {"model": "induction", "text": "a b c a b", "layer": 1, "head": 0, "query": 4, "key": 2}
    assert client.post("/api/qk", json=ok).status_code == 200
    long = " ".join(["word"] * 80)
    cases = [("/api/qk", ok | {"query": 9}, 422, "query 9 is out of range: this text has 6 tokens"),
             ("/api/qk", ok | {"key": 6}, 422, "key 6 is out of range"),
             ("/api/qk", ok | {"layer": 2}, 422, "layers [2] out of range"),
             ("/api/qk", ok | {"head": 1}, 422, "heads [1] out of range"),
             ("/api/qk", ok | {"text": long}, 422, "ATTNSCOPE_MAX_PATCHING_TOKENS"),
             ("/api/qk", ok | {"model": "nope"}, 404, "unknown model"),
             ("/api/qk", ok | {"top": 0}, 422, "greater than or equal to 1"),
             ("/api/lens", {"model": "minilm", "text": "a b"}, 422, "has no unembedding"),
             ("/api/lens", {"model": "tiny-gpt", "text": "a b", "head_lens": [0, 0]}, 422, "predicts no next token"),
             ("/api/lens", {"model": "induction", "text": "a b", "head_lens": [1]}, 422, "at least 2 items"),
             ("/api/lens", {"model": "induction", "text": "a b", "head_lens": [1, 3]}, 422, "heads [3] out of range"),
             ("/api/circuits", {"model": "nope"}, 404, "unknown model"),
             ("/api/circuits", {"model": "induction", "text": "a"}, 422, "Extra inputs are not permitted")]
    for path, body, status, says in cases:
        r = client.post(path, json=body)
        assert r.status_code == status and says in r.text, (path, body, r.status_code, r.text)
    assert client.get("/healthz").status_code == 200


def test_circuits_start_with_the_server_and_are_kept_in_the_cache(client):
    """Issue 37: a first /api/circuits on SmolLM2 computed its weight products in a run slot (seconds, and longer
    behind other runs). Each served model's are started in the background when the server starts, and kept beside the
    graphs, keyed by the weights and the code: a later server reads the same numbers."""
    from attnscope.analyses.circuits import circuits_file as _circuits_file

    svc = client.app.state.service
    kept = svc.context.kept["circuits"].futures
    assert set(kept) == {"smollm2", "minilm", "tiny-gpt", "induction", "gpt2"}   # before any request
    first = client.post("/api/circuits", json={"model": "induction"}).json()
    rt = svc.runtimes["induction"]
    path = _circuits_file(rt)
    assert kept["induction"].done() and path.is_file()
    stamp = path.stat().st_mtime_ns
    with TestClient(create_app(Settings(models=["induction"], cache=CACHE))) as again:
        second = again.post("/api/circuits", json={"model": "induction"}).json()
    assert {k: second[k] for k in ("ov_copying", "composition_q", "composition_k", "composition_v")} == \
        {k: first[k] for k in ("ov_copying", "composition_q", "composition_k", "composition_v")}
    assert path.stat().st_mtime_ns == stamp                      # read, not written again
