"""NumPy Transformer -> ONNX graph, node by node with onnx.helper, mirroring transformer.py.

Inputs:  input_ids [B, T] int64, (token_type_ids [B, T] int64), attention_mask [B, 1|H, T, T] float
         (additive: padding, causality and user masks all arrive here, so no re-export is needed),
         head_mask, head_mean [B, L, H] float and lengths [B] int64: the head-mask contract of
         functional.ablate_heads (keep everything: head_mask 1, head_mean 0; lengths = each text's tokens).
Outputs: hidden [B, T, D], attentions [L, B, H, T, T]; with an LM head also next_token_logits [B, V]
         (after each text's last token) and token_logprobs [B, T]; with stages=True also the teaching
         intermediates (transformer.STAGES): x [L, B, T, D], q, k, v, ctx [L, B, H, T, d_head] and
         scores, scaled, masked [L, B, H, T, T].
Learned positions are taken as wpe[:T] with Shape + Slice (no Gather over a Range, which
onnxruntime's GatherToSliceFusion mis-optimises); RoPE's cos/sin tables the same way.
Opset 17 has no RMSNormalization: RMSNorm is written out in primitives, as functional.rms_norm.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .attention import GroupedQueryAttention
from .transformer import LM_OUTPUTS, SQUARE_STAGES, STAGES, VOCAB_CHUNK, RMSNorm, Transformer

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

    def slice(self, x: str, start, end, axis: int, hint: str | None = None) -> str:
        """x[start:end] along axis; start and end are ints or names of 1-element int64 tensors."""
        as_input = lambda v: v if isinstance(v, str) else self.const(np.array([v]))  # noqa: E731
        return self.op("Slice", x, as_input(start), as_input(end), self.const(np.array([axis])), hint=hint)

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None, hint: str) -> str:
        y = self.op("MatMul", x, self.const(np.ascontiguousarray(weight.T), hint + ".weightT"), hint=hint)
        return y if bias is None else self.op("Add", y, self.const(bias, hint + ".bias"), hint=hint)

    def norm(self, x: str, module, hint: str) -> str:
        return self.rms_norm(x, module, hint) if isinstance(module, RMSNorm) else self.layer_norm(x, module, hint)

    def layer_norm(self, x: str, ln, hint: str) -> str:
        return self.op("LayerNormalization", x, self.const(ln.weight, hint + ".weight"),
                       self.const(ln.bias, hint + ".bias"), axis=-1, epsilon=float(ln.eps), hint=hint)

    def rms_norm(self, x: str, rms, hint: str) -> str:
        """weight * (x * 1 / sqrt(mean(x^2) + eps)), as functional.rms_norm."""
        mean_sq = self.op("ReduceMean", self.op("Mul", x, x), axes=[-1], keepdims=1)
        inv_rms = self.op("Reciprocal", self.op("Sqrt", self.op("Add", mean_sq, self.const(np.float32(rms.eps)))))
        return self.op("Mul", self.const(rms.weight, hint + ".weight"), self.op("Mul", x, inv_rms), hint=hint)

    def gelu(self, x: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt 2)), the exact form."""
        e = self.op("Erf", self.op("Mul", x, self.const(np.float32(1 / np.sqrt(2)))))
        return self.op("Mul", self.op("Mul", x, self.op("Add", e, self.const(np.float32(1.0)))),
                       self.const(np.float32(0.5)))

    def gelu_tanh(self, x: str) -> str:
        """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as functional.gelu_tanh."""
        cube = self.op("Mul", self.op("Mul", self.op("Mul", x, x), x), self.const(np.float32(0.044715)))
        t = self.op("Tanh", self.op("Mul", self.const(np.float32(np.sqrt(2.0 / np.pi))), self.op("Add", x, cube)))
        return self.op("Mul", self.op("Mul", self.const(np.float32(0.5)), x), self.op("Add", self.const(np.float32(1.0)), t))

    def silu(self, x: str) -> str:
        return self.op("Mul", x, self.op("Sigmoid", x))

    def rope(self, x: str, cos: str, sin: str, d_head: int) -> str:
        """x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1], as functional.apply_rope."""
        x1, x2 = self.slice(x, 0, d_head // 2, -1), self.slice(x, d_head // 2, d_head, -1)
        rotated = self.op("Concat", self.op("Neg", x2), x1, axis=-1)
        return self.op("Add", self.op("Mul", x, cos), self.op("Mul", rotated, sin))

    def logsumexp(self, x: str, keepdims: int) -> str:
        """log(sum(exp(x - max))) + max over the last axis, as transformer._logsumexp. (onnxruntime's
        ReduceLogSumExp is 3x slower on [T, 8192] chunks and 6x less accurate, measured.)"""
        m = self.op("ReduceMax", x, axes=[-1], keepdims=1)
        s = self.op("ReduceSum", self.op("Exp", self.op("Sub", x, m)), self.const(np.array([-1])), keepdims=keepdims)
        return self.op("Add", self.op("Log", s), m if keepdims else self.op("Squeeze", m, self.const(np.array([-1]))))


def build_graph(model: Transformer, stages: bool = False, progress=None) -> onnx.ModelProto:
    """The model as one ONNX graph; each step below names the NumPy code it mirrors."""
    cfg, g = model.cfg, _Graph()
    H, Hkv, dh, L = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.n_layers
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"])]
    if model.wtt is not None:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "tokens"]))
    inputs += [helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT,
                                             ["batch", "mask_heads", "tokens", "tokens"]),
               helper.make_tensor_value_info("head_mask", TensorProto.FLOAT, ["batch", L, H]),
               helper.make_tensor_value_info("head_mean", TensorProto.FLOAT, ["batch", L, H]),
               helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"])]

    # Transformer.embed: wte[ids] (+ wpe[:T]) (+ wtt[types]), then LayerNorm for BERT
    T = g.slice(g.op("Shape", "input_ids"), 1, 2, 0, hint="T")
    wte = g.const(model.wte, "wte")
    x = g.op("Gather", wte, "input_ids")
    if model.wpe is not None:
        x = g.op("Add", x, g.slice(g.const(model.wpe, "wpe"), 0, T, 0))
    if model.wtt is not None:
        x = g.op("Add", x, g.op("Gather", g.const(model.wtt, "wtt"), "token_type_ids"))
    if model.ln_embed is not None:
        x = g.norm(x, model.ln_embed, "ln_embed")
    rope = None if model.rope is None else tuple(g.slice(g.const(t, name), 0, T, 0, hint=name)   # [T, d_head]
                                                 for t, name in zip(model.rope, ("rope_cos", "rope_sin")))

    # functional.position_weights: 1/n on each text's n tokens, 0 on padding -> [B, 1, 1, T]
    positions = g.op("Range", g.const(np.int64(0)), g.op("Squeeze", T, g.const(np.array([0]))), g.const(np.int64(1)))
    real = g.op("Less", g.op("Unsqueeze", positions, g.const(np.array([0]))),
                g.op("Unsqueeze", "lengths", g.const(np.array([1]))))                          # [B, T]
    n_real = g.op("Cast", g.op("Max", g.op("Unsqueeze", "lengths", g.const(np.array([1]))), g.const(np.array([1]))),
                  to=TensorProto.FLOAT)                                                    # [B, 1]
    weights = g.op("Unsqueeze", g.op("Div", g.op("Cast", real, to=TensorProto.FLOAT), n_real), g.const(np.array([1, 2])),
                   hint="position_weights")                                                    # [B, 1, 1, T]

    scale = g.const(np.float32(1.0 / (np.sqrt(dh) * cfg.temperature)), "scale")
    collected = {name: [] for name in ("attentions",) + STAGES}
    for i, block in enumerate(model.blocks):
        p, attn = f"blocks.{i}", block.attn
        # TransformerBlock.__call__
        h = h_in = g.norm(x, block.ln1, p + ".ln1") if cfg.norm_first else x
        if isinstance(attn, GroupedQueryAttention):   # GroupedQueryAttention.__call__
            q, k, v = (g.op("Transpose", g.op("Reshape", g.linear(h, *attn.projection(f"{n}_proj"), f"{p}.attn.{n}"),
                                              g.const(np.array([0, 0, heads, dh]))), perm=[0, 2, 1, 3], hint=f"{p}.{n}")
                       for n, heads in (("q", H), ("k", Hkv), ("v", Hkv)))                 # [B, H|Hkv, T, dh]
            if rope is not None:
                q, k = g.rope(q, *rope, dh), g.rope(k, *rope, dh)
            if attn.group > 1:                        # functional.repeat_kv: query head h reads kv head h // group
                k, v = (g.op("Reshape", g.op("Expand", g.op("Unsqueeze", t, g.const(np.array([2]))),
                                              g.const(np.array([1, 1, attn.group, 1, 1]))),
                             g.const(np.array([0, H, -1, dh])), hint=f"{p}.{n}_repeated")
                        for t, n in ((k, "k"), (v, "v")))                                   # [B, H, T, dh]
            out_proj = attn.projection("o_proj")
        else:                                         # MultiHeadAttention.__call__
            q, k, v = (g.op("Transpose", g.op("Reshape", g.linear(h, *attn._projection(j), f"{p}.attn.{'qkv'[j]}"),
                                              g.const(np.array([0, 0, H, dh]))), perm=[0, 2, 1, 3], hint=f"{p}.{'qkv'[j]}")
                       for j in range(3))                                                   # [B, H, T, dh]
            out_proj = attn.params["out_proj.weight"], attn.params.get("out_proj.bias")
        # functional.attention_stages
        scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]), hint=p + ".scores")
        scaled = g.op("Mul", scores, scale, hint=p + ".scaled")
        masked = g.op("Add", scaled, "attention_mask", hint=p + ".masked")
        probs = g.op("Softmax", masked, axis=-1, hint=p + ".probs")                       # [B, H, T, T]
        ctx = head_ctx = g.op("MatMul", probs, v, hint=p + ".ctx")                         # [B, H, T, dh]
        # functional.ablate_heads: keep * ctx + (1 - keep) * mean * sum_t weights_t ctx_t
        layer = g.const(np.array(i, np.int64))
        keep, mean = (g.op("Unsqueeze", g.op("Gather", name, layer, axis=1), g.const(np.array([2, 3])))
                      for name in ("head_mask", "head_mean"))                               # [B, H, 1, 1]
        replace = g.op("Mul", g.op("Sub", g.const(np.float32(1.0)), keep), mean)
        avg = g.op("MatMul", weights, ctx)                                                  # [B, H, 1, dh]
        ctx = g.op("Add", g.op("Mul", keep, ctx), g.op("Mul", replace, avg), hint=p + ".ctx_masked")
        merged = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), g.const(np.array([0, 0, H * dh])))
        a = g.linear(merged, *out_proj, p + ".attn.out")
        x = g.op("Add", x, a) if cfg.norm_first else g.norm(g.op("Add", x, a), block.ln1, p + ".ln1")
        h = g.norm(x, block.ln2, p + ".ln2") if cfg.norm_first else x
        m = _mlp(g, block.mlp, h, p + ".mlp")
        x = g.op("Add", x, m) if cfg.norm_first else g.norm(g.op("Add", x, m), block.ln2, p + ".ln2")
        for name, value in dict(attentions=probs, x=h_in, q=q, k=k, v=v, scores=scores, scaled=scaled, masked=masked,
                                ctx=head_ctx).items():   # the teaching stages, as TransformerBlock.__call__ names them
            collected[name].append(value)
        if progress:
            progress(1)
    if model.ln_f is not None:
        x = g.norm(x, model.ln_f, "ln_f")
    g.op("Identity", x, out="hidden")
    if cfg.lm_head:
        _lm_outputs(g, model, wte if model.lm_head is None else g.const(model.lm_head.weight, "lm_head"))

    axis0 = g.const(np.array([0]), "axis0")
    names = ("attentions",) + (STAGES if stages else ())
    for name in names:
        g.op("Concat", *[g.op("Unsqueeze", t, axis0) for t in collected[name]], axis=0, out=name)
    Ls = ["layers", "batch", "heads", "tokens"]
    dims = {n: Ls + (["tokens"] if n in ("attentions",) + SQUARE_STAGES else [dh]) for n in names}
    dims["x"] = ["layers", "batch", "tokens", cfg.d_model]
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "tokens", cfg.d_model])]
    if cfg.lm_head:
        outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", dim])
                    for n, dim in zip(LM_OUTPUTS, (cfg.vocab_size, "tokens"))]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims[n]) for n in names]
    graph = helper.make_graph(g.nodes, "attnscope", inputs, outputs, g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="attnscope", doc_string=__doc__.split("\n")[0])
    proto.ir_version = IR_VERSION
    return proto


