"""SmolLM2-135M-Instruct: our tokenizer, ONNX graph and NumPy reference vs transformers, from the same GGUF.

transformers' LlamaForCausalLM (eager attention) and its GGUF tokenizer are the independent reference:
they de-quantise and un-permute the file themselves. Our token ids go into both models, so the numeric
checks see numerics only; the tokenizer is checked on its own against transformers' on 200+ strings.
"""
from __future__ import annotations

import numpy as np
import pytest
import regex

from attnscope.sources import zoo
from attnscope.model.masks import MASKED
from attnscope.sources.tokens import bytes_to_unicode, readable
from attnscope.model.transformer import LM_OUTPUTS
from attnscope.model.weights import state_dict

from .conftest import ablation_hooks

import torch  # noqa: E402  (the test set-up installs torch and transformers: never skipped)
import transformers  # noqa: E402
torch.set_num_threads(2)

ATTN, NEXT_PROB, LOGPROB = 1e-4, 1e-4, 1e-3     # vs transformers
ENGINES = 1e-5                                  # NumPy vs ONNX

PARAGRAPH = ("In 1905, Albert Einstein published four papers that changed physics: on the photoelectric effect, "
             "Brownian motion, special relativity and the equivalence of mass and energy (E = mc^2). ")
CODE = "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
UNICODE = "naïve café — Ünïcödé, 東京タワー, Привет мир, مرحبا, 안녕하세요. "
EMOJI = "I ❤️ 🦀 and 🐍! 👩‍👩‍👧 🇺🇸 👍🏽 "
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
TEXTS = {"code": CODE, "unicode": UNICODE, "emoji": EMOJI, "chat": CHAT, "single-token": "Hi",
         "long": (PARAGRAPH + CODE + UNICODE + EMOJI + CHAT) * 5}


# ---- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(runtimes):
    return runtimes["smollm2"]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(str(zoo.smollm2_path().parent), gguf_file=zoo.SMOLLM2_FILE)


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    """transformers' own reading of the GGUF (tests/conftest.py, shared by the session)."""
    return hf_smollm2


def hf_forward(hf_model, ids):
    """attentions [L, H, T, T] and float64 logits [T, V] for one text."""
    with torch.inference_mode():
        out = hf_model(input_ids=torch.tensor([ids]), output_attentions=True)
    return torch.cat(out.attentions).numpy(), out.logits[0].double()


def onnx_forward(rt, text):
    """One run of the served graph: token ids, attentions [L, H, T, T], next-token logits [V], log-probs [T]."""
    ids = rt.encode(text).ids
    n = len(ids)
    batch = np.array([ids])
    names = ["attentions", *LM_OUTPUTS]
    attn, logits, logprobs = rt.session(False).run(names, rt.feeds(batch, np.zeros_like(batch),
                                                                   rt.build_mask([n], causal=True), [n]))
    return ids, attn[:, 0], logits[0], logprobs[0]


def assert_max_diff(actual, expected, atol, what):
    """max |a - e| <= atol, without assert_allclose's float64 copies of 36 MB layers."""
    diff = float(np.abs(actual - expected).max())
    assert diff <= atol, f"{what}: max difference {diff:.3g} > {atol}"


# ---- weights ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_weights_are_transformers_weights(smollm2, hf_model):
    """De-quantised and un-permuted exactly as transformers' GGUF loader does: bit for bit."""
    ours = state_dict(smollm2.model)
    theirs = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    names = {"wte": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight"}
    hf_block = {"attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
                "attn.o_proj": "self_attn.o_proj", "ln1": "input_layernorm", "ln2": "post_attention_layernorm",
                "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"}
    for i in range(smollm2.cfg.n_layers):
        names |= {f"blocks.{i}.{a}.weight": f"model.layers.{i}.{b}.weight" for a, b in hf_block.items()}
    assert set(ours) == set(names)
    for name, hf_name in names.items():
        assert np.array_equal(ours[name], theirs[hf_name]), name
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model, cfg.d_ff, cfg.vocab_size) == \
        (30, 9, 3, 64, 576, 1536, 49152)
    assert cfg.rope_theta == hf_model.config.rope_parameters["rope_theta"] == 100000.0
    assert cfg.layer_norm_eps == hf_model.config.rms_norm_eps and cfg.tie_embeddings and cfg.max_positions == 8192


