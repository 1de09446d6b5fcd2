"""POST /api/lens: the logit lens. Every row is the stream after the embeddings or after a block, through the final
norm and the unembedding (the last row is the model's own prediction). With `head_lens` [layer, head]: that head's
output at each position through the final norm (its scale frozen at the run's value) and the unembedding, its direct
effect on the logits, as the tokens it promotes and suppresses most (analysis/lens.py). Two cached runs: the text's
trace (shared with QK attribution) and the lens of it."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Annotated, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.lens import HeadLens as HeadLensResult, Lens, head_lens, logit_lens
from ..runtime.interventions import Trace
from . import checks
from .answers import Answer, ModelId, Pairs, Position, ToolText, number
from .base import Analysis, Computed, Context, Method, Plan, Tool, etag_of, fields, hash_of
from .errors import Refused
from .runs import Run, Runner
from .schemas import _bounded, EXAMPLE_TEXT, Index, Matrix, QK_TEXT, Strict, Text


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


@dataclass(frozen=True)
class Lensed:
    """The logit lens of a traced text, and one head's when asked (analysis/lens.py)."""
    tokens: list[str]
    lens: Lens
    head: HeadLensResult | None
    seconds: float


@dataclass(frozen=True, kw_only=True)
class LensPlan(Plan):
    """The logit lens (and one head's) of the text's traced run: two cached runs, the trace and the lens of it."""
    run: Run                                  # the trace
    lens_key: str
    lens: Callable[[Trace], Lensed]

    async def compute(self, runner: Runner) -> Computed:
        trace, _ = await runner.result(self.run)
        result, hit = await runner.result(Run(self.lens_key, functools.partial(self.lens, trace)))
        return Computed(result, hit, {})

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def plan(ctx: Context, req: LensRequest, binary: bool) -> LensPlan:
    rt, enc = checks.text(ctx, req, "the logit lens (/api/lens)")
    if not rt.cfg.has_unembedding:
        with_one = [m for m, r in ctx.runtimes.items() if r.cfg.has_unembedding]
        raise Refused(f"the logit lens reads tokens out of the residual stream, and model {rt.spec.id!r} has no "
                      f"unembedding (no LM head); models with one: {', '.join(with_one) or 'none served'}")
    if req.head_lens is not None:
        checks.decomposable(rt, "the head lens", direct=True)
        checks.select("layers", req.head_lens[:1], rt.cfg.n_layers)
        checks.select("heads", req.head_lens[1:], rt.cfg.n_heads)
    run = checks.traced(ctx, rt, enc, "the logit lens")
    caps = rt.capabilities                    # what else its record refuses (tiny-gpt: it predicts no next token)
    if not caps.allows("lens"):
        raise Refused(f"the logit lens reads next-token predictions out of the residual stream, and model "
                      f"{rt.spec.id!r} makes none: {caps.short.get('lens') or caps.reasons.get('lens')}")
    k, L, T = req.top, rt.cfg.n_layers, len(enc.ids)

    def call(trace: Trace) -> Lensed:
        t0 = time.perf_counter()
        residual = trace.sites["residual"]
        lens = logit_lens(rt.model, residual, enc.ids, k)
        head = None if req.head_lens is None else head_lens(rt.model, trace.sites["head_output"][tuple(req.head_lens)],
                                                            residual[-1], *req.head_lens, k)
        return Lensed(enc.tokens, lens, head, time.perf_counter() - t0)
    per = 4 if binary else 30                                         # a token's id, string and probability
    return LensPlan(request=req, runtime=rt, encoding=enc, key=run.key, etag=etag_of(run.key, req, binary),
                    binary=binary, size=(L + 3) * T * (k * per + 12) + 100 * T, run=run,
                    lens_key=hash_of(["lens", run.key, k, req.head_lens]), lens=call)


