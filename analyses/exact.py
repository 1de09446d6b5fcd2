"""Exact rows and tiles of a text's attention, beside whatever else POST /api/attention asks (its `queries` and
`tile`): at any length the model reads, the full rows of chosen queries [layer][head][query][T] and a query range by
a key range [layer][head][query][key], every number the whole text's softmax. A text the stacked graph runs gives them
from its matrices; a long one recomputes them from the run's checkpoints (runtime/blocks.exact_parts: the asked
layers' q, k, v, each query's row over all its visible keys), never stored."""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from ..runtime.blocks import VIEWS
from .errors import Refused
from .schemas import _bounded, Matrix, Strict

MAX_QUERIES = 64     # rows one request may ask for (each is T numbers per asked head)
# a position in the longest text a model reads (Llama 3.1's 131,072 tokens): MAX_INDEX (8,191) refused a tile past
# SmolLM2's length on Gemma 3's 32k text; the text's own length is checked in check()
Position = _bounded(0, 131_071)


class Tile(Strict):
    queries: list[Position] = Field(min_length=2, max_length=2, description="[first, end) query positions: 0-based, "
                                 "first < end <= the text's token count", examples=[[0, 8]])
    keys: list[Position] = Field(min_length=2, max_length=2, description="[first, end) key positions, likewise",
                              examples=[[0, 8]])


class ExactRequest(BaseModel):
    """The request's fields for exact rows and a tile (AttentionRequest has them)."""
    queries: list[Position] | None = Field(
        None, max_length=MAX_QUERIES, description="query positions (0-based, below the text's token count) whose "
        "full rows the answer holds in `rows` [layer][head][query][key], each over all T keys and exact at any "
        "length (a long text's are recomputed from its run's checkpoints), beside the rest of the answer; at most "
        f"{MAX_QUERIES}", examples=[[0, 3]])
    tile: Tile | None = Field(
        None, description="an exact tile of every asked head: the weights of queries [first, end) on keys [first, "
        "end), in `tile` [layer][head][query][key]; what a zoomed overview draws. Each weight is the whole row's "
        "softmax, not renormalised over the tile", examples=[{"queries": [0, 8], "keys": [0, 8]}])
    view: Literal[tuple(VIEWS)] = Field(
        "weights", description="what `rows` and `tile` hold: `weights`, the attention weights; `value_weighted`, "
        "each weight times the norm of what its key writes through the head, ||v_j W_O^h||, normalised per row "
        "(Kobayashi et al. 2020: a sink key with a small value vector costs little). Computed from the layers' q, k, "
        "v (the layer-by-layer run, at any length)")


class ExactAnswer(BaseModel):
    """The answer's fields for them (AttentionResponse has them)."""
    queries: list[int] | None = Field(None, description="with `queries`: the positions of `rows`' queries, as asked")
    rows: list[list[Matrix]] | None = Field(
        None, description="with `queries`: [layer][head][query][key] the full rows of those queries (each sums to 1)")
    tile: list[list[Matrix]] | None = Field(
        None, description="with `tile`: [layer][head][query][key] the asked tile's weights")


def check(req, T: int, layers: int, heads: int) -> int:
    """The asked positions within the text (422 naming the token count); the values the answer adds."""
    cells = 0
    for q in req.queries or ():
        if q >= T:
            raise Refused(f"queries: {q} is out of range: this text has {T} tokens (0..{T - 1})")
    cells += len(req.queries or ()) * T
    if req.tile is not None:
        for name, (a, b) in (("queries", req.tile.queries), ("keys", req.tile.keys)):
            if not a < b <= T:
                raise Refused(f"tile {name} [{a}, {b}) must be a range first < end <= {T}, this text's token count")
        cells += (req.tile.queries[1] - req.tile.queries[0]) * (req.tile.keys[1] - req.tile.keys[0])
    return cells * layers * heads


def want(req) -> dict:
    """runtime/layerwise.Want's fields for them."""
    return {"queries": tuple(req.queries or ()), "view": req.view,
            "tile": None if req.tile is None else (tuple(req.tile.queries), tuple(req.tile.keys))}


def walks(req) -> bool:
    """Whether they need the layer-by-layer run whatever the text's length: a view of the rows or tile other than
    the weights (the stacked graph gives the weights alone)."""
    return req.view != "weights" and (bool(req.queries) or req.tile is not None)


def from_matrices(req, probs: np.ndarray) -> dict:
    """From the asked heads' matrices [l, h, T, T] (the stacked graph's)."""
    out = {}
    if req.queries:
        out |= {"queries": list(req.queries), "rows": probs[:, :, list(req.queries)]}
    if req.tile is not None:
        (a, b), (c, d) = req.tile.queries, req.tile.keys
        out["tile"] = np.ascontiguousarray(probs[:, :, a:b, c:d])
    return out


def from_run(req, asked, layers: list[int]) -> dict:
    """From a layer-by-layer run's asked parts (runtime/layerwise.Asked rows and tile)."""
    out = {}
    if req.queries:
        out |= {"queries": list(req.queries), "rows": np.stack([asked.rows[layer] for layer in layers])}
    if req.tile is not None:
        out["tile"] = np.stack([asked.tile[layer] for layer in layers])
    return out
