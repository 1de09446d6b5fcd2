"""Interventions: a forward pass with edits at named sites, in NumPy (the reference the served path is tested against).

A site is a value the forward pass computes at one layer. Its name is TransformerLens' hook point's:

    residual      blocks.{layer}.hook_resid_pre       the residual stream entering the block    [T, D]
    query         blocks.{layer}.attn.hook_q          each head's queries (after RoPE)           [H, T, d_head]
    key           blocks.{layer}.attn.hook_k          the keys each query head reads             [H, T, d_head]
    value         blocks.{layer}.attn.hook_v          the values each query head reads           [H, T, d_head]
    masked        blocks.{layer}.attn.hook_attn_scores  the masked, scaled scores (pre-softmax)  [H, T, T]
    pattern       blocks.{layer}.attn.hook_pattern    the attention probabilities                [H, T, T]
    head_output   blocks.{layer}.attn.hook_z          each head's output before the output projection, [H, T, d_head]

For grouped-query models (fewer key/value heads) key and value are per *query* head: the copy of its group's key
and value that head reads, so an edit of one head's key leaves its group's other heads alone.

An Edit replaces a site's value where `where` is true by `value` (an array broadcast to the site's shape: zero, a
mean over reference texts, a value cached from another run). `where` picks positions [T] of the residual stream,
(head, position) [H, T] of query, key, value and head_output, (head, query row) [H, T] of pattern, and
(head, query, key) cells [H, T, T] of masked.
The site is named "masked" as the teaching stage is (model/transformer.py STAGES: "scores" is q . k alone, before the
scale and the mask); its hook keeps TransformerLens' name, hook_attn_scores, which means these masked scores there.
Knockout is an edit of the masked scores: MASKED on the blocked (query, key) cells, so the softmax renormalises the row's
other weights. runtime/interventions.py runs the same edits through the ONNX graphs, layer by layer, reusing the
unedited prefix; this module is their independent reference.

    edited = forward(model, ids, mask, edits)          # edits: for each text of the batch, a list of Edit
    cache = edited.cache                               # (site, layer) -> [B, ...] every site's value as computed
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .masks import MASKED
from .precision import COMPUTE
from .transformer import logits

HOOKS = {
    "residual": "blocks.{layer}.hook_resid_pre",
    "query": "blocks.{layer}.attn.hook_q",
    "key": "blocks.{layer}.attn.hook_k",
    "value": "blocks.{layer}.attn.hook_v",
    "masked": "blocks.{layer}.attn.hook_attn_scores",
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "head_output": "blocks.{layer}.attn.hook_z",
}
SITES = tuple(HOOKS)
HEAD_SITES = ("query", "key", "value", "pattern", "head_output")   # one value per head


def hook_name(site: str, layer: int) -> str:
    """The stable name of a site at a layer: hook_name("head_output", 3) == "blocks.3.attn.hook_z"."""
    return HOOKS[site].format(layer=layer)


@dataclass(frozen=True, eq=False)
class Edit:
    """Replace `site` at `layer` where `where` is true by `value`. `where` has the site's shape without its last
    axis (for masked, with it: it picks cells); value broadcasts to the site's shape."""
    site: str
    layer: int
    where: np.ndarray
    value: np.ndarray | float = 0.0

    def __post_init__(self):
        if self.site not in HOOKS:
            raise ValueError(f"unknown site {self.site!r}; sites: {', '.join(SITES)}")

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The site's value x (one text: no batch axis) with this edit made."""
        where = self.where if self.site == "masked" else self.where[..., None]
        return np.where(where, np.asarray(self.value, COMPUTE), x).astype(COMPUTE)


def knockout(layers, queries, keys, heads: int, T: int) -> list[Edit]:
    """Attention knockout (Geva et al. 2023): every head of `layers` stops reading `keys` from `queries`; each such
    query's other weights are renormalised by the softmax."""
    where = np.zeros((heads, T, T), bool)
    where[:, np.asarray(queries, int)[:, None], np.asarray(keys, int)[None, :]] = True
    return [Edit("masked", int(layer), where, MASKED) for layer in layers]


@dataclass
class Edited:
    """An edited forward pass: final hidden states (after the final norm) [B, T, D], next-token logits [B, V] of
    the last position (LM head only), and every site's value as computed, cache[(site, layer)] [B, ...]."""
    hidden: np.ndarray
    logits: np.ndarray | None
    cache: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)


def forward(model, input_ids, mask, edits: list[list[Edit]] | None = None) -> Edited:
    """The model's forward pass on input_ids [B, T] (no padding) under the additive mask [B|1, 1, T, T], with
    edits[b] made to text b: the blocks' own forward (TransformerBlock.__call__), with a hook at every site that
    makes the edits there and keeps the value."""
    ids = np.asarray(input_ids, np.int64)
    B, T = ids.shape
    edits = edits or [[] for _ in range(B)]
    cache = {}

    def editing(layer: int):
        def hook(name: str, value: np.ndarray) -> np.ndarray:   # value [B, ...] -> edited, kept
            if name not in HOOKS:                               # a teaching stage: not a site
                return value
            value = np.array(value, COMPUTE)
            for b in range(B):
                for e in edits[b]:
                    if e.site == name and e.layer == layer:
                        value[b] = e.apply(value[b])
            cache[(name, layer)] = value
            return value
        return hook

    x = model.embed(ids)                                                             # [B, T, D]
    for layer, block in enumerate(model.blocks):
        x = block(x, mask, hook=editing(layer)).x
    if model.ln_f is not None:
        x = model.ln_f(x)
    return Edited(x, logits(model, x[:, -1]) if model.cfg.lm_head else None, cache)
