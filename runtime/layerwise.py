"""Long inputs, one layer at a time: every layer explorable, memory bounded by settings, not by the input.

A text's attention is layers x heads x T^2 numbers: SmolLM2's 30 layers x 9 heads hold 4.5 GB of float32 at
2048 tokens and 18 GB at 4096. The served graph (graphs/stacked.py) returns them stacked, so it cannot run such
a text. Here the same model runs as a chain of graphs, the steps of the stacked graph cut apart:

    embed                   input ids -> x [T, D]                                        layers.build_embed
    per layer: block in     x -> q, k, v [H, T, dh]                                       layers.build_block_halves
               attend       q, k, v of a group of heads -> their ctx and reductions       layers.build_attend
               block out    x, ctx -> the next x                                          layers.build_block_halves
    final                   x -> hidden, next-token logits, token log-probs               layers.build_final
                            (or the final norm's hidden, then the last position's logits alone)

The weights are graph inputs, so one small graph serves every layer: layer i binds its own arrays (views of the
weight store, runtime/tensors.Weights; nothing is exported or copied per layer). The attention graph returns, instead
of its probabilities p [h, T, T], reductions of them computed where they are (graphs/reductions.py): the registry's
rows (analysis/statistics.py ROWS), block-averaged thumbnails; p itself leaves the graph only for the heads a request
asks for, or as their top-k keys per query. A layer's heads run in groups whose [h, T, T] float32 stays within
group_mb; a text whose one head passes it runs each head in blocks of queries over the keys they see (runtime/blocks.py:
memory linear in T). A run keeps

    checkpoints   x entering every k-th layer [1, T, D] (k = checkpoint_every), kept where the sessions compute
                  (Held): a head, rows or a tile asked later are recomputed from the nearest one (the same graphs)
    rows          the registry's rows (ROWS; PAIR_ROWS too for a pair): [L, H, T] (previous, next: T-1)
    thumbnails    [H, R, R] per layer, for each resolution computed
    outputs       final hidden states, next-token logits, token log-probs

(O(L H T + L T D) numbers, never L x H x T^2), and reports progress layer by layer. Why this way, measured:
docs/long-inputs.md and bench/long_input.py.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ..model.precision import COMPUTE
from ..analysis import thumbnails as thumbnails_
from ..analysis.statistics import STATISTICS, TextKeys, visible_keys
from ..graphs import layers
from ..graphs.layers import weighted
from ..graphs.reductions import key_input
from ..model.weights import block_layouts
from .results import Encoded, Encoding, NextToken
from ..sources.store import read, release
from .blocks import (NO_CELLS, VALUE_ROW, BlockedLayer, _walk, blocked, by_tokens, checkpoint_spacing,  # noqa: F401
                     exact_parts, exact_qkv, final_parts, head_groups, hidden_keys, kept_layers, run_axes, tokenwise,
                     unread_inputs, value_norms, visible_counts)
from .options import GROUP_MB
from .sessions import Session
from .tensors import Held, hold
from .wants import Asked, Want

# The rows every run keeps for every head (the API's row outputs and summaries: statistics.STATISTICS); a pair's too.
ROWS = tuple(dict.fromkeys(["entropy", "max_weight"] + [s.row for s in STATISTICS.values()
                                                         if s.needs in ("probabilities", "run")]))
PAIR_ROWS = tuple(s.row for s in STATISTICS.values() if s.needs == "pair")
Progress = Callable[[int, int], None]   # (blocks done, blocks in this run)


def thumbnail_output(T: int, resolution: int) -> str:
    """The attention graph's thumbnail output at T tokens: equal blocks when the resolution divides T."""
    return "thumbnail_even" if T % resolution == 0 else "thumbnail"


def kept_rows(keys: TextKeys) -> tuple[str, ...]:
    """The rows a run of this text keeps for every head."""
    return ROWS + (PAIR_ROWS if keys.pair else ())


