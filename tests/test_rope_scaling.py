"""RoPE scaling (issue 23): Llama 3.x's llama3, linear, yarn and dynamic scaling, and Phi-3 (fused qkv and gate_up,
LongRoPE, partial rotary), against transformers eager.

The tables first, for every kind, against transformers' own rotary embedding (inv_freq bit for bit). Then small random
checkpoints made with transformers' config classes and save_pretrained, served by path through the app: attention
probabilities and next-token probabilities within 1e-4 of transformers eager, at a length where the scaling changes
them (checked against the same weights with plain RoPE), attention peaked (mean row max >= 0.5). Kinds that depend
on the input's length (longrope past its original length, dynamic past max_position_embeddings) are capped where
one table stops being exact, and say so.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model import functional as F
from attnscope.model.rope import RopeScaling
from tests.conftest import CACHE, serving
from tests.test_checkpoints import CORPUS, edit_config, peaked, refusal, save_tokenizer, widen

torch.set_num_threads(2)
ATOL = 1e-4
THETA = 100.0        # small: the slow pairs turn within ~100 tokens, where a scaling then shows
TEXT = " ".join(CORPUS[:5])   # ~150 tokens with the checkpoints' small BPE


# ---- the tables ---------------------------------------------------------------------------------------------------
def hf_rotary(rope: dict, positions: int, family: str = "llama", **extra):
    """transformers' rotary embedding for this rope_parameters: inv_freq, attention factor, cos and sin [P, r]."""
    if family == "phi3":
        cfg = transformers.Phi3Config(hidden_size=64, num_attention_heads=2, max_position_embeddings=512,
                                      rope_parameters=dict(rope_theta=THETA, **rope), **extra)
        emb = transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=512,
                                       rope_parameters=dict(rope_theta=THETA, **rope), **extra)
        emb = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    cos, sin = emb(torch.zeros(1), torch.arange(positions)[None])
    return emb.inv_freq.numpy(), emb.attention_scaling, cos[0].numpy(), sin[0].numpy()


SHORT = [1.0, 1.3, 2.0, 3.5, 5.0, 8.0, 9.5, 12.0, 1.1, 1.2, 1.4, 1.6, 2.2, 2.9, 4.0, 6.0]
TABLES = {   # name: (transformers' rope_parameters, ours)
    "linear": (dict(rope_type="linear", factor=4.0), RopeScaling("linear", 4.0)),
    "llama3": (dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64), RopeScaling("llama3", 8.0, 64)),
    "yarn": (dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=64), RopeScaling("yarn", 8.0, 64)),
    "yarn-mscale": (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, mscale=0.7,
                         mscale_all_dim=1.0, beta_fast=16, beta_slow=2, truncate=False),
                    RopeScaling("yarn", 4.0, 64, mscale=0.7, mscale_all_dim=1.0, beta_fast=16, beta_slow=2,
                                truncate=False)),
    "longrope": (dict(rope_type="longrope", short_factor=SHORT, long_factor=[2 * f for f in SHORT],
                      original_max_position_embeddings=128),
                 RopeScaling("longrope", 4.0, 128, short_factor=SHORT, long_factor=[2 * f for f in SHORT])),
    "dynamic": (dict(rope_type="dynamic", factor=3.0), RopeScaling("dynamic", 3.0, 512)),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_tables_match_transformers(name):
    hf, ours = TABLES[name]
    P = 128 if name == "longrope" else 512     # longrope's short factors: up to its original length
    extra = {"original_max_position_embeddings": 128} if name == "longrope" else {}
    inv_freq, factor, cos_hf, sin_hf = hf_rotary(hf, P, "phi3" if name == "longrope" else "llama", **extra)
    d = 2 * len(inv_freq)
    base = (THETA ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)).astype(np.float64)).astype(np.float32)
    mine, attention_factor = ours.inverse_frequencies(base, THETA, P)
    np.testing.assert_array_equal(mine, inv_freq)                  # bit for bit
    assert attention_factor == pytest.approx(factor, rel=1e-12)
    cos, sin = F.rope_tables(P, d, THETA, ours)
    np.testing.assert_allclose(cos, cos_hf, atol=3e-7, rtol=0)    # cos/sin within a float32 rounding
    np.testing.assert_allclose(sin, sin_hf, atol=3e-7, rtol=0)
    plain = F.rope_tables(P, d, THETA)[0]
    assert (np.abs(plain - cos).max() > 0.5) == (name != "dynamic")   # dynamic: plain RoPE up to its length


def test_a_table_past_where_one_table_is_exact_is_refused():
    for kind, limit in (("longrope", 128), ("dynamic", 512)):
        with pytest.raises(ValueError, match=f"changes with the input's length past {limit} positions"):
            F.rope_tables(limit + 1, 16, THETA, RopeScaling(kind, 2.0, limit, short_factor=[1.0] * 8))


