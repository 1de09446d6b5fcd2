"""GGUF's block formats kept in their blocks (sources/gguf_blocks.py, model/quantized.py), format by format, against
gguf's own de-quantiser (gguf.quants.dequantize) on random blocks:
  - the NumPy reference's de-quantisation equals gguf's bit for bit;
  - the graph's product (onnxruntime's MatMulNBits, plus the offsets' share) by the identity returns gguf's values
    exactly (one float32 rounding each, the same as gguf's; only a zero's sign may differ), and by random inputs agrees with float64 within
    float32's bound for a K-term dot product;
  - the graph's embedding lookup (rows gathered and de-quantised in the graph) and a range of rows (the LM head's
    vocabulary chunks) equal the reference.
And the zoo's GGUF models load in their blocks: no float32 copy of their weights in the cache, and a server process
after loading holds less than their float32 weights; Gemma 3's layers of two block layouts run layer by layer (one
layer graph per layout) as the float32 model does; and a random Q4_K_M Llama file written with gguf's GGUFWriter
(bench/checkpoints.llama_gguf, the 8B bench's family at a small size) equals transformers on gguf's de-quantisation.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

import gguf  # noqa: E402 - installed by the set-up (a dependency): never skipped

from attnscope.graphs.builder import FLOAT, INT, Graph, initialized, model_proto  # noqa: E402
from attnscope.model.quantized import Blocks, expand  # noqa: E402
from attnscope.model.weights import identities  # noqa: E402
from attnscope.runtime.options import default_providers, open_session  # noqa: E402
from attnscope.sources.gguf_blocks import FORMATS, to_blocks  # noqa: E402

EPS = float(np.finfo(np.float32).eps)


def random_blocks(name: str, rows: int, n_blocks: int, seed: int = 0) -> np.ndarray:
    """[rows, n_blocks * type_size] random bytes in `name`'s format, its float16 fields (d, dmin, m) finite."""
    kind = gguf.GGMLQuantizationType[name]
    _, type_size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, n_blocks, type_size)).astype(np.uint8)
    f16 = {(0, 2), (2, 4)} if name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else \
        {(0, 2)} if name in ("Q4_0", "Q5_0", "Q8_0") else {"Q2_K": {(80, 82), (82, 84)}, "Q3_K": {(108, 110)},
                                                           "Q6_K": {(208, 210)}}[name]
    for lo, hi in f16:
        b[..., lo:hi] = (rng.standard_normal((rows, n_blocks)) * 0.02).astype(np.float16)[..., None].view(np.uint8)
    return b.reshape(rows, -1)


def session(g: Graph, inputs, outputs):
    proto = model_proto(g, inputs + g.inputs, outputs, "blocks_test")
    return open_session(proto.SerializeToString(), default_providers(), 2)   # the app's options (CUDA: no TF32)


