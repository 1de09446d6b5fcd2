"""QK attribution: why a head attends where it does. One head's pre-softmax score at one cell, split exactly into
(query-side component) x (key-side component) terms.

The score of head h at (query i, key j) is the `scaled` step of /api/stages:

    score = q_i . k_j / (sqrt(d_head) * temperature),   q_i = R_i (W_Q n_i + b_Q),   k_j = R_j (W_K n_j + b_K)

where n is what the block's projections read (pre-norm: its input norm of the stream x; post-norm: x itself) and
R_p is RoPE's rotation at position p (the identity without RoPE). The stream entering the block is a sum of
components,

    x_p = embed_p (+ pos_embed_p, + type_embed_p) + sum_{l' < l} ( sum_h head_{l'h, p} + mlp_{l', p} ) + constants

(head_{l'h} = z_{l'h} W_O,h: a head's output through its columns of the output projection). A norm with its scale
frozen at the run's value is linear (analysis/norms.py), and so are W_Q, W_K and the rotation, so q_i and k_j are
sums over the same components, and

    score = sum_{a, b} Q(a_i) . K(b_j) / (sqrt(d_head) * temperature)

exactly: a [components x components] table. The constant terms (projection biases, LayerNorm biases, the output
projections' biases) are one component, `bias`. In a post-norm model (BERT) the stream entering layer l is the
output of the previous block's last norm: every component is carried through each norm on the way (centred and
scaled by that norm's frozen scale; its bias joins `bias`), and each MLP's output is computed from the run's values.

    qk = qk_attribution(model, ids, type_ids, residual, z, layer, head, query, key)
    qk.table.sum() == qk.score          # the model's scaled score, to float error
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.precision import COMPUTE
from ..model.functional import apply_rope, score_scale
from .norms import FrozenNorm


@dataclass(frozen=True)
class Component:
    """A part of the residual stream, named as TransformerLens labels it (hook: the hook point that holds it)."""
    name: str                  # "embed", "pos_embed", "type_embed", "L3H4", "L3 MLP", "bias"
    kind: str                  # "embed", "pos_embed", "type_embed", "head", "mlp", "bias"
    layer: int | None = None
    head: int | None = None
    hook: str | None = None


def components(model, layer: int) -> list[Component]:
    """What the stream entering `layer` is made of, in the order stream_parts gives them: the embeddings, each
    earlier block's heads and MLP, and the constant terms last."""
    out = [Component("embed", "embed", hook="hook_embed")]
    if model.wpe is not None:
        out.append(Component("pos_embed", "pos_embed", hook="hook_pos_embed"))
    if model.wtt is not None:
        out.append(Component("type_embed", "type_embed", hook="hook_token_type_embed"))
    for l in range(layer):
        out += [Component(f"L{l}H{h}", "head", l, h, f"blocks.{l}.attn.hook_result") for h in range(model.cfg.n_heads)]
        out.append(Component(f"L{l} MLP", "mlp", l, None, f"blocks.{l}.hook_mlp_out"))
    return out + [Component("bias", "bias")]


def head_outputs(model, layer: int, z: np.ndarray, heads=None) -> np.ndarray:
    """Each head's output through its d_head columns of the layer's output projection: z [n, P, d_head] of `heads`
    (all by default) -> [n, P, D] (float64). Every head's, summed, plus W_O's bias is the attention's output."""
    cfg = model.cfg
    W = np.asarray(model.blocks[layer].attn.projection("o_proj")[0], np.float64)          # [D, H * dh]
    W = W.reshape(-1, cfg.n_heads, cfg.d_head)[:, slice(None) if heads is None else heads]
    return np.einsum("hpd,ehd->hpe", np.asarray(z, np.float64), W)