# ---- parity with transformers -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(TEXTS))
def test_matches_transformers(smollm2, hf_model, hf_tokenizer, name):
    text = TEXTS[name]
    ids, attn, logits, logprobs = onnx_forward(smollm2, text)
    assert ids == hf_tokenizer(text).input_ids, "token ids differ from transformers' GGUF tokenizer"
    assert len(ids) == 1 if name == "single-token" else len(ids) >= (1000 if name == "long" else 8)
    hf_attn, hf_logits = hf_forward(hf_model, ids)
    for layer in range(smollm2.cfg.n_layers):
        assert_max_diff(attn[layer], hf_attn[layer], ATTN, f"attention probabilities, layer {layer}")
    p_hf = torch.softmax(hf_logits[-1], -1).numpy()
    assert_max_diff(torch.softmax(torch.from_numpy(logits).double(), -1).numpy(), p_hf, NEXT_PROB,
                    "next-token probabilities")
    top = smollm2.top_tokens(logits, 10)                         # what the runtime reports
    assert_max_diff(np.array([t.prob for t in top]), np.sort(p_hf)[::-1][:10], NEXT_PROB, "top-10 probabilities")
    lp_hf = torch.log_softmax(hf_logits[:-1], -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:], dtype=torch.long)]
    assert logprobs[0] == 0.0
    if len(ids) > 1:
        assert_max_diff(logprobs[1:], lp_hf.numpy(), LOGPROB, "token log-probabilities")


def test_runtime_result_carries_the_graphs_numbers(smollm2):
    ids, attn, logits, logprobs = onnx_forward(smollm2, CHAT)
    [res] = smollm2.run(CHAT)
    assert res.token_ids == ids and res.token_logprobs[0] is None and len(res.token_logprobs) == len(ids)
    assert np.array_equal(res.attentions, attn)
    np.testing.assert_array_equal(np.array(res.token_logprobs[1:], np.float32), logprobs[1:])
    probs = torch.softmax(torch.from_numpy(logits).double(), -1).numpy()
    top = np.argsort(-probs, kind="stable")[:10]
    assert [t.id for t in res.next_tokens] == list(top)
    np.testing.assert_allclose([t.prob for t in res.next_tokens], probs[top], rtol=1e-12)
    assert [t.token for t in res.next_tokens] == [smollm2.token_string(i) for i in top]


def test_next_token_is_predicted(smollm2):
    [res] = smollm2.run("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy")
    top = res.next_tokens[0]
    assert (top.token, top.id) == ("␣dog", smollm2.tokenizer.token_to_id("Ġdog"))
    assert 0.98 < top.prob < 1.0 and len(res.next_tokens) == 10
    assert all(a.prob >= b.prob for a, b in zip(res.next_tokens, res.next_tokens[1:]))
    # repeated words are more predictable (induction) than the first time round
    quick = [i for i, t in enumerate(res.tokens) if t == "␣quick"]
    lp = np.array(res.token_logprobs[1:], float)                     # lp[i - 1] is token i's
    n = len(res.tokens) - quick[1]                                   # "quick brown fox jumps over the lazy"
    first, again = lp[quick[0] - 1:quick[0] - 1 + n], lp[quick[1] - 1:]
    assert len(first) == len(again) == 7 and again.mean() > first.mean() + 2   # measured: -1.27 vs -4.86 nats


# ---- NumPy reference vs ONNX ----------------------------------------------------------------
@pytest.mark.slow
def test_numpy_and_onnx_agree(smollm2):
    text = CHAT + CODE
    [fast], [ref] = smollm2.run(text, engine="onnx"), smollm2.run(text, engine="numpy")
    assert fast.token_ids == ref.token_ids and len(ref.token_ids) > 60
    np.testing.assert_allclose(fast.attentions, ref.attentions, atol=ENGINES, rtol=0)
    scale = np.abs(ref.hidden).max()
    np.testing.assert_allclose(fast.hidden, ref.hidden, atol=ENGINES * scale, rtol=0)
    np.testing.assert_allclose([t.prob for t in fast.next_tokens], [t.prob for t in ref.next_tokens], atol=ENGINES)
    assert [t.id for t in fast.next_tokens[:3]] == [t.id for t in ref.next_tokens[:3]]
    lp_fast, lp_ref = np.array(fast.token_logprobs[1:]), np.array(ref.token_logprobs[1:])
    np.testing.assert_allclose(lp_fast, lp_ref, atol=ENGINES * max(1.0, np.abs(lp_ref).max()), rtol=0)