def product_graph(w: Blocks, rows=None):
    names = identities(expand({"w": w}))
    g = Graph(names)
    W = g.param(w, "w")
    y = g.times("x", W, rows) if rows else g.linear("x", w, None, "lin")
    g.op("Identity", y, out="y")
    g.op("Identity", g.gather(W, "ids"), out="rows")
    return session(g, [helper.make_tensor_value_info("x", FLOAT, ["M", w.shape[1]]),
                       helper.make_tensor_value_info("ids", INT, ["B", "T"])],
                   [helper.make_tensor_value_info("y", FLOAT, ["M", "N"]),
                    helper.make_tensor_value_info("rows", FLOAT, ["B", "T", w.shape[1]])]), g.feeds


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_blocks_equal_gguf_dequantisation(name):
    kind = gguf.GGMLQuantizationType[name]
    data = random_blocks(name, 24, 2 if name.endswith("_K") else 8)          # 512 values a row
    ref = gguf.quants.dequantize(data, kind)                                  # [24, 512] float32
    w = to_blocks(data, kind)
    assert w.shape == ref.shape and w.bits == FORMATS[name].bits
    assert (w.factors is not None) == name.endswith("_K")    # a K-quant's scales kept factored (model/quantized.py)
    assert np.array_equal(w.dequantize().view(np.uint32), ref.view(np.uint32))   # the NumPy reference, bit for bit

    sess, feeds = product_graph(w)
    K = w.shape[1]
    ids = np.array([[3, 0, 23, 3], [7, 7, 1, 12]])
    y, rows = sess.run(None, {"x": np.eye(K, dtype=np.float32), "ids": ids, **feeds})
    assert np.array_equal(y.T, ref)               # MatMulNBits by I: gguf's values exactly (a zero's sign may differ)
    assert np.array_equal(rows, ref[ids])         # the in-graph embedding lookup too

    x = np.random.default_rng(1).standard_normal((5, K)).astype(np.float32)
    y = sess.run(["y"], {"x": x, "ids": ids, **feeds})[0]
    exact = x.astype(np.float64) @ ref.astype(np.float64).T
    bound = 2 * K * EPS * (np.abs(x).astype(np.float64) @ np.abs(ref.astype(np.float64)).T) + 1e-30
    assert np.all(np.abs(y - exact) <= bound)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_packed_graph_multiplies_prepacked_blocks_as_exactly(name):
    """A packed graph (the decoding step's, graphs/decoding.packs) opens the parts as initializers that onnxruntime
    prepacks, 8-bit codes read as the 4-bit codes of a weight twice as wide (graphs/builder Graph._times_nibbles):
    the product agrees with float64 within float32's bound for its 2K-term sum, whose terms are at most
    |x| (|W| + |o| + 48 s) (code = 16 hi + lo and zero point z against m = round(z / 17): |lo - m| + 16 |hi - m| <=
    |code - z| + 8.5 + 30, and the offsets that bring the sum back, s |17 m - z| + |o|), and the lookup is exact.
    Rows of 7 blocks of 32 values (an odd count: 8-bit zero points are packed two a byte) or 3 super-blocks of 256.
    Opened without initializers (a GPU's session), the same graph binds every part and gives the same product.
    Measured here: 2.5e-7 to 1.1e-6 of max |y|, at most 0.5 % of the plain product's bound 2 K eps |x| |W|; and at
    most 4x the error of the same blocks bound as inputs (measured: the same for 4-bit codes, 0.5-1.7x for 8-bit;
    one zero point 8 for every block, as first written, made Q5_0's 14x)."""
    from attnscope.runtime.tensors import ort_value

    kind = gguf.GGMLQuantizationType[name]
    ref = gguf.quants.dequantize(data := random_blocks(name, 24, 3 if name.endswith("_K") else 7, seed=4), kind)
    w = to_blocks(data, kind)
    K, feeds = w.shape[1], expand({"w": w})
    g = Graph(identities(feeds), packed=True)
    W = g.param(w, "w")
    g.op("Identity", g.times("x", W), out="y")
    g.op("Identity", g.gather(W, "ids"), out="rows")
    proto = model_proto(g, [helper.make_tensor_value_info("x", FLOAT, ["M", K]),
                            helper.make_tensor_value_info("ids", INT, ["B", "T"])] + g.inputs,
                        [helper.make_tensor_value_info("y", FLOAT, ["M", "N"]),
                         helper.make_tensor_value_info("rows", FLOAT, ["B", "T", K])], "packed_test")
    assert sorted(initialized(proto).values()) == sorted(feeds)     # every part an initializer of the product's
    sess = open_session(proto.SerializeToString(), default_providers(), 2,
                        initial=lambda n: ort_value(feeds[n], "cpu"))
    assert sorted(i.name for i in sess.get_inputs()) == sorted(["ids", "x", *feeds])   # the lookup's: bound
    x = np.random.default_rng(5).standard_normal((5, K)).astype(np.float32)
    ids = np.array([[3, 0, 23, 3], [7, 7, 1, 12]])
    y, rows = sess.run(None, {"x": x, "ids": ids, **feeds})
    exact = x.astype(np.float64) @ ref.astype(np.float64).T
    per = lambda a: np.repeat(np.abs(a.astype(np.float64)), w.block, axis=1)           # noqa: E731 - per value
    terms = np.abs(ref.astype(np.float64)) + 48 * per(w.scales) + (0 if w.offsets is None else per(w.offsets))
    assert np.all(np.abs(y - exact) <= 4 * K * EPS * (np.abs(x).astype(np.float64) @ terms.T) + 1e-30)
    assert np.array_equal(rows, ref[ids])
    gpu = open_session(proto.SerializeToString(), default_providers(), 2)     # no initializers given (a GPU's):
    names = initialized(proto)                                                # every part bound, by its array's name
    bound_too = gpu.run(["y"], {"x": x, "ids": ids, **feeds, **{n: feeds[a] for n, a in names.items()}})[0]
    assert np.abs(bound_too - exact).max() <= 4 * np.abs(y - exact).max() + 1e-30
    plain, bound = product_graph(w)                                   # the same blocks bound as inputs
    unpacked = plain.run(["y"], {"x": x, "ids": ids, **bound})[0]
    assert np.abs(y - exact).max() <= 4 * np.abs(unpacked - exact).max()


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K"])
def test_a_range_of_rows_is_multiplied_in_its_blocks(name):
    """The LM head's vocabulary chunks: rows [5, 19) of the weight, by MatMulNBits on the parts' slices."""
    kind = gguf.GGMLQuantizationType[name]
    data = random_blocks(name, 24, 1 if name.endswith("_K") else 8, seed=2)
    ref = gguf.quants.dequantize(data, kind)
    sess, feeds = product_graph(to_blocks(data, kind), rows=(5, 19))
    y = sess.run(["y"], {"x": np.eye(ref.shape[1], dtype=np.float32), "ids": np.zeros((1, 1), np.int64), **feeds})[0]
    assert np.array_equal(y.T, ref[5:19])


