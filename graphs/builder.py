"""Writing ONNX graphs node by node with onnx.helper: a small builder whose methods return their output's name.

Every graph attnscope exports is written with it: the stacked graph (graphs/stacked.py) and the layer-by-layer ones
(graphs/layers.py), from the same step functions (graphs/steps.py). Opset 17 and its IR version, which every
onnxruntime from 1.14 on reads.

No graph holds a weight. Every model array a graph reads (weights, position tables) is a graph INPUT named as the
model names it (runtime/binding.py binds the model's arrays to those names at every run: views of the weight store,
sources/store.py), in the type it is stored in; a narrower one is widened to the compute type by a Cast where it is
used (model/precision.py). So a graph is a few hundred kB whatever the model's size (protobuf stops at 2 GB), every
variant of a model's graph reads the same weights, and onnxruntime never folds them into copies of its own. One
exception: a packed graph (Graph's `packed`: a small model's decoding step) names its quantised weights' parts in
its metadata (`initialized`), and its session opens them as initializers over the same memory, which onnxruntime
prepacks (runtime/options.open_session).
"""
from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..model.precision import COMPUTE, INDEX, STORAGE, scalar
from ..model.quantized import Blocks
from ..model.transformer import RMSNorm

OPSET = 17
IR_VERSION = 8  # the IR version of opset 17; onnx 1.23 would write 14, which onnxruntime 1.31 refuses
FLOAT = helper.np_dtype_to_tensor_dtype(COMPUTE)   # the compute type's ONNX type (activations, masks, outputs)
INT = helper.np_dtype_to_tensor_dtype(INDEX)       # token ids, positions, lengths
UINT8 = onnx.TensorProto.UINT8                      # quantised codes and zero points


