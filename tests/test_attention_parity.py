"""Parity of model.attention.MultiHeadAttention with torch.nn.MultiheadAttention (batch_first=True).

Both modules hold the same tensors (ours loads torch's state dict), run on the same inputs and masks,
and must give the same outputs and attention weights to 1e-5. Torch's biases start at zero, so every
parameter is re-drawn at random first: a bias bug cannot hide behind zeros. No case masks a whole
query row, where torch gives NaN and we spread evenly by design.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attnscope.model.attention import MultiHeadAttention

E, H = 8, 2          # embed_dim, num_heads (head_dim 4)
B = 3                # batch
T_SELF = 6           # self-attention length
TQ, S = 5, 9         # cross-attention: query and key lengths
KDIM, VDIM = 6, 10   # cross-attention key / value feature sizes
ATOL = 1e-5


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, atol=ATOL, rtol=0)


def make_pair(seed: int, *, bias=True, add_bias_kv=False, add_zero_attn=False, cross=False,
              temperature=1.0, causal=False):
    """A torch MHA with random parameters, and ours loaded with the same (temperature folded into torch's q)."""
    torch.manual_seed(seed)
    kdim, vdim = (KDIM, VDIM) if cross else (None, None)
    ref = torch.nn.MultiheadAttention(E, H, bias=bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                                      kdim=kdim, vdim=vdim, batch_first=True).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = MultiHeadAttention(E, H, bias=bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                              kdim=kdim, vdim=vdim, temperature=temperature, causal=causal)
    ours.load_state_dict(ref.state_dict())
    if temperature != 1.0:
        # scores / T == (q / T) . k: scale torch's q projection (weight rows and bias) by 1/T.
        with torch.no_grad():
            qw = ref.in_proj_weight if ref._qkv_same_embed_dim else ref.q_proj_weight
            qw[:E] /= temperature
            if bias:
                ref.in_proj_bias[:E] /= temperature
    return ours, ref


def make_inputs(seed: int, cross: bool, batched: bool = True):
    g = torch.Generator().manual_seed(seed + 1000)
    lead = (B,) if batched else ()
    if cross:
        q = torch.randn(*lead, TQ, E, generator=g)
        k = torch.randn(*lead, S, KDIM, generator=g)
        v = torch.randn(*lead, S, VDIM, generator=g)
        return q, k, v
    x = torch.randn(*lead, T_SELF, E, generator=g)
    return x, x, x


def torch_forward(ref, q, k, v, **kw):
    with torch.no_grad():
        out, w = ref(q, k, v, **kw)
    return out.numpy(), None if w is None else w.numpy()


def ours_forward(ours, q, k, v, **kw):
    return ours(q.numpy(), k.numpy(), v.numpy(), **kw)


def key_padding(tk: int, batch: int = B) -> np.ndarray:
    """[batch, tk] with True on the last b keys of batch row b (row 0 unpadded), never all keys."""
    kpm = np.zeros((batch, tk), bool)
    for b in range(batch):
        if b:
            kpm[b, tk - b:] = True
    return kpm


def random_bool_mask(rng: np.random.Generator, shape) -> np.ndarray:
    """Random True (= masked) entries, with key 0 always kept so no query row is fully masked."""
    m = rng.random(shape) < 0.4
    m[..., 0] = False
    return m


MASK_KINDS = ["none", "padding", "bool2d", "bool3d", "float2d", "float3d", "causal", "causal+padding",
              "float2d+padding", "bool2d+padding"]


def build_masks(kind: str, tq: int, tk: int, seed: int):
    """(kwargs for ours, kwargs for torch) for one mask kind."""
    rng = np.random.default_rng(seed)
    ours_kw, ref_kw = {}, {}
    if "padding" in kind:
        kpm = key_padding(tk)
        ours_kw["key_padding_mask"] = kpm
        if "float" in kind:   # torch wants both masks of one type: padding as additive -inf there
            ref_kw["key_padding_mask"] = torch.zeros(B, tk).masked_fill(torch.from_numpy(kpm), float("-inf"))
        else:
            ref_kw["key_padding_mask"] = torch.from_numpy(kpm)
    if kind.startswith("bool2d"):
        m = random_bool_mask(rng, (tq, tk))
    elif kind.startswith("bool3d"):
        m = random_bool_mask(rng, (B * H, tq, tk))
    elif kind.startswith("float2d"):
        m = rng.standard_normal((tq, tk)).astype(np.float32)
    elif kind.startswith("float3d"):
        m = rng.standard_normal((B * H, tq, tk)).astype(np.float32)
    else:
        m = None
    if m is not None:
        ours_kw["attn_mask"] = m
        ref_kw["attn_mask"] = torch.from_numpy(m)
    if kind.startswith("causal"):
        ours_kw["causal"] = True
        ref_kw["attn_mask"] = torch.triu(torch.ones(tq, tk), 1).bool()
    return ours_kw, ref_kw


EXTRAS = {"plain": {}, "bias_kv": {"add_bias_kv": True}, "zero_attn": {"add_zero_attn": True},
          "bias_kv+zero_attn": {"add_bias_kv": True, "add_zero_attn": True}}


@pytest.mark.parametrize("average", [True, False], ids=["avg", "per_head"])
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_parity(bias, cross, extra, mask_kind, average):
    seed = 1 + 7 * bias + 13 * cross + 31 * list(EXTRAS).index(extra) + 101 * MASK_KINDS.index(mask_kind)
    ours, ref = make_pair(seed, bias=bias, cross=cross, **EXTRAS[extra])
    q, k, v = make_inputs(seed, cross)
    ours_kw, ref_kw = build_masks(mask_kind, q.shape[1], k.shape[1], seed)
    out, w = ours_forward(ours, q, k, v, average_attn_weights=average, **ours_kw)
    ref_out, ref_w = torch_forward(ref, q, k, v, average_attn_weights=average, **ref_kw)
    assert out.shape == ref_out.shape and w.shape == ref_w.shape
    extra_keys = ("bias_kv" in extra) + ("zero_attn" in extra)
    tq = TQ if cross else T_SELF
    assert w.shape == ((B, tq) if average else (B, H, tq)) + (k.shape[1] + extra_keys,)
    close(out, ref_out)
    close(w, ref_w)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
@pytest.mark.parametrize("mask_kind", ["none", "causal+padding"])
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_parity_temperature(bias, cross, mask_kind, temperature):
    seed = 500 + 7 * bias + 13 * cross + int(temperature * 10)
    ours, ref = make_pair(seed, bias=bias, cross=cross, temperature=temperature, add_bias_kv=True)
    q, k, v = make_inputs(seed, cross)
    ours_kw, ref_kw = build_masks(mask_kind, q.shape[1], k.shape[1], seed)
    out, w = ours_forward(ours, q, k, v, average_attn_weights=False, **ours_kw)
    ref_out, ref_w = torch_forward(ref, q, k, v, average_attn_weights=False, **ref_kw)
    close(out, ref_out)
    close(w, ref_w)


def test_temperature_changes_the_weights():
    """The temperature test above would pass vacuously if temperature were ignored on both sides."""
    ours, _ = make_pair(3)
    hot, _ = make_pair(3, temperature=2.0)
    q, k, v = make_inputs(3, cross=False)
    _, w1 = ours_forward(ours, q, k, v)
    _, w2 = ours_forward(hot, q, k, v)
    assert np.abs(w1 - w2).max() > 1e-3
    # hotter is flatter: higher entropy in every row
    ent = lambda w: -(w * np.log(w)).sum(-1)
    assert (ent(w2) > ent(w1)).all()


@pytest.mark.parametrize("average", [True, False], ids=["avg", "per_head"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool2d", "float2d"])
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_parity_unbatched(cross, mask_kind, average):
    seed = 700 + 13 * cross + MASK_KINDS.index(mask_kind)
    ours, ref = make_pair(seed, cross=cross, add_bias_kv=True, add_zero_attn=True)
    q, k, v = make_inputs(seed, cross, batched=False)
    ours_kw, ref_kw = build_masks(mask_kind, q.shape[0], k.shape[0], seed)
    out, w = ours_forward(ours, q, k, v, average_attn_weights=average, **ours_kw)
    ref_out, ref_w = torch_forward(ref, q, k, v, average_attn_weights=average, **ref_kw)
    assert out.ndim == 2 and w.ndim == (2 if average else 3)
    close(out, ref_out)
    close(w, ref_w)


@pytest.mark.parametrize("kind", ["B,H,Tq,S", "1,H,Tq,S", "B,1,Tq,S", "B,1,1,S", "float B,H,Tq,S"])
def test_parity_4d_attn_mask(kind):
    """Our 4-D mask forms against torch given the same mask expanded to its (B*H, Tq, S) form."""
    ours, ref = make_pair(9, cross=True, add_zero_attn=True)
    q, k, v = make_inputs(9, cross=True)
    rng = np.random.default_rng(9)
    dims = kind.split()[-1].split(",")
    shape = tuple({"B": B, "H": H, "Tq": TQ, "S": S, "1": 1}[d] for d in dims)
    m = rng.standard_normal(shape).astype(np.float32) if kind.startswith("float") else random_bool_mask(rng, shape)
    full = np.broadcast_to(m, (B, H, TQ, S)).reshape(B * H, TQ, S).copy()
    out, w = ours_forward(ours, q, k, v, attn_mask=m, average_attn_weights=False)
    ref_out, ref_w = torch_forward(ref, q, k, v, attn_mask=torch.from_numpy(full), average_attn_weights=False)
    close(out, ref_out)
    close(w, ref_w)


def test_parity_unbatched_key_padding():
    ours, ref = make_pair(11)
    x = make_inputs(11, cross=False, batched=False)[0]
    kpm = np.zeros(T_SELF, bool)
    kpm[-2:] = True
    out, w = ours(x.numpy(), key_padding_mask=kpm)
    ref_out, ref_w = torch_forward(ref, x, x, x, key_padding_mask=torch.from_numpy(kpm))
    close(out, ref_out)
    close(w, ref_w)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_need_weights_false(cross, batched):
    ours, ref = make_pair(21, cross=cross)
    q, k, v = make_inputs(21, cross, batched=batched)
    out, w = ours_forward(ours, q, k, v, need_weights=False)
    ref_out, ref_w = torch_forward(ref, q, k, v, need_weights=False)
    assert w is None and ref_w is None
    close(out, ref_out)


def test_self_attention_key_value_default_to_query():
    ours, ref = make_pair(31, add_bias_kv=True)
    x = make_inputs(31, cross=False)[0]
    out, w = ours(x.numpy())
    ref_out, ref_w = torch_forward(ref, x, x, x)
    close(out, ref_out)
    close(w, ref_w)


@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_state_dict_round_trip(bias, cross, extra):
    """Ours (own random init) -> state_dict -> torch: same outputs; and the names match torch's exactly."""
    kdim, vdim = (KDIM, VDIM) if cross else (None, None)
    ours = MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, seed=5, **EXTRAS[extra])
    ours.params = {n: np.random.default_rng(i).standard_normal(p.shape).astype(np.float32) * 0.5
                   for i, (n, p) in enumerate(ours.params.items())}   # non-zero biases too
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=True,
                                      **EXTRAS[extra]).eval()
    sd = ours.state_dict()
    assert set(sd) == set(ref.state_dict())
    ref.load_state_dict({n: torch.from_numpy(a) for n, a in sd.items()}, strict=True)
    q, k, v = make_inputs(41, cross)
    out, w = ours_forward(ours, q, k, v, key_padding_mask=key_padding(k.shape[1]))
    ref_out, ref_w = torch_forward(ref, q, k, v, key_padding_mask=torch.from_numpy(key_padding(k.shape[1])))
    close(out, ref_out)
    close(w, ref_w)
    # and back again: torch's copy into a fresh module of ours reproduces the same numbers
    again = MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, seed=99, **EXTRAS[extra])
    again.load_state_dict(ref.state_dict())
    out2, w2 = ours_forward(again, q, k, v, key_padding_mask=key_padding(k.shape[1]))
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(w2, w)


