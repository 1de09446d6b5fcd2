"""POST /api/attention: every asked head's attention probabilities [layer][head][query][key], their row statistics,
summaries and what `include` adds (predictions, scores, an ablation's effect, direct logit attribution). A text the
stacked graph fits runs in one pass (AttentionPlan), a longer one layer by layer (LayerwisePlan), an encoder-decoder's
three attentions in one run (analyses/encoder_decoder.py)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Annotated, Callable, Literal

import numpy as np
from pydantic import ConfigDict, Field

from ..analysis import rollout, scores as head_scores, statistics as stats, thumbnails
from ..analysis.effects import effect
from ..analysis.scores import probe_ids
from ..analysis.statistics import HEAD_STATS, PAIR_STATS, RUN_STATS, SCORE_INFO
from ..runtime import Encoding, Runtime
from ..runtime.encdec import EncoderDecoderRuntime
from ..runtime.interventions import head_masks
from ..runtime.layerwise import LayerwiseResult, Want, checkpoint_spacing
from . import attribution as attributing, checks, encoder_decoder, exact
from .attribution import Attribution
from .answers import TOP, Answer, Head, Indexed, Layer, ModelId, Top, ToolText, number, top_heads, top_of
from .base import Analysis, Computed, Context, Method, Plan, Tool, etag_of, hash_of
from .errors import Refused
from .payloads import predictions, select, tokens
from .runs import Run, Runner, RunProgress
from .schemas import EXAMPLE_TEXT, Effect, Index, Matrix, NextToken, RunOptions, Text, Tokens, _bounded

UP_TO_LAYER = {"attention", "entropy", "summary", "scores"}   # of the asked layers alone: Runtime.depth_of
PROBE_TOKENS = 50   # the induction probe: this many random tokens, repeated once
LIGHT_CELLS, LIGHT_BYTES = 1 << 18, 1 << 20   # Plan.light: probabilities read, bytes sent (built on the event loop)


class AttentionRequest(RunOptions, exact.ExactRequest):
    layers: list[Index] | None = Field(None, description="layers to return (0-based); all when omitted. Each must "
                                       "be below the chosen model's `layers` (GET /api/models)", examples=[[0, 5]])
    heads: list[Index] | None = Field(None, description="heads to return (0-based); all when omitted. Each must be "
                                      "below the chosen model's `heads` (GET /api/models)")
    include: list[Literal["attention", "entropy", "summary", "rollout", "predictions", "scores", "effect",
                          "attribution"]] = Field(
        default=["attention", "entropy", "summary"],
        description="parts of the answer to compute: leave out `attention` for summaries without matrices; "
        "`predictions`: next_tokens and token_logprobs (models with an LM head; ignored for others); `scores`: "
        "head-finding scores; `effect`: what `ablate` changed (ignored without `ablate`); `attribution`: direct "
        "logit attribution of `target` (models with an LM head; needs `target`)")
    target: Text | None = Field(None, min_length=1, description="with `attribution`: the token whose logit is attributed, as "
                                "next_tokens shows it (\"␣Mary\") or a text that is exactly one token (\" Mary\")",
                                examples=["␣Mary"])
    distractor: Text | None = Field(None, min_length=1, description="with `attribution`: attribute logit(target) - "
                                    "logit(distractor) instead (one token, like `target`)")
    position: Index | None = Field(None, description="with `attribution`: the position whose next-token logit is "
                                   "attributed (0-based; below the text's token count); the last when omitted")
    resolution: _bounded(1, 512) | None = Field(
        None, description="block-average each matrix to at most resolution x resolution (overview thumbnails); "
        "`blocks` then gives each cell's token range. A cell is the mean weight of its block, so a row of cells sums "
        "to about 1/(key block width), not 1: multiply each cell by its key block's width for the share of the "
        "query block's attention on those keys (rows of that sum to 1)")
    top_k: _bounded(1, 64) | None = Field(
        None, description="instead of the matrices, each query's k keys with the most weight (heaviest first, ties "
        "to the lower key): `top_keys` and `top_weights` [layer][head][query][k], what a lines view of a long text "
        "draws. Keys a query cannot see come last, with weight 0")

    decoder_text: Text | None = Field(None, description="encoder-decoders only: the decoder's text, read as "
                                      "transformers reads labels (tokenised with the tokenizer's specials, shifted "
                                      "right behind the decoder start token); the start token alone when omitted or "
                                      "blank (white space only). The answer has decoder_attention and "
                                      "cross_attention")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "minilm", "text": EXAMPLE_TEXT, "layers": [4], "heads": [3]},
        {"model": "minilm", "text": EXAMPLE_TEXT, "layers": [4], "heads": [3], "include": ["summary"], "queries": [0, 3],
         "tile": {"queries": [0, 8], "keys": [0, 8]}},
        {"model": "t5-small", "text": "translate English to German: The house is wonderful.",
         "decoder_text": "Das Haus ist", "layers": [0], "heads": [0, 1]}]})


class AttentionResponse(Tokens, exact.ExactAnswer):
    layers: list[int] = Field(description="the layers in `attention`, in order")
    heads: list[int] = Field(description="the heads in `attention`, in order")
    attention: list[list[Matrix]] | None = Field(
        None, description="[layer][head][query][key] probabilities; rows sum to 1. With `resolution`: block means, "
        "whose rows sum to about 1/(key block width) (see `resolution`)")
    blocks: list[list[int]] | None = Field(
        None, description="with `resolution`: [start, end) token range of each row/column block")
    top_keys: list[list[list[list[int]]]] | None = Field(
        None, description="with `top_k`: [layer][head][query][k] key indices, heaviest first")
    top_weights: list[list[Matrix]] | None = Field(
        None, description="with `top_k`: [layer][head][query][k] their weights")
    entropy: list[list[list[float]]] | None = Field(None, description="[layer][head][query] in nats, -sum p log p")
    normalized_entropy: list[list[list[float]]] | None = Field(
        None, description="[layer][head][query] entropy / log(visible keys), within [0, 1]: 0 focused, 1 uniform "
        "(0 when one key is visible)")
    max_weight: list[list[list[float]]] | None = Field(None, description="[layer][head][query] largest weight")
    summary: dict[str, list[list[float]]] | None = Field(
        None, description=f"per-head statistics [layer][head]: {', '.join(HEAD_STATS + RUN_STATS)} (the last where "
        f"the run computes the keys' value norms); for a sentence pair also {', '.join(PAIR_STATS)}")
    rollout: Matrix | None = Field(None, description="attention rollout over all layers [query][key]")
    next_tokens: list[NextToken] | None = Field(None, description="with `predictions`: the 10 most probable "
                                                "tokens after the last one")
    token_logprobs: list[float | None] | None = Field(
        None, description="with `predictions`: natural log p(token_i | the tokens before it); null for the first")
    scores: dict[str, list[list[float]]] | None = Field(
        None, description="with `scores`, per head [layer][head] in [0, 1]: "
        + "; ".join(f"{k}: {v}" for k, v in SCORE_INFO.items()))
    attribution: Attribution | None = Field(None, description="with `attribution`: direct logit attribution")
    ablate: list[list[int]] | None = Field(None, description="the heads knocked out in this run, [layer, head]")
    effect: Effect | None = Field(None, description="with `effect` and `ablate`: what the ablation changed")
    decoder_tokens: list[str] | None = Field(None, description="encoder-decoders: the decoder's tokens, its start "
                                             "token first")
    decoder_token_ids: list[int] | None = Field(None, description="encoder-decoders: their ids")
    decoder_special: list[bool] | None = Field(None, description="encoder-decoders: which decoder tokens are special "
                                               "(the start token, </s>): what the page hides with the special tokens")
    decoder_attention: list[list[Matrix]] | None = Field(
        None, description="encoder-decoders: the decoder's self-attention [layer][head][decoder query][decoder key] "
        "(causal); `attention` is then the encoder's")
    cross_attention: list[list[Matrix]] | None = Field(
        None, description="encoder-decoders: [layer][head][decoder query][encoder key], each decoder token's "
        "attention over the encoder's tokens (rows sum to 1)")


# ---- the plans ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AttentionPlan(Plan):
    """One forward pass of the stacked graph (or the NumPy reference), and the extra runs the answer needs (extras)."""
    layers: list[int]
    heads: list[int]
    run: Run
    extras: dict[str, Run]

    async def compute(self, runner: Runner) -> Computed:
        whole = runner.cache.get(self.key) if self.run.key != self.key else None   # a run that stops early: a
        result, hit = (whole, True) if whole is not None else await runner.result(self.run)   # whole one answers too
        return Computed(result, hit, {name: (await runner.result(run))[0] for name, run in self.extras.items()})

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)

    @property
    def light(self) -> bool:   # MiniLM's last layer at 128 tokens: 196,608 cells, ~1.5 ms (bench/answer.py)
        return (len(self.layers) * len(self.heads) * len(self.encoding.ids) ** 2 <= LIGHT_CELLS
                and self.size <= LIGHT_BYTES and not self.extras and "rollout" not in self.request.include)


def attention_size(req: AttentionRequest, layers: int, heads: int, T: int, binary: bool) -> tuple[int, int]:
    """The one estimate of an attention answer's size over T tokens: (attention values, bytes on the wire)."""
    side = min(T, req.resolution or T)
    cells = layers * heads * (T * min(req.top_k, T) if req.top_k else side * side) if "attention" in req.include else 0
    per = (4 if req.dtype == "float32" or req.top_k else 2) if binary else (req.precision or 9) + 3
    values = cells * (2 if req.top_k else 1)                       # top_k: its keys and its weights
    return cells, values * per + 64 * T * layers * heads + 100 * T


