"""POST /api/retrieval: retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"). A needle-in-a-haystack probe: a needle sentence is placed at chosen depths of a haystack (the user's
text, or the bundled one, analyses/data/haystack.txt), a question follows, and the needle's answer is appended (teacher
forcing). A head's retrieval score is how often, over the answer's tokens, its top key (the argmax of its attention
row at the position that predicts the token) is a needle token equal to the one being predicted: the head copies it
from the needle. Averaged over the depths. The top heads are then knocked out (their output, hook_z, zeroed: the
interventions' head_output edit), and so are as many random heads of the same layers (seeded): the answer's probability
under each says what retrieval loses.

Each probe's run is the layer-by-layer walk (runtime/layerwise.py) asking every head's top-1 key per query: [L, H, T]
key indices, never a [T, T] matrix; the knockouts are walks with a head mask."""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..model.interventions import hook_name
from ..runtime import Encoding, Runtime
from ..runtime.errors import Stopped
from ..runtime.interventions import head_masks
from ..runtime.layerwise import Want
from . import checks
from .answers import Answer, ModelId, heads_map, number
from .base import Analysis, Computed, Context, ManyRunsPlan, Method, Tool, etag_of, fields, hash_of
from .errors import Refused
from .runs import Run
from .schemas import _bounded, MAX_INDEX, Strict, Text

HAYSTACK = Path(__file__).with_name("data") / "haystack.txt"   # an original essay, ~3,800 tokens of plain English
NEEDLE = "The secret word that opens the harbour gate is marmalade sunrise."
QUESTION = ("Question: What is the secret word that opens the harbour gate?\n"
            "Answer: The secret word that opens the harbour gate is")
ANSWER = " marmalade sunrise"
DEPTHS = (0.1, 0.5, 0.9)
HAYSTACK_TOKENS = 512        # the bundled haystack's length by default (or what the model reads, if less)
MAX_TOP = 32
NO_ROWS = Want(rows=False)   # the knockout walks read the answer's log-prob alone
Depth = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False, strict=True)]   # JSON numbers only: no true/false


@functools.cache
def bundled() -> str:
    return HAYSTACK.read_text(encoding="utf-8")


class RetrievalRequest(Strict):
    """A needle-in-a-haystack probe: every head's retrieval score, the top heads, and what knocking them out costs."""
    model: Text = Field("smollm2", description="a model id with an LM head (`predictions`)", examples=["smollm2"])
    text: Text | None = Field(None, description="the haystack; the bundled one (an original essay of ~3,800 tokens) "
                              "when omitted", json_schema_extra={"pattern": r"\S"})
    tokens: _bounded(1, MAX_INDEX + 1) | None = Field(
        None, description=f"the haystack's first `tokens` tokens are used; default: the bundled haystack's first "
        f"{HAYSTACK_TOKENS} (fewer where the model reads fewer), the whole of a given text")
    needle: Text = Field(NEEDLE, description="the sentence placed in the haystack",
                         json_schema_extra={"pattern": r"\S"})
    question: Text = Field(QUESTION, description="what follows the haystack (after a blank line), up to the answer",
                           json_schema_extra={"pattern": r"\S"})
    answer: Text = Field(ANSWER, description="the needle's answer, appended after the question and scored (teacher "
                         "forcing); it must appear in the needle", json_schema_extra={"pattern": r"\S"})
    depths: list[Depth] = Field(list(DEPTHS), min_length=1, max_length=11, description="where the needle goes: "
                                "fractions of the haystack (0 its start, 1 its end), each moved to the nearest "
                                "sentence start; the scores and probabilities are averaged over them")
    top: _bounded(1, MAX_TOP) | None = Field(None, description="how many of the top heads are knocked out together; "
                                             "default 5 (half the model's heads if that is fewer)")
    controls: _bounded(0, 8) = Field(2, description="random draws of as many heads from the same layers (none of the "
                                     "top heads), each knocked out in a run of its own")
    seed: _bounded(0, 2**31 - 1) = Field(0, description="seeds the random draws")
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "tokens": 256, "depths": [0.25, 0.75]}]})


