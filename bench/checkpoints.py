"""Random checkpoints of the exact shapes researchers study, as Hugging Face folders, for the big-model tests and
bench/big_models.py (nothing downloaded: the weights are drawn here, the config is transformers' own LlamaConfig).

    folder = llama(tmp / "l1b", "l1b", "bfloat16")            # Llama 3.2 1B's shapes, bf16, ~2.5 GB
    folder = llama(tmp / "l8b", "l8b", "bfloat16")            # Llama 3.1 8B's, ~16 GB, written tensor by tensor
    folder = llama(tmp / "l8b-2", "l8b", "bfloat16", layers=2)   # the same first two layers and ends, nothing else

Every tensor is read from its own offset of shared normal draws (a hash of its name), so a checkpoint cut to fewer
layers holds the very same weights as the full one. Queries and keys are drawn wide enough that attention is peaked
(a random-weight parity test is only evidence when rows are: mean row max >= 0.5, checked by the tests): std
2.6 / sqrt(hidden) puts a head's scaled scores at a standard deviation of ~6.8 whatever the width. And the network
is stable, as a trained one is: the token embedding at unit scale and the output projections (o_proj, down_proj)
at std 0.005, so each layer adds a little to the stream. With transformers' 0.02 everywhere a random deep model is
chaotic: float32's rounding grows layer by layer, and at SmolLM2's 30 layers transformers' own float32 run was
2.5e-3 off its float64 run (here: 5e-6), which no parity bound can be set against. Other weights: std 0.02; norms
1 + N(0, 0.1^2). The tokenizer is byte-level (256 byte tokens + the model's special tokens at their published ids):
a text of n ASCII characters is n tokens after <|begin_of_text|>.
"""
from __future__ import annotations

import functools
import hashlib
import json
import struct
from pathlib import Path

import numpy as np

SHAPES = {
    # SmolLM2-135M (HuggingFaceTB/SmolLM2-135M): the zoo's model, as a random checkpoint (bench/gpu.py)
    "smol": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                 intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                 max_position_embeddings=8192, rms_norm_eps=1e-5, head_dim=64, rope_scaling=None),
    # Llama 3.2 1B (meta-llama/Llama-3.2-1B): tied embeddings, RoPE scaling llama3 (factor 32 from 8192)
    "l1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
                max_position_embeddings=131072, rms_norm_eps=1e-5, head_dim=64,
                rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=8192)),
    # Llama 3.1 8B (meta-llama/Llama-3.1-8B): untied LM head, RoPE scaling llama3 (factor 8 from 8192)
    # a small model of the same family, for tests of the GGUF writer's files (K-quants: dimensions multiples of 256)
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=768, vocab_size=384, tie_word_embeddings=False, rope_theta=500000.0,
                 max_position_embeddings=8192, rms_norm_eps=1e-5, head_dim=64, rope_scaling=None),
    "l8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                max_position_embeddings=131072, rms_norm_eps=1e-5, head_dim=128,
                rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=8192)),
}
BOS, EOS = 128000, 128001
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def tensors(shape: dict, layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor of a LlamaForCausalLM of these shapes, by transformers' names, in file order."""
    d, f, V = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    dh = shape["head_dim"]
    q, kv = shape["num_attention_heads"] * dh, shape["num_key_value_heads"] * dh
    out = {"model.embed_tokens.weight": (V, d)}
    for i in range(shape["num_hidden_layers"] if layers is None else layers):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (q, d),
                p + "self_attn.k_proj.weight": (kv, d), p + "self_attn.v_proj.weight": (kv, d),
                p + "self_attn.o_proj.weight": (d, q), p + "post_attention_layernorm.weight": (d,),
                p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f)}
    out["model.norm.weight"] = (d,)
    if not shape["tie_word_embeddings"]:
        out["lm_head.weight"] = (V, d)
    return out


OUT_STD = 0.005       # the output projections' (see std_of)
EMBED_STD = 1.0       # the token embedding's
BASE = 1 << 26        # normal draws shared by every tensor of a checkpoint: each reads them from an offset of its own