def test_state_dict_is_a_copy():
    ours = MultiHeadAttention(E, H)
    sd = ours.state_dict()
    sd["in_proj_weight"][:] = 0
    assert np.abs(ours.params["in_proj_weight"]).sum() > 0


# ---- invariants ------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_kind", ["none", "padding", "bool3d", "float2d", "causal+padding"])
@pytest.mark.parametrize("extra", list(EXTRAS))
def test_rows_sum_to_one(extra, mask_kind):
    ours, _ = make_pair(51, cross=True, **EXTRAS[extra])
    q, k, v = make_inputs(51, cross=True)
    ours_kw, _ = build_masks(mask_kind, TQ, S, 51)
    _, w = ours_forward(ours, q, k, v, average_attn_weights=False, **ours_kw)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6, rtol=0)
    assert (w >= 0).all()


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("how", ["constructor", "call"])
def test_causal_future_is_exactly_zero(cross, how):
    ours, _ = make_pair(61, cross=cross, causal=how == "constructor")
    q, k, v = make_inputs(61, cross)
    kw = {"causal": True} if how == "call" else {}
    _, w = ours_forward(ours, q, k, v, average_attn_weights=False, **kw)
    tq, tk = w.shape[-2:]
    future = np.triu(np.ones((tq, tk), bool), 1)
    assert (w[..., future] == 0.0).all()
    assert (w[..., ~future] > 0.0).all()   # and nothing else is masked