def test_partial_rotary_turns_the_first_features_only():
    x = np.random.default_rng(0).standard_normal((2, 7, 16)).astype(np.float32)
    cos, sin = F.rope_tables(7, 8, THETA)
    y = F.apply_rope(x, cos, sin)
    np.testing.assert_array_equal(y[..., 8:], x[..., 8:])
    np.testing.assert_array_equal(y[..., :8], F.apply_rope(x[..., :8], cos, sin))
    q = torch.from_numpy(x)[None]
    ref, _ = transformers.models.phi3.modeling_phi3.apply_rotary_pos_emb(q, q, torch.from_numpy(cos)[None],
                                                                         torch.from_numpy(sin)[None])
    np.testing.assert_allclose(y, ref[0].numpy(), atol=1e-6, rtol=0)


# ---- checkpoints through the app ----------------------------------------------------------------------------------
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             rms_norm_eps=1e-5)


def llama(rope: dict, **kw):
    kw = SMALL | dict(head_dim=16, max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=0,
                      eos_token_id=1) | kw
    return transformers.LlamaConfig(rope_parameters=dict(rope_theta=THETA, **rope), **kw), transformers.LlamaForCausalLM


CHECKPOINTS = {   # name: (tokenizer family, config, 4.x rope_scaling to write instead of rope_parameters, or None)
    "llama3": ("mistral", lambda: llama(dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=32)), None),
    "linear": ("mistral", lambda: llama(dict(rope_type="linear", factor=4.0)), {"type": "linear", "factor": 4.0}),
    "yarn": ("qwen2", lambda: (transformers.Qwen2Config(
        **SMALL, max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=0, rope_parameters=dict(rope_theta=THETA, rope_type="yarn", factor=4.0,
                                             original_max_position_embeddings=64)), transformers.Qwen2ForCausalLM),
        None),
    "dynamic": ("mistral", lambda: llama(dict(rope_type="dynamic", factor=2.0), max_position_embeddings=64),
                {"type": "dynamic", "factor": 2.0}),
    "phi3": ("gpt2", lambda: (transformers.Phi3Config(
        **SMALL, max_position_embeddings=512, original_max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=None,
        rope_parameters=dict(rope_theta=THETA, rope_type="longrope", short_factor=SHORT[:4],
                             long_factor=[2 * f for f in SHORT[:4]], partial_rotary_factor=0.5)),
        transformers.Phi3ForCausalLM), None),
}
CAPPED = {"dynamic": 64, "phi3": 128}    # where one table stops being exact: max_position_embeddings, the original


def build(name: str, folder):
    family, make, old_style = CHECKPOINTS[name]
    folder.mkdir(parents=True)
    vocab = save_tokenizer(family, folder)
    config, cls = make()
    config.vocab_size = vocab
    torch.manual_seed(0)
    model = cls(config)
    widen(model, seed=len(name))
    with torch.no_grad():                         # Phi-3's fused qkv_proj: the query and key rows as wide as Llama's
        for layer in getattr(model.model, "layers", []):
            if hasattr(layer.self_attn, "qkv_proj"):
                layer.self_attn.qkv_proj.weight.mul_(2.0)
    model.save_pretrained(folder)
    if old_style is not None:                     # a transformers 4.x config.json: rope_theta and rope_scaling
        c = json.loads((folder / "config.json").read_text())
        c.pop("rope_parameters")
        (folder / "config.json").write_text(json.dumps(c | {"rope_theta": THETA, "rope_scaling": old_style}))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("rope")
    return {name: build(name, root / name) for name in CHECKPOINTS}


@pytest.fixture(scope="module")
def client(folders):
    with serving(folders) as c:
        yield c


