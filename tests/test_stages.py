"""The teaching stages of every head, from x to its contribution: NumPy and ONNX agree on the outputs the steps
view added (x, v, ctx), each is what it says, and /api/stages serves them with the head's share of W_o."""
from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.analyses.stages import StagesResponse
from attnscope.app.settings import Settings
from attnscope.model import masks as M
from attnscope.graphs.stacked import build_graph
from attnscope.model.transformer import LM_OUTPUTS, STAGES, Transformer, TransformerConfig
from attnscope.runtime.sessions import Session
from attnscope.runtime.tensors import Weights
from .conftest import DEVICE, PROVIDERS

# SmolLM2's layout (GQA, RoPE): the small Llama below. MiniLM's first stages run takes ~10 s (graph and weights)
MODEL_IDS = ["tiny-gpt", "induction", pytest.param("minilm", marks=pytest.mark.slow)]
TEXTS = ["The cat sat on the mat.", "A longer sentence, so that the other texts of this batch are padded.", "hi"]
ATOL = 1e-5


def close_scaled(actual, expected, rtol, name):
    """|a - e| <= rtol * max(1, max|e|): fp32 agreement relative to the array's own size."""
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale, err_msg=name)


def attention_output(block, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Attn(x) [T, D] by the block's own attention module, for one text."""
    return block.attn(x[None], attn_mask=mask[None, None])[0][0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_new_stages_agree_between_engines_and_are_what_they_say(runtimes, model_id, causal):
    rt = runtimes[model_id]
    ref = rt.run(TEXTS, causal=causal, engine="numpy", stages=True)
    fast = rt.run(TEXTS, causal=causal, engine="onnx", stages=True)
    L, H, dh, D = rt.cfg.n_layers, rt.cfg.n_heads, rt.cfg.d_head, rt.cfg.d_model
    for a, b in zip(ref, fast):
        T = len(a.tokens)
        assert set(a.stages) == set(b.stages) == set(STAGES)
        assert a.stages["x"].shape == (L, T, D)
        assert a.stages["v"].shape == a.stages["ctx"].shape == (L, H, T, dh)
        for name in ("x", "v", "ctx"):   # rtol: the induction model's vectors reach ~100, where fp32 agrees to ~1e-6
            close_scaled(b.stages[name], a.stages[name], 2e-6 if model_id == "induction" else ATOL, name)
        # ctx is the probabilities times v; x is what the projections read: q = x W_q^T + b_q for each head
        np.testing.assert_allclose(a.stages["ctx"], a.attentions @ a.stages["v"], rtol=1e-5, atol=1e-6)
        for layer, block in enumerate(rt.model.blocks):
            x = a.stages["x"][layer]
            W, bias = block.attn._projection(0)
            q = (x @ W.T + bias).reshape(T, H, dh).transpose(1, 0, 2)
            close_scaled(q, a.stages["q"][layer], 1e-5, "q from x")
            # the heads' contributions plus the output bias are the attention output the block adds
            parts = sum(block.head_output(h, a.stages["ctx"][layer, h]) for h in range(H))
            out = parts + block.attn.params.get("out_proj.bias", 0.0)
            close_scaled(out, attention_output(block, x, a.mask), 1e-5, f"contributions of layer {layer}")


def tiny_llama(seed: int = 0) -> Transformer:
    """A small Llama-family model (RoPE, GQA with 3 heads per key/value head), weights wide enough to peak."""
    cfg = TransformerConfig(vocab_size=61, max_positions=32, d_model=36, n_heads=6, n_layers=2, d_ff=40,
                            norm_first=True, causal=True, final_norm=True, norm="rms", position="rope", mlp="swiglu",
                            attention="gqa", n_kv_heads=2, d_head=8, bias=False, qkv_bias=False, lm_head=True)
    model = Transformer(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    model.wte = rng.standard_normal(model.wte.shape).astype(np.float32)
    for block in model.blocks:
        for name, w in block.attn.params.items():
            block.attn.params[name] = (rng.standard_normal(w.shape) * (0.6 if name[0] in "qk" else 0.2)).astype(np.float32)
    return model


def test_gqa_stages_agree_between_engines():
    model = tiny_llama()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    lengths = np.array([20, 9])
    B, T = len(lengths), int(lengths.max())
    ids = np.random.default_rng(5).integers(0, model.cfg.vocab_size, (B, T))
    keep = np.arange(T)[None] < lengths[:, None]
    mask = np.ascontiguousarray(np.broadcast_to(M.combine(M.padding_mask(keep), M.causal_mask(T)[None, None]),
                                                (B, 1, T, T)))
    ref = model(ids, None, mask, stages=True, lengths=lengths)
    peaked = ref.attentions[:, 0, :, :20].max(-1).mean()
    assert peaked >= 0.5, peaked
    sess = Session(build_graph(model, stages=True).SerializeToString(), PROVIDERS, 2, Weights(model, DEVICE))
    names = ["hidden", "attentions", *LM_OUTPUTS, *STAGES]
    feeds = {"input_ids": ids, "attention_mask": mask, "head_mask": np.ones((B, L, H), np.float32),
             "head_mean": np.zeros((B, L, H), np.float32), "lengths": lengths}
    outs = dict(zip(names, sess.run(names, feeds)))
    for b, n in enumerate(lengths):
        close_scaled(outs["x"][:, b, :n], ref.stages["x"][:, b, :n], ATOL, "x")
        for name in ("v", "ctx"):
            close_scaled(outs[name][:, b, :, :n], ref.stages[name][:, b, :, :n], ATOL, name)
        # query heads of one group read the same v
        v = ref.stages["v"][:, b]
        assert np.array_equal(v[:, 0], v[:, 2]) and not np.array_equal(v[:, 2], v[:, 3])
    for layer, block in enumerate(model.blocks):
        x = ref.stages["x"][layer, 0, :20]
        parts = sum(block.head_output(h, ref.stages["ctx"][layer, 0, h, :20]) for h in range(H))
        close_scaled(parts, attention_output(block, x, mask[0, 0, :20, :20]), 1e-5, f"contributions of layer {layer}")


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(models=["tiny-gpt", "induction"], default_model="tiny-gpt"))) as c:
        yield c


@pytest.mark.parametrize("limit", [None, 4])
def test_api_stages_serve_every_step(client, runtimes, limit):
    text = "The cat sat on the mat, and the cat sat."
    body = {"model": "tiny-gpt", "text": text, "layer": 1, "head": 0, "causal": False} | ({"limit": limit} if limit else {})
    j = client.post("/api/stages", json=body).json()
    rt = runtimes["tiny-gpt"]
    [ref] = rt.run([text], causal=False, stages=True)
    n = limit or len(ref.tokens)
    np.testing.assert_allclose(j["x"], ref.stages["x"][1, :n], atol=1e-6)
    for name in ("q", "k", "v", "ctx"):
        np.testing.assert_allclose(j[name], ref.stages[name][1, 0, :n], atol=1e-6, err_msg=name)
    assert np.array(j["x"]).shape == (n, rt.cfg.d_model) and np.array(j["v"]).shape == (n, rt.cfg.d_head)
    # the contribution: ctx through the head's columns of W_o
    W = rt.model.blocks[1].attn.params["out_proj.weight"][:, :rt.cfg.d_head]
    np.testing.assert_allclose(j["contribution"], np.array(j["ctx"]) @ W.T, rtol=1e-5, atol=1e-6)
    # the softmax readout: probs = exp(masked - row_max) / row_sum, also when `limit` cuts the rows
    masked = np.array(j["masked"], np.float64)
    np.testing.assert_allclose(np.exp(masked - np.array(j["row_max"])[:, None]) / np.array(j["row_sum"])[:, None],
                               j["probs"], rtol=1e-5, atol=1e-12)   # onnxruntime's float32 Softmax: ~1e-6 off at 1
    if limit:   # a non-causal row cut by `limit` does not sum to 1; the whole row's sum is in row_sum
        assert np.array(j["probs"]).sum(axis=1).min() < 0.99
    StagesResponse.model_validate(j)   # the answer is what the schema says
    schema = client.get("/openapi.json").json()["components"]["schemas"]["StagesResponse"]["properties"]
    for name in ("x", "v", "ctx", "contribution", "row_max", "row_sum"):
        assert schema[name]["description"]


def test_api_stages_of_the_induction_model(client):
    j = client.post("/api/stages", json={"model": "induction", "text": "red blue green red", "layer": 1,
                                         "head": 0}).json()
    T = len(j["tokens"])
    assert np.array(j["x"]).shape == (T, 324) and np.array(j["ctx"]).shape == (T, 324)
    assert np.array(j["contribution"]).shape == (T, 324)
    # the last "red" looks at "blue", the token after the earlier "red"
    assert np.argmax(j["probs"][-1]) == j["tokens"].index("blue")
