"""What a head does to the output (issue 22): the intervention mechanism, activation patching, attention knockout and
direct logit attribution, against transformers with hooks and against the NumPy reference (model/interventions.py).

transformers' references: the GGUF SmolLM2 (its own loader) and a GPT-2 checkpoint with wide random weights (peaked
attention, checked) built by tests/test_checkpoints.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from attnscope.analysis.effects import Metric
from attnscope.analysis.scores import induction_score, probe_ids
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model import interventions as reference
from attnscope.model.interventions import HOOKS, Edit, hook_name, knockout
from attnscope.model.masks import MASKED
from attnscope.runtime import Runtime
from attnscope.runtime.interventions import Interventions
from attnscope.runtime.patching import patch, path_patch
from attnscope.sources import resolve

from .conftest import CACHE
from .float32 import assert_within, float32_bound
from .test_checkpoints import build_checkpoint

IOI_CLEAN = "When Mary and John went to the store, John gave a drink to"
IOI_CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
GPT2_CLEAN, GPT2_CORRUPT = "the cat sat on the mat and the dog", "the cat sat on the hat and the dog"


# ---- fixtures ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(runtimes):
    return runtimes["smollm2"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A GPT-2 checkpoint (LayerNorm, biases everywhere, learned positions) served by us and read by transformers."""
    folder = build_checkpoint("gpt2", tmp_path_factory.mktemp("effects") / "gpt2")
    rt = Runtime(resolve(f"gpt2={folder}", cache=CACHE), cache_dir=CACHE)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                           dtype=torch.float32).eval()
    return rt, hf, folder


def _hf_parts(hf):
    """(layers' output projections, d_head, final norm, unembedding [V, D]) of a transformers Llama or GPT-2."""
    if hasattr(hf, "model"):
        return ([b.self_attn.o_proj for b in hf.model.layers], hf.config.head_dim, hf.model.norm,
                hf.lm_head.weight.detach().double().numpy())
    return ([b.attn.c_proj for b in hf.transformer.h], hf.config.n_embd // hf.config.n_head, hf.transformer.ln_f,
            hf.lm_head.weight.detach().double().numpy())


def _hf_logits(hf, ids, hooks=()):
    handles = [module.register_forward_pre_hook(fn) for module, fn in hooks]
    try:
        with torch.inference_mode():
            return hf(input_ids=torch.tensor(ids)).logits[:, -1].double().numpy()
    finally:
        for h in handles:
            h.remove()


def _o_inputs(hf, ids) -> list[torch.Tensor]:
    """Every layer's output-projection input [T, H * d_head] (the heads' outputs, concatenated) on one text."""
    projections, _, _, _ = _hf_parts(hf)
    seen = {}
    hooks = [(m, lambda module, args, i=i: seen.__setitem__(i, args[0][0].clone())) for i, m in enumerate(projections)]
    _hf_logits(hf, [ids], hooks)
    return [seen[i] for i in range(len(projections))]


def hf_patching(hf, clean_ids, corrupt_ids, metric: Metric, heads: int) -> np.ndarray:
    """Denoising head_output patching the transformers way: per layer, a batch of the corrupt text, row h with a
    forward pre-hook on the output projection writing head h's slice of the clean run's input. [L, H] metric."""
    projections, dh, _, _ = _hf_parts(hf)
    clean = _o_inputs(hf, clean_ids)
    out = []
    for layer, proj in enumerate(projections):
        def pre_hook(module, args, layer=layer):
            x = args[0].clone()
            for h in range(heads):
                x[h, :, h * dh:(h + 1) * dh] = clean[layer][:, h * dh:(h + 1) * dh]
            return (x,)
        out.append(metric(_hf_logits(hf, [corrupt_ids] * heads, [(proj, pre_hook)])))
    return np.array(out)


# ---- the mechanism -------------------------------------------------------------------------------------------------
def test_site_names_are_transformerlens_hook_points():
    assert hook_name("head_output", 3) == "blocks.3.attn.hook_z"
    assert hook_name("residual", 0) == "blocks.0.hook_resid_pre"
    assert {s: HOOKS[s].split(".")[-1] for s in ("query", "key", "value", "pattern", "masked")} == {
        "query": "hook_q", "key": "hook_k", "value": "hook_v", "pattern": "hook_pattern", "masked": "hook_attn_scores"}
    with pytest.raises(ValueError, match="unknown site"):
        Edit("mlp_out", 0, np.zeros(3, bool))