def test_causal_call_argument_overrides_constructor():
    ours, _ = make_pair(62, causal=True)
    x = make_inputs(62, cross=False)[0].numpy()
    _, w_off = ours(x, causal=False)
    assert (w_off > 0).all()


def test_causal_with_bias_kv_and_zero_attn_keeps_extra_keys_visible():
    ours, _ = make_pair(63, add_bias_kv=True, add_zero_attn=True, causal=True)
    x = make_inputs(63, cross=False)[0].numpy()
    _, w = ours(x, average_attn_weights=False)
    future = np.triu(np.ones((T_SELF, T_SELF), bool), 1)
    assert (w[..., :T_SELF][..., future] == 0.0).all()
    assert (w[..., T_SELF:] > 0).all()


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("average", [True, False], ids=["avg", "per_head"])
def test_padded_keys_get_exactly_zero(cross, average):
    ours, _ = make_pair(71, cross=cross)
    q, k, v = make_inputs(71, cross)
    kpm = key_padding(k.shape[1])
    _, w = ours_forward(ours, q, k, v, key_padding_mask=kpm, average_attn_weights=average)
    for b in range(B):
        wb = w[b]                                   # [Tq, S] or [H, Tq, S]
        assert (wb[..., kpm[b]] == 0.0).all()
        assert (wb[..., ~kpm[b]] > 0.0).all()