def reference(folder, plain: bool = False):
    """transformers' tokenizer and eager model from the folder; plain: the same weights with unscaled RoPE."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    if plain:
        config = model.config
        rope = config.rope_parameters
        config.rope_parameters = {k: rope[k] for k in ("rope_theta", "partial_rotary_factor") if k in rope} | \
            {"rope_type": "default"}
        unscaled = type(model)(config).eval()
        unscaled.load_state_dict(model.state_dict())
        model = unscaled
    return tok, model


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_scaled_checkpoint_matches_transformers(name, folders, client):
    tok, model = reference(folders[name])
    rt = client.app.state.service.runtimes[name]
    r = client.post("/api/attention", json={"model": name, "text": TEXT, "include": ["attention", "predictions"]})
    assert r.status_code == 200, r.text
    r = r.json()
    ids = tok(TEXT, truncation=True, max_length=rt.spec.max_tokens)["input_ids"]
    assert r["token_ids"] == ids and len(ids) == CAPPED.get(name, len(ids)) and len(ids) >= 64
    assert r["truncated"] == (name in CAPPED)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    ref = torch.stack(out.attentions)[:, 0].numpy()                         # [L, H, T, T]
    ours = np.asarray(r["attention"], np.float32)
    assert peaked(ours) >= 0.5, peaked(ours)
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)
    logp = torch.log_softmax(out.logits[0].double(), -1)
    top = int(logp[-1].argmax())
    assert r["next_tokens"][0]["id"] == top and abs(r["next_tokens"][0]["prob"] - float(logp[-1, top].exp())) <= ATOL
    want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    np.testing.assert_allclose(r["token_logprobs"][1:], want, atol=ATOL * max(1.0, np.abs(want).max()), rtol=0)

    _, unscaled = reference(folders[name], plain=True)     # the scaling changes these numbers (dynamic: only past
    with torch.inference_mode():                             # its length, which is why it is capped there)
        plain = torch.stack(unscaled(input_ids=torch.tensor([ids]), output_attentions=True).attentions)[:, 0].numpy()
        longer = torch.tensor([ids + ids[1:9]])
        past = [m(input_ids=longer, output_attentions=True).attentions[0][0, :, :len(ids), :len(ids)].numpy()
                for m in (model, unscaled)] if name == "dynamic" else None
    if name == "dynamic":
        np.testing.assert_allclose(ours, plain, atol=ATOL, rtol=0)
        assert np.abs(past[0] - past[1]).max() > 0.05     # 8 more tokens and every position's angles change
    else:
        assert np.abs(ours - plain).max() > 0.05, np.abs(ours - plain).max()


def test_models_describe_their_rope_and_their_cap(client):
    models = {m["id"]: m for m in client.get("/api/models").json()}
    assert models["phi3"]["architecture"] == "phi3" and models["phi3"]["kv_heads"] == 2
    assert "with longrope scaling (factor 4 from 128 positions) on 8 of 16 features" in models["phi3"]["description"]
    assert "capped at 128 tokens" in models["phi3"]["description"] and models["phi3"]["max_positions"] == 128
    assert "with llama3 scaling (factor 8 from 32 positions)" in models["llama3"]["description"]
    assert models["dynamic"]["max_tokens"] == 64 and "capped at 64 tokens" in models["dynamic"]["description"]
    assert (models["yarn"]["max_tokens"], models["yarn"]["max_positions"]) == (256, 256)


def test_rope_configs_refused_in_one_line(folders, tmp_path):
    from tests.test_checkpoints import copy_of

    folder = copy_of(folders["llama3"], tmp_path)
    edit_config(folder, rope_parameters={"rope_type": "proportional", "rope_theta": THETA, "factor": 2.0})
    assert "RoPE scaling 'proportional' is not supported (supported rope_type: default, linear, llama3, yarn, " \
           "longrope, dynamic)" in refusal(f"m={folder}")
    edit_config(folder, rope_parameters={"rope_type": "llama3", "rope_theta": THETA, "factor": 8.0})
    assert "config.json's RoPE scaling 'llama3' has no low_freq_factor, high_freq_factor" in refusal(f"m={folder}")
    edit_config(folder, rope_parameters={"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.5})
    assert "partial rotary embeddings (partial_rotary_factor 0.5) are not supported for model_type 'llama'" in \
        refusal(f"m={folder}")
    folder = copy_of(folders["phi3"], tmp_path)
    c = json.loads((folder / "config.json").read_text())
    edit_config(folder, rope_parameters=c["rope_parameters"] | {"short_factor": [1.0] * 3})
    assert "longrope short_factor has 3 entries; its 8 rotary features need 4" in refusal(f"m={folder}")
    folder = copy_of(folders["dynamic"], tmp_path)     # past max_position_embeddings: not exact, so not allowed
    assert "ATTNSCOPE_MAX_TOKENS: m=65, but it takes 2 to 64 tokens" in refusal(f"m={folder}", max_tokens={"m": 65})


# ---- a Llama 3.2-style checkpoint past 8192 positions -------------------------------------------------------------
LONG = 8300          # tokens: past Llama 3's original 8192, where llama3 scaling has slowed its slow pairs 32 times
PAST = 8192


@pytest.fixture(scope="module")
def llama32(tmp_path_factory):
    """1 layer, 1 head, head_dim 16, tied embeddings, 131072 positions with
    Llama 3.2's rope_parameters (theta 500000, llama3 factor 32 from 8192); q/k drawn wide enough that rows of
    8300 keys are peaked."""
    folder = tmp_path_factory.mktemp("llama32") / "l32"
    folder.mkdir()
    vocab = save_tokenizer("mistral", folder)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
        head_dim=16, intermediate_size=64, max_position_embeddings=131072, tie_word_embeddings=True,
        rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    widen(model, seed=32)
    with torch.no_grad():
        for proj in (model.model.layers[0].self_attn.q_proj, model.model.layers[0].self_attn.k_proj):
            proj.weight.mul_(1.0 / 0.3)          # q and k N(0, 1): one key stands out among thousands
    model.save_pretrained(folder)
    return folder


def long_text(folder, n: int) -> str:
    """Random words of the checkpoints' corpus, a little more than n tokens."""
    from tokenizers import Tokenizer

    tok, words = Tokenizer.from_file(str(folder / "tokenizer.json")), " ".join(CORPUS[:4]).split()
    rng, text = np.random.default_rng(0), "Once"
    while len(tok.encode(text).ids) <= n:
        text += " " + " ".join(rng.choice(words, 500))
    return text


