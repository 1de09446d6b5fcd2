"""The teaching decoder's hand-wired heads show the patterns they are named for, on both engines."""
from __future__ import annotations

import numpy as np
import pytest

from attnscope.model import stats
from attnscope.model.teaching import PATTERNS

TEXT = "The cat sat on the mat and the cat slept while the dog barked at the cat."


@pytest.mark.parametrize("engine", ["onnx", "numpy"])
def test_wired_heads(runtimes, engine):
    [res] = runtimes["tiny-gpt"].run([TEXT], engine=engine)
    A = res.attentions
    T = A.shape[-1]
    hs = stats.head_stats(A)
    assert hs["previous_token_mass"][0, 0] > 0.85
    assert hs["first_token_mass"][0, 1] > 0.99
    assert hs["diagonal_mass"][0, 2] > 0.95
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    np.testing.assert_allclose(A[0, 3], uniform, atol=1e-6)          # a zero query: the running average
    two_back = np.mean([A[1, 1, i, i - 2] for i in range(2, T)])
    assert two_back > 0.8
    cat = [i for i, t in enumerate(res.tokens) if t == "cat"]
    assert len(cat) == 3 and A[1, 0, cat[2], cat[0]] > 0.2 and A[1, 0, cat[2], cat[1]] > 0.2  # same token
    assert set(PATTERNS) == {(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)}
