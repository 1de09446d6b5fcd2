"""Encoder-decoders (T5, BART, Marian): tiny random checkpoints made with transformers' own config classes and
save_pretrained, served by path through the app, against transformers eager: the encoder's self-attention, the
decoder's self-attention, cross-attention and the next-token probabilities within 1e-4, weights wide enough that
attention is peaked (asserted). T5 twice: gated-gelu with its own LM head (no rescale), and relu with the tied head
read at d_model**-0.5. What does not apply to an encoder-decoder is refused, by name."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.app.wire import from_binary
from attnscope.model.encdec import relative_position_bucket
from attnscope.sources import ModelUnavailable, folders as hf_folders
from tests.conftest import CACHE, serving
from tests.float32 import assert_within, float32_bound
from tests.test_checkpoints import peaked, trained_bpe, widen

torch.set_num_threads(2)
ATOL = 1e-4
FAMILIES = ("t5", "t5-relu", "bart", "marian")
TEXT = "The quick brown fox jumps over the lazy dog near the river bank."
DECODER_TEXT = "Attention heads look back at the fox"


def save_tokenizer(family: str, folder: Path):
    """BART's own byte-level BPE class; T5 and Marian: a byte-level BPE appending </s>, as theirs do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    T = transformers
    if family == "bart":
        tok = T.BartTokenizer(*trained_bpe(["<s>", "<pad>", "</s>", "<unk>"]))
    else:
        specials = ["<pad>", "</s>", "<unk>"] if family.startswith("t5") else ["<unk>", "<pad>", "</s>"]
        vocab, merges = trained_bpe(specials)
        backend = Tokenizer(models.BPE(vocab, merges))
        backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        backend.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B:1 </s>:1", special_tokens=[("</s>", vocab["</s>"])])
        tok = T.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")
    tok.save_pretrained(folder)
    return tok


