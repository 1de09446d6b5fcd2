"""The same model as small graphs, for the layer-by-layer run of long texts (runtime/layerwise.py).

A block runs as three graphs: its attention's inputs (q, k, v), the attention of a group of heads, and its output
(head mask, output projection, MLP); plus the embedding and the final norm and LM head. The weights are graph inputs
(as in every graph), and the block graphs name them "block.*", so one small graph serves every layer: layer i binds
its own arrays (model/weights.block_arrays). The attention graph returns ctx
and, instead of its probabilities p [B, h, T, T], reductions of them (graphs/reductions.py): the registry's rows
(analysis/statistics.py), thumbnails, and the asked heads' probabilities or top-k keys; so a layer-by-layer run keeps these
and drops p, and holds one group of heads' p at a time.
"""
from __future__ import annotations

import onnx
from onnx import helper

from ..model.transformer import Transformer
from ..model.weights import arrays, block_arrays, identities
from .builder import FLOAT, INT, Graph, model_proto, pruned
from .reductions import OUTPUTS, VALUE_ROW, Reductions, needed_columns, reduce
from .steps import (attend, attention_inputs, block_output, embed, final, final_outputs, position_weights, rope_tables,
                    token_inputs, transformer_block, value_norms)


def build_embed(model: Transformer) -> onnx.ModelProto:
    """Transformer.embed as a graph: input_ids (token_type_ids) -> x [B, T, D]."""
    g = Graph(identities(arrays(model)))
    x, _, _ = embed(g, model)
    g.op("Identity", x, out="x")
    out = [helper.make_tensor_value_info("x", FLOAT, ["batch", "tokens", model.cfg.d_model])]
    return model_proto(g, token_inputs(model) + g.inputs, out, "attnscope-embed")


def build_final(model: Transformer, which: str = "final") -> onnx.ModelProto:
    """The final norm and LM head as a graph: x, input_ids, lengths -> hidden and the LM outputs ("final"); the final
    norm alone, x -> hidden ("final_norm"); or the next-token logits alone ("final_logits": a text's last position,
    runtime/blocks.final_parts). Pruned to those outputs: a graph runs every node it holds, and the log-prob's
    chunks would keep each widened chunk of a bfloat16 LM head alive until the last (2.2 GB for Llama 3's 128k
    vocabulary, faulted in at every request)."""
    g = Graph(identities(arrays(model)))
    final(g, model, "x", g.param(model.wte, "wte") if model.cfg.lm_head and model.lm_head is None else "",
          last_only=which == "final_logits")
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["batch", "tokens", model.cfg.d_model]),
              *token_inputs(model)[:1], helper.make_tensor_value_info("lengths", INT, ["batch"])]
    outputs = final_outputs(model.cfg)
    outputs = {"final": outputs, "final_norm": outputs[:1], "final_logits": outputs[1:2]}[which]
    return pruned(model_proto(g, inputs + g.inputs, outputs, "attnscope-final"))


BLOCK_HALVES = ("block_in", "block_kv", "block_out", "wide_block_in", "wide_block_out")   # runtime/layerwise.py's names


def weighted(which) -> bool:
    """Whether a layer-by-layer graph (runtime/layerwise.Layerwise.session's name for it) binds a block's weights: one
    graph per layout (model/weights.block_layouts)."""
    return which in BLOCK_HALVES or (isinstance(which, tuple) and which[0] == "layer")


