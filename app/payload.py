"""Answers as plain dicts: pure functions of (plan, computed), no I/O, no state.

Each function takes what the planner validated (a plan, app/plans.py) and what the model computed (a Computed: the
run's result and the extra runs it is compared with) and returns the payload the wire codec encodes. Statistics are
computed on the asked selection only, from the registry (analysis/statistics.py).
"""
from __future__ import annotations

import time

import numpy as np

from ..analysis import rollout, scores as head_scores, statistics as stats, thumbnails
from ..analysis.effects import effect
from ..analysis.qk import qk_attribution
from ..model.functional import score_scale, softmax
from ..model.interventions import HOOKS
from ..model.transformer import SQUARE_STAGES
from ..runtime import AttentionResult


def select(a: np.ndarray, layers: list[int], heads: list[int]) -> np.ndarray:
    """a's [layers][heads] ([l, h, ...]): a view where each list is a run of consecutive indices (one layer and
    every head, say: the answer's tensor is then a slice of the run's own, no copy), a copy otherwise."""
    def run(idx: list[int]):
        return slice(idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[-1] + 1)) else None
    rows, cols = run(layers), run(heads)
    return a[rows, cols] if rows is not None and cols is not None else a[np.ix_(layers, heads)]


def warnings(spec, r: AttentionResult, compute_dtype: str = "float32") -> list[str]:
    """What to know before trusting the numbers: positions past the length the model was trained on, and matrix
    products run in a fast mode (compute_dtype) rather than float32."""
    T, trained, out = len(r.tokens), spec.trained_tokens, []
    if trained is not None and T > trained:
        out.append(f"{T} tokens is more than the {trained} {spec.title} was trained on: positions {trained} to "
                   f"{T - 1} are untrained, and its attention there can be an artefact of position rather than a "
                   f"finding")
    if compute_dtype != "float32":
        out.append(f"the matrix products ran in {compute_dtype}, a fast mode (ATTNSCOPE_COMPUTE_DTYPE), not float32: "
                   f"attention weights and predictions differ from float32's by up to the errors the README measures "
                   f"per model (\"Precision modes\": largest attention difference, top-1 agreement, total variation)")
    return out


def compute_dtype(plan, r: AttentionResult) -> str:
    """What a run's matrix products ran in: its runtime's mode, float32 for the NumPy engine."""
    return "float32" if r.engine == "numpy" else plan.runtime.compute_dtype


def tokens(plan, r: AttentionResult) -> dict:
    """The fields every answer shares: what ran (in which precision), the tokens it ran on, and any warnings."""
    e, dtype = r.encoding, compute_dtype(plan, r)
    return {"model": r.model, "engine": r.engine, "provider": r.provider, "compute_dtype": dtype, "causal": r.causal,
            "truncated": e.truncated, "tokens": e.tokens, "token_ids": e.ids, "offsets": [list(o) for o in e.offsets],
            "special": e.special, "segments": e.segments, "mask_tokens": r.mask_tokens,
            "warnings": warnings(plan.runtime.spec, r, dtype)}


def attention(plan, computed) -> dict:
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
            out["blocks"] = blocks(T, req.resolution)
        else:
            out["attention"] = probs
    keys = stats.TextKeys.of(r.encoding)
    rows = stats.rows(probs, keys, _rows_asked(req, keys))                              # [l, h, T'] each
    out |= _row_statistics(plan, rows, keys, stats.visible_keys(r.mask), computed)
    if "rollout" in req.include:
        out["rollout"] = rollout.rollout(r.attentions).astype(np.float32)
    return out | _outputs(plan, computed)


def encoder_decoder(plan, computed) -> dict:
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


