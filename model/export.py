"""NumPy Transformer -> ONNX graph, node by node with onnx.helper, mirroring transformer.py.

Inputs:  input_ids [B, T] int64, (token_type_ids [B, T] int64), attention_mask [B, 1|H, T, T] float
         (additive: padding, causality and user masks all arrive here, so no re-export is needed),
         head_mask, head_mean [B, L, H] float and lengths [B] int64: the head-mask contract of
         functional.ablate_heads (keep everything: head_mask 1, head_mean 0; lengths = each text's tokens).
Outputs: hidden [B, T, D], attentions [L, B, H, T, T]; with an LM head also next_token_logits [B, V]
         (after each text's last token) and token_logprobs [B, T]; with stages=True also the teaching
         intermediates (transformer.STAGES): x [L, B, T, D], q, k, v, ctx [L, B, H, T, d_head] and
         scores, scaled, masked [L, B, H, T, T].
build_embed, build_block_halves, build_attend and build_final write the same steps as graphs of their own, the
weights graph inputs instead of initializers: model/layerwise.py runs them layer by layer for long inputs.
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

    def __init__(self, params_as_inputs: bool = False):
        self.nodes, self.inits, self._n = [], [], 0
        self.params_as_inputs = params_as_inputs
        self.inputs: list[onnx.ValueInfoProto] = []   # params_as_inputs: the weights' graph inputs...
        self.feeds: dict[str, np.ndarray] = {}         # ...and the arrays that feed them

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def param(self, value: np.ndarray, name: str) -> str:
        """A model weight: an initializer (the served graph), or a graph input called `name` that the caller
        feeds (the block graph, one graph for every layer: layer i feeds its own arrays under the same names)."""
        if not self.params_as_inputs:
            return self.const(value, name)
        value = np.asarray(value)
        if name not in self.feeds:
            self.inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                             list(value.shape)))
        self.feeds[name] = value
        return name

    def input(self, name: str, elem_type: int, shape: list) -> str:
        """A graph input (declared once, however often asked for)."""
        if all(i.name != name for i in self.inputs):
            self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
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
        """x @ W^T + b, as functional.linear. Fed weights arrive [out, in] as stored: onnxruntime folds the
        Transpose into the MatMul (FusedMatMul transB), so nothing is copied per run."""
        if self.params_as_inputs:
            w = self.op("Transpose", self.param(weight, hint + ".weight"), perm=[1, 0])
        else:
            w = self.const(np.ascontiguousarray(weight.T), hint + ".weightT")
        y = self.op("MatMul", x, w, hint=hint)
        return y if bias is None else self.op("Add", y, self.param(bias, hint + ".bias"), hint=hint)

    def norm(self, x: str, module, hint: str) -> str:
        return self.rms_norm(x, module, hint) if isinstance(module, RMSNorm) else self.layer_norm(x, module, hint)

    def layer_norm(self, x: str, ln, hint: str) -> str:
        return self.op("LayerNormalization", x, self.param(ln.weight, hint + ".weight"),
                       self.param(ln.bias, hint + ".bias"), axis=-1, epsilon=float(ln.eps), hint=hint)

    def rms_norm(self, x: str, rms, hint: str) -> str:
        """weight * (x * 1 / sqrt(mean(x^2) + eps)), as functional.rms_norm."""
        mean_sq = self.op("ReduceMean", self.op("Mul", x, x), axes=[-1], keepdims=1)
        inv_rms = self.op("Reciprocal", self.op("Sqrt", self.op("Add", mean_sq, self.const(np.float32(rms.eps)))))
        return self.op("Mul", self.param(rms.weight, hint + ".weight"), self.op("Mul", x, inv_rms), hint=hint)

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


def build_graph(model: Transformer, stages: bool = False, progress=None, attentions: bool = True) -> onnx.ModelProto:
    """The model as one ONNX graph; each step below names the NumPy code it mirrors. attentions=False leaves out
    the stacked probabilities (hidden states and LM outputs only: what a plain inference graph returns)."""
    cfg, g = model.cfg, _Graph()
    H, dh, L = cfg.n_heads, cfg.d_head, cfg.n_layers
    inputs = _token_inputs(model) + [
        helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "mask_heads", "tokens", "tokens"]),
        helper.make_tensor_value_info("head_mask", TensorProto.FLOAT, ["batch", L, H]),
        helper.make_tensor_value_info("head_mean", TensorProto.FLOAT, ["batch", L, H]),
        helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"])]
    x, wte, T = _embed(g, model)
    rope, weights = _rope(g, model, T), _position_weights(g, T)
    collected = {name: [] for name in ("attentions",) + STAGES}
    for i, block in enumerate(model.blocks):
        layer = g.const(np.array(i, np.int64))
        keep, mean = (g.op("Gather", name, layer, axis=1) for name in ("head_mask", "head_mean"))   # [B, H]
        x, st = _block(g, block, cfg, f"blocks.{i}", x, "attention_mask", keep, mean, weights, rope)
        for name in collected:
            collected[name].append(st[name])
        if progress:
            progress(1)
    _final(g, model, x, wte)

    axis0 = g.const(np.array([0]), "axis0")
    names = (("attentions",) if attentions else ()) + (STAGES if stages else ())
    for name in names:
        g.op("Concat", *[g.op("Unsqueeze", t, axis0) for t in collected[name]], axis=0, out=name)
    Ls = ["layers", "batch", "heads", "tokens"]
    dims = {n: Ls + (["tokens"] if n in ("attentions",) + SQUARE_STAGES else [dh]) for n in names}
    dims["x"] = ["layers", "batch", "tokens", cfg.d_model]
    outputs = _final_outputs(cfg) + [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims[n]) for n in names]
    proto = _model(g, inputs, outputs, "attnscope")
    return proto if attentions else _pruned(proto)


def _token_inputs(model: Transformer) -> list:
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"])]
    if model.wtt is not None:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "tokens"]))
    return inputs


def _final_outputs(cfg) -> list:
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "tokens", cfg.d_model])]
    if cfg.lm_head:
        outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", dim])
                    for n, dim in zip(LM_OUTPUTS, (cfg.vocab_size, "tokens"))]
    return outputs


def _model(g: _Graph, inputs: list, outputs: list, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="attnscope", doc_string=__doc__.split("\n")[0])
    proto.ir_version = IR_VERSION
    return proto


def _embed(g: _Graph, model: Transformer) -> tuple[str, str, str]:
    """Transformer.embed: wte[ids] (+ wpe[:T]) (+ wtt[types]), then LayerNorm for BERT. Returns x [B, T, D],
    the name of wte (the tied LM head reads it) and T (a 1-element int64 tensor)."""
    T = g.slice(g.op("Shape", "input_ids"), 1, 2, 0, hint="T")
    wte = g.param(model.wte, "wte")
    x = g.op("Gather", wte, "input_ids")
    if model.wpe is not None:
        x = g.op("Add", x, g.slice(g.param(model.wpe, "wpe"), 0, T, 0))
    if model.wtt is not None:
        x = g.op("Add", x, g.op("Gather", g.param(model.wtt, "wtt"), "token_type_ids"))
    if model.ln_embed is not None:
        x = g.norm(x, model.ln_embed, "ln_embed")
    return x, wte, T


def _rope(g: _Graph, model: Transformer, T: str) -> tuple[str, str] | None:
    """RoPE's cos/sin tables sliced to [T, d_head], like wpe."""
    return None if model.rope is None else tuple(g.slice(g.param(t, name), 0, T, 0, hint=name)
                                                 for t, name in zip(model.rope, ("rope_cos", "rope_sin")))


