"""What a run gives back: the tokens it ran on (Encoding) and what the model computed (AttentionResult; a long
text's layer-by-layer run keeps less, runtime/layerwise.py's LayerwiseResult)."""
from __future__ import annotations

import dataclasses
import itertools
import sys
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from ..analysis import statistics
from ..sources.store import is_mapped

Engine = Literal["onnx", "numpy"]    # what computes the forward pass: the served ONNX graph, or the NumPy reference


@dataclass
class Encoding:
    """One tokenised text (or sentence pair), unpadded."""
    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]   # character span in its own text (the pair's second text for segment 1)
    special: list[bool]              # [CLS], [SEP] and the like, added by the tokenizer or typed in the text
    segments: list[int]              # 0 first text, 1 second text, -1 special token
    truncated: bool
    punctuation: list[bool]          # tokens whose characters are all punctuation (statistics.is_punctuation)
    text_tokens: int | None = None   # a cut single text: the tokens of all of it (the page's length banner)


class NextToken(NamedTuple):
    """One candidate for the token after the text: readable string, exact id, probability (full softmax)."""
    token: str
    id: int
    prob: float


class Encoded:
    """A run's result's token fields, from its `encoding` (AttentionResult, layerwise.LayerwiseResult)."""

    @property
    def tokens(self) -> list[str]:
        return self.encoding.tokens

    @property
    def token_ids(self) -> list[int]:
        return self.encoding.ids


@dataclass
class AttentionResult(Encoded):
    """Everything the model computed for one text, trimmed to its own tokens."""
    model: str
    engine: Engine
    provider: str
    causal: bool
    encoding: Encoding
    attentions: np.ndarray               # [L, H, T, T] probabilities, query x key (a run to a depth: [depth, ...])
    hidden: np.ndarray | None            # [T, D] final hidden states (None: a run that stopped at a depth)
    mask: np.ndarray                     # [T, T] the additive mask the model saw (0 or masks.MASKED)
    mask_tokens: list[int] = field(default_factory=list)  # token indices hidden as keys
    stages: dict[str, np.ndarray] | None = None  # transformer.STAGES: x [L, T, D]; q, k, v, ctx [L, H, T, dh];
    #                                              scores, scaled, masked [L, H, T, T]
    seconds: float = 0.0
    next_tokens: list[NextToken] | None = None    # decoders with an LM head: top-k after the last token
    token_logprobs: list[float | None] | None = None  # log p(token_i | tokens before it); None for the first
    next_token_logits: np.ndarray | None = None   # [V] logits for the token after the last one
    value_norms: np.ndarray | None = None         # [L, H, T] ||v_j W_O^h|| of each key (TransformerBlock.value_norms)

    def entropy(self) -> np.ndarray:
        """[L, H, T] entropy of each query row, in nats."""
        return statistics.entropy(self.attentions)

    def summary(self) -> dict[str, np.ndarray]:
        """Per-head statistics (statistics.HEAD_STATS), each [L, H]."""
        return statistics.head_stats(self.attentions)


ARRAY_HEADER = 112   # an ndarray object without its data (sys.getsizeof of an empty view)
SCALARS = (str, bytes, int, float, bool, type(None))
SCALAR_TYPES = frozenset(SCALARS)      # exact types (footprint's lists of scalars): a NumPy scalar is walked