# ---- planning -----------------------------------------------------------------------------------------------------
def plan(ctx: Context, req: AttentionRequest, binary: bool) -> Plan:
    """The model (404), the character limit (413), the text tokenised once, layers, heads, masks and ablations
    against the model and the tokens (422), the answer's size (attention_size, the one estimate): the plan."""
    rt, enc = checks.text(ctx, req)
    if isinstance(rt, EncoderDecoderRuntime):
        return encoder_decoder.attention(ctx, req, rt, enc, binary)
    checks.only_encoder_decoders(req, rt, "decoder_text")
    layers = checks.select("layers", req.layers, rt.cfg.n_layers)
    heads = checks.select("heads", req.heads, rt.cfg.n_heads)
    checks.run_options(ctx, req, rt, enc)
    if req.engine == "numpy":
        checks.capable(rt, "numpy", "the NumPy reference (engine: numpy)")
    T = len(enc.ids)
    checks.long_text(rt, T)                  # what one run fits here (422 naming the longest text that fits)
    if req.position is not None:
        checks.position("position", req.position, T)
    cells, size = attention_size(req, len(layers), len(heads), T, binary)
    extra = exact.check(req, T, len(layers), len(heads))                                  # exact rows and a tile
    cells, size = cells + extra, size + extra * (4 if binary else (req.precision or 9) + 3)
    key = checks.run_key(req, rt, False)
    common = dict(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary), binary=binary,
                  size=size, layers=layers, heads=heads)
    want = Want(tuple(layers), tuple(heads), ends=not (set(req.include) <= UP_TO_LAYER and req.engine == "onnx"))
    depth = rt.depth_of(want)
    if rt.capabilities.stacked and checks.fits_stacked(ctx, rt, T) and not _walks(ctx, req, rt, want, depth, T):
        checks.cells(ctx, cells, binary)
        # a run that stops early keeps the asked blocks' attentions only (Runtime.forward): its key says which
        run = Run(key if depth is None else hash_of([key, depth, layers]), checks.forward(req, rt, enc, want=want))
        return AttentionPlan(run=run, extras=_extras(ctx, req, rt, enc), **common)
    return _layerwise(ctx, req, rt, enc, cells, common)


