"""The models researchers study: random checkpoints of Llama 3.2 1B's and Llama 3.1 8B's exact published shapes
(bench/checkpoints.py: transformers' LlamaConfig, weights drawn wide enough that attention is peaked), served by path
through the app, against transformers eager in float32 on the same weights (a bfloat16 weight widened to float32 is
exact, so the bf16 folder and its widened float32 copy are the same model and must give the same answers).

l1b: 1.24B parameters, 2.5 GB in bfloat16, 4.9 GB in float32: no graph could hold it before weights left the graph
(protobuf stops at 2 GB). l8b's full 16 GB checkpoint is bench/big_models.py's; here its first two layers (the very
same weights: each tensor is drawn from a seed of its own name). Marked own_process: transformers' float32 copy of
l1b (5 GB) and ours are held at once.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope.app.wire import BINARY, from_binary
from bench.checkpoints import llama, text, widened

from .conftest import serving

pytestmark = [pytest.mark.own_process, pytest.mark.slow]
TOKENS = 512                                      # the attention parity's text, BOS included


def gone(folder: Path) -> None:
    """Each checkpoint here is GBs (l1b: 7.4 GB, both folders; l8b's first layers: 3.3 GB; the T5: 1.1 GB): deleted
    when its tests are done, not left for pytest's basetemp rotation, so the module never holds more than one model's
    files on a disk shared with everything else the run writes (one CI run failed with "No space left on device")."""
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def l8b_cut(tmp_path_factory) -> Iterator[Path]:
    """Llama 3.1 8B's shapes (4096 wide, 32 heads over 8 key/value heads of 128, 14336 MLP, untied 128256-token
    head), its first two layers: the same weights as the full checkpoint's."""
    root = tmp_path_factory.mktemp("l8b")
    yield llama(root / "l8b-2", "l8b", "bfloat16", layers=2)
    gone(root)


def test_l8b_first_layers_equal_transformers(l8b_cut):
    from transformers import LlamaForCausalLM

    with serving({"l8b-2": l8b_cut}) as c:
        a = c.post("/api/attention", json={"model": "l8b-2", "text": text(127), "include": ["attention"]},
                   headers={"Accept": BINARY})
        assert a.status_code == 200, a.text[:300]
        ours = from_binary(a.content)
    hf = LlamaForCausalLM.from_pretrained(l8b_cut, dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        ref = torch.stack(hf(torch.tensor([ours["token_ids"]]), output_attentions=True).attentions)[:, 0].numpy()
    assert ref.max(-1).mean() >= 0.5
    np.testing.assert_allclose(ours["attention"], ref, atol=1e-4, rtol=0)


@pytest.fixture
def t5_big(tmp_path_factory) -> Iterator[Path]:
    """A T5 (gated-gelu, relative position buckets, tied embeddings) over 2 GB in float32: tests/test_encdec.py's
    tiny T5 (d_model 64, weights drawn wide: peaked attention) with an 8.8M-token vocabulary (its shared embedding
    alone is 2.25 GB; the tokenizer uses the first ids), saved in bf16 (1.1 GB)."""
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.initialization import no_init_weights

    from .test_checkpoints import widen
    from .test_encdec import save_tokenizer

    root = tmp_path_factory.mktemp("t5big")
    folder = root / "t5"
    folder.mkdir()
    save_tokenizer("t5", folder)
    cfg = T5Config(vocab_size=8_800_000, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                   feed_forward_proj="gated-gelu", tie_word_embeddings=True, decoder_start_token_id=0, pad_token_id=0,
                   eos_token_id=1, relative_attention_num_buckets=8, relative_attention_max_distance=20)
    with no_init_weights():                            # widen() draws every weight: transformers' init (~40 s) skipped
        model = T5ForConditionalGeneration(cfg)
    model.tie_weights()                                # which that init also does: one shared embedding, not four
    widen(model, seed=0)
    model.to(torch.bfloat16).save_pretrained(folder)
    yield folder
    gone(root)


def test_an_encoder_decoder_over_2_gb_equals_transformers(t5_big):
    """The encoder-decoder graph, the last graph kind, on a model over 2 GB in float32: its three attentions and the
    next token equal transformers eager in float32 on the widened weights."""
    from .test_encdec import DECODER_TEXT, TEXT, reference

    with serving({"t5": t5_big}) as c:
        caps = c.get("/api/models").json()[0]["capabilities"]
        r = c.post("/api/attention", json={"model": "t5", "text": TEXT, "decoder_text": DECODER_TEXT,
                                           "include": ["attention", "predictions"]})
    assert r.status_code == 200, r.text[:300]
    assert caps["dtype"] == "bfloat16" and caps["parameters"] * 4 > 2 * 10**9
    r = r.json()
    src, tgt, out = reference(t5_big, TEXT, DECODER_TEXT)
    assert r["token_ids"] == src and r["decoder_token_ids"] == tgt
    for ours, theirs in ((r["attention"], out.encoder_attentions), (r["decoder_attention"], out.decoder_attentions),
                         (r["cross_attention"], out.cross_attentions)):
        theirs = torch.stack(theirs)[:, 0].numpy()
        assert theirs.max(-1).mean() >= 0.5
        np.testing.assert_allclose(np.asarray(ours, np.float32), theirs, atol=1e-4, rtol=0)
    p = torch.softmax(out.logits[0, -1].double(), -1).numpy()
    assert r["next_tokens"][0]["id"] == int(p.argmax())
    for t in r["next_tokens"]:
        assert abs(t["prob"] - p[t["id"]]) < 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("big")
    bf16 = llama(root / "l1b-bf16", "l1b", "bfloat16")
    yield {"l1b-bf16": bf16, "l1b-f32": widened(bf16, root / "l1b-f32")}
    gone(root)


@pytest.fixture(scope="module")
def client(folders):
    """The app serving both folders; a 512-token text's attention (537 MB for 16 x 32 heads) in one stacked run."""
    with serving(folders, layerwise_mb=1024) as c:
        yield c


@pytest.fixture(scope="module")
def hf(folders):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folders["l1b-f32"], dtype=torch.float32, attn_implementation="eager")


