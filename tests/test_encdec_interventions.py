"""Interventions on encoder-decoders (T5, BART), the same edits as the decoders' (model/interventions.py) at the same
named sites of the one block: knocking out a cross-attention head's cells, and patching a head's output (hook_z) of
the decoder's self-attention and of the cross-attention from another run. The served path (runtime/encdec.py, the
graph of runs with edits) and the NumPy reference (model/interventions.forward_encoder_decoder) each equal
transformers' own model with PyTorch hooks making the same edit, within 1e-4 on the logits and the attention
probabilities, with weights wide enough that attention is peaked (asserted): the tiny random checkpoints of
tests/test_encdec.py."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers

from attnscope.analysis.effects import Metric
from attnscope.model.interventions import Edit, forward_encoder_decoder, hook_name, knockout
from attnscope.runtime.encdec import EncoderDecoderInterventions, EncoderDecoderRuntime, knock_out, patch
from attnscope.sources.resolve import resolve
from tests.test_checkpoints import peaked
from tests.test_encdec import DECODER_TEXT, TEXT, build

torch.set_num_threads(2)
ATOL = 1e-4
FAMILIES = ("t5", "bart")
H, DH = 4, 16


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory):
    root = tmp_path_factory.mktemp("encdec_interventions")
    out = {}
    for family in FAMILIES:
        folder = build(family, root / family)
        rt = EncoderDecoderRuntime(resolve(f"{family}={folder}"), cache_dir=root / "cache")
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager",
                                                                   dtype=torch.float32).eval()
        out[family] = rt, model
    return out


def texts(rt):
    """The clean (source, decoder) encodings, and a corrupt pair of the same token counts: every token id moved one
    place along its text (the specials at the ends kept)."""
    enc, dec = rt.encode(TEXT), rt.encode_decoder(DECODER_TEXT)
    moved = lambda e, keep: replace(e, ids=e.ids[:keep] + list(np.roll(e.ids[keep:-1], 1)) + e.ids[-1:])  # noqa: E731
    return (enc, dec), (moved(enc, 0), moved(dec, 1))


def modules(model, family: str, layer: int, which: str):
    """transformers' attention module of decoder layer `layer` (which: "self" or "cross") and its output projection."""
    if family == "t5":
        a = model.decoder.block[layer].layer[0 if which == "self" else 1]
        a = a.SelfAttention if which == "self" else a.EncDecAttention
        return a, a.o
    a = model.model.decoder.layers[layer]
    a = a.self_attn if which == "self" else a.encoder_attn
    return a, a.out_proj


def theirs(model, enc, dec, hooks=()):
    """transformers' run of (enc, dec) with hooks [(module, pre-hook)] in place: (last logits [V], output)."""
    handles = [m.register_forward_pre_hook(f, with_kwargs=True) for m, f in hooks]
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([enc.ids]), decoder_input_ids=torch.tensor([dec.ids]),
                        output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return out.logits[0, -1].numpy(), out


def close(ours, want, what: str):
    want = np.asarray(want, np.float64)
    np.testing.assert_allclose(np.asarray(ours, np.float64), want, atol=ATOL * max(1.0, np.abs(want).max()), rtol=0,
                               err_msg=what)


@pytest.mark.parametrize("family", FAMILIES)
def test_knocking_out_a_cross_attention_head_matches_transformers(family, runtimes):
    """Decoder layer 1's cross-attention head 2 stops reading the 3 source positions it reads most from decoder
    positions 2, 3 and the last (whose logits are read):
    MASKED on those cells of its masked scores (transformers: the cells added to its attention mask by a pre-hook).
    The other heads, and the other layers, are left as they were."""
    rt, model = runtimes[family]
    (enc, dec), _ = texts(rt)
    S, T = len(enc.ids), len(dec.ids)
    layer, head, queries = 1, 2, [2, 3, T - 1]
    intact, base = theirs(model, enc, dec)
    keys = sorted(np.argsort(-base.cross_attentions[layer][0, head, queries].sum(0).numpy())[:3].tolist())
    cells = torch.zeros((1, H, T, S), dtype=torch.bool)
    cells[0, head, torch.tensor(queries)[:, None], torch.tensor(keys)[None, :]] = True
    key = "mask" if family == "t5" else "attention_mask"

    def knock(module, args, kwargs):
        m = kwargs.get(key)
        kwargs[key] = torch.where(cells, torch.finfo(torch.float32).min, 0.0 if m is None else m)
        return args, kwargs
    attn, _ = modules(model, family, layer, "cross")
    logits, out = theirs(model, enc, dec, [(attn, knock)])
    want = torch.stack(out.cross_attentions)[:, 0].numpy()                          # [L, H, T, S]
    assert peaked(want) >= 0.5, peaked(want)
    assert (want[layer, head][cells[0, head].numpy()] == 0).all()
    assert np.abs(logits - intact).max() > 1e-2                                      # the knockout changes the answer

    edits = knockout([layer], queries, keys, H, T, S, site="cross_masked", stack="decoder", only=[head])
    assert edits[0].hook == hook_name("cross_masked", layer, "decoder") == \
        "decoder.blocks.1.cross_attn.hook_attn_scores"
    iv = EncoderDecoderInterventions(rt)
    for engine in ("onnx", "numpy"):
        run = iv.run(enc, dec, [edits], engine=engine)
        close(run["next_token_logits"][0], logits, f"{engine}: logits")
        close(run["cross_attentions"][0], want, f"{engine}: cross-attention probabilities")
        close(run["decoder_attentions"][0], torch.stack(out.decoder_attentions)[:, 0].numpy(),
              f"{engine}: decoder self-attention probabilities")
    k = knock_out(rt, enc, dec, queries, keys, (layer, layer), attention="cross", heads=[head])
    close(k.after.next_token_logits, logits, "knock_out: after")
    close(k.before.next_token_logits, intact, "knock_out: before")
    logp = torch.log_softmax(out.logits[0].double(), -1).numpy()
    close(k.after.token_logprobs[1:], logp[np.arange(T - 1), dec.ids[1:]], "knock_out: token log-probs after")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("which", ["self", "cross"])
