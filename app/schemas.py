"""Every request and response body of the REST API, in one place (the OpenAPI at /docs comes from here)."""
from __future__ import annotations

from typing import Annotated, Literal

import copy

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ..analysis.roles import ROLE_TARGETS
from ..analysis.statistics import HEAD_STATS, PAIR_STATS, SCORE_INFO
from ..corpus.examples import RANKABLE
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


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HeadRole(BaseModel):
    layer: int
    head: int
    role: Literal[tuple(ROLE_TARGETS)] = Field(description="; ".join(f"{k}: {v}" for k, v in ROLE_TARGETS.items()))


class ModelCapabilities(BaseModel):
    parameters: int = Field(description="the weights' count")
    weights_bytes: int = Field(description="the weights' size as stored (memory-mapped from their files)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(description="the type the weights are stored in (the "
                                                               "checkpoint's own); arithmetic widens them to float32")
    compute_dtype: ComputeDtype = Field(description="what the model's matrix products run in (ATTNSCOPE_COMPUTE_DTYPE): "
                                        "float32, exact (a bfloat16 or float16 weight widens to float32 exactly), or "
                                        "a fast mode: float16, bfloat16 or tf32, whose error against float32 the "
                                        "README gives per model. Softmax, norms and statistics run in float32 in "
                                        "every mode; the NumPy engine always computes float32",
                                        examples=["float32"])
    memory_budget_bytes: int = Field(description="the memory budget the features were decided against "
                                     "(ATTNSCOPE_MEMORY_MB)")
    features: dict[str, bool] = Field(description="what the model can do here, one entry per feature "
                                      "(runtime/capabilities.py FEATURES, and the page's views: app/pages.py "
                                      "VIEW_NEEDS). By size: stacked (one run holds the whole "
                                      "model; else every request runs layer by layer), numpy (the NumPy engine), "
                                      "circuits (weight-space circuits), importance (/api/importance over every head), "
                                      "stages (/api/stages: the graph of every step of every layer, priced at the "
                                      "longest text it takes). "
                                      "The page's tabs, by their view ids: head, lines, model, summary, entropy, stages, "
                                      "compare, corpus, effects, lens, circuits, atlas. The parts inside them: why "
                                      "(/api/qk), head_lens (/api/lens's head_lens), attribution (include attribution), "
                                      "patching, knockout, predictions (next tokens), generate, jobs (corpus jobs)",
                                      examples=[{"stacked": True, "numpy": True, "circuits": True, "importance": True,
                                                 "stages": True, "lens": False}])
    reasons: dict[str, str] = Field(description="each size feature the model lacks, and why (the limit, named)")
    short: dict[str, str] = Field(default_factory=dict, description="each feature the model lacks, in a few words "
                                  "(what the page shows on a disabled tab or part)",
                                  examples=[{"lens": "no unembedding: no tokens can be read out of its stream"}])


class ModelInfo(BaseModel):
    id: str = Field(description="model id to pass as `model`", examples=["minilm"])
    title: str = Field(description="human-readable name")
    description: str = Field(description="what the model is and where its weights come from")
    kind: Literal["encoder", "decoder", "encoder-decoder"] = Field(
        description="decoders are causal: each token sees only the past; encoder-decoders (T5, BART, Marian) read "
        "`text` with the encoder and `decoder_text` with the decoder, which attends to the encoder (cross-attention)")
    source: Literal["zoo", "folder", "gguf", "hf-cache"] = Field(description="where the model came from")
    architecture: str = Field(description="model family: bert, roberta, gpt2, llama, mistral, qwen2", examples=["bert"])
    layers: int = Field(description="transformer blocks")
    heads: int = Field(description="attention heads per block")
    d_model: int = Field(description="width of the residual stream")
    d_head: int = Field(description="width of each head's queries and keys: d_model / heads")
    max_tokens: int = Field(description="longer inputs are truncated to this many tokens (and flagged `truncated`); "
                            "by default the length the model was trained on (ATTNSCOPE_MAX_TOKENS may raise it)")
    trained_tokens: int | None = Field(None, description="the length the model was trained on, when known: answers "
                                       "past it carry a `warnings` entry (positions beyond it are untrained)")
    max_positions: int = Field(description="the model's position limit: the most ATTNSCOPE_MAX_TOKENS may allow")
    pair: bool = Field(description="accepts `text_pair` (sentence pairs with segment embeddings)")
    provider: str = Field(description="onnxruntime execution provider in use", examples=["CPUExecutionProvider"])
    kv_heads: int = Field(description="key/value heads: query head h reads key/value group h // (heads / kv_heads) "
                          "(grouped-query attention when fewer than heads)")
    predictions: bool = Field(description="has an LM head: answers can include next-token predictions, and it "
                              "generates text (/api/generate)")
    unembedding: bool = Field(False, description="reads tokens out of its residual stream: an LM head, or a "
                              "decoder's tied token embeddings; /api/lens and the OV copying scores need one")
    chat: bool = Field(False, description="its files have a chat template: /api/generate takes `chat`")
    local_layers: list[int] = Field(default_factory=list, description="layers with sliding-window (local) "
                                    "attention (Gemma 2 and 3): there a query sees only its last `sliding_window` "
                                    "keys, a band that is part of the model's own mask, like the causal mask")
    sliding_window: int = Field(0, description="the local layers' window in keys, the query's own included (0: none)")
    head_roles: list[HeadRole] = Field(default_factory=list, description="teaching models: what each hand-wired "
                                       "head does, exactly (>= 0.99 of its weight on its role's target)")
    explanation: str = Field("", description="teaching models: how the model works, in plain language")
    capabilities: ModelCapabilities = Field(description="what the model's size allows on this machine, decided when "
                                            "it loaded (runtime/capabilities.py): a feature it lacks answers 422 with "
                                            "the reason given here")


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


class AttentionRequest(RunOptions):
    layers: list[Index] | None = Field(None, description="layers to return (0-based); all when omitted. Each must "
                                       "be below the chosen model's `layers` (GET /api/models)", examples=[[0, 5]])
    heads: list[Index] | None = Field(None, description="heads to return (0-based); all when omitted. Each must be "
                                      "below the chosen model's `heads` (GET /api/models)")
    include: list[Literal["attention", "entropy", "summary", "rollout", "predictions", "scores", "effect",
                          "attribution"]] = Field(
        default=["attention", "entropy", "summary"],
        description="parts of the answer to compute: leave out `attention` for summaries without matrices; "
        "`predictions`: next_tokens and token_logprobs (models with an LM head; ignored for others); `scores`: "
        "head-finding scores; `effect`: what `ablate` changed (ignored without `ablate`); `attribution`: direct "
        "logit attribution of `target` (models with an LM head; needs `target`)")
    target: Text | None = Field(None, min_length=1, description="with `attribution`: the token whose logit is attributed, as "
                                "next_tokens shows it (\"␣Mary\") or a text that is exactly one token (\" Mary\")",
                                examples=["␣Mary"])
    distractor: Text | None = Field(None, min_length=1, description="with `attribution`: attribute logit(target) - "
                                    "logit(distractor) instead (one token, like `target`)")
    position: Index | None = Field(None, description="with `attribution`: the position whose next-token logit is "
                                   "attributed (0-based; below the text's token count); the last when omitted")
    resolution: _bounded(1, 512) | None = Field(
        None, description="block-average each matrix to at most resolution x resolution (overview thumbnails); "
        "`blocks` then gives each cell's token range. A cell is the mean weight of its block, so a row of cells sums "
        "to about 1/(key block width), not 1: multiply each cell by its key block's width for the share of the "
        "query block's attention on those keys (rows of that sum to 1)")
    top_k: _bounded(1, 64) | None = Field(
        None, description="instead of the matrices, each query's k keys with the most weight (heaviest first, ties "
        "to the lower key): `top_keys` and `top_weights` [layer][head][query][k], what a lines view of a long text "
        "draws. Keys a query cannot see come last, with weight 0")

    decoder_text: Text | None = Field(None, description="encoder-decoders only: the decoder's text, read as "
                                      "transformers reads labels (tokenised with the tokenizer's specials, shifted "
                                      "right behind the decoder start token); the start token alone when omitted or "
                                      "blank (white space only). The answer has decoder_attention and "
                                      "cross_attention")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "minilm", "text": EXAMPLE_TEXT, "layers": [4], "heads": [3]},
        {"model": "t5-small", "text": "translate English to German: The house is wonderful.",
         "decoder_text": "Das Haus ist", "layers": [0], "heads": [0, 1]}]})


