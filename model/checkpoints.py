"""Checkpoints on disk: Hugging Face folders (config.json, safetensors, tokenizer.json) in our terms.

    ckpt = inspect(folder)             # config.json -> TransformerConfig; every file and tensor shape checked
    model = load_model(folder)         # the weights, renamed to our flat names (weights.state_dict)
    tokenizer = load_tokenizer(folder) # tokenizer.json, adding BOS/EOS/CLS/SEP as the file says
    hf_snapshot("org/repo")            # a repo's folder in the local Hugging Face cache (never the network)

One entry of ARCHITECTURES per model family, chosen by config.json's `model_type` (or `architectures`):
a config mapping (config.json -> TransformerConfig) and a name mapping (our tensor -> the checkpoint's).
Where the families differ from the TransformerConfig defaults:
  BERT      post-norm encoder; separate query/key/value stacked into one in_proj (PyTorch's layout)
  RoBERTa   BERT, but position ids start after the padding index (padding_idx + 1 + position): the
            position table's first padding_idx + 1 rows are never read, so they are dropped here
  GPT-2     pre-norm decoder; Conv1D layers keep weights [in, out], so they are transposed; gelu_new
            is the tanh GELU; learned positions; the LM head is the token embedding (tied)
  Llama     pre-norm, RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases
  Mistral   Llama with a sliding window: exact while the input fits in it, so max_tokens is capped there
  Qwen2     Llama with biases on the q, k and v projections
Whatever does not fit (an unknown family, a missing file or tensor, a shape the config does not
imply, a truncated file) raises ModelUnavailable with one line saying what was found and what works.
One known difference: RoBERTa gives a `<pad>` typed into the text, and the tokens after it, other
positions in transformers (it skips padding ids when counting); here positions count every token.

Safetensors files are read here rather than with the safetensors package: its NumPy reader has no
bfloat16, which most Llama-family checkpoints use, and the header alone tells a truncated file.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from .transformer import Transformer, TransformerConfig
from .weights import load_state_dict, state_dict
from .zoo import ModelUnavailable, one_line

MAX_TOKENS = 4096      # as SmolLM2's: beyond it one text's [L, H, T, T] attention outgrows a server's memory
FOLDER_FILES = "config.json, model.safetensors (or model.safetensors.index.json and its shards) and tokenizer.json"
GELU = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}   # hidden_act -> our mlp
DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}   # bfloat16: the top half of a float32


# ---- safetensors ----------------------------------------------------------------------------
class Tensor(NamedTuple):
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int            # byte offsets in the file
    end: int


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors a .safetensors file describes (an 8-byte length, a JSON header, then the data),
    checked against the file's size: a truncated file is named here, before anything is read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise ModelUnavailable(f"{path.name} is {size:,} bytes and not a readable safetensors file "
                                   f"(truncated or corrupt); fix: copy or save it again")
        header = f.read(n)
    tensors, base = {}, 8 + n
    try:
        for name, t in json.loads(header).items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            bits = int(re.sub(r"\D", "", t["dtype"].split("_")[0]) or 8)   # BOOL, U8, I64, BF16, F8_E4M3, ...
            if not 0 <= begin <= end or end - begin != math.prod(t["shape"]) * bits // 8:
                raise ValueError(f"tensor {name}'s byte range does not fit its shape")
            tensors[name] = Tensor(path, t["dtype"], tuple(t["shape"]), base + begin, base + end)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelUnavailable(f"{path.name} has an unreadable safetensors header ({one_line(e)}; corrupt); "
                               f"fix: copy or save it again") from None
    needed = max((t.end for t in tensors.values()), default=base)
    if needed > size:
        raise ModelUnavailable(f"{path.name} is truncated: {size:,} bytes, but its header describes {needed:,}; "
                               f"fix: copy or download it again")
    return tensors


def read_tensor(t: Tensor) -> np.ndarray:
    """One tensor as float32."""
    with open(t.path, "rb") as f:
        f.seek(t.start)
        raw = np.frombuffer(f.read(t.end - t.start), DTYPES[t.dtype]).reshape(t.shape)
    if t.dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError):
            raise ModelUnavailable(f"{index.name} in {folder} is not a safetensors index (no weight_map); "
                                   f"fix: save the checkpoint again") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ModelUnavailable(f"{len(missing)} of the {len(shards)} shards {index.name} names are missing from "
                                   f"{folder} ({', '.join(missing[:3])}); fix: copy or download them")
        return [folder / s for s in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    others = sorted(p.name for p in folder.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".h5", ".msgpack"))
    found = f"found only {', '.join(others[:3])}; attnscope reads safetensors" if others else "found no weights"
    raise ModelUnavailable(f"no model.safetensors in {folder} ({found}); fix: save it with "
                           f"model.save_pretrained(folder) (safetensors is its default)")


# ---- config.json -> TransformerConfig, per architecture ---------------------------------------
class Source(NamedTuple):
    """Where one of our tensors comes from: the checkpoint's tensors, stacked along rows in this order."""
    names: tuple[str, ...]
    transpose: bool = False   # GPT-2's Conv1D keeps weights [in, out]
    skip_rows: int = 0        # RoBERTa's position table: rows before padding_idx + 1 are never read


