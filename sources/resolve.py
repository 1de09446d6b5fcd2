"""An ATTNSCOPE_MODELS entry -> a ModelSpec: a zoo id, NAME=PATH (a Hugging Face model folder or a .gguf file), or
NAME=hf:ORG/REPO (a repo in the local Hugging Face cache, never the network)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from tokenizers import Tokenizer

from ..model.transformer import Transformer
from . import folders
from .families import ARCHITECTURES
from .gguf import file_config, gguf_generation, gguf_tokenizer, load_gguf
from .hf_cache import hf_snapshot
from .spec import MAX_TOKENS, ModelSpec, ModelUnavailable, one_line
from .zoo import get


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def split_entry(entry: str) -> tuple[str, str | None]:
    """An ATTNSCOPE_MODELS entry as (model id, source): "minilm" -> ("minilm", None), "mine=/m/x" -> ("mine", "/m/x")."""
    name, sep, source = entry.partition("=")
    return name.strip(), (source.strip() if sep else None)


def resolve(entry: str, zoo_folders: dict[str, Path] | None = None, hf_cache: Path | None = None,
            cache: Path | None = None) -> ModelSpec:
    """One ATTNSCOPE_MODELS entry as a spec: a zoo id (its files from `zoo_folders` when named there); NAME=PATH,
    a Hugging Face folder or a .gguf file; NAME=hf:ORG/REPO, a repo in the local Hugging Face cache (`hf_cache`,
    else huggingface_hub's own lookup), never the network. NAME becomes the model's id. `cache` is the folder
    of derived files (de-quantised GGUF weights), where a GGUF file's config is read fastest.
    Raises KeyError for an unknown zoo id and ModelUnavailable for everything about a model on disk."""

    name, source = split_entry(entry)
    if source is None:
        return get(name, (zoo_folders or {}).get(name))
    if not NAME.fullmatch(name):
        raise ModelUnavailable(f"{name!r} is not a usable model id: give NAME=PATH or NAME=hf:ORG/REPO with NAME "
                               f"of letters, digits, '.', '_' or '-' (at most 64)")
    if not source:
        raise ModelUnavailable(f"nothing after {name}=: give a folder, a .gguf file or hf:ORG/REPO")
    if source.startswith("hf:"):
        path, origin, shown = hf_snapshot(source[3:], hf_cache), "hf-cache", source
    else:
        path = Path(source).expanduser()
        origin, shown = ("gguf" if path.suffix.lower() == ".gguf" else "folder"), path.name
    if origin == "gguf":
        return _gguf_spec(name, path, cache)
    mf = folders.inspect(path)
    arch = ARCHITECTURES[mf.architecture].title
    where = f"the local Hugging Face cache ({shown})" if origin == "hf-cache" else f"the folder {shown}"
    does = "predicts the next token" if mf.cfg.lm_head else ("reads the text both ways" if mf.kind == "encoder"
                                                                else "has no LM head: no predictions")
    return ModelSpec(name, f"{shown.removeprefix('hf:')} ({arch})",
                     " ".join([f"{arch} {mf.kind} from {where}: {mf.summary()}; {does}.", *mf.notes]),
                     mf.kind, folders.load_model, folders.load_tokenizer, max_tokens=mf.max_tokens,
                     pair=mf.pair, folder=path, source=origin, architecture=mf.architecture,
                     generation=folders.load_generation if mf.cfg.lm_head else None)


def _gguf_spec(name: str, path: Path, cache: Path | None = None) -> ModelSpec:
    """A Llama-family .gguf file: de-quantised once into the cache, tokenizer rebuilt from its vocabulary."""
    if not path.is_file():
        raise ModelUnavailable(f"no file at {path}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailable("reading .gguf files needs the GGUF reader; fix: pip install gguf")
    try:
        cfg = file_config(path, cache)
    except Exception as e:  # noqa: BLE001 - gguf's own errors, and ours for an unsupported file
        raise ModelUnavailable(f"cannot use {path.name}: {one_line(e)}; supported: Llama-family GGUF files "
                               f"(general.architecture 'llama', byte-level BPE vocabulary) and Gemma 3's") from None

    def build(folder: Path, cache: Path | None) -> Transformer:
        try:
            return load_gguf(folder, cache=cache, desc=name)
        except Exception as e:  # noqa: BLE001
            raise ModelUnavailable(f"cannot read {folder.name} ({type(e).__name__}: {one_line(e)})") from None

    def tokenizer(folder: Path, cache: Path | None) -> Tokenizer:
        try:
            return gguf_tokenizer(folder, cache=cache)
        except Exception as e:  # noqa: BLE001
            raise ModelUnavailable(f"cannot use the tokenizer of {folder.name}: {one_line(e)}") from None

    kv = f" ({cfg.n_kv_heads} key/value heads)" if cfg.n_kv_heads != cfg.n_heads else ""
    gemma = cfg.mlp == "geglu"                            # sources/gguf.py reads Llama-family and Gemma 3 files
    local = (f"; {len(cfg.local_layers)} of its {cfg.n_layers} layers are local: each query sees only the last "
             f"{cfg.sliding_window} keys (sliding window)") if cfg.local_layers else ""
    return ModelSpec(name, f"{path.name} ({'Gemma 3' if gemma else 'Llama'}, GGUF)",
                     f"{'Gemma 3' if gemma else 'Llama-family'} decoder from the GGUF file {path.name}: "
                     f"{cfg.n_layers} layers x {cfg.n_heads} heads{kv}, d_model {cfg.d_model}, head_dim {cfg.d_head}, "
                     f"RoPE theta {cfg.rope_theta:g}{local}; de-quantised to float32 once (cached); predicts the next "
                     f"token.", "decoder", build, tokenizer, max_tokens=min(cfg.max_positions, MAX_TOKENS),
                     folder=path, source="gguf", architecture="gemma3" if gemma else "llama",
                     generation=gguf_generation)
