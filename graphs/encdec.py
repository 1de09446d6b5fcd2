"""An encoder-decoder (model/encdec.py) as one ONNX graph: both stacks in one run, as a request needs them.

Inputs:  input_ids [B, S], decoder_input_ids [B, T] int64; additive masks encoder_mask [B, 1, S, S], decoder_mask
         [B, 1, T, T] (causal + padding), cross_mask [B, 1, T, S]; decoder_lengths [B] int64.
Outputs: encoder_hidden [B, S, D], hidden [B, T, D], encoder_attentions [L, B, H, S, S], decoder_attentions
         [L_dec, B, H, T, T], cross_attentions [L_dec, B, H, T, S], next_token_logits [B, V] (after each decoder
         text's last token), token_logprobs [B, T] (log p of each decoder token; 0 for the first).
Each function names the NumPy code it mirrors, step for step; the blocks are graphs/steps.transformer_block's, the one
block builder of every graph (as model/encdec.py's are model/transformer.TransformerBlock), their attention
graphs/steps.attend.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..model.encdec import EncoderDecoder
from ..model.masks import MASKED
from ..model.precision import scalar
from ..model.weights import arrays, identities
from .builder import FLOAT, INT, Graph, model_proto, save_checked
from .steps import transformer_block

INPUTS = (("input_ids", INT, ["batch", "source"]),
          ("decoder_input_ids", INT, ["batch", "target"]),
          ("encoder_mask", FLOAT, ["batch", 1, "source", "source"]),
          ("decoder_mask", FLOAT, ["batch", 1, "target", "target"]),
          ("cross_mask", FLOAT, ["batch", 1, "target", "source"]),
          ("decoder_lengths", INT, ["batch"]))
OUTPUTS = ("encoder_hidden", "hidden", "encoder_attentions", "decoder_attentions", "cross_attentions",
           "next_token_logits", "token_logprobs")


def length(g: Graph, ids: str) -> str:
    """T of ids [B, T], a 1-element int64 tensor."""
    return g.slice(g.op("Shape", ids), 1, 2, 0, hint="T")


def embed(g: Graph, model: EncoderDecoder, ids: str, decoder: bool) -> str:
    """EncoderDecoder.embed: shared[ids] * embed_scale (+ wpe[offset:offset+T] or sinusoids[:T]) (then
    layernorm_embedding) -> [B, T, D]."""
    cfg, side = model.cfg, "dec" if decoder else "enc"
    T = length(g, ids)
    shared = g.param(model.shared, "shared")
    x = g.widen(g.op("Gather", shared, ids), of=shared)
    if cfg.embed_scale != 1.0:
        x = g.op("Mul", x, g.const(scalar(cfg.embed_scale), "embed_scale"))
    wpe = model.dec_wpe if decoder else model.enc_wpe
    if wpe is not None:
        start = g.const(np.array([cfg.position_offset], np.int64), "position_offset")
        table = g.param(wpe, f"{side}_wpe")
        x = g.op("Add", x, g.widen(g.slice(table, start, g.op("Add", start, T), 0), of=table))
    if model.sinusoids is not None:
        x = g.op("Add", x, g.slice(g.param(model.sinusoids, "sinusoids"), 0, T, 0))
    ln = model.dec_ln_embed if decoder else model.enc_ln_embed
    return x if ln is None else g.norm(x, ln, f"{side}_ln_embed")


def position_bias(g: Graph, bias, name: str, Tq: str, S: str) -> str:
    """RelativePositionBias.__call__: by_distance[j - i + P - 1] for query i, key j -> [1, H, Tq, S], by_distance
    being weight[buckets] (the buckets a constant of the graph, the weight its input)."""
    P = bias.cfg.max_positions
    rng = lambda n: g.op("Range", g.const(np.int64(0)), g.op("Squeeze", n, g.const(np.array([0]))),   # noqa: E731
                         g.const(np.int64(1)))
    distance = g.op("Add", g.op("Sub", g.op("Unsqueeze", rng(S), g.const(np.array([0]))),
                                g.op("Unsqueeze", rng(Tq), g.const(np.array([1])))), g.const(np.int64(P - 1)))
    weight = g.param(bias.weight, name)                                                  # [buckets, H]
    table = g.widen(g.op("Gather", weight, g.op("Gather", g.const(bias.buckets, "buckets"), distance)), of=weight)
    return g.op("Unsqueeze", g.op("Transpose", table, perm=[2, 0, 1]), g.const(np.array([0])), hint=name)


def lm_outputs(g: Graph, model: EncoderDecoder, hidden: str) -> None:
    """EncoderDecoder.logits and the log-probs of EncoderDecoder.__call__: next_token_logits [B, V] after each
    text's last token, token_logprobs [B, T] (the decoder's texts are short: every position's logits are made)."""
    cfg = model.cfg
    h = hidden if cfg.lm_scale == 1.0 else g.op("Mul", hidden, g.const(scalar(cfg.lm_scale), "lm_scale"))
    W = g.op("Transpose", g.weight(model.unembedding, "unembedding"))                      # [D, V]
    logits = g.op("MatMul", h, W, hint="logits")                                          # [B, T, V]
    if model.logits_bias is not None:
        logits = g.op("Add", logits, g.weight(model.logits_bias, "logits_bias"))
    last = g.op("Unsqueeze", g.op("Sub", "decoder_lengths", g.const(np.int64(1))), g.const(np.array([1])))
    g.op("GatherND", logits, last, batch_dims=1, out="next_token_logits")                  # [B, V]
    ids = "decoder_input_ids"
    first = g.slice(ids, 0, 1, 1)
    following = g.op("Concat", g.slice(ids, 1, np.iinfo(np.int64).max, 1), g.op("Mul", first, g.const(np.int64(0))),
                     axis=1)                                                              # x_{t+1}, [B, T]
    target = g.op("Squeeze", g.op("GatherElements", logits, g.op("Unsqueeze", following, g.const(np.array([2]))),
                                  axis=2), g.const(np.array([2])))                        # [B, T]
    logp_next = g.op("Sub", target, g.logsumexp(logits, 0))
    zero = g.op("Cast", g.op("Mul", first, g.const(np.int64(0))), to=FLOAT)  # [B, 1]
    g.op("Concat", zero, g.slice(logp_next, 0, -1, 1), axis=1, out="token_logprobs")


