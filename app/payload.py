"""Answers as plain dicts: pure functions of (plan, result), no I/O, no state.

Each function takes what the service validated (a Plan) and what the model computed (an
AttentionResult) and returns the payload the wire codec encodes. Statistics are computed on the
asked selection only.
"""
from __future__ import annotations

import time

import numpy as np

from ..model import stats
from ..model.runtime import AttentionResult


def warnings(spec, r: AttentionResult) -> list[str]:
    """What to know before trusting the numbers: positions past the length the model was trained on."""
    T, trained = len(r.tokens), spec.trained_tokens
    if trained is not None and T > trained:
        return [f"{T} tokens is more than the {trained} {spec.title} was trained on: positions {trained} to {T - 1} "
                f"are untrained, and its attention there can be an artefact of position rather than a finding"]
    return []


def tokens(plan, r: AttentionResult) -> dict:
    """The fields every answer shares: what ran, the tokens it ran on, and any warnings."""
    e = r.encoding
    return {"model": r.model, "engine": r.engine, "provider": r.provider, "causal": r.causal,
            "truncated": e.truncated, "tokens": e.tokens, "token_ids": e.ids, "offsets": [list(o) for o in e.offsets],
            "special": e.special, "segments": e.segments, "mask_tokens": r.mask_tokens,
            "warnings": warnings(plan.runtime.spec, r)}


def attention(plan, r: AttentionResult) -> dict:
    """The asked layers x heads: matrices (optionally block-averaged), row statistics, per-head summaries."""
    req, layers, heads = plan.request, plan.layers, plan.heads
    L, H, T = r.attentions.shape[:3]
    everything = layers == list(range(L)) and heads == list(range(H))
    probs = r.attentions if everything else r.attentions[np.ix_(layers, heads)]   # [l, h, T, T]; no copy for all
    out = tokens(plan, r) | {"layers": layers, "heads": heads}
    if "attention" in req.include:
        if req.resolution and T > req.resolution:
            out["attention"] = stats.downsample(probs, req.resolution).astype(np.float32)
            edges = np.linspace(0, T, req.resolution + 1).astype(int)
            out["blocks"] = [[int(a), int(b)] for a, b in zip(edges[:-1], edges[1:])]
        else:
            out["attention"] = probs
    rows = stats.row_stats(probs, r.mask) if "entropy" in req.include else None
    if rows is not None:
        out |= rows
    if "summary" in req.include:
        out["summary"] = stats.head_stats(probs, rows["entropy"] if rows else None, r.encoding.segments)
    if "rollout" in req.include:
        out["rollout"] = stats.rollout(r.attentions).astype(np.float32)
    return out


def stages(plan, r: AttentionResult) -> dict:
    """Every intermediate of one head, for the first `limit` tokens."""
    req, cfg = plan.request, plan.runtime.cfg
    l, h = req.layer, req.head
    n = req.limit or len(r.tokens)
    st = {name: v[l, h, :n, :] if name in ("q", "k") else v[l, h, :n, :n] for name, v in r.stages.items()}
    return tokens(plan, r) | {"layer": l, "head": h, "d_head": cfg.d_head,
                        "scale": float(1.0 / (np.sqrt(cfg.d_head) * cfg.temperature)),
                        **st, "mask": r.mask[:n, :n], "probs": r.attentions[l, h, :n, :n]}


def rounded(payload: dict, precision: int | None) -> dict:
    """Every float of the payload (arrays, nested dicts, scalars) rounded to `precision` decimals."""
    if precision is None:
        return payload

    def rnd(v):
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            return np.round(v, precision)
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
