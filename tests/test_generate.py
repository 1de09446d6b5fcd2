"""Generation (issue 26): the key/value-cache step against transformers' generate and against one full forward, the
sampling distributions against transformers' own logits warpers, knocked-out heads against transformers with a hook,
the NumPy step against the ONNX one, and /api/generate's stream, limits and refusals.

transformers' references: the GGUF SmolLM2 (its own loader), and GPT-2 and Llama checkpoints with wide random weights
(peaked attention) built by tests/test_checkpoints.py.
"""
from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from attnscope.model.interventions import forward as reference_forward
from attnscope.model.masks import causal_mask
from attnscope.runtime import Runtime
from attnscope.app.errors import Refused
from attnscope.app.main import create_app
from attnscope.analyses.base import Context
from attnscope.analyses.generate import chat_prompt
from attnscope.analyses.registry import Plans
from attnscope.analyses.generate import GenerateRequest
from attnscope.app.settings import Settings
from attnscope.runtime.generation import Generator, Sampling, distributions
from attnscope.sources import resolve, zoo

from .conftest import CACHE, ablation_hooks
from .test_checkpoints import build_checkpoint

PROMPTS = ("The quick brown fox jumps over the lazy dog. The quick brown fox",
           "In 1905, Albert Einstein published four papers that",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
NEW = 48


# ---- fixtures ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(runtimes):
    return runtimes["smollm2"]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def checkpoint(request, tmp_path_factory):
    """A checkpoint (GPT-2: learned positions, LayerNorm, biases; Llama: RoPE, one key/value head, untied) served by
    us and read by transformers."""
    folder = build_checkpoint(request.param, tmp_path_factory.mktemp("generate") / request.param)
    rt = Runtime(resolve(f"{request.param}={folder}", cache=CACHE), cache_dir=CACHE)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                           dtype=torch.float32).eval()
    return rt, hf


def hf_greedy(hf, ids: list[int], n: int, hooks=None) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(ids):].tolist()


def greedy(rt, ids: list[int], n: int, **options) -> Generator:
    gen = Generator(rt, ids, Sampling(greedy=True), n, **options)
    for _ in gen:
        pass
    return gen


# ---- greedy generation equals transformers' generate ---------------------------------------------------------------
@pytest.mark.parametrize("prompt", PROMPTS)
def test_smollm2_greedy_equals_transformers_generate(smollm2, hf_smollm2, prompt):
    ids = smollm2.encode(prompt).ids
    ours = greedy(smollm2, ids, NEW)
    assert ours.new_ids == hf_greedy(hf_smollm2, ids, NEW)
    assert len(ours.new_ids) == NEW or ours.stop_reason == "eos"


def test_checkpoint_greedy_equals_transformers_generate(checkpoint):
    rt, hf = checkpoint
    rng = np.random.default_rng(5)
    for _ in range(3):
        ids = rng.integers(3, rt.cfg.vocab_size, 12).tolist()
        ours = greedy(rt, ids, NEW)
        theirs = hf_greedy(hf, ids, NEW)
        assert ours.new_ids == theirs
        assert len(ours.new_ids) == NEW        # not stopped early by the end-of-text id: 48 tokens compared


def test_checkpoint_attention_is_peaked(checkpoint):
    """The random-weight comparison means something: the streamed rows are peaked (mean row max >= 0.5)."""
    rt, _ = checkpoint
    gen = greedy(rt, list(range(3, 23)), 16, layers=tuple(range(rt.cfg.n_layers)), heads=tuple(range(rt.cfg.n_heads)))
    gen2 = Generator(rt, list(range(3, 23)), Sampling(greedy=True), 16, layers=tuple(range(rt.cfg.n_layers)),
                     heads=tuple(range(rt.cfg.n_heads)))
    assert np.mean([t.attention.max(axis=-1).mean() for t in gen2]) >= 0.5
    assert gen.new_ids == gen2.new_ids