@dataclass(frozen=True)
class Architecture:
    title: str
    embedding: str                                   # the token embedding's name, which tells the prefix
    config: Callable[[dict, set], tuple[TransformerConfig, int, list[str]]]   # -> cfg, max_tokens, notes
    names: Callable[[TransformerConfig, dict, str], dict[str, Source]]         # our name -> Source


def _get(c: dict, key: str, default=None):
    """A config value; a required one (no default) missing is the config's fault, said in one line."""
    value = c.get(key, default)
    if value is None:
        raise ModelUnavailable(f"config.json has no {key!r}, which its model_type {c.get('model_type')!r} needs")
    return value


def _width(c: dict, d_key: str, h_key: str) -> tuple[int, int]:
    """d_model and heads of a family whose heads split d_model evenly (BERT, RoBERTa, GPT-2)."""
    d, heads = _get(c, d_key), _get(c, h_key)
    if d % heads:
        raise ModelUnavailable(f"config.json's {d_key} {d} is not divisible by {h_key} {heads}")
    return d, heads


def _activation(c: dict, key: str, default: str) -> str:
    act = c.get(key, default)
    if act not in GELU:
        raise ModelUnavailable(f"config.json's {key} is {act!r}; supported: {', '.join(GELU)}")
    return GELU[act]


def _bert_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ModelUnavailable(f"position_embedding_type {c['position_embedding_type']!r} is not supported "
                               f"(only 'absolute', learned positions)")
    if c.get("is_decoder") or c.get("add_cross_attention"):
        raise ModelUnavailable("a BERT-style model configured as a decoder (is_decoder / add_cross_attention) is "
                               "not supported; encoders only")
    offset = _get(c, "pad_token_id", 1) + 1 if c["model_type"] == "roberta" else 0
    positions = _get(c, "max_position_embeddings") - offset
    d, heads = _width(c, "hidden_size", "num_attention_heads")
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=positions, d_model=d, n_heads=heads,
        n_layers=_get(c, "num_hidden_layers"),
        d_ff=_get(c, "intermediate_size"), type_vocab_size=c.get("type_vocab_size", 2), embed_norm=True,
        layer_norm_eps=c.get("layer_norm_eps", 1e-12), mlp=_activation(c, "hidden_act", "gelu"))
    return cfg, min(positions, MAX_TOKENS), []


def _bert_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """BERT and RoBERTa; m is the prefix ("bert.", "roberta." or none)."""
    e = m + "embeddings."
    offset = c.get("pad_token_id", 1) + 1 if c["model_type"] == "roberta" else 0
    names = {"wte": Source((e + "word_embeddings.weight",)),
             "wpe": Source((e + "position_embeddings.weight",), skip_rows=offset),
             "wtt": Source((e + "token_type_embeddings.weight",))} | _module("ln_embed", e + "LayerNorm")
    for i in range(cfg.n_layers):
        h, p = f"{m}encoder.layer.{i}.", f"blocks.{i}."
        qkv = [f"{h}attention.self.{n}" for n in ("query", "key", "value")]
        names[p + "attn.in_proj_weight"] = Source(tuple(n + ".weight" for n in qkv))
        names[p + "attn.in_proj_bias"] = Source(tuple(n + ".bias" for n in qkv))
        for ours, theirs in (("attn.out_proj", "attention.output.dense"), ("ln1", "attention.output.LayerNorm"),
                             ("mlp.fc", "intermediate.dense"), ("mlp.proj", "output.dense"),
                             ("ln2", "output.LayerNorm")):
            names |= _module(p + ours, h + theirs)
    return names


