"""The decoding step (model/decoding.py) as one ONNX graph: new tokens in, next-token logits, their attention rows and
the grown key/value cache out, every layer in one run (runtime/generation.py runs it once per generated token).

Inputs:  input_ids [B, t] int64 (the new tokens, at positions P..P+t-1), past.{l}.key and past.{l}.value
         [B, Hkv, P, d_head] for every layer l (P = 0 for the prompt), attention_mask [B, 1, t, P+t] (additive),
         head_mask [B, L, H] (1 keeps a head, 0 makes its output zero), key_mask [B, L, Hkv, P+t] (additive: the
         keys a cache policy has evicted from each layer's key/value heads, model/kv_policies.py; zeros keep all),
         votes [B, t] (each new query's weight in `received`)
Outputs: next_token_logits [B, V] after the last new token, attentions [L, B, H, P+t] (its attention rows),
         received [L, B, Hkv, P+t] (the attention each key got, summed over the voting queries and the query heads
         of its key/value head), head_outputs [L, B, H, d_head] (the last new token's z, hook_z),
         present.{l}.key and present.{l}.value [B, Hkv, P+t, d_head]
The weights are graph inputs, as in every graph (graphs/builder.py), bound at each step from the weight store (with
them as initializers onnxruntime packed each matrix once, 27 ms a SmolLM2 token against 31-32 with them as inputs,
bench/generate.py; weights outside the graph are what lets an 8B model load at all). Quantised weights that come to
at most PACKED_BYTES are the exception: MatMulNBits de-quantises a bound input whole at every run, so the session
opens them as initializers that onnxruntime prepacks (builder.Graph's packed; still not in the graph file): from
their blocks SmolLM2 took 96 ms a token bound, 16 packed (24 from float32 weights), Gemma 3 235 and 30 (40).
Built on first use into the graph cache (graphs/cache.py).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..model.transformer import Transformer
from ..model.quantized import Blocks
from ..model.weights import arrays, identities, state_dict
from ..model.precision import MASKED
from .builder import FLOAT, INT, Graph, model_proto, pruned, save_checked
from .steps import embed, logits, rope_tables, sliding_window_mask, transformer_block


def cache_names(layer: int) -> tuple[str, str, str, str]:
    """past key, past value, present key, present value of a layer."""
    return f"past.{layer}.key", f"past.{layer}.value", f"present.{layer}.key", f"present.{layer}.value"


# A model whose quantised weights come to at most this many bytes decodes with them as initializers that onnxruntime
# prepacks (builder.Graph's packed: a decoding step multiplies one token by every weight, and MatMulNBits de-quantises
# a bound input whole at every run). Bigger ones bind them at each step: a prepacked copy would double their memory.
PACKED_BYTES = 1 << 30


def packs(model: Transformer) -> bool:
    """Whether the decoding graph reads `model`'s quantised weights as prepacked initializers (PACKED_BYTES)."""
    quantised = [w.nbytes for w in state_dict(model).values() if isinstance(w, Blocks)]
    return bool(quantised) and sum(quantised) <= PACKED_BYTES


