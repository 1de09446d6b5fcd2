"""What a model is to the app before it is loaded: its spec, and the one error every source raises."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from tokenizers import Tokenizer

from ..model.transformer import Transformer

MAX_TOKENS = 131072    # a model folder's or GGUF file's input cap (Llama 3.1's context): it reads up to its own
#                        max_position_embeddings, a long text layer by layer in blocks of queries (runtime/blocks.py),
#                        memory linear in the tokens; what one run fits here is priced by its capability record
#                        (Capabilities.long_tokens: ATTNSCOPE_MEMORY_MB, ATTNSCOPE_WORK_TFLOP) and a longer text refused
MAX_POSITIONS = 131072  # the most positions a model folder's or GGUF file's RoPE tables hold (so the most
#                         ATTNSCOPE_MAX_TOKENS can raise its limit to, within its config's): 64 MB of float32 tables at
#                         131072 positions of 64 dims


class ModelUnavailable(RuntimeError):
    """A model's files are missing or unreadable; the message says what is wrong and the command that fixes it."""


def one_line(e: Exception) -> str:
    """An exception's message as one short line, for the one-line start-up refusals."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


@dataclass(frozen=True)
class Generation:
    """What generating text with a decoder needs besides its weights: the ids that end a text (generation stops
    after one) and its chat template (Jinja2, with the tokens it names), from the model's own files."""
    eos_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """A model the app offers. `build` and `tokenizer` take (folder, cache): where the model's own files are
    (None: its default source) and a folder for files derived from them (de-quantised weights), or None."""
    id: str
    title: str
    description: str
    kind: Literal["encoder", "decoder"]
    build: Callable[[Path | None, Path | None], Transformer]
    tokenizer: Callable[[Path | None, Path | None], Tokenizer]
    max_tokens: int = 512       # the limit in force: longer inputs are truncated (and flagged)
    pair: bool = False          # accepts a sentence pair (segment embeddings)
    trained_tokens: int | None = None  # the length it was trained on, if known: answers past it carry a warning
    folder: Path | None = None  # where the files come from, when not the default source
    head_roles: tuple[dict, ...] = ()  # wired heads: {"layer", "head", "role"}, role from teaching.ROLES
    explanation: str = ""       # plain-language account of how the model works, for the page
    source: Literal["zoo", "folder", "gguf", "hf-cache"] = "zoo"   # where the model came from
    architecture: str = ""      # the family: bert, roberta, gpt2, llama, mistral, qwen2 (teaching: their own)
    generation: Callable[[Path | None, Path | None], Generation] | None = None   # decoders: end-of-text ids, chat
#                                                                                  template; takes (folder, cache)

    def load_model(self, cache: Path | None = None) -> Transformer:
        return self.build(self.folder, cache)

    def load_tokenizer(self, cache: Path | None = None) -> Tokenizer:
        return self.tokenizer(self.folder, cache)

    def load_generation(self, cache: Path | None = None) -> Generation:
        return Generation() if self.generation is None else self.generation(self.folder, cache)
