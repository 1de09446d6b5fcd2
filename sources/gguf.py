"""Llama-family and Gemma 3 models from GGUF files (llama.cpp's format): config, weights kept in their blocks, tokenizer.

    model = load_gguf(path, cache=folder)      # de-quantised once (progress bar), then read from the cache
    tokenizer = gguf_tokenizer(path, cache=folder)

`GGUFFile` parses the file's header, metadata and tensor table (the format's spec: ggml's docs/gguf.md); `gguf`
(llama.cpp's own package) de-quantises Q4_1 / Q8_0 / Q4_K... blocks to float32. gguf's own reader is not used: it
makes a NumPy view per value (a 262,144-token vocabulary: ~17 s a read on 2 cores, where this takes ~0.3 s).
Two conventions differ from transformers, and both are undone here as transformers' GGUF loader
undoes them (transformers/modeling_gguf_pytorch_utils.py, LlamaTensorProcessor):
  - tensor shapes are listed fastest axis first (ne0, ne1); `dequantize` already returns [out, in];
  - llama.cpp's converter permutes the rows of attn_q / attn_k for its interleaved RoPE (pairs 2i,
    2i+1); transformers' rotate-half pairs (i, i + d/2), so the rows are put back (`unpermute`).
Quantised tensors are kept in their blocks (model/quantized.Blocks, onnxruntime's MatMulNBits layout, exact:
sources/gguf_blocks.py): graphs multiply by them as they are, the NumPy reference de-quantises what it reads. They are
cached, re-laid out, as one .safetensors file (codes, scales, zero points and offsets per weight: about the GGUF
file's size, no float32 copy) in a folder the caller passes in, under a key made of the GGUF file's bytes and this
module's source, so a later start maps that file instead of parsing the blocks again.

Gemma 3 (general.architecture "gemma3"), as transformers' GGUF loader reads it (Gemma2TensorProcessor): no row
permutation (llama.cpp rotates Gemma's q/k in the rotate-half layout already); its norms are stored as 1 + weight,
which is the multiplier our RMSNorm holds (sources/decoders.py); what the file does not say is transformers'
Gemma3TextConfig default (query_pre_attn_scalar 256, local RoPE base 10000, every 6th layer global). Its vocabulary
is sentencepiece-style (tokenizer.ggml.model "llama"): gemma_tokenizer rebuilds it as transformers does.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .gguf_blocks import expressible, to_blocks
from .safetensors import DTYPES, INTEGERS, read_header, write_streamed
from .store import mapped, release
from .spec import MAX_POSITIONS, Generation
from .tokens import bytes_to_unicode
from ..model.precision import scalar
from ..model.quantized import FACTORS, PARTS, Blocks, expand
from ..model.transformer import Transformer, TransformerConfig
from ..model.weights import load_state_dict

ARCHITECTURES = ("llama", "gemma3")
# GGUF tensor name (after "blk.N.") -> ours (after "blocks.N.")
BLOCK_NAMES = {"attn_norm.weight": "ln1.weight", "attn_q.weight": "attn.q_proj.weight",
               "attn_k.weight": "attn.k_proj.weight", "attn_v.weight": "attn.v_proj.weight",
               "attn_output.weight": "attn.o_proj.weight", "ffn_norm.weight": "ln2.weight",
               "ffn_gate.weight": "mlp.gate.weight", "ffn_up.weight": "mlp.up.weight",
               "ffn_down.weight": "mlp.down.weight"}
TOP_NAMES = {"token_embd.weight": "wte", "output_norm.weight": "ln_f.weight", "output.weight": "lm_head.weight"}
GEMMA3_BLOCK_NAMES = {k: v for k, v in BLOCK_NAMES.items() if not k.startswith("ffn_norm")} | {
    "post_attention_norm.weight": "post_attn_norm.weight", "ffn_norm.weight": "ln2.weight",
    "post_ffw_norm.weight": "post_mlp_norm.weight", "attn_q_norm.weight": "attn.q_norm.weight",
    "attn_k_norm.weight": "attn.k_norm.weight"}
GEMMA3_DEFAULTS = dict(query_pre_attn_scalar=256.0, rope_local_theta=10000.0, sliding_window_pattern=6)


class GGUFTensor(NamedTuple):
    name: str
    tensor_type: int           # a gguf.GGMLQuantizationType
    data: np.ndarray           # a view of the mapped file: values, or a quantised type's bytes [..., row bytes]


class GGUFFile:
    """A GGUF file (little-endian, versions 2 and 3): `fields` maps each metadata key to its value (str, int, float,
    bool, or a list of them), `tensors` lists the tensors in file order, their data mapped, not read.

    Layout: magic b"GGUF", u32 version, u64 tensor count, u64 key/value count; each key/value: a string key (u64
    length, UTF-8 bytes), a u32 value type, the value (an array: u32 item type, u64 count, the items); each tensor:
    its name, u32 dims, u64 extents fastest axis first, u32 ggml type, u64 offset into the data, which starts at the
    next multiple of general.alignment (32 by default) after the table."""

    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    STRING, ARRAY = 8, 9

    def __init__(self, path):
        import gguf
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        self.raw = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self.raw)
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{path.name} is not a GGUF file (it does not start with 'GGUF')")
        version, n_tensors, n_fields = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{path.name}: GGUF version {version} is not supported (2 and 3 are; a big-endian file "
                             f"reads as a huge version)")
        self._buf, self._at = buf, 24
        self.fields = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I"))
        table = []
        for _ in range(n_tensors):
            name, n_dims = self._string(), self._unpack("<I")
            dims = struct.unpack_from(f"<{n_dims}Q", buf, self._at)
            self._at += 8 * n_dims
            table.append((name, dims, self._unpack("<I"), self._unpack("<Q")))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self._at // align) * align
        self.tensors = []
        for name, dims, kind, offset in table:
            kind = gguf.GGMLQuantizationType(kind)
            block, type_bytes = gguf.GGML_QUANT_SIZES[kind]
            shape = tuple(reversed(dims))                                      # slowest axis first
            n_bytes = int(np.prod(dims)) * type_bytes // block
            data = self.raw[start + offset:start + offset + n_bytes]
            if kind.name in _PLAIN:                                            # plain values: F32, F16, I8...
                data = data.view(_PLAIN[kind.name]).reshape(shape)
            else:                                                              # blocks (and BF16) as bytes
                data = data.reshape(gguf.quants.quant_shape_to_byte_shape(shape, kind))
            self.tensors.append(GGUFTensor(name, kind, data))
        del self._buf

    def _unpack(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self._buf, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        self._at += n
        return str(self._buf[self._at - n:self._at], "utf-8")

    def _value(self, kind: int):
        if kind == self.STRING:
            return self._string()
        if kind in self.SCALARS:
            return self._unpack(self.SCALARS[kind])
        if kind != self.ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self._unpack("<I"), self._unpack("<Q")
        if item in self.SCALARS:                                               # numbers: one NumPy read
            fmt = np.dtype(self.SCALARS[item])
            out = np.frombuffer(self._buf, fmt, count, self._at).tolist()
            self._at += fmt.itemsize * count
            return out
        return [self._value(item) for _ in range(count)]


_PLAIN = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}
"""ggml types read as values (as gguf's reader reads them); every other type is handed to its de-quantiser as bytes."""


def gguf_config(reader) -> TransformerConfig:
    """Our config from the file's metadata ("llama.block_count", ...)."""
    arch = reader.fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"only Llama-family GGUF files are supported (general.architecture 'llama'), and Gemma 3's "
                         f"('gemma3'); this one is {arch!r}")
    scaling = reader.fields.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"RoPE scaling {scaling!r} is not supported in GGUF files (a Hugging Face folder's "
                         f"rope_parameters are)")
    g = lambda key, default=None: reader.fields.get(f"{arch}.{key}", default)  # noqa: E731
    n_heads, d_model = g("attention.head_count"), g("embedding_length")
    d_head = g("attention.key_length", d_model // n_heads)
    if g("rope.dimension_count", d_head) != d_head:
        raise ValueError(f"partial rotary embeddings (rope.dimension_count {g('rope.dimension_count')} of "
                         f"head dim {d_head}) are not supported")
    names = {t.name for t in reader.tensors}
    if arch == "gemma3":
        return _gemma3_config(reader, g, names)
    return TransformerConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in reader.fields
        else g("vocab_size"),
        max_positions=min(g("context_length"), MAX_POSITIONS), d_model=d_model, n_heads=n_heads, n_layers=g("block_count"),
        d_ff=g("feed_forward_length"), norm_first=True, causal=True, final_norm=True,
        layer_norm_eps=float(g("attention.layer_norm_rms_epsilon")), norm="rms", position="rope", mlp="swiglu",
        attention="gqa", n_kv_heads=g("attention.head_count_kv", n_heads), d_head=d_head,
        rope_theta=float(g("rope.freq_base", 10000.0)), qkv_bias=False, bias=False, lm_head=True,
        tie_embeddings="output.weight" not in names)


