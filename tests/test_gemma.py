"""Gemma 2 and Gemma 3 from Hugging Face folders: small random checkpoints made with transformers' own config classes
(`save_pretrained`, a Gemma tokenizer), served by path through the app, against transformers eager.

What each checkpoint exercises: Gemma 2's attention and final logit soft-capping (caps small enough that they change
the values: checked), query_pre_attn_scalar != head_dim, scaled embeddings, four norms per block, GeGLU, alternating
local (sliding-window) and global layers; Gemma 3's QK-norm and the local layers' own RoPE base. The text is longer
than the window (WINDOW = 6 tokens, the text 24), so the band matters (checked: exact zeros past it on local layers,
weight there on global ones). Weights are drawn wide (test_checkpoints.widen): attention is peaked (asserted).
Downstream: the NumPy reference and the ONNX graphs (stacked, cut, layer by layer, the key/value-cache step) agree,
head ablation equals transformers with hooks, greedy generation past the window equals transformers' generate, and
the analyses whose math these models change refuse with a message naming the feature.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from attnscope.app.errors import StartupError
from attnscope.app.main import create_app
from attnscope.app.service import AttentionService
from attnscope.app.settings import Settings
from attnscope.model.interventions import forward as reference_forward
from attnscope.runtime.generation import Generator, Sampling
from attnscope.runtime.interventions import Interventions
from attnscope.runtime.layerwise import Layerwise, Want

from .conftest import CACHE, ablation_hooks, serving
from .test_checkpoints import TEXT, TEXTS, peaked, trained_bpe, widen

torch.set_num_threads(2)
ATOL = 1e-4
WINDOW = 6                       # the local layers' sliding window: TEXT is 24 tokens
ATTN_CAP, FINAL_CAP = 8.0, 10.0  # Gemma 2's soft-caps, small enough to matter (Gemma 2 itself: 50 and 30)
FAMILIES = ("gemma2", "gemma3_text")


def save_gemma_tokenizer(folder: Path) -> int:
    """A sentencepiece-style BPE (byte fallback) trained on the test corpus, saved through GemmaTokenizer."""
    vocab, merges = trained_bpe(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"], byte_level=False)
    tok = transformers.GemmaTokenizer(vocab, merges)
    tok.save_pretrained(folder)
    return len(tok)


def hf_config(family: str, vocab: int):
    """2 layers (local, global), d_model 64, 4 query heads on 2 key/value heads of head_dim 32 (!= 64 / 4), scores
    scaled by query_pre_attn_scalar 24 (not head_dim)."""
    T = transformers
    small = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=96, max_position_embeddings=256, rms_norm_eps=1e-6,
                 sliding_window=WINDOW, query_pre_attn_scalar=24, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if family == "gemma2":   # layer_types left to the config: Gemma 2 alternates, local first
        return T.Gemma2Config(**small, attn_logit_softcapping=ATTN_CAP, final_logit_softcapping=FINAL_CAP,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0}), T.Gemma2ForCausalLM
    return T.Gemma3TextConfig(**small, layer_types=["sliding_attention", "full_attention"],
                              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}
                              ), T.Gemma3ForCausalLM


def build(family: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    config, cls = hf_config(family, save_gemma_tokenizer(folder))
    torch.manual_seed(0)
    model = cls(config)
    widen(model, seed=11)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma")
    return {family: build(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def client(folders):
    with serving(folders) as c:
        yield c


@pytest.fixture(scope="module")
def hf(folders):
    return {f: (transformers.AutoTokenizer.from_pretrained(folder), transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32).eval()) for f, folder in folders.items()}


def runtime(client, family):
    return client.app.state.service.runtimes[family]


def hf_run(model, ids):
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return torch.stack(out.attentions)[:, 0].numpy(), torch.log_softmax(out.logits[0].double(), -1)


# ---- parity -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_served_checkpoint_matches_transformers(family, client, hf):
    tok, model = hf[family]
    rt = runtime(client, family)
    for text in TEXTS:
        assert rt.encode(text).ids == tok(text)["input_ids"], (family, text)
    r = client.post("/api/attention", json={"model": family, "text": TEXT})
    assert r.status_code == 200, r.text
    r = r.json()
    ids = tok(TEXT)["input_ids"]
    assert r["token_ids"] == ids and len(ids) > 3 * WINDOW
    ref, logp = hf_run(model, ids)
    ours = np.asarray(r["attention"], np.float32)
    assert peaked(ours) >= 0.5, peaked(ours)
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)

    res = rt(TEXT)
    top = int(logp[-1].argmax())
    assert res.next_tokens[0].id == top
    assert abs(res.next_tokens[0].prob - float(logp[-1, top].exp())) <= ATOL
    want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    np.testing.assert_allclose(res.token_logprobs[1:], want, atol=1e-4 * max(1.0, np.abs(want).max()), rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_local_layers_see_only_their_window(family, client):
    """Layer 0 is local: every key WINDOW or more tokens back gets exactly 0. Layer 1 is global: it puts weight
    there. The API says which layers are local and how wide their window is."""
    rt = runtime(client, family)
    a = rt(TEXT).attentions                                   # [L, H, T, T]
    T = a.shape[-1]
    far = np.subtract.outer(np.arange(T), np.arange(T)) >= WINDOW
    assert (a[0][:, far] == 0).all()
    assert a[1][:, far].sum(-1).mean() > 0.1
    info = {m["id"]: m for m in client.get("/api/models").json()}[family]
    assert info["local_layers"] == [0] and info["sliding_window"] == WINDOW
    assert f"1 of its 2 layers are local: each query sees only the last {WINDOW} keys" in info["description"]


def test_soft_capping_changes_the_values(client):
    """Gemma 2's caps are not vacuous here: without them the probabilities and log-probs move, and logits go past
    the cap; with it they stay within [-cap, cap]."""
    rt = runtime(client, "gemma2")
    res = rt(TEXT, engine="numpy")
    assert np.abs(res.next_token_logits).max() <= FINAL_CAP
    blocks = rt.model.blocks
    try:
        for b in blocks:
            b.attn.softcap = 0.0
        uncapped = rt(TEXT, engine="numpy")
    finally:
        for b in blocks:
            b.attn.softcap = ATTN_CAP
    assert np.abs(uncapped.attentions - res.attentions).max() > 0.05
    cfg = rt.model.cfg
    object.__setattr__(cfg, "final_softcap", 0.0)
    try:
        plain = rt(TEXT, engine="numpy")
    finally:
        object.__setattr__(cfg, "final_softcap", FINAL_CAP)
    assert np.abs(np.array(plain.token_logprobs[1:]) - np.array(res.token_logprobs[1:])).max() > 0.05
    assert np.abs(plain.next_token_logits).max() > FINAL_CAP


# ---- every path agrees ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_numpy_onnx_cut_and_layerwise_agree(family, client):
    rt = runtime(client, family)
    onnx = rt(TEXT, stages=True)
    ref = rt(TEXT, engine="numpy", stages=True)
    np.testing.assert_allclose(onnx.attentions, ref.attentions, atol=1e-5, rtol=0)
    for name in ("scaled", "masked", "q", "k", "ctx"):
        np.testing.assert_allclose(onnx.stages[name], ref.stages[name], atol=1e-4 * max(1, np.abs(ref.stages[name][
            np.isfinite(ref.stages[name]) & (ref.stages[name] > -1e30)]).max()), rtol=0)
    np.testing.assert_allclose(onnx.next_token_logits, ref.next_token_logits, atol=1e-4, rtol=0)
    assert rt.depth_of(Want((0,), ends=False)) == 1
    [cut] = rt.forward([rt.encode(TEXT)], want=Want((0,), ends=False))   # the graph cut after the (local) first block
    np.testing.assert_array_equal(cut.attentions[0], onnx.attentions[0])
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    for fused in (False, True):                  # three graphs a block, or one (a GPU's walk)
        lw = Layerwise(rt, graphs=rt.layerwise(), fused=fused).forward(
            rt.encode(TEXT), want=Want(layers=tuple(range(L)), heads=tuple(range(H)), attention=True))
        for layer in range(L):
            np.testing.assert_allclose(lw.asked.attention[layer][:, 0] if lw.asked.attention[layer].ndim == 4
                                       else lw.asked.attention[layer], onnx.attentions[layer], atol=1e-5, rtol=0)
        np.testing.assert_allclose(lw.next_token_logits, onnx.next_token_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_interventions_trace_equals_the_reference(family, client):
    """The layer-by-layer intervention graphs (the local band added per layer) and model/interventions.forward (the
    NumPy sites) give the served attention and logits."""
    rt = runtime(client, family)
    enc = rt.encode(TEXT)
    res = rt(TEXT)
    trace = Interventions(rt).trace(enc, pattern=True)
    np.testing.assert_allclose(trace.sites["pattern"], res.attentions, atol=1e-5, rtol=0)
    mask = rt.build_mask([len(enc.ids)], True)
    ref = reference_forward(rt.model, np.array([enc.ids]), mask)
    np.testing.assert_allclose(ref.cache[("pattern", 0)][0], res.attentions[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(ref.logits[0], res.next_token_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_head_ablation_matches_transformers_hooks(family, client, hf):
    tok, model = hf[family]
    rt = runtime(client, family)
    heads = [(0, 1), (1, 3)]
    keep = np.ones((1, rt.cfg.n_layers, rt.cfg.n_heads), np.float32)
    for layer, head in heads:
        keep[0, layer, head] = 0
    res = rt(TEXT, head_mask=keep)
    with ablation_hooks(lambda l: model.model.layers[l].self_attn.o_proj, rt.cfg.d_head, heads, "zero"):
        ref, logp = hf_run(model, res.token_ids)
    np.testing.assert_allclose(res.attentions, ref, atol=ATOL, rtol=0)
    assert np.abs(res.attentions[1] - rt(TEXT).attentions[1]).max() > 1e-3    # the ablation did something


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_past_the_window_equals_transformers(family, client, hf):
    """The key/value-cache step (graphs/decoding.py: the band built from positions P..P+t-1) over 20 new tokens
    after an 8-token prompt: far past the window."""
    _, model = hf[family]
    rt = runtime(client, family)
    ids = np.random.default_rng(3).integers(5, rt.cfg.vocab_size, 8).tolist()
    for engine in ("onnx", "numpy"):
        gen = Generator(rt, ids, Sampling(greedy=True), 20, engine=engine)
        for _ in gen:
            pass
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20, min_new_tokens=20,
                                 pad_token_id=0)
        assert gen.new_ids == out[0, len(ids):].tolist(), engine


# ---- refusals -----------------------------------------------------------------------------------------------------
def refusal(entry: str) -> str:
    with pytest.raises(StartupError) as e:
        AttentionService(Settings(models=[entry], cache=CACHE)).load()
    line = str(e.value)
    assert "\n" not in line
    return line


def edited(folder: Path, tmp_path: Path, **changes) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / f"{folder.name}-{len(list(tmp_path.iterdir()))}"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | changes))
    return copy


def test_unsupported_gemma_options_are_refused_by_name(folders, tmp_path):
    g3 = folders["gemma3_text"]
    line = refusal(f"m={edited(g3, tmp_path, use_bidirectional_attention=True)}")
    assert "use_bidirectional_attention is not supported" in line
    scaled = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
              "sliding_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4}}
    assert "RoPE scaling 'linear' on sliding_attention is not supported for Gemma 3" in refusal(
        f"m={edited(g3, tmp_path, rope_parameters=scaled)}")
    assert "hidden_activation 'silu' is not supported" in refusal(
        f"m={edited(folders['gemma2'], tmp_path, hidden_activation='silu')}")


def test_analyses_whose_math_changes_refuse_by_name(client):
    """QK attribution, the weight-space circuits, the head lens and direct logit attribution decompose a linear (or
    bilinear) computation: QK-norm, soft-capping and post-norms put a non-linearity in it. Each refuses (422, one
    line) and names what breaks it; the logit lens applies the final cap and stays exact."""
    qk = {"text": TEXT, "layer": 1, "head": 0, "query": 9, "key": 2}
    dla = {"text": TEXT, "include": ["attribution"], "target": "the"}
    expected = {   # (family, path) -> what is refused, and the features named
        ("gemma2", "/api/qk"): ("QK attribution", ["attention logit soft-capping", "post-norms"]),
        ("gemma3_text", "/api/qk"): ("QK attribution", ["QK-norm", "post-norms"]),
        ("gemma2", "/api/circuits"): ("weight-space circuits", ["post-norms"]),
        ("gemma3_text", "/api/circuits"): ("weight-space circuits", ["QK-norm", "post-norms"]),
        ("gemma2", "/api/lens"): ("the head lens", ["post-norms"]),
        ("gemma3_text", "/api/lens"): ("the head lens", ["post-norms"]),
        ("gemma2", "/api/attention"): ("direct logit attribution", ["post-norms", "final logit soft-capping"]),
        ("gemma3_text", "/api/attention"): ("direct logit attribution", ["post-norms"])}
    bodies = {"/api/qk": qk, "/api/circuits": {}, "/api/lens": {"text": TEXT, "head_lens": [1, 0]},
              "/api/attention": dla}
    for (family, path), (what, words) in expected.items():
        r = client.post(path, json={"model": family} | bodies[path])
        assert r.status_code == 422, (family, path, r.text)
        line = r.json()["detail"]
        assert line.startswith(what) and f"not exact for model {family!r}, which has" in line and "\n" not in line, line
        assert all(w in line for w in words), line
    rt = runtime(client, "gemma2")
    r = client.post("/api/lens", json={"model": "gemma2", "text": TEXT, "top": 1})
    assert r.status_code == 200, r.text
    res = rt(TEXT)
    assert r.json()["top_ids"][-1][-1][0] == res.next_tokens[0].id
    assert abs(r.json()["top_probs"][-1][-1][0] - res.next_tokens[0].prob) < 1e-4


def test_a_gemma3_folder_serves_its_text_model(folders, client, tmp_path):
    """model_type gemma3 (Gemma3ForConditionalGeneration): config.json keeps the text model's config in text_config
    and the weights under model.language_model.*; a vision tower's tensors are left alone. Served by path, it is the
    gemma3_text checkpoint it was made from: the same attention, bit for bit."""
    from safetensors.numpy import load_file, save_file

    src = folders["gemma3_text"]
    folder = Path(shutil.copytree(src, tmp_path / "gemma3", ignore=shutil.ignore_patterns("*.safetensors*")))
    text = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text,
                                                    "architectures": ["Gemma3ForConditionalGeneration"]}))
    weights = {"model.language_model." + k.removeprefix("model."): v for k, v in
               load_file(src / "model.safetensors").items()}
    weights["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = np.ones((4, 3), np.float32)
    save_file(weights, folder / "model.safetensors")
    settings = Settings(models=[f"g3={folder}"], cache=CACHE)
    with TestClient(create_app(settings)) as c:
        info = c.get("/api/models").json()[0]
        assert (info["architecture"], info["local_layers"], info["sliding_window"]) == ("gemma3", [0], WINDOW)
        got = c.post("/api/attention", json={"model": "g3", "text": TEXT}).json()["attention"]
    want = client.post("/api/attention", json={"model": "gemma3_text", "text": TEXT}).json()["attention"]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_gemma3_global_rope_scaling_matches_transformers(folders, tmp_path):
    """Gemma 3 (4B and up) scales its global layers' RoPE (linear, factor 8) and keeps plain RoPE on its local ones:
    main's rope_scaling serves the global table, the local layers keep their own unscaled base."""
    scaled = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
              "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}
    folder = edited(folders["gemma3_text"], tmp_path, rope_parameters=scaled)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    service = AttentionService(Settings(models=[f"g3s={folder}"], cache=CACHE))
    service.load()
    rt = service.runtimes["g3s"]
    assert rt.cfg.rope_scaling is not None and rt.cfg.rope_scaling.kind == "linear" and rt.cfg.rope_local_theta == 50.0
    ids = tok(TEXT)["input_ids"]
    ref, logp = hf_run(model, ids)
    for engine in ("onnx", "numpy"):
        res = rt(TEXT, engine=engine)
        assert np.abs(np.asarray(res.attentions) - ref).max() < ATOL, engine
        want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
        np.testing.assert_allclose(res.token_logprobs[1:], want, atol=1e-4 * max(1.0, np.abs(want).max()), rtol=0)
    plain, _ = hf_run(transformers.AutoModelForCausalLM.from_pretrained(
        folders["gemma3_text"], attn_implementation="eager", dtype=torch.float32).eval(), ids)
    assert np.abs(plain[1] - ref[1]).max() > 1e-3 and np.abs(plain[0] - ref[0]).max() < ATOL   # global layer moved
