"""A run stops at the last layer a request needs (Runtime.depth_for, graphs/stacked.py build_graph's depth): the
answer for the first layers is computed by a graph cut after them, and it is the whole model's answer, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.app.wire import BINARY, from_binary
from attnscope.runtime.layerwise import Want
from tests.test_runtime import ATOL                 # NumPy vs ONNX in float32: what two orders of a sum differ by

TEXTS = {"minilm": "The animal didn't cross the street because it was too tired. It was late, and the road was wide.",
         "smollm2": "Mr and Mrs Dursley, of number four, Privet Drive, were proud to say that they were perfectly "
                    "normal, thank you very much."}


@pytest.mark.parametrize("model", ["minilm", "smollm2"])
def test_a_run_stops_at_the_last_layer_asked_and_answers_the_same_bits(model):
    app = create_app(Settings(models=[model], default_model=model))
    with TestClient(app) as c:
        rt = app.state.service.runtimes[model]
        L, text = rt.cfg.n_layers, TEXTS[model]

        def answer(body):
            r = c.post("/api/attention", json={"model": model, "text": text, **body}, headers={"Accept": BINARY})
            assert r.status_code == 200, r.text[:300]
            return from_binary(r.content)

        asked = [[0], [1, 0], [2], [3], [0, L // 2], [L - 1]]   # the last: every block, within the memory setting
        parts = {tuple(layers): answer({"layers": layers, "include": ["attention", "entropy", "summary", "scores"]})
                 for layers in asked}                                 # before the whole run is in the cache
        depths = sorted(rt.open_depths())    # every depth a request may need: opened while the model loaded
        assert depths == sorted({rt.depth_for(layer) for layer in range(L)}) == rt.depths()
        assert {rt.depth_for(max(layers)) for layers in asked} <= set(depths)
        assert depths[0] == 1 and all(d <= L for d in depths)
        assert L in depths                 # graphs hold no weights: the every-block cut costs no more than its runs
        whole = answer({"include": ["attention", "entropy", "summary", "scores"]})
        for layers, part in parts.items():
            assert part["layers"] == list(layers)
            np.testing.assert_array_equal(part["attention"], whole["attention"][list(layers)])
            np.testing.assert_array_equal(part["entropy"], whole["entropy"][list(layers)])
            for name, values in part["summary"].items():
                np.testing.assert_array_equal(values, np.asarray(whole["summary"][name])[list(layers)], err_msg=name)
            for name, values in part["scores"].items():
                if isinstance(values, list | np.ndarray) and np.asarray(values).shape[:1] == (len(layers),):
                    np.testing.assert_array_equal(values, np.asarray(whole["scores"][name])[list(layers)],
                                                  err_msg=name)
        # what needs every layer runs them all: predictions (an LM head) and rollout
        for include in (["attention", "rollout"],) + ((["predictions"],) if rt.cfg.lm_head else ()):
            runs = app.state.service.runner.cache
            j = answer({"layers": [0], "include": include, "text": text + " Again."})
            whole = [r for r, _ in runs._items.values() if getattr(r, "tokens", None) == j["tokens"]]
            assert j["layers"] == [0] and whole and all(r.attentions.shape[0] == L and r.hidden is not None
                                                        for r in whole)


def test_graphs_that_stop_early_hold_no_weights_and_can_be_turned_off(runtimes):
    """A cut graph reads the weights bound at its runs (runtime/tensors.Weights), as every graph: its protobuf holds
    no weight, whatever its depth, so every depth may be opened; ATTNSCOPE_STOP_EARLY_MB 0 turns them off."""
    import onnx

    from attnscope.runtime import Runtime

    rt = runtimes["smollm2"]
    cut = Runtime(rt.spec, cache_dir=rt.cache_dir, stop_early_mb=500)
    assert [cut.depth_for(layer) for layer in (0, 1, 2, 15, 29)] == [1, 2, 4, 16, 30]
    weights = sum(a.nbytes for a in cut.weights.named.values())
    for depth in (1, 16, 30):
        graph = cut.graphs.stopping(depth)
        assert len(graph) < weights / 100                      # 30 blocks of SmolLM2: ~0.3 MB against 540 MB
        proto = onnx.load_from_string(graph)
        assert all(np.prod(t.dims) < 2**16 for t in proto.graph.initializer)
        inputs = {i.name for i in proto.graph.input}                # a weight kept in blocks: "<name>.codes", ...
        assert all(w in inputs or f"{w}.codes" in inputs for w in (f"blocks.{depth - 1}.attn.q_proj.weight", "wte"))
    assert cut.depth_of(Want((0,), ends=False)) == 1 and cut.depth_of(Want((0,))) is None   # ends: the whole graph
    [res] = cut.forward([cut.encode("One two three.")], want=Want((0,), ends=False))   # stops after block 0
    [whole] = rt.forward([rt.encode("One two three.")])
    np.testing.assert_array_equal(res.attentions[0], whole.attentions[0])
    off = Runtime(rt.spec, cache_dir=rt.cache_dir, stop_early_mb=0)
    assert [off.depth_for(layer) for layer in range(4)] == [None] * 4


def test_a_weight_a_product_reads_too_stays_bound():
    """What a prepacking graph opens besides its product weights (runtime/options.unmultiplied) is what no product
    reads: a tied embedding, a Gather's table and the LM head's Transpose and MatMul at once, is neither prepacked nor
    opened in place (onnxruntime would fold its Transpose into a copy of it); a bias is opened."""
    from onnx import TensorProto, helper

    from attnscope.runtime.options import product_weights, unmultiplied

    def tensor(name, kind, shape):
        return helper.make_tensor_value_info(name, kind, shape)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["wte", "ids"], ["x"]), helper.make_node("Transpose", ["wte"], ["wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["x", "wt"], ["logits"]), helper.make_node("Add", ["x", "bias"], ["y"]),
         helper.make_node("MatMul", ["x", "w"], ["z"])], "tied",
        [tensor("wte", TensorProto.FLOAT, [10, 4]), tensor("ids", TensorProto.INT64, [3]),
         tensor("bias", TensorProto.FLOAT, [4]), tensor("w", TensorProto.FLOAT, [4, 4])],
        [tensor("logits", TensorProto.FLOAT, [3, 10]), tensor("y", TensorProto.FLOAT, [3, 4]),
         tensor("z", TensorProto.FLOAT, [3, 4])])
    proto = helper.make_model(graph)
    assert product_weights(proto) == ["w"] and unmultiplied(proto) == ["bias"]


def test_a_request_for_one_layer_fetches_that_layer_alone():
    """What a run hands back is what the answer holds (issue 38): a request for layer 3 of MiniLM runs the graph cut
    after block 3, whose four blocks each write their attention; the three not asked are left where the session
    computes (scratch memory here, device memory on a GPU), so the bytes the session wrapper counts as fetched are
    one layer's [H, T, T] float32 matrices and its [H, T] value norms, exactly."""
    from attnscope.runtime.results import footprint

    app = create_app(Settings(models=["minilm"], default_model="minilm"))
    with TestClient(app) as c:
        rt = app.state.service.runtimes["minilm"]
        text = TEXTS["minilm"] + " One layer."

        def fetched() -> int:
            return sum(s.fetched for s in rt._sessions.values())

        before = fetched()
        r = c.post("/api/attention", json={"model": "minilm", "text": text, "layers": [3], "include": ["attention"]},
                   headers={"Accept": BINARY})
        assert r.status_code == 200, r.text[:300]
        j = from_binary(r.content)
        T, H = len(j["tokens"]), rt.cfg.n_heads
        assert 4 in rt.open_depths() and j["layers"] == [3]   # every depth is opened at start (Runtime.prepare)
        assert fetched() - before == H * T * T * 4 + H * T * 4      # and its keys' value norms [H, T] (summaries)
        [kept] = [r for r, _ in app.state.service.runner.cache._items.values() if getattr(r, "tokens", 0) == j["tokens"]]
        assert kept.attentions.shape[:2] == (4, H) and not kept.attentions.flags.writeable   # results.one_block: the
        assert footprint(kept.attentions) < 2 * H * T * T * 4        # cached result holds one block's memory, not four
        full = rt.forward([rt.encode(text)])[0].attentions                  # the whole graph, every layer fetched
        np.testing.assert_array_equal(j["attention"][0], full[3])