@functools.lru_cache(maxsize=2)
def _base(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(BASE, dtype=np.float32)


def drawn(name: str, size: tuple[int, ...], hidden: int, seed: int = 0, chunk: int = 1 << 22):
    """One tensor's float32 values, the same in every cut of a model, in order, at most `chunk` at a time (one
    buffer, reused: copy what you keep): N(0, 1) draws
    read from an offset of the tensor's own (its name's hash) in a shared buffer of BASE draws (a tensor larger than
    it reads it again, each pass times a factor of its own, so no two rows are equal), scaled by std_of (norm weights:
    1 + 0.1 x). One pass over a buffer that stays in cache: an 8B checkpoint at the disk's speed."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    base, n = _base(seed), int(np.prod(size))
    norm = name.endswith("norm.weight")
    std = 0.1 if norm else std_of(name, hidden)
    buf = np.empty(min(n, chunk), np.float32)
    at, done, k = h % BASE, 0, 0
    while done < n:
        part = min(n - done, BASE - at, chunk)
        out = buf[:part]
        np.multiply(base[at:at + part], np.float32(std * (1.0 + 0.01 * k)), out=out)
        if norm:
            out += np.float32(1.0)
        yield out
        done, at = done + part, at + part
        if at == BASE:
            at, k = 0, k + 1


def std_of(name: str, hidden: int) -> float:
    """A tensor's standard deviation: queries and keys wide (peaked attention); the embedding at unit scale and the
    sublayers' output projections small, so each layer adds a tenth of the stream or so (a stable network: float32's
    rounding is not amplified layer by layer, and float32 runs agree with float64 to ~1e-6, as a trained model's)."""
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        return 2.6 / np.sqrt(hidden)
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return EMBED_STD if "embed" in name else 0.02
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return OUT_STD
    return 0.02


def write_safetensors(path: Path, names: dict[str, tuple[int, ...]], make, dtype: str) -> None:
    """A safetensors file written tensor by tensor: the header first (every offset known from the shapes), then each
    tensor's values as `make(name, shape)` yields them, in parts (float32 or narrower), each cast to `dtype` and
    written: no more than one part is ever in memory."""
    from attnscope.model.precision import STORAGE

    np_dtype = STORAGE[dtype]
    header, offset = {}, 0
    for name, size in names.items():
        n = int(np.prod(size)) * np_dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(size), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)                               # data starts 8-byte aligned
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, size in names.items():
            written = 0
            for part in make(name, size):
                f.write(np.ascontiguousarray(part.astype(np_dtype, copy=False)).reshape(-1).view(np.uint8))
                written += part.size
            assert written == int(np.prod(size)), (name, written, size)
    tmp.replace(path)


def parts(a: np.ndarray, chunk: int = 1 << 22):
    """A C-ordered array's values, `chunk` at a time (views)."""
    flat = a.reshape(-1)
    return (flat[i:i + chunk] for i in range(0, flat.size, chunk))


def byte_tokenizer(vocab_size: int = 128256) -> str:
    """A byte-level tokenizer as tokenizer.json: each of the 256 bytes one token (ids 0-255, written in GPT-2's byte
    alphabet), and Llama 3's <|begin_of_text|> / <|end_of_text|> at their own ids (a smaller vocabulary: its last
    two), BOS added before every text."""
    bos, eos = (BOS, EOS) if vocab_size > EOS else (vocab_size - 2, vocab_size - 1)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    from attnscope.sources.tokens import bytes_to_unicode

    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)} | {f"<unused_{i}>": i for i in range(256, bos)}   # never produced:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))   # no merges make them; they put the specials at their ids
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", bos)])
    data = json.loads(tok.to_str())
    data["added_tokens"] = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False,
                                 special=True) for i, t in ((bos, "<|begin_of_text|>"), (eos, "<|end_of_text|>"))]
    return json.dumps(data)


def llama(folder: str | Path, name: str, dtype: str = "bfloat16", layers: int | None = None, seed: int = 0) -> Path:
    """A random checkpoint of SHAPES[name] in `folder` (config.json, model.safetensors, tokenizer.json), in `dtype`;
    layers: only the first this many (the same weights). Written once: an existing complete folder is kept."""
    from transformers import LlamaConfig

    folder = Path(folder)
    shape = dict(SHAPES[name])
    if layers is not None:
        shape["num_hidden_layers"] = layers
    done = folder / ".complete"
    if done.is_file() and done.read_text() == json.dumps([name, dtype, layers, seed]):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    specials = (BOS, EOS) if shape["vocab_size"] > EOS else (shape["vocab_size"] - 2, shape["vocab_size"] - 1)
    cfg = LlamaConfig(**shape, bos_token_id=specials[0], eos_token_id=specials[1])
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(byte_tokenizer(shape["vocab_size"]))
    write_safetensors(folder / "model.safetensors", tensors(shape),
                      lambda n, size: drawn(n, size, shape["hidden_size"], seed), dtype)
    done.write_text(json.dumps([name, dtype, layers, seed]))
    return folder