def test_padding_does_not_change_unpadded_batch_rows():
    """Padding row 1's keys leaves row 0 (no padding) bit-identical."""
    ours, _ = make_pair(72)
    x = make_inputs(72, cross=False)[0].numpy()
    out_a, w_a = ours(x)
    out_b, w_b = ours(x, key_padding_mask=key_padding(T_SELF))
    np.testing.assert_array_equal(out_a[0], out_b[0])
    np.testing.assert_array_equal(w_a[0], w_b[0])


def test_fully_masked_row_spreads_evenly_not_nan():
    """Our documented difference from torch: a query with every key masked attends uniformly."""
    ours, _ = make_pair(73)
    x = make_inputs(73, cross=False)[0].numpy()
    kpm = np.zeros((B, T_SELF), bool)
    kpm[1] = True
    out, w = ours(x, key_padding_mask=kpm)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(w[1], 1.0 / T_SELF, atol=1e-6, rtol=0)


def test_dropout_is_identity_at_inference():
    a, _ = make_pair(81)
    b = MultiHeadAttention(E, H, dropout=0.5)
    b.load_state_dict(a.state_dict())
    x = make_inputs(81, cross=False)[0].numpy()
    for got, want in zip(b(x), a(x)):
        np.testing.assert_array_equal(got, want)


