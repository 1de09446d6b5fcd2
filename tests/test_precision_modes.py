"""The fast modes (model/precision.py COMPUTE_DTYPES, issue 38): float16 products on the CPU provider, within a bound
derived for them, labelled in every answer; float32 untouched; the modes the device cannot run refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from attnscope.graphs import layers
from attnscope.graphs.reduced import reduce_products, reduced_products
from attnscope.runtime.layerwise import superset
from attnscope.runtime.options import open_session

from .conftest import PROVIDERS
from .float32 import ULPS, U, assert_within, reduced_bound

TEXT = "The cat sat on"            # 4 tokens: the bound runs 16 float64 copies of SmolLM2 on them
FLOAT16_UNIT = 2.0 ** -11        # float16's unit roundoff (10 stored mantissa bits)


@pytest.fixture(scope="module")
def smollm2(runtimes):
    return runtimes["smollm2"]


def _products(proto: onnx.ModelProto):
    return [n for n in proto.graph.node if n.op_type == "MatMul"]


def test_float16_graph_reduces_the_model_products_and_keeps_every_reduction_float32(minilm):
    """Proves the transform (graphs/reduced.py): in the served graph every product of the model reads float16
    operands, and the only ones left in float32 are the head-mean ablation's average over token positions (a
    reduction); in the layer-by-layer attention graph with every statistic and thumbnail, exactly the head's two
    products (scores, weighted values) are reduced, every pooling/statistic product stays float32. The served
    graph's reduced forms (float16, and bfloat16 the same products) pass onnx.checker (full check); the attention
    graph's (whose outputs declare no shape,
    which the checker refuses in float32 too) opens in onnxruntime as a session does."""
    served = onnx.load(str(minilm.onnx_path()))
    reduced = reduce_products(served, "float16")
    onnx.checker.check_model(reduced, full_check=True)
    fast = {n.output[0] for n in reduced_products(reduced)}
    kept = [n for n in _products(reduced) if n.output[0] not in fast]
    assert len(fast) == len(_products(served)) - minilm.cfg.n_layers > 0
    assert len(kept) == minilm.cfg.n_layers and all(n.input[0].startswith("position_weights") for n in kept)
    bf16 = reduce_products(served, "bfloat16")          # runs on the CUDA provider only: checked, not run, here
    onnx.checker.check_model(bf16, full_check=True)
    assert [n.output[0].split(".bfloat16")[0] for n in reduced_products(bf16)] == \
        [n.output[0].split(".float16")[0] for n in reduced_products(reduced)]

    attend = layers.build_attend(minilm.model, superset(("attend", ("thumbnail",), False))[1], False)
    reduced = reduce_products(attend, "float16")
    open_session(attend.SerializeToString(), PROVIDERS, 1, compute_dtype="float16")
    fast = reduced_products(reduced)     # each named after the product it replaces: NAME_i.float16_j
    assert len(_products(attend)) > 2 and len(fast) == 2
    assert {n.output[0].split(".float16")[0].rsplit("_", 1)[0] for n in fast} == {"attend.scores", "attend.ctx"}


@pytest.mark.slow
def test_float16_smollm2_within_its_derived_bound_and_float32_unchanged(smollm2, hf_smollm2):
    """Proves the float16 mode's numbers on a real model: SmolLM2's attention and next-token logits with float16
    products are within the bound derived for float16 products (tests/float32.py reduced_bound: each product's
    operands and result rounded at float16's unit roundoff 2^-11, its sum and everything else at float32's, propagated
    through transformers' float64 model on 16 perturbed copies; at 4.6e-11 per element, ~25x the error seen), its top-1
    is float64's wherever float64's top two are further apart than the bound, its rows sum to 1 within float32's
    error of a softmax (the softmax ran in float32), and it really ran reduced (not float32's numbers). And the
    float32 option is the default, bit for bit: its runtime's key and numbers are those of a runtime without it."""
    fast = smollm2.with_compute_dtype("float16")
    r16, r32 = fast(TEXT), smollm2(TEXT)
    T, L, H = len(r16.tokens), smollm2.cfg.n_layers, smollm2.cfg.n_heads
    exact, bound = reduced_bound(
        hf_smollm2, lambda o: torch.cat([torch.stack(o.attentions, 1).flatten(1), o.logits[:, -1]], 1),
        FLOAT16_UNIT, samples=16, input_ids=torch.tensor([r16.token_ids]), output_attentions=True,
        logits_to_keep=1)
    cells = L * H * T * T
    assert_within(r16.attentions.reshape(-1), exact[:cells], bound[:cells], "float16 attention")
    assert_within(r16.next_token_logits, exact[cells:], bound[cells:], "float16 next-token logits")
    first, second = np.sort(exact[cells:])[::-1][:2]
    if first - second > 2 * bound[cells:].max():
        assert int(np.argmax(r16.next_token_logits)) == int(np.argmax(exact[cells:]))
    # softmax in float32: the sum's T - 1 roundings, one division (or a reciprocal and a product), ULPS each for an
    # exp and a log where a kernel normalises by exp(x - max - log s)
    assert np.abs(r16.attentions.astype(np.float64).sum(-1) - 1).max() <= (T + 2 * ULPS + 2) * U
    assert (r16.attentions != r32.attentions).any()

    plain = fast.with_compute_dtype("float32")          # fresh sessions, the option given
    assert plain.key == smollm2.key != fast.key
    again = plain(TEXT)
    assert np.array_equal(again.attentions, r32.attentions) and np.array_equal(again.next_token_logits,
                                                                                 r32.next_token_logits)


def test_fast_mode_is_labelled_in_models_and_answers(smollm2, local_smollm2):
    """Proves the labels: a float16 model's capabilities (/api/models) and its answers say float16, with a warning
    naming the mode (a generation's last line too); its NumPy-engine answers say float32 (the reference always computes float32); a float32 model's
    answers say float32 with no such warning."""
    import attnscope

    model = attnscope.Model(smollm2.with_compute_dtype("float16"))
    try:
        assert model.models()[0]["capabilities"]["compute_dtype"] == "float16"
        ans = model.attention(TEXT, layers=[0], heads=[0])
        assert ans["compute_dtype"] == "float16" and any("float16" in w and "README" in w for w in ans["warnings"])
        ref = model.attention(TEXT, layers=[0], heads=[0], engine="numpy")
        assert ref["compute_dtype"] == "float32" and ref["warnings"] == []
        assert model.generate(TEXT, max_new_tokens=1, greedy=True).result()["compute_dtype"] == "float16"
    finally:
        model.close()
    ans = local_smollm2.attention(TEXT, layers=[0], heads=[0])
    assert ans["compute_dtype"] == "float32" and ans["warnings"] == []


@pytest.mark.parametrize("mode", ["tf32", "bfloat16"])
def test_modes_the_cpu_cannot_run_are_refused_at_start(mode, smollm2):
    """Proves the refusal: on the CPU provider (named, so that it holds on a GPU machine too) tf32 and bfloat16 are
    refused before anything loads, by the runtime (ValueError) and by the server's start (one line naming the
    setting and the fix)."""
    from attnscope.app.errors import StartupError
    from attnscope.app.service import AttentionService
    from attnscope.app.settings import Settings
    from attnscope.runtime.runtime import Runtime

    with pytest.raises(ValueError, match=f"compute_dtype {mode} needs the CUDA execution provider"):
        Runtime(smollm2.spec, ["CPUExecutionProvider"], cache_dir=smollm2.cache_dir, compute_dtype=mode)
    with pytest.raises(StartupError, match=f"ATTNSCOPE_COMPUTE_DTYPE.*{mode} needs the CUDA execution provider.*fix:"):
        AttentionService(Settings(models=["tiny-gpt"], providers=["CPUExecutionProvider"],
                                  compute_dtype=mode)).resolve()


def test_a_fast_mode_onnxruntime_cannot_open_is_refused_and_the_graph_kept(runtimes, monkeypatch):
    """Proves a mode's failure is reported as the mode's, not taken for a corrupt file: when a fast mode's form of a
    good cached graph will not open (here: a transform made to write an unknown operator, as a provider lacking a
    kernel would refuse), the run is refused naming the mode and the fix, and the cached graph is not deleted."""
    from attnscope.graphs import reduced

    def broken(proto, dtype):
        out = onnx.ModelProto()
        out.CopyFrom(proto)
        out.graph.node[0].op_type = "NoSuchOperator"
        return out
    monkeypatch.setattr(reduced, "reduce_products", broken)
    rt = runtimes["tiny-gpt"].with_compute_dtype("float16")
    path = rt.onnx_path()
    with pytest.raises(ValueError, match="compute_dtype 'float16': onnxruntime cannot open .* use float32"):
        rt.session()
    assert path.exists() and rt.graphs.path() == path