def answer(client, model: str, text: str) -> dict:
    """Every head's attention (binary form, 4 layers an answer within its cell limit: one run, cached) and the
    next tokens."""
    body = {"model": model, "text": text, "include": ["attention", "predictions"]}
    parts = []
    for first in range(0, 16, 4):
        r = client.post("/api/attention", json=body | {"layers": list(range(first, first + 4))},
                        headers={"Accept": BINARY})
        assert r.status_code == 200, r.text[:300]
        parts.append(from_binary(r.content))
    return {"token_ids": parts[0]["token_ids"], "next_tokens": parts[0]["next_tokens"],
            "attention": np.concatenate([p["attention"] for p in parts])}              # [16, 32, T, T]


@pytest.fixture(scope="module")
def reference(client, hf) -> dict:
    """transformers eager, float32, on the widened weights: a 512-token text's attention and next-token
    distribution (its published RoPE scaling: llama3, factor 32 from 8192)."""
    ids = client.post("/api/attention", json={"model": "l1b-bf16", "text": text(TOKENS - 1), "include": []}
                      ).json()["token_ids"]
    assert len(ids) == TOKENS
    with torch.inference_mode():
        out = hf(torch.tensor([ids]), output_attentions=True)
    return {"ids": ids, "attention": torch.stack(out.attentions)[:, 0].numpy(),
            "p": torch.softmax(out.logits[0, -1].double(), -1).numpy()}


def test_l1b_is_served_in_its_own_precision(client, folders):
    """The bf16 folder is served as bf16 (half the f32 bytes), the f32 one as f32; both whole (one run holds them)."""
    models = {m["id"]: m for m in client.get("/api/models").json()}
    bf16, f32 = models["l1b-bf16"]["capabilities"], models["l1b-f32"]["capabilities"]
    assert bf16["dtype"] == "bfloat16" and f32["dtype"] == "float32" and bf16["compute_dtype"] == "float32"
    assert bf16["parameters"] == f32["parameters"] == 1_235_814_400
    assert bf16["weights_bytes"] * 2 == f32["weights_bytes"]
    assert bf16["features"]["stacked"] and f32["features"]["stacked"]
    assert not bf16["features"]["importance"] and "ATTNSCOPE_WORK_TFLOP" in bf16["reasons"]["importance"]