class Probe(BaseModel):
    depth: float = Field(description="the depth asked (a fraction of the haystack)")
    text: str = Field(description="the probe: the haystack with the needle, the question and the answer")
    tokens: int = Field(description="its token count")
    needle: list[int] = Field(description="[start, end) the needle's token positions")
    answer: list[int] = Field(description="the answer's token positions (each predicted from the one before)")
    answer_tokens: list[str]
    probability: float = Field(description="p(answer | everything before it): the product of its tokens' "
                               "probabilities, every head kept")
    knocked_out: float = Field(description="the same with the top heads knocked out")
    controls: list[float] = Field(description="the same with each control draw knocked out")


class Knocked(BaseModel):
    heads: list[list[int]] = Field(description="[layer, head] pairs knocked out together: each head's output "
                                   "(hook_z, before the output projection) zeroed")
    hooks: list[str] = Field(description="their sites, as TransformerLens names them", examples=[
        ["blocks.17.attn.hook_z"]])
    probability: float = Field(description="the answer's probability with them knocked out, mean over depths")
    same_layers: bool = Field(True, description="controls: every head drawn from its top head's layer (false: a "
                              "layer had too few other heads, and the nearest layer gave one)")


class TopHead(BaseModel):
    layer: int
    head: int
    score: float = Field(description="its retrieval score, mean over depths")
    hook: str = Field(description="its output's site", examples=["blocks.17.attn.hook_z"])


class RetrievalResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    haystack_tokens: int = Field(description="the haystack's tokens used")
    depths: list[float]
    probes: list[Probe]
    scores: list[list[float]] = Field(description="[layer][head] the retrieval score: the share of the answer's "
                                      "tokens whose top key is that token in the needle, mean over depths")
    copy_weights: list[list[float]] = Field(description="[layer][head] the mean attention weight of those copying "
                                            "top keys (0 where the head does not copy): ranks heads of equal scores")
    top_heads: list[TopHead] = Field(description="the heads of the highest scores, highest first")
    probability: float = Field(description="the answer's probability, every head kept, mean over depths")
    knocked_out: Knocked = Field(description="the top heads knocked out")
    controls: list[Knocked] = Field(description="each draw of random heads from the same layers, knocked out")
    control_probability: float | None = Field(description="the controls' probability, mean over draws")
    timing_ms: dict[str, float]


# ---- the probe -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placed:
    """One probe: its text and tokens, the needle's token span, the answer's token positions."""
    depth: float
    text: str
    encoding: Encoding
    needle: tuple[int, int]
    answer: tuple[int, ...]


def haystack(rt: Runtime, text: str | None, tokens: int | None, room: int) -> tuple[str, int]:
    """The haystack's text cut after its first `tokens` tokens (default: the bundled one's HAYSTACK_TOKENS, at most
    `room`; a given text whole), and its token count."""
    n = tokens if tokens is not None or text is not None else min(HAYSTACK_TOKENS, max(room, 1))
    text = bundled() if text is None else text
    enc = rt.vocabulary.encode(text)
    words = [i for i, s in enumerate(enc.special) if not s]
    if n is not None and n < len(words):
        text = text[:enc.offsets[words[n]][0]]
    return text.rstrip(), min(len(words), n or len(words))


def place(hay: str, needle: str, depth: float) -> tuple[str, int]:
    """The haystack with the needle at the sentence start nearest `depth` of its characters (word starts where it has
    fewer than two sentences), and where the needle starts."""
    starts = [0] + [m.end() for m in re.finditer(r"[.!?][\"')\]]*\s+", hay)]
    if len(starts) < 3:
        starts = [0] + [m.end() for m in re.finditer(r"\s+", hay)]
    b = min(starts + [len(hay)], key=lambda s: abs(s - depth * len(hay)))
    before, after = hay[:b], hay[b:]
    before += "" if not before or before[-1].isspace() else " "
    return before + needle + ("" if not after or after[0].isspace() else " ") + after, len(before)


def probe(rt: Runtime, hay: str, req: RetrievalRequest, depth: float, room: int) -> Placed:
    text, at = place(hay, req.needle, depth)
    text = f"{text.rstrip()}\n\n{req.question}{req.answer}"
    enc = rt.vocabulary.encode(text)
    if enc.truncated:
        raise Refused(f"the probe is over {rt.spec.max_tokens} tokens, what model {req.model!r} reads (its "
                      f"max_tokens): shorten the haystack to at most about {max(room, 1)} tokens (tokens)")
    a0, n1 = len(text) - len(req.answer), at + len(req.needle)
    real = [i for i, s in enumerate(enc.special) if not s]
    needle = [i for i in real if enc.offsets[i][1] > at and enc.offsets[i][0] < n1]
    answer = tuple(i for i in real if enc.offsets[i][1] > a0 and i > 0)
    for name, span in (("needle", needle), ("answer", answer)):
        if not span:
            raise Refused(f"the {name} reads as no token of model {req.model!r}: give it words the model reads")
    return Placed(depth, text, enc, (needle[0], needle[-1] + 1), answer)


