"""Token strings a person can read, for byte-level BPE vocabularies (GPT-2, SmolLM2, Llama 3, Qwen2).

Byte-level BPE works on UTF-8 bytes and spells each byte as one printable character (GPT-2's
bytes_to_unicode): a space is "Ġ", a newline "Ċ", so the token "Ġthe" is the text " the". `readable`
turns a token back into its text with whitespace made visible (" the" -> "␣the", "\\n" -> "↵"), and
shows bytes that are only part of a character (an emoji split over two tokens) as \\xNN escapes.
For display only: token ids stay exact, and the vocabulary keeps its own spelling.
"""
from __future__ import annotations

from functools import cache

VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other 68
    (control characters, space, soft hyphen, ...) are moved to U+0100 and up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return dict(sorted(table.items()))


@cache
def _byte_of() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


@cache
def _visible_table() -> dict[int, str]:
    """Whitespace to visible marks; other control characters to \\xNN."""
    table = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]}
    return table | {ord(k): v for k, v in VISIBLE.items()}


def readable(token: str) -> str:
    """A byte-level token's text, whitespace visible. Tokens not spelled in the byte alphabet pass through."""
    byte_of = _byte_of()
    if not token or any(c not in byte_of for c in token):
        return token
    text = bytes(byte_of[c] for c in token).decode("utf-8", errors="backslashreplace")
    return text.translate(_visible_table())


def is_byte_level(tokenizer) -> bool:
    """Whether a `tokenizers.Tokenizer` decodes byte-level (its token strings need `readable`)."""
    return type(tokenizer.decoder).__name__ == "ByteLevel"