def rows_past(folder, ids: list[int], start: int, plain: bool = False):
    """transformers on ids: its attention probabilities of queries start.. [H, R, T] (its own eager_attention_forward
    on the queries and keys its rotary embedding turned, captured), and log-softmax of its logits [T, V]. The forward
    runs sdpa, so that no [H, T, T] is held (eager's would be 0.5 GB a tensor at 8300 tokens)."""
    from transformers.models.llama import modeling_llama as ML

    _, model = reference(folder, plain)
    model.config._attn_implementation = "sdpa"
    captured, rotate = {}, ML.apply_rotary_pos_emb

    def capture(q, k, cos, sin, *args, **kwargs):
        captured["q"], captured["k"] = rotate(q, k, cos, sin, *args, **kwargs)
        return captured["q"], captured["k"]

    ML.apply_rotary_pos_emb = capture
    try:
        with torch.inference_mode():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
            attn = model.model.layers[0].self_attn
            T = len(ids)
            future = torch.arange(T)[None, :] > torch.arange(start, T)[:, None]                 # [R, T]
            mask = torch.zeros(future.shape).masked_fill(future, torch.finfo(torch.float32).min)[None, None]
            v = torch.zeros_like(captured["k"])
            _, probs = ML.eager_attention_forward(attn, captured["q"][:, :, start:], captured["k"], v, mask,
                                                  scaling=attn.scaling)
    finally:
        ML.apply_rotary_pos_emb = rotate
    return probs[0].numpy(), logp


@pytest.mark.slow
def test_llama32_is_served_past_8192_positions(llama32):
    """Through the app (ATTNSCOPE_MAX_TOKENS=l32=8300, layer by layer): each query's 4 heaviest keys and their
    weights, and every token's log-probability, against transformers at positions 8192..8299."""
    settings = Settings(models=[f"l32={llama32}"], max_tokens={"l32": LONG}, cache=CACHE)
    with TestClient(create_app(settings)) as client:
        info = client.get("/api/models").json()[0]
        assert (info["max_tokens"], info["max_positions"]) == (LONG, 131072)   # its own (MAX_POSITIONS: 131072)
        assert "with llama3 scaling (factor 32 from 8192 positions)" in info["description"]
        r = client.post("/api/attention", json={"model": "l32", "text": long_text(llama32, LONG), "top_k": 4,
                                                "include": ["attention", "predictions"]})
    assert r.status_code == 200, r.text[:300]
    r = r.json()
    ids = r["token_ids"]
    assert len(ids) == LONG and r["truncated"]
    keys, weights = (np.asarray(r[n])[0, :, PAST:] for n in ("top_keys", "top_weights"))   # [H, R, 4]
    ref, logp = rows_past(llama32, ids, PAST)                                              # [H, R, T]
    assert peaked(ref) >= 0.5, peaked(ref)
    heavy = np.take_along_axis(ref, keys, -1)                                              # transformers' weights there
    np.testing.assert_allclose(weights, heavy, atol=ATOL, rtol=0)
    np.testing.assert_allclose(ref.sum(-1) - heavy.sum(-1), 1 - weights.sum(-1), atol=ATOL)   # nothing heavier missed
    want = logp[torch.arange(PAST - 1, LONG - 1), torch.tensor(ids[PAST:])].numpy()
    np.testing.assert_allclose(r["token_logprobs"][PAST:], want, atol=ATOL * max(1.0, np.abs(want).max()), rtol=0)
    top = int(logp[-1].argmax())
    assert r["next_tokens"][0]["id"] == top and abs(r["next_tokens"][0]["prob"] - float(logp[-1, top].exp())) <= ATOL

    plain, _ = rows_past(llama32, ids, PAST, plain=True)        # the scaling is what these numbers show
    assert np.abs(np.take_along_axis(plain, keys, -1) - heavy).max() > 0.5
