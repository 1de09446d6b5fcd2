"""A graph's matrix products in a reduced float type (the float16 and bfloat16 modes, model/precision.py): a pure
transform of an exported graph, applied to every graph a session opens (runtime/options.open_session), so the
stacked graph, its cut and stages variants, the decoding step, the layer-by-layer graphs and an encoder-decoder's all
get it from one place, and the float32 graphs on disk stay as they are.

Each MatMul or Gemm of the model (a linear layer, the LM head, a head's scores q k^T and its weighted values p v)
reads its float operands cast to the reduced type and casts its result back to float32: the products run in the
reduced type, as torch's autocast runs them, while everything else stays float32: softmax, norms, masks, residual
sums, the LM head's log-sum-exp, and every statistic, thumbnail and pooling product of graphs/reductions.py (a
product one of whose operands is a pattern of the run -- a pooling matrix, a key set, token positions or weights --
rather than data of the model: those are reductions, and reductions always run in float32, DESIGN.md "Scale").

Casting is exact where it can be: a weight stored in the reduced type and widened for the float32 graph is read as
stored (widening then narrowing is the identity), and a transposed weight is cast before its Transpose, which
onnxruntime then folds into the product as before.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from .builder import pruned
from .reductions import key_input

REDUCED = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}   # mode -> the products' ONNX type
PRODUCTS = ("MatMul", "Gemm")
# The run's own inputs that are patterns, not data: a product with one of them (or anything made only of them, of
# constants and of shapes) is a reduction, kept in float32. Every other float input (weights, activations, caches)
# is data. value_norms (a layer-by-layer attend graph's input: each key's ||v_j W_O^h||, fed to the value-weighted
# statistic's row, analysis/statistics.py) feeds a statistic alone: its product with the weights is a reduction.
PATTERNS = ("attention_mask", "head_mask", "head_mean", "pool", "value_norms")
SHAPES = ("Shape", "Size")


def reduce_products(proto: onnx.ModelProto, compute_dtype: str) -> onnx.ModelProto:
    """A copy of `proto` whose model products run in `compute_dtype` ("float16" or "bfloat16"); see the module."""
    if compute_dtype not in REDUCED:
        raise ValueError(f"reduced products are {' or '.join(REDUCED)}; got {compute_dtype!r}")
    target = REDUCED[compute_dtype]
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    types = _types(proto)
    producer = {o: n for n in graph.node for o in n.output}
    data = _data(graph)
    made: dict[str, str] = {}      # a float32 tensor -> its name in the target type
    nodes, count = [], [0]

    def fresh(hint: str) -> str:
        count[0] += 1
        return f"{hint}.{compute_dtype}_{count[0]}"

    def narrow(name: str) -> str:
        """`name` in the target type, made of nodes appended to `nodes` (once per tensor)."""
        if name in made:
            return made[name]
        node = producer.get(name)
        if node is not None and node.op_type == "Cast" and types.get(node.input[0]) == target:
            made[name] = node.input[0]                       # a narrow weight's widening: read it as stored
        elif node is not None and node.op_type == "Transpose":
            made[name] = fresh(name)
            turned = helper.make_node("Transpose", [narrow(node.input[0])], [made[name]])
            turned.attribute.extend(node.attribute)                   # its perm
            nodes.append(turned)
        else:
            made[name] = fresh(name)
            nodes.append(helper.make_node("Cast", [name], [made[name]], to=target))
        return made[name]

    for node in graph.node:
        floats = [i for i in node.input if i and types.get(i) == TensorProto.FLOAT]
        if node.op_type not in PRODUCTS or not floats or not all(i in data for i in node.input[:2]):
            nodes.append(node)
            continue
        product = onnx.NodeProto()
        product.CopyFrom(node)
        product.input[:] = [narrow(i) if i in floats else i for i in node.input]
        result = node.output[0]
        product.output[0] = fresh(result)
        nodes += [product, helper.make_node("Cast", [product.output[0]], [result], to=TensorProto.FLOAT)]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return pruned(out)


def compute_key(compute_dtype: str) -> str:
    """What a mode adds to the key of a model's results (Runtime.key): nothing for float32 (its keys stay as they
    were), else its name and the hash of the source that makes its graphs (this module)."""
    if compute_dtype == "float32":
        return ""
    return f":{compute_dtype}:{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]}"


def reduced_products(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The products of `proto` that read a reduced type (float16 or bfloat16) operand: what reduce_products made."""
    types = _types(proto)
    return [n for n in proto.graph.node if n.op_type in PRODUCTS and
            any(types.get(i) in REDUCED.values() for i in n.input)]


def _types(proto: onnx.ModelProto) -> dict[str, int]:
    """Each tensor's ONNX element type (onnx's shape inference; graph inputs and initializers at least). onnx knows
    no com.microsoft op: a MatMulNBits' output (a product by quantised blocks) is declared float, its input's type,
    so that inference carries on past it."""
    declared = onnx.ModelProto()
    declared.CopyFrom(proto)
    known = {v.name for v in declared.graph.value_info}
    declared.graph.value_info.extend(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None)
                                     for n in proto.graph.node
                                     if n.op_type == "MatMulNBits" and n.output[0] not in known)
    try:
        inferred = onnx.shape_inference.infer_shapes(declared)
    except Exception:  # noqa: BLE001 - a graph onnx cannot infer: its declared types only
        inferred = declared
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for v in [*g.input, *g.value_info, *g.output]:
        if v.type.HasField("tensor_type"):
            types[v.name] = v.type.tensor_type.elem_type
    return types


def _data(graph: onnx.GraphProto) -> set[str]:
    """The tensors that carry the model's data: every float graph input but the run's patterns, and what is computed
    from at least one of them (a shape of one is not: it carries the run's size, not its values)."""
    data = {i.name for i in graph.input if i.type.tensor_type.elem_type != TensorProto.INT64
            and i.name not in PATTERNS and not i.name.startswith(key_input(""))}
    for node in graph.node:
        if node.op_type not in SHAPES and any(i in data for i in node.input):
            data.update(node.output)
    return data