def test_small_models_prepack_their_product_weights_within_the_budget(runtimes):
    """A model's float32 product weights (what Graph.linear multiplies by, and the value norms' R) are opened as
    initializers, which onnxruntime prepacks, by the served graph and its cut graphs while their copies fit
    ATTNSCOPE_PREPACK_MB (Weights.prepacks: all or nothing per graph, in the order the graphs open); past it a graph
    binds them at every run as a big model's does. The answers are the bound graph's, within float32 rounding (the
    packed products sum in another order: 1-2e-6 of MiniLM's attention here, bounded as the engines' parity is)."""
    import onnx

    from attnscope.runtime import Runtime
    from attnscope.runtime.options import product_weights
    from attnscope.runtime.tensors import IN_PLACE

    spec, cache, text = runtimes["minilm"].spec, runtimes["minilm"].cache_dir, TEXTS["minilm"]
    bound = Runtime(spec, cache_dir=cache, stop_early_mb=1024, prepack_mb=0)
    packed = Runtime(spec, cache_dir=cache, stop_early_mb=1024)                 # the default budget: every graph
    small = Runtime(spec, cache_dir=cache, stop_early_mb=1024, prepack_mb=20)   # the cut after block 0 only
    enc = bound.encode(text)
    product = {f"blocks.{i}.{w}" for i in range(6) for w in ("attn.in_proj_weight", "attn.out_proj.weight",
                                                             "mlp.fc.weight", "mlp.proj.weight", "attn.value_r")}
    assert product <= set(bound.session().bound) and bound.weights.prepacked == 0
    whole = bound.forward([enc])[0]
    for rt in (packed, small):
        [first] = rt.forward([enc], want=Want((0,), ends=False))          # the graph cut after block 0 opens first
        [got] = rt.forward([enc])
        np.testing.assert_allclose(first.attentions[0], whole.attentions[0], rtol=0, atol=ATOL)
        np.testing.assert_allclose(got.attentions, whole.attentions, rtol=0, atol=ATOL)
        np.testing.assert_allclose(got.hidden, whole.hidden, rtol=0, atol=ATOL * np.abs(whole.hidden).max())
        block0 = {n for n in product if n.startswith("blocks.0.")}
        assert not block0 & set(rt.session(depth=1).bound)                 # prepacked: no longer a bound input
        assert not product & set(rt.session().bound) if rt is packed else product <= set(rt.session().bound)
        if rt is packed:   # the other weights open with them, but for those onnxruntime would copy (big, unaligned)
            assert all(rt.weights.array(n).nbytes > IN_PLACE and rt.weights.array(n).ctypes.data % 64
                       for n in rt.session().bound)
        cut = product_weights(onnx.load_from_string(rt.graphs.stopping(1)))   # block 0's q, k, v and R: 1.8 MB
        if rt is small:
            assert rt.weights.prepacked == sum(rt.weights.array(n).nbytes for n in cut)
        assert 0 < rt.weights.prepacked <= rt.weights.prepack_bytes
