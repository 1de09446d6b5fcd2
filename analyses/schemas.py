"""The request and answer models' shared parts: JSON's integers and booleans read strictly, valid Unicode, the run
options of a forward pass, tokens, two texts for an intervention. Each analysis' own models are in its module."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ..model.precision import COMPUTE_DTYPES


def _json_int(v):
    """What JSON Schema calls an integer: a number without a fractional part, 4 or 4.0 (read as 4), as pydantic's lax
    mode takes it; never 4.5, true/false or a "4" string (which the lax mode would also take)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (bool, str, float)):
        raise ValueError("must be a JSON integer (a whole number such as 4 or 4.0)")
    return v


def _json_bool(v):
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def _unicode(v: str) -> str:
    """Valid Unicode only: a JSON escape like "\\ud800" decodes to half a surrogate pair, which no tokenizer or
    UTF-8 encoder takes."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"contains a lone UTF-16 surrogate (U+{ord(v[e.start]):04X} at character {e.start}); "
                         "send valid Unicode (a character above U+FFFF is a surrogate pair, never half of one)"
                         ) from None
    return v


def _unicode_first(v):
    """_unicode before a string's own checks (a length limit's message then counts characters, not "items")."""
    return _unicode(v) if isinstance(v, str) else v


def _bounded(ge: int, le: int):
    """A JSON integer in [ge, le]. The bounds come before the validator so OpenAPI shows them as minimum/maximum."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_json_int)]


JsonBool = Annotated[bool, BeforeValidator(_json_bool)]


Text = Annotated[str, AfterValidator(_unicode)]


MAX_INDEX = 8191   # a token index below the most positions a served model reads (SmolLM2: 8192)


Index = _bounded(0, MAX_INDEX)   # the OpenAPI narrows it to each served model (`per_model`)


Matrix = list[list[float]]


ComputeDtype = Literal[COMPUTE_DTYPES]   # what matrix products run in: float32 (exact) or a fast mode