ATTENTIONS = ("encoder", "decoder", "cross")   # an encoder-decoder's three attentions: stack's self-attention, cross


def build_graph(model: EncoderDecoder, edits: bool = False) -> onnx.ModelProto:
    """EncoderDecoder.__call__ as one graph. edits: the graph of runs with edits (runtime/encdec.py's interventions),
    model/interventions.forward_encoder_decoder's: for each attention a of ATTENTIONS three more inputs,
    {a}_knocked [B, L, H, Tq|1, Tk|1] bool (a knockout's cells, model/interventions.knockout: MASKED in the layer's mask
    there, as runtime/interventions.py's knockouts are), {a}_edited [B, L, H, Tq] bool and {a}_edits
    [B, L, H, Tq, dh] (values put into its heads' outputs, hook_z: steps.edited_heads), and one more output,
    {a}_head_output [L, B, H, Tq, dh] (each head's output as the run computed it, edits made)."""
    cfg, g = model.cfg, Graph(identities(arrays(model)))
    S, T = length(g, "input_ids"), length(g, "decoder_input_ids")
    enc_mask, dec_mask = "encoder_mask", "decoder_mask"
    if model.enc_bias is not None:                       # T5: the position bias joins the masks
        enc_mask = g.op("Add", enc_mask, position_bias(g, model.enc_bias, "enc_bias", S, S))
        dec_mask = g.op("Add", dec_mask, position_bias(g, model.dec_bias, "dec_bias", T, T))

    def patch(a: str, layer: int):
        """Layer `layer`'s edits of attention a's head outputs, from the edits graph's inputs (None: no edits)."""
        if not edits:
            return None
        i = g.const(np.array(layer, np.int64))
        return tuple(g.op("Gather", f"{a}_{n}", i, axis=1) for n in ("edited", "edits"))

    def knocked(a: str, layer: int, mask: str) -> str:
        """Layer `layer`'s mask of attention a, MASKED on the cells its knockouts block (the edits graph's)."""
        if not edits:
            return mask
        cells = g.op("Gather", f"{a}_knocked", g.const(np.array(layer, np.int64)), axis=1)   # [B, H, Tq, Tk]
        return g.op("Where", cells, g.const(MASKED), mask, hint=f"{a}.{layer}.knocked")

    kept = {a: [] for a in ATTENTIONS}
    heads = {a: [] for a in ATTENTIONS}
    x = embed(g, model, "input_ids", decoder=False)
    for i, b in enumerate(model.encoder):
        x, st = transformer_block(g, b, cfg, f"encoder.{i}", x, knocked("encoder", i, enc_mask),
                                  patch=patch("encoder", i))
        kept["encoder"].append(st["attentions"])
        heads["encoder"].append(st["ctx"])
    memory = x if model.enc_ln_f is None else g.norm(x, model.enc_ln_f, "enc_ln_f")
    g.op("Identity", memory, out="encoder_hidden")
    y = embed(g, model, "decoder_input_ids", decoder=True)
    for i, b in enumerate(model.decoder):
        y, st = transformer_block(g, b, cfg, f"decoder.{i}", y, knocked("decoder", i, dec_mask), memory=memory,
                                  cross_mask=knocked("cross", i, "cross_mask"), patch=patch("decoder", i),
                                  cross_patch=patch("cross", i))
        kept["decoder"].append(st["attentions"])
        kept["cross"].append(st["cross"]["attentions"])
        heads["decoder"].append(st["ctx"])
        heads["cross"].append(st["cross"]["ctx"])
    hidden = y if model.dec_ln_f is None else g.norm(y, model.dec_ln_f, "dec_ln_f")
    g.op("Identity", hidden, out="hidden")
    stacked = lambda parts, out: g.op("Concat", *[g.op("Unsqueeze", p, g.const(np.array([0]))) for p in parts],  # noqa: E731
                                      axis=0, out=out)
    for name, probs in kept.items():
        stacked(probs, f"{name}_attentions")
    lm_outputs(g, model, "hidden")
    f, H, dh = FLOAT, cfg.n_heads, cfg.d_head
    layers = {"encoder": cfg.n_layers, "decoder": cfg.n_decoder_layers, "cross": cfg.n_decoder_layers}
    queries = {"encoder": "source", "decoder": "target", "cross": "target"}
    inputs = [helper.make_tensor_value_info(*i) for i in INPUTS]
    dims = {"encoder_hidden": ["batch", "source", cfg.d_model], "hidden": ["batch", "target", cfg.d_model],
            "encoder_attentions": [cfg.n_layers, "batch", cfg.n_heads, "source", "source"],
            "decoder_attentions": [cfg.n_decoder_layers, "batch", cfg.n_heads, "target", "target"],
            "cross_attentions": [cfg.n_decoder_layers, "batch", cfg.n_heads, "target", "source"],
            "next_token_logits": ["batch", cfg.vocab_size], "token_logprobs": ["batch", "target"]}
    outputs = [helper.make_tensor_value_info(n, f, dims[n]) for n in OUTPUTS]
    if edits:
        for a in ATTENTIONS:
            L, Tq = layers[a], queries[a]
            Tk = "target" if a == "decoder" else "source"
            # its own query and key axes: [B, L, H, 1, 1] (nothing knocked) broadcasts, so a batch of rows without a
            # knockout of attention a feeds no [Tq, Tk] cells (runtime/encdec.py _edit_feeds)
            inputs += [helper.make_tensor_value_info(f"{a}_knocked", onnx.TensorProto.BOOL,
                                                     ["batch", L, H, f"{a}_knocked_queries", f"{a}_knocked_keys"]),
                       helper.make_tensor_value_info(f"{a}_edited", onnx.TensorProto.BOOL, ["batch", L, H, Tq]),
                       helper.make_tensor_value_info(f"{a}_edits", f, ["batch", L, H, Tq, dh])]
            stacked(heads[a], f"{a}_head_output")
            outputs.append(helper.make_tensor_value_info(f"{a}_head_output", f, [L, "batch", H, Tq, dh]))
    return model_proto(g, inputs + g.inputs, outputs, "attnscope-encoder-decoder" + ("-edits" if edits else ""))


def export(model: EncoderDecoder, path, desc: str = "export", edits: bool = False) -> None:
    """Write the graph (with edits: build_graph's) to `path` (atomically) and validate it with onnx.checker."""
    save_checked(build_graph(model, edits), path)