def key_feeds(keys: TextKeys, T: int, rows) -> dict[str, np.ndarray]:
    """The attend graph's key-set inputs for these rows (graphs/reductions.py Reductions.marked), and the local
    window (Reductions.local; TextKeys.window)."""
    feeds = {"local_window": np.array([keys.window], np.int64)} if "local" in rows else {}
    if "punctuation" in rows:
        feeds[key_input("punctuation")] = np.asarray(keys.punctuation, COMPUTE)
    for name, keyset in (("cross_sentence", "other_sentence"), ("duplicate", "same_token_before")):
        if name in rows:
            feeds[key_input(keyset)] = keys.mask(keyset, T).astype(COMPUTE)
    return feeds


@dataclass
class LayerwiseResult(Encoded):
    """What a layer-by-layer run keeps of one text (see the module docstring); AttentionResult's fields where
    they mean the same, but no [L, H, T, T] attentions."""
    model: str
    engine: str
    provider: str
    causal: bool
    encoding: Encoding
    hidden: np.ndarray                       # [T, D] final hidden states
    rows: dict[str, np.ndarray]              # kept_rows -> [L, H, T] (previous, next: [L, H, T-1])
    visible: np.ndarray                      # [T] keys each query may see (normalised entropy)
    checkpoints: dict[int, Held]             # layer -> x entering it [1, T, D], where the sessions compute
    thumbnails: dict[int, dict[int, np.ndarray]]   # resolution -> layer -> [H, R, R]
    inputs: dict[str, np.ndarray]            # what recomputing needs besides x: head_mask, head_mean [1, L, H]
    mask_tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    next_tokens: list[NextToken] | None = None
    token_logprobs: list[float | None] | None = None
    next_token_logits: np.ndarray | None = None
    asked: Asked | None = None