def test_streamed_rows_equal_one_full_forward(smollm2):
    """Every new token's attention row, from its own step, equals its row in one forward over the final sequence."""
    ids = smollm2.encode(PROMPTS[1]).ids
    layers, heads = (0, 7, 17, 29), tuple(range(9))
    gen = Generator(smollm2, ids, Sampling(temperature=0.8, top_k=40, seed=3), 24, layers=layers, heads=heads)
    tokens = list(gen)
    full = smollm2.forward([smollm2.encode_ids(ids + gen.new_ids)])[0].attentions[list(layers)]   # [4, 9, T, T]
    worst = max(np.abs(t.attention - full[:, :, t.index, :t.index + 1]).max() for t in tokens)
    assert worst < 1e-5
    assert [t.index for t in tokens] == list(range(len(ids), len(ids) + len(tokens)))


def test_numpy_step_equals_onnx_step_and_a_full_forward(runtimes):
    """model/decoding.py (the reference) and graphs/decoding.py agree step by step, and the last step's logits equal
    those of the reference forward pass (model/interventions.py) over the whole sequence."""
    for name, atol in (("smollm2", 1e-5), ("induction", 1e-4)):   # the induction model's hand-set scores are
        rt = runtimes[name]                                        # huge: a one-row sgemv's rounding shows at 2e-5
        ids = rt.encode("The cat sat on the mat because it was warm").ids
        onnx = Generator(rt, ids, Sampling(greedy=True), 6, layers=(0, 1), heads=(0,))
        ref = Generator(rt, ids, Sampling(greedy=True), 6, layers=(0, 1), heads=(0,), engine="numpy")
        pairs = list(zip(onnx, ref))
        assert onnx.new_ids == ref.new_ids and len(pairs) == 6
        for a, b in pairs:
            np.testing.assert_allclose(a.attention, b.attention, atol=atol)
            assert a.probability == pytest.approx(b.probability, abs=1e-5)
        seq = np.array([ids + ref.new_ids])
        full = reference_forward(rt.model, seq, causal_mask(seq.shape[1])[None, None])
        np.testing.assert_allclose(ref._logits, full.logits[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(onnx._logits, full.logits[0], rtol=1e-4, atol=1e-4)


# ---- sampling ------------------------------------------------------------------------------------------------------
SETTINGS = [Sampling(temperature=0.7), Sampling(top_k=5), Sampling(top_p=0.9), Sampling(temperature=1.3, top_k=50,
            top_p=0.8), Sampling(temperature=0.5, top_p=0.3), Sampling(top_k=1), Sampling(top_p=1e-6)]


@pytest.mark.parametrize("sampling", SETTINGS, ids=str)
def test_distributions_equal_transformers_logits_warpers(sampling):
    """temperature, then top-k, then top-p, as transformers' warpers apply them (float64, the same logits)."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
    rng = np.random.default_rng(0)
    for _ in range(5):
        logits = rng.normal(0, 3, 1000)
        p, q = distributions(logits, sampling)
        z = torch.tensor(logits, dtype=torch.float64)[None]
        warpers = [TemperatureLogitsWarper(sampling.temperature)]
        if sampling.top_k:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        for w in warpers:
            z = w(None, z)
        np.testing.assert_allclose(q, torch.softmax(z, -1)[0].numpy(), atol=1e-12)
        np.testing.assert_allclose(p, np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum(), atol=1e-12)


def test_distributions_equal_an_independent_computation():
    """The nucleus written the other way round: descending, keep tokens until the kept mass reaches top_p."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, 300)
    T, k, top_p = 0.8, 40, 0.75
    z = logits / T
    kth = sorted(z, reverse=True)[k - 1]
    z = np.array([v if v >= kth else -np.inf for v in z])
    probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    kept, mass = set(), 0.0
    for i in sorted(range(len(z)), key=lambda i: -probs[i]):
        kept.add(i)
        mass += probs[i]
        if mass >= top_p:
            break
    expected = np.array([probs[i] if i in kept else 0.0 for i in range(len(z))])
    _, q = distributions(logits, Sampling(temperature=T, top_k=k, top_p=top_p))
    np.testing.assert_allclose(q, expected / expected.sum(), atol=1e-12)


def test_a_seed_reproduces_a_sampled_continuation(smollm2):
    ids = smollm2.encode(PROMPTS[0]).ids
    runs = [Generator(smollm2, ids, Sampling(temperature=1.2, top_p=0.95, seed=seed), 16) for seed in (7, 7, 8)]
    tokens = [list(gen) for gen in runs]
    assert runs[0].new_ids == runs[1].new_ids != runs[2].new_ids
    # each token was drawn from the stated distribution: it has probability > 0 under it
    assert all(t.sampling_probability > 0 for t in tokens[0])
    greedy_ids = greedy(smollm2, ids, 16).new_ids
    assert runs[0].new_ids != greedy_ids


# ---- interventions -------------------------------------------------------------------------------------------------
def test_knocked_out_heads_equal_transformers_with_a_hook(smollm2, hf_smollm2):
    """Heads knocked out (output zero) in the prompt and in every step: transformers' greedy generation with the same
    heads' slice of o_proj's input zeroed by a forward pre-hook, token for token; and a different continuation."""
    heads = [(0, 1), (3, 4), (17, 4), (18, 6)]
    ids = smollm2.encode(PROMPTS[0]).ids
    keep = np.ones((1, 30, 9), np.float32)
    for layer, head in heads:
        keep[0, layer, head] = 0
    ours = greedy(smollm2, ids, 32, keep=keep)
    with ablation_hooks(lambda l: hf_smollm2.model.layers[l].self_attn.o_proj, 64, heads, "zero"):
        theirs = hf_greedy(hf_smollm2, ids, 32)
    assert ours.new_ids == theirs
    assert ours.new_ids != greedy(smollm2, ids, 32).new_ids


def test_chat_template_equals_transformers(smollm2):
    tok = transformers.AutoTokenizer.from_pretrained(str(zoo.smollm2_path().parent), gguf_file=zoo.SMOLLM2_FILE)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    theirs = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat_prompt(smollm2.generation, messages[0]["content"]) == theirs
    assert smollm2.generation.eos_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)


# ---- the API, on a real server ---------------------------------------------------------------------------------
def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/api/generate", json=body, timeout=120)


def lines(r) -> list[dict]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


def test_api_streams_a_line_per_token_then_done(live_server_smollm2, smollm2, hf_smollm2):
    body = {"model": "smollm2", "text": PROMPTS[0], "max_new_tokens": 12, "greedy": True,
            "include": ["candidates", "attention"], "layers": [2, 17], "heads": [4, 0]}
    out = lines(post(live_server_smollm2, body))
    tokens, done = [line["token"] for line in out[:-1]], out[-1]["done"]
    ids = smollm2.encode(PROMPTS[0]).ids
    assert done["ids"] == [t["id"] for t in tokens] == hf_greedy(hf_smollm2, ids, 12)
    assert done["stop_reason"] == "max_new_tokens" and done["tokens"] == [t["token"] for t in tokens]
    assert done["sequence"] == PROMPTS[0] + done["text"] and tokens[-1]["text"] == done["text"]
    full = smollm2.forward([smollm2.encode_ids(ids + done["ids"])])[0].attentions
    for t in tokens:
        rows = np.array(t["attention"])                                   # [2 layers, 2 heads, index + 1]
        np.testing.assert_allclose(rows, full[[2, 17]][:, [4, 0], t["index"], :t["index"] + 1], atol=1e-5)
        c = t["candidates"]
        assert len(c) == 10 and c[0]["id"] == t["id"]                     # greedy: the most probable
        assert c[0]["probability"] == pytest.approx(t["probability"])
    assert done["tokens_per_second"] > 0 and done["timing_ms"]["per_token"] > 0


def test_api_stop_strings_seed_chat_and_knocked_out_heads(live_server_smollm2, smollm2):
    url = live_server_smollm2
    out = lines(post(url, {"model": "smollm2", "text": "Count: one, two, three,", "max_new_tokens": 40, "greedy": True,
                           "stop": [" six"]}))
    assert out[-1]["done"]["stop_reason"] == "stop" and out[-1]["done"]["text"].endswith(" six")
    a, b = (lines(post(url, {"model": "smollm2", "text": "Once upon a time", "seed": 11, "max_new_tokens": 8,
                             "top_k": 20}))[-1]["done"] for _ in range(2))
    assert a["ids"] == b["ids"] and a["seed"] == 11
    chat = lines(post(url, {"model": "smollm2", "text": "Hi!", "chat": True, "max_new_tokens": 64,
                            "greedy": True}))[-1]["done"]
    assert chat["prompt_tokens"][0] == "<|im_start|>" and chat["stop_reason"] == "eos"
    assert chat["tokens"][-1] == "<|im_end|>"
    ablate = [[0, 1], [3, 4], [17, 4], [18, 6]]
    done = lines(post(url, {"model": "smollm2", "text": PROMPTS[0], "max_new_tokens": 16, "greedy": True,
                            "interventions": {"ablate": ablate}}))[-1]["done"]
    keep = np.ones((1, 30, 9), np.float32)
    keep[0, [0, 3, 17, 18], [1, 4, 4, 6]] = 0
    assert done["ids"] == greedy(smollm2, smollm2.encode(PROMPTS[0]).ids, 16, keep=keep).new_ids
    assert done["ablate"] == ablate


@pytest.mark.parametrize("body, status, words", [
    ({"model": "tiny-gpt", "text": "a b"}, 422, "no LM head"),
    ({"text": "a b", "temperature": 0}, 422, "temperature"),
    ({"text": "a b", "temperature": -1, "greedy": True}, 422, "temperature"),
    ({"text": "a b", "top_p": 0}, 422, "top_p"),
    ({"text": "a b", "top_p": 1.01}, 422, "top_p"),
    ({"text": "a b", "top_k": -1}, 422, "top_k"),
    ({"text": "a b", "max_new_tokens": 257}, 422, "ATTNSCOPE_MAX_NEW_TOKENS"),
    ({"text": "a b", "max_new_tokens": 0}, 422, "max_new_tokens"),
    ({"text": "a " * 8000, "max_new_tokens": 256}, 422, "max_tokens"),      # SmolLM2 reads 8,192
    ({"text": "a b", "interventions": {"ablate": [[30, 0]]}}, 422, "out of range"),
    ({"text": "a b", "include": ["attention"], "layers": [30]}, 422, "out of range"),
    ({"text": "a b", "include": ["attention"], "max_new_tokens": 256}, 422, "ATTNSCOPE_MAX_JSON_CELLS"),
    ({"text": "a b", "stop": [""]}, 422, "stop"),
    ({"text": "a b", "seed": -1}, 422, "seed"),
    ({"model": "nope", "text": "a b"}, 404, "unknown model"),
    ({"text": " "}, 422, "text"),
])
def test_api_refuses_bad_input_clearly(live_server_smollm2, body, status, words):
    r = post(live_server_smollm2, {"model": "smollm2"} | body)
    assert r.status_code == status and words.lower() in r.json()["detail"].lower(), r.text
    assert httpx.get(live_server_smollm2 + "/healthz").json()["running"] == 0


def test_a_key_value_cache_over_its_limit_is_refused(smollm2):
    """SmolLM2's cache is 45 KB a token (5,825 tokens fit the default 256 MB, more than it reads); at 1 MB, 23 do."""
    planner = Plans(Context({"smollm2": smollm2}, Settings(layerwise_mb=1)))
    planner.generate(GenerateRequest(text="The quick brown fox", max_new_tokens=18))
    with pytest.raises(Refused, match=r"key/value cache would hold 1 MB \(4 \+ 19 tokens\).*ATTNSCOPE_LAYERWISE_MB"):
        planner.generate(GenerateRequest(text="The quick brown fox", max_new_tokens=19))


def test_the_default_length_stays_within_a_lower_limit(smollm2):
    """ATTNSCOPE_MAX_NEW_TOKENS below the default (32): a request that leaves max_new_tokens out asks for the limit,
    and the request schema's default says so (the fuzzer found the default refused as over the limit); one that asks
    for more is refused by name."""
    planner = Plans(Context({"smollm2": smollm2}, Settings(max_new_tokens=16)))
    assert planner.generate(GenerateRequest(text="The quick brown fox")).request.max_new_tokens == 16
    with pytest.raises(Refused, match=r"max_new_tokens 17 is over the limit of 16 \(ATTNSCOPE_MAX_NEW_TOKENS\)"):
        planner.generate(GenerateRequest(text="The quick brown fox", max_new_tokens=17))
    with TestClient(create_app(Settings(models=["induction"], cache=CACHE, max_new_tokens=16))) as c:
        props = c.get("/openapi.json").json()["components"]["schemas"]["GenerateRequest.induction"]["properties"]
        assert props["max_new_tokens"]["maximum"] == 16 and props["max_new_tokens"]["default"] == 16
        r = c.post("/api/generate", json={"model": "induction", "text": "a b c a b", "greedy": True})
        assert r.status_code == 200, r.text
        done = json.loads(r.text.splitlines()[-1])["done"]
        assert len(done["ids"]) == 16 and done["stop_reason"] == "max_new_tokens"


def test_an_encoder_is_refused(minilm):
    with pytest.raises(Refused, match="generation reads next-token logits, and model 'minilm' has no LM head"):
        Plans(Context({"minilm": minilm}, Settings())).generate(GenerateRequest(model="minilm", text="A sentence."))


def test_a_model_without_a_chat_template_refuses_chat(runtimes):
    with pytest.raises(Refused, match="no chat template"):
        chat_prompt(runtimes["induction"].generation, "Hi")


def test_a_client_that_goes_away_stops_its_generation(live_server_smollm2):
    """Reading two lines and closing the connection ends the generation within a step (the server runs nothing
    afterwards), where the whole would take seconds."""
    url = live_server_smollm2
    body = {"model": "smollm2", "text": PROMPTS[1], "max_new_tokens": 200, "greedy": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", url + "/api/generate", json=body) as r:
            got = [line for _, line in zip(range(2), r.iter_lines())]
    assert len(got) == 2 and "token" in json.loads(got[0])
    time.sleep(0.5)
    running = []
    for _ in range(10):
        running.append(httpx.get(url + "/healthz").json()["running"])
        time.sleep(0.1)
    assert running == [0] * 10


def test_a_generation_takes_turns_with_other_runs(live_server_smollm2):
    """A generation holds a run slot a step at a time: a request that comes while it streams is answered before the
    generation ends (on 2 cores the server runs one model run at a time), and the generation then goes on."""
    import threading

    url, events = live_server_smollm2, []
    body = {"model": "smollm2", "text": PROMPTS[0], "max_new_tokens": 96, "greedy": True}

    def generate():
        with httpx.Client(timeout=120) as c, c.stream("POST", url + "/api/generate", json=body) as r:
            for line in r.iter_lines():
                events.append("done" if line.startswith('{"done"') else "token")
                if len(events) == 2:
                    started.set()

    started = threading.Event()
    worker = threading.Thread(target=generate)
    worker.start()
    assert started.wait(60)
    r = httpx.post(url + "/api/attention", json={"model": "smollm2", "text": "A fresh text to read, once.",
                                                  "layers": [0]}, timeout=120)
    answered_after = len(events)
    worker.join(120)
    assert r.status_code == 200
    assert events[-1] == "done" and answered_after < len(events) - 1, (answered_after, len(events))
