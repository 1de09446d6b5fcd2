"""POST /api/kv_compare: several key/value-cache policies and budgets on one prompt, side by side: per policy and budget,
the probability of an answer (a given text, or the full cache's greedy continuation), and how far the policy's
next-token distributions are from the full cache's (KL, mean and max over the answer's tokens) and how often their
most probable tokens agree. The answer's tokens are teacher-forced under each policy (runtime/generation.Generator's
`forced`, the full cache run alongside), so every row scores the same tokens; each row is what /api/generate with that
`kv_cache` computes at those tokens. A long prompt runs a while: asked as NDJSON (Accept: application/x-ndjson), the
answer streams its progress (the runs done of all, with the time left) before it, and stops when the client goes away."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, Field

from ..model import kv_policies
from ..runtime.errors import Stopped
from ..runtime.generation import Generator, Sampling
from . import checks
from .answers import Answer, ModelId, ToolText, number
from .base import Analysis, Computed, Context, ManyRunsPlan, Method, Tool, etag_of, fields, hash_of
from .errors import Refused
from .generate import Keys, _odd
from .runs import Run
from .schemas import _bounded, Strict, Text

POLICIES = ("streaming", "h2o", "snapkv")
EXAMPLE = {"text": "The harbour master kept a ledger of every ship. On Monday the Alba came in with salt, on Tuesday "
                   "the Brisa with figs, and on Wednesday the Corvo with nothing at all. The ship with figs was the",
           "answer": " Brisa", "policies": ["streaming", "h2o", "snapkv"], "budgets": [8, 16, 32],
           "snapkv_window": 4}


class CompareRequest(Strict):
    """Policies x budgets on one prompt: each policy at each budget (keys per key/value head)."""
    model: Text = Field("smollm2", description="a model id with an LM head (`predictions`)", examples=["smollm2"])
    text: Text = Field(description="the prompt", examples=[EXAMPLE["text"]], json_schema_extra={"pattern": r"\S"})
    answer: Text | None = Field(None, description="the text whose probability each policy gives, after the prompt "
                                "(its tokens teacher-forced); omitted: the full cache's greedy continuation of "
                                "max_new_tokens tokens", examples=[EXAMPLE["answer"]])
    max_new_tokens: _bounded(1, 64) = Field(8, description="without `answer`: the greedy continuation's length")
    policies: list[Literal["streaming", "h2o", "snapkv"]] = Field(
        list(POLICIES), min_length=1, max_length=3, description="the policies compared, each at every budget")
    budgets: list[Keys] = Field(min_length=1, max_length=8, examples=[[8, 16, 32]], description="keys each key/value "
                                "head keeps: streaming keeps `sinks` and a window of budget - sinks; h2o a recent "
                                "window (`recent`, or budget / 2 as the paper splits it) and heavy hitters; snapkv the "
                                "observation window and budget - window voted prompt keys")
    sinks: _bounded(0, 1_000_000) = Field(4, description="streaming: the first positions, always kept")
    recent: _bounded(0, 1_000_000) | None = Field(None, description="h2o: the recent window; omitted: budget // 2")
    snapkv_window: _bounded(1, 1_000_000) = Field(32, description="snapkv: the observation window (the last prompt "
                                                  "queries, who vote), under every budget")
    kernel: Annotated[_bounded(1, 1001), AfterValidator(_odd)] = Field(
        5, description="snapkv: the pooling's width, odd", json_schema_extra={"not": {"multipleOf": 2}})
    pooling: Literal["avg", "max"] = Field("avg", description="snapkv: avg_pool1d or max_pool1d over the votes")


class PolicyRow(BaseModel):
    """One policy at one budget (the full cache: policy `full`, budget null)."""
    policy: Literal["full", "streaming", "h2o", "snapkv"]
    budget: int | None
    kv_cache: dict = Field(description="the policy as /api/generate's kv_cache takes it")
    answer_probability: float = Field(description="the answer's probability: the product of its tokens'")
    answer_logprob: float
    probabilities: list[float] = Field(description="each answer token's probability under the policy")
    top_tokens: list[str] = Field(description="the policy's most probable token at each answer token's step")
    kl: list[float] = Field(description="KL(full || policy) of each step's next-token distributions, in nats")
    kl_mean: float
    kl_max: float
    top1: list[bool] = Field(description="at each step, the policy's and the full cache's most probable tokens agree")
    top1_agreement: float = Field(description="the share of steps whose most probable tokens agree")
    seconds: float


class CompareResponse(BaseModel):
    model: str
    prompt_tokens: int
    answer_tokens: list[str] = Field(description="the answer's tokens, as scored")
    answer_source: Literal["answer", "greedy"] = Field(description="answer: the request's text; greedy: the full "
                                                       "cache's greedy continuation")
    rows: list[PolicyRow] = Field(description="the full cache first, then each policy at each budget")
    timing_ms: dict[str, float]


@dataclass(frozen=True)
class Compared:
    tokens: list[str]                       # the prompt's
    answer: list[str]
    source: str
    rows: list[dict]
    seconds: float


@dataclass(frozen=True, kw_only=True)
class ComparePlan(ManyRunsPlan):
    def payload(self, computed: Computed) -> dict:
        r = computed.result
        return {"model": self.request.model, "prompt_tokens": len(r.tokens), "answer_tokens": r.answer,
                "answer_source": r.source, "rows": r.rows, "timing_ms": {"model": r.seconds * 1000}}


def grid(req: CompareRequest, cfg) -> list[tuple[str, int, object, dict]]:
    """(policy, budget, its kv_policies rule, its kv_cache) for each policy at each budget, checked (422s)."""
    least = min(req.budgets)
    if "streaming" in req.policies and req.sinks >= least:
        raise Refused(f"sinks ({req.sinks}) must be under every budget (the smallest is {least}): streaming keeps "
                      f"the sinks and a window of budget - sinks")
    if "h2o" in req.policies and req.recent is not None and req.recent > least:
        raise Refused(f"recent ({req.recent}) is over the smallest budget ({least}): the recent window is part of "
                      f"the budget")
    if "snapkv" in req.policies and req.snapkv_window >= least:
        raise Refused(f"snapkv_window ({req.snapkv_window}) must be under every budget (the smallest is {least}): "
                      f"SnapKV keeps the observation window and budget - window voted keys")
    out = []
    for name in dict.fromkeys(req.policies):
        for b in sorted(set(req.budgets)):
            if name == "streaming":
                kv = {"policy": "streaming", "sinks": req.sinks, "window": b - req.sinks}
                rule = kv_policies.Streaming(req.sinks, b - req.sinks)
            elif name == "h2o":
                recent = b // 2 if req.recent is None else req.recent
                kv, rule = {"policy": "h2o", "budget": b, "recent": recent}, kv_policies.H2O(b, recent)
            else:
                kv = {"policy": "snapkv", "budget": b, "window": req.snapkv_window, "kernel": req.kernel,
                      "pooling": req.pooling}
                rule = kv_policies.SnapKV(b, req.snapkv_window, req.kernel, req.pooling)
            out.append((name, b, rule, kv))
    return out


def row(policy: str, budget: int | None, kv: dict, tokens, views, seconds: float) -> dict:
    """A PolicyRow from a forced generation's tokens (Generated) and, under a policy, its CacheViews."""
    p = [t.probability for t in tokens]
    kl = [v.kl for v in views] if views else [0.0] * len(tokens)
    top1 = [bool(v.top1) for v in views] if views else [True] * len(tokens)
    with np.errstate(divide="ignore"):
        logp = float(np.sum(np.log(p)))
    return {"policy": policy, "budget": budget, "kv_cache": kv, "answer_probability": float(np.prod(p)),
            "answer_logprob": logp, "probabilities": p, "top_tokens": [t.candidates[0].token for t in tokens],
            "kl": kl, "kl_mean": float(np.mean(kl)), "kl_max": float(np.max(kl)), "top1": top1,
            "top1_agreement": float(np.mean(top1)), "seconds": seconds}


