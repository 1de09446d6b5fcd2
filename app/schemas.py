"""Every request and response body of the REST API, in one place (the OpenAPI at /docs comes from here)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ..model.stats import HEAD_STATS


def _json_int(v):
    """JSON integers only: no true/false, no "3" strings, no 0.0 (pydantic's lax mode would take all three)."""
    if isinstance(v, (bool, str, float)):
        raise ValueError("must be a JSON integer")
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


def _bounded(ge: int, le: int):
    """A JSON integer in [ge, le]. The bounds come before the validator so OpenAPI shows them as minimum/maximum."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_json_int)]


JsonBool = Annotated[bool, BeforeValidator(_json_bool)]
Text = Annotated[str, AfterValidator(_unicode)]
Index = _bounded(0, 4095)
Matrix = list[list[float]]

EXAMPLE_TEXT = "The animal didn't cross the street because it was too tired."


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelInfo(BaseModel):
    id: str = Field(description="model id to pass as `model`", examples=["minilm"])
    title: str = Field(description="human-readable name")
    description: str = Field(description="what the model is and where its weights come from")
    kind: Literal["encoder", "decoder"] = Field(description="decoders are causal: each token sees only the past")
    layers: int = Field(description="transformer blocks")
    heads: int = Field(description="attention heads per block")
    d_model: int = Field(description="width of the residual stream")
    d_head: int = Field(description="width of each head's queries and keys: d_model / heads")
    max_tokens: int = Field(description="longer inputs are truncated to this many tokens (and flagged)")
    pair: bool = Field(description="accepts `text_pair` (sentence pairs with segment embeddings)")
    provider: str = Field(description="onnxruntime execution provider in use", examples=["CPUExecutionProvider"])


class RunOptions(Strict):
    """What to run: shared by /api/attention and /api/stages."""
    model: Text = Field("minilm", description="a model id from GET /api/models", examples=["minilm"])
    text: Text = Field(description="the text to analyse (the first sentence of a pair)", examples=[EXAMPLE_TEXT])
    text_pair: Text | None = Field(None, description="optional second sentence (encoder models only)")
    causal: JsonBool | None = Field(None, description="apply the look-ahead mask: each query sees only earlier keys. "
                                    "Default: the model's own (true for decoders, false for encoders)")
    mask_tokens: list[Index] = Field(default_factory=list, description="token indices to hide as keys from every "
                                     "other query before re-running the model (each token still sees itself)")
    engine: Literal["onnx", "numpy"] = Field("onnx", description="onnx: the served graph; numpy: the reference")
    precision: _bounded(1, 8) | None = Field(
        None, description="round every number of the answer to this many decimals (smaller JSON); full float32 "
        "when omitted")
    dtype: Literal["float32", "float16"] = Field("float32", description="tensor dtype of the binary form")


class AttentionRequest(RunOptions):
    layers: list[Index] | None = Field(None, description="layers to return (0-based); all when omitted",
                                       examples=[[0, 5]])
    heads: list[Index] | None = Field(None, description="heads to return (0-based); all when omitted")
    include: list[Literal["attention", "entropy", "summary", "rollout"]] = Field(
        default=["attention", "entropy", "summary"],
        description="parts of the answer to compute: leave out `attention` for summaries without matrices")
    resolution: _bounded(1, 512) | None = Field(
        None, description="block-average each matrix to at most resolution x resolution (overview thumbnails); "
        "`blocks` then gives each cell's token range")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "minilm", "text": EXAMPLE_TEXT, "layers": [4], "heads": [3]}]})


class StagesRequest(RunOptions):
    layer: Index = Field(description="0-based layer")
    head: Index = Field(description="0-based head")
    limit: _bounded(1, 512) | None = Field(
        None, description="return the matrices for the first `limit` tokens only (queries and keys), e.g. to show "
        "the numbers of a long text's opening; `probs` rows are then partial. All tokens when omitted")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "tiny-gpt", "text": "The cat sat on the mat", "layer": 0, "head": 1}]})


class Tokens(BaseModel):
    model: str = Field(description="the model id that answered")
    engine: Literal["onnx", "numpy"] = Field(description="onnx: the served graph; numpy: the reference")
    provider: str = Field(description="execution provider that ran the model (`numpy` for the reference)")
    causal: bool = Field(description="whether the look-ahead mask was applied")
    truncated: bool = Field(description="the input was longer than max_tokens and was cut")
    tokens: list[str] = Field(description="the model's tokens, [CLS]/[SEP] included")
    token_ids: list[int] = Field(description="the tokenizer's id of each token (exact, for any downstream use)")
    offsets: list[list[int]] = Field(description="[start, end) character span of each token in its own text")
    special: list[bool] = Field(description="true for [CLS], [SEP] and other special tokens")
    segments: list[int] = Field(description="0: text, 1: text_pair, -1: special token")
    mask_tokens: list[int] = Field(description="token indices hidden as keys (as asked, sorted)")
    timing_ms: dict[str, float] = Field(description="model: forward pass; total: request handling")


class AttentionResponse(Tokens):
    layers: list[int] = Field(description="the layers in `attention`, in order")
    heads: list[int] = Field(description="the heads in `attention`, in order")
    attention: list[list[Matrix]] | None = Field(
        None, description="[layer][head][query][key] probabilities; rows sum to 1 (block means if `resolution`)")
    blocks: list[list[int]] | None = Field(
        None, description="with `resolution`: [start, end) token range of each row/column block")
    entropy: list[list[list[float]]] | None = Field(None, description="[layer][head][query] in nats, -sum p log p")
    normalized_entropy: list[list[list[float]]] | None = Field(
        None, description="[layer][head][query] entropy / log(visible keys): 0 focused, 1 uniform")
    max_weight: list[list[list[float]]] | None = Field(None, description="[layer][head][query] largest weight")
    summary: dict[str, list[list[float]]] | None = Field(
        None, description=f"per-head statistics [layer][head]: {', '.join(HEAD_STATS)}")
    rollout: Matrix | None = Field(None, description="attention rollout over all layers [query][key]")


class StagesResponse(Tokens):
    layer: int = Field(description="the layer shown")
    head: int = Field(description="the head shown")
    d_head: int = Field(description="width of q and k")
    scale: float = Field(description="1 / (sqrt(d_head) * temperature), the factor applied to the raw scores")
    q: Matrix = Field(description="queries [token][d_head]")
    k: Matrix = Field(description="keys [token][d_head]")
    scores: Matrix = Field(description="q . k^T [query][key]")
    scaled: Matrix = Field(description="scores * scale")
    mask: Matrix = Field(description="additive mask: 0 visible, -3.4e38 (float32 min, i.e. minus infinity) hidden")
    masked: Matrix = Field(description="scaled + mask")
    probs: Matrix = Field(description="softmax of each masked row: the attention weights")


class Health(BaseModel):
    status: Literal["ok"] = Field(description="ok once every model is loaded and its session is open")
    models: dict[str, str] = Field(description="loaded model id -> execution provider")
    version: str = Field(description="attnscope version")
    running: int = Field(description="model runs in flight now")
    waiting: int = Field(description="requests waiting for a run slot")
    max_inflight: int = Field(description="model runs at once (ATTNSCOPE_MAX_INFLIGHT)")
    max_queue: int = Field(description="waiting requests beyond which the answer is 503 (ATTNSCOPE_MAX_QUEUE)")


class Error(BaseModel):
    detail: str = Field(description="what went wrong and what to change")
    errors: list[dict] | None = Field(None, description="per-field validation errors, when there are several")