def _halves(model: Transformer, i: int, wide: bool = False) -> tuple[Graph, Graph]:
    """Block i's attention inputs and its output, each as a graph reading the block's arrays as "block.*" inputs
    (wide: narrower float ones bound widened, builder.Graph's `wide`)."""
    cfg, f = model.cfg, FLOAT
    heads = ["batch", cfg.n_heads, "tokens", cfg.d_head]
    names = identities(block_arrays(model, i))
    first = Graph(names, wide)
    first.input("x", f, ["batch", "tokens", cfg.d_model])
    T = first.slice(first.op("Shape", "x"), 1, 2, 0, hint="T")
    start = first.input("start", INT, [1])            # x's first position (a long text's run of tokens; fed 0 else)
    _, qkv = attention_inputs(first, model.blocks[i], cfg, "block", "x", rope_tables(first, model, T, start, layer=i))
    for name, value in zip("qkv", qkv):
        first.op("Identity", value, out=name)
    second = Graph(names, wide)
    for name, shape in (("x", ["batch", "tokens", cfg.d_model]), ("ctx", heads), ("head_mask", ["batch", cfg.n_heads]),
                        ("head_mean", ["batch", cfg.n_heads])):
        second.input(name, f, shape)
    second.input("lengths", INT, ["batch"])
    T = second.slice(second.op("Shape", "x"), 1, 2, 0, hint="T")
    x = block_output(second, model.blocks[i], cfg, "block", "x", "ctx", "head_mask", "head_mean",
                      position_weights(second, T))
    second.op("Identity", x, out="x_next")
    return first, second


def build_block_halves(model: Transformer, wide: bool = False, layer: int = 0, first_outputs: str = "qkv"
                       ) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The block before its attention (x, start -> q, k, v [B, H, T, dh]: x holds positions start.. of the text, whose
    RoPE turns q and k; a model without RoPE has no input start) and after it (x, ctx, head_mask, head_mean [B, H],
    lengths -> x_next), for every layer of `layer`'s layout (model/weights.block_layouts: one graph per
    layout): bind model/weights.block_arrays(model, i) for layer i (wide: its bfloat16 or float16 arrays as float32
    inputs, bound widened: runtime/tensors.Weights.widening). first_outputs "kv": the first graph without the query
    projection ("block_kv": the keys and values of rows asked after a run, runtime/blocks.exact_qkv)."""
    first, second = _halves(model, layer, wide)
    f, heads = FLOAT, ["batch", model.cfg.n_heads, "tokens", model.cfg.d_head]
    return (pruned(model_proto(first, first.inputs, [helper.make_tensor_value_info(n, f, heads)
                                                     for n in first_outputs],
                           "attnscope-block-in")),
            pruned(model_proto(second, second.inputs, [helper.make_tensor_value_info(
                "x_next", f, ["batch", "tokens", model.cfg.d_model])], "attnscope-block-out")))


def _check(outputs) -> None:
    unknown = set(outputs) - set(OUTPUTS)
    if unknown:
        raise ValueError(f"unknown attention outputs {sorted(unknown)}; known: {', '.join(OUTPUTS)}")


def _reductions(g: Graph, st: dict[str, str], outputs, causal: bool, block: bool = False,
                values: str | None = None) -> dict[str, str]:
    """ctx and the reductions.OUTPUTS asked of the probabilities of an attention's stages st (steps.attend's); values:
    the keys' value norms where this graph computes them (else an input, Reductions.value_weighted)."""
    T = g.slice(g.op("Shape", st["q"]), 2, 3, 0, hint="T")
    r = Reductions(g, st["attentions"], st["masked"], T, causal, needed_columns(outputs, causal, values is None), block,
                   values)
    return {"ctx": st["ctx"]} | reduce(r, outputs)


def _outputs(g: Graph, made: dict[str, str], names) -> list:
    for name in names:
        g.op("Identity", made[name], out=name)
    return [helper.make_tensor_value_info(n, INT if n == "top_keys" else FLOAT, None) for n in names]