def build_decode(model: Transformer) -> onnx.ModelProto:
    """decoding.decode (model/decoding.py) as a graph, step for step."""
    cfg, f = model.cfg, FLOAT
    if not (cfg.causal and cfg.lm_head):
        raise ValueError("decoding needs a decoder with an LM head (a causal model that predicts the next token)")
    g = Graph(identities(arrays(model)), packed=packs(model))
    cache = ["batch", cfg.n_kv_heads, "past", cfg.d_head]
    inputs = [helper.make_tensor_value_info("input_ids", INT, ["batch", "tokens"])]
    for layer in range(cfg.n_layers):
        inputs += [helper.make_tensor_value_info(name, f, cache) for name in cache_names(layer)[:2]]
    inputs += [helper.make_tensor_value_info("attention_mask", f, ["batch", 1, "tokens", "keys"]),
               helper.make_tensor_value_info("head_mask", f, ["batch", cfg.n_layers, cfg.n_heads]),
               helper.make_tensor_value_info("key_mask", f, ["batch", cfg.n_layers, cfg.n_kv_heads, "keys"]),
               helper.make_tensor_value_info("votes", f, ["batch", "tokens"])]
    P = g.slice(g.op("Shape", "past.0.key"), 2, 3, 0, hint="P")
    group = cfg.n_heads // cfg.n_kv_heads
    votes = g.op("Unsqueeze", "votes", g.const(np.array([1, 3])))                     # [B, 1, t, 1]
    x, wte, T = embed(g, model, start=P)                                             # [B, t, D]
    ropes, masks, rows, received, z = {}, {}, [], [], []   # RoPE tables (local layers may have their own), masks
    for i, block in enumerate(model.blocks):
        p, (past_k, past_v, present_k, present_v) = f"blocks.{i}", cache_names(i)
        tables = model.rope_for(i)
        if tables is not None and id(tables[0]) not in ropes:
            ropes[id(tables[0])] = rope_tables(g, model, T, start=P, layer=i)
        if block.window not in masks:   # decoding.decode: block.local_mask at positions P..P+t-1
            masks[block.window] = sliding_window_mask(g, "attention_mask", T, g.op("Add", P, T), block.window, P) \
                if block.window else "attention_mask"
        rope = None if tables is None else ropes[id(tables[0])]
        keep = g.op("Gather", "head_mask", g.const(np.array(i, np.int64)), axis=1)    # [B, H]
        evicted = g.op("Unsqueeze", g.op("Gather", "key_mask", g.const(np.array(i, np.int64)), axis=1),
                       g.const(np.array([2])))                                          # [B, Hkv, 1, P+t]
        evicted = repeat_kv_mask(g, evicted, group, cfg.n_heads)                        # [B, H, 1, P+t]
        mask = g.op("Max", g.op("Add", masks[block.window], evicted), g.const(MASKED), hint=f"{p}.kept_keys")
        x, st = transformer_block(g, block, cfg, p, x, mask, keep, rope=rope, past=(past_k, past_v),
                                  present=(present_k, present_v))                     # probs [B, H, t, P+t]
        rows.append(g.op("Gather", st["attentions"], g.const(np.array(-1, np.int64)), axis=2))   # [B, H, P+t]
        summed = g.op("ReduceSum", g.op("Mul", st["attentions"], votes), g.const(np.array([2])), keepdims=0)
        received.append(g.op("ReduceSum", g.op("Reshape", summed, g.const(np.array([0, cfg.n_kv_heads, group, -1]))),
                             g.const(np.array([2])), keepdims=0))                      # [B, Hkv, P+t]
        z.append(g.op("Gather", st["ctx"], g.const(np.array(-1, np.int64)), axis=2))   # [B, H, dh]
    last = g.op("Gather", x, g.const(np.array(-1, np.int64)), axis=1)                 # [B, D]
    if model.ln_f is not None:
        last = g.norm(last, model.ln_f, "ln_f")
    W = wte if model.lm_head is None else g.param(model.lm_head.weight, "lm_head")
    g.op("Identity", logits(g, model, last, W), out="next_token_logits")             # [B, V]
    axis0 = g.const(np.array([0]))
    g.op("Concat", *[g.op("Unsqueeze", r, axis0) for r in rows], axis=0, out="attentions")
    g.op("Concat", *[g.op("Unsqueeze", r, axis0) for r in received], axis=0, out="received")
    g.op("Concat", *[g.op("Unsqueeze", r, axis0) for r in z], axis=0, out="head_outputs")
    present = ["batch", cfg.n_kv_heads, "keys", cfg.d_head]
    outputs = [helper.make_tensor_value_info("next_token_logits", f, ["batch", cfg.vocab_size]),
               helper.make_tensor_value_info("attentions", f, [cfg.n_layers, "batch", cfg.n_heads, "keys"]),
               helper.make_tensor_value_info("received", f, [cfg.n_layers, "batch", cfg.n_kv_heads, "keys"]),
               helper.make_tensor_value_info("head_outputs", f, [cfg.n_layers, "batch", cfg.n_heads, cfg.d_head])]
    for layer in range(cfg.n_layers):
        outputs += [helper.make_tensor_value_info(name, f, present) for name in cache_names(layer)[2:]]
    return pruned(model_proto(g, inputs + g.inputs, outputs, "attnscope-decode"))


def repeat_kv_mask(g: Graph, mask: str, group: int, n_heads: int) -> str:
    """functional.repeat_kv on a key/value head's mask [B, Hkv, 1, S] -> [B, H, 1, S]: query head h reads kv head
    h // group's."""
    if group == 1:
        return mask
    return g.op("Reshape", g.op("Expand", g.op("Unsqueeze", mask, g.const(np.array([2]))),
                                g.const(np.array([1, 1, group, 1, 1]))), g.const(np.array([0, n_heads, 1, -1])))


def export(model: Transformer, path, desc: str = "export") -> None:
    """Write the decoding graph to `path` (atomically), with a progress bar, and validate it with onnx.checker."""
    from tqdm import tqdm

    with tqdm(total=3, desc=f"{desc}: building the decoding graph", unit="step", leave=False) as bar:
        proto = build_decode(model)
        bar.update(1)
        save_checked(proto, path, bar.update)
