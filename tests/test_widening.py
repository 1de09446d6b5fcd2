"""bfloat16 weights widened once per layer per run (issue 49): a patching request's batches read every layer again,
and the blocks' wide graphs bind float32 copies made once each (runtime/tensors.Weights.widening), instead of a Cast
of each weight in every run. The answer is the narrow graphs' own (widening is exact either way), and each of the
blocks' bfloat16 arrays is widened exactly once in the whole request.
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
