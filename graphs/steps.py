"""The transformer's steps as ONNX nodes, each mirroring the NumPy code it names (model/transformer.py,
model/attention.py, model/functional.py), in the same order. The stacked graph (graphs/stacked.py) strings them
together for every layer; the layer-by-layer graphs (graphs/layers.py) cut them apart.

Learned positions are taken as wpe[:T] with Shape + Slice (no Gather over a Range, which onnxruntime's
GatherToSliceFusion mis-optimises); RoPE's cos/sin tables the same way. Opset 17 has no RMSNormalization: RMSNorm is
written out in primitives, as functional.rms_norm.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from onnx import helper

from ..model.attention import GroupedQueryAttention
from ..model.masks import MASKED
from ..model.precision import COMPUTE, scalar
from ..model.transformer import LM_OUTPUTS, VOCAB_CHUNK, GeGLU, Transformer
from .builder import FLOAT, INT, Graph


def token_inputs(model: Transformer) -> list:
    inputs = [helper.make_tensor_value_info("input_ids", INT, ["batch", "tokens"])]
    if model.wtt is not None:
        inputs.append(helper.make_tensor_value_info("token_type_ids", INT, ["batch", "tokens"]))
    return inputs


def final_outputs(cfg) -> list:
    outputs = [helper.make_tensor_value_info("hidden", FLOAT, ["batch", "tokens", cfg.d_model])]
    if cfg.lm_head:
        outputs += [helper.make_tensor_value_info(n, FLOAT, ["batch", dim])
                    for n, dim in zip(LM_OUTPUTS, (cfg.vocab_size, "tokens"))]
    return outputs


def embed(g: Graph, model: Transformer, start: str | None = None) -> tuple[str, str, str]:
    """Transformer.embed: wte[ids] (+ wpe[start:start+T]) (+ wtt[types]), then LayerNorm for BERT. Returns x
    [B, T, D], the name of wte (the tied LM head reads it) and T (a 1-element int64 tensor). start: the first
    position, a 1-element int64 tensor (None: 0)."""
    T = g.slice(g.op("Shape", "input_ids"), 1, 2, 0, hint="T")
    wte = g.param(model.wte, "wte")
    x = g.gather(wte, "input_ids")                                         # only the rows read are widened
    if model.cfg.embed_scale != 1.0:                                       # Gemma: times sqrt(d_model)
        x = g.op("Mul", x, g.const(scalar(model.cfg.embed_scale), "embed_scale"))
    if model.wpe is not None:
        wpe = g.param(model.wpe, "wpe")
        x = g.op("Add", x, g.widen(_positions(g, wpe, T, start), of=wpe))
    if model.wtt is not None:
        wtt = g.param(model.wtt, "wtt")
        x = g.op("Add", x, g.widen(g.op("Gather", wtt, "token_type_ids"), of=wtt))
    if model.ln_embed is not None:
        x = g.norm(x, model.ln_embed, "ln_embed")
    return x, wte, T


def rope_tables(g: Graph, model: Transformer, T: str, start: str | None = None, layer: int = 0
                ) -> tuple[str, str] | None:
    """RoPE's cos/sin tables sliced to positions start..start+T-1 [T, d_head], like wpe: those of `layer`
    (Transformer.rope_for: a local layer's own where the model has them; every graph with a layer-0 default)."""
    tables = model.rope_for(layer)
    return None if tables is None else tuple(_positions(g, g.param(t, name), T, start, hint=name)
                                             for t, name in zip(tables, ("rope.cos", "rope.sin")))


def sliding_window_mask(g: Graph, mask: str, Tq: str, Tk: str, window: int, start: str | None = None) -> str:
    """TransformerBlock.local_mask: mask plus masks.sliding_window_mask, built from positions -- key j hidden from
    the query at position start + i when start + i - j >= window -- and clipped at MASKED as masks.combine."""
    def positions(n: str, first: str | None) -> str:
        end = g.op("Squeeze", n if first is None else g.op("Add", first, n), g.const(np.array([0])))
        begin = g.const(np.int64(0)) if first is None else g.op("Squeeze", first, g.const(np.array([0])))
        return g.op("Range", begin, end, g.const(np.int64(1)))
    distance = g.op("Sub", g.op("Unsqueeze", positions(Tq, start), g.const(np.array([1]))),
                    g.op("Unsqueeze", positions(Tk, None), g.const(np.array([0]))))                # [Tq, Tk]
    band = g.op("Where", g.op("GreaterOrEqual", distance, g.const(np.int64(window))), g.const(MASKED),
                g.const(scalar(0.0)), hint=f"sliding_window_{window}")                         # [Tq, Tk]
    return g.op("Max", g.op("Add", mask, band), g.const(MASKED), hint="local_mask")


def _positions(g: Graph, table: str, T: str, start: str | None, hint: str | None = None) -> str:
    """table[start:start+T] (table[:T] when start is None)."""
    return g.slice(table, 0, T, 0, hint=hint) if start is None else g.slice(table, start, g.op("Add", start, T), 0,
                                                                            hint=hint)


def position_weights(g: Graph, T: str) -> str:
    """functional.position_weights: 1/n on each text's n tokens, 0 on padding -> [B, 1, 1, T]"""
    positions = g.op("Range", g.const(np.int64(0)), g.op("Squeeze", T, g.const(np.array([0]))), g.const(np.int64(1)))
    real = g.op("Less", g.op("Unsqueeze", positions, g.const(np.array([0]))),
                g.op("Unsqueeze", "lengths", g.const(np.array([1]))))                          # [B, T]
    n_real = g.op("Cast", g.op("Max", g.op("Unsqueeze", "lengths", g.const(np.array([1]))), g.const(np.array([1]))),
                  to=FLOAT)                                                    # [B, 1]
    return g.op("Unsqueeze", g.op("Div", g.op("Cast", real, to=FLOAT), n_real), g.const(np.array([1, 2])),
                hint="position_weights")                                                    # [B, 1, 1, T]


def transformer_block(g: Graph, block, cfg, p: str, x: str, mask: str, keep: str | None = None,
                      mean: str | None = None, weights: str | None = None, rope=None, past=None, present=None,
                      memory: str | None = None, cross_mask: str | None = None, patch=None,
                      cross_patch=None) -> tuple[str, dict[str, str]]:
    """TransformerBlock.__call__: x [B, T, D] -> x, and the attention's stages (probabilities as "attentions"; a
    decoder block of an encoder-decoder adds its cross-attention's stages as "cross"). The one block builder: the
    stacked graph (graphs/stacked.py), the per-layer graph (graphs/layers.build_layer), the decoding step
    (graphs/decoding.py: past and present, the key/value cache's names; keep with mean None) and the encoder-decoders'
    graph (graphs/encdec.py: memory and cross_mask; no head mask) build every block here.
    mask: additive, this layer's (a local layer's band added by the caller, once per graph: sliding_window_mask);
    keep, mean [B, H]: this layer's head mask (keep None: none; mean None: knocked-out heads write zero);
    weights [B, 1, 1, T]: position_weights (the mean's); patch, cross_patch: edits of the head outputs (hook_z) of the
    attention and the cross-attention (edited_heads; None: none)."""
    h = attention_input(g, block, cfg, p, x)
    st = attention(g, block.attn, cfg, p + ".attn", h, mask, rope, past=past, present=present) | {"x": h}
    st["ctx"] = edited_heads(g, st["ctx"], patch)

    def cross(x: str) -> str:                                          # a decoder block's cross-attention sublayer
        x, st["cross"] = cross_attention(g, block, cfg, p, x, memory, cross_mask, cross_patch)
        return x
    return block_output(g, block, cfg, p, x, st["ctx"], keep, mean, weights,
                        None if block.cross_attn is None else cross), st


def attention_inputs(g: Graph, block, cfg, p: str, x: str, rope) -> tuple[str, tuple[str, str, str]]:
    """The block up to its attention's scores (the layer-by-layer run's first graph, graphs/layers.py), as
    TransformerBlock.attention_input then model/attention.attention's projections and repeat_kv: its input h (normed
    first for pre-norm blocks) and the queries, keys and values, each [B, H, T, dh] (keys and values repeated for
    grouped-query attention, rotated by RoPE where the model has it)."""
    h = attention_input(g, block, cfg, p, x)
    q, k, v = project(g, block.attn, cfg, p + ".attn", h, rope)
    return h, (q, repeat_kv(g, cfg, p, k, "k"), repeat_kv(g, cfg, p, v, "v"))


def attention_input(g: Graph, block, cfg, p: str, x: str) -> str:
    """TransformerBlock.attention_input: N1(x) in a pre-norm block, x itself otherwise."""
    return g.norm(x, block.ln1, p + ".ln1") if block.norm_first else x


def attention(g: Graph, attn, cfg, p: str, h: str, mask: str, rope=None, memory: str | None = None, past=None,
              present=None) -> dict[str, str]:
    """model/attention.attention up to the weighted values z (the head mask and W_O are block_output's): q from h,
    k and v from memory (None: h; cross-attention), after past's keys and values where given (a decoding step:
    past (key, value) names [B, Hkv, P, dh], the grown cache written to the names present), repeated per query head,
    then attend. Returns attend's stages."""
    q, k, v = project(g, attn, cfg, p, h, rope, memory)              # q [B, H, T, dh]; k, v [B, Hkv, S, dh]
    if past is not None:
        k = g.op("Concat", past[0], k, axis=2, out=present[0])       # [B, Hkv, P+S, dh]
        v = g.op("Concat", past[1], v, axis=2, out=present[1])
    return attend(g, attn, p, q, repeat_kv(g, cfg, p, k, "k"), repeat_kv(g, cfg, p, v, "v"), mask)


def cross_attention(g: Graph, block, cfg, p: str, x: str, memory: str, mask: str, patch=None
                    ) -> tuple[str, dict[str, str]]:
    """TransformerBlock.cross_attention: x + Cross(NC(x), m) pre-norm, NC(x + Cross(x, m)) post-norm. Returns the
    stream and the cross-attention's stages ("x": its queries' input). patch: edited_heads'."""
    h = g.norm(x, block.ln_cross, p + ".ln_cross") if block.norm_first else x
    st = attention(g, block.cross_attn, cfg, p + ".cross_attn", h, mask, memory=memory) | {"x": h}
    st["ctx"] = edited_heads(g, st["ctx"], patch)
    c = out_projection(g, block.cross_attn, cfg, p + ".cross_attn", st["ctx"])
    return (g.op("Add", x, c) if block.norm_first else g.norm(g.op("Add", x, c), block.ln_cross, p + ".ln_cross")), st


def _qk_norms(g: Graph, attn, p: str, q: str, k: str) -> tuple[str, str]:
    """GroupedQueryAttention.qk_normed: RMSNorm of q and k over their last axis, each with its own weight."""
    return tuple(g.rms_norm(t, SimpleNamespace(weight=attn.params[f"{n}_norm.weight"], eps=attn.norm_eps),
                            f"{p}.{n}_norm") for t, n in ((q, "q"), (k, "k")))


def project(g: Graph, attn, cfg, p: str, h: str, rope, memory: str | None = None) -> tuple[str, str, str]:
    """GroupedQueryAttention.project / MultiHeadAttention.project: queries [B, H, T, dh] of h and the key/value
    heads' keys and values [B, Hkv, S, dh] of memory (None: h), q and k rotated by `rope` (cos, sin [T, dh]) where
    the model has RoPE. p: the attention's prefix (blocks.3.attn)."""
    H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    if isinstance(attn, GroupedQueryAttention):
        m = h if memory is None else memory
        q, k, v = (g.linear(t, *attn.projection(f"{n}_proj"), f"{p}.{n}") for t, n in ((h, "q"), (m, "k"), (m, "v")))
        if attn.qk_norm == "full":                                                      # [B, T|S, H|Hkv * dh]
            q, k = _qk_norms(g, attn, p, q, k)
        q, k, v = (g.op("Transpose", g.op("Reshape", t, g.const(np.array([0, 0, heads, dh]))), perm=[0, 2, 1, 3],
                        hint=f"{p}.{n}_heads") for t, n, heads in ((q, "q", H), (k, "k", Hkv), (v, "v", Hkv)))
        if attn.qk_norm == "head":                                                      # [B, H|Hkv, T|S, dh]
            q, k = _qk_norms(g, attn, p, q, k)
        if rope is not None:
            q, k = g.rope(q, *rope, dh, cfg.rotary_dim), g.rope(k, *rope, dh, cfg.rotary_dim)
        return q, k, v
    if memory is not None:
        raise ValueError("a MultiHeadAttention block attends to itself (no cross-attention in the served graphs)")
    # MultiHeadAttention._projection: q, k, v are the three row blocks of PyTorch's fused in_proj (one MatMul here,
    # cut after it: the graph reads the fused weight as the model stores it)
    fused = g.linear(h, attn.params["in_proj_weight"], attn.params.get("in_proj_bias"), f"{p}.in_proj")
    E = H * dh
    return tuple(g.op("Transpose", g.op("Reshape", g.slice(fused, j * E, (j + 1) * E, -1),
                                        g.const(np.array([0, 0, H, dh]))), perm=[0, 2, 1, 3], hint=f"{p}.{'qkv'[j]}")
                 for j in range(3))


def repeat_kv(g: Graph, cfg, p: str, t: str, n: str) -> str:
    """functional.repeat_kv: [B, Hkv, T, dh] -> [B, H, T, dh], query head h reading kv head h // group."""
    group = cfg.n_heads // cfg.n_kv_heads
    if group == 1:
        return t
    return g.op("Reshape", g.op("Expand", g.op("Unsqueeze", t, g.const(np.array([2]))),
                                g.const(np.array([1, 1, group, 1, 1]))),
                g.const(np.array([0, cfg.n_heads, -1, cfg.d_head])), hint=f"{p}.{n}_repeated")


def attend(g: Graph, attn, p: str, q: str, k: str, v: str, mask: str) -> dict[str, str]:
    """The one attention of the graphs, model/attention.attention from its scores to its weighted values, for however
    many heads q, k, v hold: scores (q k^T), scaled (times attn.scale; soft-capped where the model caps), masked,
    attentions (the probabilities) [B, h, T, S] and ctx [B, h, T, dh]. attn: the attention module (its scale and
    soft cap: every layer's are the model's)."""
    scale = g.const(attn.scale, "scale")
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]), hint=p + ".scores")
    scaled = soft_cap(g, g.op("Mul", scores, scale, hint=p + ".scaled"), getattr(attn, "softcap", 0.0),
                      hint=p + ".capped")
    masked = g.op("Add", scaled, mask, hint=p + ".masked")
    probs = g.op("Softmax", masked, axis=-1, hint=p + ".probs")                       # [B, H, T, S]
    ctx = g.op("MatMul", probs, v, hint=p + ".ctx")                                    # [B, H, T, dh]
    return dict(attentions=probs, q=q, k=k, v=v, scores=scores, scaled=scaled, masked=masked, ctx=ctx)


