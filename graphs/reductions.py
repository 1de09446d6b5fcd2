"""Reductions of a group of heads' attention probabilities p [B, h, T, T] inside the attend graph (graphs/layers.py),
so that a layer-by-layer run keeps these and never p itself:

    rows         the registry's per-query rows (analysis/statistics.py GRAPH_ROWS): each row's `reduce(r)` calls one
                 method of Reductions below, so the graph computes exactly what the row's NumPy form computes
    thumbnail    block means of every head [B, h, R, R] (analysis/thumbnails.downsample): pool^T p pool
    a block of queries (`block`: runtime/blocks.py): p is [B, h, Tq, Tk], the rows of queries q0.. over keys k0..
                 (input offsets [2] = q0, k0; input total [1] = T); every row is that of the whole text's p (a key
                 outside the block has weight 0 for these queries), the thumbnail a part to add (pool [Tq, Rq]: the
                 pooling matrix's rows and cells these queries touch; pool_keys [Tk, Rk], its rows and cells these
                 keys touch, or for many cells cell_keys and cell_weights [Rk, S]: each cell's keys, gathered)
    attention    the probabilities of the heads asked (input heads [n], indices in this group) [B, n, T, T]
    top_weights  the k largest weights of each row of those heads (input top_k [1]) [B, n, T, k]
    top_keys     their key indices [B, n, T, k]
    ASKED_ROWS   rows computed for the asked heads only (the duplicate-token score's), [B, n, T]
    run rows     local (input local_window [1]: the keys |i - j| < w) and value_weighted_first (input value_norms
                 [B, h, Tk], each key's ||v_j W_O^h||, unless the graph computes them: a whole layer's, build_layer)

Written for speed over a layer's T^2 numbers (bench/long_input.py measures it): every full pass costs, Log most, so
entropy is -sum p log p through log p_ij = m_ij - lse_i without a Log per entry, the diagonals are strided slices of
the flattened p, and every key-vector product (the thumbnail's pooling, the positions of a causal distance, the
punctuation keys) rides on one matrix product.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ..analysis.statistics import GRAPH_ROWS
from .builder import FLOAT, INT, Graph

EXTRAS = {
    "thumbnail": "block means of every head [B, h, R, R]: pool^T p pool (input pool [T, R])",
    "thumbnail_even": "the same when R divides T (equal blocks: p pool is a sum over a reshape)",
    "attention": "the probabilities of the heads asked (input heads [n], indices in this group) [B, n, T, T]",
    "top_weights": "the k largest weights of each row of those heads (input top_k [1]) [B, n, T, k]",
    "top_keys": "their key indices [B, n, T, k]",
}
ASKED_ROWS = ("duplicate",)            # its key set is a [T, T] input: computed for the asked heads only
VALUE_ROW = "value_weighted_first"     # the row that reads the keys' value norms (input value_norms [B, h, Tk])
OUTPUTS = {name: row.meaning + (" (the asked heads)" if name in ASKED_ROWS else "")
           for name, row in GRAPH_ROWS.items()} \
    | EXTRAS
LAST = np.iinfo(np.int64).max


def key_input(keyset: str) -> str:
    """The graph input that carries a text's key set (statistics.TextKeys): [T] for a key vector, else [T, T]."""
    return f"keys_{keyset}"