def test_reading_rows_and_columns_dequantises_only_them():
    """The NumPy reference reads parts of a weight (W[ids], W[:, cols], W[i]) as gguf de-quantises them."""
    data = random_blocks("Q4_K", 10, 2, seed=3)
    ref = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q4_K)
    w = to_blocks(data, gguf.GGMLQuantizationType.Q4_K)
    ids = np.array([[1, 9], [0, 0]])
    assert np.array_equal(w[ids], ref[ids]) and np.array_equal(w[:, 30:70], ref[:, 30:70])
    assert np.array_equal(w[4], ref[4]) and np.array_equal(w[2:5], ref[2:5]) and np.array_equal(np.asarray(w), ref)


@pytest.mark.parametrize("model_id", ["smollm2", "gemma3"])
def test_zoo_gguf_models_are_served_from_their_blocks(model_id):
    """By default (sources/gguf.F32_IN_MEMORY_BYTES 0), as a server serves them: loaded in their blocks (every
    projection a Blocks), with no float32 copy of the weights in the cache folder, and a process that has loaded the
    model and answered once holds less memory than the float32 weights alone. That process is a server's start:
    every graph built and opened (Runtime.prepare; the decoding step's prepacked session is opened by the first
    generation), then one run. The blocks with offsets (SmolLM2's Q4_1, Gemma 3's Q4_K) have their zero points
    centred: each offset is within a step (a scale) of zero, so the product by the codes is the size of the product
    by the weight, not twice it (sources/gguf_blocks._centred)."""
    from attnscope.model.quantized import unpack
    from attnscope.model.weights import state_dict
    from attnscope.sources import zoo

    from .conftest import CACHE

    model = zoo.get(model_id).load_model(CACHE)         # the set-up installs both zoo GGUF packages: never skipped
    sd = state_dict(model)
    quantised = [n for n, w in sd.items() if isinstance(w, Blocks)]
    assert all(isinstance(sd[n], Blocks) for n in sd if n.endswith(("proj.weight", "up.weight", "gate.weight",
                                                                       "down.weight")))
    f32_bytes = 4 * sum(w.size for w in sd.values())
    stem = {"smollm2": zoo.SMOLLM2_FILE, "gemma3": zoo.GEMMA3_FILE}[model_id].rsplit(".", 1)[0]
    cached = sorted(CACHE.glob(f"{stem}-*.safetensors"))
    from attnscope.sources.safetensors import read_header
    floats = sum(t.end - t.start for p in cached for t in read_header(p).values() if t.dtype == "F32")
    assert cached and quantised and floats < f32_bytes / 4          # scales, offsets and norms only
    offset = [sd[n] for n in quantised if sd[n].offsets is not None]
    assert offset and all(np.all(np.abs(w.offsets) <= np.abs(w.scales)) for w in offset)
    assert all(np.any(unpack(w.zero_points, w.bits, w.scales.shape[1]) > 0) for w in offset)

    script = (f"import resource, numpy as np; from attnscope.runtime.runtime import Runtime; "
              f"from attnscope.sources import zoo; rt = Runtime(zoo.get({model_id!r}), cache_dir={str(CACHE)!r}); "
              f"rt.prepare(); rt.run('The quick brown fox jumps over the lazy dog.'); "
              f"print(int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) * 1024)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rss = int(out.stdout.split()[-1])
    assert rss < f32_bytes, f"RSS {rss / 2**20:.0f} MB after loading, float32 weights {f32_bytes / 2**20:.0f} MB"


def test_generation_multiplies_the_blocks_prepacked(runtimes):
    """SmolLM2's decoding step (graphs/decoding.packs: its blocks come to ~110 MB) multiplies by every quantised
    weight as initializers, 8-bit (the Q8_0 tied LM head) and 4-bit alike (its embedding lookup reads the embedding's
    parts bound, as every graph does); a server's start
    builds that graph but leaves its session to the first generation; and its greedy tokens and logits are the NumPy
    reference's (which de-quantises)."""
    from attnscope.graphs.decoding import packs
    from attnscope.model.weights import state_dict
    from attnscope.runtime.generation import Generator, Sampling

    rt = runtimes["smollm2"]
    parts = set(expand({n: w for n, w in state_dict(rt.model).items() if isinstance(w, Blocks)}))
    assert packs(rt.model) and any(w.bits == 8 for w in state_dict(rt.model).values() if isinstance(w, Blocks))
    rt._sessions.pop("decode", None)
    rt.prepare()
    assert "decode" not in rt._sessions                        # built, not opened
    ids = rt.encode("The history of the printing press begins with").ids
    graph, ref = (Generator(rt, ids, Sampling(greedy=True), 6, engine=engine) for engine in ("onnx", "numpy"))
    pairs = list(zip(graph, ref))
    decode = rt._sessions["decode"]
    assert set(initialized(onnx.load(str(rt.graphs.path(decode=True)))).values()) == parts   # every product's
    assert not any(n.endswith(".packed") for n in decode.inputs)              # opened as initializers, not bound
    assert parts & set(decode.bound) == {n for n in parts if n.startswith("wte.")}   # the embedding lookup's
    assert all(rt.weights.binds(n) and rt.weights.array(n) is rt.weights.array(n.removesuffix(".packed"))
               for n in initialized(onnx.load(str(rt.graphs.path(decode=True)))))  # bound where not initializers
    assert graph.new_ids == ref.new_ids and len(pairs) == 6
    assert all(a.probability == pytest.approx(b.probability, abs=1e-5) for a, b in pairs)



def test_under_a_capped_arena_nothing_is_prepacked_and_a_run_past_the_cap_is_refused():
    """onnxruntime runs a session that prepacks an initializer outside the shared arena (runtime/options.share_arena),
    so under ATTNSCOPE_ARENA_MB every session binds its weights: SmolLM2's packed decoding step and MiniLM's served
    graph (which prepack them without a cap) then hold their runs to the cap, and a prompt past it is refused
    (OutOfMemory, the server's 507) where it ran through the packed step at 1 MB. In a process of its own: the cap is
    process-wide."""
    from .conftest import CACHE

    script = (f"import numpy as np; from attnscope.runtime.sessions import open_helpers; open_helpers(1); "
              f"from attnscope.runtime.runtime import Runtime; from attnscope.runtime.errors import OutOfMemory; "
              f"from attnscope.runtime.generation import Generator, Sampling; from attnscope.sources import zoo\n"
              f"for name in ('smollm2', 'minilm'):\n"
              f"    rt = Runtime(zoo.get(name), cache_dir={str(CACHE)!r}); ids = rt.encode(' '.join(['word'] * 300)).ids\n"
              f"    try:\n"
              f"        list(Generator(rt, ids, Sampling(greedy=True), 1)) if name == 'smollm2' else rt.run('word ' * 300)\n"
              f"        print(name, 'ran')\n"
              f"    except OutOfMemory as e:\n"
              f"        sess = rt._sessions['decode' if name == 'smollm2' else False]\n"
              f"        print(name, 'refused', rt.weights.prepacked, sum(n.endswith('.packed') for n in sess.bound), "
              f"len(sess.bound))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    gguf, small = (line.split() for line in out.stdout.splitlines()[-2:])    # name, refused, prepacked bytes,
    assert gguf[:2] == ["smollm2", "refused"] and int(gguf[3]) > 0, out.stdout  # bound parts of blocks, bound arrays
    assert small[:2] == ["minilm", "refused"] and small[2] == "0" and int(small[4]) > 80, out.stdout   # every one


def test_layer_by_layer_runs_serve_layers_of_different_block_formats(monkeypatch):
    """Gemma 3's Q4_K_M file holds mlp.down in Q4_K in some layers and in Q6_K in others (other bits and block
    sizes): a layer-by-layer run in blocks builds one layer graph per layout (model/weights.block_layouts), the three
    graphs a block and the fused one alike, and gives the float32 model's stacked answer (the same weights,
    de-quantised in memory at load)."""
    from attnscope.runtime.layerwise import Layerwise, Want
    from attnscope.runtime.runtime import Runtime
    from attnscope.sources import gguf as gguf_source
    from attnscope.sources import zoo

    from .conftest import CACHE

    text = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."
    monkeypatch.setattr(gguf_source, "F32_IN_MEMORY_BYTES", 1 << 40)          # every weight de-quantised at load
    f32 = Runtime(zoo.get("gemma3"), cache_dir=CACHE)
    ref = f32(text)
    del f32
    monkeypatch.setattr(gguf_source, "F32_IN_MEMORY_BYTES", 0)                # the blocks
    rt = Runtime(zoo.get("gemma3"), cache_dir=CACHE)
    assert isinstance(rt.model.blocks[0].mlp.down.weight, Blocks)
    layouts = sorted(set(Layerwise(rt).layouts))
    assert len(layouts) > 1
    assert {rt.model.blocks[i].mlp.down.weight.bits for i in layouts} == {4, 8}
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    for fused in (False, True):
        lw = Layerwise(rt, graphs=rt.layerwise(), fused=fused).forward(
            rt.encode(text), want=Want(layers=tuple(range(L)), heads=tuple(range(H)), attention=True))
        got = np.stack([lw.asked.attention[layer].reshape(ref.attentions[layer].shape) for layer in range(L)])
        np.testing.assert_allclose(got, ref.attentions, atol=1e-5, rtol=0)
        np.testing.assert_allclose(lw.next_token_logits, ref.next_token_logits, atol=1e-4, rtol=0)
    assert sum(1 for key in rt.layerwise()._sessions if key[0] == "block_in") == len(layouts)


def test_a_random_q4_k_m_llama_file_equals_transformers(tmp_path, monkeypatch):
    """bench/checkpoints.llama_gguf's file, the 8B bench's family at a small size (Q4_K, and Q6_K for attn_v and
    ffn_down where llama.cpp's Q4_K_M puts it: layers of two layouts), served from its blocks, whole and layer by
    layer: every layer's attention and the next-token logits equal transformers' Llama on gguf's de-quantisation
    (float64) within 1e-4, with peaked attention."""
    import torch

    from attnscope.runtime.layerwise import Layerwise, Want
    from attnscope.runtime.runtime import Runtime
    from attnscope.sources import gguf as gguf_source
    from attnscope.sources import resolve

    from bench.checkpoints import SHAPES, dequantised_llama, llama_gguf, text

    path = llama_gguf(tmp_path / "tiny.gguf", "tiny")
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert kinds["blk.2.ffn_down.weight"] == kinds["blk.3.attn_v.weight"] == kinds["output.weight"] == "Q6_K"
    assert kinds["blk.0.ffn_down.weight"] == kinds["blk.1.attn_q.weight"] == kinds["token_embd.weight"] == "Q4_K"
    monkeypatch.setattr(gguf_source, "F32_IN_MEMORY_BYTES", 0)
    rt = Runtime(resolve(f"tiny={path}", cache=tmp_path), cache_dir=tmp_path)
    assert isinstance(rt.model.blocks[2].mlp.down.weight, Blocks) and rt.model.blocks[2].mlp.down.weight.bits == 8
    enc = rt.encode(text(60))
    res = rt(text(60))
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    lw = Layerwise(rt, graphs=rt.layerwise()).forward(enc, want=Want(tuple(range(L)), tuple(range(H)), attention=True))

    ref = dequantised_llama(path, SHAPES["tiny"])
    with torch.no_grad():
        values: list = []                                     # each layer's v_proj output [1, T, Hkv * dh]
        for layer in ref.model.layers:
            layer.self_attn.v_proj.register_forward_hook(lambda m, a, o: values.append(o.numpy()))
        out = ref(torch.tensor([enc.ids]), output_attentions=True)
    want = np.stack([a[0].numpy() for a in out.attentions])                      # [L, H, T, T]
    assert want.max(-1).mean() >= 0.5                                             # peaked: the check means something
    np.testing.assert_allclose(res.attentions.reshape(want.shape), want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.stack([lw.asked.attention[i].reshape(want.shape[1:]) for i in range(L)]), want,
                               atol=1e-4, rtol=0)
    logits = out.logits[0, -1].numpy()
    np.testing.assert_allclose(res.next_token_logits, logits, atol=1e-4, rtol=0)
    np.testing.assert_allclose(lw.next_token_logits, logits, atol=1e-4, rtol=0)
    # W_O in blocks: the graph's value norms from each head's R (model/weights.value_r) equal ||W_h v|| in float64
    dh, T = rt.cfg.d_head, len(enc.ids)
    for layer in range(L):
        W = np.asarray(rt.model.blocks[layer].attn.out_projection()[0], np.float64)       # [D, H * dh]
        heads = W.reshape(W.shape[0], H, dh).transpose(1, 0, 2)                            # [H, D, dh]
        v = values[layer][0].astype(np.float64).reshape(T, -1, dh).transpose(1, 0, 2)     # [Hkv, T, dh]
        vl = np.repeat(v, H // v.shape[0], axis=0)                                        # [H, T, dh]
        want_norms = np.linalg.norm(np.einsum("hdk,htk->htd", heads, vl), axis=-1)        # [H, T]
        np.testing.assert_allclose(res.value_norms[layer], want_norms, rtol=1e-4, atol=1e-5)
    # the float16 mode opens a graph of blocks (its products by blocks stay float32) and agrees with float32
    half = Runtime(resolve(f"tiny={path}", cache=tmp_path), cache_dir=tmp_path, compute_dtype="float16")(text(60))
    assert half.next_tokens[0].id == res.next_tokens[0].id
    assert np.abs(half.attentions - res.attentions).max() < 0.05


def test_a_run_unpacks_each_zero_point_and_scale_just_before_its_product(tmp_path, monkeypatch):
    """4-bit codes' zero points go to MatMulNBits as floats (graphs/builder.Graph.times), unpacked in the graph from
    graph inputs, and a K-quant's scales and offsets are multiplied out of their factors there (model/quantized.py).
    onnxruntime may run a node that reads only graph inputs first of all: it did so for the factored scales, and
    every layer's were alive at once (an 8B's stacked run: ~0.4 GB more at its peak), so they are read after the
    product's input (Graph._after). Checked on onnxruntime's own profile of a run of the stacked graph (node names
    are their outputs'): each Cast that starts a product's float zero points or scales runs after the product before
    it."""
    import json

    import onnxruntime as ort

    from attnscope.graphs.stacked import build_graph
    from attnscope.runtime.runtime import Runtime
    from attnscope.sources import gguf as gguf_source
    from attnscope.sources import resolve

    from bench.checkpoints import llama_gguf, text
    from bench.common import session_feeds

    monkeypatch.setattr(gguf_source, "F32_IN_MEMORY_BYTES", 0)                # served from its blocks
    rt = Runtime(resolve(f"tiny={llama_gguf(tmp_path / 'tiny.gguf', 'tiny')}", cache=tmp_path), cache_dir=tmp_path)
    from attnscope.model.weights import state_dict
    assert any(isinstance(w, Blocks) and w.factors is not None for w in state_dict(rt.model).values())   # Q4_K
    proto = build_graph(rt.model, attentions=False)
    made = {o: n for n in proto.graph.node for o in n.output}
    given = {i.name for i in proto.graph.input} | {i.name for i in proto.graph.initializer}

    def casts(name: str, depth: int = 12) -> set[str]:
        """The Casts of a graph input (or of a Reshape of one: Graph._after) within `depth` nodes above `name`."""
        node = made.get(name)
        if node is None or depth == 0:
            return set()
        source = node.input[0] if node.input else None
        if node.op_type == "Cast" and (source in given or source in made and made[source].input[0] in given):
            return {node.name}
        return set().union(*(casts(i, depth - 1) for i in node.input))

    chains = {n.name: casts(n.input[2]) | casts(n.input[3]) for n in proto.graph.node if n.op_type == "MatMulNBits"}
    chains = {p: c for p, c in chains.items() if c}
    assert len(chains) >= 5 * rt.cfg.n_layers                     # q, k, o, gate, up at least: Q4_K

    so = ort.SessionOptions()
    so.enable_profiling, so.profile_file_prefix, so.log_severity_level = True, str(tmp_path / "profile"), 3
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=default_providers())
    sess.run(None, session_feeds(rt, rt.encode(text(30)), sess))
    with open(sess.end_profiling()) as f:
        ran = [e["name"][:-len("_kernel_time")] for e in json.load(f)
               if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    at = {name: i for i, name in enumerate(ran)}
    products = [name for name in ran if name in made and made[name].op_type == "MatMulNBits"]
    for before, product in zip(products, products[1:]):
        early = sorted(n for n in chains.get(product, ()) if n in at and at[n] < at[before])
        assert not early, f"{product}'s zero points or scales ({early}) were made before {before} ran"


def test_the_blocks_cache_is_written_one_tensor_at_a_time(tmp_path):
    """sources/safetensors.write_streamed (the GGUF cache's writer): arrays of mixed item sizes and odd lengths, given
    one at a time, read back equal by the safetensors package and by our reader, each aligned to its item size (so
    views need no copy), the metadata asked for after the last one."""
    import ml_dtypes
    from safetensors import safe_open

    from attnscope.sources.safetensors import read_header, write_streamed

    rng = np.random.default_rng(0)
    arrays = {"codes": rng.integers(0, 256, (3, 5), dtype=np.uint8), "scales": rng.standard_normal((7, 3), np.float32),
              "half": rng.standard_normal(5).astype(np.float16), "more": rng.integers(0, 256, 9, dtype=np.uint8),
              "bf": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16)}
    seen = []
    path = tmp_path / "w.safetensors"
    write_streamed(path, ((n, seen.append(n) or a) for n, a in arrays.items()), lambda: {"n": str(len(seen))})
    assert not list(tmp_path.glob("w.safetensors.*"))                # the side files are gone
    with safe_open(path, "np") as f:
        assert f.metadata() == {"n": "5"}
        assert all(np.array_equal(f.get_tensor(n), a) for n, a in arrays.items() if n != "bf")
    data = path.read_bytes()
    for name, t in read_header(path).items():
        assert t.start % arrays[name].dtype.itemsize == 0
        assert data[t.start:t.end] == arrays[name].tobytes()
