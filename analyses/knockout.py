"""POST /api/knockout: attention knockout (Geva et al. 2023). In layers `layers` every head's `queries` stop reading
`keys` (each such row's other weights renormalised by the softmax: an edit of the masked scores, model/interventions.py
knockout); the answer is the next-token prediction before and after, and each token's log-prob change."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.effects import effect
from ..runtime.encdec import Attention, EncoderDecoderRuntime
from ..runtime.patching import knock_out
from . import checks, encoder_decoder
from .answers import Answer, ModelId, ToolText, number
from .base import Analysis, Computed, Context, Method, OneRunPlan, Tool, etag_of, fields, hash_of
from .errors import Refused
from .runs import Run
from .schemas import _bounded, Effect, EXAMPLE_TEXT, Index, MAX_INDEX, Strict, Text


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
    heads: list[Index] | None = Field(None, min_length=1, max_length=MAX_INDEX + 1, description="the heads knocked "
                                      "out (0-based); every head when omitted")
    decoder_text: Text | None = Field(None, description="encoder-decoders only: the decoder's text (`text` is the "
                                      "source); the prediction is the decoder's next token")
    attention: Attention | None = Field(
        None, description="encoder-decoders only: whose queries stop reading keys: cross (the default: decoder "
        "positions stop reading source positions), decoder or encoder (a stack's self-attention)")
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
    heads: list[int] | None = Field(None, description="the heads knocked out; every head when null")
    attention: Attention | None = Field(None, description="an encoder-decoder's: whose "
                                                                       "queries stopped reading keys")
    effect: Effect = Field(description="the prediction before and after (`next_tokens_after`)")
    timing_ms: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class KnockoutPlan(OneRunPlan):
    """One run with queries blocked from keys in a range of layers, and the intact one."""

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def plan(ctx: Context, req: KnockoutRequest, binary: bool) -> KnockoutPlan:
    rt = checks.runtime(ctx, req.model)
    if isinstance(rt, EncoderDecoderRuntime):
        return KnockoutPlan(**encoder_decoder.knockout(ctx, req, rt, binary))
    checks.only_encoder_decoders(req, rt, "decoder_text", "attention")
    rt, enc = checks.text(ctx, req)
    checks.lm(ctx, rt, "knockout")
    checks.capable(rt, "stacked", "attention knockout (/api/knockout)")
    T, L = len(enc.ids), rt.cfg.n_layers
    checks.patching_tokens(ctx, T, "knockout")
    for name in ("queries", "keys"):
        bad = [j for j in getattr(req, name) if j >= T]
        if bad:
            raise Refused(f"{name} {bad[:5]} out of range: this text has {T} tokens (0..{T - 1})")
    first, last = req.layers or (0, L - 1)
    if not first <= last < L:
        raise Refused(f"layers [{first}, {last}] must be [first, last] with first <= last <= {L - 1}")
    queries, keys = sorted(set(req.queries)), sorted(set(req.keys))
    mask = rt.build_mask([T], rt.cfg.causal)[0, 0] > -1.0
    left = [q for q in queries if not np.any(mask[q] & ~np.isin(np.arange(T), keys))]
    if left:
        raise Refused(f"queries {left[:5]} would read no key at all: every key they see is knocked out; keep "
                      f"at least one (a causal query {left[0]} sees keys 0..{left[0]})")
    heads = None if req.heads is None else checks.select("heads", req.heads, rt.cfg.n_heads)
    key = hash_of(["knockout", req.model, rt.key, req.text, queries, keys, first, last, heads])

    def call():
        return knock_out(rt, enc, queries, keys, (first, last), heads=heads)
    return KnockoutPlan(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary),
                        binary=binary, size=2000 + 40 * T, run=Run(key, call))


def payload(plan, computed) -> dict:
    """Attention knockout's effect on the prediction (runtime/patching.py Knockout)."""
    r, req = computed.result, plan.request
    encdec = isinstance(plan.runtime, EncoderDecoderRuntime)
    return {"model": req.model, "tokens": r.tokens, "queries": sorted(set(req.queries)), "keys": sorted(set(req.keys)),
            "layers": list(r.layers), "heads": None if req.heads is None else sorted(set(req.heads)),
            "attention": (req.attention or "cross") if encdec else None, "effect": effect(r.after, r.before) | {
                "next_tokens_after": [t._asdict() for t in r.after.next_tokens]}}