class Reductions:
    """The reductions of probs [B, h, T, T] (and of the masked scores it is the softmax of) that a row may ask for.

    `columns` names the key vectors that p is multiplied with, all in one MatMul made when the first is used:
    "pool" [T, R] (thumbnails), "positions" (a causal distance), "punctuation" [T] (a graph input)."""

    def __init__(self, g: Graph, probs: str, masked: str, T: str, causal: bool, columns: tuple[str, ...] = (),
                 block: bool = False, values: str | None = None):
        self.g, self.probs, self.masked, self.T, self.causal = g, probs, masked, T, causal
        self.values = values                   # the keys' value norms [B, h, Tk] where the graph computes them
        self.columns, self._product, self._cache, self.block = tuple(columns), None, {}, block
        self.last_axis = g.const(np.array([-1]))
        if block:
            offsets = g.input("offsets", INT, [2])
            self.q0, self.k0 = g.slice(offsets, 0, 1, 0), g.slice(offsets, 1, 2, 0)
            self.total = g.input("total", INT, [1])
            self.Tk = g.op("Shape", probs, start=3, end=4)

    def _once(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # ---- the rows' primitives (analysis/statistics.py) ----------------------------------------------------
    def max_weight(self) -> str:
        return self.g.op("Squeeze", self._top(), self.last_axis)

    def entropy(self) -> str:
        """statistics.entropy: log p_ij = m_ij - m_i* + log p_i* (the row's max m and max p are at the same key), so
        with sum_j p_ij = 1: -sum_j p log p = sum_j p_ij (m_i* - m_ij) - log p_i*; every term >= 0, nothing cancels,
        no Log per entry. Operands are ordered so that onnxruntime may write each step over the one before: the
        layer holds two [H, T, T] buffers, masked and probs."""
        g = self.g
        below = g.op("Sub", self.masked, g.op("ReduceMax", self.masked, axes=[-1], keepdims=1))    # m_ij - m_i* <= 0
        spread = g.op("ReduceSum", g.op("Mul", below, self.probs), self.last_axis, keepdims=1)  # masked: huge * 0
        return g.op("Squeeze", g.op("Neg", g.op("Add", spread, g.op("Log", self._top()))), self.last_axis)

    def column(self, key: int) -> str:
        """p[:, key] for every query (key -1: the last); made once (the first key's column serves two rows)."""
        def make():
            if self.block:
                g = self.g
                at = g.const(np.array([key])) if key >= 0 else g.op("Sub", self.total, g.const(np.array([1])))
                return self._at(g.op("Expand", at, self.T))
            end = key + 1 if key >= 0 else LAST
            return self.g.op("Squeeze", self.g.slice(self.probs, key, end, 3), self.g.const(np.array([3])))
        return self._once(("column", key), make)

    def diagonal(self, offset: int) -> str:
        """p[i, i + offset] for the queries that have that key: a strided slice of the flattened p, whose (i, i + d)
        entry is at i (T + 1) + d. A block's: [B, h, Tq], 0 where the query has no such key (runtime/blocks.py
        cuts those queries off)."""
        g, T = self.g, self.T
        if self.block:
            return self._at(g.op("Add", self._query_ints(), g.const(np.array([offset]))))
        flat = self._flat()
        TT = self._once("TT", lambda: g.op("Mul", T, T))
        if offset >= 0:
            start = g.const(np.array([offset]))
            end = g.op("Sub", TT, g.op("Mul", T, g.const(np.array([offset])))) if offset else TT
        else:
            start, end = g.op("Mul", T, g.const(np.array([-offset]))), TT
        step = self._once("step", lambda: g.op("Add", T, g.const(np.array([1]))))
        return g.op("Slice", flat, start, end, g.const(np.array([2])), step)

    def distance(self) -> str:
        """sum_j p_ij |i - j|; under a causal mask (no query sees a later key) i - sum_j p_ij j, one matrix-vector
        product away."""
        g = self.g
        if self.causal:
            return g.op("Sub", self._query_positions(), self._part("positions"))
        return g.op("ReduceSum", g.op("Mul", self.probs, self._apart()), self.last_axis, keepdims=0)

    def local(self) -> str:
        """sum_j p_ij over |i - j| < w, the window w an input (local_window [1]: statistics.local_window): the band
        of each query's keys i - w < j < i + w (under a causal mask j <= i), [Tq, 2w - 1] numbers a query gathered
        from the flattened p (_at) and not its whole row (a full pass over p costs as much as a row,
        bench/long_input.py)."""
        g, zero, one = self.g, self.g.const(np.array([0])), self.g.const(np.array([1]))
        w = g.input("local_window", INT, [1])
        last = zero if self.causal else g.op("Sub", w, one)
        offsets = g.op("Range", g.op("Squeeze", g.op("Sub", one, w), zero), g.op("Squeeze", g.op("Add", last, one), zero),
                       g.const(np.int64(1)))                                                        # [W]
        band = g.op("Add", g.op("Unsqueeze", self._query_ints(), one), g.op("Unsqueeze", offsets, zero))  # [Tq, W]
        return g.op("ReduceSum", self._at(band, band=True), self.last_axis, keepdims=0)              # [B, h, Tq]

    def value_weighted(self, key: int) -> str:
        """p_i,key n_key / sum_j p_ij n_j, n the keys' value norms ||v_j W_O^h|| [B, h, Tk] (`values`: computed in
        this graph, graphs/steps.value_norms; else the input value_norms); the first key only (a block's k0 > 0:
        its p_i0 is 0, so the norm gathered at its first key multiplies 0)."""
        if key != 0:
            raise ValueError("value-weighted rows are computed in the graphs at the first key only")
        g = self.g
        n = self.values or g.input("value_norms", FLOAT, ["batch", "heads", "tokens"])
        three = g.const(np.array([3]))
        total = (self._part("value_norms") if "value_norms" in self.columns else
                 g.op("Squeeze", g.op("MatMul", self.probs, g.op("Unsqueeze", n, three)), three))   # [B, h, Tq]
        return g.op("Div", g.op("Mul", self.column(0), g.op("Gather", n, g.const(np.array([0])), axis=2)), total)

    def marked(self, keyset: str) -> str:
        """sum_j p_ij over the keys the text marks: a key vector (punctuation) rides on the shared product; a
        per-query key set [T, T] (the other sentence, earlier copies of the token) is a graph input multiplied in."""
        if keyset in self.columns:
            return self._part(keyset)
        marks = self.g.input(key_input(keyset), FLOAT, ["tokens", "tokens"])
        return self.g.op("ReduceSum", self.g.op("Mul", self.probs, marks), self.last_axis, keepdims=0)

    # ---- thumbnails ----------------------------------------------------------------------------------------------
    def thumbnail(self) -> str:
        """analysis.thumbnails.downsample: block means, pool^T p pool (pool[t, r] = 1/|block r| on block r's tokens).
        A block of queries pools its keys either way, as the run feeds it (runtime/blocks.py CELLS_GATHERED): by the
        product with pool_keys [Tk, Rk] (then cell_keys is [0, 1]) or by cells (_cells; then pool_keys is [Tk, 0])."""
        g = self.g
        pool = g.input("pool", FLOAT, ["tokens", "cells"])
        keys = g.op("Concat", self._part("pool"), self._cells(), axis=-1) if self.block else self._part("pool")
        return g.op("MatMul", g.op("Transpose", pool, perm=[1, 0]), keys)

    def _cells(self) -> str:
        """A block's p pool over its keys, [B, h, Tq, Rk]: each cell's keys gathered (input cell_keys [Rk, S], offsets
        from k0; a cell of fewer than S keys in the block padded) and summed, each times 1/|cell| (input cell_weights
        [Rk, S], 0 on the padding). A product by the pooling matrix's [Tk, Rk] rows costs 2 Rk FLOP per weight and a
        [Tk, Rk] copy per block (a 32k-token text drawn at 512 cells: ~1 TFLOP a head); this costs three passes over
        the block, more than the product of a few cells."""
        g = self.g
        keys = g.input("cell_keys", INT, ["cells", "cell_size"])
        weights = g.input("cell_weights", FLOAT, ["cells", "cell_size"])
        gathered = g.op("Gather", self.probs, keys, axis=3)                                   # [B, h, Tq, Rk, S]
        return g.op("ReduceSum", g.op("Mul", gathered, weights), self.last_axis, keepdims=0)

    def _at(self, keys: str, band: bool = False) -> str:
        """p[i, keys[i]] of each query i, keys positions in the text: [Tq] (one key a query) -> [B, h, Tq], or with
        `band` [Tq, W] (W keys a query) -> [B, h, Tq, W]; gathered from the flattened p (a block's: its queries'
        rows, its keys from k0), 0 where a key is outside p's keys (read clipped, then multiplied by 0: a key before
        the text or after it, or outside a block's keys, hidden from the query, whose weight is 0 in the whole text's
        p too)."""
        g, zero, one = self.g, self.g.const(np.array([0])), self.g.const(np.array([1]))
        Tk, k0 = (self.Tk, self.k0) if self.block else (self.T, zero)
        rel = g.op("Sub", keys, k0)
        inside = g.cast_float(g.op("And", g.op("GreaterOrEqual", rel, zero), g.op("Less", rel, Tk)))
        rel = g.op("Min", g.op("Max", rel, zero), g.op("Sub", Tk, one))
        rows = g.op("Mul", g.op("Range", g.const(np.int64(0)), g.op("Squeeze", self.T, zero), g.const(np.int64(1))),
                    Tk)                                                         # [Tq]: each query's row in the flat p
        if band:
            rows = g.op("Unsqueeze", rows, one)                                                       # [Tq, 1]
        picked = g.op("Gather", self._flat(), g.op("Add", rows, rel), axis=2)
        return g.op("Mul", picked, inside)

    def thumbnail_even(self) -> str:
        """The same when R divides T: each key block is b tokens, and p pool a sum over a reshape (no product)."""
        g = self.g
        pool = g.input("pool", FLOAT, ["tokens", "cells"])
        R = g.op("Shape", pool, start=1, end=2)
        b = g.op("Div", self.T, R)
        blocks = g.op("Reshape", self.probs, g.op("Concat", g.const(np.array([0, 0])), self.T, R, b, axis=0))
        pooled = g.op("Div", g.op("ReduceSum", blocks, self.last_axis, keepdims=0), g.cast_float(b))  # [B, h, T, R]
        return g.op("MatMul", g.op("Transpose", pool, perm=[1, 0]), pooled)

    # ---- the asked heads -------------------------------------------------------------------------------------------
    def asked(self) -> "Reductions":
        """The same reductions of the heads asked for (input heads [n]: indices within this group)."""
        def make():
            g = self.g
            heads = g.input("heads", INT, ["asked"])
            return Reductions(g, g.op("Gather", self.probs, heads, axis=1), g.op("Gather", self.masked, heads, axis=1),
                              self.T, self.causal, block=self.block)
        return self._once("asked", make)

    def top_k(self) -> tuple[str, str]:
        """analysis.thumbnails.top_keys: the k heaviest keys of each row, ties to the lower key (TopK's order)."""
        g = self.g
        weights, keys = g.name("top_weights"), g.name("top_keys")
        g.nodes.append(helper.make_node("TopK", [self.probs, g.input("top_k", INT, [1])],
                                        [weights, keys], axis=-1, largest=1, sorted=1))
        return weights, keys

    # ---- shared intermediates ------------------------------------------------------------------------------------
    def _flat(self) -> str:
        """p flattened per head, [B, h, Tq * Tk]: entry (i, j) at i Tk + j."""
        return self._once("flat", lambda: self.g.op("Reshape", self.probs, self.g.const(np.array([0, 0, -1]))))

    def _top(self) -> str:
        return self._once("top", lambda: self.g.op("ReduceMax", self.probs, axes=[-1], keepdims=1))   # [B, h, T, 1]

    def _positions(self) -> str:
        """The keys' positions in the text, float [Tk] (a block's start at k0)."""
        g = self.g
        if self.block:
            return self._once("positions", lambda: g.cast_float(g.op("Range", g.op("Squeeze", self.k0, g.const(
                np.array([0]))), g.op("Squeeze", g.op("Add", self.k0, self.Tk), g.const(np.array([0]))),
                g.const(np.int64(1)))))
        return self._once("positions", lambda: g.cast_float(g.op(
            "Range", g.const(np.int64(0)), g.op("Squeeze", self.T, g.const(np.array([0]))), g.const(np.int64(1)))))

    def _apart(self) -> str:
        """|i - j| of each query and key, float [Tq, Tk]."""
        g, one, zero = self.g, self.g.const(np.array([1])), self.g.const(np.array([0]))
        return self._once("apart", lambda: g.op("Abs", g.op("Sub", g.op("Unsqueeze", self._query_positions(), one),
                                                            g.op("Unsqueeze", self._positions(), zero))))

    def _query_positions(self) -> str:
        """The queries' positions in the text, float [Tq]: the keys' (a square p), or a block's from q0."""
        if not self.block:
            return self._positions()
        return self._once("query_positions", lambda: self.g.cast_float(self._query_ints()))

    def _query_ints(self) -> str:
        """The queries' positions, int64 [Tq] (a block's from q0)."""
        g, zero = self.g, self.g.const(np.array([0]))
        q0 = self.q0 if self.block else zero
        return self._once("query_ints", lambda: g.op("Range", g.op("Squeeze", q0, zero), g.op(
            "Squeeze", g.op("Add", q0, self.T), zero), g.const(np.int64(1))))

    def _part(self, column: str) -> str:
        """probs times one of `columns`, from the one product of them all: [B, h, T, R] for the pool, [B, h, T]
        for a key vector. The pool comes first when there is one; each vector is one column after it, in order."""
        g, n = self.g, len(self.columns)
        if self._product is None:
            one = g.const(np.array([1]))
            make = {"pool": lambda: g.input("pool_keys" if self.block else "pool", FLOAT, ["tokens", "cells"]),
                    "positions": lambda: g.op("Unsqueeze", self._positions(), one),
                    "punctuation": lambda: g.op("Unsqueeze", g.input(key_input("punctuation"), FLOAT, ["tokens"]), one)}
            parts = [make[c]() for c in self.columns if c != "value_norms"]
            if "value_norms" in self.columns:     # one key vector per head: each shared one repeated per head
                norms = g.op("Unsqueeze", g.input("value_norms", FLOAT, ["batch", "heads", "tokens"]),
                             g.const(np.array([3])))                                               # [B, h, Tk, 1]
                parts = [g.op("Expand", part, g.op("Shape", norms)) for part in parts] + [norms]
            self._product = g.op("MatMul", self.probs, parts[0] if n == 1 else g.op("Concat", *parts, axis=-1))
        if column == "pool":
            return self._product if n == 1 else g.slice(self._product, 0, 1 - n, 3)
        k = self.columns.index(column)
        part = self._product if n == 1 else g.slice(self._product, k - n, (k - n + 1) or LAST, 3)
        return g.op("Squeeze", part, g.const(np.array([3])))


def needed_columns(outputs, causal: bool, norms_input: bool = True) -> tuple[str, ...]:
    """The key vectors the shared product must hold for these outputs: the pool first, then the vectors; the value
    norms last when they are an input (norms_input: else the graph computes them, and their product is the model's
    data, graphs/reduced.py) and no pool is asked (the pool is shared by the heads: [Tk, R] copied per head would
    cost more than the pass it saves)."""
    columns = []
    if "thumbnail" in outputs:
        columns.append("pool")
    if "distance" in outputs and causal:
        columns.append("positions")
    if "punctuation" in outputs:
        columns.append("punctuation")
    if VALUE_ROW in outputs and norms_input and "pool" not in columns:
        columns.append("value_norms")
    return tuple(columns)


def reduce(r: Reductions, outputs) -> dict[str, str]:
    """Each output's graph value: the registry's rows (all heads, or the asked heads for ASKED_ROWS), the extras."""
    made = {}
    for name in outputs:
        if name in ASKED_ROWS:
            made[name] = GRAPH_ROWS[name].reduce(r.asked())
        elif name in GRAPH_ROWS:
            made[name] = GRAPH_ROWS[name].reduce(r)
        elif name in ("thumbnail", "thumbnail_even"):
            made[name] = getattr(r, name)()
        elif name == "attention":
            made[name] = r.asked().probs
        elif name in ("top_weights", "top_keys"):
            if name not in made:
                made["top_weights"], made["top_keys"] = r.asked().top_k()
        else:
            raise ValueError(f"unknown attention output {name!r}; known: {', '.join(OUTPUTS)}")
    return made
