"""Model families: one entry of ARCHITECTURES per family, chosen by config.json's `model_type` (or `architectures`).

Each entry (sources/mapping.py's Architecture) is a config mapping (config.json -> TransformerConfig, the input cap,
notes for a person) and a name mapping (our tensor -> the model folder's). The entries, by kind, with what sets each
family apart: sources/encoders.py (BERT, RoBERTa), sources/decoders.py (GPT-2, the Llama family, GPT-NeoX, Phi-3,
Gemma 2 and 3; their RoPE settings read by sources/rope_settings.py), sources/encoder_decoders.py (T5, BART, Marian).
Adding a family is adding an entry there and its class prefix here (and its parity test), never editing routes or
the page.
"""
from __future__ import annotations

import re

from .decoders import DECODERS
from .encoder_decoders import ENCODER_DECODERS
from .encoders import ENCODERS
from .spec import ModelUnavailable

ARCHITECTURES = ENCODERS | DECODERS | ENCODER_DECODERS
# (BertModel, BertForMaskedLM, GPT2LMHeadModel, Qwen2ForCausalLM, T5ForConditionalGeneration, BartModel, ...)
CLASS_PREFIXES = {"Bert": "bert", "Roberta": "roberta", "GPT2": "gpt2", "Llama": "llama", "Mistral": "mistral",
                  "Qwen2": "qwen2", "Qwen3": "qwen3", "Olmo2": "olmo2", "GPTNeoX": "gpt_neox", "Phi3": "phi3",
                  "Gemma2": "gemma2", "Gemma3": "gemma3", "T5": "t5", "Bart": "bart", "Marian": "marian"}
SUPPORTED = (f"supported: {', '.join(a.title for a in ARCHITECTURES.values())} model folders "
             f"(model_type {', '.join(ARCHITECTURES)}) and Llama-family or Gemma 3 .gguf files")


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
