"""Qwen3 (QK-norm per head), OLMo 2 (norms after the sublayers, QK-norm over the whole projections) and GPT-NeoX /
Pythia (parallel residual, partial rotary, fused per-head query_key_value), served by path and checked against
transformers eager reading the same folder.

Small random checkpoints are made with transformers' own config classes and `save_pretrained`, with a trained
byte-level BPE tokenizer, weights drawn wide enough that attention is peaked (asserted). With QK-norm the scores'
size is set by the norms' weights, so those are drawn wide too. Checked: attention and next-token probabilities
(1e-4), the teaching stages' q and k (after QK-norm and RoPE, as transformers computes them), a head ablated through
the intervention graphs against transformers with a hook, generation with the key/value cache, a cut graph, and
the analyses whose decomposition these features make inexact, refused in one line.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from attnscope.model.decoding import KVCache
from attnscope.model.interventions import Edit
from attnscope.runtime.generation import decode
from attnscope.runtime.interventions import Interventions
from attnscope.runtime.layerwise import Layerwise, Want
from tests.conftest import serving
from tests.test_checkpoints import TEXT, copy_of, edit_config, peaked, refusal, trained_bpe, widen

torch.set_num_threads(2)
ATOL = 1e-4
T = transformers
# name -> (config class, model class, tokenizer class, config); gpt_neox_seq: use_parallel_residual false
FAMILIES = ("qwen3", "olmo2", "gpt_neox", "gpt_neox_seq")
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=128)


def hf_config(family: str, vocab: int):
    if family == "qwen3":    # grouped (2 kv heads), head_dim 32 != 64 / 4, tied
        return T.Qwen3Config(vocab_size=vocab, **SMALL, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                             rope_theta=500.0, tie_word_embeddings=True, bos_token_id=None, eos_token_id=0), \
            T.Qwen3ForCausalLM
    if family == "olmo2":    # grouped: k_norm spans the 2 kv heads' 32 features; untied
        return T.Olmo2Config(vocab_size=vocab, **SMALL, num_key_value_heads=2, rope_theta=500.0,
                             tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=0), \
            T.Olmo2ForCausalLM
    return T.GPTNeoXConfig(vocab_size=vocab, **SMALL, rotary_pct=0.5, rotary_emb_base=500.0,   # 8 of 16 features turn
                           use_parallel_residual=family == "gpt_neox", bos_token_id=0, eos_token_id=0), \
        T.GPTNeoXForCausalLM


def build(family: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    if family.startswith("gpt_neox"):
        tok = T.GPTNeoXTokenizer(*trained_bpe(["<|endoftext|>", "<|padding|>"]))
    elif family == "qwen3":
        tok = T.Qwen2Tokenizer(*trained_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
    else:
        tok = T.GPT2Tokenizer(*trained_bpe(["<|endoftext|>"]))
    tok.save_pretrained(folder)
    config, cls = hf_config(family, len(tok))
    torch.manual_seed(0)
    model = cls(config)
    widen(model, seed=10 + FAMILIES.index(family))
    with torch.no_grad():   # QK-norm fixes the queries' and keys' size: only the norms' weights can sharpen attention
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.mul_(2.5)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoder-families")
    return {family: build(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def client(folders):
    with serving(folders) as c:
        yield c


@pytest.fixture(scope="module")
def references(folders):
    """transformers' tokenizer and eager model for each folder, loaded once."""
    return {f: (T.AutoTokenizer.from_pretrained(folders[f]),
                T.AutoModelForCausalLM.from_pretrained(folders[f], attn_implementation="eager",
                                                       dtype=torch.float32).eval()) for f in FAMILIES}


def runtime(client, family):
    return client.app.state.service.runtimes[family]