def build(family: str, folder: Path) -> Path:
    T = transformers
    folder.mkdir(parents=True)
    V = len(save_tokenizer(family, folder))
    seq = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=128, scale_embedding=True)
    if family.startswith("t5"):
        config = T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                            relative_attention_num_buckets=8, relative_attention_max_distance=20,
                            feed_forward_proj="relu" if family == "t5-relu" else "gated-gelu",
                            tie_word_embeddings=family == "t5-relu", decoder_start_token_id=0, pad_token_id=0,
                            eos_token_id=1)
        cls = T.T5ForConditionalGeneration
    elif family == "bart":
        config, cls = T.BartConfig(vocab_size=V, **seq), T.BartForConditionalGeneration
    else:
        config, cls = T.MarianConfig(vocab_size=V, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                                     **seq), T.MarianMTModel
    torch.manual_seed(0)
    model = cls(config)
    widen(model, seed=FAMILIES.index(family))
    with torch.no_grad():
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape))
    model.save_pretrained(folder)
    if family == "t5":   # T5 v1.1: an LM head of its own in the file (transformers then leaves it untied)
        from safetensors.torch import load_file, save_file
        tensors = load_file(folder / "model.safetensors")
        tensors["lm_head.weight"] = 0.15 * torch.randn(V, 64, generator=torch.Generator().manual_seed(1))
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encdec")
    return {family: build(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def client(folders):
    with serving(folders) as c:
        yield c


def reference(folder: Path, text: str, decoder_text: str | None):
    """transformers' tokenizer and eager model: the decoder reads the labels shifted right."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    src = tok(text)["input_ids"]
    start = model.config.decoder_start_token_id
    tgt = [start] + (tok(text_target=decoder_text)["input_ids"][:-1] if decoder_text else [])
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([tgt]), output_attentions=True)
    return src, tgt, out


@pytest.mark.parametrize("family", FAMILIES)
def test_served_encoder_decoder_matches_transformers(family, folders, client):
    src, tgt, out = reference(folders[family], TEXT, DECODER_TEXT)
    r = client.post("/api/attention", json={"model": family, "text": TEXT, "decoder_text": DECODER_TEXT,
                                            "include": ["attention", "predictions"]})
    assert r.status_code == 200, r.text
    r = r.json()
    assert r["token_ids"] == src and r["decoder_token_ids"] == tgt
    assert len(r["decoder_tokens"]) == len(tgt)
    for ours, theirs in ((r["attention"], out.encoder_attentions), (r["decoder_attention"], out.decoder_attentions),
                         (r["cross_attention"], out.cross_attentions)):
        ours, theirs = np.asarray(ours, np.float32), torch.stack(theirs)[:, 0].numpy()
        assert ours.shape == theirs.shape
        assert peaked(ours) >= 0.5, peaked(ours)
        np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)
    logp = torch.log_softmax(out.logits[0].double(), -1).numpy()                # [T, V]
    for t in r["next_tokens"]:
        assert abs(t["prob"] - np.exp(logp[-1, t["id"]])) <= ATOL
    assert r["next_tokens"][0]["id"] == int(logp[-1].argmax())
    want = logp[np.arange(len(tgt) - 1), tgt[1:]]
    np.testing.assert_allclose(r["token_logprobs"][1:], want, atol=ATOL * max(1.0, np.abs(want).max()), rtol=0)


def test_decoder_start_token_alone_and_numpy_engine(folders, client):
    """No decoder_text: the decoder reads its start token alone; the NumPy reference gives the same numbers."""
    src, tgt, out = reference(folders["bart"], TEXT, None)
    answers = [client.post("/api/attention", json={"model": "bart", "text": TEXT, "engine": engine}).json()
               for engine in ("onnx", "numpy")]
    for r in answers:
        assert r["decoder_token_ids"] == tgt == [2]
        cross = np.asarray(r["cross_attention"])
        assert cross.shape == (2, 4, 1, len(src))
        np.testing.assert_allclose(cross, torch.stack(out.cross_attentions)[:, 0].numpy(), atol=ATOL, rtol=0)
    assert answers[1]["provider"] == "numpy"


@pytest.mark.parametrize("family", ["t5", "bart", "marian"])
def test_a_blank_decoder_text_is_the_start_token_alone(family, client):
    """One rule in every family (issue 37: T5 took a blank decoder_text, BART and Marian refused it): a decoder text
    of white space only is the decoder start token alone, the same answer as none at all, on both endpoints."""
    body = {"model": family, "text": TEXT, "layers": [1], "heads": [0, 3]}
    alone = client.post("/api/attention", json=body).json()
    steps = client.post("/api/stages", json={"model": family, "text": TEXT, "layer": 1, "head": 3}).json()
    assert len(alone["decoder_token_ids"]) == 1 and len(steps["query_tokens"]) == 1
    for blank in ("", " ", "\t\n "):
        r = client.post("/api/attention", json=body | {"decoder_text": blank})
        assert r.status_code == 200, r.text
        r = r.json()
        assert (r["decoder_token_ids"], r["decoder_tokens"]) == (alone["decoder_token_ids"], alone["decoder_tokens"])
        for name in ("attention", "decoder_attention", "cross_attention"):
            assert r[name] == alone[name], name
        st = client.post("/api/stages", json={"model": family, "text": TEXT, "layer": 1, "head": 3,
                                              "decoder_text": blank})
        assert st.status_code == 200 and st.json()["probs"] == steps["probs"], st.text


def test_layers_heads_and_binary_form(client):
    body = {"model": "t5", "text": TEXT, "decoder_text": DECODER_TEXT}
    whole = client.post("/api/attention", json=body).json()
    part = client.post("/api/attention", json=body | {"layers": [1], "heads": [3, 0]}).json()
    blob = client.post("/api/attention", json=body | {"layers": [1], "heads": [3, 0]},
                       headers={"Accept": "application/vnd.attnscope.tensors"})
    assert blob.status_code == 200, blob.text
    binary = from_binary(blob.content)
    for name in ("attention", "decoder_attention", "cross_attention"):
        want = np.asarray(whole[name])[np.ix_([1], [3, 0])]
        np.testing.assert_array_equal(np.asarray(part[name]), want)
        np.testing.assert_allclose(binary[name], want, atol=1e-7, rtol=0)
    assert binary["decoder_tokens"] == whole["decoder_tokens"]


def test_bucket_table_matches_transformers():
    """T5's relative-position buckets, as transformers computes them (float32 logs), for 1,500 distances each way."""
    from transformers.models.t5.modeling_t5 import T5Attention
    rel = torch.arange(-1500, 1501)
    for bidirectional, buckets, distance in ((True, 32, 128), (False, 32, 128), (True, 8, 20), (False, 12, 50)):
        theirs = T5Attention._relative_position_bucket(rel, bidirectional, buckets, distance).numpy()
        np.testing.assert_array_equal(relative_position_bucket(rel.numpy(), bidirectional, buckets, distance), theirs)


@pytest.mark.parametrize("path, body, named", [
    ("/api/attention", {"ablate": [[0, 0]]}, "ablate"),
    ("/api/attention", {"include": ["attention", "entropy"]}, "include 'entropy'"),
    ("/api/stages", {"layer": 0, "head": 0, "mask_tokens": [1]}, "mask_tokens"),
    ("/api/qk", {"layer": 0, "head": 0, "query": 1, "key": 0}, "QK attribution"),
    ("/api/lens", {}, "the logit lens"),
    ("/api/importance", {}, "head importance"),
    ("/api/generate", {"max_new_tokens": 2}, "generation"),
    ("/api/circuits", {}, "circuits"),
])
def test_what_does_not_apply_is_refused_by_name(client, path, body, named):
    body = {"model": "marian"} | ({} if path == "/api/circuits" else {"text": TEXT}) | body
    r = client.post(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and named in detail and "encoder-decoder" in detail, detail


def test_models_list_encoder_decoders(client):
    models = {m["id"]: m for m in client.get("/api/models").json()}
    for family in FAMILIES:
        m = models[family]
        assert (m["kind"], m["architecture"], m["layers"], m["heads"]) == \
            ("encoder-decoder", family.split("-")[0], 2, 4)
    assert "untied LM head" in models["t5"]["description"] and "tied" in models["t5-relu"]["description"]


def test_unsupported_config_options_are_refused(folders, tmp_path):
    import shutil
    folder = Path(shutil.copytree(folders["marian"], tmp_path / "m"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"share_encoder_decoder_embeddings": False}))
    with pytest.raises(ModelUnavailable, match="separate encoder and decoder vocabularies"):
        hf_folders.inspect(folder)
    (folder / "config.json").write_text(json.dumps(config | {"decoder_attention_heads": 2}))
    with pytest.raises(ModelUnavailable, match="encoder_attention_heads 4 differs from its decoder_attention_heads 2"):
        hf_folders.inspect(folder)


def _cross_modules(model, family: str, layer: int):
    """transformers' cross-attention of decoder layer `layer`: (module, q, k, v, o projections)."""
    if family.startswith("t5"):
        a = model.decoder.block[layer].layer[1].EncDecAttention
        return a, a.q, a.k, a.v, a.o
    a = model.model.decoder.layers[layer].encoder_attn
    return a, a.q_proj, a.k_proj, a.v_proj, a.out_proj


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_cross_attention_steps(family, folders, client):
    """/api/stages explains a cross-attention head (the default `attention`): Q from the decoder's tokens (the input
    transformers' cross-attention reads, caught with a hook), K and V from the encoder's output (transformers'
    encoder_last_hidden_state) through the head's projections; the probabilities, and /api/attention's
    cross_attention (the ONNX graph), within float32's derived bound of transformers' float64 value; every step
    follows from the one before."""
    l, h, H = 1, 2, 4
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folders[family], attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folders[family])
    src = tok(TEXT)["input_ids"]
    tgt = [model.config.decoder_start_token_id] + tok(text_target=DECODER_TEXT)["input_ids"][:-1]
    attn, wq, wk, wv, wo = _cross_modules(model, family, l)
    seen = {}

    def keep_input(module, args, kwargs):                     # the decoder's hidden states the queries are made of
        seen["x"] = kwargs.get("hidden_states", args[0] if args else None)
    hook = attn.register_forward_pre_hook(keep_input, with_kwargs=True)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([tgt]), output_attentions=True)
    hook.remove()
    split = lambda t: t[0].reshape(t.shape[1], H, -1)[:, h].numpy()   # noqa: E731  [T, dh] of head h

    body = {"model": family, "text": TEXT, "decoder_text": DECODER_TEXT}
    st = client.post("/api/stages", json=body | {"layer": l, "head": h})
    assert st.status_code == 200, st.text
    st = st.json()
    ans = client.post("/api/attention", json=body | {"layers": [l], "heads": [h]}).json()
    assert st["attention"] == "cross" and st["provider"] == "numpy"
    assert list(st["query_tokens"]) == ans["decoder_tokens"] and list(st["key_tokens"]) == ans["tokens"]
    probs = np.asarray(st["probs"], np.float64)
    assert probs.shape == (len(tgt), len(src)) and peaked(probs) >= 0.5
    # The steps (NumPy) and the served graph (ONNX) are two float32 computations of transformers' float64 value: each
    # is within its derived float32 bound (tests/float32.py: these wide-weight checkpoints score up to ~20, so a
    # weight can be ~1e-5 off on one CPU and further on another: a bound measured on one machine is no bound)
    exact, bound = float32_bound(model, lambda o: o.cross_attentions[l][:, h], input_ids=torch.tensor([src]),
                                 decoder_input_ids=torch.tensor([tgt]), output_attentions=True)
    assert bound.max() < 1e-2                                            # the check means something
    assert_within(probs, exact, bound, "the steps' probabilities")
    assert_within(ans["cross_attention"][0][0], exact, bound, "the served graph's cross-attention")
    with torch.inference_mode():
        memory = out.encoder_last_hidden_state                                    # [1, S, D]
        want = {"x": seen["x"][0].numpy(), "q": split(wq(seen["x"])), "k": split(wk(memory)), "v": split(wv(memory))}
    for name, w in want.items():
        got = np.asarray(st[name], np.float64)
        assert got.shape == w.shape, name
        np.testing.assert_allclose(got, w, atol=ATOL * max(1.0, np.abs(w).max()), rtol=0, err_msg=name)
    q, k, v = (np.asarray(st[n], np.float64) for n in "qkv")
    scores = np.asarray(st["scores"], np.float64)
    np.testing.assert_allclose(scores, q @ k.T, atol=1e-4 * max(1.0, np.abs(scores).max()), rtol=0)
    np.testing.assert_allclose(st["scaled"], scores * st["scale"], atol=1e-4 * max(1.0, np.abs(scores).max()))
    assert st["scale"] == (1.0 if family == "t5" else 16 ** -0.5)
    assert not np.asarray(st["mask"]).any()                          # nothing is hidden from a decoder token
    masked = np.asarray(st["masked"], np.float64)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(-1, keepdims=True), probs, atol=1e-6, rtol=0)
    np.testing.assert_allclose(st["ctx"], probs @ v, atol=1e-4 * max(1.0, np.abs(v).max()), rtol=0)
    W = wo.weight.detach().numpy()[:, h * 16:(h + 1) * 16]                                   # [D, dh]
    contribution = np.asarray(st["contribution"], np.float64)
    np.testing.assert_allclose(contribution, np.asarray(st["ctx"]) @ W.T,
                               atol=1e-4 * max(1.0, np.abs(contribution).max()), rtol=0)