def _position_weights(g: _Graph, T: str) -> str:
    """functional.position_weights: 1/n on each text's n tokens, 0 on padding -> [B, 1, 1, T]"""
    positions = g.op("Range", g.const(np.int64(0)), g.op("Squeeze", T, g.const(np.array([0]))), g.const(np.int64(1)))
    real = g.op("Less", g.op("Unsqueeze", positions, g.const(np.array([0]))),
                g.op("Unsqueeze", "lengths", g.const(np.array([1]))))                          # [B, T]
    n_real = g.op("Cast", g.op("Max", g.op("Unsqueeze", "lengths", g.const(np.array([1]))), g.const(np.array([1]))),
                  to=TensorProto.FLOAT)                                                    # [B, 1]
    return g.op("Unsqueeze", g.op("Div", g.op("Cast", real, to=TensorProto.FLOAT), n_real), g.const(np.array([1, 2])),
                hint="position_weights")                                                    # [B, 1, 1, T]


def _block(g: _Graph, block, cfg, p: str, x: str, mask: str, keep: str, mean: str, weights: str,
           rope) -> tuple[str, dict[str, str]]:
    """TransformerBlock.__call__: x [B, T, D] -> x, and the attention's stages (probabilities as "attentions").
    keep, mean [B, H]: this layer's head mask. In three steps, which the layer-by-layer graphs run apart."""
    h, (q, k, v) = _attention_inputs(g, block, cfg, p, x, rope)
    st = _attend(g, cfg, p, q, k, v, mask) | {"x": h}   # the teaching stages, as TransformerBlock.__call__ names them
    return _block_output(g, block, cfg, p, x, st["ctx"], keep, mean, weights), st


