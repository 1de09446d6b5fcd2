"""Encoder-decoders (T5, BART, Marian) in POST /api/attention and POST /api/stages: their three attentions (the
encoder's, the decoder's, and cross-attention: decoder queries against encoder keys) from one run of both stacks
(runtime/encdec.py), and the steps of one head of any of them from the NumPy reference. What reads a single stack's
run (masks, ablation, statistics, pairs) is refused by name."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime import Encoding
from ..runtime.encdec import EncoderDecoderRuntime
from . import checks
from .base import Computed, Context, OneRunPlan, Plan, etag_of, hash_of
from .errors import Refused
from .payloads import predictions, select, tokens
from .runs import Run, Runner


@dataclass(frozen=True, kw_only=True)
class EncoderDecoderPlan(Plan):
    """/api/attention for an encoder-decoder: one run of both stacks (runtime/encdec.py)."""
    layers: list[int]
    heads: list[int]
    run: Run

    async def compute(self, runner: Runner) -> Computed:
        result, hit = await runner.result(self.run)
        return Computed(result, hit, {})

    def payload(self, computed: Computed) -> dict:
        return attention_payload(self, computed)


def attention(ctx: Context, req, rt: EncoderDecoderRuntime, enc: Encoding,
              binary: bool) -> EncoderDecoderPlan:
    """/api/attention for an encoder-decoder: its three attentions, the layers and heads asked of each (a layer
    must be in both stacks). What reads one text's single stack (masks, ablation, statistics, ...) is refused."""
    given = req.model_fields_set
    unsupported = [name for name in ("text_pair", "causal", "resolution", "top_k", "target", "distractor",
                                     "position") if getattr(req, name) is not None]
    unsupported += [name for name in ("mask_tokens", "ablate") if getattr(req, name)]
    if "include" in given:
        unsupported += [f"include {part!r}" for part in req.include if part not in ("attention", "predictions")]
    if unsupported:
        raise Refused(f"{', '.join(unsupported)}: not available for encoder-decoders ({req.model!r} is one); "
                      f"they answer `attention`, `decoder_attention`, `cross_attention` and `predictions`")
    checks.chars(ctx, rt, "text and decoder_text are", req.text, req.decoder_text)
    dec = rt.encode_decoder(req.decoder_text)
    layers = checks.select("layers", req.layers, min(rt.cfg.n_layers, rt.cfg.n_decoder_layers))
    heads = checks.select("heads", req.heads, rt.cfg.n_heads)
    S, T = len(enc.ids), len(dec.ids)
    cells = len(layers) * len(heads) * (S * S + T * T + T * S) if "attention" in req.include else 0
    checks.cells(ctx, cells, binary)
    key = hash_of([req.model, rt.key, req.engine, req.text, dec.ids])
    run = Run(key, lambda: rt.forward([enc], [dec], engine=req.engine)[0])
    per = 4 if binary else (req.precision or 9) + 3
    return EncoderDecoderPlan(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary),
                              binary=binary, size=cells * per + 100 * (S + T), layers=layers, heads=heads, run=run)


def attention_payload(plan, computed) -> dict:
    """An encoder-decoder's answer: the encoder's attention as `attention` [l][h][S][S], the decoder's
    `decoder_attention` [l][h][T][T] and `cross_attention` [l][h][T][S], for the asked layers x heads; both token lists;
    next_tokens and token_logprobs (of the decoder's tokens) with `predictions`."""
    r, req, layers, heads = computed.result, plan.request, plan.layers, plan.heads
    pick = lambda a: select(a, layers, heads)   # noqa: E731  [l, h, ., .]
    out = tokens(plan, r) | {"layers": layers, "heads": heads, "decoder_tokens": r.decoder_encoding.tokens,
                             "decoder_token_ids": r.decoder_encoding.ids, "decoder_special": r.decoder_encoding.special}
    if "attention" in req.include:
        out |= {"attention": pick(r.encoder_attentions), "decoder_attention": pick(r.decoder_attentions),
                "cross_attention": pick(r.cross_attentions)}
    if "predictions" in req.include:
        out |= predictions(r)
    return out


@dataclass(frozen=True, kw_only=True)
class EncoderDecoderStagesPlan(OneRunPlan):
    """/api/stages for an encoder-decoder: one head of its encoder's, its decoder's or its cross-attention."""
    layer: int
    head: int
    attention: str

    def payload(self, computed: Computed) -> dict:
        return stages_payload(self, computed)


