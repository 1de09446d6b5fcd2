"""The README's curl examples, run as written against a real server, and each answer checked for what its request
asks.

The examples are read from README.md (every `curl` line of a ```bash block), so a new example is run and checked
without touching this file: by its endpoint's check (CHECKS), and an endpoint without one fails. Every POST operation
of the API must have an example. A check asserts values: what the request asked (layers, heads, positions, masks,
precision) against what came back, the answer's own invariants (rows that sum to 1, a score that is the sum of its
parts), and, where another endpoint computes the same number, that the two agree (QK attribution's probability is
/api/attention's weight at that cell, the lens' last row is the model's own prediction, a head's importance is the
effect of ablating it, patching's clean and corrupt metrics are the log-probability gaps of /api/attention).
"""
from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from attnscope.app.wire import BINARY, from_binary

README = Path(__file__).resolve().parents[1] / "README.md"
HOST = "http://127.0.0.1:8000"


# ---- the examples ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """One curl command of the README, as curl reads it."""
    command: str
    method: str
    path: str
    body: dict | None
    headers: dict[str, str]
    output: str | None           # -o FILE

    @property
    def model(self) -> str | None:
        return (self.body or {}).get("model")

    def __str__(self) -> str:
        return f"{self.method} {self.path} {json.dumps(self.body)[:60] if self.body else ''}"


def parse(command: str) -> Example:
    """curl's arguments: -X, -H, -d, -o and the URL; -s/-N/-f style switches take no value. Anything else is a
    curl option this parser does not know: teach it here rather than skip the example."""
    args = shlex.split(command, comments=True)          # a trailing "# ..." is a comment, as in bash
    assert args[0] == "curl", command
    method, headers, body, output, url = None, {}, None, None, None
    i = 1
    while i < len(args):
        a = args[i]
        if a == "-X":
            method, i = args[i + 1], i + 2
        elif a == "-H":
            name, value = args[i + 1].split(":", 1)
            headers[name.strip().lower()], i = value.strip(), i + 2
        elif a == "-d":
            body, i = json.loads(args[i + 1]), i + 2
        elif a == "-o":
            output, i = args[i + 1], i + 2
        elif a.startswith("http"):
            url, i = a, i + 1
        elif re.fullmatch(r"-[sNfS]+", a):
            i += 1
        else:
            raise AssertionError(f"the README's curl uses {a!r}, which tests/test_readme.py cannot read: {command}")
    assert url and url.startswith(HOST), command
    return Example(command, method or ("POST" if body is not None else "GET"), urlsplit(url).path, body, headers,
                   output)


