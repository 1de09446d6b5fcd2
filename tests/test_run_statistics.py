"""The per-head statistics of one run beyond its probabilities (analysis/statistics.py, needs "run"): the
value-weighted first-token mass (each key's ||v_j W_O^h||, Kobayashi et al. 2020) and the local-window mass, against
transformers' eager SmolLM2 on every path that computes them (the stacked graph, the layer-by-layer walk, the NumPy
reference). Their NumPy and in-graph forms: tests/test_structure.py; the blocked walk against the stacked graph:
tests/test_long_context.py::test_blocked_rows_equal_float64_and_the_stacked_graph."""
from __future__ import annotations

import numpy as np
import pytest

from attnscope.analysis import statistics as stats
from attnscope.runtime.layerwise import Layerwise

from .test_long_context import ValueWeighted

TEXT = "The quick brown fox jumps over the lazy dog. Then the dog sleeps in the warm sun all afternoon."


@pytest.mark.slow
def test_value_weighted_first_token_mass_equals_transformers(local_smollm2, hf_smollm2):
    """value_weighted_first_token_mass of the API's summary (the stacked graph), of the NumPy engine and of a walk
    layer by layer equals the mean over queries of transformers' value-weighted attention on the first key (eager
    weights, v_proj and o_proj: tests/test_long_context.ValueWeighted), within float32 bounds derived against float64
    (tests/float32.py, the mean's own rounding included). The sink heads it is for weigh less value-weighted."""
    import torch

    from .float32 import assert_within, float32_bound
    model, layer, heads = local_smollm2, 3, [0, 4, 8]
    rt = model.runtime
    enc = rt.encode(TEXT)
    blocks, n = hf_smollm2.model.layers, hf_smollm2.config.num_hidden_layers
    try:                        # the reference runs the blocks up to `layer` alone (its attentions are theirs): 8x less
        hf_smollm2.model.layers, hf_smollm2.config.num_hidden_layers = blocks[:layer + 1], layer + 1
        exact, bound = float32_bound(ValueWeighted(hf_smollm2, layer), lambda o: o[:, heads, :, 0].mean(-1),
                                     samples=16, input_ids=torch.tensor([enc.ids]))          # [3]: per head
    finally:
        hf_smollm2.model.layers, hf_smollm2.config.num_hidden_layers = blocks, n
    name = "value_weighted_first_token_mass"
    for engine in ("onnx", "numpy"):
        got = model.attention(TEXT, model="smollm2", layers=[layer], heads=heads, include=["summary"], engine=engine)
        assert_within(np.asarray(got["summary"][name])[0], exact, 2 * bound + 1e-7, engine)
        raw = np.asarray(got["summary"]["first_token_mass"])[0]
        assert not np.allclose(raw, exact, atol=1e-2)                       # value-weighting changed the number
    res = Layerwise(rt, group_mb=8, graphs=rt.layerwise()).forward(enc)
    assert_within(res.rows["value_weighted_first"][layer, heads].mean(-1), exact, 2 * bound + 1e-7, "layer by layer")
    first = stats.summarize({"first": res.rows["first"], "value_weighted_first": res.rows["value_weighted_first"]})
    sinks = first["first_token_mass"] > 0.5                                 # heads that park on the first token
    assert sinks.sum() > 10 and (first[name][sinks] < first["first_token_mass"][sinks]).mean() > 0.8


def test_local_mass_reads_the_models_window(runtimes):
    """local_mass's window is the model's own where it has local layers (Gemma 3: 512 keys), else LOCAL_WINDOW; its
    row is the weight on the keys fewer than that many tokens away, the band a local layer attends within."""
    assert stats.local_window(runtimes["gemma3"].cfg) == 512
    assert stats.local_window(runtimes["smollm2"].cfg) == stats.LOCAL_WINDOW
    T, w = 9, 3
    p = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]             # causal, uniform over the visible keys
    got = stats.ROWS["local"].numpy(p, stats.TextKeys(window=w))
    np.testing.assert_allclose(got, np.minimum(np.arange(1, T + 1), w) / np.arange(1, T + 1))
    assert np.isnan(stats.ROWS["local"].numpy(p)).all()                     # no window known: NaN, never a guess