def _rows_asked(req, keys: stats.TextKeys) -> list[str]:
    """The registry's rows the answer's row outputs, summaries and scores read."""
    names = set()
    if "entropy" in req.include:
        names |= {"entropy", "max_weight"}
    if "summary" in req.include:
        names |= {s.row for s in stats.STATISTICS.values() if s.needs == "probabilities" or (s.needs == "pair" and
                                                                                            keys.pair)}
    if "scores" in req.include:
        names |= set(head_scores.score_rows())
    return [name for name in stats.ROWS if name in names]


def _row_statistics(plan, rows: dict, keys: stats.TextKeys, visible: np.ndarray, computed) -> dict:
    """Row outputs, summaries and scores from the registry's rows: those the stacked path computed from the
    matrices, or those a layer-by-layer run computed in its graphs."""
    req, out = plan.request, {}
    if "entropy" in req.include:
        out |= {"entropy": rows["entropy"], "normalized_entropy": stats.normalize_entropy(rows["entropy"], visible),
                "max_weight": rows["max_weight"]}
    if "summary" in req.include:
        out["summary"] = stats.summarize(rows, keys)
    if "scores" in req.include:
        out["scores"] = scores(plan, head_scores.scores_of(rows, keys), computed.extra["probe"])
    return out


def blocks(T: int, resolution: int) -> list[list[int]]:
    """[start, end) token range of each thumbnail row/column block (thumbnails.block_edges)."""
    edges = thumbnails.block_edges(T, resolution)
    return [[int(a), int(b)] for a, b in zip(edges[:-1], edges[1:])]


def layerwise_attention(plan, computed) -> dict:
    """attention() for a long text's run: the same fields, from the rows, thumbnails and asked heads it kept."""
    r, req, layers, heads = computed.result, plan.request, plan.layers, plan.heads
    T, sel, keys = len(r.tokens), np.ix_(layers, heads), stats.TextKeys.of(r.encoding)
    out = tokens(plan, r) | {"layers": layers, "heads": heads}
    if "attention" in req.include:
        if req.top_k:
            out["top_keys"] = np.stack([r.asked.top_keys[layer] for layer in layers])
            out["top_weights"] = np.stack([r.asked.top_weights[layer] for layer in layers])
        elif req.resolution and T > req.resolution:
            pictures = r.thumbnails[req.resolution]
            out["attention"] = np.stack([pictures[layer][heads] for layer in layers])
            out["blocks"] = blocks(T, req.resolution)
        else:
            out["attention"] = np.stack([r.asked.attention[layer] for layer in layers])
    rows = {name: values[sel] for name, values in r.rows.items()}                  # [l, h, T]
    if "scores" in req.include:                     # computed for the asked heads only
        rows["duplicate"] = np.stack([r.asked.duplicate[layer] for layer in layers])
    out |= _row_statistics(plan, rows, keys, r.visible, computed)
    return out | _outputs(plan, computed)


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
        out["attribution"] = attribution(plan.runtime, computed.extra["attribution"])
    return out


def _token(rt, token_id: int | None) -> dict | None:
    return None if token_id is None else {"token": rt.token_string(token_id), "id": int(token_id)}


def _ranked(rt, a, token_id: int) -> dict:
    rank, prob = a.ranks[token_id]
    return {**_token(rt, token_id), "rank": rank, "probability": prob}


def attribution(rt, a) -> dict:
    """Direct logit attribution (plans.Attributed): every part's share, their sum and the model's own logit; the
    target as typed, the token it became (its rank among the next tokens), and the other spelling it may have meant."""
    p = a.parts
    target = {**_ranked(rt, a, a.metric.target), "typed": a.typed,
              "other": None if a.other is None else _ranked(rt, a, a.other)}
    return {"target": target, "distractor": _token(rt, a.metric.distractor),
            "position": a.position, "metric": "logit" if a.metric.distractor is None else "logit_difference",
            "logit": a.logit, "sum": p.total, "embeddings": p.embeddings, "heads": p.heads, "mlps": p.mlps,
            "attention_bias": p.attention_bias, "norm_bias": p.norm_bias}


