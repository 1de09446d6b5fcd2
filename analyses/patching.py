"""POST /api/patching: activation patching. Each (layer, head) -- or (layer, head, position) -- of a site patched from
the clean run into the corrupt one (denoise) or back (noise); the metric at the last position and its recovery,
(patched - corrupt) / (clean - corrupt). Each patched run reuses the unpatched layers below its site
(runtime/patching.py). The checks of two texts and their price are shared with path patching."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.effects import Metric
from ..model.interventions import HOOKS
from ..runtime import Encoding, Runtime
from ..runtime.encdec import Attention, EncoderDecoderRuntime
from ..runtime.patching import patch
from . import checks, encoder_decoder
from .answers import TOP, Answer, ModelId, Top, ToolText, heads_map, number, top_heads
from .base import Analysis, Computed, Context, ManyRunsPlan, Method, Tool, etag_of, fields, hash_of
from .errors import Refused
from .payloads import token
from .runs import Run
from .schemas import _bounded, JsonBool, SITE_DOC, Text, Token, TwoTexts


class PatchingRequest(TwoTexts):
    """Activation patching between a clean and a corrupt text of the same token count."""
    site: Literal["head_output", "query", "key", "value", "pattern", "residual"] = Field(
        "head_output", description="what is patched: " + SITE_DOC)
    per_position: JsonBool = Field(False, description="patch each (layer, head, position) alone, not each (layer, "
                                   "head) at every position; at most ATTNSCOPE_MAX_PATCHING_RUNS rows in all. "
                                   "residual is always per position")
    direction: Literal["denoise", "noise"] = Field("denoise", description="denoise: clean values into the corrupt "
                                                   "run; noise: corrupt values into the clean run")
    decoder_text: Text | None = Field(None, description="encoder-decoders only: the decoder's text, read with both "
                                      "`clean` and `corrupt` (the sources); the metric is at its last position")
    attention: Attention | None = Field(
        None, description="encoder-decoders only: whose heads are patched (site head_output): cross (the default), "
        "decoder or encoder self-attention; hooks decoder.blocks.{layer}.cross_attn.hook_z, ...")
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "clean": "When Mary and John went to the store, John gave a drink to",
         "corrupt": "When Mary and John went to the store, Mary gave a drink to", "target": "␣Mary",
         "distractor": "␣John"}]})


class PatchingResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    site: str = Field(description="the site patched")
    hook: str = Field(description="its name at each layer, TransformerLens' hook point", examples=[
        "blocks.{layer}.attn.hook_z"])
    attention: Attention | None = Field(None, description="an encoder-decoder's: whose "
                                                                       "heads were patched")
    direction: Literal["denoise", "noise"]
    metric: Literal["logit_difference", "logprob"] = Field(description="logit(target) - logit(distractor) at the "
                                                           "last position, or log p(target) without a distractor")
    target: Token
    distractor: Token | None = None
    clean_tokens: list[str]
    corrupt_tokens: list[str]
    clean: float = Field(description="the metric on the clean run")
    corrupt: float = Field(description="the metric on the corrupt run")
    patched: list = Field(description="the metric with one site patched: [layer][head] ([layer][head][position] "
                          "per position; residual [layer][position])")
    recovery: list | None = Field(description="(patched - corrupt) / (clean - corrupt), the same shape; null when "
                                  "clean and corrupt have the same metric")
    timing_ms: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class PatchingPlan(ManyRunsPlan):
    """Every (layer, head) of a site patched between two texts (runtime/patching.py)."""
    corrupt: Encoding
    metric: Metric

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def two_texts(ctx: Context, req, what: str) -> tuple[Runtime, Encoding, Encoding, Metric]:
    """A patching request's model (one with an LM head that runs the stacked graph), its two texts of one token
    count, tokenised, and its metric."""
    rt = checks.runtime(ctx, req.model, what)
    checks.lm(ctx, rt, "patching")
    checks.capable(rt, "stacked", what)
    checks.chars(ctx, rt, "clean and corrupt are", req.clean, req.corrupt)
    clean, corrupt = rt.vocabulary.encode(req.clean), rt.vocabulary.encode(req.corrupt)
    if len(clean.ids) != len(corrupt.ids):
        raise Refused(f"clean and corrupt must have the same token count: clean has {len(clean.ids)} tokens, "
                      f"corrupt has {len(corrupt.ids)}; patching puts each position's value into the same position")
    checks.patching_tokens(ctx, len(clean.ids), "patching")
    return rt, clean, corrupt, checks.metric(rt, req.target, req.distractor)


def price(ctx: Context, rt: Runtime, rows: int, T: int, passes: int = 1,
                   fix: str = "patch per (layer, head) (per_position false), or shorten the texts") -> None:
    """Every row runs the blocks from its own layer up, over every token (path patching: twice): L (L + 1) / 2
    block runs per row of each layer's rows. What that takes, in float operations, bounds how long the answer
    takes."""
    L = rt.cfg.n_layers
    gflop = passes * (rows // L) * L * (L + 1) // 2 * T * checks.block_flops(rt, T) / 1e9
    if gflop > ctx.settings.max_patching_gflop:
        raise Refused(f"this patching is {gflop:,.0f} GFLOP ({rows} rows, each running the blocks from its own "
                      f"layer up over {T} tokens); the limit is {ctx.settings.max_patching_gflop:,g} "
                      f"(ATTNSCOPE_MAX_PATCHING_GFLOP): {fix}")


def plan(ctx: Context, req: PatchingRequest, binary: bool) -> PatchingPlan:
    rt = checks.runtime(ctx, req.model)
    if isinstance(rt, EncoderDecoderRuntime):
        return PatchingPlan(**encoder_decoder.patching(ctx, req, rt, binary))
    checks.only_encoder_decoders(req, rt, "decoder_text", "attention")
    rt, clean, corrupt, metric = two_texts(ctx, req, "activation patching (/api/patching)")
    T, L, H = len(clean.ids), rt.cfg.n_layers, rt.cfg.n_heads
    rows = L * T if req.site == "residual" else L * H * (T if req.per_position else 1)
    if rows > ctx.settings.max_patching_runs:
        raise Refused(f"this patching is {rows} runs ({L} layers x {H} heads x {T} positions); the limit is "
                      f"{ctx.settings.max_patching_runs} (ATTNSCOPE_MAX_PATCHING_RUNS): patch per (layer, head) "
                      f"(per_position false), or shorten the texts")
    price(ctx, rt, rows, T)
    key = hash_of(["patching", req.model, rt.key, req.clean, req.corrupt, metric.target, metric.distractor,
                 req.site, req.per_position, req.direction])

    def call(progress, stopped):
        return patch(rt, clean, corrupt, metric, site=req.site, per_position=req.per_position,
                     direction=req.direction, progress=progress, stop=stopped)
    return PatchingPlan(request=req, runtime=rt, encoding=clean, key=key, etag=etag_of(key, req, binary),
                        binary=binary, size=24 * rows + 200 * T, run=Run(key, call, steps=True),
                        corrupt=corrupt, metric=metric)


def payload(plan, computed) -> dict:
    """Activation patching (runtime/patching.py Patching)."""
    r, rt = computed.result, plan.runtime
    return {"model": plan.request.model, "site": r.site, "hook": getattr(r, "hook", HOOKS[r.site]),
            "attention": getattr(r, "attention", None), "direction": r.direction,
            "metric": r.metric.name, "target": token(rt, r.metric.target),
            "distractor": token(rt, r.metric.distractor), "clean_tokens": plan.encoding.tokens,
            "corrupt_tokens": plan.corrupt.tokens, "clean": r.clean, "corrupt": r.corrupt, "patched": r.patched,
            "recovery": r.recovery}


class Patching(Answer):
    """POST /api/patching: the patched metric and its recovery per [layer, head] ([layer, head, position] per
    position; residual [layer, position])."""
    VIEW = ("patching", "json")   # a notebook's view draws it (python/jupyter.py)

    def _dims(self) -> tuple[str, ...]:
        n = np.ndim(self.data["patched"])
        return ("layer", "position") if self.data.get("site") == "residual" else ("layer", "head", "position")[:n]

    def arrays(self):
        dims = self._dims()
        return {name: (dims, np.asarray(self.data[name], np.float64)) for name in ("patched", "recovery")
                if self.data.get(name) is not None and np.ndim(self.data[name]) == len(dims)}

    def coords(self):
        shape = np.shape(self.data["patched"])
        return {d: list(range(n)) for d, n in zip(self._dims(), shape)}

    def top_heads(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k (layer, head) of largest recovery (|patched - corrupt| when recovery is undefined)."""
        z = self.data["recovery"] if self.data.get("recovery") is not None else \
            np.asarray(self.data["patched"], np.float64) - self.data["corrupt"]
        return top_heads(z, k)

    def figure(self):
        z = self.data["recovery"] if self.data.get("recovery") is not None else \
            np.asarray(self.data["patched"], np.float64) - self.data["corrupt"]
        return heads_map(f"{self.data['model']} · {type(self).__name__.lower()}", np.asarray(z).reshape(
            np.shape(z)[0], -1), "recovery" if self.data.get("recovery") is not None else "patched − corrupt")

    def summary(self) -> str:
        top = ", ".join(f"L{l}H{h} {v:+.3f}" for l, h, v in self.top_heads(3)) if np.ndim(self.data["patched"]) == 2 \
            and self.data.get("site") != "residual" else ""
        return (f"{self.data['metric']}: clean {self.data['clean']:.4f}, corrupt {self.data['corrupt']:.4f}"
                + (f"; top {top}" if top else ""))