class Knockout(Answer):
    """POST /api/knockout: the prediction before and after, and each token's log-prob change [position]."""

    def arrays(self):
        change = self.data["effect"].get("token_logprob_change")
        if change is None:
            return {}
        return {"token_logprob_change": (("position",), np.array([np.nan if v is None else v for v in change]))}

    def coords(self):
        return {"position": list(range(len(self.data["tokens"])))}

    def to_pandas(self):
        """The next tokens before and after, side by side (rank, token, prob)."""
        import pandas as pd

        e = self.data["effect"]
        rows = [{"rank": i, "when": when, **t} for when in ("before", "after")
                for i, t in enumerate(e[f"next_tokens_{when}"])]
        return pd.DataFrame(rows)

    def figure(self):
        import plotly.graph_objects as go

        e = self.data["effect"]
        fig = go.Figure([go.Bar(name=when, x=[t["token"] for t in e[f"next_tokens_{when}"]],
                                y=[t["prob"] for t in e[f"next_tokens_{when}"]]) for when in ("before", "after")])
        fig.update_layout(title=f"{self.data['model']} · knockout: next token before and after (KL {e['kl']:.4g})",
                          template="none", yaxis={"title": "probability"})
        return fig

    def summary(self) -> str:
        e = self.data["effect"]
        return (f"queries {self.data['queries']} stop reading keys {self.data['keys']} in layers {self.data['layers']}:"
                f" KL {e['kl']:.4g}, top after {e['next_tokens_after'][0]['token']!r}")


def body(text: str, queries: list[int], keys: list[int], *, layers: tuple[int, int] | None = None,
         heads: list[int] | None = None, decoder_text: str | None = None, attention: str | None = None) -> dict:
    """POST /api/knockout: `queries` stop reading `keys` in layers [first, last] (every head, or `heads`); the
    prediction before/after. An encoder-decoder's: `text` the source, `decoder_text`, and `attention` (cross, the
    default: decoder positions stop reading source positions; decoder; encoder)."""
    return fields(text=text, queries=list(queries), keys=list(keys), layers=None if layers is None else list(layers),
                  heads=None if heads is None else list(heads), decoder_text=decoder_text, attention=attention)


def tool(api, text: ToolText, queries: list[int], keys: list[int], layers: tuple[int, int] | None = None,
         model: ModelId = None, top: Annotated[int, Field(ge=1, le=10)] = 5) -> dict:
    a = api.knockout(text, queries, keys, layers=layers, model=model)
    e = a.effect
    pick = lambda ts: [{"token": t["token"], "prob": number(t["prob"])} for t in ts[:top]]   # noqa: E731
    return {"model": a.model, "layers": a.layers, "kl": number(e["kl"]), "before": pick(e["next_tokens_before"]),
            "after": pick(e["next_tokens_after"]), "mean_logprob_change": number(e.get("mean_logprob_change"))}


ANALYSIS = Analysis(
    name="knockout", tag="interventions", summary="Attention knockout: queries stop reading keys in a range of "
    "layers; the prediction's change", description="In layers `layers` every head's `queries` stop reading `keys` "
    "(each such row's other weights renormalised by the softmax); the answer is the next-token prediction before and "
    "after, and each token's log-prob change.", request=KnockoutRequest, response=KnockoutResponse, plan=plan,
    needs=("predictions", "an LM head"), example={"text": EXAMPLE_TEXT, "queries": [1], "keys": [0]},
    methods=(Method("knockout", body, Knockout),),
    tools=(Tool("knockout", "Attention knockout: chosen query positions stop reading chosen key positions in a "
                "range of layers; the next-token prediction before and after.", tool),),
    page=("model", "text", "queries", "keys", "layers", "precision"))
