"""MiniLM from our NumPy reference and our ONNX graph vs Hugging Face transformers (eager attention).

Both sides get the same token ids (ours, from Runtime.encode), so this checks the numerics alone:
attentions [L, H, T, T] and the last hidden state agree to 1e-4.
"""
from __future__ import annotations

import numpy as np
import pytest

import torch  # noqa: E402  (the test set-up installs torch and transformers: never skipped)
import transformers  # noqa: E402

ATOL = 1e-4
ENGINES = ("numpy", "onnx")

TEXTS = {
    "english": ("The quick brown fox jumps over the lazy dog near the river bank.", None),
    "unicode": ("naïve café — 東京 🙂 Ünïcödé", None),
    "single-word": ("attention", None),
    "pair": ("Where does the cat sleep?", "The cat sleeps on the warm windowsill every afternoon."),
}
LONG = " ".join(f"Sentence number {i} keeps going so that the text runs well past the limit." for i in range(80))


@pytest.fixture(scope="module")
def hf_model():
    from attnscope.sources import zoo

    model = transformers.BertModel.from_pretrained(str(zoo.minilm_dir()), attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module")
def hf_run(hf_model):
    """Encoding -> (attentions [L, H, T, T], hidden [T, D]) from transformers, memoised per token sequence."""
    memo = {}

    def run(encoding):
        key = (tuple(encoding.ids), tuple(encoding.type_ids))
        if key not in memo:
            with torch.inference_mode():
                out = hf_model(input_ids=torch.tensor([encoding.ids]), token_type_ids=torch.tensor([encoding.type_ids]),
                               attention_mask=torch.ones(1, len(encoding.ids), dtype=torch.long),
                               output_attentions=True)
            memo[key] = (torch.stack(out.attentions)[:, 0].numpy(), out.last_hidden_state[0].numpy())
        return memo[key]

    return run


def assert_matches_hf(result, hf_run):
    attn, hidden = hf_run(result.encoding)
    assert result.attentions.shape == attn.shape
    np.testing.assert_allclose(result.attentions, attn, atol=ATOL, rtol=0, err_msg="attentions differ from HF")
    np.testing.assert_allclose(result.hidden, hidden, atol=ATOL, rtol=0, err_msg="hidden states differ from HF")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", list(TEXTS))
def test_matches_transformers(minilm, hf_run, name, engine):
    text, pair = TEXTS[name]
    [res] = minilm.run([text], [pair], engine=engine)
    if pair is not None:
        assert 1 in res.encoding.type_ids and 0 in res.encoding.type_ids, "a pair must use both segments"
    assert_matches_hf(res, hf_run)


@pytest.fixture(scope="module")
def minilm_512(minilm):
    """MiniLM raised to all 512 of its positions (as ATTNSCOPE_MAX_TOKENS=minilm=512 does); by default it stops at
    the 256 it was trained on."""
    from dataclasses import replace

    from attnscope.runtime import Runtime
    return Runtime(replace(minilm.spec, max_tokens=512), cache_dir=minilm.cache_dir)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("limit", [256, 512])
def test_truncated_at_the_limit_matches_transformers(minilm, minilm_512, hf_run, engine, limit):
    [res] = (minilm if limit == 256 else minilm_512).run(LONG, engine=engine)
    assert res.encoding.truncated is True
    assert len(res.tokens) == limit
    assert res.tokens[0] == "[CLS]" and res.tokens[-1] == "[SEP]"
    assert_matches_hf(res, hf_run)


@pytest.mark.parametrize("engine", ENGINES)
def test_padded_batch_matches_transformers_one_by_one(minilm, hf_run, engine):
    texts = ["Short one.", "A somewhat longer sentence, with a comma and more words in it.", "Middle length text here."]
    results = minilm.run(texts, engine=engine)
    lengths = [len(r.tokens) for r in results]
    assert len(set(lengths)) == 3, f"texts should pad to different lengths; got {lengths}"
    for res in results:
        assert res.attentions.shape[-1] == len(res.tokens)
        assert_matches_hf(res, hf_run)