def edited_heads(g: Graph, ctx: str, patch) -> str:
    """model/interventions.Edit.apply at the head_output site (hook_z): patch = (where [B, H, T] bool, value
    [B, H, T, dh]) -> value where `where` is true, ctx elsewhere (None: ctx as it is)."""
    if patch is None:
        return ctx
    where, value = patch
    return g.op("Where", g.op("Unsqueeze", where, g.const(np.array([3]))), value, ctx, hint="head_output_edited")


def soft_cap(g: Graph, x: str, cap: float, hint: str | None = None) -> str:
    """functional.soft_cap: cap * tanh(x / cap); cap 0: x itself."""
    if not cap:
        return x
    c = g.const(scalar(cap), "softcap")
    return g.op("Mul", c, g.op("Tanh", g.op("Div", x, c)), hint=hint)


def value_norms(g: Graph, block, cfg, p: str, v: str) -> str:
    """TransformerBlock.value_norms: ||v_j W_O^h|| of each head and key, v [B, H, S, dh] -> [B, H, S], as ||R v_j||
    with each head's R^T [H, dh, dh] (TransformerBlock._value_r, a model array: model/weights.value_r): a [dh, dh]
    product a key, as the NumPy reference computes it, where the [dh, D] product of W_O read as [H, dh, D] was a tenth
    of MiniLM's whole forward (its products and their ReduceL2 over D: 3.8 of 37 ms, onnxruntime's profile)."""
    R_t = g.param(block._value_r(cfg.d_head), p + ".value_r")
    return g.op("ReduceL2", g.op("MatMul", v, R_t), axes=[-1], keepdims=0, hint=p + ".value_norms")


