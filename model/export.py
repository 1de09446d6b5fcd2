"""NumPy Transformer -> ONNX graph, node by node with onnx.helper, mirroring transformer.py.

Inputs:  input_ids [B, T] int64, (token_type_ids [B, T] int64), attention_mask [B, 1|H, T, T] float
         (additive: padding, causality and user masks all arrive here, so no re-export is needed).
Outputs: hidden [B, T, D], attentions [L, B, H, T, T]; with stages=True also q, k [L, B, H, T, d_head]
         and scores, scaled, masked [L, B, H, T, T], the teaching intermediates.
Positions are taken as wpe[:T] with Shape + Slice (no Gather over a Range, which onnxruntime's
GatherToSliceFusion mis-optimises).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .transformer import STAGES, Transformer

OPSET = 17
IR_VERSION = 8  # the IR version of opset 17; onnx 1.23 would write 14, which onnxruntime 1.31 refuses


class _Graph:
    """Accumulates nodes and initializers; every method returns the name of its output."""

    def __init__(self):
        self.nodes, self.inits, self._n = [], [], 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, *inputs: str, hint: str | None = None, out: str | None = None, **attrs) -> str:
        out = out or self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None, hint: str) -> str:
        y = self.op("MatMul", x, self.const(np.ascontiguousarray(weight.T), hint + ".weightT"), hint=hint)
        return y if bias is None else self.op("Add", y, self.const(bias, hint + ".bias"), hint=hint)

    def layer_norm(self, x: str, ln, hint: str) -> str:
        return self.op("LayerNormalization", x, self.const(ln.weight, hint + ".weight"),
                       self.const(ln.bias, hint + ".bias"), axis=-1, epsilon=float(ln.eps), hint=hint)

    def gelu(self, x: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt 2)), the exact form."""
        e = self.op("Erf", self.op("Mul", x, self.const(np.float32(1 / np.sqrt(2)))))
        return self.op("Mul", self.op("Mul", x, self.op("Add", e, self.const(np.float32(1.0)))),
                       self.const(np.float32(0.5)))


def build_graph(model: Transformer, stages: bool = False, progress=None) -> onnx.ModelProto:
    cfg, g = model.cfg, _Graph()
    H, dh, D = cfg.n_heads, cfg.d_head, cfg.d_model
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"])]
    if model.wtt is not None:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "tokens"]))
    inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT,
                                                ["batch", "mask_heads", "tokens", "tokens"]))

    # embeddings: wte[ids] + wpe[:T] (+ wtt[types]), then LayerNorm for BERT
    T = g.op("Slice", g.op("Shape", "input_ids"), g.const(np.array([1])), g.const(np.array([2])), hint="T")
    x = g.op("Add", g.op("Gather", g.const(model.wte, "wte"), "input_ids"),
             g.op("Slice", g.const(model.wpe, "wpe"), g.const(np.array([0])), T, g.const(np.array([0]))))
    if model.wtt is not None:
        x = g.op("Add", x, g.op("Gather", g.const(model.wtt, "wtt"), "token_type_ids"))
    if model.ln_embed is not None:
        x = g.layer_norm(x, model.ln_embed, "ln_embed")

    split_heads = g.const(np.array([0, 0, H, dh]), "split_heads")
    merge_heads = g.const(np.array([0, 0, D]), "merge_heads")
    scale = g.const(np.float32(1.0 / (np.sqrt(dh) * cfg.temperature)), "scale")
    collected = {name: [] for name in ("attentions",) + STAGES}
    for i, block in enumerate(model.blocks):
        p, attn = f"blocks.{i}", block.attn
        h = g.layer_norm(x, block.ln1, p + ".ln1") if cfg.norm_first else x
        heads = [g.op("Transpose", g.op("Reshape", g.linear(h, *attn._projection(j), f"{p}.attn.{'qkv'[j]}"),
                                        split_heads), perm=[0, 2, 1, 3], hint=f"{p}.{'qkv'[j]}")
                 for j in range(3)]                                                    # [B, H, T, dh]
        scores = g.op("MatMul", heads[0], g.op("Transpose", heads[1], perm=[0, 1, 3, 2]), hint=p + ".scores")
        scaled = g.op("Mul", scores, scale, hint=p + ".scaled")
        masked = g.op("Add", scaled, "attention_mask", hint=p + ".masked")
        probs = g.op("Softmax", masked, axis=-1, hint=p + ".probs")                   # [B, H, T, T]
        ctx = g.op("Reshape", g.op("Transpose", g.op("MatMul", probs, heads[2]), perm=[0, 2, 1, 3]), merge_heads)
        a = g.linear(ctx, attn.params["out_proj.weight"], attn.params.get("out_proj.bias"), p + ".attn.out")
        x = g.op("Add", x, a) if cfg.norm_first else g.layer_norm(g.op("Add", x, a), block.ln1, p + ".ln1")
        h = g.layer_norm(x, block.ln2, p + ".ln2") if cfg.norm_first else x
        m = g.linear(g.gelu(g.linear(h, block.mlp.fc.weight, block.mlp.fc.bias, p + ".mlp.fc")),
                     block.mlp.proj.weight, block.mlp.proj.bias, p + ".mlp.proj")
        x = g.op("Add", x, m) if cfg.norm_first else g.layer_norm(g.op("Add", x, m), block.ln2, p + ".ln2")
        for name, value in zip(("attentions", "q", "k", "scores", "scaled", "masked"),
                               (probs, heads[0], heads[1], scores, scaled, masked)):
            collected[name].append(value)
        if progress:
            progress(1)
    if model.ln_f is not None:
        x = g.layer_norm(x, model.ln_f, "ln_f")
    g.op("Identity", x, out="hidden")

    axis0 = g.const(np.array([0]), "axis0")
    names = ("attentions",) + (STAGES if stages else ())
    for name in names:
        g.op("Concat", *[g.op("Unsqueeze", t, axis0) for t in collected[name]], axis=0, out=name)
    L = ["layers", "batch", "heads", "tokens"]
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "tokens", D])]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, L + ([dh] if n in ("q", "k") else ["tokens"]))
                for n in names]
    graph = helper.make_graph(g.nodes, "attnscope", inputs, outputs, g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="attnscope", doc_string=__doc__.split("\n")[0])
    proto.ir_version = IR_VERSION
    return proto


def export(model: Transformer, path, stages: bool = False, desc: str = "export") -> None:
    """Write the graph to `path` (atomically), with a progress bar, and validate it with onnx.checker."""
    import os
    from pathlib import Path

    from tqdm import tqdm

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(model.blocks) + 2, desc=f"{desc}: building ONNX", unit="step", leave=False) as bar:
        proto = build_graph(model, stages, progress=bar.update)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        onnx.save(proto, tmp)
        bar.update(1)
        onnx.checker.check_model(str(tmp), full_check=True)
        bar.update(1)
    os.replace(tmp, path)
