"""Model folders on disk: Hugging Face folders (config.json, safetensors, tokenizer.json) in our terms.

    mf = inspect(folder)               # config.json -> TransformerConfig; every file and tensor shape checked
    model = load_model(folder)         # the weights, renamed to our flat names (model.weights.state_dict)
    tokenizer = load_tokenizer(folder) # tokenizer.json, adding BOS/EOS/CLS/SEP as the file says

The family (sources/families.py) says how config.json and the tensor names map to ours. Whatever does not fit (an
unknown family, a missing file or tensor, a shape the config does not imply, a truncated file) raises
ModelUnavailable with one line saying what was found and what works. One known difference: RoBERTa gives a `<pad>`
typed into the text, and the tokens after it, other positions in transformers (it skips padding ids when counting);
here positions count every token.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.encdec import EncoderDecoder, EncoderDecoderConfig
from ..model.precision import scalar, widen
from ..model.transformer import Transformer, TransformerConfig
from ..model.weights import load_state_dict, state_dict
from .families import ARCHITECTURES, architecture
from .mapping import Source
from .safetensors import DTYPES, Tensor, read_header, read_tensor, weight_files
from .spec import Generation, ModelUnavailable, one_line

FOLDER_FILES = "config.json, model.safetensors (or model.safetensors.index.json and its shards) and tokenizer.json"


@dataclass(frozen=True)
class ModelFolder:
    """A Hugging Face model folder, understood and checked: the config, where every tensor comes from."""
    folder: Path
    architecture: str            # a key of ARCHITECTURES
    cfg: TransformerConfig
    max_tokens: int
    notes: tuple[str, ...]       # what a person should know (a capped input length)
    tensors: dict[str, Tensor]   # the model folder's tensors, by its names
    sources: dict[str, Source]   # our name -> the model folder's tensors

    @property
    def kind(self) -> str:
        if isinstance(self.cfg, EncoderDecoderConfig):
            return "encoder-decoder"
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
            parts.append(f"RoPE theta {cfg.rope_theta:g}" + rope_words(cfg))
        if cfg.lm_head:
            parts.append("tied embeddings" if cfg.tie_embeddings else "untied LM head")
        return ", ".join(parts)


def rope_words(cfg: TransformerConfig) -> str:
    """' with llama3 scaling (factor 32 from 8192 positions)', ' on 8 of 16 features', or ''."""
    s, words = cfg.rope_scaling, ""
    if s is not None:
        words += f" with {s.kind} scaling (factor {s.factor:g}" + \
            (f" from {s.original_max_positions} positions)" if s.kind != "dynamic" else ")")
    if cfg.rotary_dim < cfg.d_head:
        words += f" on {cfg.rotary_dim} of {cfg.d_head} features"
    return words


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelUnavailable(f"cannot read {path.name} in {path.parent} ({one_line(e)}); "
                               f"fix: copy or save it again") from None
    if not isinstance(value, dict):
        raise ModelUnavailable(f"{path.name} in {path.parent} is not a JSON object; fix: copy or save it again")
    return value


def inspect(folder: str | Path) -> ModelFolder:
    """Read config.json and the safetensors headers, and check that every tensor the config implies is there
    with the shape it implies. Reads no weights: cheap enough to run before anything is loaded."""
    folder = Path(folder)
    try:
        return _inspect(folder)
    except OSError as e:   # unreadable files (permissions, I/O errors): not the graph cache's fault
        raise ModelUnavailable(f"cannot read {e.filename or folder} ({e.strerror or type(e).__name__})") from None


def _inspect(folder: Path) -> ModelFolder:
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
    mf = ModelFolder(folder, arch, cfg, max_tokens, tuple(notes), tensors, sources)
    _check(mf, prefix)
    return mf


def _prefix(tensors: dict, embedding: str, folder: Path) -> str:
    """What the model folder puts before the body's names: "" (BertModel), "bert.", "transformer.", "model."."""
    found = sorted((n[:-len(embedding)] for n in tensors if n.endswith(embedding)
                    and (n == embedding or n[-len(embedding) - 1] == ".")), key=len)
    if not found:
        raise ModelUnavailable(f"the weights in {folder} have no token embedding (*{embedding}): they do not match "
                               f"config.json's model_type")
    return found[0]