def _gemma3_config(reader, g, names) -> TransformerConfig:
    """Gemma 3 from the file's metadata, the rest transformers' Gemma3TextConfig defaults (GEMMA3_DEFAULTS).
    Positions are capped at MAX_TOKENS: the served limit (RoPE tables for 32768 positions would be 128 MB)."""
    from .spec import MAX_TOKENS

    L, d, n_heads = g("block_count"), g("embedding_length"), g("attention.head_count")
    pattern = GEMMA3_DEFAULTS["sliding_window_pattern"]
    window = int(g("attention.sliding_window", 0) or 0)
    return TransformerConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"]), max_positions=min(g("context_length"), MAX_TOKENS),
        d_model=d, n_heads=n_heads, n_layers=L, d_ff=g("feed_forward_length"), norm_first=True, causal=True,
        final_norm=True, layer_norm_eps=float(g("attention.layer_norm_rms_epsilon")), norm="rms", position="rope",
        mlp="geglu", attention="gqa", n_kv_heads=g("attention.head_count_kv", n_heads),
        d_head=g("attention.key_length", d // n_heads), rope_theta=float(g("rope.freq_base", 1_000_000.0)),
        qkv_bias=False, bias=False, lm_head=True, tie_embeddings="output.weight" not in names,
        embed_scale=float(scalar(d ** 0.5)), query_pre_attn_scalar=GEMMA3_DEFAULTS["query_pre_attn_scalar"],
        output_norms=True, sliding_window=window, layer_types=tuple(
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)) if window else (),
        rope_local_theta=GEMMA3_DEFAULTS["rope_local_theta"], qk_norm="head")


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: within each head, GGUF row 2i + j is row j * d/2 + i here.

    llama.cpp's converter does w.reshape(n, 2, d/2, in).swapaxes(1, 2) so that its interleaved RoPE
    pairs rows (2i, 2i+1); this is the inverse, as in transformers' GGUF loader."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_tensor_of(t: GGUFTensor) -> np.ndarray | Blocks:
    """One GGUF tensor as the model keeps it: a 2-D quantised one in its blocks (sources/gguf_blocks.py: MatMulNBits'
    layout, exact), float32 and float16 as they are, anything else (1-D blocks, a format Blocks cannot express, BF16)
    de-quantised to float32, that tensor alone."""
    import gguf

    if t.tensor_type.name in ("F32", "F16"):
        return np.asarray(t.data)
    if t.data.ndim == 2 and expressible(t.tensor_type):
        return to_blocks(t.data, t.tensor_type)
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)   # [out, in]