def test_l1b_attention_and_next_token_equal_transformers(client, reference):
    """Every head's attention probabilities at 512 tokens and the next-token distribution, within 1e-4 of
    transformers eager (float32), on peaked rows; and the float32 folder gives the bf16 folder's numbers exactly
    (a bf16 weight widened to float32 is the float32 weight: the same arithmetic on the same numbers)."""
    ref = reference["attention"]
    assert ref.max(-1).mean() >= 0.5                                           # peaked: the comparison means something
    ours = {model: answer(client, model, text(TOKENS - 1)) for model in ("l1b-bf16", "l1b-f32")}
    for a in ours.values():
        assert a["token_ids"] == reference["ids"]
        np.testing.assert_allclose(a["attention"], ref, atol=1e-4, rtol=0)
        for t in a["next_tokens"]:
            assert abs(t["prob"] - reference["p"][t["id"]]) < 1e-4, t
        assert a["next_tokens"][0]["id"] == int(reference["p"].argmax())
    np.testing.assert_array_equal(ours["l1b-bf16"]["attention"], ours["l1b-f32"]["attention"])


def test_l1b_generates_what_transformers_generates(client, hf):
    """16 greedy tokens on the decoding graph (the key/value cache; weights bound at every step) equal
    transformers' greedy choice at every step: its logits over the prompt and our tokens, one forward (transformers'
    generate makes the same choices when each step's argmax is ours)."""
    prompt = text(24)
    r = client.post("/api/generate", json={"model": "l1b-f32", "text": prompt, "greedy": True, "max_new_tokens": 16})
    assert r.status_code == 200, r.text[:300]
    done = json.loads(r.text.splitlines()[-1])["done"]
    ids = client.post("/api/attention", json={"model": "l1b-f32", "text": prompt, "include": []}).json()["token_ids"]
    assert len(done["ids"]) == 16
    with torch.inference_mode():
        logits = hf(torch.tensor([ids + done["ids"]])).logits[0]
    steps = logits[len(ids) - 1:-1].double()                                   # [16, V]: each step's logits
    assert steps.argmax(-1).tolist() == done["ids"]
    top2 = steps.topk(2, -1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-4                      # no step decided by a near tie


def test_l1b_patching_qk_and_lens_work(client):
    """The analyses that read every layer's sites, through the layer graphs: patching the one position where two
    texts differ, at layer 0, recovers the clean metric (the runs are then the same), and patching any other position
    there changes nothing (the same token's embedding); QK attribution's table
    sums to the score the run computed; the lens' last row is the model's own next-token distribution. On the float32
    folder: the layer graphs widen a bf16 layer's weights at every call (bench/big_models.py), and these analyses
    call each layer many times (the layer graphs' bf16 path is the layer-by-layer test's)."""
    clean, corrupt = "a cat", "a bat"                             # one byte apart: one token
    r = client.post("/api/patching", json={"model": "l1b-f32", "clean": clean, "corrupt": corrupt, "site": "residual",
                                           "target": "m", "distractor": "h"})
    assert r.status_code == 200, r.text[:300]
    p = r.json()
    assert abs(p["clean"] - p["corrupt"]) > 1e-3
    [position] = [i + 1 for i, (a, b) in enumerate(zip(clean, corrupt)) if a != b]   # byte tokens, after the BOS
    np.testing.assert_allclose(p["patched"][0][position], p["clean"], atol=1e-4)
    same = [v for t, v in enumerate(p["patched"][0]) if t != position]    # the stream there is the same token's:
    np.testing.assert_allclose(same, p["corrupt"], atol=1e-4)                # patching it changes nothing
    q = client.post("/api/qk", json={"model": "l1b-f32", "text": clean, "layer": 5, "head": 7, "query": 5,
                                     "key": 2}).json()
    assert abs(q["score"] - q["scaled"]) < 1e-3 * max(1.0, abs(q["scaled"])), q
    lens = client.post("/api/lens", json={"model": "l1b-f32", "text": clean, "top": 3}).json()
    a = client.post("/api/attention", json={"model": "l1b-f32", "text": clean, "include": ["predictions"]}).json()
    assert lens["rows"][0] == "embed" and len(lens["rows"]) == 17
    assert lens["top_ids"][-1][-1][0] == a["next_tokens"][0]["id"]


def test_every_graph_kind_runs_a_model_over_2_gb(client):
    """l1b in float32 (4.9 GB: no graph can hold it) through each kind of graph the app builds for a decoder: the
    stacked graph (above), a graph cut after the first block, the teaching stages, the decoding step (above), and the
    layer graphs of a long text (a layer-by-layer run, ATTNSCOPE_LAYERWISE_MB) -- their answers agreeing."""
    body = {"model": "l1b-f32", "text": text(40)}
    whole = client.post("/api/attention", json=body | {"include": ["attention", "predictions"]}).json()
    cut = client.post("/api/attention", json=body | {"layers": [0], "include": ["attention"]}).json()
    np.testing.assert_array_equal(cut["attention"][0], whole["attention"][0])
    st = client.post("/api/stages", json=body | {"layer": 3, "head": 9}).json()
    np.testing.assert_allclose(st["probs"], whole["attention"][3][9], atol=1e-6)


def test_a_walk_widens_each_layer_into_the_memory_the_last_one_used(folders):
    """A bf16 model walked layer by layer widens each layer's weights (a Cast in the graph) into memory its sessions'
    arena hands on from one layer to the next (runtime/layerwise.Layerwise.session), a big model's too: a walk
    faults in about one layer's widened weights, not each layer's (Llama 3.1 8B's shape: 5.4 million page faults
    and 11 s of kernel time a request, before). Counted here: the process's minor page faults during a second
    request, against the pages of every layer's widened weights (l1b: 950,272; measured 829,321 faults without the
    layer sessions' arena, 180,497 with it: the arena given back at the end of the last walk, the activations)."""
    import resource

    from bench.checkpoints import SHAPES, tensors
    layer = [s for n, s in tensors(SHAPES["l1b"], layers=1).items() if ".layers.0." in n and len(s) == 2]
    walk_pages = SHAPES["l1b"]["num_hidden_layers"] * sum(4 * int(np.prod(s)) for s in layer) // resource.getpagesize()
    body = {"model": "l1b-bf16", "include": ["summary"]}
    with serving({"l1b-bf16": folders["l1b-bf16"]}, layerwise_mb=1) as c:
        assert c.post("/api/attention", json=body | {"text": text(40)}).status_code == 200    # sessions opened
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        r = c.post("/api/attention", json=body | {"text": text(41)})                       # a fresh text: a walk
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert r.status_code == 200, r.text[:300]
    assert faults < walk_pages / 3, f"{faults:,} page faults in a walk whose widened weights are {walk_pages:,} pages"


def test_l1b_layer_by_layer_equals_the_whole_graph(folders):
    """A run too big for the stacked graph (here: forced by a tiny ATTNSCOPE_LAYERWISE_MB) walks the layer graphs,
    which bind one layer's bf16 weights at a time and widen them in the graph: the float32 folder's whole run."""
    body = {"text": text(40), "layers": [2, 11], "include": ["attention"]}
    with serving({"l1b-bf16": folders["l1b-bf16"]}, layerwise_mb=1) as c:
        lw = c.post("/api/attention", json=body | {"model": "l1b-bf16"}).json()
    with serving({"l1b-f32": folders["l1b-f32"]}) as c:
        whole = c.post("/api/attention", json=body | {"model": "l1b-f32"}).json()
    np.testing.assert_allclose(lw["attention"], whole["attention"], atol=2e-6)
