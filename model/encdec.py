"""Encoder-decoders in NumPy: T5, BART and Marian (Vaswani et al. 2017's original shape).

The encoder reads the source text both ways; the decoder reads its own text causally and, in every block, attends
to the encoder's output through cross-attention (model/attention.CrossAttention: queries from the decoder, keys and
values from the encoder). The families differ in a few choices, each a field of EncoderDecoderConfig:

  T5      pre-norm, T5's LayerNorm (RMSNorm: no centring, no bias), no 1/sqrt(d_head) on the scores, positions as
          a learned bias per head and *bucketed* relative distance (Raffel et al. 2020, section 2.1): bidirectional
          in the encoder, causal in the decoder, the table of layer 0 shared by every layer; relu or gated-gelu
          feed-forward; a final norm per stack; the tied LM head reads hidden * d_model**-0.5
  BART    post-norm LayerNorm, learned positions read at position + 2 (its offset), a LayerNorm on the embeddings
          (layernorm_embedding), token embeddings times sqrt(d_model) when scale_embedding; final_logits_bias
  Marian  BART's blocks with fixed sinusoidal positions and no embedding norm

Masks are inputs, as in model/transformer.py: encoder [B, 1, S, S], decoder [B, 1, T, T] (causal + padding), cross
[B, 1, T, S] (the encoder's padding). T5's position bias is added to them here (inside the model), so the attention
itself is the same for every family. The blocks are model/transformer.TransformerBlock, the one block forward of
every model, built from these families' parts (`block`): cross-attention is a sublayer of the decoder's blocks, and
every block has the named sites a decoder's has (model/interventions.py). graphs/encdec.py writes every step below as
ONNX nodes, naming what it mirrors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .precision import COMPUTE, scalar
from .attention import CrossAttention
from .functional import gelu, gelu_tanh, silu
from .transformer import STAGE_SITES, STAGES, LayerNorm, Linear, RMSNorm, TransformerBlock, _normal
from .weights import stored

ACTIVATIONS = {"relu": lambda x: np.maximum(x, scalar(0.0)), "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}
# STAGES, per attention (model/transformer.py's): x [L, B, Tq, D] (the queries' input), q [L, B, H, Tq, dh], k, v
# [L, B, H, S, dh], scores, scaled, masked [L, B, H, Tq, S], ctx [L, B, H, Tq, dh]


@dataclass(frozen=True)
class EncoderDecoderConfig:
    """Everything that shapes an encoder-decoder (the defaults are BART's)."""
    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int                    # encoder blocks
    n_decoder_layers: int            # decoder blocks
    d_ff: int
    max_positions: int               # the longest text either stack reads
    d_head: int = 0                  # 0: d_model // n_heads (T5 sets its own: d_kv)
    norm: Literal["layer", "rms"] = "layer"
    norm_first: bool = False         # T5 pre-norm; BART and Marian post-norm
    position: Literal["learned", "sinusoidal", "relative"] = "learned"
    position_offset: int = 0         # BART reads its learned table at position + 2
    relative_buckets: int = 32       # T5: buckets of relative distance ...
    relative_max_distance: int = 128  # ... the last one holds every distance from here on
    embed_scale: float = 1.0         # token embeddings times sqrt(d_model) (scale_embedding)
    embed_norm: bool = False         # BART's layernorm_embedding
    final_norm: bool = False         # T5's final_layer_norm after each stack
    scaled: bool = True              # scores times 1/sqrt(d_head); T5: not scaled
    activation: Literal["relu", "gelu", "gelu_tanh", "silu"] = "gelu"
    gated: bool = False              # T5's gated feed-forward: act(wi_0 x) * wi_1 x
    bias: bool = True                # biases on every projection (none in T5)
    layer_norm_eps: float = 1e-5
    lm_scale: float = 1.0            # T5 with tied embeddings: the LM head reads hidden * d_model**-0.5
    tie_embeddings: bool = True      # the LM head is the shared token embedding
    logits_bias: bool = False        # BART's and Marian's final_logits_bias
    decoder_start_token_id: int = 0  # the decoder's first token

    def __post_init__(self):
        if not self.d_head:
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)

    # the names the rest of attnscope reads off a config
    causal = False
    type_vocab_size = 0
    lm_head = True
    n_kv_heads = property(lambda self: self.n_heads)
    qkv_bias = property(lambda self: self.bias)   # the page's facts about the family (app/pages.py)
    qk_norm, output_norms, parallel_residual = None, False, False   # none of the decoder families' variations
    rotary_dim = 0
    local_layers, sliding_window = (), 0                             # no layer with a window of its own (Gemma's)
    has_unembedding = False          # no logit lens or OV copying scores here (their analyses read one stack)