def root(a: np.ndarray) -> np.ndarray:
    """The array that owns a view's memory (the array itself when it owns its own)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def one_block(block: np.ndarray, depth: int) -> np.ndarray:
    """A run to `depth` blocks that kept one block's probabilities [H, T, T], as the [depth, H, T, T] such a run
    gives (Runtime.forward): every slice is that block, over its memory (the unasked blocks' slices are undefined),
    read-only. Its footprint is the block's."""
    out = np.ndarray((depth, *block.shape), block.dtype, buffer=block, strides=(0, *block.strides))
    out.flags.writeable = False
    return out


def _scalars(x: list | tuple) -> list[list] | None:
    """The items of a list (or tuple) of scalars, or of tuples of scalars, and the scalars in those tuples: what
    footprint counts in C (_sizes), each item by its size without the identity check (a shared small int counted each
    time: an over-count of a few bytes, never an under-count), where walking an encoding item by item took 0.8 ms of
    every answer. None: a list of anything else, walked."""
    kinds = set(map(type, x))
    if kinds <= SCALAR_TYPES:
        return [list(x)]
    if kinds == {tuple}:
        items = list(itertools.chain.from_iterable(x))
        if set(map(type, items)) <= SCALAR_TYPES:
            return [list(x), items]
    return None


_DIGIT = 1 << sys.int_info.bits_per_digit
_ONE_DIGIT = sys.getsizeof(1) if sys.getsizeof(_DIGIT - 1) == sys.getsizeof(1 - _DIGIT) == sys.getsizeof(1) else 0
_ASCII = sys.getsizeof("")


def _sizes(items: list) -> int:
    """sum(map(sys.getsizeof, items)), exactly, counted by kind where it can be (sys.getsizeof one by one took 0.2 ms
    of the 0.3 footprint spends on a 128-token encoding): bools (two sizes), ints of one digit (zero has its own
    size), ASCII strings (a header and a byte each), tuples of one length, each kind alone in the list; anything else
    one by one."""
    kinds = set(map(type, items))
    if kinds == {bool}:
        trues = sum(items)
        return trues * sys.getsizeof(True) + (len(items) - trues) * sys.getsizeof(False)
    if kinds == {int} and _ONE_DIGIT and items and -_DIGIT < min(items) and max(items) < _DIGIT:
        zeros = items.count(0)
        return (len(items) - zeros) * _ONE_DIGIT + zeros * sys.getsizeof(0)
    if kinds == {str} and all(map(str.isascii, items)):
        return len(items) * _ASCII + sum(map(len, items))
    if kinds == {tuple} and len(set(map(len, items))) == 1:
        return len(items) * sys.getsizeof(items[0])
    return sum(map(sys.getsizeof, items))


def footprint(obj) -> int:
    """Bytes an object keeps alive, counted honestly: every NumPy array at the whole buffer it holds (a view keeps
    the array it was cut from alive: that array's bytes, counted once however many views share it), and the Python
    objects around the arrays (sys.getsizeof of each string, number, list, tuple, dict, set, dataclass). Walks
    dataclasses (NamedTuples are tuples), dicts, lists, tuples and sets; an object of any other class is counted
    by its own size and not walked: a result does not own the runtime or model it might point at (nor a view of the
    weight store's mapped files, sources/store.py). A tensor kept where its session computes (tensors.Held: a
    layer-by-layer run's checkpoints) counts its bytes there: its NumPy array on the CPU, its device memory on a GPU
    (so the result cache's budget bounds what cached results hold on the GPU too)."""
    from .tensors import Held

    seen: set[int] = set()
    counted: set[int] = set()      # arrays whose buffer is counted
    total, stack = 0, [obj]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            owner = root(x)
            total += ARRAY_HEADER
            if owner is not x and id(owner) not in seen:
                seen.add(id(owner))
                total += ARRAY_HEADER
            if id(owner) not in counted and not is_mapped(owner):   # a weight's file mapping: the model's, not
                counted.add(id(owner))                             # the result's (and paged from disk, not memory)
                total += owner.nbytes
            continue
        if isinstance(x, Held):
            if x.array is not None:
                stack.append(x.array)
            else:
                total += x.nbytes
            continue
        total += sys.getsizeof(x)
        if isinstance(x, SCALARS):
            continue
        if isinstance(x, (list, tuple)) and (groups := _scalars(x)) is not None:   # an encoding's ids, tokens, offsets
            total += sum(map(_sizes, groups))
            continue
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
    return total