def _rows_unpermuted(w, n_heads: int):
    """unpermute on a weight's rows, in its blocks for a quantised one (rows are independent of the blocks along K)."""
    if isinstance(w, Blocks):
        return w.map(lambda a: np.ascontiguousarray(unpermute(a, n_heads)))
    return unpermute(w, n_heads)


def read_weights(reader, cfg: TransformerConfig):
    """Every tensor as the model keeps it (read_tensor_of: quantised ones in their blocks), renamed to our flat
    names, q/k rows un-permuted: (name, weight) pairs, made one at a time, each tensor's pages of the file given back
    once it is read (an 8B file's 4.9 GB are never in memory at once)."""
    gemma = cfg.mlp == "geglu"                  # Gemma 3: its own names, no q/k permutation
    block_names = GEMMA3_BLOCK_NAMES if gemma else BLOCK_NAMES
    for t in reader.tensors:
        w = read_tensor_of(t)
        if t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if rest not in block_names:
                raise ValueError(f"unexpected tensor {t.name} in a {'Gemma 3' if gemma else 'Llama'} GGUF file")
            if rest in ("attn_q.weight", "attn_k.weight") and not gemma:
                w = _rows_unpermuted(w, cfg.n_heads if rest == "attn_q.weight" else cfg.n_kv_heads)
            yield f"blocks.{layer}.{block_names[rest]}", w
        elif t.name in TOP_NAMES:
            yield TOP_NAMES[t.name], w
        else:   # e.g. rope_freqs (Llama 3's scaled RoPE): not supported in GGUF files, and never silently dropped
            raise ValueError(f"unexpected tensor {t.name} in a Llama GGUF file" + (
                " (Llama 3.x RoPE scaling: supported from a Hugging Face folder's rope_parameters, not from GGUF "
                "files yet)" if t.name.startswith("rope_freqs") else ""))
        release([t.data])                       # a view of it (F32) reads its pages again when touched


