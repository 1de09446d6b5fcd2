"""Attention at the lengths models read (issue 48): a layer's attention in blocks of queries (runtime/blocks.py), exact
rows and tiles recomputed from a run's checkpoints (analyses/exact.py), memory linear in the text, and the limit a
text past what fits is refused at.

The blocks' numbers are held to two independent ones: the layer's rows in float64 from the same q and k (each row's
softmax over every key its mask leaves it: causal, and on Gemma 3's local layers the 512-key window), and the
unblocked walk's full matrices, which tests/test_long.py holds to the stacked graph and tests/test_gemma3_zoo.py and
test_smollm2.py to transformers. Lengths are past the old stacked limit but modest: the 30,000-token run is
bench/long_context.py's."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from attnscope.analysis import thumbnails
from attnscope.runtime.blocks import block_mask, key_range, query_blocks, tokenwise
from attnscope.runtime.layerwise import Layerwise, Want
from attnscope.sources import zoo

from .conftest import CACHE
from .references import hf_from_gguf

ATOL = 1e-5          # float32 blocks against the unblocked walk (the same products, other shapes and orders)
ROW_ATOL = 1e-4      # against float64 rows from the same q, k


def words(n: int) -> str:
    """About n tokens of English words (bench.common's list, in turn)."""
    from bench.common import WORDS
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def text_ids(rt, n: int) -> list[int]:
    """Exactly n token ids of an English text."""
    ids = rt.encode(words(n)).ids
    assert len(ids) >= n
    return ids[:n]


def float64_rows(rt, lw: Layerwise, res, layer: int, heads, queries) -> np.ndarray:
    """[n, Q, T] rows in float64 from layer `layer`'s q and k (block_in on the run's checkpoint), under the layer's
    mask (causal, its window) built independently of runtime/blocks.py."""
    qkv = lw.run_graph("block_in", {"x": res.checkpoints[layer]}, list("qk"), layer=layer, keep=("q", "k"))
    q, k = (qkv[n].host()[0].astype(np.float64) for n in "qk")                  # [H, T, dh]
    T, window = q.shape[1], rt.model.blocks[layer].window
    scale = float(rt.model.blocks[layer].attn.scale)
    out = []
    for h in heads:
        s = q[h, queries] @ k[h].T * scale                                       # [Q, T]
        j, i = np.arange(T)[None, :], np.asarray(queries)[:, None]
        s = np.where((j <= i) & ((i - j < window) if window else True), s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        out.append(s / s.sum(-1, keepdims=True))
    return np.stack(out)


def test_block_plan_covers_every_visible_key():
    """Each block's keys are exactly those its queries may see; blocks tile the queries; the mask is the whole text's."""
    from attnscope.model.attention import attention_mask
    T, window = 1000, 100
    for causal in (True, False):
        blocks = query_blocks(T, causal, window, 64 * 300 * 4)
        assert blocks[0][0] == 0 and blocks[-1][1] == T
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
        whole = attention_mask(None, T, T, causal=causal, window=window)[0, 0]
        for q0, q1, k0, k1 in blocks:
            assert (k0, k1) == key_range(q0, q1, T, causal, window)
            visible = whole[q0:q1] == 0
            assert not visible[:, :k0].any() and not visible[:, k1:].any()
            np.testing.assert_array_equal(block_mask(q0, q1, k0, k1, causal, window, None)[0, 0], whole[q0:q1, k0:k1])


@pytest.mark.parametrize("model_id, n, layers", [("gemma3", 700, (0, 5)),     # a local layer (window 512), a global
                                                 ("smollm2", 400, (3,))])
def test_blocked_rows_equal_float64_and_the_stacked_graph(runtimes, model_id, n, layers):
    """A walk in blocks of queries (a small group budget forces them) equals the stacked graph (the registry's rows,
    top-k keys, the next-token prediction); rows of chosen queries and a tile, recomputed from the checkpoints, equal
    float64 rows and the stacked graph's matrices, and the tile equals the rows."""
    from attnscope.analysis import statistics as stats

    rt = runtimes[model_id]
    enc = rt.encode_ids(text_ids(rt, n))
    T, H = len(enc.ids), rt.cfg.n_heads
    heads = (0, H - 1)
    [full] = rt.forward([enc])                                      # [L, H, T, T]
    lw = Layerwise(rt, group_mb=0.1, graphs=rt.layerwise())
    assert len(query_blocks(T, True, 0, 0.1 * 2**20)) > 4
    res = lw.forward(enc, want=Want(layers, heads, top_k=4, resolution=7))
    keys = stats.TextKeys.of(enc, rt.cfg, full.value_norms)         # the stacked graph's value norms [L, H, T]
    # the blocks' thumbnails: 7 cells of ~60-100 keys (a block's causal edge inside a cell), and, recomputed, 300
    # cells (of 2 or 3 keys at 700 tokens, of 1 or 2 at 400), the first blocks' keys pooled by the product with the
    # pooling matrix, the later ones' (over CELLS_GATHERED cells) by gathering each cell's keys
    for R, walk in ((7, res), (300, lw.recompute(res, Want(layers, (0,), resolution=300)))):
        for layer in layers:
            np.testing.assert_allclose(walk.thumbnails[R][layer], thumbnails.downsample(full.attentions[layer], R),
                                       atol=ATOL, rtol=0, err_msg=f"{R} cells, layer {layer}")
    for name in ("entropy", "first", "previous", "distance", "local", "value_weighted_first"):
        np.testing.assert_allclose(res.rows[name], stats.ROWS[name].numpy(full.attentions, keys), rtol=0,
                                   atol=(50 if name == "entropy" else T if name == "distance" else 1) * ATOL,
                                   err_msg=name)
    local = [l for l in range(rt.cfg.n_layers) if rt.model.blocks[l].window]   # Gemma 3's: every key in the window
    assert not local or (np.abs(res.rows["local"][local] - 1).max() < ATOL and res.rows["local"].min() < 0.99)
    assert res.next_tokens[0].id == full.next_tokens[0].id
    assert len(tokenwise(lw, T)) > 4 and len(tokenwise(lw, T, final=True)) > 4     # per-token graphs in runs too
    np.testing.assert_allclose(res.hidden, full.hidden, atol=ATOL * np.abs(full.hidden).max(), rtol=0)
    np.testing.assert_allclose(res.next_token_logits, full.next_token_logits, atol=10 * ATOL, rtol=0)
    np.testing.assert_allclose(res.token_logprobs[1:], full.token_logprobs[1:], atol=10 * ATOL, rtol=0)

    queries = (0, 600 if T > 600 else T // 2, T - 1)
    later = lw.recompute(res, Want(layers, heads, queries=queries, tile=((queries[1], queries[1] + 1), (0, T))))
    for layer in layers:
        A = full.attentions[layer][list(heads)]
        top = np.take_along_axis(A, res.asked.top_keys[layer].astype(np.int64), -1)
        np.testing.assert_allclose(res.asked.top_weights[layer], top, atol=ATOL, rtol=0)
        rows = later.asked.rows[layer]
        np.testing.assert_allclose(rows, A[:, list(queries)], atol=ATOL, rtol=0)
        np.testing.assert_array_equal(later.asked.tile[layer][:, 0], rows[:, 1])
        np.testing.assert_allclose(rows, float64_rows(rt, lw, res, layer, heads, queries), atol=ROW_ATOL, rtol=0)
        if rt.model.blocks[layer].window:          # far keys of a local layer: exactly 0
            assert not rows[:, 1, :queries[1] - 511].any() and rows[:, 1, queries[1] - 511:queries[1] + 1].all()


def test_the_asked_layers_inputs_are_kept_in_place_of_the_spaced_ones():
    """A walk keeps as many inputs as its spacing allows, the asked layers' first: rows and tiles asked later of a
    layer the request looked at need no block run again (Gemma 3 at 30,000 tokens, every 4th kept: layer 5's rows
    took 2.75 s from layer 4's input, bench/long_context.py). Layer 0 stays; an asked layer never gives its place."""
    from attnscope.runtime.blocks import kept_layers
    assert kept_layers(18, 4, ()) == {0, 4, 8, 12, 16}
    assert kept_layers(18, 4, (0, 5, 8, 17)) == {0, 5, 8, 12, 17}           # the bench's request on Gemma 3
    assert kept_layers(18, 4, (5, 6)) == {0, 5, 8, 12, 16}                  # 6 walks from 5
    assert kept_layers(18, 4, (2,)) == {0, 4, 8, 12, 16}                    # layer 0 always
    assert kept_layers(18, 1, (5,)) == set(range(18))
    assert all(len(kept_layers(32, e, asked)) == len(range(0, 32, e))       # never more than the spacing keeps
               for e in (2, 3, 6, 16) for asked in ((), (1, 7, 31), tuple(range(32))))


def test_spaced_checkpoints_keep_rows_and_tiles_exact(runtimes):
    """A long run keeps its checkpoints as a server spaces them (runtime/blocks.checkpoint_spacing: at 32,768 tokens
    l1b keeps one in 16 layers, bench/long_context.py): rows and a tile of a layer between checkpoints, asked after the
    run, walk to it from the nearest checkpoint below (blocks of queries, per-token graphs in runs of tokens) and are
    bit for bit the rows the run computed in its pass, and within ATOL of a run that kept every layer's; an asked
    layer's input is kept in place of the spaced one below it (kept_layers), and its rows come from there."""
    from bench.long_context import server_spacing

    class L1B:                                             # Llama 3.2 1B's stream: 16 layers of 2048 floats a token
        n_layers, d_model = 16, 2048
    # half the default 768 MB result cache: one 256 MB checkpoint at 32,768 tokens (every layer's: 4 GB), 8 at 4,096
    assert server_spacing(L1B, 32768) == 16 and server_spacing(L1B, 4096) == 2

    rt = runtimes["smollm2"]
    enc = rt.encode_ids(text_ids(rt, 400))
    T, H, layer = len(enc.ids), rt.cfg.n_heads, 6
    heads, queries, tile = (0, H - 1), (0, 200, T - 1), ((150, 260), (100, 230))
    spaced = Layerwise(rt, checkpoint_every=4, group_mb=0.1, graphs=rt.layerwise())
    want = Want((layer, layer + 1), heads, queries=queries, tile=tile)
    res = spaced.forward(enc, want=want)
    # every 4th layer's input, but the asked layer 6 takes the place of layer 4 (kept_layers): as many, the same memory
    assert sorted(res.checkpoints) == sorted({0, layer} | set(range(8, rt.cfg.n_layers, 4))) and len(tokenwise(spaced, T)) > 1
    later = spaced.recompute(res, want)                    # layer 6 from its own input, layer 7 runs block 6 again
    for at in (layer, layer + 1):
        np.testing.assert_array_equal(later.asked.rows[at], res.asked.rows[at])
        np.testing.assert_array_equal(later.asked.tile[at], res.asked.tile[at])
    every = Layerwise(rt, group_mb=0.1, graphs=rt.layerwise()).forward(enc, want=want)
    np.testing.assert_allclose(later.asked.rows[layer], every.asked.rows[layer], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(later.asked.tile[layer][:, 200 - 150], later.asked.rows[layer][:, 1, 100:230])


PEAK = textwrap.dedent("""
    import ctypes
    import sys
    from pathlib import Path
    import numpy as np
    from attnscope.analysis.statistics import TextKeys
    from attnscope.runtime import Runtime
    from attnscope.runtime.layerwise import ROWS
    from attnscope.sources import zoo
    T, cache = int(sys.argv[1]), Path(sys.argv[2])
    rt = Runtime(zoo.get("gemma3"), cache_dir=cache)
    lw = rt.layerwise()
    ctypes.CDLL("libc.so.6").malloc_trim(0)               # loading's freed temporaries back to the system first
    open("/proc/self/clear_refs", "w").write("5")          # the peak from here on: not loading's (de-quantising)
    start = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")) * 1024
    enc = rt.encode_ids([2] + [(i * 7919) % 200000 + 1000 for i in range(T - 1)])
    mask, extra, masks, blocks = lw._walk_inputs(T, True, None, TextKeys.of(enc), 512, ROWS)
    inputs = rt.feeds(np.array([enc.ids]), np.array([enc.type_ids]), mask, [T])
    x = lw.run_graph("embed", inputs, ["x"], keep=("x",))["x"]
    for layer in (4, 5):                                   # a local layer, then a global one (every earlier key)
        x = lw._block(layer, x, inputs, ROWS + ("thumbnail",), True, extra, masks, blocks=blocks)["x_next"]
    print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) * 1024 - start)
""")


def peak_bytes(T: int) -> int:
    """What a fresh process's peak resident memory (VmHWM: onnxruntime's arena is in it, which tracemalloc cannot see)
    rises over its resident memory once Gemma 3 is loaded, while it runs layers 4 (local) and 5 (global) over T
    tokens with their rows and thumbnails: the peak is reset after loading (/proc/self/clear_refs) and measured from
    there, in the same process (another process's baseline differed by 0.16 GB from run to run). Before the reset,
    malloc_trim hands back the heap that loading freed: left resident, it counts in the baseline and then absorbs the
    run's first few hundred MB, so a small run looked cheaper than it was (without it: 0.12 against 0.39 GB at 8,192
    and 16,384 tokens, 3.4x, a "T^2 term" that was only the allocator's free memory; with it: 0.40 and 0.71 GB)."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", PEAK, str(T), str(CACHE)], capture_output=True, text=True,
                         timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_memory_grows_linearly_in_the_text():
    """What a run adds to a loaded process, on Gemma 3's local and global layer: at 16,384 tokens at most 2.3x what it
    adds at 8,192 (linear: 2x; a [T, T] per head would be 4x, 1 GB against 256 MB)."""
    small, large = peak_bytes(8192), peak_bytes(16384)
    assert large <= 2.3 * small, (small, large)


def test_a_text_past_what_fits_is_refused_naming_the_limit(runtimes, local_smollm2):
    """A text longer than the capability record prices as fitting (memory, ATTNSCOPE_WORK_TFLOP: SmolLM2's 8,192
    tokens take more than the default 4 TFLOP) is a 422 that names the limit and the longest text that fits, before
    any work; rows and a tile of a short text come from its matrices."""
    from attnscope.model.weights import state_dict
    from attnscope.python.client import ApiError
    from attnscope.runtime.capabilities import forward_flop
    model, rt = local_smollm2, runtimes["smollm2"]
    longest = next(m for m in model.models() if m["id"] == "smollm2")["capabilities"]["longest_text_tokens"]
    blocks = sum(int(a.size) for name, a in state_dict(rt.model).items() if name.startswith("blocks."))
    assert forward_flop(rt.cfg, blocks, longest) <= 4e12 < forward_flop(rt.cfg, blocks, longest + 1)
    assert 4096 < longest < rt.spec.max_tokens == 8192
    text = words(longest + 20)
    assert longest < len(rt.encode(text).ids) <= 8192
    with pytest.raises(ApiError) as refused:
        model.attention(text, model="smollm2", include=["summary"])
    assert refused.value.status == 422
    assert f"the longest text that fits is {longest:,} tokens" in refused.value.detail
    assert "ATTNSCOPE_WORK_TFLOP" in refused.value.detail
    a = model.attention("Hello there.", model="smollm2", queries=[1], tile={"queries": [0, 2], "keys": [0, 3]},
                        layers=[0], heads=[0])
    A = np.asarray(a["attention"])[0, 0]
    assert list(a["queries"]) == [1]
    np.testing.assert_array_equal(np.asarray(a["rows"])[0, 0, 0], A[1])
    np.testing.assert_array_equal(np.asarray(a["tile"])[0, 0], A[0:2, 0:3])
    with pytest.raises(ApiError) as refused:
        model.attention("Hello there.", model="smollm2", tile={"queries": [0, 99], "keys": [0, 3]})
    assert refused.value.status == 422 and "this text's token count" in refused.value.detail


@pytest.mark.slow
def test_a_long_run_equals_transformers_in_float64(runtimes):
    """The issue's request at a short length, on the long path (a small group budget: attention in blocks of queries,
    the per-token graphs in runs of tokens): every head's full rows of 6 queries at 4 layers (local 0 and 8, global 5
    and 17), past the local layers' 512-key window, equal transformers' Gemma 3 from the same GGUF in float64
    (bench/long_context.reference_rows: its attention one block of queries at a time) within 1e-4, and the next-token
    top-1 is the same. bench/long_context.py --reference runs the same at 30,000 tokens. The run asks no log-probs,
    as the API's request without `predictions` (the LM head at the last position only: over Gemma 3's 262,144 rows at
    every position it took 14 of this test's 74 s; test_a_run_without_predictions_... holds the two equal)."""
    from bench.long_context import LAYERS, queries_of, reference_rows
    rt = runtimes["gemma3"]
    enc = rt.encode_ids(text_ids(rt, 1100))
    T, H, layers = len(enc.ids), rt.cfg.n_heads, LAYERS["gemma3"]
    lw = Layerwise(rt, group_mb=1, graphs=rt.layerwise())
    assert len(query_blocks(T, True, 0, 2**20)) >= 4 and len(tokenwise(lw, T)) > 4
    res = lw.forward(enc, want=Want(layers, tuple(range(H)), queries=queries_of(T), logprobs=False))
    rows, logits = reference_rows("gemma3", enc.ids, layers, queries_of(T),
                                  model=hf_from_gguf(zoo.gemma3_path(None, CACHE), CACHE))
    for layer in layers:
        np.testing.assert_allclose(res.asked.rows[layer], rows[layer], atol=ROW_ATOL, rtol=0, err_msg=str(layer))
    assert res.next_tokens[0].id == int(logits.argmax())


class ValueWeighted:
    """transformers' eager SmolLM2 as a module whose output is one layer's value-weighted attention [B, H, T, T]
    (Kobayashi et al. 2020): its attention weights alpha [B, H, T, T] times ||v_j W_O^h|| (its v_proj's output per key
    head, repeated per query head, through the head's d_head columns of o_proj), normalised over each row."""

    def __new__(cls, hf, layer: int):
        import torch

        class Module(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.hf = hf

            def forward(self, input_ids):
                attn, seen = self.hf.model.layers[layer].self_attn, {}
                hook = attn.v_proj.register_forward_hook(lambda m, i, o: seen.setdefault("v", o))
                try:
                    alpha = self.hf(input_ids=input_ids, output_attentions=True).attentions[layer]
                finally:
                    hook.remove()
                B, H, T, _ = alpha.shape
                W = attn.o_proj.weight                                     # [D, H dh]
                dh = W.shape[1] // H
                v = seen["v"].view(B, T, -1, dh).transpose(1, 2).repeat_interleave(H // (seen["v"].shape[-1] // dh), 1)
                written = v @ W.view(W.shape[0], H, dh).permute(1, 2, 0)   # [B, H, T, D]: v_j W_O^h
                norms = (written * written).sum(-1).sqrt()                 # [B, H, T]
                w = alpha * norms[:, :, None, :]
                return w / w.sum(-1, keepdim=True)
        return Module()


@pytest.mark.slow
def test_value_weighted_rows_and_tile_equal_transformers(local_smollm2, hf_smollm2):
    """`view: value_weighted` answers rows and a tile of alpha_ij ||v_j W_O^h||, normalised per row, equal to the same
    computed from transformers' eager attention weights, value states and o_proj (ValueWeighted) within float32
    bounds derived against float64 (tests/float32.py); a short text runs layer by layer for it, and its weights view
    is the stacked graph's. A first-token sink, whose value vector is small, weighs less value-weighted."""
    import torch

    from .float32 import assert_within, float32_bound
    model, layer, heads = local_smollm2, 3, [0, 4, 8]
    text = "The quick brown fox jumps over the lazy dog. Then the dog sleeps in the warm sun all afternoon."
    got = model.attention(text, model="smollm2", layers=[layer], heads=heads, include=["summary"],
                          queries=[5, 20], tile={"queries": [10, 20], "keys": [0, 12]}, view="value_weighted")
    plain = model.attention(text, model="smollm2", layers=[layer], heads=heads, include=["summary"], queries=[5, 20])
    T = len(got["tokens"])
    ids = model.runtime.encode(text).ids
    exact, bound = float32_bound(ValueWeighted(hf_smollm2, layer), lambda o: o[:, heads], samples=16,
                                 input_ids=torch.tensor([ids]))      # 16 copies: a wider bound, a quarter the work
    rows, tile = np.asarray(got["rows"])[0], np.asarray(got["tile"])[0]
    assert rows.shape == (3, 2, T)
    assert_within(rows, exact[:, [5, 20]], bound[:, [5, 20]], "rows")
    assert_within(tile, exact[:, 10:20, 0:12], bound[:, 10:20, 0:12], "tile")
    np.testing.assert_allclose(rows.sum(-1), 1, atol=1e-5)
    weights = np.asarray(plain["rows"])[0]
    assert not np.allclose(rows, weights, atol=1e-3)
    assert (rows[..., 0] < weights[..., 0]).mean() > 0.5        # the sink's value is small (arXiv 2410.10781)
    # what the layer-by-layer run cannot give a short text is refused for its view, not for a length it does not have
    from attnscope.python.client import ApiError
    with pytest.raises(ApiError, match="`view: value_weighted` is computed layer by layer, and rollout") as e:
        model.attention(text, model="smollm2", layers=[layer], include=["rollout"], queries=[5], view="value_weighted")
    assert e.value.status == 422 and "tokens" not in str(e.value)


def test_a_run_without_predictions_runs_the_lm_head_at_the_last_position(runtimes, local_smollm2):
    """A long run that asks no log-probs (Want.logprobs False: the API's answer without `predictions` or `effect`)
    runs the final norm at every position and the LM head at the last alone (runtime/blocks.final_parts): the same
    hidden states, next-token logits and top tokens as the stacked graph, no token_logprobs. The API's next request
    on the same text that asks `predictions` runs it again with them, its kept parts replaced."""
    rt = runtimes["gemma3"]
    enc = rt.encode_ids(text_ids(rt, 700))
    [full] = rt.forward([enc])
    res = Layerwise(rt, group_mb=1, graphs=rt.layerwise()).forward(enc, want=Want(logprobs=False))
    assert res.token_logprobs is None and [t.id for t in res.next_tokens] == [t.id for t in full.next_tokens]
    np.testing.assert_allclose(res.hidden, full.hidden, atol=ATOL * np.abs(full.hidden).max(), rtol=0)
    np.testing.assert_allclose(res.next_token_logits, full.next_token_logits, atol=10 * ATOL, rtol=0)

    text = words(700)                                   # SmolLM2's 30 x 9 heads at ~700 tokens: layer by layer
    plain = local_smollm2.attention(text, model="smollm2", include=["summary"], layers=[0], heads=[0])
    assert "token_logprobs" not in plain.data and len(plain["tokens"]) > 600
    asked = local_smollm2.attention(text, model="smollm2", include=["summary", "predictions"], layers=[0], heads=[0])
    logprobs = asked["token_logprobs"]
    assert len(logprobs) == len(asked["tokens"]) and logprobs[0] is None and all(v <= 0 for v in logprobs[1:])


def unembedding_products(proto, W: str) -> int:
    """How many matrix products of a graph read the unembedding W (its blocks, or rows sliced from it)."""
    made = {out: node for node in proto.graph.node for out in node.output}

    def reads(name: str, hops: int = 4) -> bool:
        node = made.get(name)
        return name.startswith(W) or (node is not None and hops > 0 and any(reads(i, hops - 1) for i in node.input))
    return sum(n.op_type in ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits") and reads(n.input[1])
               for n in proto.graph.node)


def test_the_lm_head_multiplies_each_vocabulary_chunk_once(runtimes):
    """SmolLM2 from its GGUF blocks: the served graph and a walk's final graph multiply by the unembedding once per
    VOCAB_CHUNK rows, each text's next-token logits being its last row of the log-prob's chunks (a second product at
    the last position de-quantised the whole vocabulary again in every run: 7 times in a 3,250-token Gemma 3 walk,
    4.7 of its 36 s); the graph of the last position's logits alone (a walk without log-probs) reads it once too."""
    import onnx

    from attnscope.graphs import layers
    from attnscope.model.transformer import VOCAB_CHUNK
    rt = runtimes["smollm2"]
    chunks = -(-rt.cfg.vocab_size // VOCAB_CHUNK)
    served = onnx.load(str(rt.onnx_path()), load_external_data=False)
    assert unembedding_products(served, "wte") == chunks > 1
    for which in ("final", "final_logits"):
        assert unembedding_products(layers.build_final(rt.model, which), "wte") == chunks, which