def _attention_inputs(g: _Graph, block, cfg, p: str, x: str, rope) -> tuple[str, tuple[str, str, str]]:
    """The block up to its attention: its input h (normed first for pre-norm blocks) and the queries, keys and
    values, each [B, H, T, dh] (keys and values repeated for grouped-query attention, rotated by RoPE where the
    model has it)."""
    H, Hkv, dh, attn = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, block.attn
    h = g.norm(x, block.ln1, p + ".ln1") if cfg.norm_first else x
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
        return h, (q, k, v)
    return h, tuple(g.op("Transpose", g.op("Reshape", g.linear(h, *attn._projection(j), f"{p}.attn.{'qkv'[j]}"),
                                        g.const(np.array([0, 0, H, dh]))), perm=[0, 2, 1, 3], hint=f"{p}.{'qkv'[j]}")
                 for j in range(3))                                                     # MultiHeadAttention.__call__


def _attend(g: _Graph, cfg, p: str, q: str, k: str, v: str, mask: str) -> dict[str, str]:
    """functional.attention_stages and the weighted values, for however many heads q, k, v hold:
    scores, scaled, masked, attentions (the probabilities) [B, h, T, T] and ctx [B, h, T, dh]."""
    scale = g.const(np.float32(1.0 / (np.sqrt(cfg.d_head) * cfg.temperature)), "scale")
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]), hint=p + ".scores")
    scaled = g.op("Mul", scores, scale, hint=p + ".scaled")
    masked = g.op("Add", scaled, mask, hint=p + ".masked")
    probs = g.op("Softmax", masked, axis=-1, hint=p + ".probs")                       # [B, H, T, T]
    ctx = g.op("MatMul", probs, v, hint=p + ".ctx")                                    # [B, H, T, dh]
    return dict(attentions=probs, q=q, k=k, v=v, scores=scores, scaled=scaled, masked=masked, ctx=ctx)


def _block_output(g: _Graph, block, cfg, p: str, x: str, ctx: str, keep: str, mean: str, weights: str) -> str:
    """The block after its attention: the head mask on ctx, the output projection, the residual and norms, the MLP."""
    H, dh, attn = cfg.n_heads, cfg.d_head, block.attn
    out_proj = attn.projection("o_proj") if isinstance(attn, GroupedQueryAttention) else \
        (attn.params["out_proj.weight"], attn.params.get("out_proj.bias"))
    # functional.ablate_heads: keep * ctx + (1 - keep) * mean * sum_t weights_t ctx_t
    keep, mean = (g.op("Unsqueeze", t, g.const(np.array([2, 3]))) for t in (keep, mean))   # [B, H, 1, 1]
    replace = g.op("Mul", g.op("Sub", g.const(np.float32(1.0)), keep), mean)
    avg = g.op("MatMul", weights, ctx)                                                  # [B, H, 1, dh]
    ctx = g.op("Add", g.op("Mul", keep, ctx), g.op("Mul", replace, avg), hint=p + ".ctx_masked")
    merged = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), g.const(np.array([0, 0, H * dh])))
    a = g.linear(merged, *out_proj, p + ".attn.out")
    x = g.op("Add", x, a) if cfg.norm_first else g.norm(g.op("Add", x, a), block.ln1, p + ".ln1")
    h = g.norm(x, block.ln2, p + ".ln2") if cfg.norm_first else x
    m = _mlp(g, block.mlp, h, p + ".mlp")
    return g.op("Add", x, m) if cfg.norm_first else g.norm(g.op("Add", x, m), block.ln2, p + ".ln2")


def _final(g: _Graph, model: Transformer, x: str, wte: str) -> None:
    """The final norm (GPT-2, Llama) -> "hidden"; with an LM head, its outputs too."""
    if model.ln_f is not None:
        x = g.norm(x, model.ln_f, "ln_f")
    g.op("Identity", x, out="hidden")
    if model.cfg.lm_head:
        _lm_outputs(g, model, wte if model.lm_head is None else g.param(model.lm_head.weight, "lm_head"))