@functools.lru_cache(maxsize=8)
def _shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Our tensors and their shapes for this config, from a skeleton model (once per config)."""
    return {name: value.shape for name, value in state_dict(skeleton(cfg)).items()}


def skeleton(cfg):
    """The model a config describes, its weights zero (to be loaded): an encoder-decoder (model/encdec.py) or a
    Transformer."""
    return EncoderDecoder(cfg, seed=None) if isinstance(cfg, EncoderDecoderConfig) else Transformer(cfg, seed=None)


def _config_words(mf: ModelFolder) -> str:
    cfg = mf.cfg
    return (f"config.json: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads x head_dim {cfg.d_head}"
            f", {cfg.n_kv_heads} key/value heads, d_ff {cfg.d_ff}, vocab {cfg.vocab_size}")


def _check(mf: ModelFolder, prefix: str) -> None:
    """Every tensor the config implies is in the files, with the implied shape; no layers beyond the config's."""
    cfg, tensors = mf.cfg, mf.tensors
    layer = re.compile(re.escape(prefix) + r"(?:encoder\.layer|layers|h)\.(\d+)\.")
    layers = {int(m.group(1)) for n in tensors if (m := layer.match(n))}
    if layers and max(layers) >= cfg.n_layers:
        raise ModelUnavailable(f"the weights hold {max(layers) + 1} layers; {_config_words(mf)} "
                               f"(weights that do not match their config)")
    for ours, shape in _shapes(cfg).items():
        src = mf.sources[ours]
        want = shape[::-1] if src.transpose else shape
        want = (want[0] // len(src.names) + src.skip_rows, *want[1:])       # each stacked part's rows
        if src.split:                                                       # ours is one part of a fused tensor
            want = (want[0] // src.split.sizes[src.split.part] * sum(src.split.sizes), *want[1:])
        for name in src.names:
            if name not in tensors:
                raise ModelUnavailable(f"tensor {name} is missing from the weights in {mf.folder} "
                                       f"({_config_words(mf)})")
            if tensors[name].dtype not in DTYPES:
                raise ModelUnavailable(f"tensor {name} is stored as {tensors[name].dtype}; attnscope reads "
                                       f"{', '.join(DTYPES)} safetensors (quantised weights: use a GGUF file)")
            if tensors[name].shape != want:
                raise ModelUnavailable(f"tensor {name} has shape {list(tensors[name].shape)}, but {_config_words(mf)}"
                                       f" implies {list(want)} (weights that do not match their config)")


def convert(mf: ModelFolder) -> dict[str, np.ndarray]:
    """Our flat state dict (weights.state_dict's names) from the model folder's tensors: each a read-only view of its
    mapped file in its stored type (sources/store.py), or, where the file's layout is not ours (a transposed or fused
    tensor, stacked parts), an array of its own in the same type; Gemma's norms (1 + weight) in the compute type."""
    sd, last = {}, (None, None)     # the last tensor read: a fused one's parts come one after the other
    for ours in _shapes(mf.cfg):
        src = mf.sources[ours]
        if src.split:                                      # one part of a fused tensor, read once for all its parts
            if last[0] != src.names[0]:
                last = (src.names[0], read_tensor(mf.tensors[src.names[0]]))
            parts = [_split(last[1], src.split)]
        else:
            parts = [read_tensor(mf.tensors[name])[src.skip_rows:] for name in src.names]
        w = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if src.offset:                     # Gemma's norms: the multiplier 1 + weight, in float32 as transformers
            w = widen(w) + scalar(src.offset)
        sd[ours] = np.ascontiguousarray(w.T if src.transpose else w)   # a view stays one where it is contiguous
    return sd


def _split(w: np.ndarray, split) -> np.ndarray:
    """Part `split.part` of a fused tensor whose rows are `split.groups` runs of parts of `split.sizes` rows:
    [groups * sizes[part], ...]."""
    runs = w.reshape(split.groups, sum(split.sizes), *w.shape[1:])
    start = sum(split.sizes[:split.part])
    return runs[:, start:start + split.sizes[split.part]].reshape(-1, *w.shape[1:])


def load_model(folder: str | Path, cache: Path | None = None) -> Transformer:
    """A Transformer with the model folder's weights (`cache` is unused: safetensors need no conversion cache)."""
    mf = inspect(folder)
    try:
        sd = convert(mf)
    except OSError as e:
        raise ModelUnavailable(f"cannot read {e.filename or folder} ({e.strerror or type(e).__name__})") from None
    model = skeleton(mf.cfg)
    return model.load_state_dict(sd) if isinstance(model, EncoderDecoder) else load_state_dict(model, sd)


def load_tokenizer(folder: str | Path, cache: Path | None = None):
    """tokenizer.json as written: its post-processor adds the model folder's special tokens ([CLS] ... [SEP],
    <s> ... </s>, a BOS template, or none). transformers 5 does the same: where tokenizer.json exists it
    ignores tokenizer_config.json's add_bos_token / add_eos_token. No padding or truncation (the runtime
    truncates to max_tokens and says so)."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    mf = inspect(folder)
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception
        raise ModelUnavailable(f"cannot read tokenizer.json in {folder} ({one_line(e)}); "
                               f"fix: save it again with tokenizer.save_pretrained(folder)") from None
    tok.no_padding()
    tok.no_truncation()
    top = max(tok.get_vocab(with_added_tokens=True).values()) + 1
    if top > mf.cfg.vocab_size:
        raise ModelUnavailable(f"tokenizer.json has token ids up to {top - 1}, but the model's vocabulary has "
                               f"{mf.cfg.vocab_size} rows (config.json vocab_size): tokenizer and weights do "
                               f"not belong together")
    return tok


def load_generation(folder: str | Path, cache: Path | None = None) -> Generation:
    """End-of-text ids (generation_config.json, else config.json: eos_token_id, one or a list) and the chat template
    (chat_template.jinja, else tokenizer_config.json's chat_template) with the BOS and EOS tokens it names."""
    folder = Path(folder)
    read = lambda name: _read_json(folder / name) if (folder / name).is_file() else {}   # noqa: E731
    eos = read("generation_config.json").get("eos_token_id", read("config.json").get("eos_token_id"))
    eos_ids = tuple(int(i) for i in (eos if isinstance(eos, list) else [] if eos is None else [eos]))
    tc = read("tokenizer_config.json")
    template = tc.get("chat_template")
    if isinstance(template, list):   # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    token = lambda v: v.get("content", "") if isinstance(v, dict) else (v or "")   # noqa: E731
    return Generation(eos_ids, template if isinstance(template, str) else None, token(tc.get("bos_token")),
                      token(tc.get("eos_token")))