def compare(rt, ids: list[int], answer: list[int] | None, n: int, runs: list, progress, stopped) -> Compared:
    """The full cache (its greedy continuation first, without an answer), then every policy, each teacher-forced on
    the answer's tokens; progress(runs done, runs) after each, Stopped between them once nobody waits."""
    started, total = time.perf_counter(), len(runs) + 1
    source = "answer" if answer else "greedy"
    full = Generator(rt, ids, Sampling(greedy=True), len(answer) if answer else n, forced=tuple(answer or ()))
    t0 = time.perf_counter()
    tokens = list(full)
    answer = list(full.new_ids)
    rows = [row("full", None, {"policy": "full"}, tokens, None, time.perf_counter() - t0)]
    progress(1, total)
    for i, (name, budget, rule, kv) in enumerate(runs):
        if stopped():
            raise Stopped("nobody waits for this comparison any more")
        t0 = time.perf_counter()
        gen = Generator(rt, ids, Sampling(greedy=True), len(answer), policy=rule, forced=tuple(answer))
        rows.append(row(name, budget, kv, list(gen), gen.views, time.perf_counter() - t0))
        progress(i + 2, total)
    return Compared([rt.token_string(i) for i in ids], [rt.token_string(i) for i in answer], source, rows,
                    time.perf_counter() - started)