def _gpt2_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    if not c.get("scale_attn_weights", True) or c.get("scale_attn_by_inverse_layer_idx", False):
        raise ModelUnavailable("GPT-2 attention without the 1/sqrt(d_head) scale (scale_attn_weights false) or "
                               "scaled by layer (scale_attn_by_inverse_layer_idx) is not supported")
    d, heads = _width(c, "n_embd", "n_head")
    tie = c.get("tie_word_embeddings", True)
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=_get(c, "n_positions"), d_model=d, n_heads=heads,
        n_layers=_get(c, "n_layer"), d_ff=c.get("n_inner") or 4 * d, norm_first=True, causal=True, final_norm=True,
        layer_norm_eps=c.get("layer_norm_epsilon", 1e-5), mlp=_activation(c, "activation_function", "gelu_new"),
        lm_head=tie or "lm_head.weight" in tensors, tie_embeddings=tie)
    return cfg, min(cfg.max_positions, MAX_TOKENS), []


def _gpt2_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    """GPT-2's Conv1D layers hold weights [in, out]: transposed to [out, in]. c_attn is q, k, v side by side."""
    names = {"wte": Source((m + "wte.weight",)), "wpe": Source((m + "wpe.weight",))} | _module("ln_f", m + "ln_f")
    for i in range(cfg.n_layers):
        h, p = f"{m}h.{i}.", f"blocks.{i}."
        names |= {p + "attn.in_proj_weight": Source((h + "attn.c_attn.weight",), transpose=True),
                  p + "attn.in_proj_bias": Source((h + "attn.c_attn.bias",))}
        names |= _module(p + "attn.out_proj", h + "attn.c_proj", transpose=True)
        names |= _module(p + "ln1", h + "ln_1") | _module(p + "ln2", h + "ln_2")
        names |= _module(p + "mlp.fc", h + "mlp.c_fc", transpose=True)
        names |= _module(p + "mlp.proj", h + "mlp.c_proj", transpose=True)
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("lm_head.weight",))
    return names


def _rope_theta(c: dict) -> float:
    """RoPE's base from `rope_parameters` (transformers 5) or `rope_theta` / `rope_scaling` (4.x)."""
    rope = c.get("rope_parameters") or {}
    scaling = c.get("rope_scaling") or {}
    kind = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ModelUnavailable(f"RoPE scaling {kind!r} is not supported (only plain RoPE, rope_type 'default')")
    if c.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelUnavailable(f"partial rotary embeddings (partial_rotary_factor {c['partial_rotary_factor']}) "
                               f"are not supported")
    return float(rope.get("rope_theta") or c.get("rope_theta") or 10000.0)


def _sliding_window(c: dict) -> int | None:
    """The window of layers that attend to only the last W keys, if any layer does (Mistral; Qwen2 when asked)."""
    window = c.get("sliding_window")
    if not window:
        return None
    if "layer_types" in c:
        return window if "sliding_attention" in (c["layer_types"] or ()) else None
    return window if c["model_type"] == "mistral" or c.get("use_sliding_window") else None


def _llama_config(c: dict, tensors: set) -> tuple[TransformerConfig, int, list[str]]:
    """Llama, Mistral and Qwen2: they differ in biases and the sliding window."""
    if c.get("hidden_act", "silu") != "silu":
        raise ModelUnavailable(f"hidden_act {c['hidden_act']!r} is not supported (the family's SwiGLU uses silu)")
    family = c["model_type"]
    if family == "qwen2":
        qkv_bias, bias = True, False                      # q/k/v biases; o_proj and the MLP have none
    else:
        qkv_bias = bias = bool(c.get("attention_bias", False))   # q, k, v and o
        if bool(c.get("mlp_bias", False)) != bias:
            raise ModelUnavailable(f"attention_bias {c.get('attention_bias')} with mlp_bias {c.get('mlp_bias')} "
                                   f"is not supported (both on or both off)")
    d, heads = _get(c, "hidden_size"), _get(c, "num_attention_heads")
    tie = c.get("tie_word_embeddings", False)
    max_tokens, notes = min(_get(c, "max_position_embeddings"), MAX_TOKENS), []
    window = _sliding_window(c)
    if window is not None and window < max_tokens:
        max_tokens = window
        notes.append(f"Inputs are capped at {window} tokens, its sliding window: within it every query sees all "
                     f"earlier keys, as transformers computes them; longer texts are truncated.")
    cfg = TransformerConfig(
        vocab_size=_get(c, "vocab_size"), max_positions=max_tokens, d_model=d, n_heads=heads,
        n_layers=_get(c, "num_hidden_layers"), d_ff=_get(c, "intermediate_size"), norm_first=True, causal=True,
        final_norm=True, layer_norm_eps=float(c.get("rms_norm_eps", 1e-6)), norm="rms", position="rope",
        mlp="swiglu", attention="gqa", n_kv_heads=c.get("num_key_value_heads") or heads,
        d_head=c.get("head_dim") or d // heads, rope_theta=_rope_theta(c), qkv_bias=qkv_bias, bias=bias,
        lm_head=tie or "lm_head.weight" in tensors, tie_embeddings=tie)
    return cfg, max_tokens, notes


