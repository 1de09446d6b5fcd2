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