def patched(a, top: int) -> dict:
    """A patching answer as a tool gives it: the metric on both texts and the heads that recover most."""
    out = {"model": a.model, "metric": a.metric, "target": a.target["token"],
           "distractor": (a.data.get("distractor") or {}).get("token"), "clean": number(a.clean),
           "corrupt": number(a.corrupt)}
    if np.ndim(a.patched) == 0:
        return out | {"patched": number(a.patched), "recovery": number(a.recovery)}
    z = a.recovery if a.data.get("recovery") is not None else np.asarray(a.patched, np.float64) - a.corrupt
    patched = np.asarray(a.patched, np.float64)
    heads = [{"layer": l, "head": h, "recovery" if a.data.get("recovery") is not None else "change": number(v),
              "patched": number(patched[l, h])} for l, h, v in top_heads(z, top)]
    return out | {"top_heads": heads}


def body(clean: str, corrupt: str, target: str, distractor: str | None = None, *, site: str | None = None,
         per_position: bool | None = None, direction: str | None = None, decoder_text: str | None = None,
         attention: str | None = None) -> dict:
    """POST /api/patching: each (layer, head) of `site` patched between the texts; the metric and recovery. An
    encoder-decoder's: clean and corrupt are sources read with one `decoder_text`, and `attention` whose heads
    (cross, the default; decoder; encoder)."""
    return fields(clean=clean, corrupt=corrupt, target=target, distractor=distractor, site=site,
                  per_position=per_position, direction=direction, decoder_text=decoder_text, attention=attention)