def patching(plan, computed) -> dict:
    """Activation patching (runtime/patching.py Patching)."""
    r, rt = computed.result, plan.runtime
    return {"model": plan.request.model, "site": r.site, "hook": HOOKS[r.site], "direction": r.direction,
            "metric": r.metric.name, "target": _token(rt, r.metric.target),
            "distractor": _token(rt, r.metric.distractor), "clean_tokens": plan.encoding.tokens,
            "corrupt_tokens": plan.corrupt.tokens, "clean": r.clean, "corrupt": r.corrupt, "patched": r.patched,
            "recovery": r.recovery}


def path_patching(plan, computed) -> dict:
    """Path patching (runtime/patching.py PathPatching)."""
    r, rt = computed.result, plan.runtime
    pairs = {name: None if v is None else [list(p) for p in v] for name, v in
             (("senders", r.senders), ("receivers", r.receivers))}
    return {"model": plan.request.model, **pairs, "receiver_input": r.receiver_input,
            "hooks": {"senders": HOOKS["head_output"],
                      "receivers": HOOKS[r.receiver_input] if r.receivers else "logits"},
            "metric": r.metric.name, "target": _token(rt, r.metric.target),
            "distractor": _token(rt, r.metric.distractor), "clean_tokens": plan.encoding.tokens,
            "corrupt_tokens": plan.corrupt.tokens, "clean": r.clean, "corrupt": r.corrupt, "patched": r.patched,
            "recovery": r.recovery}


def qk(plan, computed) -> dict:
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


def lens(plan, computed) -> dict:
    """The logit lens (plans.Lensed): the stream after the embeddings and after each block, and one head's."""
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


def circuits(plan, computed) -> dict:
    """Weight-space circuits (plans.Circuits)."""
    r, cfg = computed.result, plan.runtime.cfg
    ov = None if r.ov_copying is None else [[None if np.isnan(x) else float(x) for x in row] for row in r.ov_copying]
    return {"model": plan.request.model, "layers": cfg.n_layers, "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
            "ov_copying": ov, "composition_q": r.composition.q.astype(np.float32),
            "composition_k": r.composition.k.astype(np.float32), "composition_v": r.composition.v.astype(np.float32)}


def knockout(plan, computed) -> dict:
    """Attention knockout's effect on the prediction (runtime/patching.py Knockout)."""
    r, req = computed.result, plan.request
    return {"model": req.model, "tokens": r.tokens, "queries": sorted(set(req.queries)), "keys": sorted(set(req.keys)),
            "layers": list(r.layers), "effect": effect(r.after, r.before) | {
                "next_tokens_after": [t._asdict() for t in r.after.next_tokens]}}


def generated(plan, token, text: str) -> dict:
    """One line of a generation (runtime/generation.py Generated): the token, and what the request included."""
    line = {"index": token.index, "id": token.id, "token": token.token, "text": text,
            "probability": token.probability, "sampling_probability": token.sampling_probability}
    if "candidates" in plan.request.include:
        line["candidates"] = [{"token": c.token, "id": c.id, "probability": c.probability,
                               "sampling_probability": c.sampling_probability} for c in token.candidates]
    if token.attention is not None:
        line["attention"] = token.attention
    return {"token": line}


def generation_done(plan, gen, timing_ms: dict) -> dict:
    """A generation's last line: the whole continuation and why it stopped."""
    rt, n = plan.runtime, len(gen.new_ids)
    return {"done": {
        "model": plan.request.model, "compute_dtype": rt.compute_dtype, "prompt_tokens": plan.encoding.tokens,
        "tokens": [rt.token_string(i) for i in gen.new_ids], "ids": list(gen.new_ids), "text": gen.text,
        "sequence": rt.tokenizer.decode(list(plan.encoding.ids) + gen.new_ids, skip_special_tokens=False),
        "stop_reason": gen.stop_reason, "seed": plan.sampling.seed, "layers": list(gen.layers) or None,
        "heads": list(gen.heads) or None, "ablate": [list(p) for p in plan.ablate], "timing_ms": timing_ms,
        "tokens_per_second": n / max(timing_ms["total"] - timing_ms["prompt"], 1e-9) * 1000}}