KEY_BYTES = 1 << 24   # the cache key reads this many bytes at each end of a GGUF file, and its size


def cache_key(path) -> str:
    """Hash of the GGUF file (its size, its first and last KEY_BYTES: the metadata, the tensor table and the last
    tensors' data) and of this loader's source: either changing rebuilds the cache. Not every byte: an 8B model's
    file is 5-16 GB, and a start would read all of it."""
    st = Path(path).stat()
    return _cache_key(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.cache
def _cache_key(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes() + (Path(__file__).parent / "gguf_blocks.py").read_bytes())
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(KEY_BYTES))
        f.seek(max(size - KEY_BYTES, 0))
        h.update(f.read(KEY_BYTES))
    return h.hexdigest()[:16]


def _cached(cache, path: Path, suffix: str) -> Path | None:
    return None if cache is None else Path(cache) / f"{path.stem}-{cache_key(path)}{suffix}"


def _write_atomically(target: Path, write, stale: str | None = None) -> None:
    """write(tmp), then rename to target; then delete the files matching the glob `stale` (older keys)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, target)
    for old in target.parent.glob(stale) if stale else ():
        if old != target and ".tmp" not in old.name:
            old.unlink(missing_ok=True)


def file_config(path, cache: str | Path | None = None) -> TransformerConfig:
    """The file's config without de-quantising: from the cached weights' metadata when load_gguf has written
    them (parsing a GGUF file's metadata, its vocabulary included, takes seconds), else from the file."""
    from safetensors import safe_open

    cached = _cached(cache, Path(path), ".safetensors") if Path(path).is_file() else None
    if cached is not None and cached.is_file():
        try:
            with safe_open(cached, "np") as f:
                return TransformerConfig(**json.loads(f.metadata()["config"]))
        except Exception:  # noqa: BLE001 - a truncated or foreign file: read the GGUF file instead
            pass
    return gguf_config(GGUFFile(path))


def _from_cache(cached: Path, quantised: dict[str, list[int]]) -> dict[str, np.ndarray | Blocks]:
    """The weights load_gguf cached, each a view of the mapped file: quantised ones (`quantised`: name -> [bits,
    block]) put together from their parts ("<name>.codes", ...)."""
    views = {name: mapped(t.path).view(t.start, t.end, (DTYPES | INTEGERS)[t.dtype], t.shape)
             for name, t in read_header(cached).items()}
    sd = {name: Blocks.of({part: views.pop(f"{name}.{part}", None) for part in PARTS + FACTORS}, bits, block)
          for name, (bits, block) in quantised.items()}
    return sd | views


def load_gguf(path, cache: str | Path | None = None, desc: str | None = None) -> Transformer:
    """A Transformer from a Llama-family GGUF file. With a cache folder, the weights (in their blocks) are
    written to <cache>/<file name>-<key>.safetensors on the first call, and afterwards the model reads them from
    there as views of the mapped file (sources/store.py: nothing copied, pages read when used)."""
    from safetensors import safe_open
    from tqdm import tqdm

    path = Path(path)
    cached, sd = _cached(cache, path, ".safetensors"), None
    if cached is not None and cached.is_file():
        try:
            with safe_open(cached, "np") as f:
                cfg = TransformerConfig(**json.loads(f.metadata()["config"]))
                quantised = json.loads(f.metadata().get("blocks", "{}"))
            sd = _from_cache(cached, quantised)
        except Exception:  # noqa: BLE001 - a truncated or foreign file: build it again below
            cached.unlink(missing_ok=True)
    if sd is None:
        reader = GGUFFile(path)
        cfg, quantised = gguf_config(reader), {}
        bar = tqdm(total=len(reader.tensors), desc=f"{desc or path.stem}: reading GGUF blocks", unit="tensor",
                   leave=False)

        def parts():                                 # each weight's arrays, written as it is read, then dropped
            for name, w in read_weights(reader, cfg):
                quantised.update({name: [w.bits, w.block]} if isinstance(w, Blocks) else {})
                yield from expand({name: w}).items()
                bar.update(1)
        with bar:
            if cached is None:
                sd = dict(read_weights(reader, cfg))
            else:
                meta = lambda: {"config": json.dumps(asdict(cfg)), "blocks": json.dumps(quantised)}   # noqa: E731
                _write_atomically(cached, lambda tmp: write_streamed(tmp, parts(), meta),
                                  stale=f"{path.stem}-*.safetensors")   # keep only the current one
                sd = _from_cache(cached, quantised)                      # views of the file
    return load_state_dict(Transformer(cfg, seed=None), in_memory(sd))


# A GGUF model whose float32 weights come to at most this would be de-quantised in memory at load (the cache holds only
# blocks): 0, every model is served from its blocks, as exact as float32 weights (centred zero points, MatMulNBits'
# float32 kernel: graphs/builder Graph.times) in a fifth of their memory; generation reads them prepacked
# (graphs/decoding.packs). bench/quantized.py sets it to compare the two.
F32_IN_MEMORY_BYTES = 0


def in_memory(sd: dict, limit: int | None = None) -> dict:
    """sd with its Blocks de-quantised to float32 arrays when the model's float32 weights come to at most `limit`
    (None: F32_IN_MEMORY_BYTES), else as it is."""
    limit = F32_IN_MEMORY_BYTES if limit is None else limit
    if not any(isinstance(w, Blocks) for w in sd.values()) or 4 * sum(w.size for w in sd.values()) > limit:
        return sd
    return {name: w.dequantize() if isinstance(w, Blocks) else w for name, w in sd.items()}


# ---- tokenizer ------------------------------------------------------------------------------
def _pre_tokenizer(pre: str | None):
    """How text is split before BPE, by the file's tokenizer.ggml.pre (llama.cpp's names).

    smollm: every numeral alone, then GPT-2's regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM, and the
    Digits + ByteLevel pre-tokenizer of SmolLM2's own tokenizer.json: its vocabulary has no multi-digit
    token). transformers' GGUF loader has no entry for "smollm" and uses GPT-2's regex alone; the two
    differ only at numerals outside 0-9 (², ½, ٣) and where two or more whitespace characters precede
    a numeral ("x  12": "ĠĠ" "1" "2" here, "Ġ" "Ġ" "1" "2" there). This follows the file.
    """
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in (None, "default", "gpt2", "gpt-2"):
        return byte_level
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported (known: default, gpt2, smollm)")


def build_tokenizer(tokens: list[str], merges: list[str], token_types: list[int], pre: str | None):
    """A `tokenizers` byte-level BPE from a GGUF vocabulary: tokens in id order, "a b" merges best first,
    the control tokens (type 3, like <|im_start|>) as special tokens and the user-defined ones (type 4)
    as added tokens, both matched whole in the text, as transformers' GGUF loader adds them.
    No BOS or EOS is added: the runtime tokenises exactly what the user typed."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    byte_of = set(bytes_to_unicode().values())
    spell = lambda t: t if set(t) <= byte_of else "".join(bytes_to_unicode()[b] for b in t.encode())  # noqa: E731
    vocab = {spell(t): i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)                 # 3: control
                            for t, kind in zip(tokens, token_types) if kind == 3 and set(t) <= byte_of])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)                          # 4: user-defined
                    for t, kind in zip(tokens, token_types) if kind == 4 and t in vocab])
    return tok


def gemma_tokenizer(tokens: list[str], token_types: list[int]):
    """Gemma's sentencepiece-style BPE from a GGUF vocabulary, as transformers' GGUF loader rebuilds it
    (integrations/gguf/gguf_tokenizer_mapping.py gemma_tokenizer, then GemmaTokenizer's pipeline):
      - spaces become "▁" before anything else (normalizer), bytes missing from the vocabulary fall back to
        <0xNN> tokens, unknown pieces fuse into one <unk>;
      - the file has no merges: they are every split of a token into two tokens of the vocabulary, ranked by the
        token's place in the file (its scores do not follow Gemma's merge order), as generate_merges ranks them;
      - tokens of two or more spaces are stored as spaces and respelled "▁▁..." first, so merges can reach them;
      - control tokens (type 3) are special, user-defined ones (type 4) added whole, as for byte-level files."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token, score in {t: -i for i, t in enumerate(tokens)}.items():    # score: minus its place in the file
        pairs = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        merges += [(a, b, score) for a, b in sorted(pairs, key=lambda p: (vocab[p[0]], vocab[p[1]]))]
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    tok = Tokenizer(models.BPE(vocab, [(a, b) for a, b, _ in merges], fuse_unk=True, unk_token="<unk>",
                               byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(tokens, token_types) if kind == 3])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, token_types) if kind == 4])
    return tok