def build_attend(model: Transformer, outputs, causal: bool, block: bool = False, ctx: bool = True
                 ) -> onnx.ModelProto:
    """The attention of a group of heads: q, k, v [B, h, T, dh], attention_mask -> ctx [B, h, T, dh] and the
    reductions.OUTPUTS asked, nothing else (onnxruntime runs every node of a graph, asked for or not). `causal`: the
    run's mask hides every later key (a cheaper distance). A local layer's mask arrives with its band
    (TransformerBlock.local_mask, Layerwise.layer_mask): one graph serves every layer. block: q holds a block of
    queries and k, v the keys they may see, the mask [B, 1, Tq, Tk] those rows and columns of the layer's; the
    reductions are those of the whole text's rows (graphs/reductions.py, input offsets; runtime/blocks.py). ctx
    False: the outputs alone, no ctx (nor v): a block's weights, for exact rows and tiles (runtime/blocks.exact_parts)."""
    cfg, g = model.cfg, Graph()
    _check(outputs)
    if block and "thumbnail_even" in outputs:
        raise ValueError("a block of queries pools with the general thumbnail (pool and pool_keys, or cell_keys)")
    for name in "qkv":
        g.input(name, FLOAT, ["batch", "heads", "queries" if block and name == "q" else "tokens", cfg.d_head])
    g.input("attention_mask", FLOAT, ["batch", "mask_heads", "queries" if block else "tokens", "tokens"])
    made = _reductions(g, attend(g, model.blocks[0].attn, "attend", "q", "k", "v", "attention_mask"), outputs, causal,
                       block)
    names = ("ctx",) * ctx + tuple(outputs)
    return pruned(model_proto(g, g.inputs, _outputs(g, made, names), "attnscope-attend"))


def build_layer(model: Transformer, outputs, causal: bool, layer: int = 0) -> onnx.ModelProto:
    """A whole block in one graph, the three above joined where a run's heads are one group (on a GPU, where each
    run costs a launch and a synchronisation: one run a layer instead of three): x [B, T, D], attention_mask,
    head_mask, head_mean [B, H], lengths -> x_next and the reductions.OUTPUTS asked of all heads: the one block
    builder's (steps.transformer_block), the same steps as block_in's, build_attend's, then block_out's, in the same
    order (the same numbers: runtime/layerwise.py's fused walk). Built from block `layer`: it serves the blocks of
    its layout (model/weights.block_layouts)."""
    cfg, f = model.cfg, FLOAT
    _check(outputs)
    g = Graph(identities(block_arrays(model, layer)))
    g.input("x", f, ["batch", "tokens", cfg.d_model])
    g.input("attention_mask", FLOAT, ["batch", "mask_heads", "tokens", "tokens"])
    for name in ("head_mask", "head_mean"):
        g.input(name, f, ["batch", cfg.n_heads])
    g.input("lengths", INT, ["batch"])
    T = g.slice(g.op("Shape", "x"), 1, 2, 0, hint="T")
    x_next, st = transformer_block(g, model.blocks[layer], cfg, "block", "x", "attention_mask", "head_mask",
                                   "head_mean", position_weights(g, T), rope_tables(g, model, T, layer=layer))
    values = value_norms(g, model.blocks[layer], cfg, "block.attn", st["v"]) if VALUE_ROW in outputs else None
    made = _reductions(g, st, outputs, causal, values=values) | {"x_next": x_next}
    return pruned(model_proto(g, g.inputs, _outputs(g, made, ("x_next",) + tuple(outputs)), "attnscope-layer"))


def build(model: Transformer, which, layer: int = 0) -> onnx.ModelProto:
    """The layer-by-layer graph runtime/layerwise.Layerwise.session names `which`: "embed", "final", "final_norm",
    "final_logits", a BLOCK_HALVES name, or ("attend" | "attend_block" | "weights_block" | "layer", outputs, causal)
    (weights_block: an attend_block without ctx); a graph binding a block's weights (`weighted`) built from block
    `layer`, for the blocks of its layout."""
    if which == "embed":
        return build_embed(model)
    if which in ("final", "final_norm", "final_logits"):     # runtime/blocks.final_parts
        return build_final(model, which)
    if which in BLOCK_HALVES:                          # wide_: bfloat16 or float16 weights bound widened once
        return build_block_halves(model, which.startswith("wide_"), layer,
                                  "kv" if which.endswith("_kv") else "qkv")[which.endswith("out")]
    kind, outputs, causal = which
    if kind == "layer":
        return build_layer(model, outputs, causal, layer)
    return build_attend(model, outputs, causal, block=kind != "attend", ctx=kind != "weights_block")
