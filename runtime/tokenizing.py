"""Text -> tokens, once per request: the model's tokenizer, with each token's span, specials, segment and whether
it is punctuation; token ids -> readable strings (byte-level vocabularies shown through sources.tokens.readable)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..analysis.statistics import is_punctuation
from ..model.functional import softmax
from ..sources.tokens import VISIBLE, is_byte_level, readable
from .errors import InputError
from .results import Encoding, NextToken

SPACE_MARK = VISIBLE[" "]      # how a space shows in a token (the API's and the page's one mark: "␣")


class Vocabulary:
    """A model's tokenizer, truncating to `max_tokens`; `pair`: it takes sentence pairs."""

    def __init__(self, tokenizer, model_id: str, max_tokens: int, pair: bool, vocab_size: int):
        self.tokenizer, self.model_id, self.pair, self.vocab_size = tokenizer, model_id, pair, vocab_size
        self.tokenizer.enable_truncation(max_tokens, strategy="longest_first")
        self.byte_level = is_byte_level(tokenizer)
        # typed into a text, these are special too ("[SEP]" becomes id 102 whether the tokenizer added it or not)
        self._readable: dict[str, int] | None = None   # token_id's table, built on first use
        self._typed = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str, pair: str | None = None) -> Encoding:
        if not isinstance(text, str) or not text.strip():
            raise InputError("text is empty: give at least one non-blank character")
        if pair is not None and not self.pair:
            raise InputError(f"model {self.model_id!r} takes a single text, not a sentence pair")
        if pair is not None and not pair.strip():
            raise InputError("text_pair is blank: leave it out or give at least one non-blank character")
        enc = self.tokenizer.encode(text, pair)
        # each of the Encoding's lists is made anew, from Rust, at every read: read once
        ids, marks, segments, offsets, pieces, over = (enc.ids, enc.special_tokens_mask, enc.sequence_ids, enc.offsets,
                                                       enc.tokens, enc.overflowing)
        # special: added by the tokenizer ([CLS], [SEP]), or typed into the text; an [UNK] standing for real text
        # (an emoji) is not special: its span is not the token's own string
        own = (text, pair or "")
        special = [bool(m) or (i in self._typed and own[s or 0][a:b] == tok) for m, i, s, (a, b), tok in
                   zip(marks, ids, segments, offsets, pieces)]
        punctuation = [not sp and is_punctuation(own[s or 0][a:b]) for sp, s, (a, b) in zip(special, segments, offsets)]
        tokens = [readable(t) for t in pieces] if self.byte_level else pieces
        # a cut single text: every token of it, from the overflowing pieces the tokenizer made in the same pass (each
        # with the template's special tokens again: counted once, in the first piece)
        whole = len(ids) + sum(len(x.ids) - sum(x.special_tokens_mask) for x in over) if over and pair is None else None
        return Encoding(ids, enc.type_ids, tokens, [tuple(o) for o in offsets], special,
                        [-1 if s is None else s for s in segments], bool(over), punctuation, whole)

    def encode_ids(self, ids: Sequence[int]) -> Encoding:
        """An Encoding of token ids given directly (a probe of random tokens, say): no text, no offsets."""
        ids = [int(i) for i in ids]
        if not ids:
            raise InputError("no token ids given")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise InputError(f"token ids {bad[:5]} are outside this model's vocabulary (0..{self.vocab_size - 1})")
        specials = set(self.special_ids())
        tokens = [self.token_string(i) for i in ids]
        return Encoding(ids, [0] * len(ids), tokens, [(0, 0)] * len(ids), [i in specials for i in ids],
                        [-1 if i in specials else 0 for i in ids], False, [False] * len(ids))

    def special_ids(self) -> list[int]:
        """Ids of the tokenizer's special tokens ([CLS], <|im_start|>, ...)."""
        return sorted({t.id if hasattr(t, "id") else i for i, t in self.tokenizer.get_added_tokens_decoder().items()
                       if t.special})

    def token_string(self, token_id: int) -> str:
        """The vocabulary entry of an id, as a person reads it."""
        token = self.tokenizer.id_to_token(int(token_id))
        return readable(token) if self.byte_level else token

    def token_id(self, token: str, what: str = "target") -> int:
        """The id of one token, given as the API shows it (next_tokens' `token`, e.g. "␣Mary") or as a text that is
        exactly one token (" Mary"). Anything else is refused, naming the tokens it splits into."""
        if not isinstance(token, str) or not token:
            raise InputError(f"{what} is empty: give one token, as next_tokens shows it")
        if self._readable is None:
            self._readable = {self.token_string(i): i for i in range(self.tokenizer.get_vocab_size())}
        if token in self._readable:
            return self._readable[token]
        if token.replace(SPACE_MARK, "\u2581") in self._readable:   # the page's space mark, in a SentencePiece vocabulary
            return self._readable[token.replace(SPACE_MARK, "\u2581")]
        ids = self.tokenizer.encode(token, add_special_tokens=False).ids
        if len(ids) == 1:
            return ids[0]
        shown = [self.token_string(i) for i in ids]
        raise InputError(f"{what} {token!r} is not one token: it splits into {len(ids)}, {shown[:8]}"
                         f"{' ...' if len(ids) > 8 else ''}; give one of them (as next_tokens shows it)")

    def respelled(self, token: str, used: int) -> int | None:
        """The other token a typed `token` may have meant, where a word is one token both with and without its leading
        space ("Mary" and " Mary" in SmolLM2's vocabulary: they answer differently): that spelling's id, or None."""
        plain = token.replace(SPACE_MARK, " ").replace("\u2581", " ")
        other = plain[1:] if plain.startswith(" ") else " " + plain
        if not other.strip():
            return None
        try:
            found = self.token_id(other)
        except InputError:
            return None
        return None if found == used else found

    def top_tokens(self, logits: np.ndarray, k: int) -> list[NextToken]:
        """The k most probable next tokens from logits [V], probabilities from the softmax over all V."""
        probs = softmax(np.asarray(logits, np.float64))
        k = max(0, min(int(k), len(probs)))
        top = np.argpartition(-probs, k - 1)[:k] if k else np.array([], int)
        top = top[np.argsort(-probs[top], kind="stable")]
        return [NextToken(self.token_string(i), int(i), float(probs[i])) for i in top]
