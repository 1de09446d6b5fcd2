"""Direct logit attribution (DLA): each part of the residual stream's direct contribution to one logit (or to the
difference of two), at one position.

Before the final norm the residual stream is a sum (pre-norm decoders: GPT-2, Llama):

    x_L = embeddings + sum_l ( sum_h z_lh W_O,h  +  b_O,l )  +  sum_l mlp_l

z_lh W_O,h is head h's output through its d_head columns of layer l's output projection. The final norm is linear
once its scale is frozen at the run's value, s = 1 / sqrt(mean(x_L^2) + eps) (RMSNorm) or 1 / sqrt(var(x_L) + eps)
(LayerNorm, which also centres each part and adds its bias). Each part's share of logit = norm(x_L) . u, with u the
unembedding row of the target (minus the distractor's), is then g * s * part . u: the shares, with the norm's bias
term, sum to the logit (difference) exactly.

    dla = attribution(model, z, residual, u)       # z [L, H, d_head], residual [L + 1, D] at the position
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .norms import FrozenNorm
from .qk import head_outputs


@dataclass(frozen=True)
class Attribution:
    embeddings: float          # the token (+ position) embeddings
    heads: np.ndarray          # [L, H] each head's output
    attention_bias: np.ndarray  # [L] each output projection's bias (zeros where it has none)
    mlps: np.ndarray           # [L] each block's MLP
    norm_bias: float           # the final LayerNorm's bias (0 for RMSNorm)

    @property
    def total(self) -> float:
        """The parts' sum: the logit (difference) itself."""
        return float(self.embeddings + self.heads.sum() + self.attention_bias.sum() + self.mlps.sum()
                     + self.norm_bias)


def attribution(model, z: np.ndarray, residual: np.ndarray, u: np.ndarray) -> Attribution:
    """z [L, H, d_head] every head's output at one position; residual [L + 1, D] the stream entering each block
    there and leaving the last; u [D] the logit's direction (W_U[target] - W_U[distractor]). Float64 throughout."""
    cfg = model.cfg
    if not cfg.norm_first:
        raise ValueError("direct logit attribution needs a pre-norm model (its residual stream is a sum)")
    L, H, _ = z.shape
    z, residual, u = (np.asarray(a, np.float64) for a in (z, residual, u))
    norm = FrozenNorm.of(model.ln_f, residual[-1])
    bias = 0.0 if norm.bias is None else float(norm.bias @ u)

    def share(parts: np.ndarray) -> np.ndarray:             # [..., D] -> [...]: a part's share of the logit
        return norm(parts) @ u

    heads, biases, attn_out = np.zeros((L, H)), np.zeros(L), np.zeros((L, residual.shape[-1]))
    for layer, block in enumerate(model.blocks):
        b = block.attn.out_projection()[1]
        per_head = head_outputs(model, layer, z[layer][:, None])[:, 0]                                # [H, D]
        heads[layer] = share(per_head)
        attn_out[layer] = per_head.sum(axis=0)
        if b is not None:
            attn_out[layer] += b
            biases[layer] = share(np.asarray(b, np.float64))
    mlps = share(residual[1:] - residual[:-1] - attn_out)  # what each block added besides its attention
    return Attribution(float(share(residual[0])), heads, biases, mlps, bias)