LLAMA_BLOCK = {"attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
               "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
               "ln1": "input_layernorm", "ln2": "post_attention_layernorm",
               "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"}


def _llama_names(cfg: TransformerConfig, c: dict, m: str) -> dict[str, Source]:
    names = {"wte": Source((m + "embed_tokens.weight",)), "ln_f.weight": Source((m + "norm.weight",))}
    for i in range(cfg.n_layers):
        for ours, theirs in LLAMA_BLOCK.items():
            names |= _module(f"blocks.{i}.{ours}", f"{m}layers.{i}.{theirs}")
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = Source(("lm_head.weight",))
    return names


def _module(ours: str, theirs: str, transpose: bool = False) -> dict[str, Source]:
    """A norm's or linear layer's weight and bias (the bias only where our model has one: see convert)."""
    return {ours + ".weight": Source((theirs + ".weight",), transpose), ours + ".bias": Source((theirs + ".bias",))}


_LLAMA = dict(embedding="embed_tokens.weight", config=_llama_config, names=_llama_names)
ARCHITECTURES = {
    "bert": Architecture("BERT", "embeddings.word_embeddings.weight", _bert_config, _bert_names),
    "roberta": Architecture("RoBERTa", "embeddings.word_embeddings.weight", _bert_config, _bert_names),
    "gpt2": Architecture("GPT-2", "wte.weight", _gpt2_config, _gpt2_names),
    "llama": Architecture("Llama", **_LLAMA),
    "mistral": Architecture("Mistral", **_LLAMA),
    "qwen2": Architecture("Qwen2", **_LLAMA),
}
CLASS_PREFIXES = {"Bert": "bert", "Roberta": "roberta", "GPT2": "gpt2", "Llama": "llama", "Mistral": "mistral",
                  "Qwen2": "qwen2"}   # BertModel, BertForMaskedLM, GPT2LMHeadModel, Qwen2ForCausalLM, ...
SUPPORTED = (f"supported: {', '.join(a.title for a in ARCHITECTURES.values())} Hugging Face folders "
             f"(model_type {', '.join(ARCHITECTURES)}) and Llama-family .gguf files")


def architecture(c: dict) -> str:
    """The family from config.json: `model_type`, else the class named in `architectures`."""
    kind = c.get("model_type")
    if kind is None:
        for cls in c.get("architectures") or ():
            kind = next((a for p, a in CLASS_PREFIXES.items() if re.match(p + r"(Model|For|LMHead)", cls)), None)
            if kind:
                break
    if kind not in ARCHITECTURES:
        found = f"model_type {c.get('model_type')!r}, architectures {c.get('architectures')}"
        raise ModelUnavailable(f"config.json says {found}; {SUPPORTED}")
    return kind


# ---- a checkpoint folder ------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """A Hugging Face folder, understood and checked: the config, where every tensor comes from."""
    folder: Path
    architecture: str            # a key of ARCHITECTURES
    cfg: TransformerConfig
    max_tokens: int
    notes: tuple[str, ...]       # what a person should know (a capped input length)
    tensors: dict[str, Tensor]   # the checkpoint's tensors, by its names
    sources: dict[str, Source]   # our name -> the checkpoint's tensors

    @property
    def kind(self) -> str:
        return "decoder" if self.cfg.causal else "encoder"

    @property
    def pair(self) -> bool:
        """Sentence pairs: BERT with segment embeddings, RoBERTa (</s></s> between the texts, one segment)."""
        return self.architecture == "roberta" or self.cfg.type_vocab_size >= 2

    def summary(self) -> str:
        """The shape in one phrase: '2 layers x 4 heads (1 key/value head), d_model 64, head_dim 32, ...'."""
        cfg = self.cfg
        kv = "" if cfg.n_kv_heads == cfg.n_heads else \
            f" ({cfg.n_kv_heads} key/value head{'s' if cfg.n_kv_heads > 1 else ''})"
        parts = [f"{cfg.n_layers} layers x {cfg.n_heads} heads{kv}", f"d_model {cfg.d_model}", f"head_dim {cfg.d_head}"]
        if cfg.position == "rope":
            parts.append(f"RoPE theta {cfg.rope_theta:g}")
        if cfg.lm_head:
            parts.append("tied embeddings" if cfg.tie_embeddings else "untied LM head")
        return ", ".join(parts)


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelUnavailable(f"cannot read {path.name} in {path.parent} ({one_line(e)}); "
                               f"fix: copy or save it again") from None
    if not isinstance(value, dict):
        raise ModelUnavailable(f"{path.name} in {path.parent} is not a JSON object; fix: copy or save it again")
    return value


