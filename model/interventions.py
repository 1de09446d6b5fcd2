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

Encoder-decoders (T5, BART, Marian: model/encdec.py) run the same block (model/transformer.TransformerBlock), so their
blocks have the same sites, named within their stack -- an Edit's `stack`, "encoder" or "decoder", prefixes the hook
name: encoder.blocks.{layer}.attn.hook_z -- and a decoder block's cross-attention (queries from the decoder, keys and
values from the encoder's output, S source tokens) has its own, as TransformerLens' encoder-decoders name them:

    cross_query        decoder.blocks.{layer}.cross_attn.hook_q            [H, T, d_head]
    cross_key          decoder.blocks.{layer}.cross_attn.hook_k            [H, S, d_head]
    cross_value        decoder.blocks.{layer}.cross_attn.hook_v            [H, S, d_head]
    cross_masked       decoder.blocks.{layer}.cross_attn.hook_attn_scores  [H, T, S]
    cross_pattern      decoder.blocks.{layer}.cross_attn.hook_pattern      [H, T, S]
    cross_head_output  decoder.blocks.{layer}.cross_attn.hook_z            [H, T, d_head]

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
    edited = forward_encoder_decoder(model, ids, decoder_ids, masks, edits)   # cache: (stack, site, layer) -> [B, ...]
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
    # an encoder-decoder's decoder blocks: the cross-attention
    "cross_query": "blocks.{layer}.cross_attn.hook_q",
    "cross_key": "blocks.{layer}.cross_attn.hook_k",
    "cross_value": "blocks.{layer}.cross_attn.hook_v",
    "cross_masked": "blocks.{layer}.cross_attn.hook_attn_scores",
    "cross_pattern": "blocks.{layer}.cross_attn.hook_pattern",
    "cross_head_output": "blocks.{layer}.cross_attn.hook_z",
}
SITES = tuple(HOOKS)
HEAD_SITES = ("query", "key", "value", "pattern", "head_output")   # one value per head
CROSS_SITES = tuple(s for s in SITES if s.startswith("cross_"))     # a decoder block of an encoder-decoder's
STACKS = ("", "encoder", "decoder")       # an Edit's stack: "" a single-stack model's; an encoder-decoder's two


def hook_name(site: str, layer: int, stack: str = "") -> str:
    """The stable name of a site at a layer: hook_name("head_output", 3) == "blocks.3.attn.hook_z"; in an
    encoder-decoder's stack, hook_name("cross_head_output", 1, "decoder") == "decoder.blocks.1.cross_attn.hook_z"."""
    return (f"{stack}." if stack else "") + HOOKS[site].format(layer=layer)


@dataclass(frozen=True, eq=False)
class Edit:
    """Replace `site` at `layer` (of `stack`: "encoder" or "decoder" in an encoder-decoder) where `where` is true by
    `value`. `where` has the site's shape without its last axis (for masked and cross_masked, with it: it picks
    cells); value broadcasts to the site's shape."""
    site: str
    layer: int
    where: np.ndarray
    value: np.ndarray | float = 0.0
    stack: str = ""

    def __post_init__(self):
        if self.site not in HOOKS:
            raise ValueError(f"unknown site {self.site!r}; sites: {', '.join(SITES)}")
        if self.stack not in STACKS:
            raise ValueError(f"unknown stack {self.stack!r}: an encoder-decoder's are 'encoder' and 'decoder'")
        if self.site in CROSS_SITES and self.stack != "decoder":
            raise ValueError(f"{self.site} is a site of an encoder-decoder's decoder blocks (stack 'decoder')")

    @property
    def hook(self) -> str:
        return hook_name(self.site, self.layer, self.stack)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The site's value x (one text: no batch axis) with this edit made."""
        where = self.where if self.site in ("masked", "cross_masked") else self.where[..., None]
        return np.where(where, np.asarray(self.value, COMPUTE), x).astype(COMPUTE)