# ---- parity ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_served_checkpoint_matches_transformers(family, client, references):
    tok, model = references[family]
    r = client.post("/api/attention", json={"model": family, "text": TEXT})
    assert r.status_code == 200, r.text
    r = r.json()
    ids = tok(TEXT)["input_ids"]
    assert r["token_ids"] == ids
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    ref = torch.stack(out.attentions)[:, 0].numpy()                       # [L, H, T, T]
    ours = np.asarray(r["attention"], np.float32)
    assert ours.shape == ref.shape
    assert peaked(ours) >= 0.5, peaked(ours)
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)

    res = runtime(client, family)(TEXT)
    logp = torch.log_softmax(out.logits[0].double(), -1)
    top = int(logp[-1].argmax())
    assert res.next_tokens[0].id == top
    assert abs(res.next_tokens[0].prob - float(logp[-1, top].exp())) <= ATOL
    want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    np.testing.assert_allclose(res.token_logprobs[1:], want, atol=1e-4 * max(1.0, np.abs(want).max()), rtol=0)
    numpy = runtime(client, family)(TEXT, engine="numpy")                  # the NumPy reference, which ONNX mirrors
    np.testing.assert_allclose(numpy.attentions, res.attentions, atol=1e-5, rtol=0)


def test_models_say_what_they_are(client):
    models = {m["id"]: m for m in client.get("/api/models").json()}
    assert {f: models[f]["architecture"] for f in FAMILIES} == \
        {"qwen3": "qwen3", "olmo2": "olmo2", "gpt_neox": "gpt_neox", "gpt_neox_seq": "gpt_neox"}
    assert models["qwen3"]["description"].startswith("Qwen3 decoder") and "OLMo 2" in models["olmo2"]["description"]
    cfg = {f: runtime(client, f).cfg for f in FAMILIES}
    assert (cfg["qwen3"].qk_norm, cfg["olmo2"].qk_norm, cfg["gpt_neox"].qk_norm) == ("head", "full", None)
    assert cfg["olmo2"].output_norms and not cfg["olmo2"].norm_first
    assert cfg["gpt_neox"].parallel_residual and not cfg["gpt_neox_seq"].parallel_residual
    assert (cfg["gpt_neox"].rotary_dim, cfg["gpt_neox"].d_head, cfg["gpt_neox"].rope_theta) == (8, 16, 500.0)


def _hf_qk(family: str, model, ids: list[int], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' queries and keys of `layer` [H|Hkv, T, dh] after QK-norm and RoPE, from its own modules."""
    got = {}
    if family.startswith("gpt_neox"):
        attn = model.gpt_neox.layers[layer].attention
        hook = attn.query_key_value.register_forward_hook(lambda m, i, o: got.setdefault("qkv", o))
        mod = __import__("transformers.models.gpt_neox.modeling_gpt_neox", fromlist=["x"])
        rotary = model.gpt_neox.rotary_emb
    else:
        attn = model.model.layers[layer].self_attn
        hooks = [attn.q_norm.register_forward_hook(lambda m, i, o: got.setdefault("q", o)),
                 attn.k_norm.register_forward_hook(lambda m, i, o: got.setdefault("k", o))]
        mod = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
        rotary = model.model.rotary_emb
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]))
        Tn = len(ids)
        if family.startswith("gpt_neox"):
            hook.remove()
            q, k, _ = got["qkv"].view(1, Tn, -1, 3 * attn.head_size).transpose(1, 2).chunk(3, dim=-1)
        else:
            for h in hooks:
                h.remove()
            q, k = (got[n].reshape(1, Tn, -1, attn.head_dim).transpose(1, 2) for n in "qk")   # [1, H, T, dh]
        cos, sin = rotary(q, torch.arange(Tn)[None])
        q, k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    return q[0], k[0]