def sinusoidal_positions(n_positions: int, d: int) -> np.ndarray:
    """Marian's fixed positions [n_positions, d]: angle pos / 10000^(2 floor(j/2) / d); sin of the even-j angles in
    the first half of the features, cos of the odd-j angles in the second (not interleaved). In float64, rounded to
    float32 once, as transformers' MarianSinusoidalPositionalEmbedding.create_weight."""
    j = np.arange(d)
    angles = np.arange(n_positions, dtype=np.float64)[:, None] / np.power(10000, 2 * (j // 2) / d)[None, :]
    half = (d + 1) // 2
    out = np.empty((n_positions, d), COMPUTE)
    out[:, :half] = np.sin(angles[:, 0::2])
    out[:, half:] = np.cos(angles[:, 1::2])
    return out


def relative_position_bucket(relative: np.ndarray, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> np.ndarray:
    """T5's bucket of each relative position (key position - query position), as transformers'
    T5Attention._relative_position_bucket computes it (in float32). Bidirectional: half the buckets for keys after
    the query. Then distances below num_buckets/2 get a bucket each; larger ones share logarithmically wider buckets
    up to max_distance, past which all fall in the last. Causal: keys after the query all get bucket 0."""
    relative = np.asarray(relative, np.int64)
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).astype(np.int64) * num_buckets
        relative = np.abs(relative)
    else:
        relative = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    far = np.maximum(relative, max_exact).astype(COMPUTE)      # the near ones take the exact branch below
    large = max_exact + (np.log(far / scalar(max_exact)) / scalar(math.log(max_distance / max_exact))
                         * scalar(num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(relative < max_exact, relative, large)


class RelativePositionBias:
    """T5's position bias: one learned number per head for each bucket of relative distance, added to the scores.
    weight [buckets, H]. by_distance [2P - 1, H] is the bias at each distance key - query = -(P-1)..P-1 (the buckets
    looked up once); a [Tq, S] window of it is the bias of a run."""

    def __init__(self, cfg: EncoderDecoderConfig, bidirectional: bool, rng):
        self.bidirectional, self.cfg = bidirectional, cfg
        self.weight = _normal(rng, (cfg.relative_buckets, cfg.n_heads))
        P = cfg.max_positions
        self.buckets = relative_position_bucket(np.arange(-(P - 1), P), bidirectional, cfg.relative_buckets,
                                                cfg.relative_max_distance)                  # [2P - 1]

    @property
    def by_distance(self) -> np.ndarray:
        return self.weight[self.buckets]                                                    # [2P - 1, H]

    def __call__(self, Tq: int, S: int) -> np.ndarray:
        """The bias [1, H, Tq, S]: query i, key j read by_distance[j - i + P - 1]."""
        P = self.cfg.max_positions
        distance = np.arange(S)[None, :] - np.arange(Tq)[:, None] + (P - 1)                 # [Tq, S]
        return self.by_distance[distance].transpose(2, 0, 1)[None]                           # [1, H, Tq, S]


class FeedForward:
    """Position-wise feed-forward: proj(act(fc(x))), or gated (T5 v1.1's gated-gelu): proj(act(fc(x)) * up(x))."""

    def __init__(self, cfg: EncoderDecoderConfig, rng):
        self.fc = Linear(cfg.d_model, cfg.d_ff, rng, bias=cfg.bias)
        self.up = Linear(cfg.d_model, cfg.d_ff, rng, bias=cfg.bias) if cfg.gated else None
        self.proj = Linear(cfg.d_ff, cfg.d_model, rng, bias=cfg.bias)
        self.activation = cfg.activation

    def __call__(self, x):
        h = ACTIVATIONS[self.activation](self.fc(x))                                       # [B, T, d_ff]
        return self.proj(h if self.up is None else h * self.up(x))


def block(cfg: EncoderDecoderConfig, cross: bool, rng) -> TransformerBlock:
    """An encoder block (cross False) or a decoder block: model/transformer.TransformerBlock, the one block of every
    model, from the family's parts: self-attention, cross-attention (decoder blocks) and the feed-forward, each in
    a residual and a norm (ln1, ln_cross, ln2: transformers' self_attn_layer_norm / encoder_attn_layer_norm /
    final_layer_norm, T5's layer[i].layer_norm):

    pre-norm (T5):              x = x + SelfAttn(N1(x));  x = x + CrossAttn(NC(x), memory);  x = x + FF(N2(x))
    post-norm (BART, Marian):   x = N1(x + SelfAttn(x));  x = NC(x + CrossAttn(x, memory));  x = N2(x + FF(x))
    """
    Norm = RMSNorm if cfg.norm == "rms" else LayerNorm
    seed = lambda: None if rng is None else int(rng.integers(2**31))   # noqa: E731
    attn = CrossAttention(cfg.d_model, cfg.n_heads, cfg.d_head, cfg.bias, cfg.scaled, seed=seed())
    cross_attn = CrossAttention(cfg.d_model, cfg.n_heads, cfg.d_head, cfg.bias, cfg.scaled, seed=seed()) \
        if cross else None
    norm = lambda: Norm(cfg.d_model, cfg.layer_norm_eps)   # noqa: E731
    return TransformerBlock.of(attn, FeedForward(cfg, rng), norm(), norm(), cfg.norm_first, cross_attn,
                               norm() if cross else None)


@dataclass
class EncoderDecoderOutput:
    encoder_hidden: np.ndarray          # [B, S, D] the encoder's output (after its final norm): the memory
    hidden: np.ndarray                  # [B, T, D] the decoder's output
    encoder_attentions: np.ndarray      # [L_enc, B, H, S, S]
    decoder_attentions: np.ndarray      # [L_dec, B, H, T, T]
    cross_attentions: np.ndarray        # [L_dec, B, H, T, S]
    next_token_logits: np.ndarray       # [B, V] after each decoder text's last token
    token_logprobs: np.ndarray          # [B, T] log p(decoder token t | tokens before t, source); 0 at t = 0
    stages: dict[str, dict[str, np.ndarray]] | None = field(default=None)   # "encoder"/"decoder"/"cross" -> STAGES
    masks: dict[str, np.ndarray] | None = field(default=None)   # with stages: the additive mask each attention adds


class EncoderDecoder:
    """Shared token embeddings, an encoder stack, a decoder stack with cross-attention, and the LM head.
    Weights from N(0, 0.02^2) by seed (seed=None: zeros, to be loaded)."""

    def __init__(self, cfg: EncoderDecoderConfig, seed: int | None = 0):
        rng = None if seed is None else np.random.default_rng(seed)
        Norm = RMSNorm if cfg.norm == "rms" else LayerNorm
        self.cfg = cfg
        self.shared = _normal(rng, (cfg.vocab_size, cfg.d_model))                               # [V, D]
        rows = cfg.max_positions + cfg.position_offset
        learned = cfg.position == "learned"
        self.enc_wpe = _normal(rng, (rows, cfg.d_model)) if learned else None                   # [P + offset, D]
        self.dec_wpe = _normal(rng, (rows, cfg.d_model)) if learned else None
        self.sinusoids = sinusoidal_positions(cfg.max_positions, cfg.d_model) \
            if cfg.position == "sinusoidal" else None                                           # fixed, not weights
        relative = cfg.position == "relative"
        self.enc_bias = RelativePositionBias(cfg, True, rng) if relative else None               # layer 0's, shared
        self.dec_bias = RelativePositionBias(cfg, False, rng) if relative else None
        self.enc_ln_embed = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.embed_norm else None
        self.dec_ln_embed = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.embed_norm else None
        self.encoder = [block(cfg, False, rng) for _ in range(cfg.n_layers)]
        self.decoder = [block(cfg, True, rng) for _ in range(cfg.n_decoder_layers)]
        self.enc_ln_f = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.final_norm else None
        self.dec_ln_f = Norm(cfg.d_model, cfg.layer_norm_eps) if cfg.final_norm else None
        self.lm_head = None if cfg.tie_embeddings else _normal(rng, (cfg.vocab_size, cfg.d_model))  # [V, D]
        self.logits_bias = np.zeros((1, cfg.vocab_size), COMPUTE) if cfg.logits_bias else None  # [1, V]

    @property
    def unembedding(self) -> np.ndarray:
        return self.shared if self.lm_head is None else self.lm_head

    # ---- weights: flat names ----------------------------------------------------------------------------
    def _modules(self) -> dict[str, object]:
        mods = {"enc_ln_embed": self.enc_ln_embed, "dec_ln_embed": self.dec_ln_embed, "enc_ln_f": self.enc_ln_f,
                "dec_ln_f": self.dec_ln_f, "enc_bias": self.enc_bias, "dec_bias": self.dec_bias}
        for stack, blocks in (("encoder", self.encoder), ("decoder", self.decoder)):
            for i, b in enumerate(blocks):
                p = f"{stack}.{i}."
                mods |= {p + "ln_self": b.ln1, p + "ln_cross": b.ln_cross, p + "ln_ff": b.ln2,      # transformers'
                         p + "ff.fc": b.mlp.fc, p + "ff.up": b.mlp.up, p + "ff.proj": b.mlp.proj,  # names, kept
                         p + "self_attn": b.attn, p + "cross_attn": b.cross_attn}
        return {k: v for k, v in mods.items() if v is not None}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every weight under a flat name: shared, enc_wpe, encoder.0.self_attn.q_proj.weight, decoder.1.ff.fc.bias,
        enc_bias.weight (T5's bucket table), lm_head, logits_bias, ..."""
        sd = {name: getattr(self, name) for name in ("shared", "enc_wpe", "dec_wpe", "lm_head", "logits_bias")
              if getattr(self, name) is not None}
        for name, m in self._modules().items():
            if isinstance(m, CrossAttention):
                sd |= {f"{name}.{k}": v for k, v in m.params.items()}
            else:
                sd |= {f"{name}.{k}": v for k in ("weight", "bias") if (v := getattr(m, k, None)) is not None}
        return sd

    def load_state_dict(self, sd: dict[str, np.ndarray]) -> EncoderDecoder:
        expected = self.state_dict()
        missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
        if missing or unexpected:
            raise KeyError(f"state dict does not fit this model: missing {missing[:8]}, unexpected {unexpected[:8]}")
        mods = self._modules()
        for name, ref in expected.items():
            value = stored(sd[name])
            if value.shape != ref.shape:
                raise ValueError(f"{name} has shape {value.shape}; the model needs {ref.shape}")
            owner, _, attr = name.rpartition(".")
            if not owner:
                setattr(self, name, value)
            elif isinstance(mods.get(owner), CrossAttention) or owner not in mods:
                owner, _, attr = name.partition("_attn.")
                mods[owner + "_attn"].params[attr] = value
            else:
                setattr(mods[owner], attr, value)
        return self

    # ---- forward ----------------------------------------------------------------------------------------
    def embed(self, ids: np.ndarray, decoder: bool) -> np.ndarray:
        """Tokens (times embed_scale) + positions (learned at position + offset, or sinusoidal), then BART's
        layernorm_embedding. T5 adds no positions here (its bias is in the masks). ids [B, T] -> [B, T, D]."""
        T = ids.shape[1]
        if T > self.cfg.max_positions:
            raise ValueError(f"{T} tokens is more than this model's {self.cfg.max_positions} positions")
        x = self.shared[ids] * scalar(self.cfg.embed_scale)
        wpe = self.dec_wpe if decoder else self.enc_wpe
        if wpe is not None:
            x = x + wpe[self.cfg.position_offset:self.cfg.position_offset + T]
        if self.sinusoids is not None:
            x = x + self.sinusoids[:T]
        ln = self.dec_ln_embed if decoder else self.enc_ln_embed
        return x if ln is None else ln(x)

    def __call__(self, input_ids, decoder_input_ids, encoder_mask, decoder_mask, cross_mask, decoder_lengths=None,
                 stages: bool = False, edit=None) -> EncoderDecoderOutput:
        """input_ids [B, S], decoder_input_ids [B, T]; additive masks encoder_mask [B, 1|H, S, S], decoder_mask
        [B, 1|H, T, T] (causal + padding), cross_mask [B, 1|H, T, S]; decoder_lengths [B] (None: all T).
        edit(stack, layer) -> hook or None, where given: the hook(site, value) -> value of that block ("encoder" or
        "decoder", its layer), which sees and may replace its sites before they are kept (model/interventions.py)."""
        ids, dec = np.asarray(input_ids, np.int64), np.asarray(decoder_input_ids, np.int64)
        (B, S), T = ids.shape, dec.shape[1]
        lengths = np.full(B, T) if decoder_lengths is None else np.asarray(decoder_lengths, np.int64)
        if self.enc_bias is not None:                     # T5: the position bias joins the masks (every layer's)
            encoder_mask = encoder_mask + self.enc_bias(S, S)
            decoder_mask = decoder_mask + self.dec_bias(T, T)
        kept = {"encoder": [], "decoder": []}                 # each block's sites, as its hook saw them

        def hook(stack: str, layer: int):
            seen, outer = {}, None if edit is None else edit(stack, layer)
            kept[stack].append(seen)

            def see(site, value):
                seen[site] = value if outer is None else outer(site, value)
                return seen[site]
            return see

        x = self.embed(ids, decoder=False)
        for i, b in enumerate(self.encoder):
            x = b(x, encoder_mask, hook=hook("encoder", i)).x
        memory = x if self.enc_ln_f is None else self.enc_ln_f(x)                                  # [B, S, D]

        y = self.embed(dec, decoder=True)
        for i, b in enumerate(self.decoder):
            y = b(y, decoder_mask, hook=hook("decoder", i), memory=memory, cross_mask=cross_mask).x
        hidden = y if self.dec_ln_f is None else self.dec_ln_f(y)                                 # [B, T, D]

        logits = self.logits(hidden)                                                               # [B, T, V]
        from scipy.special import log_softmax   # on first use (see functional.gelu)
        logp = log_softmax(logits.astype(np.float64), axis=-1)
        following = np.concatenate([dec[:, 1:], np.zeros((B, 1), np.int64)], axis=1)             # x_{t+1}, [B, T]
        logp_next = np.take_along_axis(logp, following[..., None], -1)[..., 0]
        token_logprobs = np.concatenate([np.zeros((B, 1)), logp_next[:, :-1]], axis=1).astype(COMPUTE)
        seen = {"encoder": (kept["encoder"], ""), "decoder": (kept["decoder"], ""), "cross": (kept["decoder"], "cross_")}
        probs = {k: np.stack([s[prefix + "pattern"] for s in blocks]) for k, (blocks, prefix) in seen.items()}
        st = masks = None
        if stages:
            st = {k: {n: np.stack([s[prefix + STAGE_SITES[n]] for s in blocks]) for n in STAGES}
                  for k, (blocks, prefix) in seen.items()}
            masks = {"encoder": encoder_mask, "decoder": decoder_mask, "cross": cross_mask}   # T5's bias included
        return EncoderDecoderOutput(memory, hidden, probs["encoder"], probs["decoder"], probs["cross"],
                                    logits[np.arange(B), lengths - 1], token_logprobs, st, masks)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """The LM head: (hidden * lm_scale) @ W^T (+ final_logits_bias) -> [..., V]."""
        h = hidden * scalar(self.cfg.lm_scale) if self.cfg.lm_scale != 1.0 else hidden
        out = h @ self.unembedding.T
        return out if self.logits_bias is None else out + self.logits_bias