class Token(BaseModel):
    token: str = Field(description="the token as a person reads it")
    id: int = Field(description="its exact vocabulary id")


class RankedToken(Token):
    rank: int = Field(description="its rank among the next tokens at the position (1: the most probable)")
    probability: float = Field(description="its probability there (full softmax over the vocabulary)")


class AttributedTarget(RankedToken):
    """The token a typed target became: a text that is one token, or a token as next_tokens shows it."""
    typed: str = Field(description="the target as the request gave it")
    other: RankedToken | None = Field(None, description="the other spelling it may have meant: where a word is one "
                                      "token both with and without its leading space (\"Mary\" and \" Mary\"), the "
                                      "one not used")


class Attribution(BaseModel):
    """Direct logit attribution: each part of the residual stream's direct share of one logit (or a difference of
    two) at one position, through the final norm with its scale frozen at the run's value. The parts sum to `sum`,
    which is the logit (difference) itself (`logit`, read from the model's own output, agrees within float error)."""
    target: AttributedTarget
    distractor: Token | None = Field(None, description="when given: the parts are of logit(target) - "
                                     "logit(distractor)")
    position: int = Field(description="the position whose next-token logit is attributed")
    metric: Literal["logit", "logit_difference"]
    logit: float = Field(description="the model's own logit (difference) at that position")
    sum: float = Field(description="the sum of every part below")
    embeddings: float = Field(description="the token (and position) embeddings' share")
    heads: Matrix = Field(description="[layer][head] each head's share: its output through its columns of W_O")
    mlps: list[float] = Field(description="[layer] each MLP's share")
    attention_bias: list[float] = Field(description="[layer] each attention output bias' share (0 without one)")
    norm_bias: float = Field(description="the final LayerNorm's bias' share (0 for RMSNorm)")


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


class PatchingRequest(TwoTexts):
    """Activation patching between a clean and a corrupt text of the same token count."""
    site: Literal["head_output", "query", "key", "value", "pattern", "residual"] = Field(
        "head_output", description="what is patched: " + SITE_DOC)
    per_position: JsonBool = Field(False, description="patch each (layer, head, position) alone, not each (layer, "
                                   "head) at every position; at most ATTNSCOPE_MAX_PATCHING_RUNS rows in all. "
                                   "residual is always per position")
    direction: Literal["denoise", "noise"] = Field("denoise", description="denoise: clean values into the corrupt "
                                                   "run; noise: corrupt values into the clean run")
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "clean": "When Mary and John went to the store, John gave a drink to",
         "corrupt": "When Mary and John went to the store, Mary gave a drink to", "target": "␣Mary",
         "distractor": "␣John"}]})


class PatchingResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    site: str = Field(description="the site patched")
    hook: str = Field(description="its name at each layer, TransformerLens' hook point", examples=[
        "blocks.{layer}.attn.hook_z"])
    direction: Literal["denoise", "noise"]
    metric: Literal["logit_difference", "logprob"] = Field(description="logit(target) - logit(distractor) at the "
                                                           "last position, or log p(target) without a distractor")
    target: Token
    distractor: Token | None = None
    clean_tokens: list[str]
    corrupt_tokens: list[str]
    clean: float = Field(description="the metric on the clean run")
    corrupt: float = Field(description="the metric on the corrupt run")
    patched: list = Field(description="the metric with one site patched: [layer][head] ([layer][head][position] "
                          "per position; residual [layer][position])")
    recovery: list | None = Field(description="(patched - corrupt) / (clean - corrupt), the same shape; null when "
                                  "clean and corrupt have the same metric")
    timing_ms: dict[str, float]


Pair = Annotated[list[Index], Field(min_length=2, max_length=2)]   # [layer, head]


class PathPatchingRequest(TwoTexts):
    """Path patching (Wang et al. 2023): the senders' outputs from the corrupt run reach the receivers only along
    their direct paths (every other head frozen at its clean output, the MLPs recomputed), and the receivers' query,
    key or value so computed is put into the clean run."""
    senders: list[Pair] | None = Field(None, min_length=1, max_length=4096, examples=[[[10, 4], [12, 1]]], description="the "
                                       "sender heads, [layer, head] pairs, patched together (the answer: one number); "
                                       "each head of the model alone when omitted (the answer: a [layer][head] map)")
    receivers: list[Pair] | None = Field(None, min_length=1, max_length=4096, examples=[[[23, 3]]], description="the receiver "
                                         "heads, [layer, head] pairs, whose `receiver_input` takes the paths' values; "
                                         "when omitted the paths end at the logits (the residual stream after the last "
                                         "block). A sender at or above every receiver's layer has no path: the clean "
                                         "metric")
    receiver_input: Literal["query", "key", "value"] = Field(
        "query", description="which input of the receivers is patched (hook_q, after RoPE; hook_k; hook_v -- per "
        "query head: in a grouped-query model the key and value that head reads). Without receivers, unused")
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "clean": IOI_CLEAN, "corrupt": IOI_CORRUPT, "target": "␣Mary", "distractor": "␣John",
         "receivers": [[23, 3]], "receiver_input": "query"}]})


class PathPatchingResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    senders: list[list[int]] | None = Field(description="the senders patched together; null: each head alone")
    receivers: list[list[int]] | None = Field(description="the receivers; null: the logits")
    receiver_input: Literal["query", "key", "value"] = Field(description="the receivers' input patched")
    hooks: dict[str, str] = Field(description="TransformerLens' hook points: where senders are read and heads "
                                  "frozen (hook_z), where receivers are written", examples=[
                                      {"senders": "blocks.{layer}.attn.hook_z", "receivers": "blocks.{layer}.attn.hook_q"}])
    metric: Literal["logit_difference", "logprob"] = Field(description="logit(target) - logit(distractor) at the "
                                                           "last position, or log p(target) without a distractor")
    target: Token
    distractor: Token | None = None
    clean_tokens: list[str] = Field(description="the clean text's tokens")
    corrupt_tokens: list[str] = Field(description="the corrupt text's tokens")
    clean: float = Field(description="the metric on the clean run")
    corrupt: float = Field(description="the metric on the corrupt run")
    patched: float | Matrix = Field(description="the metric with the paths patched: one number for the senders "
                                    "together, or [layer][head] each head the one sender")
    recovery: float | Matrix | None = Field(description="(patched - corrupt) / (clean - corrupt): 1 where the paths "
                                            "carry nothing of the corruption, 0 where they carry all of it; null when "
                                            "clean and corrupt have the same metric")
    timing_ms: dict[str, float]


class KnockoutRequest(Strict):
    """Attention knockout: chosen queries stop reading chosen keys in a range of layers."""
    model: Text = Field("smollm2", description="a model id with an LM head (`predictions`)", examples=["smollm2"])
    text: Text = Field(description="the text", examples=["When Mary and John went to the store, John gave a drink "
                                                         "to"], json_schema_extra={"pattern": r"\S"})
    queries: list[Index] = Field(min_length=1, max_length=MAX_INDEX + 1, description="query positions (0-based)",
                                 examples=[[13]])
    keys: list[Index] = Field(min_length=1, max_length=MAX_INDEX + 1, description="key positions they stop reading",
                              examples=[[2]])
    layers: Annotated[list[Index], Field(min_length=2, max_length=2)] | None = Field(
        None, description="[first, last] layers (inclusive) of the knockout; every layer when omitted",
        examples=[[0, 29]])
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "text": "When Mary and John went to the store, John gave a drink to", "queries": [13],
         "keys": [2]}]})


class KnockoutResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    tokens: list[str]
    queries: list[int]
    keys: list[int]
    layers: list[int] = Field(description="[first, last] the layers knocked out")
    effect: Effect = Field(description="the prediction before and after (`next_tokens_after`)")
    timing_ms: dict[str, float]


QK_TEXT = "The cat sat on the mat. The cat"


class QKRequest(Strict):
    """QK attribution: one head's pre-softmax score at one (query, key) cell, split into the residual stream's
    components on either side."""
    model: Text = Field("smollm2", description="a model id from GET /api/models", examples=["smollm2"])
    text: Text = Field(description="the text; at least one non-blank character", examples=[QK_TEXT],
                       json_schema_extra={"pattern": r"\S"})
    layer: Index = Field(description="the head's layer (0-based), below the model's `layers`", examples=[1])
    head: Index = Field(description="the head (0-based), below the model's `heads`", examples=[0])
    query: Index = Field(description="the query position (0-based), below the text's token count", examples=[7])
    key: Index = Field(description="the key position (0-based), below the text's token count", examples=[2])
    top: _bounded(1, 1000) = Field(12, description="the pairs of components with the largest |contribution|, "
                                   "largest first")
    table: JsonBool = Field(False, description="also the whole [query component][key component] table")
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "text": QK_TEXT, "layer": 1, "head": 0, "query": 7, "key": 2}]})


class QKComponent(BaseModel):
    name: str = Field(description="embed (token embeddings), pos_embed (learned positions), type_embed (segments), "
                      "L{layer}H{head} (a head's output through its columns of W_O), L{layer} MLP (an MLP's output), "
                      "bias (every constant term: projection and norm biases)", examples=["L0H3"])
    kind: Literal["embed", "pos_embed", "type_embed", "head", "mlp", "bias"]
    layer: int | None = None
    head: int | None = None
    hook: str | None = Field(None, description="the TransformerLens hook point that holds it",
                             examples=["blocks.0.attn.hook_result"])


class QKPair(BaseModel):
    query: int = Field(description="index into `components`: the query-side part (at position `query`)")
    key: int = Field(description="index into `components`: the key-side part (at position `key`)")
    value: float = Field(description="its contribution to the scaled score")


class QKResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    tokens: list[str]
    layer: int
    head: int
    query: int
    key: int
    kv_head: int = Field(description="the key/value head whose keys this head reads (grouped-query attention)")
    score: float = Field(description="the table's sum: the head's scaled score q.k / (sqrt(d_head) * temperature) "
                         "at the cell, through the decomposition (float64)")
    scaled: float = Field(description="the same score as the model's run computed it (/api/stages' `scaled`); "
                          "`score` equals it to float error")
    visible: bool = Field(description="the query sees the key (false: masked, e.g. a causal model's future key: its "
                          "probability is 0 whatever the score)")
    probability: float = Field(description="the head's attention probability at the cell")
    components: list[QKComponent] = Field(description="the residual stream's parts entering the layer, on either side; "
                                        "norms' scales are frozen at the run's value, RoPE rotates each part at its "
                                        "own position")
    query_sums: list[float] = Field(description="[component] its query-side part's contribution with the whole key")
    key_sums: list[float] = Field(description="[component] its key-side part's contribution with the whole query")
    top: list[QKPair] = Field(description="the largest contributions by absolute value, largest first")
    explained: float = Field(description="the top pairs' share of the table's absolute mass, sum |top| / sum |table|")
    table: Matrix | None = Field(None, description="with `table`: [query component][key component]")
    timing_ms: dict[str, float]


