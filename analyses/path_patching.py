"""POST /api/path_patching: Wang et al. 2023's path patching. The clean run with the senders' outputs taken from the
corrupt run and every other head frozen at its clean output; the receivers' `receiver_input` read there is put into
the clean run (or, without receivers, that run's logits read), and the metric at the last position reported with its
recovery. Without `senders`, each head alone: a [layer][head] map (runtime/patching.py path_patch)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..model.interventions import HOOKS
from ..runtime.patching import path_patch
from .answers import TOP, ModelId, Pairs, Top, ToolText
from .base import Analysis, Computed, Context, Method, Tool, etag_of, fields, hash_of
from .errors import Refused
from .patching import Patching, PatchingPlan, patched, price, two_texts
from .payloads import token
from .runs import Run
from .schemas import _bounded, Index, IOI_CLEAN, IOI_CORRUPT, Matrix, Token, TwoTexts


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


@dataclass(frozen=True, kw_only=True)
class PathPatchingPlan(PatchingPlan):
    """Path patching from senders to receivers (runtime/patching.py path_patch)."""

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def plan(ctx: Context, req: PathPatchingRequest, binary: bool) -> PatchingPlan:
    rt, clean, corrupt, metric = two_texts(ctx, req, "path patching (/api/path_patching)")
    T, L, H = len(clean.ids), rt.cfg.n_layers, rt.cfg.n_heads
    pairs = {}
    for name in ("senders", "receivers"):
        asked = getattr(req, name)
        bad = [pair for pair in asked or () if pair[0] >= L or pair[1] >= H]
        if bad:
            raise Refused(f"{name} {bad[:5]} out of range: this model has layers 0..{L - 1} and heads 0..{H - 1}")
        pairs[name] = None if asked is None else tuple(sorted({(l, h) for l, h in asked}))
    rows = L * H if pairs["senders"] is None else 1
    price(ctx, rt, max(rows, L), T, passes=2 if pairs["receivers"] else 1,
                        fix="name the senders (one run, not one per head), or shorten the texts")
    key = hash_of(["path_patching", req.model, rt.key, req.clean, req.corrupt, metric.target, metric.distractor,
                 pairs["senders"], pairs["receivers"], req.receiver_input if pairs["receivers"] else None])

    def call():
        return path_patch(rt, clean, corrupt, metric, senders=pairs["senders"], receivers=pairs["receivers"],
                          receiver_input=req.receiver_input)
    return PathPatchingPlan(request=req, runtime=rt, encoding=clean, key=key, etag=etag_of(key, req, binary),
                            binary=binary, size=24 * rows + 200 * T + 20 * len(req.senders or ()) + 20 * len(
                                req.receivers or ()), run=Run(key, call), corrupt=corrupt, metric=metric)


def payload(plan, computed) -> dict:
    """Path patching (runtime/patching.py PathPatching)."""
    r, rt = computed.result, plan.runtime
    pairs = {name: None if v is None else [list(p) for p in v] for name, v in
             (("senders", r.senders), ("receivers", r.receivers))}
    return {"model": plan.request.model, **pairs, "receiver_input": r.receiver_input,
            "hooks": {"senders": HOOKS["head_output"],
                      "receivers": HOOKS[r.receiver_input] if r.receivers else "logits"},
            "metric": r.metric.name, "target": token(rt, r.metric.target),
            "distractor": token(rt, r.metric.distractor), "clean_tokens": plan.encoding.tokens,
            "corrupt_tokens": plan.corrupt.tokens, "clean": r.clean, "corrupt": r.corrupt, "patched": r.patched,
            "recovery": r.recovery}


class PathPatching(Patching):
    """POST /api/path_patching: with senders, one patched metric (and recovery); without, each head alone as the
    sender: [layer, head]."""
    VIEW = ("path_patching", "json")   # a notebook's view draws it (python/jupyter.py)

    def _dims(self):
        return ("layer", "head") if np.ndim(self.data["patched"]) == 2 else ()

    def figure(self):
        if np.ndim(self.data["patched"]) == 2:
            return super().figure()
        import plotly.graph_objects as go

        fig = go.Figure(go.Bar(x=["clean", "patched", "corrupt"], y=[self.data["clean"], self.data["patched"],
                                                                      self.data["corrupt"]]))
        fig.update_layout(title=f"{self.data['model']} · path patching from {self.data['senders']}", template="none",
                          yaxis={"title": self.data["metric"]})
        return fig

    def summary(self) -> str:
        if np.ndim(self.data["patched"]) == 2:
            return super().summary()
        return (f"{self.data['metric']}: clean {self.data['clean']:.4f}, corrupt {self.data['corrupt']:.4f}, "
                f"patched {self.data['patched']:.4f}")


def body(clean: str, corrupt: str, target: str, distractor: str | None = None, *,
         senders: list[tuple[int, int]] | None = None, receivers: list[tuple[int, int]] | None = None,
         receiver_input: str | None = None) -> dict:
    """POST /api/path_patching (Wang et al. 2023): senders' corrupt outputs along direct paths into receivers'
    query, key or value (or the logits), every other head frozen; senders None: each head alone, a map."""
    return fields(clean=clean, corrupt=corrupt, target=target, distractor=distractor,
                  senders=None if senders is None else [list(p) for p in senders],
                  receivers=None if receivers is None else [list(p) for p in receivers], receiver_input=receiver_input)


def tool(api, clean: ToolText, corrupt: ToolText, target: str, distractor: str | None = None, senders: Pairs = None,
         receivers: Pairs = None, receiver_input: Literal["query", "key", "value"] = "query", model: ModelId = None,
         top: Top = TOP) -> dict:
    a = api.path_patching(clean, corrupt, target, distractor, senders=senders, receivers=receivers,
                          receiver_input=receiver_input, model=model)
    return patched(a, top)


ANALYSIS = Analysis(
    name="path_patching", tag="interventions", summary="Path patching: sender heads' corrupt outputs along their "
    "direct paths into receivers' inputs", description=__doc__.split("\n", 1)[1].replace("\n", " ").strip(),
    request=PathPatchingRequest, response=PathPatchingResponse, plan=plan, needs=("predictions", "an LM head"),
    example={"clean": "The cat sat on the mat", "corrupt": "The dog sat on the mat", "target": "."},
    methods=(Method("path_patching", body, PathPatching),),
    tools=(Tool("path_patching", "Path patching (Wang et al. 2023): sender heads' corrupt outputs reach receiver "
                "heads' query, key or value (or the logits, without receivers) along direct paths only, every other "
                "head frozen. Without senders, each head alone: the senders that matter most.", tool),),
    page=("model", "clean", "corrupt", "target", "distractor", "receivers", "receiver_input", "precision"))