def plan(ctx: Context, req: CompareRequest, binary: bool) -> ComparePlan:
    rt = checks.runtime(ctx, req.model, "the cache policies' comparison (/api/kv_compare)")
    checks.lm(ctx, rt, "the cache policies' comparison")
    checks.capable(rt, "stacked", "the cache policies' comparison (/api/kv_compare, whose every step runs the whole "
                   "model)")
    checks.chars(ctx, rt, "text and answer are", req.text, req.answer)
    enc = rt.vocabulary.encode(req.text)
    ids, answer = list(enc.ids), None
    if req.answer is not None:
        whole = rt.vocabulary.encode(req.text + req.answer)
        if whole.ids[:len(ids)] != ids or len(whole.ids) == len(ids):
            raise Refused("the answer changes how the prompt's last tokens are read (tokens merge across the "
                          "boundary): start the answer where a token starts, e.g. with a space")
        answer, enc = list(whole.ids[len(ids):]), whole
    n = len(answer) if answer else req.max_new_tokens
    if n > ctx.settings.max_new_tokens:
        raise Refused(f"the answer is {n} tokens, over the limit of {ctx.settings.max_new_tokens} new tokens "
                      f"(ATTNSCOPE_MAX_NEW_TOKENS)")
    T, room = len(ids), rt.spec.max_tokens
    if enc.truncated or T + n > room:
        raise Refused(f"the prompt is {T} tokens and the answer {n}, past {rt.spec.id}'s {room} (its max_tokens; "
                      f"it has {rt.cfg.max_positions} positions): shorten the prompt or the answer")
    checks.long_text(rt, T)
    cfg, st = rt.cfg, ctx.settings
    cache = 2 * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.d_head * 4 * (T + n)
    if cache > st.layerwise_mb * 2**20:
        raise Refused(f"this comparison's key/value caches would hold {cache / 2**20:.0f} MB ({T} + {n} tokens), over "
                      f"ATTNSCOPE_LAYERWISE_MB ({st.layerwise_mb:g} MB): shorten the prompt")
    runs = grid(req, cfg)
    key = hash_of(["kv_compare", req.model, rt.key, req.model_dump(mode="json")])

    def call(progress, stopped) -> Compared:
        return compare(rt, ids, answer, n, runs, progress, stopped)
    size = (len(runs) + 1) * (400 + 60 * n) + 40 * n
    return ComparePlan(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary),
                       binary=binary, size=size, run=Run(key, call, steps=True))