class LensRequest(Strict):
    """The logit lens of a text, and optionally one head's logit lens."""
    model: Text = Field("smollm2", description="a model id with an unembedding (`unembedding`)",
                        examples=["smollm2"])
    text: Text = Field(description="the text; at least one non-blank character", examples=[QK_TEXT],
                       json_schema_extra={"pattern": r"\S"})
    top: _bounded(1, 20) = Field(5, description="tokens per cell, most probable first")
    head_lens: Annotated[list[Index], Field(min_length=2, max_length=2)] | None = Field(
        None, description="[layer, head]: also that head's logit lens", examples=[[1, 0]])
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"model": "smollm2", "text": QK_TEXT, "head_lens": [1, 0]}]})


class HeadLens(BaseModel):
    layer: int
    head: int
    promoted_ids: list[list[int]] = Field(description="[position][k] the tokens whose logits the head's output there "
                                          "raises most (through the final norm, its scale frozen, and the "
                                          "unembedding), largest first")
    promoted_tokens: list[list[str]]
    promoted_logits: Matrix = Field(description="[position][k] the head's direct effect on each one's logit")
    suppressed_ids: list[list[int]] = Field(description="[position][k] the tokens it lowers most")
    suppressed_tokens: list[list[str]]
    suppressed_logits: Matrix


class LensResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    tokens: list[str]
    token_ids: list[int]
    rows: list[str] = Field(description="embed, then L0 .. L{layers-1}: the residual stream after the embeddings and "
                            "after each block, read through the final norm and the unembedding. The last row is the "
                            "model's own prediction")
    hooks: list[str] = Field(description="each row's TransformerLens hook point")
    top_ids: list[list[list[int]]] = Field(description="[row][position][k] the most probable next tokens")
    top_tokens: list[list[list[str]]]
    top_probs: list[list[list[float]]]
    next_probs: Matrix = Field(description="[row][position] the probability of the token that actually comes next "
                               "(0 at the last position: nothing follows)")
    head_lens: HeadLens | None = None
    timing_ms: dict[str, float]


class CircuitsRequest(Strict):
    """Weight-space circuits of a model: no text."""
    model: Text = Field("smollm2", description="a model id from GET /api/models", examples=["smollm2"])
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"model": "smollm2"}]})


class CircuitsResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    layers: int
    heads: int
    kv_heads: int
    ov_copying: list[list[float | None]] | None = Field(
        description="[layer][head] the OV copying score (Elhage et al. 2021): the eigenvalues of the OV circuit "
        "from tokens to logits (W_E W_V W_O W_U), their sum over the sum of their absolute values, in [-1, 1]; "
        "positive: the head raises the logit of the token it attends to. Null for a model without an unembedding "
        "(null entries: a head whose circuit is zero)")
    composition_q: Matrix = Field(description="[writer][reader] Q-composition ||OV_w QK_r|| / (||OV_w|| ||QK_r||), "
                                  "heads by flat index layer * heads + head; 0 unless the reader's layer is later")
    composition_k: Matrix = Field(description="[writer][reader] K-composition ||OV_w QK_r^T|| / (||OV_w|| ||QK_r||)")
    composition_v: Matrix = Field(description="[writer][reader] V-composition ||OV_w OV_r|| / (||OV_w|| ||OV_r||)")
    timing_ms: dict[str, float]


class Interventions(Strict):
    """What is changed in every step of a generation."""
    ablate: list[Annotated[list[Index], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list, max_length=4096, examples=[[[17, 4]]],
        description="heads to knock out, as [layer, head] pairs: their output (before the output projection) is zero "
        "in the prompt's run and in every step, as `ablate` with `ablation` zero on /api/attention")


class GenerateRequest(Strict):
    """Token-by-token generation, streamed as NDJSON."""
    model: Text = Field("smollm2", description="a model id with an LM head (`predictions`)", examples=["smollm2"])
    text: Text = Field(description="the prompt", examples=["The quick brown fox"], json_schema_extra={"pattern": r"\S"})
    max_new_tokens: _bounded(1, 4096) = Field(32, description="tokens to generate at most (ATTNSCOPE_MAX_NEW_TOKENS "
                                              "caps it; the prompt and the new tokens together within the model's "
                                              "`max_tokens`)")
    greedy: JsonBool = Field(False, description="always the most probable token (temperature, top_k and top_p then "
                             "only shape the reported distribution); otherwise sampled")
    temperature: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] = Field(1.0, description="divides the logits before the "
                                                                "softmax: below 1 sharper, above 1 flatter; above 0 "
                                                                "(for the most probable token, set greedy)")
    top_k: _bounded(0, 1_000_000) = Field(0, description="sample among the k most probable tokens only; 0: off")
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(1.0, description="then among the fewest most probable tokens "
                                                       "whose probability reaches top_p (nucleus sampling); 1: off")
    seed: _bounded(0, 2**32 - 1) | None = Field(None, description="the sampling's random seed: the same seed and "
                                                "options give the same continuation; a random one when omitted (the "
                                                "last line says which)")
    stop: list[Annotated[str, Field(min_length=1, max_length=64), BeforeValidator(_unicode_first)]] = Field(
        default_factory=list, max_length=8, description="stop once the continuation contains one of these texts "
                                                        "(its token included); the model's end-of-text token always stops")
    chat: JsonBool = Field(False, description="wrap the prompt in the model's chat template as a user message, "
                           "with the assistant's turn opened (models whose files have a template)")
    interventions: Interventions | None = Field(None, description="heads knocked out while generating")
    layers: list[Index] | None = Field(None, description="with `attention`: the layers whose rows each token "
                                       "carries; all when omitted")
    heads: list[Index] | None = Field(None, description="with `attention`: the heads whose rows each token "
                                      "carries; all when omitted")
    include: list[Literal["attention", "candidates"]] = Field(
        default=["candidates"], description="what each token's line carries: `candidates`, the step's most "
        "probable tokens with their probability before and after temperature, top-k and top-p; `attention`, the "
        "new token's attention row over every position so far, [layer][head][key]")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "text": "The quick brown fox", "max_new_tokens": 16, "greedy": True}]})


class Candidate(BaseModel):
    token: str = Field(description="the token as a person reads it")
    id: int
    probability: float = Field(description="its probability under the model (softmax of the logits)")
    sampling_probability: float = Field(description="after temperature, top-k and top-p: what it is drawn with")


class GeneratedToken(BaseModel):
    """One line of the stream per new token: `{"token": GeneratedToken}`."""
    index: int = Field(description="its position in the sequence (prompt tokens first)")
    id: int
    token: str = Field(description="the token as a person reads it")
    text: str = Field(description="the continuation so far, decoded")
    probability: float = Field(description="its probability under the model")
    sampling_probability: float = Field(description="its probability under the sampling distribution")
    candidates: list[Candidate] | None = Field(None, description="with `candidates`: the step's most probable tokens")
    attention: list | None = Field(None, description="with `attention`: its attention row, [layer][head][key] over "
                                   "positions 0..index")


