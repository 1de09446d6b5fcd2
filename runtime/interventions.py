"""Interventions on the served model: runs with edits at named sites (model/interventions.py names them and is the
NumPy reference), through the layer-by-layer graphs (runtime/layerwise.py), so that

    trace = Interventions(rt).trace(enc)              # one run, every site's value at every layer kept
    out = Interventions(rt).run(trace, rows)          # rows[b]: the edits of batch row b, made to that run

A row whose first edit is at layer l starts from the trace's residual stream entering layer l: the unedited prefix
is never run again. Rows run in batches along the batch axis, grouped by that first layer; at the first layer a row
reuses the trace's queries, keys, values and head outputs unless an edit there changes them. On a GPU (merge) a batch
takes rows of different first layers and starts at the earliest: there a run costs a launch and a synchronisation,
not arithmetic, and patching SmolLM2's 270 heads is then one batch of 30 layers instead of 30 batches. Ablation (the head
masks of every graph, head_masks below), head importance, activation patching, knockout and direct logit
attribution (analysis/attribution.py, from a trace) all go through here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from ..analysis.effects import Metric
from ..model.interventions import Edit, hook_name
from ..model.masks import MASKED
from ..model.functional import soft_cap
from ..model.precision import COMPUTE, widen
from ..model.transformer import LM_OUTPUTS, logits
from .capabilities import SHARE
from .errors import InputError, Stopped
from .results import Encoding
from .tensors import Held

Ablation = Literal["zero", "mean"]
Readout = Literal["logits", "outputs", "sites"]   # the last position's logits [B, V] (or a metric of them), the
#                                          final graph's outputs, or the sites `keep` names (the run stops after them)
TRACED = ("residual", "query", "key", "value", "head_output")   # the sites a trace keeps by default
KEPT = TRACED                              # the sites an edited run can hand back (Interventions.run's keep)
BATCH = 16                                # rows per batch (on a CPU)
GPU_BATCH = 512                           # at least, on a GPU


def head_masks(ablate: Sequence[Sequence[int]], ablation: Ablation, layers: int, heads: int
               ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """[layer, head] pairs to knock out as the runtime's head_mask and head_mean [1, L, H]: a knocked-out head's
    output (before the output projection) becomes zero, or its mean over the text's positions. None, None keeps
    every head. The stacked graph's form of a head_output edit (see ablation_edits)."""
    if not ablate:
        return None, None
    keep = np.ones((1, layers, heads), COMPUTE)
    for layer, head in ablate:
        keep[0, layer, head] = 0.0
    return keep, (1.0 - keep) if ablation == "mean" else np.zeros_like(keep)


Progress = Callable[[int, int], None]   # (runs done, runs in all): rows of edits run


@dataclass
class Trace:
    """One text's run with every site's value kept: sites[name] [L, ...] one text's values per layer (pattern only
    when asked for); residual has L + 1 entries, the last the stream after the last block (before the final norm)."""
    encoding: Encoding
    mask: np.ndarray                     # [1, 1, T, T] the additive mask the run used
    sites: dict[str, np.ndarray]
    hidden: np.ndarray | None            # [T, D] after the final norm (None: a trace without the final graph)
    logits: np.ndarray | None            # [V] after the last position (LM head only)
    token_logprobs: np.ndarray | None    # [T]
    seconds: float = 0.0                 # the run's

    @property
    def T(self) -> int:
        return len(self.encoding.ids)

    @property
    def tokens(self) -> list[str]:
        return self.encoding.tokens

    def mean(self, site: str, layer: int) -> np.ndarray:
        """The site's mean over the text's positions at a layer: [H, 1, dh] (head sites) or [1, D] (residual)."""
        return self.sites[site][layer].mean(axis=-2, keepdims=True)


def ablation_edits(ablate: Sequence[Sequence[int]], ablation: Ablation, trace: Trace) -> list[Edit]:
    """Heads knocked out as head_output edits: to zero, or to the head's mean output over the text."""
    H = trace.sites["head_output"].shape[1]
    edits = []
    for layer, head in ablate:
        where = np.zeros((H, trace.T), bool)
        where[head] = True
        edits.append(Edit("head_output", layer, where, trace.mean("head_output", layer) if ablation == "mean" else 0.0))
    return edits