# ---- layer by layer: the same steps as graphs of their own, weights fed as inputs (model/layerwise.py) ----------
# A block runs as three graphs: its attention's inputs (q, k, v), the attention of a group of heads, and its output
# (head mask, output projection, MLP). The attention graph returns ctx and, instead of its probabilities p
# [B, h, T, T], these reductions of them, each equal to the model/stats.py function it names; so a long run keeps
# these and drops p, and holds one group of heads' p at a time.
LAYER_OUTPUTS = {
    "thumbnail": "stats.downsample of every head [B, h, R, R]: pool^T p pool (input pool [T, R])",
    "thumbnail_even": "the same when R divides T (equal blocks: p pool is a sum over a reshape)",
    "entropy": "stats.entropy of every row [B, h, T]",
    "max_weight": "largest weight of every row [B, h, T]",
    "first": "p[i, 0], weight on the first key [B, h, T]",
    "last": "p[i, T-1], weight on the last key [B, h, T]",
    "diagonal": "p[i, i] [B, h, T]",
    "previous": "p[i, i-1], i >= 1 [B, h, T-1]",
    "next": "p[i, i+1], i < T-1 [B, h, T-1]",
    "distance": "sum_j p[i, j] |i - j| [B, h, T]",
    "past_distance": "i - sum_j p[i, j] j: the distance when no query sees a later key (causal) [B, h, T]",
    "attention": "the probabilities of the heads asked (input heads [n], indices in this group) [B, n, T, T]",
    "top_weights": "the k largest weights of each row of those heads (input top_k [1]) [B, n, T, k]",
    "top_keys": "their key indices [B, n, T, k]",
    "duplicate": "sum_j p[i, j] same[i, j] for those heads (input same [T, T]) [B, n, T]",
}


def build_embed(model: Transformer) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Transformer.embed as a graph: input_ids (token_type_ids) -> x [B, T, D]; and its weight feeds."""
    g = _Graph(params_as_inputs=True)
    x, _, _ = _embed(g, model)
    g.op("Identity", x, out="x")
    out = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", model.cfg.d_model])]
    return _model(g, _token_inputs(model) + g.inputs, out, "attnscope-embed"), g.feeds


def build_final(model: Transformer) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The final norm and LM head as a graph: x, input_ids, lengths -> hidden (and LM outputs); its feeds."""
    g = _Graph(params_as_inputs=True)
    _final(g, model, "x", g.param(model.wte, "wte") if model.cfg.lm_head and model.lm_head is None else "")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", model.cfg.d_model]),
              *_token_inputs(model)[:1], helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"])]
    proto = _model(g, inputs + g.inputs, _final_outputs(model.cfg), "attnscope-final")
    return _pruned(proto), g.feeds


def _halves(model: Transformer, i: int) -> tuple[_Graph, _Graph]:
    """Block i's attention inputs and its output, each as a graph with its weights as inputs."""
    cfg, f = model.cfg, TensorProto.FLOAT
    heads = ["batch", cfg.n_heads, "tokens", cfg.d_head]
    first = _Graph(params_as_inputs=True)
    first.input("x", f, ["batch", "tokens", cfg.d_model])
    T = first.slice(first.op("Shape", "x"), 1, 2, 0, hint="T")
    _, qkv = _attention_inputs(first, model.blocks[i], cfg, "block", "x", _rope(first, model, T))
    for name, value in zip("qkv", qkv):
        first.op("Identity", value, out=name)
    second = _Graph(params_as_inputs=True)
    for name, shape in (("x", ["batch", "tokens", cfg.d_model]), ("ctx", heads), ("head_mask", ["batch", cfg.n_heads]),
                        ("head_mean", ["batch", cfg.n_heads])):
        second.input(name, f, shape)
    second.input("lengths", TensorProto.INT64, ["batch"])
    T = second.slice(second.op("Shape", "x"), 1, 2, 0, hint="T")
    x = _block_output(second, model.blocks[i], cfg, "block", "x", "ctx", "head_mask", "head_mean",
                      _position_weights(second, T))
    second.op("Identity", x, out="x_next")
    return first, second