class GenerateDone(BaseModel):
    """The stream's last line: `{"done": GenerateDone}` (or `{"error": {"status", "detail"}}`)."""
    model: str
    compute_dtype: ComputeDtype = Field("float32", description="what the steps' matrix products ran in: float32 "
                                        "(exact), or the server's fast mode (ATTNSCOPE_COMPUTE_DTYPE)")
    prompt_tokens: list[str] = Field(description="the prompt's tokens (after the chat template, with `chat`)")
    tokens: list[str] = Field(description="the new tokens")
    ids: list[int] = Field(description="the new tokens' ids")
    text: str = Field(description="the continuation, decoded")
    sequence: str = Field(description="prompt and continuation, decoded")
    stop_reason: Literal["max_new_tokens", "eos", "stop", "time"]
    seed: int = Field(description="the seed used")
    layers: list[int] | None = Field(None, description="with `attention`: the layers of each row")
    heads: list[int] | None = Field(None, description="with `attention`: the heads of each row")
    ablate: list[list[int]] = Field(description="the heads knocked out")
    timing_ms: dict[str, float] = Field(description="prompt (its run), total, and per_token (the mean step)")
    tokens_per_second: float


class StagesRequest(RunOptions):
    layer: Index = Field(description="0-based layer, below the chosen model's `layers` (GET /api/models)")
    head: Index = Field(description="0-based head, below the chosen model's `heads` (GET /api/models)")
    limit: _bounded(1, 512) | None = Field(
        None, description="return the matrices for the first `limit` tokens only (queries and keys), e.g. to show "
        "the numbers of a long text's opening; `probs` rows are then partial. All tokens when omitted")
    decoder_text: Text | None = Field(None, description="encoder-decoders only: the decoder's text, as /api/attention "
                                      "reads it (omitted or blank: the decoder start token alone)")
    attention: Literal["encoder", "decoder", "cross"] | None = Field(
        None, description="encoder-decoders only: whose head, the encoder's self-attention, the decoder's, or "
        "cross-attention (the default: queries from the decoder's tokens, keys and values from the encoder's output). "
        "Its steps come from the NumPy reference (the served graph keeps only the probabilities)")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "tiny-gpt", "text": "The cat sat on the mat", "layer": 0, "head": 1}]})


class Tokens(BaseModel):
    model: str = Field(description="the model id that answered")
    engine: Literal["onnx", "numpy"] = Field(description="onnx: the served graph; numpy: the reference")
    provider: str = Field(description="execution provider that ran the model (`numpy` for the reference)")
    compute_dtype: ComputeDtype = Field(description="what the run's matrix products ran in: float32 (exact), or the "
                                        "server's fast mode (ATTNSCOPE_COMPUTE_DTYPE), with a line in `warnings`; "
                                        "the NumPy engine always float32", examples=["float32"])
    causal: bool = Field(description="whether the look-ahead mask was applied")
    truncated: bool = Field(description="the input was longer than max_tokens and was cut")
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


class AttentionResponse(Tokens):
    layers: list[int] = Field(description="the layers in `attention`, in order")
    heads: list[int] = Field(description="the heads in `attention`, in order")
    attention: list[list[Matrix]] | None = Field(
        None, description="[layer][head][query][key] probabilities; rows sum to 1. With `resolution`: block means, "
        "whose rows sum to about 1/(key block width) (see `resolution`)")
    blocks: list[list[int]] | None = Field(
        None, description="with `resolution`: [start, end) token range of each row/column block")
    top_keys: list[list[list[list[int]]]] | None = Field(
        None, description="with `top_k`: [layer][head][query][k] key indices, heaviest first")
    top_weights: list[list[Matrix]] | None = Field(
        None, description="with `top_k`: [layer][head][query][k] their weights")
    entropy: list[list[list[float]]] | None = Field(None, description="[layer][head][query] in nats, -sum p log p")
    normalized_entropy: list[list[list[float]]] | None = Field(
        None, description="[layer][head][query] entropy / log(visible keys), within [0, 1]: 0 focused, 1 uniform "
        "(0 when one key is visible)")
    max_weight: list[list[list[float]]] | None = Field(None, description="[layer][head][query] largest weight")
    summary: dict[str, list[list[float]]] | None = Field(
        None, description=f"per-head statistics [layer][head]: {', '.join(HEAD_STATS)}; for a sentence pair also "
        f"{', '.join(PAIR_STATS)}")
    rollout: Matrix | None = Field(None, description="attention rollout over all layers [query][key]")
    next_tokens: list[NextToken] | None = Field(None, description="with `predictions`: the 10 most probable "
                                                "tokens after the last one")
    token_logprobs: list[float | None] | None = Field(
        None, description="with `predictions`: natural log p(token_i | the tokens before it); null for the first")
    scores: dict[str, list[list[float]]] | None = Field(
        None, description="with `scores`, per head [layer][head] in [0, 1]: "
        + "; ".join(f"{k}: {v}" for k, v in SCORE_INFO.items()))
    attribution: Attribution | None = Field(None, description="with `attribution`: direct logit attribution")
    ablate: list[list[int]] | None = Field(None, description="the heads knocked out in this run, [layer, head]")
    effect: Effect | None = Field(None, description="with `effect` and `ablate`: what the ablation changed")
    decoder_tokens: list[str] | None = Field(None, description="encoder-decoders: the decoder's tokens, its start "
                                             "token first")
    decoder_token_ids: list[int] | None = Field(None, description="encoder-decoders: their ids")
    decoder_special: list[bool] | None = Field(None, description="encoder-decoders: which decoder tokens are special "
                                               "(the start token, </s>): what the page hides with the special tokens")
    decoder_attention: list[list[Matrix]] | None = Field(
        None, description="encoder-decoders: the decoder's self-attention [layer][head][decoder query][decoder key] "
        "(causal); `attention` is then the encoder's")
    cross_attention: list[list[Matrix]] | None = Field(
        None, description="encoder-decoders: [layer][head][decoder query][encoder key], each decoder token's "
        "attention over the encoder's tokens (rows sum to 1)")