def out_projection(g: Graph, attn, cfg, p: str, ctx: str) -> str:
    """The end of model/attention.attention: the heads' outputs z [B, H, T, dh] concatenated, through W_O (+ b_O)."""
    merged = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), g.const(np.array([0, 0, cfg.n_heads * cfg.d_head])))
    return g.linear(merged, *attn.out_projection(), p + ".out")


def block_output(g: Graph, block, cfg, p: str, x: str, ctx: str, keep: str | None, mean: str | None,
                 weights: str | None, cross=None) -> str:
    """The block after its attention's weighted values: the head mask on ctx (model/attention.attention's head_mask;
    keep None: none), the output projection, then after_attention. mean None: knocked-out heads write zero (the
    decoding step's form, model/decoding.py)."""
    if keep is not None:
        keep = g.op("Unsqueeze", keep, g.const(np.array([2, 3])))                      # [B, H, 1, 1]
        if mean is None:
            ctx = g.op("Mul", keep, ctx, hint=p + ".ctx_masked")
        else:   # functional.ablate_heads: keep * ctx + (1 - keep) * mean * sum_t weights_t ctx_t
            mean = g.op("Unsqueeze", mean, g.const(np.array([2, 3])))                  # [B, H, 1, 1]
            replace = g.op("Mul", g.op("Sub", g.const(scalar(1.0)), keep), mean)
            avg = g.op("MatMul", weights, ctx)                                          # [B, H, 1, dh]
            ctx = g.op("Add", g.op("Mul", keep, ctx), g.op("Mul", replace, avg), hint=p + ".ctx_masked")
    return after_attention(g, block, cfg, p, x, out_projection(g, block.attn, cfg, p + ".attn", ctx), cross)