def build_block_halves(model: Transformer) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The block before its attention (x -> q, k, v [B, H, T, dh]) and after it (x, ctx, head_mask, head_mean
    [B, H], lengths -> x_next), for every layer: feed block_params(model, i) for layer i."""
    first, second = _halves(model, 0)
    f, heads = TensorProto.FLOAT, ["batch", model.cfg.n_heads, "tokens", model.cfg.d_head]
    return (_pruned(_model(first, first.inputs, [helper.make_tensor_value_info(n, f, heads) for n in "qkv"],
                           "attnscope-block-in")),
            _pruned(_model(second, second.inputs, [helper.make_tensor_value_info(
                "x_next", f, ["batch", "tokens", model.cfg.d_model])], "attnscope-block-out")))


def block_params(model: Transformer, i: int) -> dict[str, np.ndarray]:
    """Layer i's weights under the block halves' input names (views of the model's arrays, no copies)."""
    first, second = _halves(model, i)
    return first.feeds | second.feeds


def build_attend(model: Transformer, outputs) -> onnx.ModelProto:
    """The attention of a group of heads: q, k, v [B, h, T, dh], attention_mask -> ctx [B, h, T, dh] and the
    LAYER_OUTPUTS asked, nothing else (onnxruntime runs every node of a graph, asked for or not)."""
    unknown = set(outputs) - set(LAYER_OUTPUTS)
    if unknown:
        raise ValueError(f"unknown attention outputs {sorted(unknown)}; known: {', '.join(LAYER_OUTPUTS)}")
    cfg, g, f = model.cfg, _Graph(), TensorProto.FLOAT
    for name in "qkv":
        g.input(name, f, ["batch", "heads", "tokens", cfg.d_head])
    g.input("attention_mask", f, ["batch", "mask_heads", "tokens", "tokens"])
    st = _attend(g, cfg, "attend", "q", "k", "v", "attention_mask")
    T = g.slice(g.op("Shape", "q"), 2, 3, 0, hint="T")
    made = {"ctx": st["ctx"]} | _layer_reductions(g, st["attentions"], st["masked"], T, outputs)
    names = ("ctx",) + tuple(outputs)
    for name in names:
        g.op("Identity", made[name], out=name)
    outs = [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "top_keys" else f, None) for n in names]
    return _pruned(_model(g, g.inputs, outs, "attnscope-attend"))