class KVComparison(Answer):
    """POST /api/kv_compare: per policy and budget, the answer's probability, KL and top-1 agreement."""

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame([{k: r[k] for k in ("policy", "budget", "answer_probability", "kl_mean", "kl_max",
                                                "top1_agreement")} for r in self.data["rows"]])

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure()
        for name in dict.fromkeys(r["policy"] for r in self.data["rows"] if r["budget"] is not None):
            rs = [r for r in self.data["rows"] if r["policy"] == name]
            fig.add_trace(go.Scatter(x=[r["budget"] for r in rs], y=[r["answer_probability"] for r in rs],
                                     mode="lines+markers", name=name))
        full = self.data["rows"][0]["answer_probability"]
        fig.add_hline(y=full, line_dash="dot", annotation_text="full cache")
        fig.update_layout(template="none", title=f"{self.data['model']} · the answer's probability against budget",
                          xaxis={"title": "budget (keys per key/value head)", "type": "log"},
                          yaxis={"title": "answer probability"})
        return fig

    def summary(self) -> str:
        full = self.data["rows"][0]["answer_probability"]
        worst = min(self.data["rows"], key=lambda r: r["answer_probability"])
        return (f"answer {''.join(self.data['answer_tokens'])!r}: full cache p={full:.4g}; lowest "
                f"{worst['policy']} {worst['budget']} p={worst['answer_probability']:.4g}")


def body(text: str, budgets: list, *, answer: str | None = None, policies: list[str] | None = None,
         max_new_tokens: int | None = None, sinks: int | None = None, recent: int | None = None,
         snapkv_window: int | None = None, kernel: int | None = None, pooling: str | None = None) -> dict:
    """POST /api/kv_compare: each cache policy (streaming, h2o, snapkv) at each budget on one prompt: the answer's
    probability (a given text, or the full cache's greedy continuation), KL from the full cache and top-1 agreement."""
    return fields(text=text, budgets=budgets, answer=answer, policies=policies, max_new_tokens=max_new_tokens,
                  sinks=sinks, recent=recent, snapkv_window=snapkv_window, kernel=kernel, pooling=pooling)


def tool(api, text: ToolText, budgets: list[int], answer: str | None = None,
         policies: list[Literal["streaming", "h2o", "snapkv"]] | None = None, snapkv_window: int = 32,
         model: ModelId = None) -> dict:
    a = api.kv_compare(text, budgets, answer=answer, policies=policies, snapkv_window=snapkv_window, model=model)
    return {"answer": "".join(a.answer_tokens), "rows": [
        {"policy": r["policy"], "budget": r["budget"], "answer_probability": number(r["answer_probability"]),
         "kl_mean": number(r["kl_mean"]), "kl_max": number(r["kl_max"]),
         "top1_agreement": number(r["top1_agreement"])} for r in a.rows]}


ANALYSIS = Analysis(
    name="kv_compare", tag="generation", summary="Compare key/value-cache policies and budgets on one prompt: the "
    "answer's probability, KL and top-1 agreement against budget", description=__doc__.split("\n", 1)[1]
    .replace("\n", " ").strip(), request=CompareRequest, response=CompareResponse, plan=plan, stream="runs",
    needs=("predictions", "an LM head"), example={k: v for k, v in EXAMPLE.items()},
    page=("model", "text", "answer", "max_new_tokens", "policies", "budgets", "sinks", "recent", "snapkv_window",
          "kernel", "pooling"),
    methods=(Method("kv_compare", body, KVComparison),),
    tools=(Tool("kv_compare", "Compare key/value-cache eviction policies (streaming, h2o, snapkv) at several budgets "
                "on one prompt: per policy and budget the answer's probability (a given answer, or the full cache's "
                "greedy continuation), the KL from the full cache and the top-1 agreement.", tool),))