@pytest.mark.slow
def test_head_mask_agrees_between_engines(smollm2):
    L, H = smollm2.cfg.n_layers, smollm2.cfg.n_heads
    keep, mean = np.ones((1, L, H), np.float32), np.zeros((1, L, H), np.float32)
    keep[0, 0, :3] = keep[0, 4, 7] = 0          # zero-ablate three heads of layer 0, mean-ablate one of layer 4
    mean[0, 4, 7] = 1
    text = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    [a] = smollm2.run(text, engine="onnx", head_mask=keep, head_mean=mean)
    [b] = smollm2.run(text, engine="numpy", head_mask=keep, head_mean=mean)
    [plain] = smollm2.run(text, engine="onnx")
    np.testing.assert_allclose(a.attentions, b.attentions, atol=ENGINES, rtol=0)
    np.testing.assert_allclose([t.prob for t in a.next_tokens], [t.prob for t in b.next_tokens], atol=ENGINES)
    assert np.array_equal(a.attentions[0], plain.attentions[0])            # before the ablation: unchanged
    assert np.abs(a.attentions[5:] - plain.attentions[5:]).max() > 1e-3    # after it: changed
    [kept] = smollm2.run(text, engine="onnx", head_mask=np.ones((1, L, H), np.float32))
    assert np.array_equal(kept.attentions, plain.attentions) and np.array_equal(kept.hidden, plain.hidden)


# ---- invariants on a padded batch ----------------------------------------------------------
@pytest.mark.slow
def test_padded_batch_rows_and_zeros(smollm2):
    texts = [CHAT, "Hi", PARAGRAPH]
    batch = smollm2.run(texts)
    lengths = [len(r.token_ids) for r in batch]
    assert len(set(lengths)) == 3
    T = max(lengths)
    for res, text in zip(batch, texts):
        n = len(res.token_ids)
        np.testing.assert_allclose(res.attentions.astype(np.float64).sum(-1), 1.0, atol=1e-6, rtol=0)
        assert np.all(res.attentions[..., np.triu(np.ones((n, n), bool), 1)] == 0.0), "future keys must get 0"
        [alone] = smollm2.run(text)
        np.testing.assert_allclose(res.attentions, alone.attentions, atol=ENGINES, rtol=0)
        np.testing.assert_allclose(res.token_logprobs[1:], alone.token_logprobs[1:], atol=1e-4, rtol=0)
        assert [t.id for t in res.next_tokens[:3]] == [t.id for t in alone.next_tokens[:3]]
    # padded keys get exactly 0 from every query (untrimmed graph output)
    ids = np.zeros((3, T), np.int64)
    for b, r in enumerate(batch):
        ids[b, :len(r.token_ids)] = r.token_ids
    mask = smollm2.build_mask(lengths, causal=True)
    [attn] = smollm2.session(False).run(["attentions"], smollm2.feeds(ids, np.zeros_like(ids), mask, lengths))
    for b, n in enumerate(lengths):
        assert np.all(attn[:, b, :, :, n:] == 0.0)
    assert (mask[1, 0, 0, 1:] == MASKED).all()


# ---- tokens: readable strings, exact ids ----------------------------------------------------------
def test_tokens_are_readable_and_ids_exact(smollm2):
    [res] = smollm2.run("Hello world\n\tx <|im_end|>", engine="numpy")
    assert res.tokens == ["Hello", "␣world", "↵", "⇥", "x", "␣", "<|im_end|>"]
    assert res.token_ids == smollm2.tokenizer.encode("Hello world\n\tx <|im_end|>").ids
    assert res.token_ids[-1] == 2                                    # the special token, not its pieces
    emoji = smollm2.encode("🦀")
    assert "".join(emoji.tokens) == "\\xf0\\x9f\\xa6\\x80" and len(emoji.ids) == 3   # one emoji, three byte tokens
    assert readable("Ġ") == "␣" and readable("ĠĠ") == "␣␣" and readable("Ċ") == "↵" and readable("Ã©") == "é"
    assert smollm2.token_string(smollm2.tokenizer.token_to_id("Ġdog")) == "␣dog"