def test_patching_a_decoder_head_matches_transformers(family, which, runtimes):
    """The corrupt run with decoder layer `layer`'s head `head` output (hook_z, before the output projection) put in
    from the clean run, at every decoder position: of its self-attention (site head_output, stack decoder) or its
    cross-attention (cross_head_output). transformers: the clean head's slice of the output projection's input,
    caught by a pre-hook, written into the corrupt run's by another."""
    rt, model = runtimes[family]
    clean, corrupt = texts(rt)
    layer, head = (0, 1) if which == "self" else (1, 3)
    attn, o = modules(model, family, layer, which)
    kept = {}

    def keep(module, args, kwargs):
        kept["z"] = args[0][0, :, head * DH:(head + 1) * DH].clone()                # [T, dh]

    def put(module, args, kwargs):
        x = args[0].clone()
        x[0, :, head * DH:(head + 1) * DH] = kept["z"]
        return (x,) + args[1:], kwargs
    clean_logits, clean_out = theirs(model, *clean, [(o, keep)])
    corrupt_logits, _ = theirs(model, *corrupt)
    logits, out = theirs(model, *corrupt, [(o, put)])
    assert np.abs(logits - corrupt_logits).max() > 1e-3                              # the patch changes the answer
    for name in ("decoder_attentions", "cross_attentions"):
        assert peaked(torch.stack(getattr(clean_out, name))[:, 0].numpy()) >= 0.5

    iv = EncoderDecoderInterventions(rt)
    source = iv.trace(*clean)
    close(source.head_output["cross" if which == "cross" else "decoder"][layer, head], kept["z"].numpy(),
          "the clean run's head output (hook_z)")
    close(source.logits, clean_logits, "the clean run's logits")
    site = "cross_head_output" if which == "cross" else "head_output"
    z = source.head_output["cross" if which == "cross" else "decoder"][layer]        # [H, T, dh]
    where = np.zeros(z.shape[:2], bool)
    where[head] = True
    edit = Edit(site, layer, where, z, "decoder")
    assert edit.hook == f"decoder.blocks.{layer}.{'cross_attn' if which == 'cross' else 'attn'}.hook_z"
    for engine in ("onnx", "numpy"):
        run = iv.run(*corrupt, [[edit]], engine=engine)
        close(run["next_token_logits"][0], logits, f"{engine}: patched logits")
        close(run["cross_attentions"][0], torch.stack(out.cross_attentions)[:, 0].numpy(),
              f"{engine}: patched run's cross-attention probabilities")
    ref = forward_encoder_decoder(rt.model, np.array([corrupt[0].ids]), np.array([corrupt[1].ids]),
                                  rt.masks([len(corrupt[0].ids)], [len(corrupt[1].ids)]), [[edit]])
    close(ref.cache[("decoder", site, layer)][0, head], kept["z"].numpy(), "the reference's patched head")

    # the whole map: every (layer, head) of that attention patched in turn, one of them the row above
    metric = Metric(int(np.argmax(clean_logits)), int(np.argmax(corrupt_logits)))
    if metric.target == metric.distractor:
        metric = Metric(metric.target)
    p = patch(rt, clean, corrupt, metric, attention="cross" if which == "cross" else "decoder", batch=3)
    assert p.patched.shape == (2, H) and p.site == site and p.hook.format(layer=layer) == edit.hook
    close(p.patched[layer, head], metric(logits[None])[0], "patch(): the row's metric")
    close([p.clean, p.corrupt], [metric(clean_logits[None])[0], metric(corrupt_logits[None])[0]], "patch(): ends")