def gguf_tokenizer(path, cache: str | Path | None = None):
    """The file's tokenizer (tokenizer.ggml.model "gpt2": byte-level BPE); cached as tokenizer.json."""
    from tokenizers import Tokenizer

    path = Path(path)
    cached = _cached(cache, path, ".tokenizer.json")
    if cached is not None and cached.is_file():
        try:
            return Tokenizer.from_file(str(cached))
        except Exception:  # noqa: BLE001 - the tokenizers library raises plain Exception
            cached.unlink(missing_ok=True)
    reader = GGUFFile(path)
    kind, arch = reader.fields.get("tokenizer.ggml.model"), reader.fields.get("general.architecture")
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if kind == "llama" and arch == "gemma3":
        tok = gemma_tokenizer(tokens, types)
    elif kind != "gpt2":
        raise ValueError(f"only byte-level BPE GGUF tokenizers (tokenizer.ggml.model 'gpt2') and Gemma 3's "
                         f"are supported; this file's is {kind!r}")
    else:
        tok = build_tokenizer(tokens, reader.fields.get("tokenizer.ggml.merges", []), types,   # none: bytes alone
                              reader.fields.get("tokenizer.ggml.pre"))
    if reader.fields.get("tokenizer.ggml.add_bos_token"):
        if arch != "gemma3":
            raise ValueError("this GGUF file asks for a BOS token before every text; that is not supported yet")
        from tokenizers.processors import TemplateProcessing
        bos = tokens[reader.fields.get("tokenizer.ggml.bos_token_id")]   # Gemma's <bos> opens every text
        tok.post_processor = TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                                special_tokens=[(bos, reader.fields.get("tokenizer.ggml.bos_token_id"))])
    if cached is not None:
        _write_atomically(cached, lambda tmp: tok.save(str(tmp)), stale=f"{path.stem}-*.tokenizer.json")
    return tok


