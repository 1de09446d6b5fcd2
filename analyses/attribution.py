"""Direct logit attribution, served through POST /api/attention (`include: ["attribution"]`, with `target`): each
head's, MLP's and the embeddings' direct share of logit(target) (- logit(distractor)) at one position, from a run that
keeps every layer's head outputs and residual stream (runtime/interventions.py Trace; analysis/attribution.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from ..analysis.attribution import attribution
from ..analysis.effects import Metric
from ..model.functional import softmax
from ..model.transformer import logits
from ..runtime import Encoding, Runtime
from ..runtime.interventions import Interventions, reference_trace
from . import checks
from .answers import TOP, Answer, ModelId, Position, Top, ToolText, heads_map, number, top_heads, top_of
from .base import Context, Method, Tool, fields, hash_of
from .errors import Refused
from .payloads import ranked, token
from .runs import Run
from .schemas import Matrix, RankedToken, Token


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


@dataclass(frozen=True)
class Attributed:
    """Direct logit attribution of one run (analysis/attribution.py), with the model's own logit (difference)."""
    tokens: list[str]
    metric: Metric
    position: int
    parts: object          # attribution.Attribution
    logit: float
    typed: str = ""        # the target as the request gave it
    ranks: dict = field(default_factory=dict)   # id -> (rank, probability) at the position: the target's, and the
    #                                             other spelling's (Vocabulary.respelled) when there is one
    other: int | None = None


def run(ctx: Context, req, rt: Runtime, enc: Encoding) -> Run:
    """Direct logit attribution of `target` (minus `distractor`) at `position`: a run that keeps every layer's
    head outputs and residual stream (runtime/interventions.py Trace)."""
    checks.lm(ctx, rt, "attribution")
    if req.target is None:
        raise Refused("attribution needs `target`: the token whose logit is attributed (as next_tokens shows it)")
    if req.ablate:
        raise Refused("attribution is of the intact model: leave `ablate` out (or `attribution` out of include)")
    checks.decomposable(rt, "direct logit attribution", direct=True, logits=True)
    checks.capable(rt, "stacked", "direct logit attribution")
    T = len(enc.ids)
    checks.patching_tokens(ctx, T, "attribution")
    position = T - 1 if req.position is None else req.position
    if position >= T:
        raise Refused(f"position {position} is out of range: this text has {T} tokens (0..{T - 1})")
    metric = checks.metric(rt, req.target, req.distractor)
    other = rt.vocabulary.respelled(req.target, metric.target)    # "Mary" typed where " Mary" is a token too

    def call() -> Attributed:
        if req.engine == "numpy":       # the NumPy reference, as the request's own run
            trace = reference_trace(rt, enc, causal=req.causal, mask_tokens=req.mask_tokens or None)
        else:
            trace = Interventions(rt).trace(enc, causal=req.causal, mask_tokens=req.mask_tokens or None,
                                            keep=("residual", "head_output"))
        W = rt.model.unembedding                                       # [V, D]: two rows of it are read
        u = W[metric.target].astype(np.float64) - (0 if metric.distractor is None else W[metric.distractor])
        parts = attribution(rt.model, trace.sites["head_output"][:, :, position],
                            trace.sites["residual"][:, position], u)
        p = softmax(logits(rt.model, trace.hidden[position]).astype(np.float64))   # the next-token distribution
        ranks = {i: (int((p > p[i]).sum()) + 1, float(p[i])) for i in (metric.target, other) if i is not None}
        return Attributed(enc.tokens, metric, position, parts, float(trace.hidden[position] @ u), req.target,
                          ranks, other)
    key = hash_of(["attribution", checks.run_key(req, rt, False), metric.target, metric.distractor, position,
                  req.target])
    return Run(key, call)


def payload(rt, a) -> dict:
    """Direct logit attribution (Attributed): every part's share, their sum and the model's own logit; the
    target as typed, the token it became (its rank among the next tokens), and the other spelling it may have meant."""
    p = a.parts
    target = {**ranked(rt, a, a.metric.target), "typed": a.typed,
              "other": None if a.other is None else ranked(rt, a, a.other)}
    return {"target": target, "distractor": token(rt, a.metric.distractor),
            "position": a.position, "metric": "logit" if a.metric.distractor is None else "logit_difference",
            "logit": a.logit, "sum": p.total, "embeddings": p.embeddings, "heads": p.heads, "mlps": p.mlps,
            "attention_bias": p.attention_bias, "norm_bias": p.norm_bias}


class DirectAttribution(Answer):
    """Direct logit attribution: each head's share [layer, head], each MLP's and attention bias' [layer]."""
    VIEW = ("attribution", "binary")   # a notebook's view draws it (python/jupyter.py)

    @property
    def parts(self) -> dict:
        return self.data["attribution"]

    def arrays(self):
        a = self.data["attribution"]
        return {"heads": (("layer", "head"), np.asarray(a["heads"], np.float64)),
                "mlps": (("layer",), np.asarray(a["mlps"], np.float64)),
                "attention_bias": (("layer",), np.asarray(a["attention_bias"], np.float64))}

    def coords(self):
        L, H = np.shape(self.data["attribution"]["heads"])
        return {"layer": list(range(L)), "head": list(range(H))}

    def top_heads(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k heads of largest |share|: (layer, head, share)."""
        return top_heads(self.data["attribution"]["heads"], k)

    def figure(self):
        a = self.data["attribution"]
        what = a["target"]["token"] + (f" − {a['distractor']['token']}" if a.get("distractor") else "")
        return heads_map(f"{self.data['model']} · direct logit attribution of {what}", a["heads"], "logit units")

    def summary(self) -> str:
        a = self.data["attribution"]
        top = ", ".join(f"L{l}H{h} {v:+.3f}" for l, h, v in self.top_heads(3))
        return f"{a['metric']} {a['logit']:.4f} at position {a['position']}; top heads {top}"


def body(text: str, target: str, distractor: str | None = None, *, position: int | None = None) -> dict:
    """Direct logit attribution (POST /api/attention with include ["attribution"]): each head's, MLP's and the
    embeddings' direct share of logit(target) (- logit(distractor)) at `position` (default: the last)."""
    return fields(text=text, include=["attribution"], target=target, distractor=distractor, position=position)


def tool(api, text: ToolText, target: str, distractor: str | None = None, position: Position | None = None,
         model: ModelId = None, top: Top = TOP) -> dict:
    a = api.attribution(text, target, distractor, position=position, model=model)
    p = a.parts
    mlps = np.asarray(p["mlps"], np.float64)
    return {"model": a.model, "metric": p["metric"], "position": p["position"], "logit": number(p["logit"]),
            "target": p["target"]["token"], "distractor": (p.get("distractor") or {}).get("token"),
            "embeddings": number(p["embeddings"]), "heads_total": number(np.sum(p["heads"])),
            "mlps_total": number(mlps.sum()), "top_heads": top_of(p["heads"], top, "share"),
            "top_mlps": [{"layer": int(l), "share": number(mlps[l])} for l in np.argsort(-np.abs(mlps))[:top]]}


METHOD = Method("attribution", body, DirectAttribution)
TOOL = Tool("attribution", "Direct logit attribution: each head's direct share of logit(target) (minus "
            "logit(distractor)) at a position (default: the last); the top heads and MLPs.", tool)
