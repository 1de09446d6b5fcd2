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
from ..model.interventions import HEAD_SITES, Edit, hook_name, knockout
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
    with iv.widening():                          # the traces and the patched runs widen each layer once in all
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


@dataclass(frozen=True)
class Prediction:
    """A run's prediction, as analysis.effects.effect reads it."""
    next_token_logits: np.ndarray
    token_logprobs: list
    next_tokens: list
    hidden: np.ndarray


def knock_out(rt, enc: Encoding, queries, keys, layers: tuple[int, int], top_k: int = 10, *, heads=None) -> Knockout:
    """Attention knockout: in layers first..last (inclusive) every head (or those `heads` names) stops reading `keys`
    from `queries`."""
    t0 = time.perf_counter()
    iv = Interventions(rt)
    base = iv.trace(enc)
    edits = knockout(range(layers[0], layers[1] + 1), queries, keys, rt.cfg.n_heads, base.T, only=heads)
    out = iv.run(base, [edits], "outputs")

    def prediction(logits, logprobs, hidden) -> Prediction:
        return Prediction(logits, [None] + np.asarray(logprobs[1:], float).tolist(),
                          rt.top_tokens(logits, top_k), hidden)
    before = prediction(base.logits, base.token_logprobs, base.hidden)
    after = prediction(out["next_token_logits"][0], out["token_logprobs"][0], out["hidden"][0])
    return Knockout(enc.tokens, before, after, layers, time.perf_counter() - t0)


# ---- path patching ---------------------------------------------------------------------------------------------------
Receiver = Literal["query", "key", "value"]


@dataclass(frozen=True)
class PathPatching:
    """Path patching's answer: the metric on both runs and with the paths patched. senders None: each head in turn the
    one sender, patched and recovery [L, H]; senders given: those heads together, one number each. receivers None:
    the paths end at the logits (the residual stream after the last block)."""
    tokens: list[str]          # the clean text's
    senders: tuple[tuple[int, int], ...] | None
    receivers: tuple[tuple[int, int], ...] | None
    receiver_input: Receiver
    metric: Metric
    clean: float
    corrupt: float
    patched: np.ndarray | float
    recovery: np.ndarray | float | None
    seconds: float


def frozen(base: Trace, source: Trace, senders, until: int) -> list[Edit]:
    """Step 2's edits: at every layer from the first sender's up to `until` (exclusive), each head's output is
    base's (frozen), but the senders', which are source's. Below the first sender nothing differs from base."""
    z, every = base.sites["head_output"], np.ones(base.sites["head_output"].shape[1:3], bool)
    first = min(layer for layer, _ in senders)
    edits = []
    for layer in range(first, until):
        value = z[layer]                                  # base's own array: no copy where no sender is
        mine = [h for l, h in senders if l == layer]
        if mine:
            value = value.copy()
            value[mine] = source.sites["head_output"][layer][mine]
        edits.append(Edit("head_output", layer, every, value))
    return edits


def path_patch(rt, clean: Encoding, corrupt: Encoding, metric: Metric, *, senders=None, receivers=None,
               receiver_input: Receiver = "query", batch: int | None = None) -> PathPatching:
    """Path patching (Wang et al. 2023, "Interpretability in the Wild", section 3.1): the senders' outputs from the
    corrupt run reach the receivers only along their direct paths (through the MLPs, which are recomputed), every other
    head frozen at its clean output; then the receivers' `receiver_input` (query, key or value) so computed is put into
    the clean run, the rest of which is computed afresh, and the metric read at the last position. Without receivers
    the paths end at the logits: the step-2 run's own metric. Both steps are runs with edits at named sites
    (Interventions.run): head_output edits freeze the heads, and the receivers' inputs are read at their hook points
    (blocks.{l}.attn.hook_q / hook_k / hook_v) and written there. senders None: each (layer, head) alone, a [L, H] map
    (a head at or above every receiver's layer has no path: the clean metric)."""
    if receiver_input not in ("query", "key", "value"):
        raise InputError(f"receiver_input {receiver_input!r}: a receiver reads its query, key or value")
    if len(clean.ids) != len(corrupt.ids):
        raise InputError(f"clean and corrupt must have the same token count: clean has {len(clean.ids)} tokens, "
                         f"corrupt {len(corrupt.ids)}")
    t0 = time.perf_counter()
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    iv = Interventions(rt) if batch is None else Interventions(rt, batch)
    base, source = iv.trace(clean), iv.trace(corrupt)
    sets = [((l, h),) for l in range(L) for h in range(H)] if senders is None else [tuple(map(tuple, senders))]
    receivers = None if receivers is None else tuple(sorted({(int(l), int(h)) for l, h in receivers}))
    if receivers is None:
        patched = iv.run(base, [frozen(base, source, s, L) for s in sets], "logits", metric=metric)["metric"]
    else:
        layers = sorted({l for l, _ in receivers})
        keep = [(receiver_input, l) for l in layers]
        inputs = iv.run(base, [frozen(base, source, s, layers[-1]) for s in sets], "sites", keep=keep)
        rows = []
        for b in range(len(sets)):
            row = []
            for l in layers:
                where = np.zeros((H, base.T), bool)
                where[[h for ll, h in receivers if ll == l]] = True
                row.append(Edit(receiver_input, l, where, inputs[hook_name(receiver_input, l)][b]))
            rows.append(row)
        patched = iv.run(base, rows, "logits", metric=metric)["metric"]
    c, k = (float(metric(t.logits)) for t in (base, source))
    if senders is None:
        patched = patched.reshape(L, H)
        rec = recovery(patched, c, k)
    else:
        patched = float(patched[0])
        rec = None if abs(c - k) < 1e-6 else (patched - k) / (c - k)
    return PathPatching(clean.tokens, None if senders is None else sets[0], receivers, receiver_input, metric, c, k,
                        patched, rec, time.perf_counter() - t0)
