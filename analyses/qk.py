"""POST /api/qk: QK attribution. Head `head` of `layer`'s scaled score at (`query`, `key`), the `scaled` step of
/api/stages, as a table of contributions: each part of the residual stream on the query side (the token embedding,
each earlier head's output, each earlier MLP's output, the constant terms) with each part on the key side. The block's
norm is linear once its scale is frozen at the run's value, and RoPE rotates each part at its own position, so the
table sums to the score exactly (analysis/qk.py). One traced run of the text serves every head and cell of it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.qk import qk_attribution
from ..model.functional import score_scale, softmax
from . import checks
from .answers import Answer, Head, Layer, ModelId, Position, ToolText, number
from .base import Analysis, Computed, Context, Method, OneRunPlan, Tool, etag_of, fields
from .schemas import _bounded, Index, JsonBool, Matrix, QK_TEXT, Strict, Text
from .errors import Refused




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


@dataclass(frozen=True, kw_only=True)
class QKPlan(OneRunPlan):
    """One head's scaled score at one cell split into the stream's components (analysis/qk.py), from the text's
    traced run: the run is shared by every head and cell of the text (and by the lens); the split is the payload's."""

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def plan(ctx: Context, req: QKRequest, binary: bool) -> QKPlan:
    rt, enc = checks.text(ctx, req, "QK attribution (/api/qk)")
    checks.select("layers", [req.layer], rt.cfg.n_layers)
    checks.select("heads", [req.head], rt.cfg.n_heads)
    checks.decomposable(rt, "QK attribution", qk=True, scores=True, direct=True)
    T = len(enc.ids)
    for name in ("query", "key"):
        if getattr(req, name) >= T:
            raise Refused(f"{name} {getattr(req, name)} is out of range: this text has {T} tokens (0..{T - 1})")
    run = checks.traced(ctx, rt, enc, "QK attribution")
    C = 3 + req.layer * (rt.cfg.n_heads + 1)                          # the components
    size = 200 * (C + req.top) + (C * C * (4 if binary else 12) if req.table else 0) + 40 * T
    return QKPlan(request=req, runtime=rt, encoding=enc, key=run.key, etag=etag_of(run.key, req, binary),
                  binary=binary, size=size, run=run)


def payload(plan, computed) -> dict:
    """QK attribution of one cell (analysis/qk.py), from the text's traced run (runtime/interventions.py Trace)."""
    trace, req, rt = computed.result, plan.request, plan.runtime
    l, h, i, j = req.layer, req.head, req.query, req.key
    enc, s = plan.encoding, trace.sites
    a = qk_attribution(rt.model, enc.ids, enc.type_ids, s["residual"], s["head_output"], l, h, i, j)
    t = a.table
    scale = float(score_scale(rt.model.blocks[l].attn))
    scaled = (s["query"][l, h, i] @ s["key"][l, h].T).astype(np.float64) * scale             # [T]: the run's own
    p = softmax(scaled + trace.mask[0, 0, i])                                                     # [T] its row
    order = np.argsort(-np.abs(t), axis=None, kind="stable")[:req.top]
    top = [{"query": int(q), "key": int(k), "value": float(t[q, k])} for q, k in zip(*np.unravel_index(order, t.shape))]
    mass = np.abs(t).sum()
    return {"model": req.model, "tokens": enc.tokens, "layer": l, "head": h, "query": i, "key": j,
            "kv_head": a.kv_head, "score": a.score, "scaled": float(scaled[j]),
            "visible": bool(trace.mask[0, 0, i, j] > -1.0), "probability": float(p[j]),
            "components": [vars(c) for c in a.components], "query_sums": t.sum(axis=1), "key_sums": t.sum(axis=0),
            "top": top, "explained": float(sum(abs(x["value"]) for x in top) / mass) if mass else 1.0,
            "table": t if req.table else None}


class QK(Answer):
    """POST /api/qk: one head's score at one cell, split into query-side x key-side components."""

    def coords(self):
        return {"component": [c["name"] for c in self.data["components"]],
                "query_component": [c["name"] for c in self.data["components"]],
                "key_component": [c["name"] for c in self.data["components"]]}

    def arrays(self):
        out = {"query_sums": (("query_component",), np.asarray(self.data["query_sums"], np.float64)),
               "key_sums": (("key_component",), np.asarray(self.data["key_sums"], np.float64))}
        if self.data.get("table") is not None:
            out["table"] = (("query_component", "key_component"), np.asarray(self.data["table"], np.float64))
        return out

    def to_pandas(self):
        """The top pairs: query component, key component, contribution."""
        import pandas as pd

        names = [c["name"] for c in self.data["components"]]
        return pd.DataFrame([{"query_component": names[t["query"]], "key_component": names[t["key"]],
                              "value": t["value"]} for t in self.data["top"]])

    def figure(self):
        import plotly.graph_objects as go

        df = self.to_pandas()
        fig = go.Figure(go.Bar(x=df["value"], y=df["query_component"] + " · " + df["key_component"], orientation="h"))
        fig.update_layout(title=f"{self.data['model']} · L{self.data['layer']}H{self.data['head']} score at "
                          f"({self.data['query']}, {self.data['key']}) = {self.data['scaled']:.4f}: top pairs",
                          template="none", yaxis={"autorange": "reversed"})
        return fig

    def summary(self) -> str:
        names = [c["name"] for c in self.data["components"]]
        top = self.data["top"][0] if self.data["top"] else None
        return (f"L{self.data['layer']}H{self.data['head']} ({self.data['query']}, {self.data['key']}): score "
                f"{self.data['score']:.4f}, p {self.data['probability']:.4f}" +
                (f"; top {names[top['query']]} · {names[top['key']]} {top['value']:+.4f}" if top else ""))


def body(text: str, layer: int, head: int, query: int, key: int, *, top: int | None = None,
         table: bool | None = None) -> dict:
    """POST /api/qk: one head's score at (query, key) split into query-side x key-side stream components."""
    return fields(text=text, layer=layer, head=head, query=query, key=key, top=top, table=table)


def tool(api, text: ToolText, layer: Layer, head: Head, query: Position, key: Position, model: ModelId = None,
         top: Annotated[int, Field(ge=1, le=100, description="how many of the largest entries to list")] = 8) -> dict:
    a = api.qk(text, layer, head, query, key, top=top, model=model)
    names = [c["name"] for c in a.components]
    return {"model": a.model, "layer": layer, "head": head, "query": query, "key": key,
            "query_token": a.tokens[query], "key_token": a.tokens[key], "score": number(a.score),
            "scaled": number(a.scaled), "probability": number(a.probability), "explained": number(a.explained),
            "top": [{"query_component": names[t["query"]], "key_component": names[t["key"]],
                     "value": number(t["value"])} for t in a.top]}


ANALYSIS = Analysis(
    name="qk", tag="circuits", summary="QK attribution: why a head attends to a key, split into query-side x "
    "key-side components", description=__doc__.split("\n", 1)[0][len("POST /api/qk: "):] + " " +
    __doc__.split("\n", 1)[1].replace("\n", " ").strip(), request=QKRequest, response=QKResponse, plan=plan,
    example={"text": QK_TEXT, "layer": 0, "head": 0, "query": 1, "key": 0}, methods=(Method("qk", body, QK),),
    tools=(Tool("qk", "QK attribution: why one head attends from a query position to a key position: its score "
                "split into query-side x key-side components (embeddings, earlier heads, MLPs); the top pairs.",
                tool),),
    page=("model", "text", "layer", "head", "query", "key", "top", "table", "precision"))