def text(n: int) -> str:
    """A text of exactly n byte tokens (the byte tokenizer adds <|begin_of_text|> before it)."""
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches in the "
             "old market square near the river ").split(" ")
    out = ""
    i = 0
    while len(out) < n:
        out += words[i % len(words)] + " "
        i += 1
    return out[:n]


def widened(source: str | Path, folder: str | Path) -> Path:
    """A copy of checkpoint folder `source` with every weight widened to float32 (exactly: bf16 and f16 values are
    float32 values): the same model, twice the bytes. Written once."""
    from attnscope.model.precision import widen
    from attnscope.sources.safetensors import read_header, read_tensor

    source, folder = Path(source), Path(folder)
    done = folder / ".complete"
    if done.is_file() and done.read_text() == str(source.resolve()):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json"):
        (folder / name).write_bytes((source / name).read_bytes())
    header = read_header(source / "model.safetensors")
    write_safetensors(folder / "model.safetensors", {n: t.shape for n, t in header.items()},
                      lambda n, size: map(widen, parts(read_tensor(header[n]))), "float32")
    config = json.loads((folder / "config.json").read_text())
    config["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    done.write_text(str(source.resolve()))
    return folder


# ---- GGUF files of random blocks (issue 49) --------------------------------------------------------------------------
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def q4_k_m_type(name: str, layers: int) -> str:
    """The ggml type llama.cpp's Q4_K_M gives a Llama tensor (llama-quant.cpp, llama_tensor_get_type): norms F32;
    the output Q6_K; attn_v and ffn_down Q6_K in the layers where it "uses more bits" (the first and last eighth, and
    every third between), else Q4_K; everything else (token_embd too) Q4_K."""
    if name.endswith("norm.weight"):
        return "F32"
    if name == "output.weight":
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(name.split(".")[1])
        more = i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2
        return "Q6_K" if more else "Q4_K"
    return "Q4_K"


def random_k_blocks(kind: str, rows: int, cols: int, std: float, rng) -> np.ndarray:
    """[rows, cols / 256 * type size] random but sane blocks of a K-quant whose values have about this standard
    deviation and mean 0: random codes, small finite float16 scales (each super-block's d jittered by exp(0.2 N)).
      Q4_K  w = d * sc * q - dmin * m, q uniform in 0..15; every sub-block's sc = 8 and m = 15 (the 12 scale bytes
            8 x 4, 15 x 4, 8 | 15 << 4 x 4), dmin = 4 d: w = d (8 q - 60), std 36.9 d
      Q6_K  w = d * sc * (q - 32), q uniform in 0..63 (std 18.5), sc int8 uniform in 8..23 (rms 16.2)"""
    import gguf

    _, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    n = rows * (cols // 256)
    b = np.frombuffer(rng.bytes(n * size), np.uint8).reshape(n, size).copy()
    spread = 36.9 if kind == "Q4_K" else 18.5 * 16.2
    d = (std / spread * np.exp(0.2 * rng.standard_normal(n))).astype(np.float16)
    if kind == "Q4_K":
        b[:, 0:2] = d.view(np.uint8).reshape(n, 2)
        b[:, 2:4] = (d * np.float16(4)).view(np.uint8).reshape(n, 2)
        b[:, 4:8], b[:, 8:12], b[:, 12:16] = 8, 15, 8 | 15 << 4
    elif kind == "Q6_K":
        b[:, 192:208] = rng.integers(8, 24, (n, 16), dtype=np.uint8)
        b[:, 208:210] = d.view(np.uint8).reshape(n, 2)
    else:
        raise ValueError(f"random blocks of {kind} are not written here")
    return b.reshape(rows, -1)


def llama_gguf(path: str | Path, name: str, seed: int = 0, progress=None) -> Path:
    """A Q4_K_M GGUF file of random blocks in SHAPES[name]'s shapes (Llama metadata, a byte-level vocabulary as
    byte_tokenizer's: no merges, no BOS added), written with gguf's GGUFWriter one tensor at a time (an 8B file's
    4.9 GB never sit in memory). Types as llama.cpp's Q4_K_M (q4_k_m_type); standard deviations as std_of's (queries
    and keys wide: peaked attention); norms 1 + N(0, 0.1^2). No RoPE scaling (GGUF files carry Llama 3.1's as a
    rope_freqs tensor, which sources/gguf.py refuses). Written once: an existing file is kept. progress(name) after
    each tensor."""
    import gguf

    from attnscope.sources.tokens import bytes_to_unicode

    path = Path(path)
    if path.is_file():
        return path
    shape = SHAPES[name]
    L, d, V = shape["num_hidden_layers"], shape["hidden_size"], shape["vocab_size"]
    hf = tensors(shape)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for hf_name in hf:
        if hf_name.startswith("model.layers."):
            i, rest = hf_name.split(".")[2], hf_name.split(".", 3)[3].rsplit(".", 1)[0]
            names[hf_name] = f"blk.{i}.{GGUF_NAMES[rest]}.weight"
    bos, eos = (BOS, EOS) if V > EOS else (V - 2, V - 1)
    alphabet = bytes_to_unicode()
    tokens = [alphabet[b] for b in range(256)] + [f"<unused_{i}>" for i in range(256, V)]
    tokens[bos], tokens[eos] = "<|begin_of_text|>", "<|end_of_text|>"
    w = gguf.GGUFWriter(path.with_suffix(".tmp"), "llama")
    w.add_block_count(L)
    w.add_context_length(shape["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(shape["intermediate_size"])
    w.add_head_count(shape["num_attention_heads"])
    w.add_head_count_kv(shape["num_key_value_heads"])
    w.add_rope_dimension_count(shape["head_dim"])
    w.add_rope_freq_base(shape["rope_theta"])
    w.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in (bos, eos) else 1 for i in range(V)])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    kinds = {hf_name: q4_k_m_type(g_name, L) for hf_name, g_name in names.items()}
    for hf_name, size in hf.items():
        kind = gguf.GGMLQuantizationType[kinds[hf_name]]
        block, type_size = gguf.GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(size)) // block * type_size
        w.add_tensor_info(names[hf_name], size, np.dtype(np.float32), nbytes, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for hf_name, size in hf.items():
        h = int.from_bytes(hashlib.sha256(f"{seed}:{hf_name}".encode()).digest()[:8], "little")
        rng = np.random.default_rng(h)
        if kinds[hf_name] == "F32":
            w.write_tensor_data((1 + 0.1 * rng.standard_normal(size)).astype(np.float32))
        else:
            w.write_tensor_data(random_k_blocks(kinds[hf_name], *size, std_of(hf_name, d), rng))
        if progress:
            progress(names[hf_name])
    w.close()
    path.with_suffix(".tmp").replace(path)
    return path


def dequantised_llama(path, shape: dict, layers: int | None = None, ids=None, dtype: str = "float64"):
    """transformers' LlamaForCausalLM (eager attention, in `dtype`) on gguf's de-quantisation of a Llama GGUF file's
    tensors, q/k rows un-permuted by transformers' own GGUF tensor processor; layers: the first this many only; ids:
    the embedding's rows for these token ids only (a vocabulary of len(ids), token i = ids[i]: an 8B file's full
    embedding is 2 GB of float32), and no LM head."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    import gguf

    shape = dict(shape) | ({"num_hidden_layers": layers} if layers else {}) | (
        {"vocab_size": len(ids), "tie_word_embeddings": False} if ids is not None else {})
    model = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation="eager")).to(getattr(torch, dtype)).eval()
    heads = LlamaTensorProcessor(config={"num_attention_heads": shape["num_attention_heads"],
                                         "num_key_value_heads": shape["num_key_value_heads"]})
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"} | {f"blk.{i}.{g}.weight": f"model.layers.{i}.{hf}.weight"
                                                   for i in range(shape["num_hidden_layers"])
                                                   for hf, g in GGUF_NAMES.items()}
    sd = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name not in names or (ids is not None and t.name == "output.weight"):
            continue
        data = t.data[np.asarray(ids)] if ids is not None and t.name == "token_embd.weight" else t.data
        w = heads.process(gguf.quants.dequantize(data, t.tensor_type), t.name).weights
        sd[names[t.name]] = torch.from_numpy(np.array(w, dtype))
    missing = model.load_state_dict(sd, strict=False).missing_keys
    assert set(missing) <= {"lm_head.weight"} if ids is not None else not missing, missing
    return model