@pytest.mark.parametrize("family", FAMILIES[:3])
def test_stages_show_q_and_k_after_qk_norm_and_rope(family, client, references):
    """The steps view's q and k are what transformers' attention multiplies: after QK-norm, then RoPE."""
    tok, model = references[family]
    ids = tok(TEXT)["input_ids"]
    for layer, head in ((0, 1), (1, 3)):
        st = client.post("/api/stages", json={"model": family, "text": TEXT, "layer": layer, "head": head}).json()
        q, k = _hf_qk(family, model, ids, layer)
        group = 4 // runtime(client, family).cfg.n_kv_heads
        np.testing.assert_allclose(np.asarray(st["q"]), q[head].numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(np.asarray(st["k"]), k[head // group].numpy(), atol=ATOL, rtol=0)
    boot = client.get("/").text
    assert '"qk_norm": "head"' in boot and '"output_norms": true' in boot and '"rotary_dim": 8' in boot


@pytest.mark.parametrize("family", FAMILIES)
def test_head_ablation_through_the_intervention_graphs_matches_transformers(family, client, references):
    """Head 2 of layer 1 ablated to zero (hook_z) via the layer-by-layer graphs; transformers: the same head's slice
    of the output projection's input zeroed by a hook."""
    tok, model = references[family]
    rt = runtime(client, family)
    enc = rt.encode(TEXT)
    iv = Interventions(rt)
    base = iv.trace(enc)
    where = np.zeros((4, len(enc.ids)), bool)
    where[2] = True
    logits = iv.run(base, [[Edit("head_output", 1, where)]])["logits"][0]
    dense = model.gpt_neox.layers[1].attention.dense if family.startswith("gpt_neox") else \
        model.model.layers[1].self_attn.o_proj
    dh = runtime(client, family).cfg.d_head

    def zero_head(module, args):
        x = args[0].clone()
        x[..., 2 * dh:3 * dh] = 0
        return (x,)
    hook = dense.register_forward_pre_hook(zero_head)
    try:
        with torch.inference_mode():
            want = model(input_ids=torch.tensor([enc.ids])).logits[0, -1].numpy()
    finally:
        hook.remove()
    with torch.inference_mode():
        intact = model(input_ids=torch.tensor([enc.ids])).logits[0, -1].numpy()
    assert np.abs(want - intact).max() > 0.1                               # the head mattered
    np.testing.assert_allclose(logits, want, atol=1e-4 * max(1.0, np.abs(want).max()), rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_with_a_key_value_cache_matches_transformers(family, client, references):
    """The decoding graph, prompt then four greedy tokens one at a time, against transformers' full forward."""
    tok, model = references[family]
    rt = runtime(client, family)
    ids = tok("The quick brown fox")["input_ids"]
    cache = KVCache.empty(rt.cfg)
    keep = np.ones((1, rt.cfg.n_layers, rt.cfg.n_heads), np.float32)
    step = decode(rt, np.array([ids]), cache, keep)
    for _ in range(4):
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True)
        want = torch.softmax(out.logits[0, -1].double(), -1).numpy()
        got = np.exp(step.logits[0] - step.logits[0].max())
        np.testing.assert_allclose(got / got.sum(), want, atol=ATOL, rtol=0)
        np.testing.assert_allclose(step.attentions[:, 0], torch.stack(out.attentions)[:, 0, :, -1].numpy(),
                                   atol=ATOL, rtol=0)
        ids = ids + [int(want.argmax())]
        step = decode(rt, np.array([ids[-1:]]), step.cache, keep)


@pytest.mark.parametrize("family", ["olmo2", "gpt_neox"])
def test_cut_graph_answers_the_first_layer_alike(family, client):
    """layers [0] runs the graph cut after block 0 (graphs/stacked.build_graph depth): the same probabilities."""
    full = client.post("/api/attention", json={"model": family, "text": TEXT}).json()
    first = client.post("/api/attention", json={"model": family, "text": TEXT, "layers": [0]}).json()
    assert np.array_equal(np.asarray(first["attention"])[0], np.asarray(full["attention"])[0])


@pytest.mark.parametrize("family", ["qwen3", "olmo2", "gpt_neox"])
def test_layer_by_layer_run_matches_the_stacked_graph(family, client):
    """The long-input path (runtime/layerwise.py): the same blocks cut into graphs, or each block one graph (fused,
    a GPU's walk), the same numbers."""
    rt = runtime(client, family)
    enc = rt.encode(TEXT)
    stacked = rt(TEXT)
    for fused in (False, True):
        res = Layerwise(rt, graphs=rt.layerwise(), fused=fused).forward(enc, want=Want((0, 1), (0, 3), attention=True))
        np.testing.assert_allclose(res.asked.attention[1], stacked.attentions[1, [0, 3]], atol=1e-5, rtol=0)
        np.testing.assert_allclose(res.rows["max_weight"], stacked.attentions.max(axis=-1), atol=1e-5, rtol=0)
        np.testing.assert_allclose(res.next_token_logits, stacked.next_token_logits, atol=1e-4, rtol=0)


# ---- the analyses: exact where the math holds, refused where it does not ------------------------------------------
def test_qk_attribution_sums_to_the_score_with_partial_rotary_and_parallel_residual(client):
    text = "the cat sat on the mat and the dog"
    st = client.post("/api/stages", json={"model": "gpt_neox", "text": text, "layer": 1, "head": 2}).json()
    T_ = len(st["tokens"])
    for query, key in ((T_ - 1, 1), (T_ // 2, T_ // 2 - 1)):
        j = client.post("/api/qk", json={"model": "gpt_neox", "text": text, "layer": 1, "head": 2, "query": query,
                                         "key": key, "table": True})
        assert j.status_code == 200, j.text
        j = j.json()
        assert np.sum(j["table"]) == pytest.approx(j["score"], abs=1e-9)
        assert j["score"] == pytest.approx(st["scaled"][query][key], abs=1e-4)


def test_analyses_whose_math_breaks_are_refused_in_one_line(client):
    qk = {"text": "the cat sat on the mat", "layer": 1, "head": 0, "query": 4, "key": 2}
    cases = [("/api/qk", qk | {"model": "qwen3"}, "has QK-norm (an RMSNorm over each head's queries and keys"),
             ("/api/qk", qk | {"model": "olmo2"}, "has QK-norm (an RMSNorm over the whole projection's queries"),
             ("/api/circuits", {"model": "qwen3"}, "weight-space circuits (QK = W_Q W_K^T, OV = W_V W_O) splits"),
             ("/api/circuits", {"model": "olmo2"}, "has QK-norm"),
             ("/api/lens", {"model": "olmo2", "text": "a b c", "head_lens": [1, 0]},
              "the head lens reads each head's output as its direct share of the residual stream, and model 'olmo2' "
              "normalises each sublayer's output"),
             ("/api/attention", {"model": "olmo2", "text": "a b c", "include": ["attribution"], "target": "a"},
              "direct logit attribution reads each head's output as its direct share")]
    for path, body, says in cases:
        r = client.post(path, json=body)
        assert r.status_code == 422 and says in r.text, (path, body, r.status_code, r.text)
        assert "\n" not in r.json()["detail"]
    for ok in ({"model": "qwen3", "text": "a b c"}, {"model": "olmo2", "text": "a b c"}):   # the logit lens holds
        assert client.post("/api/lens", json=ok).status_code == 200
    assert client.post("/api/circuits", json={"model": "gpt_neox"}).status_code == 200
    assert client.post("/api/lens", json={"model": "gpt_neox", "text": "a b c", "head_lens": [1, 0]}).status_code == 200


def test_unsupported_config_options_are_refused_at_load(folders, tmp_path):
    for family in ("qwen3", "olmo2"):
        folder = copy_of(folders[family], tmp_path)
        edit_config(folder, attention_bias=True)
        assert f"attention_bias true (biases on q, k, v and o but not the MLP) is not supported for model_type " \
               f"'{family}'" in refusal(f"m={folder}")
    folder = copy_of(folders["gpt_neox"], tmp_path)
    edit_config(folder, attention_bias=False)
    assert "GPT-NeoX without attention biases (attention_bias false" in refusal(f"m={folder}")
    config = json.loads((folder / "config.json").read_text())
    edit_config(folder, attention_bias=True, rope_parameters=config["rope_parameters"] | {"partial_rotary_factor": 0.1})
    assert "partial_rotary_factor 0.1 turns 1 of each head's 16 features; supported: an even number" in \
        refusal(f"m={folder}")
    edit_config(folder, rope_parameters=config["rope_parameters"] | {"rope_type": "linear", "factor": 2.0})
    assert "RoPE scaling 'linear' is not supported" in refusal(f"m={folder}")