def copies(top_keys: np.ndarray, ids: np.ndarray, p: Placed) -> np.ndarray:
    """[..., A] whether each head's top key at the query before each answer token (top_keys [..., A]) is a needle
    token equal to that answer token."""
    a, (n0, n1) = np.asarray(p.answer), p.needle
    return (top_keys >= n0) & (top_keys < n1) & (ids[top_keys] == ids[a])


# ---- the runs ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    scores: np.ndarray          # [D, L, H]
    weights: np.ndarray         # [D, L, H] the copying top keys' mean weight
    logprobs: np.ndarray        # [D] the answer's log-prob, every head kept
    top: list[tuple[int, int]]
    draws: list[list[tuple[int, int]]]
    knocked: np.ndarray         # [1 + draws, D] the answer's log-prob with the top heads / each draw knocked out
    seconds: float
    tokens: list[str]           # the first probe's (the Run contract)


def controls(top: list[tuple[int, int]], L: int, H: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """As many heads as `top`, none of them: each from its top head's layer where one is left, else the nearest."""
    taken, out = set(top), []
    for l, _ in top:
        for layer in sorted(range(L), key=lambda x: (abs(x - l), x)):
            free = [h for h in range(H) if (layer, h) not in taken]
            if free:
                out.append((layer, int(rng.choice(free))))
                taken.add(out[-1])
                break
    return out


def answer_logprob(result, p: Placed) -> float:
    return float(sum(result.token_logprobs[i] for i in p.answer))


def find(rt: Runtime, lw, probes: list[Placed], top: int, draws: int, seed: int, progress, stopped) -> Found:
    """Each probe's walk asking every head's top key per query, the top heads, then the knockout walks."""
    t0 = time.perf_counter()
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    D, total, done = len(probes), len(probes) * (2 + draws), 0

    def step():
        nonlocal done
        done += 1
        progress(done, total)
        if done < total and stopped():
            raise Stopped(f"stopped after {done} of {total} runs: nobody waits for the result")

    progress(0, total)
    scores, weights, logprobs = np.zeros((D, L, H)), np.zeros((D, L, H)), np.zeros(D)
    every = Want(tuple(range(L)), tuple(range(H)), top_k=1, rows=False)      # no walk here reads the kept rows
    for d, p in enumerate(probes):
        r = lw.forward(p.encoding, want=every)
        q = np.asarray(p.answer) - 1                                  # the queries that predict the answer's tokens
        keys = np.stack([r.asked.top_keys[l][:, q, 0] for l in range(L)])          # [L, H, A]
        w = np.stack([r.asked.top_weights[l][:, q, 0] for l in range(L)])
        hit = copies(keys, np.asarray(p.encoding.ids), p)
        scores[d], weights[d], logprobs[d] = hit.mean(-1), np.where(hit, w, 0).mean(-1), answer_logprob(r, p)
        del r
        step()
    rank = np.lexsort((np.arange(L * H), -weights.mean(0).ravel(), -scores.mean(0).ravel()))[:top]
    chosen = [(int(i) // H, int(i) % H) for i in rank]
    drawn = [controls(chosen, L, H, np.random.default_rng([seed, n])) for n in range(draws)]
    knocked = np.zeros((1 + draws, D))
    for n, heads in enumerate([chosen, *drawn]):
        keep, mean = head_masks(heads, "zero", L, H)
        for d, p in enumerate(probes):
            knocked[n, d] = answer_logprob(lw.forward(p.encoding, head_mask=keep, head_mean=mean, want=NO_ROWS), p)
            step()
    return Found(scores, weights, logprobs, chosen, drawn, knocked, time.perf_counter() - t0,
                 probes[0].encoding.tokens)


# ---- planning ------------------------------------------------------------------------------------------------------
def forward_flop(rt: Runtime, T: int) -> float:
    """One walk over T tokens: every block (checks.block_flops) and the LM head's logits at every position."""
    cfg = rt.cfg
    return T * (cfg.n_layers * checks.block_flops(rt, T) + 2.0 * cfg.vocab_size * cfg.d_model)


@dataclass(frozen=True, kw_only=True)
class RetrievalPlan(ManyRunsPlan):
    """Each depth's probe walked once for every head's top keys, then once per knocked-out set of heads."""
    probes: tuple[Placed, ...]
    haystack_tokens: int

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def plan(ctx: Context, req: RetrievalRequest, binary: bool) -> RetrievalPlan:
    what = "the retrieval-head finder (/api/retrieval)"
    rt = checks.runtime(ctx, req.model, what)
    checks.lm(ctx, rt, what)
    checks.chars(ctx, rt, "text is", req.text, req.needle, req.question, req.answer)
    for name in ("text", "needle", "question", "answer"):
        value = getattr(req, name)
        if value is not None and not value.strip():
            raise Refused(f"{name} is blank: give at least one non-blank character")
    if req.answer.strip() not in req.needle:
        raise Refused(f"answer {req.answer.strip()[:80]!r} is not in the needle: the answer is what the needle says, "
                      f"copied from it")
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    top = min(5, L * H // 2) if req.top is None else req.top
    if not 1 <= top <= L * H // 2:
        raise Refused(f"top {top} is more than half of the {L * H} heads of model {req.model!r}: the controls draw as "
                      f"many other heads; ask for at most {L * H // 2}")
    extra = len(rt.vocabulary.encode(f"{req.needle} \n\n{req.question}{req.answer}").ids) + 2
    room = rt.spec.max_tokens - extra
    hay, n = haystack(rt, req.text, req.tokens, room)
    probes = tuple(probe(rt, hay, req, d, room) for d in dict.fromkeys(req.depths))
    runs = 2 + req.controls
    flop = runs * sum(forward_flop(rt, len(p.encoding.ids)) for p in probes)
    if flop > ctx.settings.work_tflop * 1e12:
        raise Refused(f"this retrieval probe is {flop / 1e12:.1f} TFLOP ({runs * len(probes)} walks of up to "
                      f"{max(len(p.encoding.ids) for p in probes)} tokens), over the {ctx.settings.work_tflop:g} TFLOP "
                      f"a request may take (ATTNSCOPE_WORK_TFLOP): ask fewer depths or controls, or a shorter "
                      f"haystack (tokens)")
    key = hash_of(["retrieval", req.model, rt.key, [p.text for p in probes], req.needle, req.answer, top,
                   req.controls, req.seed])
    lw = rt.layerwise(ctx.settings.checkpoint_every, ctx.settings.layerwise_group_mb)

    def call(progress, stopped) -> Found:
        return find(rt, lw, list(probes), top, req.controls, req.seed, progress, stopped)
    size = 4000 + sum(len(p.text) + 40 * len(p.answer) for p in probes) + 40 * L * H
    return RetrievalPlan(request=req, runtime=rt, encoding=probes[0].encoding, key=key,
                         etag=etag_of(key, req, binary), binary=binary, size=size, run=Run(key, call, steps=True),
                         probes=probes, haystack_tokens=n)


def payload(plan: RetrievalPlan, computed: Computed) -> dict:
    """Every head's retrieval score, the top heads, and the answer's probability intact and knocked out (Found)."""
    f, req = computed.result, plan.request
    p, knocked = np.exp(f.logprobs), np.exp(f.knocked)
    scores, weights = f.scores.mean(0), f.weights.mean(0)

    def knocked_out(heads, probs, same=True) -> dict:
        return {"heads": [list(h) for h in heads], "hooks": [hook_name("head_output", l) for l, _ in heads],
                "probability": float(probs.mean()), "same_layers": same}
    probes = [{"depth": pr.depth, "text": pr.text, "tokens": len(pr.encoding.ids), "needle": list(pr.needle),
               "answer": list(pr.answer), "answer_tokens": [pr.encoding.tokens[i] for i in pr.answer],
               "probability": float(p[d]), "knocked_out": float(knocked[0, d]),
               "controls": [float(v) for v in knocked[1:, d]]} for d, pr in enumerate(plan.probes)]
    return {"model": req.model, "haystack_tokens": plan.haystack_tokens, "depths": [pr.depth for pr in plan.probes],
            "probes": probes, "scores": scores, "copy_weights": weights,
            "top_heads": [{"layer": l, "head": h, "score": float(scores[l, h]), "hook": hook_name("head_output", l)}
                          for l, h in f.top],
            "probability": float(p.mean()), "knocked_out": knocked_out(f.top, knocked[0]),
            "controls": [knocked_out(heads, knocked[1 + n], all(a[0] == b[0] for a, b in zip(heads, f.top)))
                         for n, heads in enumerate(f.draws)],
            "control_probability": float(knocked[1:].mean()) if f.draws else None}


# ---- Python and MCP ------------------------------------------------------------------------------------------------
class Retrieval(Answer):
    """POST /api/retrieval: each head's retrieval score [layer, head], the top heads, and what knocking them out
    costs the needle's answer."""
    DIMS = {"scores": ("layer", "head"), "copy_weights": ("layer", "head")}

    def coords(self):
        L, H = np.shape(self.data["scores"])
        return {"layer": list(range(L)), "head": list(range(H))}

    def figure(self):
        return heads_map(f"{self.data['model']} · retrieval score (needle at depths {self.data['depths']})",
                         self.data["scores"], "retrieval score")

    def summary(self) -> str:
        top = ", ".join(f"L{t['layer']}H{t['head']} {t['score']:.2f}" for t in self.data["top_heads"][:5])
        k, c = self.data["knocked_out"], self.data["control_probability"]
        ctl = "" if c is None else f", {c:.4g} with as many random heads of the same layers"
        return (f"top heads {top}; p(answer) {self.data['probability']:.4g}, {k['probability']:.4g} with the top "
                f"{len(k['heads'])} knocked out{ctl}")


def body(text: str | None = None, *, needle: str | None = None, question: str | None = None,
         answer: str | None = None, depths: list[float] | None = None, tokens: int | None = None,
         top: int | None = None, controls: int | None = None, seed: int | None = None) -> dict:
    """POST /api/retrieval: a needle-in-a-haystack probe (the bundled haystack, or `text`) at `depths`; every head's
    retrieval score (Wu et al. 2024), the top heads, and the answer's probability with the `top` heads knocked out
    and with `controls` draws of as many random heads of the same layers."""
    return fields(text=text, needle=needle, question=question, answer=answer,
                  depths=None if depths is None else list(depths), tokens=tokens, top=top, controls=controls,
                  seed=seed)


def tool(api, text: Annotated[str | None, Field(description="the haystack; the bundled one when omitted")] = None,
         depths: Annotated[list[float] | None, Field(description="where the needle goes, fractions 0..1")] = None,
         tokens: Annotated[int | None, Field(ge=1, description="the haystack's tokens used")] = None,
         top: Annotated[int, Field(ge=1, le=MAX_TOP)] = 5, model: ModelId = None) -> dict:
    a = api.retrieval(text, depths=depths, tokens=tokens, top=top, model=model)
    p = lambda x: None if x is None else float(f"{x:.4g}")    # noqa: E731 - a probability may be 1e-13
    return {"model": a.model, "depths": a.depths,
            "top_heads": [{"layer": t["layer"], "head": t["head"], "score": number(t["score"])} for t in a.top_heads],
            "probability": p(a.probability), "knocked_out_probability": p(a.knocked_out["probability"]),
            "control_probability": p(a.control_probability)}


ANALYSIS = Analysis(
    name="retrieval", tag="interventions", summary="Retrieval heads: a needle-in-a-haystack probe, each head's "
    "retrieval score, and what knocking the top heads out costs", description=" ".join(
        __doc__.split("\n\n")[0].split("\n"))[len("POST /api/retrieval: "):],
    request=RetrievalRequest, response=RetrievalResponse, plan=plan, stream="runs", needs=("predictions", "an LM head"),
    example={"tokens": 48, "depths": [0.5], "controls": 1},
    methods=(Method("retrieval", body, Retrieval),),
    tools=(Tool("retrieval", "Retrieval heads (Wu et al. 2024): a needle sentence placed in a haystack, a question, "
                "and its answer; the heads whose top key copies the answer from the needle, and the answer's "
                "probability with them knocked out vs as many random heads of the same layers.", tool),))
