"""bfloat16 weights widened once per layer per run (issue 49): a patching request's batches read every layer again,
and the blocks' wide graphs bind float32 copies made once each (runtime/tensors.Weights.widening), instead of a Cast
of each weight in every run. The answer is the narrow graphs' own (widening is exact either way), and each of the
blocks' bfloat16 arrays is widened exactly once in the whole request. A model kept in quantised blocks is
de-quantised the same way, once a weight, where its float32 weights fit the budget.
"""
from __future__ import annotations

import numpy as np

from attnscope.analysis.effects import Metric
from attnscope.runtime import interventions, tensors
from attnscope.runtime.patching import patch
from attnscope.runtime.runtime import Runtime
from attnscope.sources import resolve

from bench.checkpoints import llama

from .conftest import CACHE


def test_patching_a_bfloat16_model_widens_each_layer_once(tmp_path, monkeypatch):
    folder = llama(tmp_path / "smol", "smol", "bfloat16", layers=3)
    rt = Runtime(resolve(f"smol={folder}", cache=CACHE), cache_dir=CACHE)
    assert rt.capabilities.precision.storage == "bfloat16"
    clean, corrupt = rt.encode("Mary and John went in; John gave"), rt.encode("Mary and John went in; Mary gave")
    metric = Metric(clean.ids[1], clean.ids[10])              # "M" against "J"

    calls = []
    real = tensors.widen
    monkeypatch.setattr(tensors, "widen", lambda a: calls.append(a.size) or real(a))
    wide = patch(rt, clean, corrupt, metric, batch=4)
    narrow_arrays = [a for layer in range(rt.cfg.n_layers) for name, a in rt.weights.layer(layer).items()
                     if a.dtype != np.float32]
    assert len(calls) == len(narrow_arrays)                 # each once, for 2 traces and 27 patched rows

    init = interventions.Interventions.__init__

    def narrow(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.wide = ""                                       # the Cast in every run, as before
    monkeypatch.setattr(interventions.Interventions, "__init__", narrow)
    calls.clear()
    cast = patch(rt, clean, corrupt, metric, batch=4)
    assert not calls
    assert np.array_equal(wide.patched, cast.patched) and np.ptp(wide.patched) > 0


def test_a_model_too_big_to_run_whole_reads_each_layer_ahead(tmp_path, monkeypatch):
    """A model whose weights pass the memory budget's share walks layer by layer, giving each layer's pages back
    after it; while it computes a layer, a thread of its own reads the next layer's weights (the last layer: the
    embedding, final norm and LM head) from disk (runtime/layerwise.Layerwise.read_ahead). The walk's numbers are the
    stacked run's; each layer is read ahead once, in order, and the reader is done when the walk is."""
    from attnscope.runtime import layerwise
    from attnscope.sources import store

    folder = llama(tmp_path / "smol", "smol", "bfloat16", layers=3)
    whole = Runtime(resolve(f"smol={folder}", cache=CACHE), cache_dir=CACHE)
    big = Runtime(resolve(f"smol={folder}", cache=CACHE), cache_dir=CACHE, memory_mb=100)   # 78 MB of weights
    assert whole.capabilities.stacked and not big.capabilities.stacked and big.capabilities.release
    read = []
    monkeypatch.setattr(layerwise, "read", lambda arrays: read.append(arrays) or store.read(arrays))
    enc = big.encode("Mary and John went to the store; John gave a drink to")
    walk = big.layerwise()
    res = walk.forward(enc)
    [stacked] = whole.forward([enc])
    np.testing.assert_allclose(res.hidden, stacked.hidden, rtol=0, atol=1e-5 * np.abs(stacked.hidden).max())
    final = [big.weights.named[name] for name in ("ln_f.weight", "wte")]        # the final norm, the tied LM head
    expected = [list(big.weights.layer(1).values()), list(big.weights.layer(2).values()), final]
    assert [sorted(map(id, arrays)) for arrays in read] == [sorted(map(id, arrays)) for arrays in expected]
    assert not walk._reader.is_alive()


def test_patching_a_quantised_model_dequantises_each_weight_once_where_float32_fits(runtimes, monkeypatch):
    """The zoo's SmolLM2 (GGUF Q4_1 blocks): a patching request's runs read each quantised weight whole, de-quantised
    once for the request (gguf's own de-quantisation: model/quantized.Blocks.dequantize), where MatMulNBits had
    de-quantised it a block at a time in every run (runtime/capabilities.Capabilities.widened). The patched runs
    equal the blocks' products' to float32 rounding; a budget too small for the float32 copies keeps the blocks."""
    from attnscope.model.quantized import Blocks
    from attnscope.runtime.patching import rows_of

    rt = runtimes["smollm2"]
    assert rt.capabilities.precision.storage == "float32" and rt.capabilities.widened
    clean, corrupt = rt.encode("When Mary and John went to the store, John gave a drink to"), \
        rt.encode("When Mary and John went to the store, Mary gave a drink to")
    metric = Metric(rt.encode(" Mary").ids[0], rt.encode(" John").ids[0])
    calls = []
    real = tensors.widen
    monkeypatch.setattr(tensors, "widen", lambda a: calls.append(a) or real(a))

    def patched(wide: bool) -> np.ndarray:
        iv = interventions.Interventions(rt)
        iv.wide = "wide_" if wide else ""
        with iv.widening():
            base, source = iv.trace(corrupt), iv.trace(clean)
            rows, _ = rows_of("head_output", False, source, rt.cfg.n_layers, rt.cfg.n_heads)
            return iv.run(base, rows[::7], "logits", metric=metric)["metric"]      # 39 rows over every layer

    wide = patched(True)
    quantised = [w for layer in range(rt.cfg.n_layers) for w in rt.weights.quantised(layer).values()]
    assert quantised and all(isinstance(w, Blocks) for w in quantised)
    assert sorted(map(id, calls)) == sorted(map(id, quantised))    # each once, for 2 traces and 39 patched rows
    calls.clear()
    blocks = patched(False)
    assert not calls and np.ptp(blocks) > 0.5
    np.testing.assert_allclose(wide, blocks, rtol=0, atol=2e-5 * np.abs(blocks).max())   # measured: 3e-6 of it
    small = Runtime(resolve("smollm2", cache=CACHE), cache_dir=CACHE, memory_mb=1000)
    assert small.capabilities.compute_bytes > 0.45 * small.capabilities.memory_bytes - small.capabilities.stored_bytes
    assert not small.capabilities.widened