def test_decoder_self_attention_steps_with_t5_position_bias(folders, client):
    """The decoder's own head, T5: the mask the steps add is the causal mask plus T5's position bias; the probabilities
    are transformers'. `limit` cuts queries and keys; a single-stack model refuses `attention` by name."""
    _, tgt, out = reference(folders["t5"], TEXT, DECODER_TEXT)
    body = {"model": "t5", "text": TEXT, "decoder_text": DECODER_TEXT, "layer": 0, "head": 1, "attention": "decoder"}
    st = client.post("/api/stages", json=body).json()
    assert st["causal"] is True and st["query_tokens"] == st["key_tokens"]
    probs, mask = np.asarray(st["probs"]), np.asarray(st["mask"], np.float64)
    np.testing.assert_allclose(probs, out.decoder_attentions[0][0, 1].numpy(), atol=ATOL, rtol=0)
    upper = np.triu(np.ones_like(mask, bool), 1)
    assert (mask[upper] < -1e30).all() and (probs[upper] == 0).all() and np.abs(mask[~upper]).max() > 0   # the bias
    np.testing.assert_allclose(st["masked"], np.asarray(st["scaled"]) + mask, atol=1e-5, rtol=0)
    part = client.post("/api/stages", json=body | {"attention": "cross", "limit": 3}).json()
    assert np.asarray(part["probs"]).shape == (3, 3) and np.asarray(part["k"]).shape == (3, 16)
    assert len(tgt) > 3


def test_steps_options_of_encoder_decoders_refused_elsewhere():
    from fastapi.testclient import TestClient

    with TestClient(create_app(Settings(models=["tiny-gpt"], cache=CACHE))) as c:
        r = c.post("/api/stages", json={"model": "tiny-gpt", "text": TEXT, "layer": 0, "head": 0,
                                        "attention": "cross"})
    assert r.status_code == 422 and r.json()["detail"] == ("attention is for encoder-decoders (T5, BART, Marian); "
                                                           "'tiny-gpt' is a decoder: leave it out"), r.text
