"""onnxruntime's com.microsoft.MatMulNBits against a float32 MatMul on this CPU (issue 49), one product of an 8B
layer's shape, x [T, K] @ W[N, K]^T, in one run (sgemm measured in the same run), for each of
  - float32 MatMul, W a graph input (what attnscope's graphs do: weights are bound, never in the graph) and W an
    initializer (onnxruntime may prepack it);
  - MatMulNBits with 4-bit codes in blocks of 32 (Q4_K's layout) and 8-bit codes in blocks of 16 (Q6_K's), codes
    as graph inputs (4-bit also with float zero points: what attnscope's bound products use) and as initializers
    (prepacked: a packed decoding graph's, graphs/decoding.packs), at accuracy_level 0 (float32 arithmetic: exact
    to float32 rounding, attnscope's only mode) and 4 (x quantised to int8 per block: faster where the CPU has int8
    dot products, not exact: its error is printed against float64, next to level 0's);
and prints ms, GFLOP/s and the ratio to the float32 MatMul with W as an input.

    python bench/matmulnbits.py                  # T 128, K 4096, N 14336 (ffn_up's shape)
    python bench/matmulnbits.py --tokens 512 --k 4096 --n 4096
    python bench/matmulnbits.py --tokens 1 --k 576 --n 1536 --repeats 50   # a SmolLM2 decoding step's MLP product
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_ms, sgemm_gflops  # noqa: E402


def session(nodes, inputs, inits):
    import onnxruntime as ort

    from attnscope.graphs.builder import IR_VERSION, OPSET

    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(
        "com.microsoft", 1)])
    model.ir_version = IR_VERSION
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def float_case(w: np.ndarray, as_input: bool):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", w.shape[1]])
    wt = np.ascontiguousarray(w.T)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    if as_input:
        return session([node], [x, helper.make_tensor_value_info("w", TensorProto.FLOAT, list(wt.shape))], []), \
            {"w": wt}
    return session([node], [x], [numpy_helper.from_array(wt, "w")]), {}


def nbits_case(codes, scales, zero, K, N, bits, block, level, as_input: bool):
    """zero: packed uint8 zero points, or float32 ones (one per block: the kernel attnscope's bound 4-bit products
    use, graphs/builder.Graph.times)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", K])
    node = helper.make_node("MatMulNBits", ["x", "codes", "scales", "zero"], ["y"], domain="com.microsoft", K=K, N=N,
                            bits=bits, block_size=block, accuracy_level=level)
    arrays = {"codes": codes, "scales": scales.reshape(-1), "zero": zero.reshape(-1)}
    if as_input:
        kinds = {"codes": TensorProto.UINT8, "scales": TensorProto.FLOAT,
                 "zero": TensorProto.FLOAT if zero.dtype == np.float32 else TensorProto.UINT8}
        return session([node], [x] + [helper.make_tensor_value_info(n, kinds[n], list(a.shape))
                                      for n, a in arrays.items()], []), arrays
    return session([node], [x], [numpy_helper.from_array(a, n) for n, a in arrays.items()]), {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=14336)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from attnscope.model.quantized import Blocks, pack

    T, K, N = args.tokens, args.k, args.n
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, K)).astype(np.float32)
    flop = 2.0 * T * K * N
    gflops = sgemm_gflops(4096, 3)
    print(f"sgemm (NumPy, 4096^3 float32): {gflops:.0f} GFLOP/s; x [{T}, {K}] @ W [{N}, {K}]^T: "
          f"{flop / 1e9:.1f} GFLOP, bound {flop / gflops / 1e6:.1f} ms", flush=True)
    rows = {}

    def time(name, sess, feeds, exact):
        feeds = {"x": x, **feeds}
        y = sess.run(["y"], feeds)[0]
        ms = median_ms(lambda: sess.run(["y"], feeds), args.repeats, warmup=1)
        err = float(np.abs(y - exact).max() / np.abs(exact).max())
        rows[name] = ms
        base = rows.get("float32 MatMul, W an input", ms)
        print(f"  {name:<52} {ms:8.3f} ms {flop / ms / 1e6:6.0f} GFLOP/s {base / ms:5.2f}x the float32 input's speed; "
              f"error {err:.1e} of max |y|", flush=True)

    w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    for as_input in (True, False):
        time(f"float32 MatMul, W an {'input' if as_input else 'initializer'}", *float_case(w, as_input), exact)
    del w
    for bits, block in ((4, 32), (8, 16)):
        nb = K // block
        q = rng.integers(0, 2**bits, (N, nb, block), dtype=np.uint8)
        scales = (rng.random((N, nb), dtype=np.float32) * 0.01 + 0.001)
        zero_value = 2 ** (bits - 1)
        zero = pack(np.full((N, nb), zero_value, np.uint8), bits)
        codes = pack(q, bits)
        wq = Blocks(codes, scales, zero, None, bits, block).dequantize()
        exact = x.astype(np.float64) @ wq.astype(np.float64).T
        del wq
        if bits == 4:                 # float zero points, bound: attnscope's served graphs
            time(f"MatMulNBits 4-bit block {block}, level 0, inputs, float zp",
                 *nbits_case(codes, scales, np.full((N, nb), zero_value, np.float32), K, N, bits, block, 0, True),
                 exact)
        for level in (0, 4):
            for as_input in (True, False):
                time(f"MatMulNBits {bits}-bit block {block}, level {level}, codes {'inputs' if as_input else 'inits'}",
                     *nbits_case(codes, scales, zero, K, N, bits, block, level, as_input), exact)


if __name__ == "__main__":
    main()
