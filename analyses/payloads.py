"""What every analysis' payload shares: pure functions of (plan, result), no I/O, no state. An analysis' own payload
function (in its module) builds its answer from these: what ran and on which tokens (`tokens`), the asked layers and
heads of an array (`select`), next-token predictions, a token's id and string; `rounded` and `timed` finish every
answer before the wire codec encodes it."""
from __future__ import annotations

import time

import numpy as np

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
            "warnings": warnings(plan.runtime.spec, r, dtype),
            **({"text_tokens": e.text_tokens} if e.text_tokens is not None else {})}


def predictions(r: AttentionResult) -> dict:
    return {"next_tokens": [t._asdict() for t in r.next_tokens], "token_logprobs": r.token_logprobs}


def token(rt, token_id: int | None) -> dict | None:
    return None if token_id is None else {"token": rt.token_string(token_id), "id": int(token_id)}


def ranked(rt, a, token_id: int) -> dict:
    rank, prob = a.ranks[token_id]
    return {**token(rt, token_id), "rank": rank, "probability": prob}


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


def timed(payload: dict, r, started: float) -> dict:
    """Add timing_ms: the run (its result's `seconds`; 0 for a result that ran nothing) and the request so far
    (parsing to payload)."""
    payload["timing_ms"] = {"model": round(getattr(r, "seconds", 0.0) * 1000, 3),
                            "total": round((time.perf_counter() - started) * 1000, 3)}
    return payload