def inspect(folder: str | Path) -> Checkpoint:
    """Read config.json and the safetensors headers, and check that every tensor the config implies is there
    with the shape it implies. Reads no weights: cheap enough to run before anything is loaded."""
    folder = Path(folder)
    try:
        return _inspect(folder)
    except OSError as e:   # unreadable files (permissions, I/O errors): not the graph cache's fault
        raise ModelUnavailable(f"cannot read {e.filename or folder} ({e.strerror or type(e).__name__})") from None


def _inspect(folder: Path) -> Checkpoint:
    if not folder.is_dir():
        raise ModelUnavailable(f"no folder at {folder}" if not folder.exists() else
                               f"{folder} is neither a folder nor a .gguf file; give a Hugging Face folder "
                               f"({FOLDER_FILES}) or a .gguf file")
    missing = [f for f in ("config.json", "tokenizer.json") if not (folder / f).is_file()]
    if missing:
        gguf = sorted(p.name for p in folder.glob("*.gguf"))
        hint = f" (it holds {', '.join(gguf[:3])}: give that file's path)" if gguf else ""
        raise ModelUnavailable(f"{' and '.join(missing)} missing from {folder}{hint}; a Hugging Face folder needs "
                               f"{FOLDER_FILES}")
    c = _read_json(folder / "config.json")
    arch = architecture(c)
    c.setdefault("model_type", arch)
    tensors = {}
    for path in weight_files(folder):
        tensors |= read_header(path)
    try:
        cfg, max_tokens, notes = ARCHITECTURES[arch].config(c, set(tensors))
        _shapes(cfg)                       # builds a skeleton: the attention's own checks run here
    except (ValueError, TypeError, ZeroDivisionError) as e:   # TransformerConfig's and the attention's checks
        raise ModelUnavailable(f"config.json does not describe a model attnscope can build: {one_line(e)}") from None
    prefix = _prefix(tensors, ARCHITECTURES[arch].embedding, folder)
    sources = ARCHITECTURES[arch].names(cfg, c, prefix)
    ckpt = Checkpoint(folder, arch, cfg, max_tokens, tuple(notes), tensors, sources)
    _check(ckpt, prefix)
    return ckpt


def _prefix(tensors: dict, embedding: str, folder: Path) -> str:
    """What the checkpoint puts before the body's names: "" (BertModel), "bert.", "transformer.", "model."."""
    found = sorted((n[:-len(embedding)] for n in tensors if n.endswith(embedding)
                    and (n == embedding or n[-len(embedding) - 1] == ".")), key=len)
    if not found:
        raise ModelUnavailable(f"the weights in {folder} have no token embedding (*{embedding}): they do not match "
                               f"config.json's model_type")
    return found[0]