def stages(ctx: Context, req, rt: EncoderDecoderRuntime, enc: Encoding,
          binary: bool) -> EncoderDecoderStagesPlan:
    """The steps of one head of an encoder-decoder's `attention` (cross by default), from the NumPy reference run
    with every step kept (runtime/encdec.py). What reads one stack's run (masks, ablation, pairs) is refused."""
    unsupported = [name for name in ("text_pair", "causal") if getattr(req, name) is not None]
    unsupported += [name for name in ("mask_tokens", "ablate") if getattr(req, name)]
    if unsupported:
        raise Refused(f"{', '.join(unsupported)}: not available for encoder-decoders ({req.model!r} is one); "
                      f"their steps take text, decoder_text, attention, layer, head and limit")
    checks.chars(ctx, rt, "text and decoder_text are", req.text, req.decoder_text)
    dec = rt.encode_decoder(req.decoder_text)
    which = req.attention or "cross"
    checks.select("layers", [req.layer], rt.cfg.n_layers if which == "encoder" else rt.cfg.n_decoder_layers)
    checks.select("heads", [req.head], rt.cfg.n_heads)
    nq, nk = (min(req.limit or n, n) for n in ((len(dec.ids) if which != "encoder" else len(enc.ids)),
                                               (len(dec.ids) if which == "decoder" else len(enc.ids))))
    key = hash_of(["stages", req.model, rt.key, req.text, dec.ids])
    run = Run(key, lambda: rt.forward([enc], [dec], stages=True)[0])
    return EncoderDecoderStagesPlan(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary),
                                    binary=binary, size=8 * nq * (nk + rt.cfg.d_model) * (4 if binary else 12),
                                    layer=req.layer, head=req.head, run=run, attention=which)


def stages_payload(plan, computed) -> dict:
    """Every step of one head of an encoder-decoder (its encoder's or decoder's self-attention, or cross-attention),
    for the first `limit` queries and keys, from the NumPy reference's run (model/encdec.py): the queries' input x,
    q [query], k and v [key] (cross-attention: the encoder's output through W_K and W_V), the [query, key] matrices,
    the additive mask the run added (T5's position bias included), probs, ctx and the head's contribution through
    its columns of W_o; each shown row's softmax max and sum over all its keys. `tokens` stay the encoder's."""
    r, req, which = computed.result, plan.request, plan.attention
    l, h, dh = req.layer, req.head, plan.runtime.cfg.d_head
    s, mask = r.steps.stages[which], r.steps.masks[which]                 # [L, B=1, H, Tq, S], [1, 1|H, Tq, S]
    queries = r.encoding if which == "encoder" else r.decoder_encoding
    keys = r.decoder_encoding if which == "decoder" else r.encoding
    nq, nk = (min(req.limit or len(e.ids), len(e.ids)) for e in (queries, keys))
    block = (plan.runtime.model.encoder if which == "encoder" else plan.runtime.model.decoder)[l]
    attn = block.cross_attn if which == "cross" else block.attn
    probs = {"encoder": r.encoder_attentions, "decoder": r.decoder_attentions, "cross": r.cross_attentions}[which]
    ctx = s["ctx"][l, 0, h, :nq]                                                                   # [nq, dh]
    rows = s["masked"][l, 0, h, :nq].astype(np.float64)                  # [nq, S]: whole rows, in float64
    row_max = rows.max(axis=1)
    return tokens(plan, r) | {
        "layer": l, "head": h, "d_head": dh, "scale": float(attn.scale), "causal": which == "decoder",
        "attention": which, "query_tokens": queries.tokens, "key_tokens": keys.tokens,
        "x": s["x"][l, 0, :nq], "q": s["q"][l, 0, h, :nq], "k": s["k"][l, 0, h, :nk], "v": s["v"][l, 0, h, :nk],
        **{name: s[name][l, 0, h, :nq, :nk] for name in ("scores", "scaled", "masked")},
        "mask": mask[0, min(h, mask.shape[1] - 1), :nq, :nk], "probs": probs[l, h, :nq, :nk], "ctx": ctx,
        "contribution": ctx @ attn.out_projection()[0][:, h * dh:(h + 1) * dh].T,                # [nq, D]
        "row_max": row_max, "row_sum": np.exp(rows - row_max[:, None]).sum(axis=1)}


# ---- interventions: knockout and patching of their heads (runtime/encdec.py, with the decoders' named sites) ---------
def _texts(ctx: Context, rt: EncoderDecoderRuntime, *sources: str, decoder_text: str | None):
    """The sources' and the decoder text's tokens, within the character limit and the patching token limit."""
    checks.chars(ctx, rt, "the texts and decoder_text are", *sources, decoder_text)
    encs, dec = [rt.encode(s) for s in sources], rt.encode_decoder(decoder_text)
    for e in (*encs, dec):
        checks.patching_tokens(ctx, len(e.ids), "an intervention")
    return encs, dec