def after_attention(g: Graph, block, cfg, p: str, x: str, a: str, cross=None) -> str:
    """TransformerBlock.after_attention: the residual connections, norms and MLP around the attention's output a;
    cross(x) -> x, where given, the cross-attention sublayer between the attention's residual and the MLP's."""
    if block.parallel_residual:                                         # x + a + MLP(N2(x))
        m = feed_forward(g, block.mlp, g.norm(x, block.ln2, p + ".ln2"), p + ".mlp")
        return g.op("Add", g.op("Add", x, a), m)
    if block.output_norms:                              # y = x + P1(a); y + P2(MLP(N2(y) or y)): OLMo 2, Gemma
        x = g.op("Add", x, g.norm(a, block.post_attn_norm, p + ".post_attn_norm"))
        h = g.norm(x, block.ln2, p + ".ln2") if block.norm_first else x
        return g.op("Add", x, g.norm(feed_forward(g, block.mlp, h, p + ".mlp"), block.post_mlp_norm,
                                     p + ".post_mlp_norm"))
    x = g.op("Add", x, a) if block.norm_first else g.norm(g.op("Add", x, a), block.ln1, p + ".ln1")
    if cross is not None:
        x = cross(x)
    h = g.norm(x, block.ln2, p + ".ln2") if block.norm_first else x
    m = feed_forward(g, block.mlp, h, p + ".mlp")
    return g.op("Add", x, m) if block.norm_first else g.norm(g.op("Add", x, m), block.ln2, p + ".ln2")