def _rows(trace, L: int, H: int) -> list[list[Edit]]:
    """Edits of every kind at two layers: a cached value for one head at some positions, zero, a mean, a knockout."""
    T, rows = trace.T, []
    for site in ("query", "key", "value", "pattern", "head_output"):
        for layer in (0, L - 1):
            where = np.zeros((H, T), bool)
            where[1, T // 2:] = True
            rows.append([Edit(site, layer, where, trace.sites[site][layer])])
    where = np.zeros((H, T), bool)
    where[0] = True
    rows.append([Edit("value", 1, where, 0.0), Edit("head_output", L - 1, where, trace.mean("head_output", L - 1))])
    resid = np.zeros(T, bool)
    resid[T - 3:] = True
    rows.append([Edit("residual", 1, resid, trace.sites["residual"][1])])
    rows.append(knockout(range(0, L), [T - 1, T - 2], [1, 2], H, T))
    return rows


@pytest.mark.parametrize("which", ["smollm2", "gpt2"])
def test_every_site_and_knockout_match_the_numpy_reference(which, smollm2, gpt2):
    """query/key/value/pattern/head_output/residual edits and knockout, through the served graphs from the first
    edited layer, equal the NumPy reference's forward pass with the same edits, on every row."""
    rt = smollm2 if which == "smollm2" else gpt2[0]
    clean, corrupt = (IOI_CLEAN, IOI_CORRUPT) if which == "smollm2" else (GPT2_CLEAN, GPT2_CORRUPT)
    a, b = rt.encode(clean), rt.encode(corrupt)
    assert len(a.ids) == len(b.ids)
    iv = Interventions(rt)
    source, base = iv.trace(a, pattern=True), iv.trace(b, pattern=True)
    if which == "gpt2":            # the random-weight reference only means something where attention is peaked
        assert base.sites["pattern"].max(axis=-1).mean() > 0.5
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    rows = _rows(source, L, H)
    ours = iv.run(base, rows)["logits"]
    ref = reference.forward(rt.model, np.array([b.ids] * len(rows)), rt.build_mask([len(b.ids)], True), rows)
    np.testing.assert_allclose(ours, ref.logits, atol=2e-4 if which == "smollm2" else 1e-4)
    moved = np.abs(ref.logits - base.logits).max(axis=1)
    assert (moved > 1e-3).sum() >= len(rows) - 3, moved      # the edits do something (a few may be tiny)


def test_knockout_over_every_layer_is_the_mask_itself(gpt2):
    """The reference's knockout (an edit of the scores) is the model's own forward pass with those cells masked."""
    rt, _, _ = gpt2
    enc = rt.encode(GPT2_CLEAN)
    T, L, H = len(enc.ids), rt.cfg.n_layers, rt.cfg.n_heads
    mask = rt.build_mask([T], True)
    edits = knockout(range(L), [T - 1], [0, 3], H, T)
    knocked = mask.copy()
    knocked[0, 0, T - 1, [0, 3]] = MASKED
    direct = rt.model(np.array([enc.ids]), attention_mask=knocked).next_token_logits
    np.testing.assert_allclose(reference.forward(rt.model, np.array([enc.ids]), mask, [edits]).logits, direct, atol=1e-4)
    served = Interventions(rt).run(Interventions(rt).trace(enc), [edits])["logits"]
    np.testing.assert_allclose(served, direct, atol=1e-4)


def test_prefix_reuse_gives_the_plain_runs_numbers(gpt2):
    """The same edits run from the reused prefix (in batches of one first layer, or all rows in one batch from the
    earliest edit: a GPU's way) and from the embeddings, row by row: float32 computations of one
    function (onnxruntime's kernels sum in an order that depends on the batch), within twice float32's bound of the
    logits (tests/float32.py, derived on transformers' float64 model; 1e-5 absolute, measured here, failed with
    OPENBLAS_CORETYPE=Prescott). The bound is the unedited runs' (clean and corrupt, the larger): an edit puts one
    run's values (or zero, or a mean) where the other's were, so the edited rows round values of the same sizes."""
    rt, hf, _ = gpt2
    iv = Interventions(rt)
    base = iv.trace(rt.encode(GPT2_CORRUPT))
    rows = _rows(iv.trace(rt.encode(GPT2_CLEAN), pattern=True), rt.cfg.n_layers, rt.cfg.n_heads)
    bound = np.maximum(*(float32_bound(hf, lambda o: o.logits[:, -1], input_ids=torch.tensor([rt.encode(t).ids]))[1]
                         for t in (GPT2_CORRUPT, GPT2_CLEAN)))
    assert bound.max() < 1e-2
    reused, plain = iv.run(base, rows)["logits"], iv.run(base, rows, reuse=False)["logits"]
    assert_within(reused, plain.astype(np.float64), np.broadcast_to(2 * bound, plain.shape), "reused vs plain")
    merged = Interventions(rt, batch=len(rows), merge=True).run(base, rows)["logits"]   # a GPU's: one batch of all
    assert_within(merged, plain.astype(np.float64), np.broadcast_to(2 * bound, plain.shape), "merged vs plain")


# ---- activation patching against transformers ----------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_head_output_patching_equals_transformers_o_proj_hooks(smollm2, hf_smollm2):
    rt = smollm2
    a, b = rt.encode(IOI_CLEAN), rt.encode(IOI_CORRUPT)
    metric = Metric(rt.vocabulary.token_id("␣Mary"), rt.vocabulary.token_id("␣John"))
    ours = patch(rt, a, b, metric)
    theirs = hf_patching(hf_smollm2, a.ids, b.ids, metric, rt.cfg.n_heads)
    np.testing.assert_allclose(ours.patched, theirs, atol=1e-4)
    assert ours.clean > 3 and ours.corrupt < -3           # the pair's metric really flips
    assert np.abs(ours.recovery).max() > 0.2


def test_gpt2_head_output_patching_equals_transformers_c_proj_hooks(gpt2):
    rt, hf, _ = gpt2
    a, b = rt.encode(GPT2_CLEAN), rt.encode(GPT2_CORRUPT)
    for metric in (Metric(int(a.ids[-1]), int(a.ids[1])), Metric(int(a.ids[2]))):   # a difference; a log-prob
        ours = patch(rt, a, b, metric)
        np.testing.assert_allclose(ours.patched, hf_patching(hf, a.ids, b.ids, metric, rt.cfg.n_heads), atol=1e-4)
        assert np.abs(ours.patched - ours.corrupt).max() > 1e-2


@pytest.mark.slow
def test_smollm2_induction_heads_recover_the_repeated_tokens(smollm2):
    """Random tokens repeated; the corrupt text's second copy is other random tokens. Patching head outputs into the
    corrupt run recovers the log-prob of the token the clean copy predicts mostly through induction heads: the
    strongest by the induction score ranks in the top 3 by recovery (on this pair: L18H6 first, L29H1, L23H2,
    L23H7, L17H5 next), and at least 2 of the top 5 score >= 0.5."""
    rt = smollm2
    special = set(rt.special_ids())
    probe = rt.forward([rt.encode_ids(probe_ids(rt.cfg.vocab_size, 50, special))])[0]
    score = induction_score(probe.attentions, 50, 0)                               # [L, H]
    rng = np.random.default_rng(1)
    pool = np.array([i for i in range(1000, 20000) if i not in special])
    R = rng.choice(pool, 10, replace=False)
    S = rng.choice(np.setdiff1d(pool, R), 10, replace=False)
    clean, corrupt = list(R) + list(R[:9]), list(R) + list(S[:9])
    p = patch(rt, rt.encode_ids(clean), rt.encode_ids(corrupt), Metric(int(R[9])))
    assert p.clean - p.corrupt > 5
    top = [divmod(int(i), rt.cfg.n_heads) for i in np.argsort(-p.recovery.ravel())[:5]]
    strongest = divmod(int(np.argmax(score)), rt.cfg.n_heads)
    assert strongest == (18, 6) and strongest in top[:3], top
    assert sum(score[l, h] >= 0.5 for l, h in top) >= 2, [(t, float(score[t])) for t in top]


# ---- path patching against transformers ----------------------------------------------------------------------------
def _input_columns(hf, layer: int, site: str, head: int):
    """The module whose output holds a receiver head's `site` input (query, key, value: before RoPE, which rotates
    both runs' values alike at each position), and the columns that are that head's: Llama's q_proj/k_proj/v_proj
    (key and value per key/value head: the head's group), GPT-2's c_attn (q | k | v)."""
    if hasattr(hf, "model"):
        attn, cfg = hf.model.layers[layer].self_attn, hf.config
        dh, group = cfg.head_dim, cfg.num_attention_heads // cfg.num_key_value_heads
        module = {"query": attn.q_proj, "key": attn.k_proj, "value": attn.v_proj}[site]
        j = head if site == "query" else head // group
        return module, slice(j * dh, (j + 1) * dh)
    D, dh = hf.config.n_embd, hf.config.n_embd // hf.config.n_head
    offset = {"query": 0, "key": D, "value": 2 * D}[site]
    return hf.transformer.h[layer].attn.c_attn, slice(offset + head * dh, offset + (head + 1) * dh)


def hf_path_patching(hf, clean_ids, corrupt_ids, metric: Metric, senders, receivers, site: str) -> float:
    """Path patching the transformers way (Wang et al. 2023): (2) the clean text with every head's o_proj input slice
    the clean run's but the senders', which are the corrupt run's (pre-hooks on each output projection), the
    receivers' input projections' outputs read by forward hooks; (3) the clean text with those columns written back,
    nothing else touched. Without receivers, (2)'s own metric."""
    projections, dh, _, _ = _hf_parts(hf)
    clean, corrupt = _o_inputs(hf, clean_ids), _o_inputs(hf, corrupt_ids)

    def freeze(module, args, layer):
        x = clean[layer].clone()
        for l, h in senders:
            if l == layer:
                x[:, h * dh:(h + 1) * dh] = corrupt[layer][:, h * dh:(h + 1) * dh]
        return (x[None],)
    frozen = [(p, lambda m, a, layer=i: freeze(m, a, layer)) for i, p in enumerate(projections)]
    if receivers is None:
        return float(metric(_hf_logits(hf, [clean_ids], frozen))[0])
    seen, handles = {}, []
    for l, h in receivers:
        module, cols = _input_columns(hf, l, site, h)
        handles.append(module.register_forward_hook(
            lambda m, a, out, key=(l, h), cols=cols: seen.__setitem__(key, out[..., cols].clone())))
    _hf_logits(hf, [clean_ids], frozen)
    for handle in handles:
        handle.remove()
    handles = []
    for l, h in receivers:
        module, cols = _input_columns(hf, l, site, h)

        def write(m, a, out, key=(l, h), cols=cols):
            out = out.clone()
            out[..., cols] = seen[key]
            return out
        handles.append(module.register_forward_hook(write))
    try:
        return float(metric(_hf_logits(hf, [clean_ids]))[0])
    finally:
        for handle in handles:
            handle.remove()


def test_gpt2_path_patching_equals_transformers_hooks(gpt2):
    """Senders in layer 0 into receivers' query, key and value in layer 1, and into the logits, each equal to
    transformers with hooks; each sender alone (the map) is the chosen-senders answer of that one head."""
    rt, hf, _ = gpt2
    a, b = rt.encode(GPT2_CLEAN), rt.encode(GPT2_CORRUPT)
    metric = Metric(int(a.ids[-1]), int(a.ids[1]))
    senders, receivers = [(0, 1), (0, 3)], [(1, 0), (1, 2)]
    for site in ("query", "key", "value"):
        ours = path_patch(rt, a, b, metric, senders=senders, receivers=receivers, receiver_input=site)
        theirs = hf_path_patching(hf, a.ids, b.ids, metric, senders, receivers, site)
        assert ours.patched == pytest.approx(theirs, abs=1e-4), site
        assert abs(ours.patched - ours.clean) > 1e-2, site               # the paths carry something
    ours = path_patch(rt, a, b, metric, senders=senders)
    assert ours.patched == pytest.approx(hf_path_patching(hf, a.ids, b.ids, metric, senders, None, ""), abs=1e-4)
    scan = path_patch(rt, a, b, metric, receivers=receivers, receiver_input="value")
    assert scan.patched.shape == (2, 4) and np.all(scan.patched[1] == pytest.approx(scan.clean, abs=1e-5))
    for h in range(4):                                                    # layer 1 has no path to layer 1's inputs
        one = hf_path_patching(hf, a.ids, b.ids, metric, [(0, h)], receivers, "value")
        assert scan.patched[0, h] == pytest.approx(one, abs=1e-4)


@pytest.mark.slow
def test_smollm2_path_patching_equals_transformers_hooks(smollm2, hf_smollm2):
    """IOI on SmolLM2: heads of layers 10-20 patched from the corrupt run (the other name first) into L23H3's query
    (the head DLA ranks first) and into the values of its key/value group (heads 3-5: transformers' v_proj holds the
    group's value), and into the logits; equal to transformers with hooks."""
    rt, hf = smollm2, hf_smollm2
    a, b = rt.encode(IOI_CLEAN), rt.encode(IOI_CORRUPT)
    metric = Metric(rt.vocabulary.token_id("␣Mary"), rt.vocabulary.token_id("␣John"))
    senders = [(l, h) for l in range(10, 21) for h in range(rt.cfg.n_heads)]
    for site, receivers in (("query", [(23, 3)]), ("value", [(23, 3), (23, 4), (23, 5)]), (None, None)):
        ours = path_patch(rt, a, b, metric, senders=senders, receivers=receivers, receiver_input=site or "query")
        theirs = hf_path_patching(hf, a.ids, b.ids, metric, senders, receivers, site)
        assert ours.patched == pytest.approx(theirs, abs=1e-4), site
        assert abs(ours.patched - ours.clean) > 1e-2, (site, ours.patched, ours.clean)   # 100x the agreement


# ---- direct logit attribution --------------------------------------------------------------------------------------
def hf_attribution(hf, ids, u: np.ndarray, position: int) -> np.ndarray:
    """Each head's direct share [L, H], independently: transformers' o_proj (c_proj) inputs through that head's
    columns, then the final norm with its scale frozen at the run's value, dotted with u."""
    projections, dh, norm, _ = _hf_parts(hf)
    z = _o_inputs(hf, ids)
    seen = {}
    handle = norm.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0][0, position].clone()))
    _hf_logits(hf, [ids])
    handle.remove()
    x = seen["x"].double().numpy()
    g = norm.weight.detach().double().numpy()
    layer_norm = getattr(norm, "bias", None) is not None
    if layer_norm:                                                   # GPT-2: (x - mean) / sqrt(var + eps) * g + b
        scale = g / np.sqrt(x.var() + norm.eps)
    else:                                                            # Llama: x / sqrt(mean(x^2) + eps) * g
        scale = g / np.sqrt(np.mean(x * x) + norm.variance_epsilon)
    out = []
    for layer, proj in enumerate(projections):
        W = (proj.weight.detach().double().numpy() if hasattr(proj, "in_features")
             else proj.weight.detach().double().numpy().T)                          # [D, H * dh] either way
        heads = []
        for h in range(W.shape[1] // dh):
            part = z[layer][position, h * dh:(h + 1) * dh].double().numpy() @ W[:, h * dh:(h + 1) * dh].T
            if layer_norm:
                part = part - part.mean()
            heads.append(float((part * scale) @ u))
        out.append(heads)
    return np.array(out)


@pytest.mark.parametrize("which", ["smollm2", "gpt2"])
def test_attribution_parts_sum_to_the_logit_and_match_transformers(which, request):
    if which == "smollm2":
        rt, hf = request.getfixturevalue("smollm2"), request.getfixturevalue("hf_smollm2")
        text, target, distractor = IOI_CLEAN, "␣Mary", "␣John"
    else:
        rt, hf, folder = request.getfixturevalue("gpt2")
        text, target, distractor = GPT2_CLEAN, None, None
    enc = rt.encode(text)
    if target is None:
        target, distractor = rt.token_string(enc.ids[3]), rt.token_string(enc.ids[1])
    with TestClient(create_app(Settings(models=[f"m={folder}" if which == "gpt2" else "smollm2"],
                                        cache=CACHE))) as c:
        model = "m" if which == "gpt2" else "smollm2"
        for position in (None, len(enc.ids) - 3):
            body = {"model": model, "text": text, "include": ["attribution"], "target": target,
                    "distractor": distractor} | ({"position": position} if position is not None else {})
            j = c.post("/api/attention", json=body).json()["attribution"]
            pos = len(enc.ids) - 1 if position is None else position
            assert j["position"] == pos and j["metric"] == "logit_difference"
            parts = (j["embeddings"] + np.sum(j["heads"]) + np.sum(j["mlps"]) + np.sum(j["attention_bias"])
                     + j["norm_bias"])
            assert parts == pytest.approx(j["sum"], abs=1e-9)
            W = _hf_parts(hf)[3]
            u = W[j["target"]["id"]] - W[j["distractor"]["id"]]
            with torch.inference_mode():
                logits = hf(input_ids=torch.tensor([enc.ids])).logits[0, pos].double().numpy()
            assert j["sum"] == pytest.approx(logits[j["target"]["id"]] - logits[j["distractor"]["id"]], abs=1e-4)
            assert j["logit"] == pytest.approx(j["sum"], abs=1e-4)
            np.testing.assert_allclose(j["heads"], hf_attribution(hf, enc.ids, u, pos), atol=1e-4)
            assert np.abs(j["heads"]).max() > 0.05


# ---- the API's refusals --------------------------------------------------------------------------------------------
def test_bad_effects_requests_get_clear_4xx():
    settings = Settings(models=["induction", "tiny-gpt"], cache=CACHE, max_patching_runs=50, max_patching_gflop=0.05)
    with TestClient(create_app(settings)) as c:
        ok = {"model": "induction", "clean": "a b c a b", "corrupt": "a b c d b", "target": "c"}
        r = c.post("/api/patching", json=ok)
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["hook"] == "blocks.{layer}.attn.hook_z" and np.shape(j["patched"]) == (2, 1)
        cases = [
            (ok | {"corrupt": "a b"}, "same token count: clean has"),
            (ok | {"target": "c d"}, "is not one token: it splits into 2"),
            (ok | {"model": "tiny-gpt"}, "has no LM head"),
            (ok | {"per_position": True, "clean": "a b c a b c a b c a b c a b c a b c a b c a b c a b c a b c",
                   "corrupt": "a b c a b c a b c a b c a b c a b c a b c a b c a b c a b d"}, "ATTNSCOPE_MAX_PATCHING_RUNS"),
            (ok | {"per_position": True}, "GFLOP (12 rows, each running the blocks from its own layer up over 6 "
                                          "tokens); the limit is 0.05 (ATTNSCOPE_MAX_PATCHING_GFLOP"),
            (ok | {"target": "c", "distractor": "c"}, "the same token"),
            (ok | {"site": "mlp"}, "site"),
        ]
        for body, says in cases:
            r = c.post("/api/patching", json=body)
            assert r.status_code == 422 and says in r.text, (body, r.text)
        r = c.post("/api/path_patching", json=ok | {"receivers": [[1, 0]], "receiver_input": "key"})
        assert r.status_code == 200 and np.shape(r.json()["patched"]) == (2, 1), r.text
        assert r.json()["hooks"] == {"senders": "blocks.{layer}.attn.hook_z", "receivers": "blocks.{layer}.attn.hook_k"}
        for body, says in [(ok | {"senders": [[5, 0]]}, "senders [[5, 0]] out of range"),
                           (ok | {"receivers": [[0, 3]]}, "receivers [[0, 3]] out of range"),
                           (ok | {"receivers": []}, "receivers: List should have at least 1 item"),
                           (ok | {"receiver_input": "pattern"}, "receiver_input"),
                           (ok | {"corrupt": "a b"}, "same token count"),
                           (ok | {"model": "tiny-gpt"}, "has no LM head")]:
            r = c.post("/api/path_patching", json=body)
            assert r.status_code == 422 and says in r.text, (body, r.text)
        knock = {"model": "induction", "text": "a b c a b", "queries": [3], "keys": [1]}
        r = c.post("/api/knockout", json=knock)
        assert r.status_code == 200 and r.json()["effect"]["next_tokens_after"], r.text
        for body, says in [(knock | {"queries": [0], "keys": [0]}, "would read no key"),
                           (knock | {"keys": [99]}, "out of range"),
                           (knock | {"layers": [1, 0]}, "first <= last"),
                           (knock | {"model": "tiny-gpt"}, "has no LM head")]:
            r = c.post("/api/knockout", json=body)
            assert r.status_code == 422 and says in r.text, (body, r.text)
        attn = {"model": "induction", "text": "a b c a b", "include": ["attribution"]}
        for body, says in [(attn, "needs `target`"), (attn | {"target": "c", "position": 40}, "out of range"),
                           (attn | {"target": "c", "ablate": [[0, 0]]}, "leave `ablate` out"),
                           (attn | {"model": "tiny-gpt", "target": "c"}, "has no LM head")]:
            r = c.post("/api/attention", json=body)
            assert r.status_code == 422 and says in r.text, (body, r.text)
        assert c.get("/healthz").status_code == 200