@functools.lru_cache(maxsize=8)
def _shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Our tensors and their shapes for this config, from a skeleton model (once per config)."""
    return {name: value.shape for name, value in state_dict(Transformer(cfg, seed=None)).items()}


def _config_words(ckpt: Checkpoint) -> str:
    cfg = ckpt.cfg
    return (f"config.json: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads x head_dim {cfg.d_head}"
            f", {cfg.n_kv_heads} key/value heads, d_ff {cfg.d_ff}, vocab {cfg.vocab_size}")


def _check(ckpt: Checkpoint, prefix: str) -> None:
    """Every tensor the config implies is in the files, with the implied shape; no layers beyond the config's."""
    cfg, tensors = ckpt.cfg, ckpt.tensors
    layer = re.compile(re.escape(prefix) + r"(?:encoder\.layer|layers|h)\.(\d+)\.")
    layers = {int(m.group(1)) for n in tensors if (m := layer.match(n))}
    if layers and max(layers) >= cfg.n_layers:
        raise ModelUnavailable(f"the weights hold {max(layers) + 1} layers; {_config_words(ckpt)} "
                               f"(weights that do not match their config)")
    for ours, shape in _shapes(cfg).items():
        src = ckpt.sources[ours]
        want = shape[::-1] if src.transpose else shape
        want = (want[0] // len(src.names) + src.skip_rows, *want[1:])       # each stacked part's rows
        for name in src.names:
            if name not in tensors:
                raise ModelUnavailable(f"tensor {name} is missing from the weights in {ckpt.folder} "
                                       f"({_config_words(ckpt)})")
            if tensors[name].dtype not in DTYPES:
                raise ModelUnavailable(f"tensor {name} is stored as {tensors[name].dtype}; attnscope reads "
                                       f"{', '.join(DTYPES)} safetensors (quantised weights: use a GGUF file)")
            if tensors[name].shape != want:
                raise ModelUnavailable(f"tensor {name} has shape {list(tensors[name].shape)}, but {_config_words(ckpt)}"
                                       f" implies {list(want)} (weights that do not match their config)")


def convert(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """Our flat state dict (weights.state_dict's names) from the checkpoint's tensors, float32."""
    sd = {}
    for ours in _shapes(ckpt.cfg):
        src = ckpt.sources[ours]
        parts = [read_tensor(ckpt.tensors[name])[src.skip_rows:] for name in src.names]
        w = parts[0] if len(parts) == 1 else np.concatenate(parts)
        sd[ours] = np.ascontiguousarray(w.T) if src.transpose else w
    return sd


def load_model(folder: str | Path, cache: Path | None = None) -> Transformer:
    """A Transformer with the checkpoint's weights (`cache` is unused: safetensors need no conversion cache)."""
    ckpt = inspect(folder)
    try:
        sd = convert(ckpt)
    except OSError as e:
        raise ModelUnavailable(f"cannot read {e.filename or folder} ({e.strerror or type(e).__name__})") from None
    return load_state_dict(Transformer(ckpt.cfg, seed=None), sd)


# ---- tokenizer.json ------------------------------------------------------------------------------
def load_tokenizer(folder: str | Path, cache: Path | None = None):
    """tokenizer.json as written: its post-processor adds the checkpoint's special tokens ([CLS] ... [SEP],
    <s> ... </s>, a BOS template, or none). transformers 5 does the same: where tokenizer.json exists it
    ignores tokenizer_config.json's add_bos_token / add_eos_token. No padding or truncation (the runtime
    truncates to max_tokens and says so)."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    ckpt = inspect(folder)
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception
        raise ModelUnavailable(f"cannot read tokenizer.json in {folder} ({one_line(e)}); "
                               f"fix: save it again with tokenizer.save_pretrained(folder)") from None
    tok.no_padding()
    tok.no_truncation()
    top = max(tok.get_vocab(with_added_tokens=True).values()) + 1
    if top > ckpt.cfg.vocab_size:
        raise ModelUnavailable(f"tokenizer.json has token ids up to {top - 1}, but the model's vocabulary has "
                               f"{ckpt.cfg.vocab_size} rows (config.json vocab_size): tokenizer and weights do "
                               f"not belong together")
    return tok


# ---- the local Hugging Face cache --------------------------------------------------------------
def hf_snapshot(repo: str, cache: str | Path | None = None) -> Path:
    """The folder of `org/repo` (or `org/repo@revision`) in the local Hugging Face cache: `cache`, else where
    huggingface_hub looks (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub). Never the network."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ModelUnavailable("hf: entries need huggingface_hub; fix: pip install huggingface_hub") from None
    repo_id, _, revision = repo.partition("@")
    where = Path(cache or constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=where, local_files_only=True))
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors: not cached, no such revision, a bad id
        if "validation" in type(e).__name__.lower():
            raise ModelUnavailable(f"hf:{repo} is not a Hugging Face repo id ({one_line(e)}); "
                                   f"give hf:ORG/REPO or hf:ORG/REPO@REVISION") from None
        raise ModelUnavailable(f"hf:{repo} is not in the Hugging Face cache at {where}; attnscope never downloads: "
                               f"fix: `hf download {repo_id}` while online, or point HF_HUB_CACHE / HF_HOME at the "
                               f"cache that holds it") from None