def final(g: Graph, model: Transformer, x: str, wte: str, last_only: bool = False) -> None:
    """The final norm (GPT-2, Llama) -> "hidden"; with an LM head, its outputs too (last_only: the next-token logits
    alone, one product with the unembedding at each text's last position)."""
    if model.ln_f is not None:
        x = g.norm(x, model.ln_f, "ln_f")
    g.op("Identity", x, out="hidden")
    if model.cfg.lm_head:
        W = wte if model.lm_head is None else g.param(model.lm_head.weight, "lm_head")
        if last_only:
            last = g.op("GatherND", "hidden", g.op("Unsqueeze", g.op("Sub", "lengths", g.const(np.int64(1))),
                                                   g.const(np.array([1]))), batch_dims=1)     # [B, D]
            g.op("Identity", logits(g, model, last, W), out="next_token_logits")              # [B, V]
        else:
            lm_outputs(g, model, W)


def feed_forward(g: Graph, mlp, h: str, p: str) -> str:
    """MLP.__call__ (Linear -> GELU -> Linear), SwiGLU.__call__ (down(silu(gate(h)) * up(h))), GeGLU.__call__
    (gelu_tanh as the gate's activation) or model/encdec.FeedForward.__call__ (proj(act(fc(h))), or gated:
    proj(act(fc(h)) * up(h)))."""
    if hasattr(mlp, "activation"):                                      # an encoder-decoder's
        a = g.linear(h, mlp.fc.weight, mlp.fc.bias, p + ".fc")
        a = {"relu": lambda t: g.op("Relu", t), "gelu": g.gelu, "gelu_tanh": g.gelu_tanh,
             "silu": g.silu}[mlp.activation](a)
        if mlp.up is not None:
            a = g.op("Mul", a, g.linear(h, mlp.up.weight, mlp.up.bias, p + ".up"))
        return g.linear(a, mlp.proj.weight, mlp.proj.bias, p + ".proj")
    if hasattr(mlp, "gate"):
        act = g.gelu_tanh if isinstance(mlp, GeGLU) else g.silu
        gate = act(g.linear(h, mlp.gate.weight, mlp.gate.bias, p + ".gate"))
        return g.linear(g.op("Mul", gate, g.linear(h, mlp.up.weight, mlp.up.bias, p + ".up")),
                        mlp.down.weight, mlp.down.bias, p + ".down")
    act = g.gelu_tanh if mlp.act.__name__ == "gelu_tanh" else g.gelu
    return g.linear(act(g.linear(h, mlp.fc.weight, mlp.fc.bias, p + ".fc")), mlp.proj.weight, mlp.proj.bias, p + ".proj")


