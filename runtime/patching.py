"""Activation patching (Heimersheim & Nanda): a site's value from one run put into another, one (layer, head) --
or one (layer, head, position) -- at a time, and how much of the metric's gap that closes.

    denoise   the corrupt run with one clean value: which sites carry what makes the clean answer (the default)
    noise     the clean run with one corrupt value: which sites the clean answer cannot do without

recovery = (patched - corrupt) / (clean - corrupt), the metric read at the last position (analysis/effects.py).
Every row is an Edit (model/interventions.py) run by Interventions.run: a row patched at layer l reuses the
unpatched run's layers below l, and rows run in batches.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from ..analysis.effects import Metric, recovery
from ..model.interventions import HEAD_SITES, Edit, knockout
from .errors import InputError
from .interventions import Interventions, Progress, Trace
from .results import Encoding

Direction = Literal["denoise", "noise"]


@dataclass(frozen=True)
class Patching:
    """The answer: the metric on both runs, and per row the patched metric and its recovery. Head sites: [L, H]
    ([L, H, T] per position); residual: [L, T]."""
    tokens: list[str]          # the clean text's
    site: str
    direction: Direction
    metric: Metric
    clean: float
    corrupt: float
    patched: np.ndarray
    recovery: np.ndarray | None
    seconds: float

    def nbytes(self) -> int:
        return self.patched.nbytes * 2


def rows_of(site: str, per_position: bool, source: Trace, L: int, H: int) -> tuple[list[list[Edit]], tuple]:
    """The edits of a patching run, one row each, and the shape their results take."""
    T = source.T
    if site == "residual":        # the whole stream at every position would be the source run itself
        cells = [(l, None, t) for l in range(L) for t in range(T)]
        shape = (L, T)
    elif per_position:
        cells = [(l, h, t) for l in range(L) for h in range(H) for t in range(T)]
        shape = (L, H, T)
    else:
        cells = [(l, h, None) for l in range(L) for h in range(H)]
        shape = (L, H)
    rows = []
    for l, h, t in cells:
        where = np.zeros((T,) if site == "residual" else (H, T), bool)
        where[(slice(None) if t is None else t) if h is None else (h, slice(None) if t is None else t)] = True
        rows.append([Edit(site, l, where, source.sites[site][l])])
    return rows, shape


def patch(rt, clean: Encoding, corrupt: Encoding, metric: Metric, *, site: str = "head_output",
          per_position: bool = False, direction: Direction = "denoise", batch: int | None = None,
          reuse: bool = True, progress: Progress | None = None, stop: Callable[[], bool] | None = None) -> Patching:
    """Patch every (layer, head) -- every (layer, head, position) with per_position -- of `site` between the two
    texts (the same token count), in `direction`. progress(runs done, runs) as the patched runs go; stop() between
    them (Interventions.run)."""
    if site not in HEAD_SITES + ("residual",):
        raise InputError(f"unknown site {site!r}; patch one of {', '.join(HEAD_SITES + ('residual',))}")
    if len(clean.ids) != len(corrupt.ids):
        raise InputError(f"clean and corrupt must have the same token count: clean has {len(clean.ids)} tokens, "
                         f"corrupt {len(corrupt.ids)}")
    t0 = time.perf_counter()
    iv = Interventions(rt) if batch is None else Interventions(rt, batch)
    traces = {name: iv.trace(enc, pattern=site == "pattern") for name, enc in (("clean", clean), ("corrupt", corrupt))}
    base, source = (traces["corrupt"], traces["clean"]) if direction == "denoise" else \
        (traces["clean"], traces["corrupt"])
    rows, shape = rows_of(site, per_position, source, rt.cfg.n_layers, rt.cfg.n_heads)
    patched = iv.run(base, rows, "logits", reuse=reuse, metric=metric, progress=progress,
                     stop=stop)["metric"].reshape(shape)
    c, k = (float(metric(traces[name].logits)) for name in ("clean", "corrupt"))
    return Patching(clean.tokens, site, direction, metric, c, k, patched, recovery(patched, c, k), time.perf_counter() - t0)


@dataclass(frozen=True)
class Knockout:
    """The prediction before and after the knockout: next-token logits [V] and token log-probs [T] of each."""
    tokens: list[str]
    before: object
    after: object
    layers: tuple[int, int]
    seconds: float

    def nbytes(self) -> int:
        return self.before.next_token_logits.nbytes * 2


@dataclass(frozen=True)
class Prediction:
    """A run's prediction, as analysis.effects.effect reads it."""
    next_token_logits: np.ndarray
    token_logprobs: list
    next_tokens: list
    hidden: np.ndarray


def knock_out(rt, enc: Encoding, queries, keys, layers: tuple[int, int], top_k: int = 10) -> Knockout:
    """Attention knockout: in layers first..last (inclusive) every head stops reading `keys` from `queries`."""
    t0 = time.perf_counter()
    iv = Interventions(rt)
    base = iv.trace(enc)
    edits = knockout(range(layers[0], layers[1] + 1), queries, keys, rt.cfg.n_heads, base.T)
    out = iv.run(base, [edits], "outputs")

    def prediction(logits, logprobs, hidden) -> Prediction:
        return Prediction(logits, [None] + np.asarray(logprobs[1:], float).tolist(),
                          rt.top_tokens(logits, top_k), hidden)
    before = prediction(base.logits, base.token_logprobs, base.hidden)
    after = prediction(out["next_token_logits"][0], out["token_logprobs"][0], out["hidden"][0])
    return Knockout(enc.tokens, before, after, layers, time.perf_counter() - t0)