class ImportanceRequest(Strict):
    """Single-head ablation of every head, one at a time, on one text."""
    model: Text = Field("minilm", description="a model id from GET /api/models", examples=["minilm"])
    text: Text = Field(description="the text to measure on; at least one non-blank character", examples=[EXAMPLE_TEXT],
                       json_schema_extra={"pattern": r"\S"})
    text_pair: Text | None = Field(None, description="optional second sentence (models with `pair` only); at least "
                                   "one non-blank character", json_schema_extra={"pattern": r"\S"})
    ablation: Literal["zero", "mean"] = Field("zero", description="what replaces the knocked-out head's output")
    batch: _bounded(1, 64) = Field(16, description="heads ablated at once (each a row of the batch axis, "
                                   "from its own layer on); changes the speed, never the numbers beyond float "
                                   "rounding (1e-5)")
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")
    dtype: Literal["float32", "float16"] = Field("float32", description="tensor dtype of the binary form")


class ImportanceResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    tokens: list[str] = Field(description="the model's tokens")
    measure: Literal["mean_logprob_change", "embedding_distance"] = Field(
        description="mean_logprob_change (models with an LM head): the text's mean token log-prob with the head "
        "knocked out minus intact (negative: the head helps); embedding_distance (others): 1 - cosine similarity "
        "of the mean-pooled final hidden states with and without the head")
    baseline: float = Field(description="the intact run's mean token log-prob (1.0 for embedding_distance)")
    importance: list[list[float]] = Field(description="[layer][head] the measure for that head alone knocked out")
    timing_ms: dict[str, float] = Field(description="model: all forward passes; total: request handling")


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


class StagesResponse(Tokens):
    """Every step of one head, in order: x -> q, k, v -> scores -> scaled -> + mask -> softmax -> probs . v -> W_o.
    With `limit`, every matrix has its first `limit` tokens (rows, and key columns) of the run on the whole text."""
    layer: int = Field(description="the layer shown")
    head: int = Field(description="the head shown")
    d_head: int = Field(description="width of q, k, v and ctx")
    scale: float = Field(description="1 / (sqrt(d_head) * temperature), the factor applied to the raw scores (Gemma: "
                         "sqrt(query_pre_attn_scalar) in place of sqrt(d_head); Gemma 2 then soft-caps them, "
                         "cap * tanh(scaled / cap), as part of `scaled`)")
    x: Matrix = Field(description="the layer's input as its q, k and v projections read it [token][d_model]: after "
                      "the block's norm in a pre-norm model (GPT-2, Llama), the block's input itself in BERT")
    q: Matrix = Field(description="queries [token][d_head]: x W_q^T + b_q, this head's rows (after RoPE in Llama "
                      "models)")
    k: Matrix = Field(description="keys [token][d_head], as this head reads them (its key/value group's in a "
                      "grouped-query model; after RoPE in Llama models)")
    v: Matrix = Field(description="values [token][d_head], as this head reads them")
    scores: Matrix = Field(description="q . k^T [query][key]")
    scaled: Matrix = Field(description="scores * scale")
    mask: Matrix = Field(description="additive mask: 0 visible, -3.4e38 (float32 min, i.e. minus infinity) hidden")
    masked: Matrix = Field(description="scaled + mask")
    probs: Matrix = Field(description="softmax of each masked row: the attention weights")
    row_max: list[float] = Field(description="per query shown: the largest entry of its whole `masked` row (every "
                                 "key, also those past `limit`)")
    row_sum: list[float] = Field(description="per query shown: sum over its whole row of exp(masked - row_max), so "
                                 "probs[i][j] = exp(masked[i][j] - row_max[i]) / row_sum[i]")
    ctx: Matrix = Field(description="the head's output [query][d_head]: probs . v over all keys, sum_j "
                        "probs[i][j] v[j] (before any `ablate`)")
    contribution: Matrix = Field(description="the head's share of the attention output [query][d_model]: ctx "
                                 "through its d_head columns of the output projection, ctx W_o[:, head]^T. The "
                                 "heads' shares plus W_o's bias make the attention output added to the residual "
                                 "stream. Computed by the server from ctx and the model's weights")
    attention: Literal["encoder", "decoder", "cross"] | None = Field(
        None, description="encoder-decoders: whose head this is; `tokens` are then the encoder's (as in /api/attention)")
    query_tokens: list[str] | None = Field(None, description="encoder-decoders: the queries' tokens (the rows; the "
                                           "decoder's for decoder and cross-attention)")
    key_tokens: list[str] | None = Field(None, description="encoder-decoders: the keys' tokens (the columns; the "
                                         "encoder's for encoder and cross-attention)")


class SkippedJob(BaseModel):
    folder: str = Field(description="the job's folder under ATTNSCOPE_JOBS_DIR")
    reason: str = Field(description="why its job.json could not be read")


class Health(BaseModel):
    status: Literal["ok", "loading"] = Field(description="ok once every model is loaded and every graph its "
                                             "features run is open; loading before (the server answers meanwhile)")
    models: dict[str, str] = Field(description="loaded model id -> execution provider")
    loading: dict[str, str] = Field(default_factory=dict, description="each model not loaded yet -> what it is "
                                    "doing (waiting, loading its weights and tokenizer, building its graphs (n of "
                                    "m: ...)); models load in the order ATTNSCOPE_MODELS names them, and a request "
                                    "for one still loading answers 503 with Retry-After",
                                    examples=[{"smollm2": "building its graphs (3 of 25: decoding graph)",
                                               "gemma3": "waiting"}])
    graphs_built: int = Field(description="ONNX graphs this process has built: a served model's are built while it "
                              "loads (exported ones only when not in the graph cache), none by a request")
    version: str = Field(description="attnscope version")
    running: int = Field(description="model runs in flight now")
    waiting: int = Field(description="requests waiting for a run slot")
    max_inflight: int = Field(description="model runs at once (ATTNSCOPE_MAX_INFLIGHT)")
    max_queue: int = Field(description="waiting requests beyond which the answer is 503 (ATTNSCOPE_MAX_QUEUE)")
    cache_bytes: int = Field(description="what the result cache holds now, each result charged its true size")
    cache_max_bytes: int = Field(description="the result cache's budget (ATTNSCOPE_CACHE_MB)")
    jobs_skipped: list[SkippedJob] = Field(default_factory=list, description="job records found at start-up that "
                                           "this server could not read, and why (they are not listed in /api/jobs)")


# ---- corpus jobs (POST/GET/DELETE /api/jobs; app/jobs.py) -----------------------------------------------------
class CorpusUpload(Strict):
    """A corpus sent in the request: a file's content as a string, read like the CLI reads that format."""
    format: Literal["text", "jsonl", "csv", "tsv"] = Field("text", description="text: one text per line; jsonl: one "
                                                           "JSON object per line; csv/tsv: a header row, then rows")
    data: Text = Field(min_length=1, description="the file's content (UTF-8); the request body's limit is "
                       "ATTNSCOPE_MAX_UPLOAD_BYTES", examples=["The cat sat on the mat.\nThe dog sat on the rug.\n"])
    column: Text | None = Field(None, description="jsonl/csv/tsv: the field or column holding the text (default "
                                "`text`); a text upload has one text per line and no columns (ignored there)")