def reference_trace(rt, enc: Encoding, *, causal: bool | None = None, mask_tokens=None) -> Trace:
    """Interventions.trace's residual stream and head outputs, computed by the NumPy reference (engine "numpy")
    instead of the served graphs: the stream entering each block and leaving the last (residual, [L + 1, T, D]), each
    head's output before the output projection (head_output, probs @ v, [L, H, T, dh]) and the hidden states after
    the final norm. No logits."""
    t0 = time.perf_counter()
    model, T = rt.model, len(enc.ids)
    causal = rt.cfg.causal if causal is None else bool(causal)
    mask = rt.build_mask([T], causal, [mask_tokens] if mask_tokens else None)
    x = model.embed(np.array([enc.ids], np.int64), np.array([enc.type_ids], np.int64) if model.wtt is not None else None)
    residual, heads = [], []
    for block in model.blocks:
        residual.append(x[0])
        seen: dict[str, np.ndarray] = {}
        x = block(x, mask, hook=seen.setdefault).x              # the block's forward, its sites seen (not edited)
        heads.append(seen["head_output"][0])
    residual.append(x[0])
    hidden = (model.ln_f(x) if model.ln_f is not None else x)[0]
    return Trace(enc, mask, {"residual": np.stack(residual), "head_output": np.stack(heads)}, hidden, None, None,
                 time.perf_counter() - t0)