def _frozen(norm, x: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """parts [C, P, D] (the constant term last) through `norm` frozen at its input x [P, D]."""
    f = FrozenNorm.of(norm, x)
    out = f(parts)
    if f.bias is not None:
        out[-1] += f.bias
    return out


def stream_parts(model, ids, type_ids, residual: np.ndarray, z: np.ndarray, layer: int, positions) -> np.ndarray:
    """The stream entering `layer` at `positions`, split as components(model, layer): [C, P, D] float64, summing to
    residual[layer][positions]. ids, type_ids [T]: the text's tokens; residual [>= layer + 1, T, D]: the stream
    entering each block (a Trace's); z [>= layer, H, T, d_head]: each head's output before W_O."""
    cfg, pos = model.cfg, np.asarray(positions, np.int64)
    tokens = np.asarray(ids, np.int64)[pos]
    parts = [model.wte[tokens]]                                                             # [P, D] each
    if model.wpe is not None:
        parts.append(model.wpe[pos])
    if model.wtt is not None:
        parts.append(model.wtt[np.asarray(type_ids, np.int64)[pos]])
    parts = np.concatenate([np.asarray(parts, np.float64), np.zeros((1,) + parts[0].shape)])   # + constants
    if model.ln_embed is not None:                                                          # BERT
        parts = _frozen(model.ln_embed, parts.sum(axis=0), parts)
    for l in range(layer):
        block = model.blocks[l]
        heads = head_outputs(model, l, z[l][:, pos])                                        # [H, P, D]
        b = block.attn.projection("o_proj")[1]
        constant = parts[-1] + (0.0 if b is None else np.asarray(b, np.float64))
        x = np.asarray(residual[l][pos], np.float64)
        attn = heads.sum(axis=0) + constant - parts[-1]
        if cfg.norm_first:                          # x' = x + attn + mlp: the MLP is what else the block added
            mlp = np.asarray(residual[l + 1][pos], np.float64) - x - attn
            parts = np.concatenate([parts[:-1], heads, mlp[None], constant[None]])
        else:                                       # x' = N2(y + mlp(y)), y = N1(x + attn)
            parts = _frozen(block.ln1, x + attn, np.concatenate([parts[:-1], heads, constant[None]]))
            y = parts.sum(axis=0)
            mlp = np.asarray(block.mlp(y.astype(COMPUTE)), np.float64)
            parts = np.concatenate([parts[:-1], mlp[None], parts[-1:]])
            parts = _frozen(block.ln2, y + mlp, parts)
    return parts


@dataclass(frozen=True)
class QKAttribution:
    components: list[Component]
    table: np.ndarray          # [C, C] float64: query-side component x key-side component
    kv_head: int               # the key/value head whose keys the query head reads

    @property
    def score(self) -> float:
        return float(self.table.sum())


def qk_attribution(model, ids, type_ids, residual: np.ndarray, z: np.ndarray, layer: int, head: int, query: int,
                   key: int) -> QKAttribution:
    """Head `head` of `layer`'s scaled score at (query, key), split into components x components (module doc)."""
    cfg, block = model.cfg, model.blocks[layer]
    attn, dh = block.attn, cfg.d_head
    kv = head // (cfg.n_heads // cfg.n_kv_heads)
    parts = stream_parts(model, ids, type_ids, residual, z, layer, [query, key])           # [C, 2, D]
    if cfg.norm_first:
        parts = _frozen(block.ln1, residual[layer][[query, key]], parts)

    def side(name: str, h: int, p: int) -> np.ndarray:                                     # -> [C, dh]
        W, b = attn.projection(name)
        out = parts[:, p] @ np.asarray(W[h * dh:(h + 1) * dh], np.float64).T
        if b is not None:
            out[-1] += b[h * dh:(h + 1) * dh]
        rope = getattr(attn, "rope", None)
        if rope is not None:
            position = (query, key)[p]
            out = apply_rope(out, *(np.asarray(t[position], np.float64) for t in rope))
        return out
    q, k = side("q_proj", head, 0), side("k_proj", kv, 1)
    table = q @ k.T * float(score_scale(attn))                # the run's own factor (in float64 from here)
    return QKAttribution(components(model, layer), table, kv)
