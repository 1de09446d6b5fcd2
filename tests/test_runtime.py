"""model.runtime: NumPy and ONNX agree on every zoo model; attention invariants; errors; the ONNX file and its cache."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from attnscope.sources import zoo
from attnscope.model.masks import MASKED
from attnscope.graphs.cache import GraphCache
from attnscope.runtime import Runtime
from attnscope.model.transformer import LM_OUTPUTS, SQUARE_STAGES, STAGES, Transformer
from attnscope.model.weights import arrays, load_npz, save_npz, state_dict
from tests.conftest import OWN_PROCESS

MODEL_IDS = [m for m in zoo.ZOO if m != "smollm2" and m not in OWN_PROCESS]   # SmolLM2 (0.5 GB of weights):
# tests/test_smollm2.py; Gemma 3 270M: tests/test_gemma3_zoo.py, in a process of its own
ENGINES = ("numpy", "onnx")
# different lengths, so the batch pads (the longest first is not required; keep it in the middle)
TEXTS = ["The cat sat on the mat.",
         "A much longer sentence, so that every other text in this batch has to be padded quite a bit.",
         "hi"]
ATOL = 1e-5      # NumPy vs ONNX, fp32 (measured: attentions ~1e-6, hidden ~2e-6)
ROW_SUM = 1e-6


# ---- helpers -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(runtimes):
    """(model_id, engine, causal, stages) -> Runtime.run(TEXTS, ...) results, memoised for the module."""
    memo = {}

    def get(model_id, engine, causal, stages=False):
        key = (model_id, engine, causal, stages)
        if key not in memo:
            memo[key] = runtimes[model_id].run(TEXTS, causal=causal, engine=engine, stages=stages)
        return memo[key]

    return get


def forward_untrimmed(rt: Runtime, texts, engine, causal, mask_tokens=None):
    """The padded batch's attentions [L, B, H, T, T] before trimming, and each text's length."""
    encs = [rt.encode(t) for t in texts]
    lengths = [len(e.ids) for e in encs]
    ids = np.zeros((len(encs), max(lengths)), np.int64)
    types = np.zeros_like(ids)
    for b, e in enumerate(encs):
        ids[b, :lengths[b]], types[b, :lengths[b]] = e.ids, e.type_ids
    mask = rt.build_mask(lengths, causal, mask_tokens)
    has_types = rt.model.wtt is not None
    if engine == "numpy":
        attn = rt.model(ids, types if has_types else None, mask).attentions
    else:
        [attn] = rt.session(False).run(["attentions"], rt.feeds(ids, types, mask, lengths))
    return attn, lengths


def assert_close_scaled(actual, expected, rtol, name):
    """|a - e| <= rtol * max|e| over finite entries; masked (MASKED) entries must match exactly."""
    finite = expected > MASKED / 2
    np.testing.assert_array_equal(actual[~finite], expected[~finite], err_msg=f"{name}: masked entries differ")
    scale = max(1.0, float(np.abs(expected[finite]).max()))
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=0, atol=rtol * scale, err_msg=name)


# ---- NumPy vs ONNX -------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_numpy_and_onnx_agree(run, model_id, causal):
    ref, fast = run(model_id, "numpy", causal), run(model_id, "onnx", causal)
    assert len({len(r.tokens) for r in ref}) == len(TEXTS), "texts should have different lengths"
    for a, b in zip(ref, fast):
        assert a.tokens == b.tokens and a.attentions.shape == b.attentions.shape
        np.testing.assert_allclose(b.attentions, a.attentions, atol=ATOL, rtol=0, err_msg="attentions")
        np.testing.assert_allclose(b.hidden, a.hidden, atol=ATOL, rtol=0, err_msg="hidden")
        np.testing.assert_array_equal(a.mask, b.mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_stages_agree_between_engines(run, model_id, causal):
    ref, fast = run(model_id, "numpy", causal, stages=True), run(model_id, "onnx", causal, stages=True)
    plain = run(model_id, "numpy", causal)
    for a, b, p in zip(ref, fast, plain):
        assert set(a.stages) == set(b.stages) == set(STAGES)
        np.testing.assert_array_equal(a.attentions, p.attentions)  # asking for stages changes nothing
        np.testing.assert_allclose(b.attentions, a.attentions, atol=ATOL, rtol=0, err_msg="probs")
        for name in ("q", "k"):  # rtol: the induction head's q reaches ~300, where fp32 agrees to ~1e-6
            np.testing.assert_allclose(b.stages[name], a.stages[name], atol=ATOL, rtol=2e-6, err_msg=name)
        for name in ("scores", "scaled", "masked"):
            assert_close_scaled(b.stages[name], a.stages[name], 1e-5, name)
        # the stages are what they say: scaled = scores / sqrt(d_head), masked = scaled + mask
        d_head = a.stages["q"].shape[-1]
        np.testing.assert_allclose(a.stages["scaled"], a.stages["scores"] / np.sqrt(d_head), rtol=1e-5, atol=1e-6)
        assert np.array_equal(a.stages["masked"] <= MASKED / 2, np.broadcast_to(a.mask <= MASKED / 2, a.stages["masked"].shape))


def unwired(rt) -> np.ndarray:
    """[L, H] True for heads free to give every visible key some weight. The teaching models'
    hand-wired heads (spec.head_roles) are peaked enough that other weights underflow to 0."""
    free = np.ones((rt.cfg.n_layers, rt.cfg.n_heads), bool)
    for role in rt.spec.head_roles:
        free[role["layer"], role["head"]] = False
    return free


# ---- invariants, on both engines -----------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_rows_sum_to_one_and_padding_and_future_get_exactly_zero(runtimes, model_id, engine, causal):
    attn, lengths = forward_untrimmed(runtimes[model_id], TEXTS, engine, causal)
    T = max(lengths)
    assert attn.shape[1] == len(TEXTS) and attn.shape[-2:] == (T, T)
    np.testing.assert_allclose(attn.astype(np.float64).sum(-1), 1.0, atol=ROW_SUM, rtol=0)
    for b, n in enumerate(lengths):
        assert np.all(attn[:, b, :, :, n:] == 0.0), "padded keys must get exactly 0 from every query"
    future = np.triu(np.ones((T, T), bool), k=1)
    if causal:
        assert np.all(attn[..., future] == 0.0), "causal rows must put exactly 0 on future keys"
    else:
        n = lengths[1]
        seen = attn[:, 1, :, :n, :n][..., future[:n, :n]]                  # [L, H, future cells]
        assert np.all(seen[unwired(runtimes[model_id])] > 0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_trimmed_rows_sum_to_one(run, model_id, engine):
    for res in run(model_id, engine, zoo.get(model_id).kind == "decoder"):
        np.testing.assert_allclose(res.attentions.astype(np.float64).sum(-1), 1.0, atol=ROW_SUM, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_mask_tokens_get_exactly_zero_from_every_other_query(runtimes, model_id, engine, causal):
    keys = [[1, 3], [2, 5, 0], []]
    results = runtimes[model_id].run(TEXTS, causal=causal, engine=engine, mask_tokens=keys)
    for res, masked in zip(results, keys):
        assert res.mask_tokens == sorted(masked)
        T = len(res.tokens)
        np.testing.assert_allclose(res.attentions.astype(np.float64).sum(-1), 1.0, atol=ROW_SUM, rtol=0)
        for j in masked:
            others = np.arange(T) != j
            assert np.all(res.attentions[:, :, others, j] == 0.0), f"masked key {j} is still attended to"
            seen = res.attentions[:, :, j, j][unwired(runtimes[model_id])]   # a wired head may look away
            assert np.all(seen > 0), f"masked key {j} must still see itself"
        unmasked = [j for j in range(T) if j not in masked]
        if not causal and unmasked:
            assert np.all(res.attentions[:, :, :, unmasked][unwired(runtimes[model_id])] > 0)


# ---- errors a person can act on ------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text_is_rejected(runtimes, text):
    for rt in runtimes.values():
        with pytest.raises(ValueError, match="empty"):
            rt.run(text)
        with pytest.raises(ValueError, match="empty"):
            rt.run(["fine", text])


@pytest.mark.parametrize("bad", [99, -1])
def test_mask_token_out_of_range_names_the_range(minilm, bad):
    n = len(minilm.encode("hello world").ids)
    with pytest.raises(ValueError, match=rf"out of range.*0\.\.{n - 1}"):
        minilm.run("hello world", mask_tokens=[[bad]])


def test_pair_on_a_decoder_says_it_takes_a_single_text(runtimes):
    assert zoo.get("tiny-gpt").pair is False
    with pytest.raises(ValueError, match="single text"):
        runtimes["tiny-gpt"].run(["first sentence"], ["second sentence"])


def test_unknown_model_lists_available_models():
    with pytest.raises(KeyError) as err:
        zoo.get("no-such-model")
    message = str(err.value)
    assert "no-such-model" in message
    assert all(model_id in message for model_id in zoo.ZOO)


# ---- the ONNX file and its cache -----------------------------------------------------------
@pytest.mark.parametrize("stages", [False, True])
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_onnx_file_is_valid_with_dynamic_axes(runtimes, model_id, stages):
    rt = runtimes[model_id]
    path = rt.onnx_path(stages)
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path))
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17

    def dims(value_info):
        return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]

    inputs = {v.name: dims(v) for v in proto.graph.input}
    expected_inputs = (["input_ids"] + (["token_type_ids"] if rt.model.wtt is not None else []) +
                       ["attention_mask", "head_mask", "head_mean", "lengths"])
    assert list(inputs)[:len(expected_inputs)] == expected_inputs
    # the rest are the model's arrays, named as model/weights.arrays names them, in their shapes and stored types: the
    # graph holds no weight (no initializer bigger than a constant) and reads every one it needs
    weights = {v.name: v for v in proto.graph.input[len(expected_inputs):]}
    named = arrays(rt.model)
    assert set(weights) <= set(named) and set(state_dict(rt.model)) <= set(weights)
    for name, v in weights.items():
        assert dims(v) == list(named[name].shape)
        assert v.type.tensor_type.elem_type == onnx.helper.np_dtype_to_tensor_dtype(named[name].dtype)
    assert all(np.prod(t.dims) < 2**16 for t in proto.graph.initializer)
    assert inputs["input_ids"] == ["batch", "tokens"]
    if "token_type_ids" in inputs:
        assert inputs["token_type_ids"] == ["batch", "tokens"]
    assert inputs["attention_mask"][0] == "batch" and inputs["attention_mask"][2:] == ["tokens", "tokens"]
    assert inputs["head_mask"] == inputs["head_mean"] == ["batch", rt.cfg.n_layers, rt.cfg.n_heads]
    assert inputs["lengths"] == ["batch"]

    outputs = {v.name: dims(v) for v in proto.graph.output}
    lm = list(LM_OUTPUTS) if rt.cfg.lm_head else []
    assert list(outputs) == ["hidden"] + lm + ["attentions"] + (list(STAGES) if stages else []) + ["value_norms"]
    assert outputs["value_norms"] == ["layers", "batch", "heads", "tokens"]     # each key's ||v_j W_O^h||
    assert outputs["hidden"] == ["batch", "tokens", rt.cfg.d_model]
    assert outputs["attentions"][1] == "batch" and outputs["attentions"][3:] == ["tokens", "tokens"]
    for name in STAGES if stages else ():
        if name == "x":   # what the projections read: one per layer, not per head
            assert outputs[name] == ["layers", "batch", "tokens", rt.cfg.d_model]
            continue
        assert outputs[name][1] == "batch" and outputs[name][3] == "tokens"
        assert outputs[name][4] == ("tokens" if name in SQUARE_STAGES else rt.cfg.d_head)


@pytest.fixture
def fresh_tiny(tmp_path):
    """A tiny-gpt Runtime of its own, caching into a temporary folder (the shared cache is left alone)."""
    return Runtime(zoo.get("tiny-gpt"), cache_dir=tmp_path)


def test_changed_cache_key_rebuilds(fresh_tiny, tmp_path, monkeypatch):
    first = fresh_tiny.onnx_path()
    assert first.parent == tmp_path and first.is_file()
    monkeypatch.setattr(GraphCache, "key", property(lambda self: "0123456789abcdef"))
    second = fresh_tiny.onnx_path()
    assert second != first and second.is_file() and "0123456789abcdef" in second.name


def test_graphs_hold_no_weights_and_the_cache_key_follows_the_shapes(tmp_path):
    """A graph reads the weights it is bound at run time (runtime/tensors.Weights): other weights of the same shapes
    read the same graph (same key), and give their own answer; another shape or stored type is another graph."""
    a, b = Runtime(zoo.get("tiny-gpt"), cache_dir=tmp_path), Runtime(zoo.get("tiny-gpt"), cache_dir=tmp_path)
    assert a.cache_key() == b.cache_key()
    attn = b.model.blocks[2].attn                                      # a seeded random layer (0-1 are wired)
    attn.params["in_proj_weight"] = attn.params["in_proj_weight"] * 3  # sharper patterns, same shapes
    b.graphs._key = None  # the key is memoised per Runtime; a changed model is a new Runtime in practice
    b.weights = type(b.weights)(b.model)
    assert a.cache_key() == b.cache_key() and a.onnx_path() == b.onnx_path()
    [ra], [rb] = a.run(["The cat sat on the mat"]), b.run(["The cat sat on the mat"])
    [ref] = b.run(["The cat sat on the mat"], engine="numpy")
    np.testing.assert_allclose(rb.attentions, ref.attentions, atol=1e-5)
    assert np.abs(ra.attentions[2] - rb.attentions[2]).max() > 0.05
    attn.params["in_proj_weight"] = attn.params["in_proj_weight"].astype(np.float16)
    b.graphs._key = None
    assert a.cache_key() != b.cache_key()


def test_corrupt_cached_graph_is_rebuilt(fresh_tiny, caplog):
    path = fresh_tiny.onnx_path()
    path.write_bytes(b"this is not an onnx file \x00\xff" * 64)
    session = fresh_tiny.session()
    assert "rebuilding" in caplog.text
    onnx.checker.check_model(str(path), full_check=True)
    assert session is fresh_tiny.session()
    [a] = fresh_tiny.run(TEXTS[0], engine="onnx")
    [b] = fresh_tiny.run(TEXTS[0], engine="numpy")
    np.testing.assert_allclose(a.attentions, b.attentions, atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_weights_npz_round_trip(runtimes, model_id, tmp_path):
    rt = runtimes[model_id]
    path = tmp_path / f"{model_id}.npz"
    save_npz(rt.model, path)
    clone = load_npz(Transformer(rt.cfg, seed=rt.cfg.n_layers + 99), path)  # different random init, overwritten
    ids = np.array([rt.encode(TEXTS[0]).ids])
    a, b = rt.model(ids), clone(ids)
    np.testing.assert_array_equal(a.attentions, b.attentions)
    np.testing.assert_array_equal(a.hidden, b.hidden)