def _pruned(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Only the nodes, inputs and initializers the outputs need."""
    graph, needed = proto.graph, {o.name for o in proto.graph.output}
    nodes = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            nodes.append(node)
            needed.update(node.input)
    nodes.reverse()
    keep_inputs = [i for i in graph.input if i.name in needed]
    keep_inits = [t for t in graph.initializer if t.name in needed]
    for field, kept in ((graph.node, nodes), (graph.input, keep_inputs), (graph.initializer, keep_inits)):
        del field[:]
        field.extend(kept)
    return proto


def _layer_reductions(g: _Graph, probs: str, masked: str, T: str, wanted) -> dict[str, str]:
    """LAYER_OUTPUTS from probs [B, H, T, T] (and the masked scores m it is the softmax of); each names the
    stats.py function it equals. Written for speed over a layer's T^2 numbers (bench/long_input.py measures it):
    every full pass costs, Log most, so entropy is -sum p log p through log p_ij = m_ij - lse_i without a Log per
    entry, and the positions' weighted sum rides on the thumbnail's matrix product."""
    out, f, i64 = {}, TensorProto.FLOAT, TensorProto.INT64
    wanted = set(wanted)
    last_axis, zero, one = g.const(np.array([-1])), g.const(np.array([0])), g.const(np.array([1]))
    if {"entropy", "max_weight"} & wanted:    # row_stats' max_weight
        p_top = g.op("ReduceMax", probs, axes=[-1], keepdims=1)                             # [B, H, T, 1]
        out["max_weight"] = g.op("Squeeze", p_top, last_axis)
        if "entropy" in wanted:   # stats.entropy: log p_ij = m_ij - m_i* + log p_i* (the row's max m and max p are
            # at the same key), so with sum_j p_ij = 1: -sum_j p log p = sum_j p_ij (m_i* - m_ij) - log p_i*; every
            # term >= 0, nothing cancels, no Log per entry. Operands are ordered so that onnxruntime may write each
            # step over the one before: the layer holds two [H, T, T] buffers, masked and probs.
            below = g.op("Sub", masked, g.op("ReduceMax", masked, axes=[-1], keepdims=1))   # m_ij - m_i* <= 0
            spread = g.op("ReduceSum", g.op("Mul", below, probs), last_axis, keepdims=1)  # masked keys: huge * 0 = 0
            out["entropy"] = g.op("Squeeze", g.op("Neg", g.op("Add", spread, g.op("Log", p_top))), last_axis)
    column = lambda start, end: g.op("Squeeze", g.slice(probs, start, end, 3), g.const(np.array([3])))  # noqa: E731
    if "first" in wanted:
        out["first"] = column(0, 1)
    if "last" in wanted:
        out["last"] = column(-1, np.iinfo(np.int64).max)
    if {"diagonal", "previous", "next"} & wanted:   # p[i, i + d] is flat[i (T + 1) + d]: a strided slice
        flat = g.op("Reshape", probs, g.const(np.array([0, 0, -1])))                      # [B, H, T*T]
        TT, step = g.op("Mul", T, T), g.op("Add", T, one)
        for name, start in (("diagonal", zero), ("previous", T), ("next", one)):
            if name in wanted:
                out[name] = g.op("Slice", flat, start, TT, g.const(np.array([2])), step)
    pos = g.op("Cast", g.op("Range", g.const(np.int64(0)), g.op("Squeeze", T, zero), g.const(np.int64(1))), to=f)
    columns = []                                   # what probs is multiplied with: [T, R] pool, [T, 1] positions
    if {"thumbnail", "thumbnail_even"} & wanted:   # stats.downsample: block means, pool^T p pool
        pool = g.input("pool", f, ["tokens", "cells"])  # pool[t, r] = 1/|block r| on block r's tokens
        if "thumbnail" in wanted:
            columns.append(pool)
        else:                     # T = R b: each key block is b tokens, and p pool a sum over a reshape (no product)
            R = g.op("Shape", pool, start=1, end=2)
            b = g.op("Div", T, R)
            blocks = g.op("Reshape", probs, g.op("Concat", g.const(np.array([0, 0])), T, R, b, axis=0))  # B H T R b
            pooled = g.op("Div", g.op("ReduceSum", blocks, last_axis, keepdims=0), g.op("Cast", b, to=f))
            out["thumbnail_even"] = g.op("MatMul", g.op("Transpose", pool, perm=[1, 0]), pooled)
    if "past_distance" in wanted:
        columns.append(g.op("Unsqueeze", pos, one))
    if columns:
        product = g.op("MatMul", probs, g.op("Concat", *columns, axis=1) if len(columns) > 1 else columns[0])
        if "thumbnail" in wanted:
            pooled = g.slice(product, 0, -1, 3) if len(columns) > 1 else product                 # [B, H, T, R]
            out["thumbnail"] = g.op("MatMul", g.op("Transpose", columns[0], perm=[1, 0]), pooled)  # [B, H, R, R]
        if "past_distance" in wanted:   # sum_j p_ij |i - j| = i - sum_j p_ij j when p_ij = 0 for j > i
            mean_j = g.op("Squeeze", g.slice(product, -1, np.iinfo(np.int64).max, 3), g.const(np.array([3])))
            out["past_distance"] = g.op("Sub", pos, mean_j)
    if "distance" in wanted:      # stats.head_rows' distance
        apart = g.op("Abs", g.op("Sub", g.op("Unsqueeze", pos, one), g.op("Unsqueeze", pos, zero)))   # [T, T]
        out["distance"] = g.op("ReduceSum", g.op("Mul", probs, apart), last_axis, keepdims=0)
    if {"attention", "top_weights", "top_keys", "duplicate"} & wanted:
        asked = g.op("Gather", probs, g.input("heads", i64, ["asked"]), axis=1)         # [B, n, T, T]
        out["attention"] = asked
        if {"top_weights", "top_keys"} & wanted:   # stats.top_keys
            k = g.input("top_k", i64, [1])
            top_weights, top_keys = g.name("top_weights"), g.name("top_keys")
            g.nodes.append(helper.make_node("TopK", [asked, k], [top_weights, top_keys], axis=-1, largest=1, sorted=1))
            out["top_weights"], out["top_keys"] = top_weights, top_keys
        if "duplicate" in wanted:  # stats.duplicate_token_score, before the mean over queries
            same = g.input("same", f, ["tokens", "tokens"])
            out["duplicate"] = g.op("ReduceSum", g.op("Mul", asked, same), last_axis, keepdims=0)
    return out


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