def knockout(ctx: Context, req, rt: EncoderDecoderRuntime, binary: bool) -> dict:
    """/api/knockout for an encoder-decoder: `attention`'s queries (cross, the default: decoder positions) stop
    reading its keys (source positions) in layers [first, last], every head or `heads`; the decoder's next token
    before and after (runtime/encdec.py knock_out). The KnockoutPlan's fields."""
    from ..runtime.encdec import knock_out

    (enc,), dec = _texts(ctx, rt, req.text, decoder_text=req.decoder_text)
    which = req.attention or "cross"
    S, T = len(enc.ids), len(dec.ids)
    Tq, Tk = (S, S) if which == "encoder" else (T, T) if which == "decoder" else (T, S)
    n = rt.cfg.n_layers if which == "encoder" else rt.cfg.n_decoder_layers
    first, last = req.layers or (0, n - 1)
    if not first <= last < n:
        raise Refused(f"layers [{first}, {last}] must be [first, last] with first <= last <= {n - 1} (the {which} "
                      f"attention's layers)")
    for name, asked, count in (("queries", req.queries, Tq), ("keys", req.keys, Tk)):
        bad = [j for j in asked if j >= count]
        if bad:
            raise Refused(f"{name} {bad[:5]} out of range: the {which} attention's {name} are 0..{count - 1}")
    heads = None if req.heads is None else checks.select("heads", req.heads, rt.cfg.n_heads)
    queries, keys = sorted(set(req.queries)), sorted(set(req.keys))
    seen = (lambda q: q + 1) if which == "decoder" else (lambda q: Tk)         # the decoder's self-attention is causal
    left = [q for q in queries if set(range(seen(q))) <= set(keys)]
    if left:
        raise Refused(f"queries {left[:5]} would read no key at all: every key they see is knocked out; keep at least "
                      f"one")
    key = hash_of(["knockout", req.model, rt.key, req.text, dec.ids, which, queries, keys, first, last, heads])
    run = Run(key, lambda: knock_out(rt, enc, dec, queries, keys, (first, last), attention=which, heads=heads))
    return dict(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary), binary=binary,
                size=2000 + 40 * (S + T), run=run)


def patching(ctx: Context, req, rt: EncoderDecoderRuntime, binary: bool) -> dict:
    """/api/patching for an encoder-decoder: every head (or head and position) of `attention`'s outputs (hook_z:
    cross, the default, or the encoder's or the decoder's self-attention) patched between two sources read with one
    decoder text; the metric at the decoder's last position (runtime/encdec.py patch). The PatchingPlan's fields but
    `metric`. Each row runs both stacks whole (no prefix is reused): priced as rows x the model's flops."""
    from ..runtime.encdec import patch

    if req.site != "head_output":
        raise Refused(f"site {req.site!r}: an encoder-decoder's heads are patched at their output (head_output)")
    (clean, corrupt), dec = _texts(ctx, rt, req.clean, req.corrupt, decoder_text=req.decoder_text)
    if len(clean.ids) != len(corrupt.ids):
        raise Refused(f"clean and corrupt must have the same token count: clean has {len(clean.ids)} tokens, "
                      f"corrupt has {len(corrupt.ids)}; patching puts each position's value into the same position")
    metric = checks.metric(rt, req.target, req.distractor)
    which = req.attention or "cross"
    S, T, H = len(clean.ids), len(dec.ids), rt.cfg.n_heads
    L = rt.cfg.n_layers if which == "encoder" else rt.cfg.n_decoder_layers
    rows = L * H * ((S if which == "encoder" else T) if req.per_position else 1)
    if rows > ctx.settings.max_patching_runs:
        raise Refused(f"this patching is {rows} runs; the limit is {ctx.settings.max_patching_runs} "
                      f"(ATTNSCOPE_MAX_PATCHING_RUNS): patch per (layer, head) (per_position false)")
    weights = sum(w.size for w in rt.model.state_dict().values())
    gflop = rows * 2 * weights * (S + T) / 1e9
    if gflop > ctx.settings.max_patching_gflop:
        raise Refused(f"this patching is {gflop:,.0f} GFLOP ({rows} runs of both stacks); the limit is "
                      f"{ctx.settings.max_patching_gflop:,g} (ATTNSCOPE_MAX_PATCHING_GFLOP): shorten the texts")
    key = hash_of(["patching", req.model, rt.key, req.clean, req.corrupt, dec.ids, which, metric.target,
                   metric.distractor, req.per_position, req.direction])

    def call(progress, stopped):
        return patch(rt, (clean, dec), (corrupt, dec), metric, attention=which, per_position=req.per_position,
                     direction=req.direction, progress=progress, stop=stopped)
    return dict(request=req, runtime=rt, encoding=clean, key=key, etag=etag_of(key, req, binary), binary=binary,
                size=24 * rows + 200 * (S + T), run=Run(key, call, steps=True), corrupt=corrupt, metric=metric)