def _walks(ctx: Context, req: AttentionRequest, rt: Runtime, want: Want, depth: int | None, T: int) -> bool:
    """Whether a text the stacked graph takes runs layer by layer all the same (ATTNSCOPE_PREFER_LAYERWISE): the
    stacked run would fetch every layer's matrices for an answer that holds fewer (the walk gives it all)."""
    prefer = rt.weights.device != "cpu" if ctx.settings.prefer_layerwise is None else ctx.settings.prefer_layerwise
    matrices = "attention" in req.include and not req.top_k and not (req.resolution and T > req.resolution)
    held = len(want.layers) if matrices else 0                  # layers whose full matrices the answer holds
    return exact.walks(req) or (prefer and depth is None and held < rt.cfg.n_layers and req.engine == "onnx"
                                and not {"rollout", "attribution"} & set(req.include))


def _extras(ctx: Context, req: AttentionRequest, rt: Runtime, enc: Encoding) -> dict[str, Run]:
    """The runs an answer compares its run with: the text intact (`effect` of an ablation), the probe (`scores`)."""
    extras = {}
    if "effect" in req.include and req.ablate:
        intact = req.model_copy(update={"ablate": []})
        extras["baseline"] = Run(checks.run_key(intact, rt, False), checks.forward(intact, rt, enc))
    if "scores" in req.include:
        extras["probe"] = _probe(ctx, req, rt)
    if "attribution" in req.include:
        extras["attribution"] = attributing.run(ctx, req, rt, enc)
    return extras


