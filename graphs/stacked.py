"""The model as one ONNX graph, the one the app serves, built from graphs/steps.py for every layer.

Inputs:  input_ids [B, T] int64, (token_type_ids [B, T] int64), attention_mask [B, 1|H, T, T] float
         (additive: padding, causality and user masks all arrive here, so no re-export is needed),
         head_mask, head_mean [B, L, H] float and lengths [B] int64: the head-mask contract of
         functional.ablate_heads (keep everything: head_mask 1, head_mean 0; lengths = each text's tokens).
Outputs: hidden [B, T, D], attentions [L, B, H, T, T]; with an LM head also next_token_logits [B, V]
         (after each text's last token) and token_logprobs [B, T]; with stages=True also the teaching
         intermediates (transformer.STAGES): x [L, B, T, D], q, k, v, ctx [L, B, H, T, d_head] and
         scores, scaled, masked [L, B, H, T, T]; with the attentions, each key's value norms ||v_j W_O^h||
         value_norms [L, B, H, T] (TransformerBlock.value_norms).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..model.transformer import SQUARE_STAGES, STAGES, Transformer
from ..model.weights import arrays, identities
from .builder import FLOAT, INT, Graph, model_proto, pruned, save_checked
from .steps import (embed, final, final_outputs, position_weights, rope_tables, sliding_window_mask, token_inputs,
                    transformer_block, value_norms)


def build_graph(model: Transformer, stages: bool = False, progress=None, attentions: bool = True,
                depth: int | None = None) -> onnx.ModelProto:
    """The model as one ONNX graph; each step below names the NumPy code it mirrors. attentions=False leaves out
    the stacked probabilities (hidden states and LM outputs only: what a plain inference graph returns). depth: the
    run stops after that many blocks and returns only their attentions, one [B, H, T, T] output per block (a request
    for the first layers needs nothing above them, nor the last block's values, MLP or LM head; onnxruntime runs
    every node of a graph, so stopping is a graph of its own). Its
    nodes are the first blocks' nodes of the whole graph, so their probabilities are the same, bit for bit."""
    cfg, g = model.cfg, Graph(identities(arrays(model)))
    H, dh, L = cfg.n_heads, cfg.d_head, cfg.n_layers
    inputs = token_inputs(model) + [
        helper.make_tensor_value_info("attention_mask", FLOAT, ["batch", "mask_heads", "tokens", "tokens"]),
        helper.make_tensor_value_info("head_mask", FLOAT, ["batch", L, H]),
        helper.make_tensor_value_info("head_mean", FLOAT, ["batch", L, H]),
        helper.make_tensor_value_info("lengths", INT, ["batch"])]
    x, wte, T = embed(g, model)
    weights = position_weights(g, T)
    ropes, masks = {}, {}   # RoPE tables by their array (local layers may have their own), masks by window
    collected = {name: [] for name in ("attentions",) + STAGES}
    norms = []              # each block's value norms [B, H, T] (value-weighted statistics), None in quantised blocks
    for i, block in enumerate(model.blocks[:depth]):
        layer = g.const(np.array(i, np.int64))
        keep, mean = (g.op("Gather", name, layer, axis=1) for name in ("head_mask", "head_mean"))   # [B, H]
        tables = model.rope_for(i)
        if tables is not None and id(tables[0]) not in ropes:
            ropes[id(tables[0])] = rope_tables(g, model, T, layer=i)
        if block.window not in masks:   # TransformerBlock.local_mask: a local layer's band, from positions
            masks[block.window] = sliding_window_mask(g, "attention_mask", T, T, block.window) if block.window \
                else "attention_mask"
        x, st = transformer_block(g, block, cfg, f"blocks.{i}", x, masks[block.window], keep, mean, weights,
                                  None if tables is None else ropes[id(tables[0])])
        for name in collected:
            collected[name].append(st[name])
        norms.append(value_norms(g, block, cfg, f"blocks.{i}.attn", st["v"]))
        if progress:
            progress(1)
    if depth is None:
        final(g, model, x, wte)

    Ls = ["layers", "batch", "heads", "tokens"]
    if depth:   # each block's probabilities are an output of their own, in layer order: the runtime binds them to the
        outputs = [helper.make_tensor_value_info(t, FLOAT, Ls[1:] + ["tokens"])   # slices of one [depth, B, H, T,
                   for t in collected["attentions"]]                        # T] buffer, no copy
        outputs += [helper.make_tensor_value_info(g.op("Identity", n, out=f"value_norms.{i}"), FLOAT, Ls[1:])
                    for i, n in enumerate(norms)]                           # and their value norms, "value_norms.i"
        return pruned(model_proto(g, inputs + g.inputs, outputs, "attnscope"))
    axis0 = g.const(np.array([0]), "axis0")
    if attentions:
        collected["value_norms"] = norms
    names = (("attentions",) if attentions else ()) + (STAGES if stages else ()) + tuple(
        n for n in ("value_norms",) if n in collected)
    for name in names:
        g.op("Concat", *[g.op("Unsqueeze", t, axis0) for t in collected[name]], axis=0, out=name)
    dims = {n: Ls + (["tokens"] if n in ("attentions",) + SQUARE_STAGES else [dh]) for n in names}
    dims["x"] = ["layers", "batch", "tokens", cfg.d_model]
    dims["value_norms"] = Ls
    outputs = final_outputs(cfg) + [helper.make_tensor_value_info(n, FLOAT, dims[n]) for n in names]
    proto = model_proto(g, inputs + g.inputs, outputs, "attnscope")
    return proto if attentions else pruned(proto)


def export(model: Transformer, path, stages: bool = False, desc: str = "export") -> None:
    """Write the graph to `path` (atomically), with a progress bar, and validate it with onnx.checker."""
    from tqdm import tqdm

    with tqdm(total=len(model.blocks) + 2, desc=f"{desc}: building ONNX", unit="step", leave=False) as bar:
        save_checked(build_graph(model, stages, progress=bar.update), path, bar.update)