def lm_outputs(g: Graph, model: Transformer, W: str) -> None:
    """Transformer.lm_outputs: next_token_logits [B, V] and token_logprobs [B, T] from "hidden".

    Never more than [B, T, VOCAB_CHUNK] logits at a time: the target logit is one dot product per
    token (Gather of W's rows), the log-sum-exp runs chunk by chunk over the vocabulary, and each text's
    next-token logits are its last position's row of those chunks (not a second product with W)."""
    V, cap = model.cfg.vocab_size, model.cfg.final_softcap                                # cap: Gemma 2's, or 0
    last = g.op("Unsqueeze", g.op("Sub", "lengths", g.const(np.int64(1))), g.const(np.array([1])))   # [B, 1]
    first = g.slice("input_ids", 0, 1, 1)
    following = g.op("Concat", g.slice("input_ids", 1, np.iinfo(np.int64).max, 1),
                     g.op("Mul", first, g.const(np.int64(0))), axis=1)                     # x_{t+1}, [B, T]
    target = g.op("ReduceSum", g.op("Mul", "hidden", g.gather(W, following)),
                  g.const(np.array([-1])), keepdims=0, hint="target_logit")               # [B, T]
    target = soft_cap(g, target, cap)
    rows, chunks = [], []
    for v in range(0, V, VOCAB_CHUNK):
        z = soft_cap(g, _times_rows(g, "hidden", W, v, V), cap)                          # [B, T, chunk]
        rows.append(g.op("GatherND", z, last, batch_dims=1))                              # [B, chunk]
        chunks.append(g.logsumexp(z, 1))                                                  # [B, T, 1]
    g.op("Concat", *rows, axis=-1, out="next_token_logits")                               # [B, V]
    lse = g.logsumexp(g.op("Concat", *chunks, axis=-1), 0)                                 # [B, T]
    logp_next = g.op("Min", g.op("Sub", target, lse), g.const(scalar(0.0)))
    zero = g.op("Cast", g.op("Mul", first, g.const(np.int64(0))), to=FLOAT)               # [B, 1]
    g.op("Concat", zero, g.slice(logp_next, 0, -1, 1), axis=1, out="token_logprobs")       # [B, T]


def _rows(g: Graph, W: str, v: int, V: int) -> str:
    """Rows v..v+VOCAB_CHUNK of the unembedding W, in the compute type."""
    return g.widen(g.slice(W, v, min(v + VOCAB_CHUNK, V), 0), of=W)


def _times_rows(g: Graph, x: str, W: str, v: int, V: int) -> str:
    """x @ W[v:v+VOCAB_CHUNK]^T: those rows widened, or a quantised W's rows multiplied in their blocks."""
    if W in g.blocks:
        return g.times(x, W, (v, min(v + VOCAB_CHUNK, V)))
    return g.op("MatMul", x, g.op("Transpose", _rows(g, W, v, V)))


def logits(g: Graph, model: Transformer, x: str, W: str) -> str:
    """transformer.logits: x @ W^T [..., V], soft-capped where the model caps. A W stored narrower is widened
    VOCAB_CHUNK rows at a time (never whole in the compute type); a float32 one is read in one MatMul, and so is a
    quantised one in a packed graph (prepacked, it is never de-quantised whole; sliced, each chunk would be a copy)."""
    V = model.cfg.vocab_size
    if W in g.blocks and g.packed:
        y = g.times(x, W)
    elif W not in g.blocks and g.feeds[W].dtype == COMPUTE:
        y = g.op("MatMul", x, g.op("Transpose", W))
    else:
        y = g.op("Concat", *[_times_rows(g, x, W, v, V) for v in range(0, V, VOCAB_CHUNK)], axis=-1)
    return soft_cap(g, y, model.cfg.final_softcap)
