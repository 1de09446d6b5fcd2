"""POST /api/importance: rank heads by importance, each head's single-head ablation effect on one text. One run of the
text keeps every layer's values; each head's ablated run then starts at its own layer, `batch` heads at once along
the batch axis (runtime/interventions.py head_importance); its progress is the runs done of all."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from ..runtime.interventions import head_importance
from . import checks
from .answers import TOP, Answer, ModelId, Top, ToolText, heads_map, number, top_heads, top_of
from .base import Analysis, Computed, Context, ManyRunsPlan, Method, Tool, etag_of, fields, hash_of
from .errors import Refused
from .runs import Run
from .schemas import _bounded, EXAMPLE_TEXT, Strict, Text


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


@dataclass(frozen=True)
class Importance:
    """Every head's single-head ablation effect on one text (runtime.interventions.head_importance)."""
    tokens: list[str]
    values: np.ndarray     # [L, H]
    baseline: float
    seconds: float
    lm: bool               # measured on log-probs (an LM head) or on the embedding


@dataclass(frozen=True, kw_only=True)
class ImportancePlan(ManyRunsPlan):
    """Every head's single-head ablation, batched along the batch axis."""

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def plan(ctx: Context, req: ImportanceRequest, binary: bool) -> ImportancePlan:
    rt, enc = checks.text(ctx, req, "head importance (/api/importance)")
    checks.capable(rt, "importance", "head importance over every head (/api/importance)")
    T = len(enc.ids)
    checks.patching_tokens(ctx, T, "importance")       # its run keeps every layer's values (runtime/interventions.py)
    layer = rt.cfg.n_heads * T * T * 4             # one copy's attention in one layer: what a batch holds at once
    if layer * req.batch > ctx.settings.layerwise_mb * 2**20:
        fits = int(ctx.settings.layerwise_mb * 2**20 // layer)
        fix = f"set batch to {fits} or less" if fits else "shorten the text"
        raise Refused(f"importance runs {req.batch} copies of this {T}-token text a layer at a time: their "
                      f"attention in one layer is {layer * req.batch / 2**20:.1f} MB, over ATTNSCOPE_LAYERWISE_MB "
                      f"({ctx.settings.layerwise_mb} MB); {fix}")
    key = hash_of(["importance", req.model, rt.key, req.text, req.text_pair, req.ablation])

    def call(progress, stopped) -> Importance:
        t0 = time.perf_counter()
        values, baseline = head_importance(rt, enc, ablation=req.ablation, batch=req.batch, progress=progress,
                                           stop=stopped)
        return Importance(enc.tokens, values, baseline, time.perf_counter() - t0, rt.cfg.lm_head)
    return ImportancePlan(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary),
                          binary=binary, size=16 * rt.cfg.n_layers * rt.cfg.n_heads + 100 * T,
                          run=Run(key, call, steps=True))


def payload(plan, computed) -> dict:
    """Every head's single-head ablation effect (Importance)."""
    r = computed.result
    return {"model": plan.request.model, "tokens": r.tokens, "baseline": r.baseline, "importance": r.values,
            "measure": "mean_logprob_change" if r.lm else "embedding_distance"}


class HeadImportance(Answer):
    """POST /api/importance: each head's single-head ablation effect [layer, head] and the intact baseline."""
    DIMS = {"importance": ("layer", "head")}

    def coords(self):
        L, H = np.shape(self.data["importance"])
        return {"layer": list(range(L)), "head": list(range(H))}

    def top_heads(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k heads whose ablation changes the measure most: (layer, head, change)."""
        return top_heads(self.data["importance"], k)

    def figure(self):
        return heads_map(f"{self.data['model']} · {self.data['measure']} with one head knocked out",
                         self.data["importance"], self.data["measure"])

    def summary(self) -> str:
        top = ", ".join(f"L{l}H{h} {v:+.4f}" for l, h, v in self.top_heads(3))
        return f"{self.data['measure']} (baseline {self.data['baseline']:.4f}); top heads {top}"


def body(text: str, *, text_pair: str | None = None, ablation: str | None = None, batch: int | None = None) -> dict:
    """POST /api/importance: every head knocked out alone (zero or mean ablation); the change of the text's mean
    token log-prob (an LM head) or of its sentence embedding, per head."""
    return fields(text=text, text_pair=text_pair, ablation=ablation, batch=batch)


def tool(api, text: ToolText, ablation: Literal["zero", "mean"] = "zero", model: ModelId = None,
         top: Top = TOP) -> dict:
    a = api.importance(text, ablation=ablation, model=model)
    return {"model": a.model, "measure": a.measure, "baseline": number(a.baseline),
            "top_heads": top_of(a.importance, top, "change")}


ANALYSIS = Analysis(
    name="importance", tag="interventions", summary="Rank heads by importance: each head's single-head ablation "
    "effect on one text", description="Knocks out every head in turn (one run of the text keeps every layer's "
    "values; each head's ablated run then starts at its own layer, `batch` heads at once along the batch axis) and "
    "reports what each head alone changes: the text's mean token log-prob for models with an LM head, the sentence "
    "embedding otherwise.", request=ImportanceRequest, response=ImportanceResponse, plan=plan, stream="runs",
    example={"text": EXAMPLE_TEXT}, methods=(Method("importance", body, HeadImportance),),
    tools=(Tool("importance", "Head importance: every head knocked out alone (zero or mean ablation); the heads "
                "whose removal changes the text's mean token log-prob (or its embedding) most.", tool),))