def onnx_type(dtype) -> int:
    """The ONNX element type of a NumPy dtype (bfloat16 included: ml_dtypes')."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class Graph:
    """Accumulates nodes, constants and the model arrays it reads; every method returns the name of its output.
    names: each model array's name by its identity (id(array) -> name: runtime/binding.py's names), so that a graph
    input is named as the model names the array it reads, whatever graph reads it."""

    def __init__(self, names: dict[int, str] | None = None, wide: bool = False, packed: bool = False):
        """wide: the model's narrower float arrays (bfloat16, float16) and its quantised weights
        (model/quantized.Blocks) are read whole as compute-type inputs, no Cast and no MatMulNBits: a run binds their
        widened (de-quantised) copies (runtime/tensors.Weights.widening: widened once per layer for all the runs of
        a request that multiplies by the same layers' weights many times: runtime/capabilities.Capabilities.widened).
        packed: the quantised weights' parts are opened as initializers that onnxruntime prepacks (`times`; the
        graph says so, `initialized`), not bound at each run."""
        self.nodes, self.inits, self._n = [], [], 0
        self.names, self.wide, self.packed = names or {}, wide, packed
        self.initialized: set[str] = set()             # a packed graph's inputs its session opens as initializers
        self.inputs: list[onnx.ValueInfoProto] = []   # the model arrays' graph inputs...
        self.feeds: dict[str, np.ndarray] = {}         # ...and the arrays that feed them
        self._widened: dict[str, str] = {}             # a narrow input -> its Cast to the compute type
        self.blocks: dict[str, tuple[Blocks, dict[str, str]]] = {}   # a quantised weight's name -> it, its parts' inputs

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def param(self, value: np.ndarray, hint: str) -> str:
        """A model array (a weight, a position table): a graph input named as `names` names it (else `hint`), in its
        stored type, fed at every run (runtime/binding.py). Returns its name as stored: `widen` it for arithmetic,
        after a Gather or Slice where only part of it is read."""
        if isinstance(value, Blocks) and not self.wide:   # each part an input "<name>.<part>"; the name stands for them
            parts = {part: self.param(a, f"{hint}.{part}") for part, a in value.parts().items()}
            name = parts["codes"].rsplit(".", 1)[0]
            self.blocks.setdefault(name, (value, parts))
            return name
        if isinstance(value, Blocks):                  # wide: one float input, bound de-quantised, named as its parts
            name = self.names.get(id(value.codes), f"{hint}.codes").rsplit(".", 1)[0]
        else:
            value = np.asarray(value)
            name = self.names.get(id(value), hint)
        if name not in self.feeds:
            kind = FLOAT if self.wide and value.dtype in STORAGE.values() else onnx_type(value.dtype)
            self.inputs.append(helper.make_tensor_value_info(name, kind, list(value.shape)))
            self.feeds[name] = value
        elif self.feeds[name] is not value:
            raise ValueError(f"two arrays named {name!r} in one graph")
        return name

    def widen(self, x: str, of: str | None = None) -> str:
        """x in the compute type (model/precision.widen's node): x itself, or a Cast where x is a model array stored
        narrower, or a part of one (`of`: the array a Gather or Slice read x from, whose type x has)."""
        source = of or x
        if source not in self.feeds or self.feeds[source].dtype == COMPUTE or self.wide:
            return x
        if x not in self._widened:
            self._widened[x] = self.op("Cast", x, to=FLOAT, hint=f"{x}.widened")
        return self._widened[x]

    def weight(self, value: np.ndarray, hint: str) -> str:
        """A model array read whole, in the compute type: param, then widen."""
        return self.widen(self.param(value, hint))

    def input(self, name: str, elem_type: int, shape: list) -> str:
        """A graph input (declared once, however often asked for)."""
        if all(i.name != name for i in self.inputs):
            self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def op(self, op_type: str, *inputs: str, hint: str | None = None, out: str | None = None, **attrs) -> str:
        out = out or self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))   # named as its output
        return out

    def slice(self, x: str, start, end, axis: int, hint: str | None = None) -> str:
        """x[start:end] along axis; start and end are ints or names of 1-element int64 tensors."""
        as_input = lambda v: v if isinstance(v, str) else self.const(np.array([v]))  # noqa: E731
        return self.op("Slice", x, as_input(start), as_input(end), self.const(np.array([axis])), hint=hint)

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None, hint: str) -> str:
        """x @ W^T + b, as functional.linear. Weights arrive [out, in] as stored (widened first where narrower):
        onnxruntime folds the Transpose into the MatMul (FusedMatMul transB), so nothing is copied per run. A
        quantised weight (model/quantized.Blocks) is multiplied in its blocks (`times`); a wide graph's as a float
        one."""
        if isinstance(weight, Blocks) and not self.wide:
            y = self.times(x, self.param(weight, hint + ".weight"))
        else:
            y = self.op("MatMul", x, self.op("Transpose", self.weight(weight, hint + ".weight"), perm=[1, 0]), hint=hint)
        return y if bias is None else self.op("Add", y, self.weight(bias, hint + ".bias"), hint=hint)

    def times(self, x: str, W: str, rows: tuple[int, int] | None = None) -> str:
        """x @ W[rows]^T for a quantised W (a name `param` gave a Blocks weight; rows: a range of its rows, all when
        None): onnxruntime's MatMulNBits on the codes (float32 arithmetic: accuracy_level 0), plus, where the format
        has per-block offsets, their share: the sums of x over each block times the offsets, [.., K / block] @
        [K / block, N]. Codes under 8 bits get their zero points as floats (exact: small integers), which selects
        onnxruntime's kernel that de-quantises a block at a time and multiplies in float32 (as exact as a float32
        MatMul, and faster than its integer-zero-point kernel here: SmolLM2's summaries 482 -> 241 ms); on the CPU
        it takes no float zero points for 8-bit codes. Unpacking them reads only graph inputs: onnxruntime runs it
        just before the product (tests/test_gguf_blocks.py), so one product's float zero points are alive at a time.
        In a packed graph the parts are initializers with uint8 zero points, which onnxruntime prepacks once: a fused
        de-quantise-and-multiply, a SmolLM2 decoding step's [1, 576] @ [576, 1536] at 1.3-1.75x the speed of a float32
        MatMul, the same codes bound at 0.05-0.08x (`bench/matmulnbits.py --tokens 1 --k 576 --n 1536`); 8-bit codes
        as 4-bit halves (`_times_nibbles`)."""
        blocks, parts = self.blocks[W]
        (N, K), nb = blocks.shape, blocks.shape[1] // blocks.block
        if self.packed:                 # its own initializers: the parts as bound inputs serve any other reader
            parts = {p: self._initial(name, blocks.parts()[p]) for p, name in parts.items()}
        part = lambda p: parts[p] if rows is None else self.slice(parts[p], rows[0], rows[1], 0)   # noqa: E731
        N = N if rows is None else min(rows[1], N) - rows[0]
        if self.packed and blocks.bits == 8:
            return self._times_nibbles(x, blocks, part, N)
        floats = blocks.bits < 8 and not self.packed
        if floats:                                     # [N, nb] float: the exact kernel's zero points
            zero = self.slice(self._unpacked(part("zero_points"), blocks.bits, 1, [-1]), 0, nb, -1)
        else:                                          # uint8 as stored: 8-bit codes', or a packed graph's
            zero = part("zero_points")
        after = None if self.packed else x
        flat, scales = self.const(np.array([-1])), self._scales(blocks, part, after)
        y = self.op("MatMulNBits", x, part("codes"), scales, self.op("Reshape", zero, flat),
                    domain="com.microsoft", K=K, N=N, bits=blocks.bits, block_size=blocks.block, accuracy_level=0)
        if not blocks.has_offsets:
            return y
        return self._plus_offsets(y, x, nb, self._offsets(blocks, part, scales, zero if floats else None, after))

    def _scales(self, blocks: Blocks, part, after: str | None = None) -> str:
        """A quantised weight's scales [.., nb] (part(name): the input holding that part, or rows of it): as stored,
        or multiplied out of their factors, as model/quantized.Blocks.scales does (after: `_multiplied`'s)."""
        if blocks.factors is None:
            return part("scales")
        return self._multiplied(part("super_scales"), part("sub_scales"), blocks, after)

    def _after(self, a: str, x: str) -> str:
        """a, made no sooner than x is: a Reshape of a to its own shape and x's, sliced empty. onnxruntime runs nodes
        that read only graph inputs where it likes, and ran every product's scales first (an 8B's stacked run: ~0.4
        GB more at its peak); read after the product's input, each product's are alive only around it. Not in a
        packed graph, whose scales onnxruntime multiplies out once, at the session's start, to prepack them."""
        none = self.slice(self.op("Shape", x), 0, 0, 0)                                   # [0] int64
        return self.op("Reshape", a, self.op("Concat", self.op("Shape", a), none, axis=0))

    def _offsets(self, blocks: Blocks, part, scales: str, zero: str | None = None, after: str | None = None) -> str:
        """Its offsets [.., nb]: as stored, or their factors multiplied out plus scales * zero points, as
        Blocks.offsets does (the same float32 operations in the same order); zero: the float zero points [.., nb]
        where the caller has made them (else unpacked here)."""
        if blocks.factors is None:
            return part("offsets")
        nb = blocks.shape[1] // blocks.block
        if zero is None:
            zero = self.slice(self._unpacked(part("zero_points"), blocks.bits, 1, [-1]), 0, nb, -1)
        raw = self._multiplied(part("super_offsets"), part("sub_offsets"), blocks, after)
        return self.op("Add", raw, self.op("Mul", scales, zero))

    def _multiplied(self, sup: str, sub: str, blocks: Blocks, after: str | None = None) -> str:
        """model/quantized.multiplied: each super-block's float32 sup [.., S] times its sub-blocks' integers sub
        [.., nb] -> [.., nb]; after: computed no sooner than that tensor is (`_after`)."""
        nb, S = blocks.shape[1] // blocks.block, blocks.factors["super_scales"].shape[1]
        sub = sub if after is None else self._after(sub, after)
        lead = self.slice(self.op("Shape", sub), 0, -1, 0)
        grouped = self.op("Reshape", self.op("Cast", sub, to=FLOAT), self.op(
            "Concat", lead, self.const(np.array([S, nb // S])), axis=0))                   # [.., S, nb / S]
        product = self.op("Mul", self.op("Unsqueeze", sup, self.const(np.array([-1]))), grouped)
        return self.op("Reshape", product, self.op("Concat", lead, self.const(np.array([nb])), axis=0))

    def _initial(self, name: str, value: np.ndarray) -> str:
        """A model array's input `name` as an initializer of a packed graph, under a name of its own (PACKED_SUFFIX)
        that its session opens over the same array (`initialized`, runtime/options.open_session). Only the products
        read it; an embedding lookup of the same codes (a tied LM head) reads the bound input. With one name for
        both, opening Gemma 3's decoding session took 440-520 MB more memory; with two, 220-300 MB."""
        initial = name + PACKED_SUFFIX
        self.input(initial, onnx_type(value.dtype), list(value.shape))
        self.initialized.add(initial)
        return initial

    def _plus_offsets(self, y: str, x: str, nb: int, offsets: str) -> str:
        """y + the offsets' share of x @ W^T: the sums of x over each of the nb blocks times offsets [N, nb]."""
        lead = self.slice(self.op("Shape", x), 0, -1, 0)
        sums = self.op("ReduceSum", self.op("Reshape", x, self.op("Concat", lead, self.const(np.array([nb, -1])),
                                                                         axis=0)),
                       self.const(np.array([-1])), keepdims=0)                       # [.., K / block]
        return self.op("Add", y, self.op("MatMul", sums, self.op("Transpose", offsets, perm=[1, 0])))

    def _times_nibbles(self, x: str, blocks: Blocks, part, N: int) -> str:
        """`times` for 8-bit codes in a packed graph. onnxruntime's CPU kernel prepacks only 4-bit codes, so 8-bit
        codes [N, nb, block] are read as the 4-bit codes of a [N, 2K] weight in blocks of 2 * block, the same bytes:
        code = 16 hi + lo, both nibbles with one zero point m per block, against x' = (x_0, 16 x_0, x_1, 16 x_1, ...),
        which makes x' @ W'^T = x @ (s (code - 17 m))^T; the offsets s (17 m - z) (+ the format's own) add the rest,
        as a format's offsets do. m = round(z / 17) keeps both nibbles' terms the size of the weight (a 5-bit code has
        hi 0 or 1: with m = 8 each term would be ~8x the weight and the sum would lose 3 bits). Every part being an
        initializer, onnxruntime folds m and the offsets once, when the session opens."""
        (_, K), nb, flat = blocks.shape, blocks.shape[1] // blocks.block, self.const(np.array([-1]))
        scales, zero = self._scales(blocks, part), self.op("Cast", part("zero_points"), to=FLOAT)   # [N, nb]
        offsets = self._offsets(blocks, part, scales, zero) if blocks.has_offsets else None
        m = self.op("Floor", self.op("Add", self.op("Mul", zero, self.const(scalar(1 / 17))), self.const(scalar(0.5))))
        rest = self.op("Mul", scales, self.op("Sub", self.op("Mul", m, self.const(scalar(17.0))), zero))
        offsets = rest if offsets is None else self.op("Add", offsets, rest)
        pairs = self.op("Reshape", self.op("Pad", m, self.const(np.array([0, 0, 0, nb % 2]))),
                        self.const(np.array([0, -1, 2])))                                      # [N, ceil(nb/2), 2]
        low, high = (self.op("Gather", pairs, self.const(np.array(i)), axis=2) for i in (0, 1))
        packed = self.op("Cast", self.op("Add", low, self.op("Mul", high, self.const(scalar(16.0)))), to=UINT8)
        lead = self.slice(self.op("Shape", x), 0, -1, 0)
        nibbles = [self.op("Unsqueeze", v, self.const(np.array([-1]))) for v in (x, self.op(
            "Mul", x, self.const(scalar(16.0))))]
        wide = self.op("Reshape", self.op("Concat", *nibbles, axis=-1), self.op(
            "Concat", lead, self.const(np.array([2 * K])), axis=0))                            # x' [.., 2K]
        y = self.op("MatMulNBits", wide, part("codes"), scales, self.op("Reshape", packed, flat),
                    domain="com.microsoft", K=2 * K, N=N, bits=4, block_size=2 * blocks.block, accuracy_level=0)
        return self._plus_offsets(y, x, nb, offsets)

    def gather(self, W: str, index: str) -> str:
        """W[index] in the compute type (an embedding lookup, a row per token): a Gather, widened after it (only the
        rows read are widened); a quantised W's rows de-quantised in the graph from their gathered codes."""
        if W not in self.blocks:
            return self.widen(self.op("Gather", W, index), of=W)
        blocks, parts = self.blocks[W]
        (_, K), nb, bits = blocks.shape, blocks.shape[1] // blocks.block, blocks.bits
        rows = {p: self.op("Gather", name, index) for p, name in parts.items()}
        codes = self._unpacked(rows["codes"], bits, 2, [nb, blocks.block])               # [.., nb, block]
        zero = self.slice(self._unpacked(rows["zero_points"], bits, 1, [-1]), 0, nb, -1)    # [.., nb]
        scales, last = self._scales(blocks, rows.get), self.const(np.array([-1]))
        w = self.op("Mul", self.op("Unsqueeze", scales, last), self.op("Sub", codes, self.op("Unsqueeze", zero, last)))
        if blocks.has_offsets:
            offsets = self._offsets(blocks, rows.get, scales, zero)
            w = self.op("Add", w, self.op("Unsqueeze", offsets, last))
        lead = self.slice(self.op("Shape", w), 0, -2, 0)
        return self.op("Reshape", w, self.op("Concat", lead, self.const(np.array([K])), axis=0))

    def _unpacked(self, packed: str, bits: int, axes: int, shape: list[int]) -> str:
        """uint8 bytes holding 8 / bits codes each, low first -> the codes as float32, packed's last `axes` axes
        reshaped to `shape` (exact: small integers, split by floor division)."""
        c = self.op("Cast", packed, to=FLOAT)
        if bits < 8:
            digits = []
            for i in range(8 // bits):
                shifted = self.op("Floor", self.op("Mul", c, self.const(scalar(2.0 ** (-bits * i)))))
                upper = self.op("Floor", self.op("Mul", c, self.const(scalar(2.0 ** (-bits * (i + 1))))))
                digits.append(self.op("Unsqueeze", self.op("Sub", shifted, self.op(
                    "Mul", upper, self.const(scalar(2.0 ** bits)))), self.const(np.array([-1]))))
            c = self.op("Concat", *digits, axis=-1)
        lead = self.slice(self.op("Shape", packed), 0, -axes, 0)
        return self.op("Reshape", c, self.op("Concat", lead, self.const(np.array(shape)), axis=0))

    def norm(self, x: str, module, hint: str) -> str:
        return self.rms_norm(x, module, hint) if isinstance(module, RMSNorm) else self.layer_norm(x, module, hint)

    def layer_norm(self, x: str, ln, hint: str) -> str:
        return self.op("LayerNormalization", x, self.weight(ln.weight, hint + ".weight"),
                       self.weight(ln.bias, hint + ".bias"), axis=-1, epsilon=float(ln.eps), hint=hint)

    def rms_norm(self, x: str, rms, hint: str) -> str:
        """weight * (x * 1 / sqrt(mean(x^2) + eps)), as functional.rms_norm."""
        mean_sq = self.op("ReduceMean", self.op("Mul", x, x), axes=[-1], keepdims=1)
        inv_rms = self.op("Reciprocal", self.op("Sqrt", self.op("Add", mean_sq, self.const(scalar(rms.eps)))))
        return self.op("Mul", self.weight(rms.weight, hint + ".weight"), self.op("Mul", x, inv_rms), hint=hint)

    def gelu(self, x: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt 2)), the exact form."""
        e = self.op("Erf", self.op("Mul", x, self.const(scalar(1 / np.sqrt(2)))))
        return self.op("Mul", self.op("Mul", x, self.op("Add", e, self.const(scalar(1.0)))),
                       self.const(scalar(0.5)))

    def gelu_tanh(self, x: str) -> str:
        """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as functional.gelu_tanh."""
        cube = self.op("Mul", self.op("Mul", self.op("Mul", x, x), x), self.const(scalar(0.044715)))
        t = self.op("Tanh", self.op("Mul", self.const(scalar(np.sqrt(2.0 / np.pi))), self.op("Add", x, cube)))
        return self.op("Mul", self.op("Mul", self.const(scalar(0.5)), x), self.op("Add", self.const(scalar(1.0)), t))

    def silu(self, x: str) -> str:
        return self.op("Mul", x, self.op("Sigmoid", x))

    def rope(self, x: str, cos: str, sin: str, d_head: int, rotary_dim: int | None = None) -> str:
        """x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1], as functional.apply_rope; with
        rotary_dim < d_head (partial rotary) on x's first rotary_dim features, the rest passed through."""
        r = rotary_dim or d_head
        if r < d_head:
            turned = self.rope(self.slice(x, 0, r, -1), cos, sin, r)
            return self.op("Concat", turned, self.slice(x, r, d_head, -1), axis=-1)
        x1, x2 = self.slice(x, 0, d_head // 2, -1), self.slice(x, d_head // 2, d_head, -1)
        rotated = self.op("Concat", self.op("Neg", x2), x1, axis=-1)
        return self.op("Add", self.op("Mul", x, cos), self.op("Mul", rotated, sin))

    def cast_float(self, x: str) -> str:
        return self.op("Cast", x, to=FLOAT)

    def logsumexp(self, x: str, keepdims: int) -> str:
        """log(sum(exp(x - max))) + max over the last axis, as transformer._logsumexp. (onnxruntime's
        ReduceLogSumExp is 3x slower on [T, 8192] chunks and 6x less accurate, measured.)"""
        m = self.op("ReduceMax", x, axes=[-1], keepdims=1)
        s = self.op("ReduceSum", self.op("Exp", self.op("Sub", x, m)), self.const(np.array([-1])), keepdims=keepdims)
        return self.op("Add", self.op("Log", s), m if keepdims else self.op("Squeeze", m, self.const(np.array([-1]))))


BUILT: Counter[str] = Counter()   # graphs this process has made, by name: every graph is made here (model_proto)
_BUILT_LOCK = threading.Lock()


def built() -> int:
    """How many graphs this process has made (a server makes its models' at start, none in a request: /healthz)."""
    return sum(BUILT.values())


def model_proto(g: Graph, inputs: list, outputs: list, name: str) -> onnx.ModelProto:
    """The one place a graph is made: every exported, layer-by-layer, cut and helper graph passes here (and is
    counted in BUILT)."""
    with _BUILT_LOCK:
        BUILT[name] += 1
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    domains = [helper.make_opsetid("com.microsoft", 1)] if any(n.domain == "com.microsoft" for n in g.nodes) else []
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), *domains],
                              producer_name="attnscope", doc_string="attnscope: attention, exactly")
    proto.ir_version = IR_VERSION
    if g.initialized:
        helper.set_model_props(proto, {PACKED: " ".join(sorted(g.initialized))})
    return proto


PACKED = "attnscope.packed"   # a packed graph's metadata: the inputs its session opens as initializers...
PACKED_SUFFIX = ".packed"     # ...each a model array's name and this


def initialized(proto: onnx.ModelProto) -> dict[str, str]:
    """The inputs a session opens as initializers (Graph's `packed`: the quantised weights' parts its products read),
    each with the name of the model array it is. Where they are not (a GPU's session), they are bound as any model
    array is, under that name (runtime/tensors.Weights)."""
    said = set(next((p.value.split() for p in proto.metadata_props if p.key == PACKED), []))
    return {i.name: i.name.removesuffix(PACKED_SUFFIX) for i in proto.graph.input if i.name in said}


def pruned(proto: onnx.ModelProto) -> onnx.ModelProto:
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


def save_checked(proto: onnx.ModelProto, path, progress=None) -> None:
    """Write a graph to `path` atomically (a temporary file, then a rename) and validate it with onnx.checker.
    progress(1) after each of the two."""
    import os
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    onnx.save(proto, tmp)
    if progress:
        progress(1)
    onnx.checker.check_model(str(tmp), full_check=True)
    if progress:
        progress(1)
    os.replace(tmp, path)