class Layerwise:
    """A Runtime's model as the chain of graphs above, for texts too long for the stacked graph."""

    def __init__(self, rt, checkpoint_every: int = 1, group_mb: float = GROUP_MB, graphs: Layerwise | None = None,
                 fused: bool | None = None):
        """graphs: another Layerwise of the same model whose sessions (and run lock) this one shares: the graphs
        do not depend on checkpoint_every or group_mb, only the runs do. fused: a layer whose heads run as one group
        runs as one graph (graphs/layers.build_layer) instead of three; default: on a GPU (a run there costs a launch
        and a synchronisation: 92 runs made SmolLM2's 128-token answer 68 ms on an H200, torch's forward 18 ms)."""
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1; got {checkpoint_every}")
        self.rt, self.every, self.group_mb = rt, int(checkpoint_every), float(group_mb)
        self.fused = rt.weights.device != "cpu" if fused is None else bool(fused)
        self.layouts = block_layouts(rt.model)    # layer -> the first layer of its layout (its graphs' key)
        self._reader: threading.Thread | None = None   # reading the next layer's weights (read_ahead)
        if graphs is not None:
            self._sessions, self._lock, self.busy = graphs._sessions, graphs._lock, graphs.busy
            self.opened = graphs.opened
            return
        self.opened = False            # every graph a run may use is open (`open`): none is built after
        self._sessions: dict[tuple | str, Session] = {}
        self._lock = threading.Lock()
        self.busy = threading.Lock()   # one layer-by-layer run of this model at a time: its memory is the bound

    # ---- graphs -----------------------------------------------------------------------------
    def groups(self, T: int) -> int:
        """Into how many groups a layer's heads are split at T tokens: one group's scores or probabilities
        [h, T, T] float32 stay within group_mb (a layer holds about three such buffers at its peak). On a GPU, one
        group: the small groups are for a CPU's cache, and each run costs a GPU a launch and a copy (bench/gpu.py: at
        2048 tokens nine one-head runs a layer made SmolLM2's answer 24x torch's forward)."""
        H = self.rt.cfg.n_heads
        if self.rt.weights.device != "cpu":
            return 1
        return min(H, max(1, math.ceil(H * T * T * COMPUTE.itemsize / (self.group_mb * 2**20))))

    def session(self, which: str | tuple, layer: int | None = None) -> Session:
        """"embed", "block_in", "block_out", "final", ("attend", outputs, causal) or ("layer", outputs, causal) (a
        whole block); built in memory on first use (the graphs are small: their weights are inputs), or, once `open`
        has run (a server's start), the open graph that serves it: an attend or layer graph not opened then is served
        by the superset opened for it (`superset`), so no run builds a graph. A graph binding a block's weights serves
        one layout (model/weights.block_layouts): `layer`'s; layer None opens every layout's and returns layer 0's.
        Sessions take turns: none keeps a planned memory block. Each keeps a memory arena, a big model's too: a walk's
        layers ask it for the same buffers (a bf16 block's widened weights: fresh pages without it, 5.4 million page
        faults in an 8B request), and a walk's last step gives it back (release)."""
        if weighted(which) and layer is None:
            for first in sorted(set(self.layouts)):
                self.session(which, first)
        key = (which, self.layouts[layer or 0]) if weighted(which) else which
        sess = self._sessions.get(key)
        if sess is not None:
            return sess
        if self.opened and isinstance(which, tuple) and superset(which) != which:
            return self.session(superset(which), layer)
        with self._lock:
            if key not in self._sessions:
                proto = layers.build(self.rt.model, which, key[1] if weighted(which) else 0)
                self._sessions[key] = Session(proto.SerializeToString(), self.rt.providers, self.rt.threads,
                                              self.rt.weights, mem_pattern=False, arena=True,
                                              compute_dtype=self.rt.compute_dtype, optimized=self.rt.graphs.folder)
            return self._sessions[key]

    def needed(self) -> list[str | tuple]:
        """The graphs every run of this model uses, opened at a server's start (`open`): the walk's own, the attend
        graphs of the first run and of the page's head and line views (one head's matrix, its top-k keys), those of
        runs with edits (runtime/interventions.py: the heads' outputs alone, or with the pattern of some), and for
        either mask the supersets that serve every other combination of outputs."""
        causal = self.rt.cfg.causal
        exact = [("attend", ROWS, causal), ("attend", ROWS + ("thumbnail",), causal),
                 ("attend", ROWS + ("thumbnail_even",), causal),
                 ("attend", Want(attention=True).block_outputs(), causal),
                 ("attend", Want(top_k=1).block_outputs(), causal),          # k is a graph input
                 ("attend", (), causal)]
        supersets = [superset(("attend", thumbnail, c)) for c in (causal, not causal)
                     for thumbnail in ((), ("thumbnail",), ("thumbnail_even",))]
        if self.fused:                  # the walk's blocks as one graph each (interventions still run the three)
            exact += [("layer", *which[1:]) for which in exact[:5]]
            supersets += [("layer", *which[1:]) for which in supersets]
        exact += [("attend_block", ROWS, causal), ("attend_block", ROWS + ("thumbnail",), causal),   # a long text's,
                  ("attend_block", ("thumbnail",), causal)]   # and its head view's overview (a head's block means)
        supersets += [superset(("attend_block", thumbnail, c)) for c in (causal, not causal)
                      for thumbnail in ((), ("thumbnail",))]
        exact += [("weights_block", ("attention",), c) for c in (causal, not causal)]   # rows and tiles asked later
        wide = ["wide_block_in", "wide_block_out"] if self.rt.capabilities.widened else []
        logits = ["final_logits"] if self.rt.cfg.lm_head else []          # an encoder has no LM head
        return ["embed", "block_in", "block_kv", "block_out", *wide, "final", "final_norm", *logits,
                *dict.fromkeys(exact + supersets)]

    def open(self, step: Callable[[int, int], None] | None = None) -> None:
        """Build and open every graph in `needed` (in memory, a fraction of a second each), so that no run waits
        for one or builds one; step(done, total) after each."""
        todo = self.needed()
        for n, which in enumerate(todo):
            self.session(which)
            if step:
                step(n + 1, len(todo))
        self.opened = True

    def layer_mask(self, layer: int, mask: np.ndarray) -> np.ndarray:
        """The additive mask layer `layer` attends with: TransformerBlock.local_mask, the run's mask plus a local
        layer's sliding-window band (the stacked graph builds the same band from positions, graphs/steps.py)."""
        block = self.rt.model.blocks[layer]
        if not block.window:
            return mask
        T = mask.shape[-1]
        return np.ascontiguousarray(block.local_mask(mask, mask.shape[-2], T), COMPUTE)

    def run_graph(self, which, feeds: dict[str, np.ndarray | Held], outputs: list[str], release: bool = False,
                  layer: int | None = None, keep: tuple[str, ...] = ()):
        """One session run -> {output: array}; layer: whose weights a block graph binds. release: give the session's
        memory arena back afterwards; keep: outputs the walk feeds to its next graph, left on the device (Held:
        the residual stream, q, k, v, the heads' outputs). A superset's inputs that this run does not read get
        neutral values (unread)."""
        sess, axes = self.session(which, layer), run_axes(feeds)
        missing = sess.inputs - set(sess.bound) - feeds.keys()
        if missing:
            feeds = feeds | unread_inputs(sess, missing, axes["tokens"])
        return dict(zip(outputs, sess.run(outputs, feeds, layer=layer, release=release, keep=keep, axes=axes)))

    def run_block(self, which, feeds: dict[str, np.ndarray], outputs: list[str], ctx: np.ndarray | None = None
                  ) -> list:
        """One block of queries through a block attend graph (runtime/blocks.py): its heads' outputs written into
        ctx (a view of the layer's; None: not asked); a superset's inputs this run does not read get neutral values
        of the block's shapes."""
        sess = self.session(which)
        missing = sess.inputs - set(sess.bound) - feeds.keys()
        if missing:
            tq, tk = feeds["q"].shape[2], feeds["k"].shape[2]
            neutral = {"heads": np.zeros(0, np.int64), "top_k": np.ones(1, np.int64), "local_window": np.ones(1, np.int64),
                       "value_norms": np.ones((1, 1, tk), COMPUTE),
                       "pool": np.zeros((tq, 1), COMPUTE), "pool_keys": np.zeros((tk, 1), COMPUTE),
                       **dict(zip(("cell_keys", "cell_weights"), NO_CELLS)),
                       "keys_punctuation": np.zeros(tk, COMPUTE)}
            feeds = feeds | {n: neutral.get(n, np.zeros((tq, tk), COMPUTE)) for n in missing}
        return self.session(which).run(outputs, feeds, into=None if ctx is None else {"ctx": ctx})

    def masks(self, mask: np.ndarray) -> Callable[[int], Held]:
        """layer -> the mask it attends with (layer_mask), placed on the device once per window for the whole walk."""
        placed: dict[int | None, Held] = {}

        def of(layer: int) -> Held:
            window = self.rt.model.blocks[layer].window
            if window not in placed:
                placed[window] = hold(self.layer_mask(layer, mask), self.rt.weights.device)
            return placed[window]
        return of

    def _block(self, layer: int, x: np.ndarray | Held, inputs: dict, outputs: tuple[str, ...], causal: bool,
               extra: dict, masks: Callable[[int], Held], heads=(), top_k: int = 0, next_x: bool = True,
               release: bool = False, blocks: Callable[[int], BlockedLayer] | None = None, exact: tuple = ()
               ) -> dict[str, np.ndarray | Held]:
        """Block `layer` on x [1, T, D]: the attention outputs asked, group of heads by group (one group's
        probabilities exist at a time), and with next_x the residual stream after the block, "x_next" (Held: on the
        device). The per-head outputs are those of `heads` (none: empty), in their order. extra: the attend graph's
        other inputs (placed once per walk); masks: each layer's mask (Layerwise.masks)."""
        T, H = x.shape[1], self.rt.cfg.n_heads
        heads = np.asarray(heads, np.int64)
        after = {"lengths": inputs["lengths"], "head_mask": np.ascontiguousarray(inputs["head_mask"][:, layer]),
                 "head_mean": np.ascontiguousarray(inputs["head_mean"][:, layer])}          # block_out's inputs
        top_k = np.array([min(max(top_k, 1), T)], np.int64)
        groups = head_groups(H, self.groups(T))      # one on a GPU: q, k, v and ctx never leave it
        if self.fused and len(groups) == 1 and blocks is None and not exact:  # the block as one graph
            out = self.run_graph(("layer", outputs, causal), {"x": x, "attention_mask": masks(layer), "heads": heads,
                                                              "top_k": top_k, **extra, **after},
                                 ["x_next", *outputs], release, layer, keep=("x_next",))
            if not next_x:
                del out["x_next"]
            return out
        chunks = blocks and tokenwise(self, T)                  # per-token graphs in runs of tokens
        if exact and chunks and not (outputs or next_x):     # rows or a tile alone: q at theirs, k, v to their keys
            qkv, arrays = None, exact_qkv(self, layer, x, chunks, causal, *exact[1:3], release)
        else:
            qkv = by_tokens(self, "block_in", {"x": x}, list("qkv"), chunks, layer, release)
            arrays = exact and tuple(qkv[n].host() for n in "qkv")
        if VALUE_ROW in outputs and blocks is None:  # each key's value norm [1, H, T] (a block's: BlockedLayer.run);
            v = qkv["v"].array if qkv["v"].array is not None else qkv["v"].host()   # the CPU's v is host memory
            extra = extra | {"value_norms": value_norms(self.rt, layer, v[0])[None]}
        exact = exact and {name: value[None] for name, value in exact_parts(
            self, layer, *arrays, heads, causal, *exact).items()}   # (hidden, ..., view)
        if not (outputs or next_x):                  # rows or a tile alone: no other attention to compute
            out = {"ctx": None}
        elif blocks is not None:                     # a long text: blocks of queries (runtime/blocks.py)
            out = blocks(layer).run(*(qkv[n].host() for n in "qkv"), outputs, heads, int(top_k[0]))
        else:
            out = self._groups(layer, qkv, outputs, causal, extra, masks, heads, top_k, groups, release)
        out |= exact or {}
        if next_x:                                   # a mean ablation's mean is over every token: in one run
            out["x_next"] = by_tokens(self, "block_out", {"x": x, "ctx": out["ctx"], **after}, ["x_next"], None if
                                      after["head_mean"].any() else chunks, layer, release)["x_next"]
        del out["ctx"]
        return out

    def _groups(self, layer, qkv, outputs, causal, extra, masks, heads, top_k, groups, release) -> dict:
        """A layer's attention group of heads by group: ctx and the outputs asked, the asked heads in their order."""
        parts, order = {name: [] for name in ("ctx",) + outputs}, []
        for n, (a, b) in enumerate(groups):
            mine = heads[(heads >= a) & (heads < b)]
            order += mine.tolist()
            feeds = {name: qkv[name] if len(groups) == 1 else np.ascontiguousarray(qkv[name].array[:, a:b])
                     for name in "qkv"}
            feeds |= {"attention_mask": masks(layer), "heads": mine - a, "top_k": top_k, **extra}
            if "value_norms" in extra and len(groups) > 1:
                feeds["value_norms"] = np.ascontiguousarray(extra["value_norms"][:, a:b])
            out = self.run_graph(("attend", outputs, causal), feeds, list(parts), release and n == len(groups) - 1,
                                 keep=("ctx",))
            for name, value in out.items():
                parts[name].append(value)
        out = {name: values[0] if len(values) == 1 else
               np.concatenate([v.array if isinstance(v, Held) else v for v in values], axis=1)
               for name, values in parts.items()}
        if order != heads.tolist():          # the groups gave the asked heads group by group: back to their order
            back = [order.index(h) for h in heads.tolist()]
            out |= {name: out[name][:, back] for name in ("attention", "top_weights", "top_keys", "duplicate")
                    if name in out}
        return out

    def done_with(self, layer: int | None) -> None:
        """A model too big to run whole (Capabilities.release) gives a layer's weight pages back when the walk is done
        with it (None: the others): a run maps about two layers' weights at a time (sources/store.release)."""
        if self.rt.capabilities.release:
            if layer is None and self._reader is not None:
                self._reader.join()                  # read ahead and done with: nothing maps them again after
            release(self._arrays(layer))

    def read_ahead(self, layer: int | None) -> None:
        """A model too big to run whole (Capabilities.release) reads layer `layer`'s weights (None: those the final
        graph binds, not an untied embedding) from disk in a thread of its own while the walk computes the layer
        before (sources/store.read): an 8B bf16 request from a cold page cache, 19 s -> 11-12 s."""
        if not self.rt.capabilities.release:
            return
        if self._reader is not None:
            self._reader.join()                      # one layer ahead at most: about two layers' pages mapped
        arrays = self._arrays(layer) if layer is not None else \
            [self.rt.weights.array(name) for name in self.session("final").bound]
        self._reader = threading.Thread(target=read, args=(arrays,), daemon=True, name="attnscope-read-ahead")
        self._reader.start()

    def _arrays(self, layer: int | None) -> list[np.ndarray]:
        """Layer `layer`'s arrays, or (None) the model's others: the embedding, the final norm and the LM head."""
        w = self.rt.weights
        return list(w.layer(layer).values()) if layer is not None else \
            [a for name, a in w.named.items() if not name.startswith("blocks.")]

    def _walk_inputs(self, T: int, causal: bool, mask_tokens, keys: TextKeys, thumbs: int, rows):
        """What a walk's attention reads besides q, k, v: (the run's mask [1, 1, T, T], the attend graphs' other
        inputs placed once, layer -> its mask, None) for the groups of heads; for a text long enough for blocks of
        queries (runtime/blocks.py), no [T, T] at all: (None, {}, None, layer -> its BlockedLayer)."""
        rt = self.rt
        if blocked(T, self.group_mb * 2**20):
            hidden = hidden_keys(T, mask_tokens)
            pool = thumbnails_.pooling_matrix(T, thumbs) if thumbs else None
            return None, {}, None, lambda layer: BlockedLayer(self, layer, T, causal, hidden, keys, pool)
        mask = rt.build_mask([T], causal, [mask_tokens] if mask_tokens else None)
        extra = ({"pool": thumbnails_.pooling_matrix(T, thumbs)} if thumbs else {}) | key_feeds(keys, T, rows)
        extra = {name: hold(value, rt.weights.device) for name, value in extra.items()}   # once, for every layer
        return mask, extra, self.masks(mask), None

    # ---- running ----------------------------------------------------------------------------
    # A walk over the layers (forward, recompute) runs the same attention graph for every layer and group of heads
    # it visits, those it asks nothing of getting empty head selections: so onnxruntime's memory arena hands the
    # same buffers from one to the next (fresh 151 MB buffers at 2048 tokens, page-faulted in each time, made a
    # layer ~60 % slower without the arena), and the walk's last step gives the arena back.
    def forward(self, enc: Encoding, *, causal: bool | None = None, mask_tokens=None, head_mask=None,
                head_mean=None, want: Want = Want(), top_k: int = 10, progress: Progress | None = None,
                started: float | None = None) -> LayerwiseResult:
        """Run one encoded text layer by layer; keep the rows, checkpoints and thumbnails at want.resolution, and
        what `want` asks of its heads (result.asked). Options as in Runtime.run."""
        t0 = time.perf_counter() if started is None else started
        rt, cfg = self.rt, self.rt.cfg
        causal = cfg.causal if causal is None else bool(causal)
        L, H, T = cfg.n_layers, cfg.n_heads, len(enc.ids)
        ids, types = np.array([enc.ids], np.int64), np.array([enc.type_ids], np.int64)
        thumbs = want.resolution if want.resolution and T > want.resolution else 0
        keys = TextKeys.of(enc, cfg)
        kept = kept_rows(keys) if want.rows else ()
        mask, extra, masks, blocks = self._walk_inputs(T, causal, mask_tokens, keys, thumbs, kept + (
            ("duplicate",) if want.duplicate else ()))
        inputs = rt.feeds(ids, types, mask, [T], head_mask, head_mean)     # validated; head masks [1, L, H]
        outputs = kept + ((thumbnail_output(T, thumbs),) if thumbs else ()) + want.block_outputs()
        rows = {name: np.empty((L, H, T - 1 if name in ("previous", "next") else T), COMPUTE) for name in kept}
        checkpoints, thumbnails, asked = {}, {}, Asked(tuple(want.heads))
        with self.busy:
            x = self.run_graph("embed", inputs, ["x"], release=True, keep=("x",))["x"]
            keep_at = kept_layers(L, self.every, want.layers)
            for layer in range(L):
                if layer in keep_at:
                    checkpoints[layer] = x          # stays where it is: the next block writes a new x
                heads = want.heads if layer in want.layers else ()
                self.read_ahead(layer + 1 if layer + 1 < L else None)
                out = self._block(layer, x, inputs, outputs, causal, extra, masks, heads, want.top_k,
                                  release=layer == L - 1, blocks=blocks, exact=heads and _exact(want, T, mask_tokens))
                x = out.pop("x_next")
                self.done_with(layer)
                for name in kept:
                    rows[name][layer] = out.pop(name)[0]
                if thumbs:
                    thumbnails[layer] = out.pop(thumbnail_output(T, thumbs))[0]
                if heads:
                    _keep(asked, layer, out)
                if progress:
                    progress(layer + 1, L)
            final = final_parts(self, x, inputs, tokenwise(self, T, final=True), want.logprobs)
            self.done_with(None)
        res = LayerwiseResult(
            rt.spec.id, "onnx", self.session("final").get_providers()[0], causal, enc, final["hidden"][0], rows,
            visible_counts(T, causal, hidden_keys(T, mask_tokens)) if blocks else visible_keys(mask[0, 0]),
            checkpoints, {thumbs: thumbnails} if thumbs else {}, {k: inputs[k] for k in ("head_mask", "head_mean")},
            sorted(set(mask_tokens)) if mask_tokens else [], time.perf_counter() - t0,
            asked=asked if want.block_outputs() or want.exact() else None)
        if cfg.lm_head:
            logits = final["next_token_logits"][0]
            res.next_token_logits, res.next_tokens = logits, rt.top_tokens(logits, top_k)
            res.token_logprobs = ([None] + final["token_logprobs"][0, 1:].astype(float).tolist() if want.logprobs
                                  else None)
        return res

    def recompute(self, base: LayerwiseResult, want: Want, progress: Progress | None = None) -> LayerwiseResult:
        """`base` with what `want` asks that it lacks: the asked heads' parts (as result.asked) and thumbnails at
        a new resolution, computed from the checkpoints (an asked layer's own input, blocks.kept_layers; else at most
        2 checkpoint_every - 1 blocks from the one below)."""
        t0 = time.perf_counter()
        rt, enc = self.rt, base.encoding
        T = len(enc.ids)
        R = want.resolution if want.resolution and T > want.resolution else 0
        have = base.thumbnails.get(R, {})
        thumb_layers = {l for l in want.layers if l not in have} if R else set()
        head_layers = set(want.layers) if want.block_outputs() or want.exact() else set()
        steps = _walk(sorted(thumb_layers | head_layers), sorted(base.checkpoints))
        mask, extra, masks, blocks = self._walk_inputs(T, base.causal, base.mask_tokens, TextKeys.of(enc, rt.cfg),
                                                       R if thumb_layers else 0,
                                                       ("duplicate",) if want.duplicate else ())
        inputs = rt.feeds(np.array([enc.ids]), np.array([enc.type_ids]), mask, [T], base.inputs["head_mask"],
                          base.inputs["head_mean"])
        thumb = thumbnail_output(T, R) if thumb_layers else None
        outputs = ((thumb,) if thumb else ()) + want.block_outputs()
        asked, thumbnails = Asked(tuple(want.heads)), dict(have)
        with self.busy:
            x = None
            for n, (layer, start) in enumerate(steps):
                if start:
                    x = base.checkpoints[layer]
                heads = want.heads if layer in head_layers else ()
                goes_on = n + 1 < len(steps) and not steps[n + 1][1]      # the next step starts from this x_next
                out = self._block(layer, x, inputs, outputs, base.causal, extra, masks, heads, want.top_k,
                                  next_x=goes_on, release=n == len(steps) - 1, blocks=blocks,
                                  exact=heads and _exact(want, T, base.mask_tokens))
                x = out.pop("x_next", None)
                self.done_with(layer)
                if thumb:                  # every layer the walk visits: cheap, and kept for later requests
                    thumbnails[layer] = out.pop(thumb)[0]
                if heads:
                    _keep(asked, layer, out)
                if progress:
                    progress(n + 1, len(steps))
        return replace(base, thumbnails=base.thumbnails | ({R: thumbnails} if R else {}),
                       asked=asked if want.block_outputs() or want.exact() else None, seconds=time.perf_counter() - t0)


