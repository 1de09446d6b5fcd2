"""What a request asks of a run's heads, on either path (Want), and what the layer-by-layer run hands back of them
(Asked): runtime/layerwise.py reads them, runtime/runtime.py's stacked run reads Want's layers and ends."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Want:
    """What leaves the device for a request, on either path (issue 38): for `layers` x `heads`, the full
    probabilities (attention), their top_k keys per query, or the per-query duplicate-token mass (head scores); and
    thumbnails of every head of `layers` at `resolution` (0: none); beyond the rows every layer-by-layer run keeps
    (rows: unless told not to).
    ends: the run's final hidden states and LM outputs; without them the stacked graph stops after the last of
    `layers` and hands back those blocks' attentions alone (Runtime.depth_of; a walk always goes to the end, its
    checkpoints serving later requests)."""
    layers: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()
    attention: bool = False
    top_k: int = 0
    duplicate: bool = False
    resolution: int = 0
    ends: bool = True
    queries: tuple[int, ...] = ()                      # full rows of these queries, of `heads` at `layers`
    tile: tuple[tuple[int, int], tuple[int, int]] | None = None   # ([qa, qb), [kc, kd)): a tile of those heads
    view: str = "weights"                              # the rows' and tile's: runtime/blocks.VIEWS
    logprobs: bool = True                              # every token's log-prob: the LM head at every position
    rows: bool = True                                  # the rows a walk keeps for every head (False: none, for a
                                                       # caller that reads only what it asked, as the retrieval finder)

    def exact(self) -> bool:
        """Whether it asks rows or a tile: recomputed exactly from q, k, v (runtime/blocks.exact_parts)."""
        return bool(self.queries) or self.tile is not None

    def block_outputs(self) -> tuple[str, ...]:
        """The attend-graph outputs these heads need (graphs/reductions.py OUTPUTS)."""
        return ((("attention",) if self.attention else ()) + (("top_weights", "top_keys") if self.top_k else ())
                + (("duplicate",) if self.duplicate else ()))


@dataclass
class Asked:
    """The per-head parts a request asked for: layer -> [n heads, ...] for `heads`, in order."""
    heads: tuple[int, ...]
    attention: dict[int, np.ndarray] = field(default_factory=dict)     # [n, T, T]
    top_weights: dict[int, np.ndarray] = field(default_factory=dict)   # [n, T, k]
    top_keys: dict[int, np.ndarray] = field(default_factory=dict)      # [n, T, k] int32
    duplicate: dict[int, np.ndarray] = field(default_factory=dict)     # [n, T]
    rows: dict[int, np.ndarray] = field(default_factory=dict)          # [n, Q, T]: Want.queries' full rows
    tile: dict[int, np.ndarray] = field(default_factory=dict)          # [n, qb - qa, kd - kc]