def test_patching_an_encoder_head_matches_the_reference(runtimes):
    """An encoder self-attention head's output patched (stack encoder): the served graph equals the NumPy reference
    and transformers with the same pre-hook on the encoder layer's output projection."""
    rt, model = runtimes["bart"]
    clean, corrupt = texts(rt)
    layer, head = 1, 0
    o = model.model.encoder.layers[layer].self_attn.out_proj
    kept = {}

    def keep(module, args, kwargs):
        kept["z"] = args[0][0, :, head * DH:(head + 1) * DH].clone()

    def put(module, args, kwargs):
        x = args[0].clone()
        x[0, :, head * DH:(head + 1) * DH] = kept["z"]
        return (x,) + args[1:], kwargs
    theirs(model, *clean, [(o, keep)])
    logits, out = theirs(model, *corrupt, [(o, put)])
    iv = EncoderDecoderInterventions(rt)
    z = iv.trace(*clean).head_output["encoder"][layer]
    where = np.zeros(z.shape[:2], bool)
    where[head] = True
    edit = Edit("head_output", layer, where, z, "encoder")
    assert edit.hook == "encoder.blocks.1.attn.hook_z"
    want = torch.stack(out.cross_attentions)[:, 0].numpy()
    assert peaked(want) >= 0.5
    for engine in ("onnx", "numpy"):
        run = iv.run(*corrupt, [[edit]], engine=engine)
        close(run["next_token_logits"][0], logits, f"{engine}: patched logits")
        close(run["cross_attentions"][0], want, f"{engine}: cross-attention probabilities")


def test_edits_the_served_graph_cannot_make_are_refused_by_name(runtimes):
    rt, _ = runtimes["bart"]
    (enc, dec), _ = texts(rt)
    iv = EncoderDecoderInterventions(rt)
    from attnscope.runtime.errors import InputError
    with pytest.raises(InputError, match="cross_query.*engine 'numpy'|edits masked"):
        iv.run(enc, dec, [[Edit("cross_query", 0, np.ones((H, len(dec.ids)), bool), 0.0, "decoder")]])
    with pytest.raises(InputError, match="names its stack"):
        iv.run(enc, dec, [[Edit("head_output", 0, np.ones((H, len(dec.ids)), bool))]])
    with pytest.raises(ValueError, match="decoder blocks"):
        Edit("cross_head_output", 0, np.ones((H, 3), bool), 0.0, "encoder")


# ---- the same through the API: /api/knockout and /api/patching take encoder-decoders ----------------------------------
@pytest.fixture(scope="module")
def served(runtimes, tmp_path_factory):
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    rt = runtimes["t5"][0]
    with TestClient(create_app(Settings(models=[f"t5={rt.spec.folder}"], default_model="t5",
                                        cache=tmp_path_factory.mktemp("served")))) as c:
        yield c


def test_the_api_knocks_out_a_cross_attention_head_as_the_runtime_does(runtimes, served):
    rt = runtimes["t5"][0]
    (enc, dec), _ = texts(rt)
    body = {"model": "t5", "text": TEXT, "decoder_text": DECODER_TEXT, "queries": [len(dec.ids) - 1],
            "keys": [1, 2], "layers": [0, 0], "heads": [1]}
    r = served.post("/api/knockout", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["attention"] == "cross" and got["heads"] == [1] and got["tokens"] == dec.tokens
    want = knock_out(rt, enc, dec, body["queries"], body["keys"], (0, 0), attention="cross", heads=[1])
    assert got["effect"]["kl"] > 0
    close([t["prob"] for t in got["effect"]["next_tokens_after"]], [t.prob for t in want.after.next_tokens],
          "the knocked-out prediction")
    refused = served.post("/api/knockout", json={**body, "keys": list(range(len(enc.ids)))})
    assert refused.status_code == 422 and "read no key" in refused.json()["detail"]
    assert served.post("/api/knockout", json={**body, "attention": "encoder", "queries": [99]}).status_code == 422


def test_the_api_patches_decoder_and_cross_attention_heads_as_the_runtime_does(runtimes, served):
    rt = runtimes["t5"][0]
    (enc, dec), (bad, _) = texts(rt)
    corrupt = rt.tokenizer.decode(bad.ids, skip_special_tokens=True)
    assert len(rt.encode(corrupt).ids) == len(enc.ids)      # the moved tokens read back to a text of one token count
    target = rt.token_string(int(np.argmax(runtimes["t5"][1](
        input_ids=torch.tensor([enc.ids]), decoder_input_ids=torch.tensor([dec.ids])).logits[0, -1].detach())))
    for attention in ("decoder", "cross"):
        r = served.post("/api/patching", json={"model": "t5", "clean": TEXT, "corrupt": corrupt, "target": target,
                                               "decoder_text": DECODER_TEXT, "attention": attention})
        assert r.status_code == 200, r.text
        got = r.json()
        want = patch(rt, (enc, dec), (rt.encode(corrupt), dec), Metric(rt.vocabulary.token_id(target, "target")),
                     attention=attention)
        assert got["attention"] == attention and got["hook"] == want.hook
        close(got["patched"], want.patched, f"patched {attention}")
        close([got["clean"], got["corrupt"]], [want.clean, want.corrupt], "the metric")