class AtlasOptions(Strict):
    texts: _bounded(1, 10_000_000) | None = Field(None, description="a uniform random sample of this many texts "
                                                  "(seeded); all when left out. At most ATTNSCOPE_MAX_JOB_TEXTS",
                                                  examples=[200])
    seed: _bounded(0, 2**31 - 1) = Field(0, description="the sample's seed")
    top: _bounded(1, 50) = Field(10, description="top examples kept per head")
    per_decile: _bounded(0, 10) = Field(2, description="examples kept per head in each tenth of the score's range")
    rank_by: Literal[RANKABLE] = Field("max_weight", description="what ranks a window for a head: max_weight, its "
                                       "largest weight off the attention sink (queries and keys after the first), or "
                                       "a statistic whose row is a weight (the text's mean of it)")
    window: _bounded(8, 512) = Field(64, description="an example keeps at most this many tokens around its query")


class JobRequest(Strict):
    kind: Literal["atlas"] = Field("atlas", description="atlas: per-head statistics and top examples over a corpus")
    model: Text = Field("minilm", description="a served model id from GET /api/models (a zoo model)",
                        examples=["tiny-gpt"])
    corpus: Literal["bundled"] | CorpusUpload = Field(
        "bundled", description="\"bundled\": the default corpus that ships with attnscope (sentences of the Python "
        "standard library's docstrings, PSF-2.0); or an upload")
    options: AtlasOptions = Field(default_factory=AtlasOptions)
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"kind": "atlas", "model": "tiny-gpt", "corpus": "bundled", "options": {"texts": 200}}]})


class JobProgress(BaseModel):
    texts_done: int = Field(description="texts finished, those of a resumed run's earlier runs included")
    texts_total: int = Field(description="texts the job reads")
    rate: float | None = Field(None, description="texts per second in this run")
    eta_s: float | None = Field(None, description="seconds left at this rate")


class Job(BaseModel):
    id: str = Field(description="the job's id: a hash of kind, model, corpus and options (the same request is the "
                    "same job)", examples=["3f2a9c1d0b7e4a65"])
    kind: Literal["atlas"]
    model: str
    corpus: str = Field(description="\"bundled\" or upload:<sha256 prefix of the upload>")
    options: AtlasOptions
    state: Literal["queued", "running", "cancelling", "cancelled", "done", "failed", "interrupted"] = Field(
        description="queued, running, cancelling (stops after the chunk under way), cancelled, done, failed, "
        "interrupted (the server stopped while it ran); cancelled, failed and interrupted jobs resume from their "
        "finished chunks when the same request is POSTed again")
    progress: JobProgress
    resumed_from: int = Field(0, description="texts already done when this run started (a resumed job)")
    error: str | None = Field(None, description="why a failed job failed")
    created: float = Field(description="Unix time the job was first posted")
    finished: float | None = Field(None, description="Unix time it finished")
    result: dict[str, str] | None = Field(None, description="done: format -> URL of its result (json, parquet)")


class Error(BaseModel):
    detail: str = Field(description="what went wrong and what to change")
    errors: list[dict] | None = Field(None, description="per-field validation errors, when there are several")


REQUESTS = ("AttentionRequest", "StagesRequest", "ImportanceRequest", "PatchingRequest", "PathPatchingRequest",
            "KnockoutRequest", "GenerateRequest", "QKRequest", "LensRequest", "CircuitsRequest")
# the requests only some models take: the ModelInfo flag that says which, and its words
NEEDS = {"PatchingRequest": ("predictions", "an LM head"), "PathPatchingRequest": ("predictions", "an LM head"),
         "KnockoutRequest": ("predictions", "an LM head"),
         "GenerateRequest": ("predictions", "an LM head"), "LensRequest": ("unembedding", "an unembedding")}


def with_job_request(openapi: dict) -> dict:
    """The OpenAPI with JobRequest's schema (and those it refers to) among its components: POST /api/jobs reads its
    body itself (app/routes.py), and its requestBody refers to JobRequest by name."""
    schema = JobRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components["JobRequest"] = schema
    return openapi


def per_model(openapi: dict, models: list[ModelInfo], max_mask_tokens: int, max_new_tokens: int = 256) -> dict:
    """The OpenAPI with one schema per served model for every request body, so that the schema says what the server
    takes. The operations take `<Request>ByModel`, one of `<Request>.<model>`: each fixes `model` (the default
    model's may leave it out) and bounds every layer, head and token index by that model's own `layers`, `heads` and
    `max_tokens`, takes `text_pair` only for a model with `pair`, and at most ATTNSCOPE_MAX_MASK_TOKENS masked
    tokens (a generation: at most ATTNSCOPE_MAX_NEW_TOKENS new ones, and `chat` only where the model has a template). The generic `<Request>` stays, every field documented, its indices bounded by the largest served model.
    What depends on the text itself (a mask index past its last token, an answer too big for its wire form, the
    character limit) is checked per request and refused with a message naming it. With no models loaded the schema
    keeps its generic form."""
    _stream_schemas(openapi)
    _integer_bounds(openapi)
    if not models:
        return openapi
    schemas = openapi.get("components", {}).get("schemas", {})
    _bound_generic(schemas, models)
    for name in REQUESTS:
        generic = schemas.get(name)
        flag, words = NEEDS.get(name, (None, ""))
        served = [m for m in models if flag is None or getattr(m, flag)]
        if generic is None or not served:
            continue
        for m in served:
            schemas[f"{name}.{m.id}"] = _variant(generic, m, max_mask_tokens, max_new_tokens, schemas)
        schemas[f"{name}ByModel"] = {
            "title": f"{name} (one schema per served model)", "description": generic.get("description", "") +
            f" The fields of {name}, with the ranges of the model `model` names" + (
                f" (the models with {words})." if flag else "."),
            "oneOf": [{"$ref": f"#/components/schemas/{name}.{m.id}"} for m in served],
            "examples": [_example(generic, served[0])]}
    for item in openapi.get("paths", {}).values():
        for op in item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            name = body.get("$ref", "").rsplit("/", 1)[-1]
            if name in REQUESTS and f"{name}ByModel" in schemas:
                body["$ref"] = f"#/components/schemas/{name}ByModel"
    return openapi


