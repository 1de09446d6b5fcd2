"""The Python API a notebook uses: attnscope.load(...)(text) -> numpy results, and Plotly figures of them."""
from __future__ import annotations

import numpy as np

import attnscope
from attnscope.analysis import statistics as stats

from .conftest import CACHE


def test_load_run_and_summaries():
    rt = attnscope.load("minilm", cache_dir=CACHE)
    r = rt("The cat sat on the mat.")
    assert r.tokens[0] == "[CLS]" and r.token_ids[0] == 101 and len(r.token_ids) == len(r.tokens)
    assert r.attentions.shape == (6, 12, len(r.tokens), len(r.tokens))
    np.testing.assert_allclose(r.attentions.sum(-1), 1.0, atol=1e-6)
    s = r.summary()
    assert set(s) == set(stats.HEAD_STATS) and s["first_token_mass"].shape == (6, 12)
    np.testing.assert_allclose(s["first_token_mass"], r.attentions[..., 0].mean(-1), atol=1e-7)
    np.testing.assert_allclose(r.entropy(), stats.entropy(r.attentions))
    [same] = rt.run(["The cat sat on the mat."])
    np.testing.assert_array_equal(same.attentions, r.attentions)


def test_figures_show_the_numbers(runtimes):
    r = runtimes["tiny-gpt"]("The cat sat on the mat.")
    fig = attnscope.figures.head(r, 0, 1)
    np.testing.assert_allclose(np.array(fig.data[0].z), r.attentions[0, 1])
    assert fig.data[0].zmin == 0 and fig.data[0].zmax == 1
    grid = attnscope.figures.model_grid(r)
    assert len(grid.data) == r.attentions.shape[0] * r.attentions.shape[1]


def test_client_is_exported():
    assert attnscope.Client.__module__ == "attnscope.app.client"