def gguf_generation(path, cache: str | Path | None = None) -> Generation:
    """The file's end-of-text token and chat template (tokenizer.ggml.eos_token_id, tokenizer.chat_template); cached
    as JSON beside its tokenizer (reading the file's metadata takes ~2.6 s, every start)."""
    path = Path(path)
    cached = _cached(cache, path, ".generation.json")
    if cached is not None and cached.is_file():
        try:
            saved = json.loads(cached.read_text())
            return Generation(tuple(saved["eos_ids"]), saved["chat_template"], saved["bos_token"], saved["eos_token"])
        except (OSError, ValueError, KeyError, TypeError):
            cached.unlink(missing_ok=True)
    reader = GGUFFile(path)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    eos, bos = reader.fields.get("tokenizer.ggml.eos_token_id"), reader.fields.get("tokenizer.ggml.bos_token_id")
    info = Generation(eos_ids=() if eos is None else (int(eos),), chat_template=reader.fields.get("tokenizer.chat_template"),
                      bos_token="" if bos is None else tokens[bos], eos_token="" if eos is None else tokens[eos])
    if cached is not None:
        try:
            _write_atomically(cached, lambda tmp: Path(tmp).write_text(json.dumps(asdict(info))),
                              stale=f"{path.stem}-*.generation.json")
        except OSError:   # a read-only cache: read the file again next time
            pass
    return info