def tool(api, clean: ToolText, corrupt: ToolText, target: str, distractor: str | None = None, model: ModelId = None,
         site: Literal["head_output", "query", "key", "value", "pattern"] = "head_output",
         direction: Literal["denoise", "noise"] = "denoise", top: Top = TOP) -> dict:
    a = api.patching(clean, corrupt, target, distractor, site=site, direction=direction, model=model)
    return patched(a, top)


ANALYSIS = Analysis(
    name="patching", tag="interventions", summary="Activation patching: each head's value from one text put into "
    "the other's run", description="Patches `site` of every (layer, head) -- or (layer, head, position) -- from the "
    "clean run into the corrupt one (denoise) or back (noise), and reports the metric at the last position and its "
    "recovery, (patched - corrupt) / (clean - corrupt). Each patched run reuses the unpatched layers below its site.",
    request=PatchingRequest, response=PatchingResponse, plan=plan, stream="runs", needs=("predictions", "an LM head"),
    example={"clean": "The cat sat on the mat", "corrupt": "The dog sat on the mat", "target": "."},
    methods=(Method("patching", body, Patching),),
    tools=(Tool("patching", "Activation patching: each head's output (or another site) patched alone between a "
                "clean and a corrupt text of the same token count; the metric (logit difference, or log-prob) on "
                "both and the heads that recover most of the gap.", tool),),
    page=("model", "clean", "corrupt", "target", "distractor", "site", "per_position", "direction", "precision"))