def predictions(r: AttentionResult) -> dict:
    return {"next_tokens": [t._asdict() for t in r.next_tokens], "token_logprobs": r.token_logprobs}


def scores(plan, text_scores: dict, probe: AttentionResult) -> dict:
    """Head-finding scores on the asked selection: the text's own (analysis.scores), and the induction probe's."""
    n = (len(probe.token_ids) - probe.encoding.special.count(True)) // 2
    offset = probe.encoding.special.index(False)
    return text_scores | {"induction": head_scores.induction_score(select(probe.attentions, plan.layers, plan.heads), n,
                                                            offset)}


def importance(plan, computed) -> dict:
    """Every head's single-head ablation effect (plans.Importance)."""
    r = computed.result
    return {"model": plan.request.model, "tokens": r.tokens, "baseline": r.baseline, "importance": r.values,
            "measure": "mean_logprob_change" if r.lm else "embedding_distance"}


def stages(plan, computed) -> dict:
    """Every intermediate of one head, for the first `limit` tokens.

    From the model run (the ONNX graph, or the NumPy reference with engine=numpy): x, q, k, v, scores, scaled,
    masked, ctx and probs; mask is the additive mask the run was fed. Computed here, in NumPy: the head's
    contribution (ctx through its columns of W_o, TransformerBlock.head_output) and each shown row's softmax
    max and sum over all its keys (the shown part of a row can be cut by `limit`)."""
    r = computed.result
    req, cfg = plan.request, plan.runtime.cfg
    l, h = req.layer, req.head
    n = req.limit or len(r.tokens)
    st = {name: v[l, :n] if name == "x" else v[l, h, :n, :n] if name in SQUARE_STAGES else v[l, h, :n]
          for name, v in r.stages.items()}
    rows = r.stages["masked"][l, h, :n].astype(np.float64)    # [n, T]: whole rows; in float64 (also on the wire)
    row_max = rows.max(axis=1)                                 # so that exp(masked - row_max) is 1 at the max
    return tokens(plan, r) | {"layer": l, "head": h, "d_head": cfg.d_head,
                        "scale": float(score_scale(cfg)),
                        **st, "mask": r.mask[:n, :n], "probs": r.attentions[l, h, :n, :n],
                        "contribution": plan.runtime.model.blocks[l].head_output(h, st["ctx"]),
                        "row_max": row_max, "row_sum": np.exp(rows - row_max[:, None]).sum(axis=1)}


def encoder_decoder_stages(plan, computed) -> dict:
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
    attn = block.cross_attn if which == "cross" else block.self_attn
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


def rounded(payload: dict, precision: int | None) -> dict:
    """Every float of the payload (arrays, nested dicts, scalars) rounded to `precision` decimals."""
    if precision is None:
        return payload

    def rnd(v):
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            # values this large have no decimals to round, and scaling them by 10**precision would overflow to
            # infinity (the mask's -3.4e38 would come back as null)
            small = np.abs(v) < 1e15
            return np.where(small, np.round(np.where(small, v, 0), precision), v)
        if isinstance(v, dict):
            return {k: rnd(x) for k, x in v.items()}
        if isinstance(v, list):
            return [rnd(x) for x in v]
        if isinstance(v, (float, np.floating)):
            return round(float(v), precision)
        return v

    return {k: rnd(v) for k, v in payload.items()}


def timed(payload: dict, r: AttentionResult, started: float) -> dict:
    """Add timing_ms: the forward pass and the request so far (parsing to payload)."""
    payload["timing_ms"] = {"model": round(r.seconds * 1000, 3),
                            "total": round((time.perf_counter() - started) * 1000, 3)}
    return payload
