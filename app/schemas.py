"""The server's own bodies (the OpenAPI at /docs has them): a served model's description and capabilities, the
health check, a corpus job's state, and the error body every refusal has. Each analysis' request and answer models
are in its module (analyses/)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..analyses.schemas import ComputeDtype
from ..analysis.roles import ROLE_TARGETS
from ..analyses.atlas import AtlasOptions


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
    longest_text_tokens: int | None = Field(None, description="the longest text (in tokens, at most max_tokens) one "
                                            "run of its attention fits here, priced against the memory budget and "
                                            "ATTNSCOPE_WORK_TFLOP: a longer text is refused (422) naming this number")
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
    runs_computed: int = Field(0, description="model runs this server has computed since it started (answers from "
                               "the result cache or the kept answers are not counted)")
    kept_hits: int = Field(0, description="long texts' answers sent from the answers kept on disk (ATTNSCOPE_KEPT_MB) "
                           "since start, without running the model")
    jobs_skipped: list[SkippedJob] = Field(default_factory=list, description="job records found at start-up that "
                                           "this server could not read, and why (they are not listed in /api/jobs)")


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