# ---- tokenizer vs transformers' GGUF tokenizer ------------------------------------------------------
FRAGMENTS = [
    "Hello", " world", "  two spaces", "\n", "\n\n\n", "\t", " \t \n ", "   ", "trailing  ", "12345", " 42",
    "3.14159", "1,000,000", "2024-05-06", "0x1F", "a1b2c3", "v2.0.1", "$9.99", "100%", "don't", "I'M",
    "they'll", "'s", "!!!", "...", "?!", "—", "def f(x):", "    return x ** 2", "{\"key\": [1, 2]}",
    "if (a && b) { c++; }", "<div class=\"x\">", "</div>", "SELECT * FROM t;", "$ ls -la | grep py",
    "r'\\d+'", "x^2 + y^2 = z^2", "https://example.com/a?b=c", "東京タワー", "你好，世界", "안녕하세요",
    "こんにちは", "Привет", "مرحبا", "שלום", "naïve", "café", "Ünïcödé", "ß", "🦀", "🐍", "❤️", "👩‍👩‍👧",
    "🇺🇸", "👍🏽", "😀😀", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>",
    "<|im_start", "im_end|>", "<jupyter_code>", "supercalifragilisticexpialidocious", "CamelCaseWord",
    "snake_case_name", "ALLCAPS", "e.g.", "U.S.A.", "#include <stdio.h>", "fn main() {}", "// comment",
    "# heading", "* bullet", "|a|b|", "~~strike~~", "`code`", "\r\n", "\u00a0", "\u200b", "a\u0301",
]
HANDWRITTEN = [
    "", " ", "  ", "\n", "Hello world", " Hello", "Hello ", "   leading and trailing   ",
    "line one\nline two\n\nline four", "tab\tseparated\tvalues", "a  b   c    d", "12 345 6789",
    "The year 1999 and 2024.", "Call 555-0199 now!", "x=1;y=22;z=333", "πr² is not digits here",
    CODE, CHAT, UNICODE, EMOJI, PARAGRAPH, "<|im_start|>user\nhi<|im_end|>", "a<|im_end|>b", " <|im_start|> ",
    "<|im_start|><|im_end|>", "<<|im_start|>>", "ＦＵＬＬＷＩＤＴＨ", "ﬁ ligature", "Ω≈ç√∫",
]


def varied_strings() -> list[str]:
    """Hand-written cases plus seeded combinations of fragments joined by assorted whitespace."""
    rng = np.random.default_rng(2024)
    seps = ["", " ", "  ", "\n", "\t", " \n", "   "]
    made = [s for s in HANDWRITTEN] + list(FRAGMENTS)
    while len(made) < 320:
        parts = rng.choice(len(FRAGMENTS), size=int(rng.integers(2, 6)))
        made.append("".join(FRAGMENTS[i] + seps[int(rng.integers(len(seps)))] for i in parts))
    return made


# Where the file's "smollm" split and transformers' GPT-2 split part (see the last test): a numeral
# outside 0-9, or two or more whitespace characters before a numeral (GPT-2's split cuts the run's
# last one off: "x  12" is "x" "ĠĠ" "1" "2" here, "x" "Ġ" "Ġ" "1" "2" there).
SPLITS_PART = regex.compile(r"(?![0-9])\p{N}|\s\s\p{N}")


def test_tokenizer_matches_transformers_gguf_tokenizer(smollm2, hf_tokenizer):
    strings = [s for s in varied_strings() if not SPLITS_PART.search(s)]
    assert len(strings) >= 200
    for s in strings:
        ours = smollm2.tokenizer.encode(s)
        theirs = hf_tokenizer(s, return_offsets_mapping=True)
        assert ours.ids == theirs.input_ids, repr(s)
        assert ours.offsets == [tuple(o) for o in theirs["offset_mapping"]], repr(s)
    assert hf_tokenizer("Hi").input_ids == smollm2.tokenizer.encode("Hi").ids == [26843]   # no BOS


GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def llama_cpp_smollm(tokenizer, text: str) -> list[int]:
    """llama.cpp's "smollm" pre-tokenizer written out: specials whole, then every numeral alone,
    then GPT-2's regex, each piece byte-level spelled and merged by the same BPE model."""
    spell = bytes_to_unicode()
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    specials = regex.compile("(" + "|".join(regex.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")
    ids = []
    for part in specials.split(text):
        if part in added:
            ids.append(tokenizer.token_to_id(part))
            continue
        for chunk in regex.split(r"(\p{N})", part):
            for piece in GPT2_SPLIT.findall(chunk):
                ids += [t.id for t in tokenizer.model.tokenize("".join(spell[b] for b in piece.encode()))]
    return ids


def test_numerals_follow_the_files_smollm_pre_tokenizer(smollm2, hf_tokenizer):
    """The file says pre-tokenizer "smollm": every numeral alone, then GPT-2's split, as llama.cpp does and
    as SmolLM2's own tokenizer.json (Digits + ByteLevel) does; its vocabulary has no multi-digit token.
    transformers' GGUF loader has no entry for "smollm" and uses GPT-2's split alone, which parts from
    it only where SPLITS_PART matches; there we follow the file."""
    strings = varied_strings() + ["x ² y", " ½ cup", "²³", "١٢٣ ٤٥", "Ⅻ", "a 1 22 333", "x  12", "\n 7"]
    for s in strings:
        assert smollm2.tokenizer.encode(s).ids == llama_cpp_smollm(smollm2.tokenizer, s), repr(s)
    assert sum(bool(SPLITS_PART.search(s)) for s in strings) >= 20
    assert smollm2.tokenizer.encode("x  12").tokens == ["x", "ĠĠ", "1", "2"]
    assert hf_tokenizer.convert_ids_to_tokens(hf_tokenizer("x  12").input_ids) == ["x", "Ġ", "Ġ", "1", "2"]
    assert smollm2.tokenizer.encode(" ²").tokens == ["Ġ", "Â²"]
    assert hf_tokenizer.convert_ids_to_tokens(hf_tokenizer(" ²").input_ids) == ["ĠÂ", "²"]


# ---- ablation ----------------------------------------------------------------------------------------
ABLATE = [(2, 4), (5, 0), (5, 1), (9, 8)]   # (5, 0), (5, 1): two of the three query heads of one kv group
ABLATION_TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy"


def hf_ablated(hf_model, ids, heads, mode):
    """transformers' Llama with the heads knocked out by pre-hooks on o_proj (conftest.ablation_hooks)."""
    dh = hf_model.config.hidden_size // hf_model.config.num_attention_heads
    with ablation_hooks(lambda l: hf_model.model.layers[l].self_attn.o_proj, dh, heads, mode):
        return hf_forward(hf_model, ids)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_matches_transformers_o_proj_hooks(smollm2, hf_model, mode):
    rt = smollm2
    keep = np.ones((1, rt.cfg.n_layers, rt.cfg.n_heads), np.float32)
    for l, h in ABLATE:
        keep[0, l, h] = 0
    [res] = rt.run(ABLATION_TEXT, head_mask=keep, head_mean=(1 - keep) if mode == "mean" else np.zeros_like(keep))
    [intact] = rt.run(ABLATION_TEXT)
    att, logits = hf_ablated(hf_model, res.token_ids, ABLATE, mode)
    assert_max_diff(res.attentions, att, 1e-4, "attentions, ablated")
    probs = torch.softmax(logits[-1], -1).numpy()
    ours = np.exp(res.next_token_logits - res.next_token_logits.max())
    assert_max_diff(ours / ours.sum(), probs, 1e-4, "next-token probabilities, ablated")
    # layers before the first ablated one are untouched; later ones move
    np.testing.assert_array_equal(res.attentions[:3], intact.attentions[:3])
    assert np.abs(res.attentions[6:] - intact.attentions[6:]).max() > 1e-3
    # grouped-query attention: (5, 0) and (5, 1) share key/value group 0 with head 2, which the hook leaves alone;
    # the parity above is then the check that ablating a query head leaves the rest of its group as it was


@pytest.mark.slow
def test_induction_probe_finds_smollm2_induction_heads():
    """The API's induction score (50 random tokens repeated) finds real induction heads in SmolLM2: layers 17-18
    hold heads at 0.65-0.94 (L18H6 the strongest)."""
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    from .conftest import CACHE
    with TestClient(create_app(Settings(models=["smollm2"], cache=CACHE))) as c:
        j = c.post("/api/attention", json={"model": "smollm2", "text": "The quick brown fox jumps over the lazy dog.",
                                           "include": ["scores"]}).json()
    s = np.array(j["scores"]["induction"])
    found = {(int(l), int(h)) for l, h in np.argwhere(s >= 0.5)}
    assert (18, 6) in found and len(found) >= 3, found
    assert s.max() > 0.9 and np.median(s) < 0.1