class Interventions:
    """A Runtime's model run with edits, through its layer-by-layer graphs."""

    def __init__(self, rt, batch: int = BATCH, merge: bool | None = None):
        """batch: rows run at once along the batch axis; on a GPU at least GPU_BATCH (every run costs a launch and
        copies: bench/gpu.py patched SmolLM2's 270 heads in 1.1 s with 16 rows a run). merge: a batch may hold rows
        whose first edits are at different layers, run from the earliest (the others' unedited layers computed
        again, in the batch); default: on a GPU."""
        self.rt, self.lw = rt, rt.layerwise()
        # a model stored narrower than float32 (or in quantised blocks, where their float32 copies fit) runs its blocks'
        # wide graphs: each layer's weights widened once for the runs `widening` spans (every batch of rows reads
        # every layer again), not at each run (Capabilities.widened)
        self.wide = "wide_" if rt.capabilities.widened else ""
        self.batch = int(batch) if rt.weights.device == "cpu" else max(int(batch), GPU_BATCH)
        self.merge = rt.weights.device != "cpu" if merge is None else bool(merge)

    def widening(self):
        """The span over which the blocks' narrower weights are widened once each (runtime/tensors.Weights.widening):
        as much of them as fits what the memory budget leaves beside the model's weights."""
        caps = self.rt.capabilities
        return self.rt.weights.widening(max(0, int(SHARE * caps.memory_bytes) - caps.stored_bytes))

    # ---- the clean run ---------------------------------------------------------------------------------------------
    def trace(self, enc: Encoding, *, causal: bool | None = None, mask_tokens=None, pattern: bool = False,
              keep: Sequence[str] = TRACED, final: bool = True) -> Trace:
        """Run one text, keeping the sites in `keep` at every layer (the pattern's [L, H, T, T] only with `pattern`);
        final=False skips the final graph (no hidden states, logits or log-probs)."""
        t0 = time.perf_counter()
        rt, cfg, lw = self.rt, self.rt.cfg, self.lw
        L, H, T = cfg.n_layers, cfg.n_heads, len(enc.ids)
        causal = cfg.causal if causal is None else bool(causal)
        mask = rt.build_mask([T], causal, [mask_tokens] if mask_tokens else None)
        inputs = rt.feeds(np.array([enc.ids]), np.array([enc.type_ids]), mask, [T])
        names = tuple(keep) + (("pattern",) if pattern else ())
        sites = {name: [] for name in names}
        with lw.busy, self.widening():
            x = lw.run_graph("embed", inputs, ["x"])["x"]
            for layer in range(L):
                q, k, v = self._qkv(layer, x)
                out = self._attend(layer, q, k, v, mask, range(H) if pattern else ())
                for name, value in (("residual", x), ("query", q), ("key", k), ("value", v),
                                    ("head_output", out["ctx"])) + ((("pattern", out["attention"]),) if pattern else ()):
                    if name in sites:
                        sites[name].append(_host(value)[0])
                x = self._block_out(layer, x, out["ctx"])
            if "residual" in sites:
                sites["residual"].append(_host(x)[0])
            ends = self._final(x, np.array([enc.ids])) if final else {}
        lm = cfg.lm_head and final
        return Trace(enc, mask, {name: np.stack(values) for name, values in sites.items()},
                     ends["hidden"][0] if final else None, ends["next_token_logits"][0] if lm else None,
                     ends["token_logprobs"][0] if lm else None, time.perf_counter() - t0)

    # ---- edited runs -----------------------------------------------------------------------------------------------
    def run(self, base: Trace, rows: Sequence[Sequence[Edit]], readout: Readout = "logits",
            reuse: bool = True, metric: Metric | None = None, progress: Progress | None = None,
            stop: Callable[[], bool] | None = None, keep: Sequence[tuple[str, int]] = ()) -> dict[str, np.ndarray]:
        """Every row's edits made to `base`'s run: {"logits": [B, V]} (the last position's next-token logits), or
        with `metric` {"metric": [B]}, each batch's logits reduced as it comes (only the two a logit difference reads
        are computed: never [rows, V] at once); or the final graph's outputs {"hidden" [B, T, D],
        "next_token_logits", "token_logprobs"}; or ("sites") the (site, layer) values `keep` names, as the edited run
        computed them (edits there made), under their hook names {"blocks.3.attn.hook_q": [B, H, T, dh], ...}: the
        run stops after the last of their layers (path patching reads a receiver's input so). reuse=False runs every
        row from the embeddings' output, every block recomputed, one row at a time (the plain way, for comparison:
        the same numbers). progress(rows done, rows) after each batch; stop(): checked before each batch, True raises
        Stopped (nobody waits for the result)."""
        if readout == "sites" and not keep:
            raise ValueError("readout 'sites' needs the (site, layer) pairs to keep")
        bad = [site for site, _ in keep if site not in KEPT]
        if bad:
            raise ValueError(f"a run keeps {', '.join(KEPT)}; not {', '.join(bad)}")
        first = [min((e.layer for e in row), default=self.rt.cfg.n_layers) if reuse else 0 for row in rows]
        order = sorted(range(len(rows)), key=lambda b: first[b])
        size = self.batch if reuse else 1
        out: dict[str, list] = {}
        with self.lw.busy, self.widening():
            n = 0
            if progress is not None:
                progress(0, len(order))          # the batches start now: the rate (and the time left) counts from here
            while n < len(order):
                if stop is not None and stop():
                    raise Stopped(f"stopped after {n} of {len(order)} runs: nobody waits for the result")
                chunk = [b for b in order[n:n + size] if self.merge or first[b] == first[order[n]]]
                n += len(chunk)
                for name, value in self._rows(base, [rows[b] for b in chunk], first[chunk[0]], readout,
                                              reuse, metric, keep).items():
                    out.setdefault(name, []).append((chunk, value))
                if progress is not None:
                    progress(n, len(order))
        result = {}
        for name, parts in out.items():
            value = np.empty((len(rows),) + parts[0][1].shape[1:], parts[0][1].dtype)
            for chunk, part in parts:
                value[chunk] = part
            result[name] = value
        return result

    def _rows(self, base: Trace, rows: list[Sequence[Edit]], start: int, readout: Readout,
              reuse: bool = True, metric: Metric | None = None,
              keep: Sequence[tuple[str, int]] = ()) -> dict[str, np.ndarray]:
        """One batch of rows, all of whose edits are at layers >= start, from base's residual stream at start (and,
        with reuse, base's attention at start where no edit changes it)."""
        cfg, s = self.rt.cfg, base.sites
        B, T = len(rows), base.T
        kept = {hook_name(site, layer): np.repeat(s[site][layer][None], B, axis=0)    # below start: base's own
                for site, layer in keep if layer < start}
        end = max(layer for _, layer in keep) + 1 if readout == "sites" else cfg.n_layers
        x = np.repeat(s["residual"][min(start, end)][None], B, axis=0)        # [B, T, D]
        fresh = reuse                                                         # x is base's in every row
        # What no edit and no kept site reads stays where the sessions compute (Held: a GPU's memory): after a row's
        # last edit, its residual stream, queries, keys, values and head outputs never come to the host.
        for layer in range(start, end):
            here = [[e for e in row if e.layer == layer] for row in rows]
            sites = {e.site for row in here for e in row}
            if "residual" in sites:
                x, fresh = _edit(x, here, "residual"), False
            if fresh:
                q, k, v = (np.repeat(s[name][layer][None], B, axis=0) for name in ("query", "key", "value"))
            else:
                q, k, v = self._qkv(layer, x)
            q, k, v = (_edit(t, here, name) for t, name in ((q, "query"), (k, "key"), (v, "value")))
            for site, value in (("residual", x), ("query", q), ("key", k), ("value", v)):
                if (site, layer) in keep:
                    kept[hook_name(site, layer)] = _host(value)
            if fresh and not sites & {"query", "key", "value", "masked", "pattern"}:
                z = np.repeat(s["head_output"][layer][None], B, axis=0)
            else:
                patterned = sorted({h for row in here for e in row if e.site == "pattern"
                                    for h in np.flatnonzero(e.where.any(axis=-1))})
                mask = base.mask if "masked" not in sites else _knocked(base.mask, here, cfg.n_heads)
                out = self._attend(layer, q, k, v, mask, patterned)
                z = out["ctx"]
                if patterned:                                                 # z = pattern @ v, for edited heads
                    z, v = _host(z), _host(v)
                    p = np.zeros((B, cfg.n_heads, T, T), COMPUTE)
                    p[:, patterned] = out["attention"]
                    p = _edit(p, here, "pattern")
                    z[:, patterned] = p[:, patterned] @ v[:, patterned]
            z = _edit(z, here, "head_output")
            if ("head_output", layer) in keep:
                kept[hook_name("head_output", layer)] = _host(z)
            x, fresh = self._block_out(layer, x, z), False
        if readout == "sites":
            return kept
        if readout == "logits":
            model = self.rt.model
            last = _host(x)[:, -1]
            if model.ln_f is not None:
                last = model.ln_f(last)
            reads = None if metric is None else metric.reads
            if reads is None:
                out = logits(model, last)                                    # [B, V]
            else:                                                            # the metric's columns alone [B, 2]
                out = soft_cap(last @ widen(model.unembedding[reads]).T, model.cfg.final_softcap)
            return {"logits": out} if metric is None else {"metric": metric(out, only_read=reads is not None)}
        return self._final(x, np.repeat(np.array([base.encoding.ids]), B, axis=0))

    # ---- the graphs ------------------------------------------------------------------------------------------------
    def _qkv(self, layer: int, x: np.ndarray | Held):
        out = self.lw.run_graph(self.wide + "block_in", {"x": x}, list("qkv"), layer=layer, keep=tuple("qkv"))
        return out["q"], out["k"], out["v"]

    def _attend(self, layer: int, q, k, v, mask, heads) -> dict[str, np.ndarray]:
        """ctx [B, H, T, dh], and the probabilities of `heads` [B, n, T, T] as "attention" when any are asked. The
        mask gets the layer's sliding-window band where it is a local layer (Layerwise.layer_mask)."""
        heads = np.asarray(list(heads), np.int64)
        outputs = ("attention",) if len(heads) else ()
        feeds = {"q": q, "k": k, "v": v, "attention_mask": self.lw.layer_mask(layer, mask), "heads": heads, "top_k": np.array([1], np.int64)}
        return self.lw.run_graph(("attend", outputs, self.rt.cfg.causal), feeds, ["ctx", *outputs], keep=("ctx",))

    def _block_out(self, layer: int, x: np.ndarray | Held, z: np.ndarray | Held) -> Held:
        (B, T, _), H = x.shape, self.rt.cfg.n_heads
        feeds = {"x": x, "ctx": z, "lengths": np.full(B, T, np.int64),
                 "head_mask": np.ones((B, H), COMPUTE), "head_mean": np.zeros((B, H), COMPUTE)}
        return self.lw.run_graph(self.wide + "block_out", feeds, ["x_next"], layer=layer, keep=("x_next",))["x_next"]

    def _final(self, x: np.ndarray | Held, ids: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {"x": x, "input_ids": ids, "lengths": np.full(x.shape[0], x.shape[1], np.int64)}
        outputs = ["hidden"] + (list(LM_OUTPUTS) if self.rt.cfg.lm_head else [])
        return self.lw.run_graph("final", feeds, outputs)


def _host(value: np.ndarray | Held) -> np.ndarray:
    """A site's value on the host (a Held one read back from the device)."""
    return value.host() if isinstance(value, Held) else value


def _edit(value: np.ndarray | Held, here: list[list[Edit]], site: str) -> np.ndarray | Held:
    """value [B, ...] with each row's edits of `site` made (a copy on the host when any; else value as it is)."""
    if not any(e.site == site for row in here for e in row):
        return value
    value = np.array(_host(value), COMPUTE)
    for b, row in enumerate(here):
        for e in row:
            if e.site == site:
                value[b] = e.apply(value[b])
    return value


def _knocked(mask: np.ndarray, here: list[list[Edit]], heads: int) -> np.ndarray:
    """The additive mask [B, H, T, T] with each row's edits of the masked scores: knockouts (MASKED on the blocked
    cells); the served graphs take an edit of the masked scores as a mask, so no other value can be written there."""
    out = np.repeat(np.broadcast_to(mask, (1, heads) + mask.shape[2:]), len(here), axis=0).astype(COMPUTE)
    for b, row in enumerate(here):
        for e in row:
            if e.site == "masked":
                if not np.all(np.asarray(e.value) == MASKED):
                    raise InputError("the served model edits attention scores by knockout only (value MASKED)")
                out[b] = np.where(e.where, MASKED, out[b])
    return out


def head_importance(rt, text: str | Encoding, *, ablation: Ablation = "zero", batch: int = BATCH,
                    pair: str | None = None, progress: Progress | None = None,
                    stop: Callable[[], bool] | None = None) -> tuple[np.ndarray, float]:
    """Each head's single-head ablation effect on a text (or its Encoding), for every head: [L, H], and the intact
    run's value.

    Decoders (an LM head): the change in the text's mean token log-prob when that head alone is knocked out
    (negative: the head helps predict this text). Encoders: 1 - cosine similarity of the mean-pooled final
    hidden states (the sentence embedding) with and without the head. One trace of the text, then every head's
    head_output edit, each row starting at its own layer (Interventions.run)."""
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    enc = rt.encode(text, pair) if isinstance(text, str) else text
    iv = Interventions(rt, batch)
    base = iv.trace(enc)
    rows = [ablation_edits([(layer, head)], ablation, base) for layer in range(L) for head in range(H)]
    out = iv.run(base, rows, "outputs", progress=progress, stop=stop)
    if rt.cfg.lm_head:
        intact = float(np.mean(base.token_logprobs[1:])) if base.T > 1 else 0.0
        values = out["token_logprobs"][:, 1:].mean(axis=1) if base.T > 1 else np.zeros(len(rows))
        return (values.astype(np.float64) - intact).reshape(L, H), intact
    e, e0 = out["hidden"].mean(axis=1).astype(np.float64), base.hidden.mean(axis=0).astype(np.float64)
    cos = e @ e0 / (np.linalg.norm(e, axis=1) * np.linalg.norm(e0))
    return (1.0 - cos).reshape(L, H), 1.0