def _mlp(g: _Graph, mlp, h: str, p: str) -> str:
    """MLP.__call__ (Linear -> GELU -> Linear) or SwiGLU.__call__ (down(silu(gate(h)) * up(h)))."""
    if hasattr(mlp, "gate"):
        gate = g.silu(g.linear(h, mlp.gate.weight, mlp.gate.bias, p + ".gate"))
        return g.linear(g.op("Mul", gate, g.linear(h, mlp.up.weight, mlp.up.bias, p + ".up")),
                        mlp.down.weight, mlp.down.bias, p + ".down")
    act = g.gelu_tanh if mlp.act.__name__ == "gelu_tanh" else g.gelu
    return g.linear(act(g.linear(h, mlp.fc.weight, mlp.fc.bias, p + ".fc")), mlp.proj.weight, mlp.proj.bias, p + ".proj")


def _lm_outputs(g: _Graph, model: Transformer, W: str) -> None:
    """Transformer.lm_outputs: next_token_logits [B, V] and token_logprobs [B, T] from "hidden".

    Never more than [B, T, VOCAB_CHUNK] logits at a time: the target logit is one dot product per
    token (Gather of W's rows), and the log-sum-exp runs chunk by chunk over the vocabulary."""
    V = model.cfg.vocab_size
    last = g.op("GatherND", "hidden", g.op("Unsqueeze", g.op("Sub", "lengths", g.const(np.int64(1))),
                                           g.const(np.array([1]))), batch_dims=1)          # [B, D]
    g.op("Gemm", last, W, transB=1, out="next_token_logits")                              # [B, V]
    first = g.slice("input_ids", 0, 1, 1)
    following = g.op("Concat", g.slice("input_ids", 1, np.iinfo(np.int64).max, 1),
                     g.op("Mul", first, g.const(np.int64(0))), axis=1)                     # x_{t+1}, [B, T]
    target = g.op("ReduceSum", g.op("Mul", "hidden", g.op("Gather", W, following)), g.const(np.array([-1])),
                  keepdims=0, hint="target_logit")                                        # [B, T]
    chunks = [g.logsumexp(g.op("MatMul", "hidden", g.op("Transpose", g.slice(W, v, min(v + VOCAB_CHUNK, V), 0))), 1)
              for v in range(0, V, VOCAB_CHUNK)]                                          # each [B, T, 1]
    lse = g.logsumexp(g.op("Concat", *chunks, axis=-1), 0)                                 # [B, T]
    logp_next = g.op("Min", g.op("Sub", target, lse), g.const(np.float32(0.0)))
    zero = g.op("Cast", g.op("Mul", first, g.const(np.int64(0))), to=TensorProto.FLOAT)     # [B, 1]
    g.op("Concat", zero, g.slice(logp_next, 0, -1, 1), axis=1, out="token_logprobs")       # [B, T]


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