def examples() -> list[Example]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    lines = [line.strip() for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    return [parse(line) for line in lines if line.startswith("curl ")]


# ---- the servers -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live_server_t5(tmp_path_factory):
    """A real uvicorn serving a tiny T5 folder as `t5`, as the README's encoder-decoder example has it."""
    from bench.common import server
    from tests.test_encdec import build

    folder = build("t5", tmp_path_factory.mktemp("readme") / "t5")
    with server({"ATTNSCOPE_MODELS": f"t5={folder}"}) as (url, _pid):
        yield url


@dataclass
class Api:
    """The server the example ran on, for the cross-checks' own requests."""
    url: str

    def post(self, path: str, body: dict) -> dict:
        r = httpx.post(self.url + path, json=body, timeout=120)
        assert r.status_code == 200, (path, body, r.text[:500])
        return r.json()

    def post_lines(self, path: str, body: dict) -> list[dict]:
        r = httpx.post(self.url + path, json=body, timeout=120)
        assert r.status_code == 200, (path, body, r.text[:500])
        return [json.loads(line) for line in r.text.splitlines()]

    def get(self, path: str):
        r = httpx.get(self.url + path, timeout=60)
        assert r.status_code == 200, (path, r.text[:500])
        return r.json()

    @cached_property
    def info(self) -> dict:
        return {m["id"]: m for m in self.get("/api/models")}


def run(ex: Example, url: str, folder: Path):
    """The command as written (curl, against `url`), and its answer decoded: JSON, NDJSON lines, the binary form or
    the file it wrote."""
    cmd = ex.command.replace(HOST, url).replace("curl ", "curl --fail-with-body ", 1)
    out = subprocess.run(["bash", "-c", cmd], cwd=folder, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stdout[-500:] + out.stderr[-500:]
    data = (folder / ex.output).read_bytes() if ex.output else out.stdout
    assert data, "the example printed and wrote nothing"
    if ex.output and ex.output.endswith(".onnx"):
        import onnx
        return onnx.load_from_string(data)
    if ex.headers.get("accept") == BINARY:
        return from_binary(data)
    if ex.path == "/api/generate":
        return [json.loads(line) for line in data.decode().splitlines()]
    return json.loads(data)


# ---- what each endpoint's answer must hold ---------------------------------------------------------------------------
def rounded(values, decimals: int) -> bool:
    return all(v == round(v, decimals) for v in np.asarray(values, np.float64).ravel() if np.isfinite(v))


def check_rows(p: np.ndarray, tolerance: float, causal: bool = False, mask_tokens=()) -> None:
    """Attention rows [.., T, T]: non-negative, summing to 1; causal: nothing on a future key; a masked key gets 0
    from every query but itself."""
    assert (p >= 0).all() and np.abs(p.sum(-1) - 1).max() <= tolerance, np.abs(p.sum(-1) - 1).max()
    T = p.shape[-1]
    if causal:
        assert (p[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    for m in mask_tokens:
        others = [q for q in range(T) if q != m]
        assert (p[..., others, m] == 0).all(), m


def check_models(ex, answer, api):
    ids = [m["id"] for m in answer]
    assert len(ids) == len(set(ids)) and set(ids) == set(api.get("/healthz")["models"])
    for m in answer:
        assert m["layers"] > 0 and m["heads"] > 0 and m["heads"] % m["kv_heads"] == 0 and m["d_head"] > 0, m
        assert m["kind"] in ("encoder", "decoder", "encoder-decoder") and m["max_tokens"] >= 2


def check_attention(ex, a, api):
    req = ex.body
    m = api.info[req.get("model", "minilm")]
    L, H, T = m["layers"], m["heads"], len(a["tokens"])
    layers, heads = req.get("layers", list(range(L))), req.get("heads", list(range(H)))
    assert (list(a["layers"]), list(a["heads"])) == (layers, heads)
    assert len(a["token_ids"]) == T and a["tokens"][-1] and T >= 3
    causal = req.get("causal", m["kind"] == "decoder")
    assert a["causal"] == causal and a["mask_tokens"] == sorted(req.get("mask_tokens", []))
    include = req.get("include", ["attention", "entropy", "summary"])
    binary = ex.headers.get("accept") == BINARY
    p = a.get("attention")
    assert (p is not None) == ("attention" in include)
    if p is not None:
        p = np.asarray(p, np.float64)
        if "resolution" in req:        # block means: a row of cells, each times its key block's width, sums to 1
            width = np.array([e - s for s, e in a["blocks"]])
            assert p.shape == (len(layers), len(heads), len(width), len(width)) and len(width) <= req["resolution"]
            assert width.sum() == T and np.abs((p * width).sum(-1) - 1).max() <= 1e-4
        else:
            assert p.shape == (len(layers), len(heads), T, T)
            if binary:
                assert a["attention"].dtype == np.dtype(req.get("dtype", "float32"))
            decimals = req.get("precision")
            tolerance = T * 0.5 * 10.0 ** -decimals if decimals else 2e-3 if binary else 1e-5
            check_rows(p, tolerance, causal, req.get("mask_tokens", []))
    if "precision" in req:
        assert rounded(a["attention"], req["precision"]) and rounded(a["entropy"], req["precision"])
    if "entropy" in include and p is not None and not ({"resolution", "precision"} & set(req) or binary):
        want = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(-1)
        assert np.abs(np.asarray(a["entropy"]) - want).max() <= 1e-4
    if "summary" in include:
        for name, values in a["summary"].items():
            assert np.asarray(values).shape == (len(layers), len(heads)), name
        assert ("cross_sentence_mass" in a["summary"]) == ("text_pair" in req)
    if "text_pair" in req:
        assert set(a["segments"]) == {-1, 0, 1} and a["tokens"].count("[SEP]") == 2
    if "predictions" in include:
        probs = [t["prob"] for t in a["next_tokens"]]
        assert len(probs) == 10 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert a["token_logprobs"][0] is None and all(lp <= 0 for lp in a["token_logprobs"][1:])
    if "scores" in include:
        for name, values in a["scores"].items():
            v = np.asarray(values)
            assert v.shape == (L, H) and (v >= -1e-6).all() and (v <= 1 + 1e-6).all(), name
    if "effect" in include and req.get("ablate"):
        assert a["ablate"] == req["ablate"] and a["effect"]["kl"] > 1e-3     # knocking them out changed something
        change = [c for c in a["effect"]["token_logprob_change"] if c is not None]
        assert math.isclose(a["effect"]["mean_logprob_change"], np.mean(change), abs_tol=1e-5)
    if "attribution" in include:
        at = a["attribution"]
        parts = np.sum(at["heads"]) + sum(at["mlps"]) + sum(at["attention_bias"]) + at["embeddings"] + at["norm_bias"]
        assert math.isclose(parts, at["sum"], abs_tol=1e-4 * max(1, abs(at["sum"])))
        assert math.isclose(at["sum"], at["logit"], abs_tol=1e-3 * max(1, abs(at["logit"])))
        assert at["position"] == T - 1 and at["target"]["token"] == req["target"]
        # the logit difference is the log-probability difference: /api/attention's predictions say the same
        preds = api.post("/api/attention", {"model": m["id"], "text": req["text"], "include": ["predictions"],
                                            "layers": [0], "heads": [0]})["next_tokens"]
        prob = {t["token"]: t["prob"] for t in preds}
        if req.get("distractor") and req["target"] in prob and req["distractor"] in prob:
            assert math.isclose(at["logit"], math.log(prob[req["target"]] / prob[req["distractor"]]), abs_tol=1e-3)
    if m["kind"] == "encoder-decoder":
        assert a["decoder_tokens"] and np.asarray(a["cross_attention"]).shape[-1] == T


def check_stages(ex, s, api):
    req = ex.body
    assert (s["layer"], s["head"]) == (req["layer"], req["head"])
    q, k, v = (np.asarray(s[n], np.float64) for n in "qkv")
    scores, probs = np.asarray(s["scores"], np.float64), np.asarray(s["probs"], np.float64)
    scale = max(1.0, np.abs(scores).max())
    assert np.abs(scores - q @ k.T).max() <= 1e-4 * scale
    assert np.abs(np.asarray(s["scaled"]) - scores * s["scale"]).max() <= 1e-4 * scale
    masked = np.asarray(s["masked"], np.float64)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    assert np.abs(e / e.sum(-1, keepdims=True) - probs).max() <= 1e-6
    assert np.abs(np.asarray(s["ctx"]) - probs @ v).max() <= 1e-4 * max(1.0, np.abs(v).max())
    check_rows(probs, 1e-5, s["causal"])
    # the same head as /api/attention's (NumPy's steps and the served graph agree far closer: tests/test_stages.py
    # and tests/test_encdec.py hold that with float32's derived bound; this only says it is the same head)
    if "decoder_text" in req:              # cross-attention: queries from the decoder, keys from the encoder
        a = api.post("/api/attention", {k: req[k] for k in ("model", "text", "decoder_text")} |
                     {"layers": [req["layer"]], "heads": [req["head"]]})
        assert s["query_tokens"] == a["decoder_tokens"] and s["key_tokens"] == a["tokens"]
        assert np.abs(probs - np.asarray(a["cross_attention"][0][0])).max() <= 1e-3
    else:
        a = api.post("/api/attention", {"model": req["model"], "text": req["text"], "layers": [req["layer"]],
                                        "heads": [req["head"]]})
        assert s["tokens"] == a["tokens"] and np.abs(probs - np.asarray(a["attention"][0][0])).max() <= 1e-3


def check_importance(ex, a, api):
    req = ex.body
    m = api.info[req["model"]]
    imp = np.asarray(a["importance"])
    assert imp.shape == (m["layers"], m["heads"]) and np.abs(imp).max() > 0
    # a head's importance is what ablating that head alone does: to the text's mean token log-prob (an LM head), or
    # to the sentence embedding (1 - its cosine with the intact one)
    layer, head = np.unravel_index(np.abs(imp).argmax(), imp.shape)
    one = api.post("/api/attention", {"model": req["model"], "text": req["text"], "ablate": [[int(layer), int(head)]],
                                      "include": ["effect"]})["effect"]
    want = one["mean_logprob_change"] if a["measure"] == "mean_logprob_change" else 1 - one["cosine"]
    assert math.isclose(want, imp[layer, head], abs_tol=1e-4)


def check_patching(ex, a, api):
    req = ex.body
    m = api.info[req["model"]]
    patched = np.asarray(a["patched"], np.float64)
    assert patched.shape == (m["layers"], m["heads"]) and a["clean_tokens"] != a["corrupt_tokens"]
    assert np.allclose(np.asarray(a["recovery"]), (patched - a["corrupt"]) / (a["clean"] - a["corrupt"]), atol=1e-5)
    assert a["clean"] > 0 > a["corrupt"]          # the clean text favours the target, the corrupt one the distractor
    # the metric, logit(target) - logit(distractor), is the gap of their log-probabilities: /api/attention's too
    checked = 0
    for name in ("clean", "corrupt"):
        preds = api.post("/api/attention", {"model": req["model"], "text": req[name], "include": ["predictions"],
                                            "layers": [0], "heads": [0]})["next_tokens"]
        prob = {t["token"]: t["prob"] for t in preds}
        if req["target"] in prob and req["distractor"] in prob:          # both among the top 10
            assert math.isclose(a[name], math.log(prob[req["target"]] / prob[req["distractor"]]), abs_tol=1e-3)
            checked += 1
    assert checked, "neither text has target and distractor among its top 10: choose an example that does"
    assert np.nanmax(np.asarray(a["recovery"])) > 0.1                # some head carries what makes the clean answer


def check_knockout(ex, a, api):
    req = ex.body
    m = api.info[req["model"]]
    assert (a["queries"], a["keys"]) == (req["queries"], req["keys"]) and a["layers"] == [0, m["layers"] - 1]
    before = [t["prob"] for t in a["effect"]["next_tokens_before"]]
    after = [t["prob"] for t in a["effect"]["next_tokens_after"]]
    assert before == sorted(before, reverse=True) and after == sorted(after, reverse=True) and before != after
    preds = api.post("/api/attention", {"model": req["model"], "text": req["text"], "include": ["predictions"],
                                        "layers": [0], "heads": [0]})["next_tokens"]
    assert [t["id"] for t in preds] == [t["id"] for t in a["effect"]["next_tokens_before"]]


def check_retrieval(ex, a, api):
    req = ex.body
    m = api.info[req["model"]]
    scores = np.asarray(a["scores"])
    assert scores.shape == (m["layers"], m["heads"]) and a["depths"] == req["depths"]
    assert a["haystack_tokens"] == req["tokens"] and len(a["controls"]) == req["controls"]
    top = [(t["layer"], t["head"]) for t in a["top_heads"]]
    assert [t["score"] for t in a["top_heads"]] == sorted(scores.ravel(), reverse=True)[:len(top)] and top
    k = a["knocked_out"]["probability"]
    assert k < a["control_probability"] and k < a["probability"]        # the top heads carry the retrieval
    # the top head's score is its attention rows' argmax on the needle's copy of each answer token (/api/attention)
    (p,) = a["probes"]
    (l, h) = top[0]
    b = api.post("/api/attention", {"model": req["model"], "text": p["text"], "layers": [l], "heads": [h]})
    keys = np.asarray(b["attention"])[0, 0][np.asarray(p["answer"]) - 1].argmax(-1)
    ids, (n0, n1) = np.asarray(b["token_ids"]), p["needle"]
    assert math.isclose(((keys >= n0) & (keys < n1) & (ids[keys] == ids[p["answer"]])).mean(), scores[l, h])


def check_path_patching(ex, a, api):
    """Each head alone as the sender to L23H3's query: a [layer][head] map; a head at or above the receiver's layer has
    no path (the clean metric), and some head below it carries the corruption."""
    req = ex.body
    m = api.info[req["model"]]
    patched = np.asarray(a["patched"], np.float64)
    assert patched.shape == (m["layers"], m["heads"]) and a["senders"] is None and a["receivers"] == [[23, 3]]
    assert a["hooks"] == {"senders": "blocks.{layer}.attn.hook_z", "receivers": "blocks.{layer}.attn.hook_q"}
    assert np.allclose(np.asarray(a["recovery"]), (patched - a["corrupt"]) / (a["clean"] - a["corrupt"]), atol=1e-5)
    assert a["clean"] > 0 > a["corrupt"]
    assert np.allclose(patched[23:], a["clean"], atol=1e-4)
    assert np.abs(patched[:23] - a["clean"]).max() > 0.05


def check_qk(ex, a, api):
    req = ex.body
    assert [a[k] for k in ("layer", "head", "query", "key")] == [req[k] for k in ("layer", "head", "query", "key")]
    assert len(a["top"]) == req.get("top", 12) and a["visible"] is True and 0 < a["explained"] <= 1
    values = [abs(t["value"]) for t in a["top"]]
    assert values == sorted(values, reverse=True)
    scale = max(1.0, sum(abs(v) for v in a["query_sums"]))
    assert math.isclose(sum(a["query_sums"]), a["score"], abs_tol=1e-6 * scale)
    assert math.isclose(sum(a["key_sums"]), a["score"], abs_tol=1e-6 * scale)
    assert math.isclose(a["score"], a["scaled"], abs_tol=1e-5 * scale)
    # the probability at the cell is the head's attention weight there, as /api/attention gives it
    att = api.post("/api/attention", {"model": req["model"], "text": req["text"], "layers": [req["layer"]],
                                      "heads": [req["head"]]})
    assert att["tokens"] == a["tokens"]
    assert math.isclose(a["probability"], att["attention"][0][0][req["query"]][req["key"]], abs_tol=1e-5)


def check_lens(ex, a, api):
    req = ex.body
    m = api.info[req["model"]]
    k, T = req.get("top", 5), len(a["tokens"])
    assert a["rows"] == ["embed"] + [f"L{i}" for i in range(m["layers"])]
    probs = np.asarray(a["top_probs"])
    assert probs.shape == (m["layers"] + 1, T, k) and (np.diff(probs, axis=-1) <= 0).all() and (probs <= 1).all()
    # the last row is the model's own prediction: /api/attention's next tokens
    preds = api.post("/api/attention", {"model": req["model"], "text": req["text"], "include": ["predictions"],
                                        "layers": [0], "heads": [0]})["next_tokens"]
    assert a["top_ids"][-1][-1] == [t["id"] for t in preds[:k]]
    assert np.allclose(a["top_probs"][-1][-1], [t["prob"] for t in preds[:k]], atol=1e-3)   # the same softmax
    if "head_lens" in req:
        hl = a["head_lens"]
        assert [hl["layer"], hl["head"]] == req["head_lens"] and np.asarray(hl["promoted_ids"]).shape == (T, k)
        assert (np.diff(hl["promoted_logits"], axis=-1) <= 0).all() and (np.diff(hl["suppressed_logits"], axis=-1) >= 0).all()


def check_circuits(ex, a, api):
    m = api.info[ex.body["model"]]
    L, H = m["layers"], m["heads"]
    layer = np.repeat(np.arange(L), H)
    for mode in "qkv":
        c = np.asarray(a[f"composition_{mode}"])
        assert c.shape == (L * H, L * H) and (c >= 0).all() and (c <= 1 + 1e-6).all(), mode
        assert (c[layer[:, None] >= layer[None, :]] == 0).all(), mode   # a reader in a later layer only
    if m["unembedding"]:
        ov = np.asarray(a["ov_copying"], np.float64)
        assert ov.shape == (L, H) and (np.abs(ov[np.isfinite(ov)]) <= 1 + 1e-9).all()
    if [(r["layer"], r["head"], r["role"]) for r in m["head_roles"]] == [(0, 0, "previous-token"),
                                                                        (1, 0, "induction")]:
        k, q, v = (a[f"composition_{mode}"][0][1] for mode in "kqv")      # the induction circuit: K-composition
        assert k > 10 * max(q, v), (q, k, v)


def check_generate(ex, lines, api):
    req = ex.body
    *tokens, last = lines
    done = last["done"]
    assert len(tokens) == len(done["ids"]) <= req.get("max_new_tokens", 32)
    assert [t["token"]["id"] for t in tokens] == done["ids"]
    assert done["ablate"] == (req.get("interventions") or {}).get("ablate", [])
    for t in (t["token"] for t in tokens):
        assert 0 < t["probability"] <= 1
        if req.get("greedy"):          # the most probable candidate, every step
            assert t["id"] == max(t["candidates"], key=lambda c: c["probability"])["id"]
    assert done["sequence"].startswith(req["text"]) and done["stop_reason"] in ("max_new_tokens", "eos")


def check_kv_compare(ex, a, api):
    """Rows: the full cache, then each policy at each budget; the full row is plain greedy generation's
    probabilities, and every row's summaries are its per-step values'."""
    req = ex.body
    assert [(r["policy"], r["budget"]) for r in a["rows"]] == [("full", None)] + [
        (p, b) for p in req.get("policies", ["streaming", "h2o", "snapkv"]) for b in sorted(set(req["budgets"]))]
    lines = api.post_lines("/api/generate", {"model": req["model"], "text": req["text"], "greedy": True,
                                             "max_new_tokens": req["max_new_tokens"]})
    assert [t["token"]["token"] for t in lines[:-1]] == a["answer_tokens"]
    assert [t["token"]["probability"] for t in lines[:-1]] == a["rows"][0]["probabilities"]
    for r in a["rows"]:
        assert np.isclose(r["answer_probability"], np.prod(r["probabilities"]), rtol=1e-9, atol=0)
        assert r["kl_max"] == max(r["kl"]) and np.isclose(r["kl_mean"], np.mean(r["kl"]))
        assert r["top1_agreement"] == np.mean(r["top1"]) and all(0 <= p <= 1 for p in r["probabilities"])
    full = a["rows"][0]
    assert all(full["top1"]) and full["kl_max"] == 0


def check_onnx(ex, model, api):
    import onnx
    onnx.checker.check_model(model)
    names = {i.name for i in model.graph.input}
    assert "input_ids" in names and "attention_mask" in names, names
    assert any(o.name == "attentions" for o in model.graph.output)


def check_health(ex, h, api):
    assert h["status"] == "ok" and h["models"] and h["running"] >= 0 and h["max_inflight"] >= 1


def check_job(ex, job, api):
    req = ex.body
    assert re.fullmatch(r"[0-9a-f]+", job["id"]) and job["model"] == req["model"] and job["kind"] == "atlas"
    assert job["state"] in ("queued", "running", "done") and job["progress"]["texts_total"] >= 1
    if req["corpus"] == "bundled":
        assert job["corpus"] == "bundled" and job["progress"]["texts_total"] == req["options"]["texts"]
    else:
        assert job["corpus"].startswith("upload:") and job["progress"]["texts_total"] == 1
    assert job["id"] in {j["id"] for j in api.get("/api/jobs")}


def check_job_cancel(ex, job, api):
    """The README's first job example, by the id its POST answers (the README writes ID: a job's id hashes what it
    computes, the exporter's source among it), cancelled: it stays listed, cancelled."""
    job_id = ex.path.split("/")[3]
    assert job["id"] == job_id and job["state"] in ("cancelled", "cancelling")
    assert api.get(f"/api/jobs/{job_id}")["state"] in ("cancelled", "cancelling")


def check_jobs(ex, jobs, api):
    assert isinstance(jobs, list) and all(j["state"] in ("queued", "running", "done", "cancelled", "failed",
                                                         "interrupted", "cancelling") for j in jobs)


CHECKS = {("GET", "/api/models"): check_models, ("POST", "/api/attention"): check_attention,
          ("POST", "/api/stages"): check_stages, ("POST", "/api/importance"): check_importance,
          ("POST", "/api/patching"): check_patching, ("POST", "/api/knockout"): check_knockout,
          ("POST", "/api/retrieval"): check_retrieval,
          ("POST", "/api/path_patching"): check_path_patching,
          ("POST", "/api/qk"): check_qk, ("POST", "/api/lens"): check_lens, ("POST", "/api/circuits"): check_circuits,
          ("POST", "/api/generate"): check_generate, ("POST", "/api/kv_compare"): check_kv_compare,
          ("GET", "/api/models/{id}/onnx"): check_onnx,
          ("GET", "/healthz"): check_health, ("POST", "/api/jobs"): check_job, ("GET", "/api/jobs"): check_jobs,
          ("POST", "/api/jobs/{job_id}/cancel"): check_job_cancel}


def route(ex: Example) -> tuple[str, str]:
    path = re.sub(r"^/api/models/[^/]+/onnx$", "/api/models/{id}/onnx", ex.path)
    return ex.method, re.sub(r"^/api/jobs/(ID|[0-9a-f]{16})/cancel$", "/api/jobs/{job_id}/cancel", path)


# ---- the tests -------------------------------------------------------------------------------------------------------
def test_every_post_operation_and_every_example_is_checked():
    """Each POST operation of the API has an example in the README, and each example's endpoint has a check."""
    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    paths = create_app(Settings(models=["tiny-gpt"])).openapi()["paths"]
    posts = {path for path, ops in paths.items() if "post" in ops}
    shown = {route(ex) for ex in examples()}
    assert {("POST", p) for p in posts} <= shown, sorted({("POST", p) for p in posts} - shown)
    assert shown <= set(CHECKS), sorted(shown - set(CHECKS))


@pytest.mark.parametrize("ex", examples(), ids=str)
def test_readme_curl_example(ex, request, tmp_path):
    # the suite's server serves the quick models; SmolLM2's examples go to the SmolLM2 server, T5's to a tiny T5's
    url = request.getfixturevalue({"smollm2": "live_server_smollm2", "t5": "live_server_t5"}.get(ex.model,
                                                                                                   "live_server"))
    if route(ex) == ("POST", "/api/jobs/{job_id}/cancel"):       # ID: the README's first job's, as its POST answers
        first = next(e for e in examples() if route(e) == ("POST", "/api/jobs"))
        r = httpx.post(url + "/api/jobs", json=first.body, timeout=60)            # 202: started (or already known)
        assert r.status_code in (200, 202), r.text[:500]
        job_id = r.json()["id"]
        ex = parse(ex.command.replace("/api/jobs/ID/", f"/api/jobs/{job_id}/"))
    CHECKS[route(ex)](ex, run(ex, url, tmp_path), Api(url))


# ---- the Python snippets: "From Python and Jupyter", "For agents (MCP)" ------------------------------------------------
def python_blocks(section: str) -> list[str]:
    """The ```python blocks of a README section (up to the next ## heading), as written."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def test_readme_python_and_jupyter(local_smollm2, live_server_smollm2):
    """The section's two blocks run as written, one after the other: in this process (attnscope.load's SmolLM2 is the
    suite's in-process Model: no second load), then against the suite's SmolLM2 server; what they say they give,
    they give."""
    import attnscope

    local, remote = python_blocks("From Python and Jupyter")
    original = attnscope.load
    ns: dict = {}
    try:
        attnscope.load = lambda model_id, **kw: {"smollm2": local_smollm2}[model_id]
        exec(compile(local, "README.md", "exec"), ns)
        exec(compile(remote.replace(HOST, live_server_smollm2), "README.md", "exec"), ns)
    finally:
        attnscope.load = original
    assert (23, 3) in [(l, h) for l, h, _ in ns["top"]]                     # "L23H3 among them"
    assert ns["recovery"].dims == ("layer", "head") and ns["recovery"].shape == (30, 9)
    path = ns["path"]                                                       # two senders together: one number
    assert np.ndim(path.patched) == 0 and path.receivers == [[23, 3]] and path.patched != path.clean
    assert ns["a"].to_xarray()["attention"].dims == ("layer", "head", "query", "key")
    assert list(ns["cells"].columns) == ["layer", "head", "query", "key", "attention"] and len(ns["cells"]) == 14 * 14
    assert ns["why"].tokens[13] == "␣to" and ns["why"].tokens[9] == "␣John" and ns["why"].probability > 0.5
    assert ns["lens"].top_tokens[-1][-1][0] == "␣Mary"                     # the last row: the model's prediction
    assert len(ns["words"]) == 5
    assert ns["view"].state["view"] == "head" and (ns["view"].state["layer"], ns["view"].state["head"]) == (23, 3)
    assert 'class="attnscope-embed"' in ns["view"].html(plotly=False)
    assert set(ns["maps"].answers) == {"attention", "attribution", "patching"} and ns["maps"].state["corrupt"] == ns["corrupt"]
    assert ns["same"].data["attribution"] == ns["dla"].data["attribution"]   # the server's answer is the in-process one
    assert ns["atlas"].to_xarray()["induction_mass"].dims == ("layer", "head") and ns["atlas"].texts == 20
    ns["api"].close()


def test_readme_agents_mcp_snippet(live_server):
    """The MCP block, with `attnscope` the command of this interpreter (python -m attnscope) in this environment (the
    SDK passes a server only a few variables: the suite's ATTNSCOPE_CACHE and import path go along): its tools listed
    and its QK answer the REST API's."""
    import os
    import sys

    from .conftest import in_thread

    [block] = python_blocks("For agents (MCP)")
    code = block.replace('command="attnscope", args=["mcp"', f'command={sys.executable!r}, env={dict(os.environ)!r}, '
                         'args=["-m", "attnscope", "mcp"')
    assert code != block
    ns: dict = {}
    in_thread(exec, compile(code, "README.md", "exec"), ns)
    assert "qk" in ns["tools"] and "path_patching" in ns["tools"]
    answer = ns["answer"]
    ref = httpx.post(f"{live_server}/api/qk", json={"model": "induction", "text": "Harry Potter met Ron Weasley at "
                     "school. Then Harry Potter", "layer": 1, "head": 0, "query": 11, "key": 3, "top": 3}).json()
    assert answer["score"] == pytest.approx(ref["score"], abs=1e-5) and len(answer["top"]) == 3
    names = [c["name"] for c in ref["components"]]
    assert [(t["query_component"], t["key_component"]) for t in answer["top"]] == [
        (names[t["query"]], names[t["key"]]) for t in ref["top"]]