def _probe(ctx: Context, req: AttentionRequest, rt: Runtime) -> Run:
    """The induction probe: PROBE_TOKENS random non-special tokens repeated twice, wrapped in the specials the
    tokenizer puts around any text (so [CLS] ... [SEP] for BERT), under this request's masks and ablations. It
    does not depend on the text: one run per model (and causal/ablation choice), cached."""
    ids = _probe_ids(rt)
    probe = req.model_copy(update={"text": "", "text_pair": None, "mask_tokens": []})
    return Run(checks.run_key(probe, rt, False, ids), checks.forward(probe, rt, rt.encode_ids(ids)))


@functools.cache   # one probe per model for the server's life
def _probe_ids(rt: Runtime) -> tuple[int, ...]:
    n = min(PROBE_TOKENS, (rt.spec.max_tokens - 2) // 2)
    opening = rt.vocabulary.encode("a")
    first = opening.special.index(False)
    return tuple(opening.ids[:first] + probe_ids(rt.cfg.vocab_size, n, set(rt.special_ids()))
                 + opening.ids[first + 1:])


# ---- a long text, layer by layer ----------------------------------------------------------------------------------
CHECKPOINTS_SHARE = 0.5   # of the result cache a long run's checkpoints may take: its other parts need the rest


@dataclass(frozen=True, kw_only=True)
class LayerwisePlan(Plan):
    """A long text, layer by layer (runtime/layerwise.py). Its kept parts (rows, checkpoints, thumbnails) are cached
    under `key`, shared by every request on this text; what a request asks of its heads (want) is computed in the
    same pass on a first run, recomputed from the checkpoints later."""
    layers: list[int]
    heads: list[int]
    extras: dict[str, Run]
    want: Want
    every: int
    group_mb: float
    head_mask: np.ndarray | None
    head_mean: np.ndarray | None

    @property
    def walk_key(self) -> str:
        """The key of the run that computes this plan's asked parts (the kept parts' key is `key`)."""
        return hash_of([self.key, repr(self.want), self.every])

    def progress(self, runner: Runner) -> RunProgress:
        return runner.watch(self.walk_key)

    async def compute(self, runner: Runner) -> Computed:
        base = runner.cache.get(self.key)
        base = None if base is not None and self.want.logprobs and base.token_logprobs is None else base   # again
        try:
            if base is not None and not _lacks(base, self.want):
                result, hit = base, True
            else:
                result, hit = await runner.result(Run(self.walk_key, self._walk(base, self.progress(runner))))
                if base is None:
                    runner.cache.put(self.key, replace(result, asked=None))
        finally:
            runner.unwatch(self.walk_key)
        return Computed(result, hit, {name: (await runner.result(run))[0] for name, run in self.extras.items()})

    def _walk(self, base: LayerwiseResult | None, progress: RunProgress) -> Callable[[], LayerwiseResult]:
        """The run: from scratch, or the asked parts from a cached run's checkpoints."""
        req, lw = self.request, self.runtime.layerwise(self.every, self.group_mb)
        if base is not None:
            return lambda: lw.recompute(base, self.want, progress.update)
        return lambda: lw.forward(self.encoding, causal=req.causal, mask_tokens=req.mask_tokens or None, want=self.want,
                                  head_mask=self.head_mask, head_mean=self.head_mean, progress=progress.update)

    def payload(self, computed: Computed) -> dict:
        return layerwise_payload(self, computed)


def _lacks(base: LayerwiseResult, want: Want) -> bool:
    """Whether a run's kept parts miss something `want` asks for (its heads' parts are never kept)."""
    thumbs = base.thumbnails.get(want.resolution, {})
    return bool(want.block_outputs()) or want.exact() or bool(want.resolution and any(l not in thumbs for l in want.layers))


def _layerwise(ctx: Context, req: AttentionRequest, rt: Runtime, enc: Encoding, cells: int, common: dict
               ) -> LayerwisePlan:
    """A text past ATTNSCOPE_LAYERWISE_MB (or whose answer _walks) runs layer by layer; what it cannot give: 422."""
    T = len(enc.ids)
    if short := rt.capabilities.stacked and checks.fits_stacked(ctx, rt, T):   # walks for its view (exact.walks)
        common = common | {"key": hash_of([common["key"], "layer by layer"])}   # (the stacked graph's key is its own)
    why = (f"`view: {req.view}` is computed layer by layer" if short else f"this text is {T} tokens: every layer's "
           f"attention together is {checks.stacked_bytes(rt, T) / 2**30:.1f} GiB, so it runs layer by layer "
           f"(ATTNSCOPE_LAYERWISE_MB)" if rt.capabilities.stacked else f"model {rt.spec.id!r} runs layer by layer: "
           f"{rt.capabilities.refusal('stacked')}")
    if req.engine == "numpy":
        raise Refused(f"{why} on the onnx engine only; leave `engine` out")
    if "attribution" in req.include:
        checks.patching_tokens(ctx, T, "attribution")
    if "rollout" in req.include:
        raise Refused(f"{why}, and rollout multiplies every layer's full matrices; leave `rollout` out of "
                      f"include, or shorten the text")
    checks.cells(ctx, cells, common["binary"])
    include = set(req.include)
    attention = "attention" in include and not req.top_k
    thumbnails = attention and bool(req.resolution) and T > req.resolution
    want = Want(tuple(common["layers"]), tuple(common["heads"]), attention=attention and not thumbnails,
                top_k=req.top_k if "attention" in include and req.top_k else 0, duplicate="scores" in include,
                resolution=req.resolution if thumbnails else 0, **exact.want(req),
                logprobs=rt.cfg.lm_head and bool({"predictions", "effect"} & include))     # else the last position's
    every = checkpoint_spacing(rt.cfg, T, ctx.settings.checkpoint_every,
                               ctx.settings.cache_mb * 2**20 * CHECKPOINTS_SHARE)
    group_mb = ctx.settings.layerwise_group_mb
    lw = rt.layerwise(every, group_mb)
    keep, mean = head_masks(req.ablate, req.ablation, rt.cfg.n_layers, rt.cfg.n_heads)
    extras = {}
    if "effect" in include and req.ablate:   # the same text intact: layer by layer too, asking nothing of its heads
        intact = req.model_copy(update={"ablate": []})
        extras["baseline"] = Run(checks.run_key(intact, rt, False), lambda: lw.forward(
            enc, causal=req.causal, mask_tokens=req.mask_tokens or None, want=Want()))
    if "scores" in include:
        extras["probe"] = _probe(ctx, req, rt)
    return LayerwisePlan(extras=extras, want=want, every=every, group_mb=group_mb, head_mask=keep,
                         head_mean=mean, **common)


def layerwise_payload(plan, computed) -> dict:
    """payload() for a long text's run: the same fields, from the rows, thumbnails and asked heads it kept."""
    r, req, layers, heads = computed.result, plan.request, plan.layers, plan.heads
    T, sel, keys = len(r.tokens), np.ix_(layers, heads), stats.TextKeys.of(r.encoding, plan.runtime.cfg)
    out = tokens(plan, r) | {"layers": layers, "heads": heads}
    if "attention" in req.include:
        if req.top_k:
            out["top_keys"] = np.stack([r.asked.top_keys[layer] for layer in layers])
            out["top_weights"] = np.stack([r.asked.top_weights[layer] for layer in layers])
        elif req.resolution and T > req.resolution:
            pictures = r.thumbnails[req.resolution]
            out["attention"] = np.stack([pictures[layer][heads] for layer in layers])
            out["blocks"] = thumbnails.block_ranges(T, req.resolution)
        else:
            out["attention"] = np.stack([r.asked.attention[layer] for layer in layers])
    out |= exact.from_run(req, r.asked, layers)
    rows = {name: values[sel] for name, values in r.rows.items()}                  # [l, h, T]
    if "scores" in req.include:                     # computed for the asked heads only
        rows["duplicate"] = np.stack([r.asked.duplicate[layer] for layer in layers])
    out |= _row_statistics(plan, rows, keys, r.visible, computed)
    return out | _outputs(plan, computed)


# ---- the payload --------------------------------------------------------------------------------------------------
def payload(plan, computed) -> dict:
    """The asked layers x heads: matrices (optionally block-averaged, or each query's top-k keys), row statistics,
    per-head summaries, and what else `include` names (predictions, head-finding scores, the effect of an ablation).
    """
    r = computed.result
    req, layers, heads = plan.request, plan.layers, plan.heads
    T = r.attentions.shape[2]
    probs = select(r.attentions, layers, heads)                                       # [l, h, T, T]
    out = tokens(plan, r) | {"layers": layers, "heads": heads}
    if "attention" in req.include:
        if req.top_k:
            out["top_keys"], out["top_weights"] = thumbnails.top_keys(probs, req.top_k)
        elif req.resolution and T > req.resolution:
            out["attention"] = thumbnails.downsample(probs, req.resolution).astype(np.float32)
            out["blocks"] = thumbnails.block_ranges(T, req.resolution)
        else:
            out["attention"] = probs
    out |= exact.from_matrices(req, probs)
    norms = None if r.value_norms is None else r.value_norms[np.ix_(layers, heads)]            # [l, h, T]
    keys = stats.TextKeys.of(r.encoding, plan.runtime.cfg, norms)
    rows = stats.rows(probs, keys, _rows_asked(req, keys))                              # [l, h, T'] each
    out |= _row_statistics(plan, rows, keys, stats.visible_keys(r.mask), computed)
    if "rollout" in req.include:
        out["rollout"] = rollout.rollout(r.attentions).astype(np.float32)
    return out | _outputs(plan, computed)


def _rows_asked(req, keys: stats.TextKeys) -> list[str]:
    """The registry's rows the answer's row outputs, summaries and scores read."""
    names = set()
    if "entropy" in req.include:
        names |= {"entropy", "max_weight"}
    if "summary" in req.include:
        names |= stats.summary_rows(keys)
    if "scores" in req.include:
        names |= set(head_scores.score_rows())
    return [name for name in stats.ROWS if name in names]


def _row_statistics(plan, rows: dict, keys: stats.TextKeys, visible: np.ndarray, computed) -> dict:
    """Row outputs, summaries and scores from the registry's rows (the stacked path's, or a layer-by-layer run's)."""
    req, out = plan.request, {}
    if "entropy" in req.include:
        out |= {"entropy": rows["entropy"], "normalized_entropy": stats.normalize_entropy(rows["entropy"], visible),
                "max_weight": rows["max_weight"]}
    if "summary" in req.include:
        out["summary"] = stats.summarize(rows, keys)
    if "scores" in req.include:
        out["scores"] = scores(plan, head_scores.scores_of(rows, keys), computed.extra["probe"])
    return out


def _outputs(plan, computed) -> dict:
    """What the run predicts and what an ablation changed."""
    r, req, out = computed.result, plan.request, {}
    if "predictions" in req.include and r.next_tokens is not None:
        out |= predictions(r)
    if req.ablate:
        out["ablate"] = [list(pair) for pair in req.ablate]
    if "baseline" in computed.extra:
        out["effect"] = effect(r, computed.extra["baseline"])
    if "attribution" in computed.extra:
        out["attribution"] = attributing.payload(plan.runtime, computed.extra["attribution"])
    return out


def scores(plan, text_scores: dict, probe) -> dict:
    """Head-finding scores on the asked selection: the text's own (analysis.scores), and the induction probe's."""
    n = (len(probe.token_ids) - probe.encoding.special.count(True)) // 2
    offset = probe.encoding.special.index(False)
    return text_scores | {"induction": head_scores.induction_score(select(probe.attentions, plan.layers, plan.heads), n,
                                                            offset)}


# ---- Python: the answer, the method, the MCP tool -------------------------------------------------------------------
class Attention(Answer):
    """POST /api/attention: the asked heads' attention probabilities [layer, head, query, key], rows and summaries."""
    VIEW = ("attention", "binary")   # a notebook's view draws it (python/jupyter.py)
    DIMS = {"attention": ("layer", "head", "query", "key"), "entropy": ("layer", "head", "query"),
            "normalized_entropy": ("layer", "head", "query"), "max_weight": ("layer", "head", "query")}

    def arrays(self):
        out = super().arrays()
        for name, value in (self.data.get("summary") or {}).items():
            out[name] = (("layer", "head"), np.asarray(value, np.float64))
        return out

    attentions = property(lambda self: self.data["attention"], doc="[asked layer, asked head, query, key], as runtime "
                          "results name them (analysis/figures.py draws them)")

    def figure(self, layer: int | None = None, head: int | None = None):
        """One head's matrix (layer and head as the model numbers them; the first asked when only one was), or all."""
        from ..analysis import figures

        layers, heads = self.data["layers"], self.data["heads"]
        if layer is None and head is None and (len(layers) > 1 or len(heads) > 1):
            return figures.model_grid(self)
        layer, head = layers[0] if layer is None else layer, heads[0] if head is None else head
        return figures.head(Indexed(self, layers.index(layer), heads.index(head)), 0, 0,
                            title=f"{self.data['model']} · layer {layer} · head {head}")

    def summary(self) -> str:
        a, d = self.data.get("attention"), self.data
        return f"{d.get('model')}: {len(d.get('tokens', []))} tokens, layers {d.get('layers')}, heads {d.get('heads')}" \
            + ("" if a is None else f", attention {list(np.shape(a))}")


def body(text: str, **options) -> dict:
    """POST /api/attention: per-head attention probabilities [layer, head, query, key] of the asked layers and heads,
    entropy, summaries; options as the API takes them (layers, heads, include, queries, tile, ...)."""
    return {"text": text, **options}


def tool(api, text: ToolText, model: ModelId = None,
         statistic: Annotated[str, Field(description="a summary statistic: mean_entropy, first_token_mass, "
                                                     "previous_token_mass, ... (the API's `summary`)")
                              ] = "previous_token_mass", layer: Layer | None = None, head: Head | None = None,
         top: Top = TOP) -> dict:
    if head is not None and layer is None:
        raise ValueError("head needs layer: give layer and head for one head's strongest links, or neither for the "
                         "heads that rank highest on the statistic")
    a = api.attention(text, model=model, include=["summary"] + (["attention"] if layer is not None else []),
                      **({"layers": [layer], "heads": [head or 0]} if layer is not None else {}))
    out = {"model": a.model, "tokens": a.tokens}
    if layer is None:
        summary = a["summary"]
        if statistic not in summary:
            raise ValueError(f"unknown statistic {statistic!r}; one of {', '.join(summary)}")
        out["top_heads"] = top_of(summary[statistic], top, statistic, by_abs=False)
    else:
        p = np.asarray(a["attention"])[0, 0]
        out["links"] = [{"query": q, "key": k, "weight": number(w), "query_token": a.tokens[q],
                         "key_token": a.tokens[k]} for q, k, w in top_heads(p, top, by_abs=False)]
    return out


ANALYSIS = Analysis(
    name="attention", tag="attention", summary="Attention weights, entropy and per-head statistics for a text",
    description="Weights are [layer][head][query][key]; `entropy` is [layer][head][query] in nats. JSON by "
    "default; the binary tensor form when `Accept` names application/vnd.attnscope.tensors; progress lines then the "
    "JSON answer when it names application/x-ndjson.\n\nLong texts (up to each model's trained context: Gemma 3 32,768 "
    "tokens, SmolLM2 8,192) run layer by layer, attention in blocks of queries: ask for `resolution` overviews of every "
    "head, exact `rows` of chosen `queries` and a `tile`, the full matrices of a few heads, or `top_k` keys per query; "
    "`rollout` and the NumPy engine are refused there.",
    request=AttentionRequest, response=AttentionResponse, plan=plan, stream="layers", form="binary",
    example={"text": EXAMPLE_TEXT},
    methods=(Method("attention", body, Attention), attributing.METHOD),
    tools=(Tool("attention", "Per-head attention statistics of a text (means over its queries): the top heads by "
                "one statistic, and one head's strongest (query -> key) links.", tool), attributing.TOOL))
