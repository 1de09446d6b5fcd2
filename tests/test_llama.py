"""The Llama-family pieces against their textbook definitions and against PyTorch / transformers.

RMSNorm, RoPE, grouped-query attention, SwiGLU and the tanh GELU one by one; then a small random
Llama (and a Qwen2, which has q/k/v biases) end to end against transformers' eager implementation
with the same weights, and our NumPy forward against our ONNX graph (head mask and stages included).
Weights are drawn wide enough that attention rows are peaked (asserted: mean row max >= 0.5):
parity on near-uniform rows would prove little.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from attnscope.model import functional as F
from attnscope.model import masks as M
from attnscope.model.attention import GroupedQueryAttention
from attnscope.graphs.stacked import build_graph
from attnscope.model.transformer import LM_OUTPUTS, STAGES, SwiGLU, Transformer, TransformerConfig
from attnscope.model.weights import load_npz, save_npz, state_dict
from attnscope.runtime.sessions import Session
from attnscope.runtime.tensors import Weights
from .conftest import DEVICE, PROVIDERS

torch.set_num_threads(2)


def randn(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def close(actual, expected, atol):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), atol=atol, rtol=0)


def close_scaled(actual, expected, rtol):
    """|a - e| <= rtol * max(1, max |e|): for values far from 1 in size (hidden states, logits)."""
    expected = np.asarray(expected, np.float64)
    close(actual, expected, rtol * max(1.0, float(np.abs(expected).max())))


def peaked(probs: np.ndarray) -> float:
    """Mean over rows of the largest weight: 1/T for uniform rows, 1 for one-hot ones."""
    return float(probs.max(axis=-1).mean())


# ---- RMSNorm, activations --------------------------------------------------------------------
@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_rms_norm_is_x_over_its_root_mean_square_times_weight(eps):
    x, w = randn(3, 5, 64, seed=1, scale=3.0), randn(64, seed=2)
    x64 = x.astype(np.float64)
    textbook = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * w
    y = F.rms_norm(x, w, eps)
    assert y.dtype == np.float32
    close(y, textbook, 1e-5)
    close(y, TF.rms_norm(torch.from_numpy(x), (64,), torch.from_numpy(w), eps).numpy(), 1e-5)


def test_rms_norm_does_not_centre():
    x = np.full((1, 8), 5.0, np.float32)  # LayerNorm would give zeros; RMSNorm keeps the sign and scale 1
    close(F.rms_norm(x, np.ones(8, np.float32), 1e-6), np.ones((1, 8)), 1e-5)


def test_gelu_tanh_and_silu_match_torch():
    x = randn(1000, seed=3, scale=4.0)
    t = torch.from_numpy(x)
    close(F.gelu_tanh(x), TF.gelu(t, approximate="tanh").numpy(), 1e-6)
    close(F.silu(x), TF.silu(t).numpy(), 1e-6)
    assert F.gelu_tanh(x).dtype == F.silu(x).dtype == np.float32
    assert np.abs(F.gelu_tanh(x) - F.gelu(x)).max() > 1e-4   # a different function from the exact GELU


# ---- RoPE ------------------------------------------------------------------------------------
def textbook_rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Turn each pair (x_i, x_{i + d/2}) of position p by p * theta^(-2i/d), with explicit 2x2 rotations."""
    T, d = x.shape[-2:]
    out = np.empty(x.shape, np.float64)
    for p in range(T):
        for i in range(d // 2):
            a = p * theta ** (-2 * i / d)
            c, s = np.cos(a), np.sin(a)
            x1, x2 = x[..., p, i].astype(np.float64), x[..., p, i + d // 2].astype(np.float64)
            out[..., p, i], out[..., p, i + d // 2] = c * x1 - s * x2, s * x1 + c * x2
    return out


@pytest.mark.parametrize("theta", [10000.0, 100000.0])
def test_rope_is_a_rotation_of_feature_pairs(theta):
    x = randn(2, 3, 40, 16, seed=4)
    cos, sin = F.rope_tables(64, 16, theta)
    y = F.apply_rope(x, cos[:40], sin[:40])
    close(y, textbook_rope(x, theta), 2e-5)
    close(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), 1e-4)   # rotations keep lengths


def test_rope_scores_depend_on_the_offset_only():
    q, k = randn(16, seed=5), randn(16, seed=6)
    cos, sin = F.rope_tables(128, 16, 10000.0)

    def score(i, j):
        return (F.apply_rope(q[None], cos[i:i + 1], sin[i:i + 1]) @ F.apply_rope(k[None], cos[j:j + 1], sin[j:j + 1]).T).item()

    for shift in (1, 17, 60):
        assert abs(score(9, 4) - score(9 + shift, 4 + shift)) < 1e-4
    assert abs(score(9, 4) - score(9, 5)) > 1e-3


def test_rope_tables_match_transformers():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64, rope_theta=100000.0,
                      max_position_embeddings=4096)
    emb = LlamaRotaryEmbedding(cfg)
    cos_hf, sin_hf = emb(torch.zeros(1, dtype=torch.float32), torch.arange(4096)[None])
    cos, sin = F.rope_tables(4096, 64, 100000.0)
    # same float32 angles; cos/sin themselves within a float32 rounding of each other
    close(cos, cos_hf[0].numpy(), 2e-7)
    close(sin, sin_hf[0].numpy(), 2e-7)


# ---- grouped-query attention -----------------------------------------------------------------
def gqa_module(H=6, Hkv=2, dh=16, D=40, rope=True, qkv_bias=False, seed=7):
    attn = GroupedQueryAttention(D, H, Hkv, dh, rope=F.rope_tables(64, dh, 10000.0) if rope else None,
                                 qkv_bias=qkv_bias, seed=seed, std=0.6)   # wide: peaked rows
    if qkv_bias:
        for name in ("q_proj.bias", "k_proj.bias", "v_proj.bias"):
            attn.params[name] = randn(*attn.params[name].shape, seed=seed + len(name))
    return attn


def repeat_kv_reference(attn, x, mask):
    """Attention written head by head in float64: query head h uses key/value head h // (H / Hkv)."""
    B, T, _ = x.shape
    H, Hkv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    x64 = x.astype(np.float64)
    proj = {n: x64 @ attn.params[f"{n}_proj.weight"].T.astype(np.float64) + attn.params.get(f"{n}_proj.bias", 0)
            for n in "qkv"}
    cos, sin = attn.rope[0][:T].astype(np.float64), attn.rope[1][:T].astype(np.float64)
    rot = lambda t: t * cos + np.concatenate([-t[..., dh // 2:], t[..., :dh // 2]], -1) * sin  # noqa: E731
    probs = np.zeros((B, H, T, T))
    ctx = np.zeros((B, T, H * dh))
    for h in range(H):
        g = h // (H // Hkv)
        q = rot(proj["q"][..., h * dh:(h + 1) * dh])
        k = rot(proj["k"][..., g * dh:(g + 1) * dh])
        v = proj["v"][..., g * dh:(g + 1) * dh]
        s = q @ k.transpose(0, 2, 1) / np.sqrt(dh) + mask[:, 0]
        p = np.exp(s - s.max(-1, keepdims=True))
        probs[:, h] = p / p.sum(-1, keepdims=True)
        ctx[..., h * dh:(h + 1) * dh] = probs[:, h] @ v
    return ctx @ attn.params["o_proj.weight"].T.astype(np.float64), probs


@pytest.mark.parametrize("H,Hkv", [(6, 2), (6, 1), (4, 4)], ids=["grouped", "multi-query", "multi-head"])
@pytest.mark.parametrize("qkv_bias", [False, True], ids=["nobias", "qkv_bias"])
def test_gqa_matches_head_by_head_reference(H, Hkv, qkv_bias):
    attn = gqa_module(H=H, Hkv=Hkv, qkv_bias=qkv_bias)
    x = randn(2, 20, 40, seed=8)
    mask = M.causal_mask(20)[None, None]
    out, probs = attn(x, attn_mask=mask)
    ref_out, ref_probs = repeat_kv_reference(attn, x, mask)
    assert probs.shape == (2, H, 20, 20) and peaked(probs) >= 0.5, peaked(probs)
    close(probs, ref_probs, 1e-5)
    close_scaled(out, ref_out, 1e-5)


def test_gqa_matches_torch_sdpa_enable_gqa():
    attn = gqa_module()
    x = randn(2, 24, 40, seed=9)
    out, probs, stages, (q, k, v) = attn(x, attn_mask=M.causal_mask(24)[None, None], return_stages=True)
    assert peaked(probs) >= 0.5
    Hkv, group = attn.n_kv_heads, attn.group
    k_kv, v_kv = k[:, ::group], v[:, ::group]                        # the 2 kv heads before repetition
    assert np.array_equal(k, np.repeat(k_kv, group, axis=1))          # head h reads kv head h // group
    ctx = TF.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(np.ascontiguousarray(k_kv)),
                                          torch.from_numpy(np.ascontiguousarray(v_kv)), is_causal=True,
                                          enable_gqa=True)           # [B, H, T, dh]
    ref = ctx.transpose(1, 2).reshape(2, 24, -1).numpy() @ attn.params["o_proj.weight"].T
    close_scaled(out, ref, 1e-5)
    assert k_kv.shape[1] == Hkv


def test_gqa_rejects_uneven_groups():
    with pytest.raises(ValueError, match="must divide"):
        GroupedQueryAttention(40, 6, 4, 16)


# ---- SwiGLU ------------------------------------------------------------------------------------
def test_swiglu_is_down_of_silu_gate_times_up():
    cfg = TransformerConfig(vocab_size=10, max_positions=8, d_model=24, n_heads=4, n_layers=1, d_ff=40,
                            mlp="swiglu", attention="gqa", bias=False, qkv_bias=False)
    mlp = SwiGLU(cfg, np.random.default_rng(0))
    for lin in (mlp.gate, mlp.up, mlp.down):
        lin.weight = lin.weight * 20   # activations well into silu's curved part
    x = randn(2, 5, 24, seed=10)
    t = lambda a: torch.from_numpy(a)  # noqa: E731
    ref = TF.linear(TF.silu(TF.linear(t(x), t(mlp.gate.weight))) * TF.linear(t(x), t(mlp.up.weight)), t(mlp.down.weight))
    close(mlp(x), ref.numpy(), 1e-5)
    assert mlp.gate.bias is None and mlp.down.bias is None


# ---- head mask -----------------------------------------------------------------------------------
def test_ablate_heads_keeps_zeroes_or_averages():
    ctx = randn(2, 3, 5, 4, seed=11)
    weights = F.position_weights(np.array([5, 3]), 5)
    keep = np.array([[1, 0, 0], [0, 1, 1]], np.float32)
    mean = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    out = F.ablate_heads(ctx, keep, mean, weights)
    assert np.array_equal(out[0, 0], ctx[0, 0]) and np.array_equal(out[1, 1:], ctx[1, 1:])   # kept: exactly
    close(out[0, 1], np.broadcast_to(ctx[0, 1].mean(0), (5, 4)), 1e-6)                      # mean over 5 tokens
    close(out[1, 0], np.broadcast_to(ctx[1, 0, :3].mean(0), (5, 4)), 1e-6)                   # padding left out
    assert np.all(out[0, 2] == 0)                                                            # zero-ablated
    close(weights, [[.2] * 5, [1 / 3] * 3 + [0, 0]], 1e-7)


# ---- a small Llama (and Qwen2) end to end ----------------------------------------------------------
FAMILIES = {
    "llama": dict(qkv_bias=False),
    "qwen2": dict(qkv_bias=True),
}


def tiny_config(family: str, tie: bool = True) -> TransformerConfig:
    return TransformerConfig(vocab_size=97, max_positions=64, d_model=48, n_heads=6, n_layers=3, d_ff=80,
                             norm_first=True, causal=True, final_norm=True, layer_norm_eps=1e-6, norm="rms",
                             position="rope", mlp="swiglu", attention="gqa", n_kv_heads=2, d_head=16,
                             rope_theta=500.0, bias=False, lm_head=True, tie_embeddings=tie, **FAMILIES[family])


def tiny_model(family: str, tie: bool = True, seed: int = 0) -> Transformer:
    """Random weights, wide where it makes attention peaked; norm weights not all ones."""
    model = Transformer(tiny_config(family, tie), seed=seed)
    rng = np.random.default_rng(seed + 1)
    model.wte = (rng.standard_normal(model.wte.shape)).astype(np.float32)
    for b in model.blocks:
        for name, w in b.attn.params.items():
            std = 0.3 if name.startswith(("q_proj", "k_proj")) else 0.15
            b.attn.params[name] = (rng.standard_normal(w.shape) * std).astype(np.float32)
        for lin in (b.mlp.gate, b.mlp.up, b.mlp.down):
            lin.weight = (rng.standard_normal(lin.weight.shape) * 0.15).astype(np.float32)
        for ln in (b.ln1, b.ln2):
            ln.weight = (1 + 0.2 * rng.standard_normal(ln.weight.shape)).astype(np.float32)
    model.ln_f.weight = (1 + 0.2 * rng.standard_normal(model.ln_f.weight.shape)).astype(np.float32)
    if model.lm_head is not None:
        model.lm_head.weight = rng.standard_normal(model.lm_head.weight.shape).astype(np.float32)
    return model


def to_transformers(model: Transformer, family: str):
    """The same weights in transformers' LlamaForCausalLM / Qwen2ForCausalLM (eager attention)."""
    import transformers

    cfg = model.cfg
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
              head_dim=cfg.d_head, rms_norm_eps=cfg.layer_norm_eps, rope_theta=cfg.rope_theta,
              max_position_embeddings=cfg.max_positions, tie_word_embeddings=cfg.tie_embeddings)
    if family == "llama":
        hf_cfg, cls = transformers.LlamaConfig(**kw, attention_bias=False, mlp_bias=False), transformers.LlamaForCausalLM
    else:
        hf_cfg, cls = transformers.Qwen2Config(**kw), transformers.Qwen2ForCausalLM
    hf = cls(hf_cfg)
    hf.config._attn_implementation = "eager"
    sd = {"model.embed_tokens.weight": model.wte, "model.norm.weight": model.ln_f.weight}
    if model.lm_head is not None:
        sd["lm_head.weight"] = model.lm_head.weight
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        sd |= {p + "self_attn." + k: v for k, v in b.attn.params.items()}
        sd |= {p + "input_layernorm.weight": b.ln1.weight, p + "post_attention_layernorm.weight": b.ln2.weight,
               p + "mlp.gate_proj.weight": b.mlp.gate.weight, p + "mlp.up_proj.weight": b.mlp.up.weight,
               p + "mlp.down_proj.weight": b.mlp.down.weight}
    missing, unexpected = hf.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                                             strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf.eval()


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tiny_model_matches_transformers(family, tie):
    model = tiny_model(family, tie)
    hf = to_transformers(model, family)
    ids = np.random.default_rng(3).integers(0, model.cfg.vocab_size, (1, 40))
    out = model(ids, attention_mask=M.causal_mask(40)[None, None])
    assert peaked(out.attentions) >= 0.5, peaked(out.attentions)
    with torch.inference_mode():
        ref = hf(input_ids=torch.from_numpy(ids), output_attentions=True)
    close(out.attentions, torch.stack(ref.attentions).numpy(), 1e-5)
    logits = ref.logits[0].double()
    close(F.softmax(out.next_token_logits.astype(np.float64)), torch.softmax(logits[-1:], -1).numpy(), 1e-5)
    logprobs = torch.log_softmax(logits, -1)[torch.arange(39), torch.from_numpy(ids[0, 1:])].numpy()
    close_scaled(out.token_logprobs[0, 1:], logprobs, 1e-5)
    assert out.token_logprobs[0, 0] == 0.0


def onnx_session(model: Transformer, stages: bool = False):
    """The graph in a session of the runtime's, which binds the model's weights at every run (graphs hold none)."""
    return Session(build_graph(model, stages).SerializeToString(), PROVIDERS, 2, Weights(model, DEVICE))


def padded_batch(model, lengths, seed=4):
    B, T = len(lengths), max(lengths)
    ids = np.random.default_rng(seed).integers(0, model.cfg.vocab_size, (B, T))
    keep = np.arange(T)[None] < np.array(lengths)[:, None]
    ids[~keep] = 0
    mask = np.ascontiguousarray(np.broadcast_to(M.combine(M.padding_mask(keep), M.causal_mask(T)[None, None]),
                                                (B, 1, T, T)))
    return ids, mask, np.array(lengths)


@pytest.mark.parametrize("ablate", [False, True], ids=["keep-all", "ablated"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_numpy_and_onnx_agree(family, ablate):
    model = tiny_model(family)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    ids, mask, lengths = padded_batch(model, [30, 17, 1])
    head_mask, head_mean = np.ones((3, L, H), np.float32), np.zeros((3, L, H), np.float32)
    if ablate:
        head_mask[0, 0, :2] = head_mask[1, 2, 5] = head_mask[2, 1, 3] = 0
        head_mean[0, 0, 1] = head_mean[1] = 1
    ref = model(ids, None, mask, stages=True, head_mask=head_mask, head_mean=head_mean, lengths=lengths)
    names = ["hidden", "attentions", *LM_OUTPUTS, *STAGES]
    feeds = {"input_ids": ids, "attention_mask": mask, "head_mask": head_mask, "head_mean": head_mean,
             "lengths": lengths}
    outs = dict(zip(names, onnx_session(model, stages=True).run(names, feeds)))
    assert peaked(ref.attentions[:, 0]) >= 0.5
    for b, n in enumerate(lengths):
        close(outs["attentions"][:, b, :, :n, :n], ref.attentions[:, b, :, :n, :n], 1e-5)
        for name in ("hidden", "token_logprobs"):
            close_scaled(outs[name][b, :n], getattr(ref, name)[b, :n], 1e-5)
        for name in ("q", "k"):
            close_scaled(outs[name][:, b, :, :n], ref.stages[name][:, b, :, :n], 1e-5)
    close_scaled(outs["next_token_logits"], ref.next_token_logits, 1e-5)
    if not ablate:   # keeping every head is exactly no head mask at all
        plain = model(ids, None, mask, lengths=lengths)
        assert np.array_equal(plain.hidden, ref.hidden) and np.array_equal(plain.attentions, ref.attentions)


def test_head_mask_changes_only_what_it_should():
    model = tiny_model("llama")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    ids, mask, lengths = padded_batch(model, [25])
    base = model(ids, None, mask, lengths=lengths)
    keep = np.ones((1, L, H), np.float32)
    keep[0, 1, 4] = 0
    zeroed = model(ids, None, mask, head_mask=keep, lengths=lengths)
    averaged = model(ids, None, mask, head_mask=keep, head_mean=np.ones_like(keep), lengths=lengths)
    assert np.array_equal(zeroed.attentions[:2], base.attentions[:2])   # layers up to the ablated one: same
    assert not np.allclose(zeroed.attentions[2], base.attentions[2], atol=1e-3)
    assert not np.allclose(zeroed.hidden, averaged.hidden, atol=1e-3)    # zero- and mean-ablation differ


def test_first_token_and_single_token_text():
    model = tiny_model("llama")
    ids, mask, lengths = padded_batch(model, [1])
    out = model(ids, None, mask, lengths=lengths)
    assert out.token_logprobs.shape == (1, 1) and out.token_logprobs[0, 0] == 0.0
    assert out.next_token_logits.shape == (1, model.cfg.vocab_size)
    [lp] = onnx_session(model).run(["token_logprobs"], {"input_ids": ids, "attention_mask": mask,
                                                        "head_mask": np.ones((1, 3, 6), np.float32),
                                                        "head_mean": np.zeros((1, 3, 6), np.float32),
                                                        "lengths": lengths})
    assert lp.shape == (1, 1) and lp[0, 0] == 0.0


def test_log_sum_exp_over_vocabulary_chunks_equals_one_pass(monkeypatch):
    import attnscope.model.transformer as T

    model = tiny_model("llama")
    ids, mask, lengths = padded_batch(model, [20])
    whole = model(ids, None, mask, lengths=lengths).token_logprobs
    monkeypatch.setattr(T, "VOCAB_CHUNK", 10)   # 97 words in 10 chunks, the last one short
    close_scaled(model(ids, None, mask, lengths=lengths).token_logprobs, whole, 1e-5)
    [lp] = onnx_session(model).run(["token_logprobs"], {"input_ids": ids, "attention_mask": mask,
                                                        "head_mask": np.ones((1, 3, 6), np.float32),
                                                        "head_mean": np.zeros((1, 3, 6), np.float32),
                                                        "lengths": lengths})
    close_scaled(lp, whole, 1e-5)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_state_dict_round_trip(tmp_path, tie):
    model = tiny_model("qwen2", tie)
    names = set(state_dict(model))
    assert "blocks.0.attn.q_proj.bias" in names and "blocks.0.attn.o_proj.bias" not in names
    assert "blocks.0.mlp.gate.weight" in names and "blocks.0.ln1.bias" not in names
    assert ("lm_head.weight" in names) is (not tie) and "wpe" not in names
    save_npz(model, tmp_path / "m.npz")
    clone = load_npz(Transformer(model.cfg, seed=None), tmp_path / "m.npz")
    ids = np.arange(12)[None]
    a, b = model(ids), clone(ids)
    assert np.array_equal(a.attentions, b.attentions) and np.array_equal(a.token_logprobs, b.token_logprobs)


def test_config_fills_in_and_checks():
    cfg = tiny_config("llama")
    assert (cfg.n_kv_heads, cfg.d_head) == (2, 16)
    plain = TransformerConfig(vocab_size=10, max_positions=8, d_model=32, n_heads=4, n_layers=1, d_ff=8)
    assert (plain.n_kv_heads, plain.d_head) == (4, 8)
    with pytest.raises(ValueError, match="attention='gqa'"):
        TransformerConfig(vocab_size=10, max_positions=8, d_model=32, n_heads=4, n_layers=1, d_ff=8, position="rope")