EXAMPLE_TEXT = "The animal didn't cross the street because it was too tired."
QK_TEXT = "The cat sat on the mat. The cat"   # a repeat: an induction head's key is the token after the first "cat"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunOptions(Strict):
    """What to run: shared by /api/attention and /api/stages."""
    model: Text = Field("minilm", description="a model id from GET /api/models", examples=["minilm"])
    text: Text = Field(description="the text to analyse (the first sentence of a pair); at least one non-blank "
                       "character", examples=[EXAMPLE_TEXT], json_schema_extra={"pattern": r"\S"})
    text_pair: Text | None = Field(None, description="optional second sentence (models with `pair` only); at least "
                                   "one non-blank character", json_schema_extra={"pattern": r"\S"})
    causal: JsonBool | None = Field(None, description="apply the look-ahead mask: each query sees only earlier keys. "
                                    "Default: the model's own (true for decoders, false for encoders)")
    mask_tokens: list[Index] = Field(default_factory=list, description="token indices to hide as keys from every "
                                     "other query before re-running the model (each token still sees itself); "
                                     "each must be below the text's token count")
    engine: Literal["onnx", "numpy"] = Field("onnx", description="onnx: the served graph; numpy: the reference")
    precision: _bounded(1, 8) | None = Field(
        None, description="round every computed number of the answer (matrices, entropies, summaries, stages) to "
        "this many decimals (smaller JSON); full float32 when omitted. `timing_ms` keeps its 3 decimals")
    dtype: Literal["float32", "float16"] = Field("float32", description="tensor dtype of the binary form")
    ablate: list[Annotated[list[Index], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list, max_length=4096, examples=[[[3, 1], [5, 0]]],
        description="heads to knock out, as [layer, head] pairs: their output (their slice of the concatenated "
        "heads, before the output projection) is removed in the forward pass, so later layers, hidden states and "
        "predictions change. In a grouped-query model the other heads of the group are left alone")
    ablation: Literal["zero", "mean"] = Field("zero", description="zero: replace an ablated head's output with "
                                              "zeros; mean: with its average over this text's positions")


class Token(BaseModel):
    token: str = Field(description="the token as a person reads it")
    id: int = Field(description="its exact vocabulary id")


class RankedToken(Token):
    rank: int = Field(description="its rank among the next tokens at the position (1: the most probable)")
    probability: float = Field(description="its probability there (full softmax over the vocabulary)")


class NextToken(BaseModel):
    token: str = Field(description="the token as a person reads it (byte-level markers decoded, ␣ for a space)")
    id: int = Field(description="its exact vocabulary id")
    prob: float = Field(description="its probability under the full softmax over the vocabulary")


class Effect(BaseModel):
    """What knocking the heads out changed, against the same run with every head kept."""
    kl: float | None = Field(None, description="decoders: KL(before || after) of the next-token distribution, nats")
    next_tokens_before: list[NextToken] | None = Field(None, description="decoders: top next tokens with every "
                                                      "head kept (`next_tokens` holds the ablated run's)")
    token_logprob_change: list[float | None] | None = Field(
        None, description="decoders: each token's log-prob, ablated minus intact (null for the first token)")
    mean_logprob_change: float | None = Field(None, description="decoders: mean of token_logprob_change")
    next_tokens_after: list[NextToken] | None = Field(None, description="knockout: top next tokens after it")
    cosine: float | None = Field(None, description="encoders: cosine similarity of the mean-pooled final hidden "
                                 "states (the sentence embedding) ablated vs intact; 1 = unchanged")


class Tokens(BaseModel):
    model: str = Field(description="the model id that answered")
    engine: Literal["onnx", "numpy"] = Field(description="onnx: the served graph; numpy: the reference")
    provider: str = Field(description="execution provider that ran the model (`numpy` for the reference)")
    compute_dtype: ComputeDtype = Field(description="what the run's matrix products ran in: float32 (exact), or the "
                                        "server's fast mode (ATTNSCOPE_COMPUTE_DTYPE), with a line in `warnings`; "
                                        "the NumPy engine always float32", examples=["float32"])
    causal: bool = Field(description="whether the look-ahead mask was applied")
    truncated: bool = Field(description="the input was longer than max_tokens and was cut")
    text_tokens: int | None = Field(None, description="with `truncated`, for a single text: how many tokens the "
                                    "whole text is (the model read the first max_tokens of them)")
    tokens: list[str] = Field(description="the model's tokens, [CLS]/[SEP] included")
    token_ids: list[int] = Field(description="the tokenizer's id of each token (exact, for any downstream use)")
    offsets: list[list[int]] = Field(description=(
        "[start, end) span of each token in its own text (`text` for segment 0, `text_pair` for 1; [0, 0] for an "
        "added special token), counted in Unicode code points as Python's str indexes. JavaScript strings index "
        "UTF-16 units, which differ after any character above U+FFFF (an emoji counts 2): use "
        "`Array.from(text).slice(start, end).join('')`, not `text.slice(start, end)`"))
    special: list[bool] = Field(description="true for [CLS], [SEP] and other special tokens, whether the tokenizer "
                                "added them or they were typed into the text (a typed \"[SEP]\" is id 102 too); "
                                "false for an [UNK] that stands for real text")
    segments: list[int] = Field(description="0: text, 1: text_pair, -1: a special token the tokenizer added")
    warnings: list[str] = Field(default_factory=list, description="things to know before trusting the numbers, e.g. "
                                "the input is longer than the length the model was trained on")
    mask_tokens: list[int] = Field(description="token indices hidden as keys (as asked, sorted)")
    timing_ms: dict[str, float] = Field(description="model: forward pass; total: request handling")


SITE_DOC = ("head_output (blocks.{layer}.attn.hook_z: a head's output before the output projection), query "
            "(hook_q, after RoPE), key (hook_k), value (hook_v) -- per query head: in a grouped-query model the key "
            "and value that head reads --, pattern (hook_pattern: the attention probabilities), residual "
            "(blocks.{layer}.hook_resid_pre: the residual stream entering the block, patched per position)")


IOI_CLEAN = "When Mary and John went to the store, John gave a drink to"


IOI_CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


class TwoTexts(Strict):
    """A clean and a corrupt text of the same token count, and the metric an intervention between them reads."""
    model: Text = Field("smollm2", description="a model id from GET /api/models, one with an LM head "
                        "(`predictions`)", examples=["smollm2"])
    clean: Text = Field(description="the clean text", examples=[IOI_CLEAN], json_schema_extra={"pattern": r"\S"})
    corrupt: Text = Field(description="the corrupt text: the same token count as `clean`",
                          examples=[IOI_CORRUPT], json_schema_extra={"pattern": r"\S"})
    target: Text = Field(min_length=1, description="the token whose logit the metric reads, as next_tokens shows it (\"␣Mary\") "
                         "or a text that is exactly one token", examples=["␣Mary"])
    distractor: Text | None = Field(None, min_length=1, description="metric logit(target) - logit(distractor) when given; "
                                    "log p(target) otherwise", examples=["␣John"])
