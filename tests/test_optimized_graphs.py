"""Graphs kept as onnxruntime optimizes them (runtime/options.OptimizedGraphs): the first session on a graph saves its
optimized form in the graph cache, later sessions open that with optimization off, and every output is the same bit
for bit as a session that optimizes the graph itself; a damaged saved form is made again, a folder that cannot be
written keeps nothing and costs nothing but the saving."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from attnscope.runtime.options import open_session

from .conftest import DEVICE, PROVIDERS

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."


def saved(folder) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("optimized-"))


def outputs(rt, sess) -> list[np.ndarray]:
    """The session's outputs on TEXT (a decoding step's: TEXT as the prompt, after an empty cache)."""
    from attnscope.model.decoding import KeyMasks, KVCache
    from attnscope.runtime.generation import cache_names
    from bench.common import session_feeds
    feeds = session_feeds(rt, enc := rt.encode(TEXT), sess)
    if "key_mask" in {i.name for i in sess.get_inputs()}:
        masks, cache = KeyMasks.plain(rt.cfg, 1, len(enc.ids), 0), KVCache.empty(rt.cfg)
        feeds |= {"attention_mask": masks.attention, "key_mask": masks.keys, "votes": masks.votes}
        for layer in range(rt.cfg.n_layers):
            feeds |= dict(zip(cache_names(layer)[:2], (cache.keys[layer], cache.values[layer])))
    return sess.run(None, feeds)


# the served graph with its product weights prepacked (MiniLM) or its quantised blocks' parts (SmolLM2's decoding
# graph) opened as initializers; a graph cut after two blocks, built in memory; the teaching stages, as it is; MiniLM
# in float16 (a graph open_session rewrites)
CASES = {"prepacked": ("minilm", lambda rt: rt.onnx_path(), dict(prepack=True)),
         "packed": ("smollm2", lambda rt: rt.graphs.path(decode=True), dict(packed=True)),
         "cut": ("smollm2", lambda rt: rt.graphs.stopping(2), dict(prepack=True)),
         "stages": ("smollm2", lambda rt: rt.graphs.path(stages=True), {}),
         "float16": ("minilm", lambda rt: rt.onnx_path(), dict(compute_dtype="float16"))}


@pytest.mark.parametrize("case", CASES)
def test_a_saved_optimized_graph_answers_the_same_bits(runtimes, tmp_path, case):
    model_id, graph, how = CASES[case]
    rt = runtimes[model_id]
    graph = graph(rt)
    kw = {"compute_dtype": how.get("compute_dtype", "float32")}
    if how.get("prepack") or how.get("packed"):      # every product weight prepacked, whatever the budget has left
        kw |= dict(initial=rt.weights.value, prepack=(lambda products, others: list(products)) if how.get("prepack")
                   else None)
    if case == "packed":
        from attnscope.graphs.decoding import packs
        assert packs(rt.model)
    reference = outputs(rt, open_session(graph, PROVIDERS, 2, **kw))
    first = open_session(graph, PROVIDERS, 2, optimized=tmp_path, **kw)
    made = saved(tmp_path)
    again = open_session(graph, PROVIDERS, 2, optimized=tmp_path, **kw)
    for got in (outputs(rt, first), outputs(rt, again)):
        assert len(got) == len(reference)
        for a, b in zip(got, reference):
            np.testing.assert_array_equal(a, b)
    if DEVICE != "cpu" or case == "packed":     # kept for the CPU's sessions only, and for no packed graph (its
        assert made == []                        # quantised parts change how it is optimized)
        return
    assert len(made) == 2 and made[1] == made[0] + ".sha256", made
    assert saved(tmp_path) == made                                             # read, not made again
    kept = onnx.load(str(tmp_path / made[0]))               # no weight of the model: they stay bound (or are added
    held = {i.name: numpy_helper.to_array(i).nbytes for i in kept.graph.initializer}     # at each open), and what
    assert not set(held) & set(rt.weights.named), sorted(set(held) & set(rt.weights.named))   # the optimizer folded
    assert sum(held.values()) < 2**16, sorted(held.items(), key=lambda kv: -kv[1])[:5]        # is small constants


def test_a_damaged_or_unwritable_cache_leaves_the_session_optimizing(runtimes, tmp_path):
    rt = runtimes["minilm"]
    graph = rt.graphs.path(stages=True)
    reference = outputs(rt, open_session(graph, PROVIDERS, 2))
    open_session(graph, PROVIDERS, 2, optimized=tmp_path)
    made = [p for p in tmp_path.iterdir() if p.suffix == ".onnx"]
    if DEVICE != "cpu":
        assert made == []
        return
    [onnx_file] = made
    open_session(graph.read_bytes(), PROVIDERS, 2, optimized=tmp_path)   # the same graph as bytes: the same saved
    assert [p for p in tmp_path.iterdir() if p.suffix == ".onnx"] == made  # form (a file's key is its sidecar's hash)
    good = onnx_file.read_bytes()
    onnx_file.write_bytes(good[:-100] + bytes(100))                 # bit rot: the checksum no longer matches
    for a, b in zip(outputs(rt, open_session(graph, PROVIDERS, 2, optimized=tmp_path)), reference):
        np.testing.assert_array_equal(a, b)
    assert onnx_file.read_bytes() == good                           # made again
    blocker = tmp_path / "a-file"                               # a folder under a file: nothing can be written
    blocker.write_text("not a folder")                          # there, whoever runs this (root too)
    for a, b in zip(outputs(rt, open_session(graph, PROVIDERS, 2, optimized=blocker / "sub")), reference):
        np.testing.assert_array_equal(a, b)
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]   # no temporary file left


def test_a_runtime_keeps_its_sessions_optimized_graphs_in_its_graph_cache(runtimes):
    rt = runtimes["minilm"]
    rt.session()
    rt.layerwise().session(rt.layerwise().needed()[0])
    assert (len([p for p in rt.graphs.folder.glob("optimized-*.onnx")]) > 0) == (DEVICE == "cpu")