# What any request may ask of an attend graph beyond its rows (graphs/reductions.py OUTPUTS): a superset graph
# computes them all, for the asked heads (none: empty), and a run reads the outputs it asked for.
ASKABLE = ("attention", "top_weights", "top_keys", "duplicate")


def superset(which: tuple) -> tuple:
    """The attend graph opened at start that serves ("attend", outputs, causal): every row, every askable output,
    and the thumbnail output asked (the two kinds read their pool input differently: one superset each); a layer
    graph's likewise."""
    kind, outputs, causal = which
    if kind == "weights_block":       # the weights alone (runtime/blocks.exact_parts): opened as they are
        return which
    thumbnail = tuple(name for name in ("thumbnail", "thumbnail_even") if name in outputs)
    if len(thumbnail) > 1:
        raise ValueError("an attend graph has one kind of thumbnail output")
    if kind == "attend_block":        # a block of queries pools one way (runtime/blocks.py)
        thumbnail = thumbnail and ("thumbnail",)
    served = ROWS + PAIR_ROWS + thumbnail + ASKABLE
    unknown = set(outputs) - set(served)
    if unknown:
        raise ValueError(f"no attend graph computes {sorted(unknown)}")
    return (kind, served, causal)


def _exact(want: Want, T: int, mask_tokens) -> tuple:
    """What runtime/blocks.exact_parts needs besides a layer's q, k, v: (hidden keys, queries, tile, view); ()."""
    return (hidden_keys(T, mask_tokens), want.queries, want.tile, want.view) if want.exact() else ()


def _keep(asked: Asked, layer: int, out: dict[str, np.ndarray]) -> None:
    """File a block's per-head outputs under its layer (batch axis dropped; top-k key indices as int32)."""
    for name, value in out.items():
        value = value[0]
        getattr(asked, name)[layer] = value.astype(np.int32) if name == "top_keys" else value
