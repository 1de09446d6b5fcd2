"""Text in, results out: a model's vocabulary, masks and onnxruntime sessions (runtime.py), what a run returns
(results.py), long texts layer by layer (layerwise.py), knocked-out heads and head importance (interventions.py)."""
from .errors import InputError
from .results import AttentionResult, Encoding, NextToken
from .runtime import DEFAULT_CACHE, Runtime, load

__all__ = ["AttentionResult", "DEFAULT_CACHE", "Encoding", "InputError", "NextToken", "Runtime", "load"]