def test_return_stages_are_consistent():
    ours, _ = make_pair(91, temperature=2.0)
    x = make_inputs(91, cross=False)[0].numpy()
    out, w, stages, (q, k, v) = ours(x, causal=True, average_attn_weights=False, return_stages=True)
    np.testing.assert_allclose(stages.scaled, stages.scores / (np.sqrt(E // H) * 2.0), atol=1e-6, rtol=1e-6)
    np.testing.assert_array_equal(stages.probs, w)
    assert q.shape == (B, H, T_SELF, E // H)


# ---- error messages --------------------------------------------------------------------------

def test_error_num_heads_must_divide_embed_dim():
    with pytest.raises(ValueError, match=r"num_heads must divide embed_dim.*10.*3"):
        MultiHeadAttention(10, 3)


@pytest.mark.parametrize("embed_dim, num_heads", [(0, 1), (8, 0), (-8, 2)])
def test_error_non_positive_sizes(embed_dim, num_heads):
    with pytest.raises(ValueError, match="must be positive"):
        MultiHeadAttention(embed_dim, num_heads)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_error_temperature(temperature):
    with pytest.raises(ValueError, match=r"temperature must be > 0"):
        MultiHeadAttention(E, H, temperature=temperature)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5])
def test_error_dropout(dropout):
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        MultiHeadAttention(E, H, dropout=dropout)


@pytest.mark.parametrize("shape", [(T_SELF, T_SELF + 1), (H, T_SELF, T_SELF), (B * H + 1, T_SELF, T_SELF),
                                   (2, H, T_SELF, T_SELF), (T_SELF,)])
def test_error_attn_mask_shape(shape):
    ours = MultiHeadAttention(E, H)
    x = np.zeros((B, T_SELF, E), np.float32)
    with pytest.raises(ValueError) as info:
        ours(x, attn_mask=np.zeros(shape, bool))
    msg = str(info.value)
    assert f"attn_mask has shape {shape}" in msg
    for expected in ["(Tq, S) = (6, 6)", "(batch*num_heads, Tq, S) = (6, 6, 6)", "(B|1, H|1, Tq"]:
        assert expected in msg


@pytest.mark.parametrize("shape", [(B, T_SELF + 1), (T_SELF,), (B, 1, T_SELF)])
def test_error_key_padding_mask_shape(shape):
    ours = MultiHeadAttention(E, H)
    x = np.zeros((B, T_SELF, E), np.float32)
    with pytest.raises(ValueError, match=r"key_padding_mask has shape .*expected \(batch, keys\) = \(3, 6\)"):
        ours(x, key_padding_mask=np.zeros(shape, bool))


def test_error_mask_dtype():
    ours = MultiHeadAttention(E, H)
    x = np.zeros((B, T_SELF, E), np.float32)
    with pytest.raises(TypeError, match="boolean .* or additive float"):
        ours(x, attn_mask=np.zeros((T_SELF, T_SELF), np.int64))


def test_error_key_features_vs_kdim():
    ours = MultiHeadAttention(E, H)
    q = np.zeros((B, TQ, E), np.float32)
    k = np.zeros((B, S, KDIM), np.float32)
    with pytest.raises(ValueError, match=r"key has 6 features but kdim is 8; construct with kdim=6"):
        ours(q, k, k)


def test_error_value_features_vs_vdim():
    ours = MultiHeadAttention(E, H, kdim=KDIM)
    q = np.zeros((B, TQ, E), np.float32)
    k = np.zeros((B, S, KDIM), np.float32)
    with pytest.raises(ValueError, match=r"value has 6 features but vdim is 8; construct with vdim=6"):
        ours(q, k, k)


def test_error_query_features():
    ours = MultiHeadAttention(E, H)
    with pytest.raises(ValueError, match=r"query has 5 features; this module's embed_dim is 8"):
        ours(np.zeros((B, T_SELF, 5), np.float32))


@pytest.mark.parametrize("kshape, vshape", [((B, S, E), (B, S + 1, E)), ((B + 1, S, E), (B + 1, S, E))])
def test_error_batch_or_length_mismatch(kshape, vshape):
    ours = MultiHeadAttention(E, H)
    with pytest.raises(ValueError, match="must share the batch size"):
        ours(np.zeros((B, TQ, E), np.float32), np.zeros(kshape, np.float32), np.zeros(vshape, np.float32))


def test_error_mixed_batched_and_unbatched():
    ours = MultiHeadAttention(E, H)
    with pytest.raises(ValueError, match=r"must all be \[batch, time, features\]"):
        ours(np.zeros((B, TQ, E), np.float32), np.zeros((S, E), np.float32), np.zeros((S, E), np.float32))


def test_error_load_state_dict_missing_and_unexpected():
    ours = MultiHeadAttention(E, H)       # same dims: in_proj_weight, biases, no bias_k/bias_v
    sd = ours.state_dict()
    del sd["in_proj_bias"]
    sd["bias_k"] = np.zeros((1, 1, E), np.float32)
    with pytest.raises(KeyError, match=r"missing \['in_proj_bias'\], unexpected \['bias_k'\]"):
        ours.load_state_dict(sd)


def test_error_load_state_dict_from_differently_configured_torch_module():
    ref = torch.nn.MultiheadAttention(E, H, kdim=KDIM, vdim=VDIM, add_bias_kv=True, batch_first=True)
    ours = MultiHeadAttention(E, H)
    with pytest.raises(KeyError, match=r"missing \['in_proj_weight'\].*unexpected \['bias_k', 'bias_v', "
                                       r"'k_proj_weight', 'q_proj_weight', 'v_proj_weight'\]"):
        ours.load_state_dict(ref.state_dict())


@pytest.mark.parametrize("name, shape", [("in_proj_weight", (3 * E, E + 1)), ("out_proj.bias", (E, 1)),
                                         ("in_proj_bias", (2 * E,))])
def test_error_load_state_dict_wrong_shape(name, shape):
    ours = MultiHeadAttention(E, H)
    before = ours.state_dict()
    sd = ours.state_dict()
    sd[name] = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match=rf"{name} has shape \({shape[0]}, ?.*\); this module needs"):
        ours.load_state_dict(sd)
    for n, a in ours.state_dict().items():      # a failed load leaves the module untouched
        np.testing.assert_array_equal(a, before[n])