def knockout(layers, queries, keys, heads: int, T: int, S: int | None = None, *, site: str = "masked",
             stack: str = "", only=None) -> list[Edit]:
    """Attention knockout (Geva et al. 2023): every head of `layers` (or the heads `only` names) stops reading `keys`
    from `queries`; each such query's other weights are renormalised by the softmax. T queries over S keys (None: T).
    An encoder-decoder's: site "cross_masked" with stack "decoder" (decoder queries stop reading source tokens), or
    "masked" with stack "encoder" or "decoder" (a stack's self-attention)."""
    where = np.zeros((heads, T, T if S is None else S), bool)
    rows = np.arange(heads) if only is None else np.asarray(only, int)
    where[rows[:, None, None], np.asarray(queries, int)[None, :, None], np.asarray(keys, int)[None, None, :]] = True
    return [Edit(site, int(layer), where, MASKED, stack) for layer in layers]


@dataclass
class Edited:
    """An edited forward pass: final hidden states (after the final norm) [B, T, D], next-token logits [B, V] of
    the last position (LM head only), and every site's value as computed, cache[(site, layer)] [B, ...]."""
    hidden: np.ndarray
    logits: np.ndarray | None
    cache: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    token_logprobs: np.ndarray | None = None    # [B, T] an encoder-decoder's decoder tokens' (forward_encoder_decoder)


def forward(model, input_ids, mask, edits: list[list[Edit]] | None = None) -> Edited:
    """The model's forward pass on input_ids [B, T] (no padding) under the additive mask [B|1, 1, T, T], with
    edits[b] made to text b: the blocks' own forward (TransformerBlock.__call__), with a hook at every site that
    makes the edits there and keeps the value."""
    ids = np.asarray(input_ids, np.int64)
    B, T = ids.shape
    edits = edits or [[] for _ in range(B)]
    cache = {}
    x = model.embed(ids)                                                             # [B, T, D]
    for layer, block in enumerate(model.blocks):
        x = block(x, mask, hook=_editing(edits, cache, layer)).x
    if model.ln_f is not None:
        x = model.ln_f(x)
    return Edited(x, logits(model, x[:, -1]) if model.cfg.lm_head else None, cache)


def forward_encoder_decoder(model, input_ids, decoder_input_ids, masks: dict[str, np.ndarray],
                            edits: list[list[Edit]] | None = None, decoder_lengths=None) -> Edited:
    """An encoder-decoder's forward pass (model/encdec.EncoderDecoder.__call__) on input_ids [B, S] and
    decoder_input_ids [B, T] under the additive masks {encoder_mask, decoder_mask, cross_mask} (runtime/encdec.py
    EncoderDecoderRuntime.masks), with edits[b] made to text b at their (stack, site, layer). Returns the decoder's
    final hidden states, the next-token logits after each decoder text's last token [B, V], every site's value as
    computed, cache[(stack, site, layer)] [B, ...], and the decoder tokens' log-probs [B, T]."""
    B = np.asarray(input_ids).shape[0]
    edits = edits or [[] for _ in range(B)]
    cache = {}
    out = model(input_ids, decoder_input_ids, masks["encoder_mask"], masks["decoder_mask"], masks["cross_mask"],
                decoder_lengths, edit=lambda stack, layer: _editing(edits, cache, layer, stack))
    return Edited(out.hidden, out.next_token_logits, cache, out.token_logprobs)


def _editing(edits: list[list[Edit]], cache: dict, layer: int, stack: str = ""):
    """The hook of one block (`layer` of `stack`): each text's edits of a site made there, every site's value kept in
    cache, under (site, layer) ((stack, site, layer) in an encoder-decoder's stack)."""
    def hook(name: str, value: np.ndarray) -> np.ndarray:   # value [B, ...] -> edited, kept
        if name not in HOOKS:                               # a teaching stage: not a site
            return value
        value = np.array(value, COMPUTE)
        for b, row in enumerate(edits):
            for e in row:
                if e.site == name and e.layer == layer and e.stack == stack:
                    value[b] = e.apply(value[b])
        cache[(stack, name, layer) if stack else (name, layer)] = value
        return value
    return hook