def payload(plan, computed) -> dict:
    """The logit lens (Lensed): the stream after the embeddings and after each block, and one head's."""
    r, rt, enc = computed.result, plan.runtime, plan.encoding
    L = rt.cfg.n_layers
    strings = np.vectorize(rt.token_string, otypes=[object])
    out = {"model": plan.request.model, "tokens": enc.tokens, "token_ids": enc.ids,
           "rows": ["embed"] + [f"L{l}" for l in range(L)],
           "hooks": ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.hook_resid_post" for l in range(L)],
           "top_ids": r.lens.top_ids.tolist(), "top_tokens": strings(r.lens.top_ids).tolist(),
           "top_probs": r.lens.top_probs, "next_probs": r.lens.next_probs, "head_lens": None}
    if r.head is not None:
        hl = r.head
        out["head_lens"] = {"layer": hl.layer, "head": hl.head,
                            "promoted_ids": hl.promoted_ids.tolist(), "promoted_tokens": strings(hl.promoted_ids).tolist(),
                            "promoted_logits": hl.promoted_logits.astype(np.float32),
                            "suppressed_ids": hl.suppressed_ids.tolist(),
                            "suppressed_tokens": strings(hl.suppressed_ids).tolist(),
                            "suppressed_logits": hl.suppressed_logits.astype(np.float32)}
    return out


class LogitLens(Answer):
    """POST /api/lens: each row (the stream after the embeddings, after each block) as next-token predictions:
    top_probs [row, position, rank], next_probs [row, position]."""
    VIEW = ("lens", "json")   # a notebook's view draws it (python/jupyter.py)
    DIMS = {"top_probs": ("row", "position", "rank"), "next_probs": ("row", "position")}

    def coords(self):
        out = super().coords()
        out["row"] = list(self.data["rows"])
        out["rank"] = list(range(np.shape(self.data["top_probs"])[-1]))
        return out

    def figure(self):
        import plotly.graph_objects as go

        p = np.asarray(self.data["top_probs"])[..., 0]
        text = [[t[0] for t in row] for row in self.data["top_tokens"]]
        fig = go.Figure(go.Heatmap(z=p, x=[f"{t} #{i}" for i, t in enumerate(self.data["tokens"])],
                                   y=self.data["rows"], text=text, texttemplate="%{text}", colorscale="Cividis",
                                   zmin=0, zmax=1))
        fig.update_layout(title=f"{self.data['model']} · logit lens: top token after each block", template="none",
                          yaxis={"autorange": "reversed"})
        return fig

    def summary(self) -> str:
        return f"{len(self.data['rows'])} rows x {len(self.data['tokens'])} positions"


def body(text: str, *, top: int | None = None, head_lens: tuple[int, int] | None = None) -> dict:
    """POST /api/lens: the logit lens (the stream after each block as next-token predictions) and, with
    head_lens (layer, head), that head's promoted and suppressed tokens."""
    return fields(text=text, top=top, head_lens=None if head_lens is None else list(head_lens))


def tool(api, text: ToolText, position: Position | None = None, head_lens: Pairs = None, model: ModelId = None,
         top: Annotated[int, Field(ge=1, le=10)] = 3) -> dict:
    if head_lens and len(head_lens) > 1:
        raise ValueError(f"head_lens takes one [layer, head] pair; got {len(head_lens)}: ask for each head in a call "
                         f"of its own")
    a = api.lens(text, top=top, head_lens=None if not head_lens else head_lens[0], model=model)
    i = len(a.tokens) - 1 if position is None else position
    if not 0 <= i < len(a.tokens):
        raise ValueError(f"position {i} is out of range: the text has {len(a.tokens)} tokens")
    probs = np.asarray(a["top_probs"])
    out = {"model": a.model, "position": i, "token": a.tokens[i],
           "rows": [{"row": r, "top": [{"token": t, "prob": number(p)} for t, p in zip(a.top_tokens[n][i],
                                                                                      probs[n, i])]}
                    for n, r in enumerate(a.rows)]}
    if a.data.get("head_lens"):
        h = a["head_lens"]
        out["head_lens"] = {"layer": h["layer"], "head": h["head"], "promoted": list(h["promoted_tokens"][i]),
                            "suppressed": list(h["suppressed_tokens"][i])}
    return out


ANALYSIS = Analysis(
    name="lens", tag="circuits", summary="Logit lens: the residual stream after each block read as next-token "
    "predictions; a head's promoted and suppressed tokens", description=__doc__.split("\n", 1)[0][
        len("POST /api/lens: the logit lens. "):] + " " + __doc__.split("\n", 1)[1].replace("\n", " ").strip(),
    request=LensRequest, response=LensResponse, plan=plan, needs=("unembedding", "an unembedding"),
    example={"text": EXAMPLE_TEXT}, methods=(Method("lens", body, LogitLens),),
    tools=(Tool("lens", "Logit lens: the residual stream after each block read as next-token predictions, at one "
                "position (default: the last); optionally one head's promoted tokens there.", tool),),
    page=("model", "text", "top", "precision", "head_lens"))