def _integer_bounds(node) -> None:
    """An integer's bounds written as integers: FastAPI's OpenAPI model writes every bound as a float (64.0). The API
    takes 45.0 for the integer 45, as JSON Schema does, but a schema's integer bounds read best as integers."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
                if isinstance(node.get(key), float) and node[key].is_integer():
                    node[key] = int(node[key])
        for value in node.values():
            _integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _integer_bounds(value)


def _bound_generic(schemas: dict, models: list[ModelInfo]) -> None:
    """The generic request schemas: every layer, head and token index bounded by the largest served model."""
    top = {"layers": max(m.layers for m in models) - 1, "heads": max(m.heads for m in models) - 1,
           "mask_tokens": max(m.max_tokens for m in models) - 1}
    top |= {"layer": top["layers"], "head": top["heads"]}
    note = {"layers": "layers", "heads": "heads", "layer": "layers", "head": "heads", "mask_tokens": "max_tokens"}
    for name in ("AttentionRequest", "StagesRequest"):
        props = schemas.get(name, {}).get("properties", {})
        for field, bound in top.items():
            if field in props:
                _narrow(props[field], bound)
                props[field]["description"] += (f". Here at most {bound}: the largest `{note[field]}` among the "
                                                 "served models, each of which checks its own")


def _variant(generic: dict, m: ModelInfo, max_mask_tokens: int, max_new_tokens: int, schemas: dict) -> dict:
    variant = copy.deepcopy(generic)
    variant.pop("description", None)
    variant["title"] = f"{generic.get('title', '')} for {m.id}"
    props = variant["properties"]
    variant["examples"] = [_example(generic, m)]
    for field in ("layers", "heads", "ablate", "mask_tokens", "queries", "keys", "query", "key", "position", "clean",
                  "corrupt", "target", "distractor", "head_lens", "senders", "receivers"):   # the generic examples need not fit this model (its tokens, its sizes)
        props.get(field, {}).pop("examples", None)
    default = props["model"].get("default")
    props["model"] = {"const": m.id, "type": "string", "description": f"{m.title}: {m.layers} layers x {m.heads} "
                      f"heads, up to {m.max_tokens} tokens"} | ({"default": m.id} if m.id == default else {})
    if m.id != default:
        variant["required"] = sorted(set(variant.get("required", [])) | {"model"})
    bounds = {"layers": m.layers - 1, "heads": m.heads - 1, "layer": m.layers - 1, "head": m.heads - 1,
              "mask_tokens": m.max_tokens - 1, "queries": m.max_tokens - 1, "keys": m.max_tokens - 1,
              "position": m.max_tokens - 1, "query": m.max_tokens - 1, "key": m.max_tokens - 1}
    for field, bound in bounds.items():
        if field in props:
            _narrow(props[field], bound)
    for field in ("layers", "heads"):        # an empty list is refused ("leave it out for all")
        for node in [props.get(field, {}), *props.get(field, {}).get("anyOf", [])]:
            if node.get("type") == "array":
                node["minItems"] = max(node.get("minItems", 1), 1)
    if "mask_tokens" in props:
        props["mask_tokens"]["maxItems"] = max_mask_tokens
    if "interventions" in props:             # inline, to bound its [layer, head] pairs by this model
        inline = copy.deepcopy(schemas["Interventions"])
        _bound_pairs(inline["properties"], m)
        props["interventions"] = {"anyOf": [inline, {"type": "null"}], "default": None,
                                  "description": props["interventions"].get("description", "")}
    _bound_pairs(props, m)
    if "max_new_tokens" in props:
        props["max_new_tokens"]["maximum"] = top = max(1, min(max_new_tokens, m.max_tokens - 1))
        props["max_new_tokens"]["default"] = min(props["max_new_tokens"].get("default", top), top)
    if "chat" in props and not m.chat:
        props["chat"] = {"type": "boolean", "const": False, "default": False,
                         "description": f"{m.id}'s files have no chat template: leave it out"}
    if "text_pair" in props and not m.pair:
        props["text_pair"] = {"type": "null", "description": f"{m.id} takes a single text: leave it out"}
    if "include" in props and not m.predictions:     # attribution reads next-token logits: an LM head's
        items = props["include"].get("items", {})
        if "enum" in items:
            items["enum"] = [part for part in items["enum"] if part != "attribution"]
    if m.kind != "encoder-decoder":          # the decoder's text and which attention: encoder-decoders only
        for field in ("decoder_text", "attention"):
            if field in props:
                props[field] = {"type": "null", "description": f"encoder-decoders only; {m.id} is "
                                f"{'an' if m.kind == 'encoder' else 'a'} {m.kind}: leave it out"}
    return variant


def _bound_pairs(props: dict, m: ModelInfo) -> None:
    """[layer, head] pairs (`ablate`'s, `senders`', `receivers'`, `head_lens`): each number bounded by its own axis."""
    pairs = [props["ablate"]["items"]] if "ablate" in props else []
    pairs += [node["items"] for field in ("senders", "receivers") for node in props.get(field, {}).get("anyOf", [])
              if node.get("type") == "array"]
    pairs += [node for node in props.get("head_lens", {}).get("anyOf", []) if node.get("type") == "array"]
    for pair in pairs:
        index = pair.pop("items")
        pair["prefixItems"] = [index | {"maximum": m.layers - 1}, index | {"maximum": m.heads - 1}]


def _example(generic: dict, m: ModelInfo) -> dict:
    """A request that this model takes: a text (and a head), or a patching or knockout example's texts."""
    props = generic["properties"]
    if "query" in props:
        return {"model": m.id, "text": EXAMPLE_TEXT, "layer": 0, "head": 0, "query": 1, "key": 0}
    if "text" not in props and "clean" not in props:
        return {"model": m.id}
    if "text" in props and "queries" not in props:
        return {"model": m.id, "text": EXAMPLE_TEXT} | ({"layer": 0, "head": 0} if "layer" in props else {})
    if "queries" in props:
        return {"model": m.id, "text": EXAMPLE_TEXT, "queries": [1], "keys": [0]}
    return {"model": m.id, "clean": "The cat sat on the mat", "corrupt": "The dog sat on the mat", "target": "."}


def _narrow(node: dict, bound: int) -> None:
    if "maximum" in node:
        node["maximum"] = bound
    for child in [node.get("items"), *node.get("anyOf", [])]:
        if isinstance(child, dict):
            _narrow(child, bound)


STREAMED = (GeneratedToken, GenerateDone)   # the lines of /api/generate's stream: no response_model names them


def _stream_schemas(openapi: dict) -> None:
    """The streamed lines' schemas among the components, where the stream's description points."""
    from pydantic.json_schema import models_json_schema

    _, defs = models_json_schema([(m, "serialization") for m in STREAMED],
                                 ref_template="#/components/schemas/{model}")
    openapi.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
