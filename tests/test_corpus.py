"""model.corpus: corpus statistics equal a plain computation from the runtime's matrices; the engines agree;
bad input is skipped or refused with its line number; every input format; partial results and resuming."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from attnscope.analysis import statistics as stats
from attnscope.corpus import CorpusError
from attnscope.corpus.readers import Problem, read_corpus
from attnscope.corpus.sums import STATS, js_rows_of
from attnscope.corpus import run_corpus as _run_corpus

from .conftest import CACHE


def run_corpus(*args, **kw):
    """The job on the suite's graph cache (workers, Ray actors included)."""
    return _run_corpus(*args, cache_dir=CACHE, **kw)

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The cat sat on the mat.",
         "Hello, world! How are you today?",
         "A longer sentence; it has commas, a colon: and more words than the others do, so batches pad.",
         "hi",
         "Punctuation... everywhere!?! (really) -- yes.",
         "Attention heads look at [SEP] and the previous token.",
         "One more text, to make the chunks uneven.",
         "Last."]
ENGINE_RTOL = 1e-6


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(t + "\n" for t in lines))
    return path


def corpus(tmp_path, model="tiny-gpt", texts=TEXTS, **kw) -> dict:
    """run_corpus on a text file of `texts`, in this process unless told otherwise."""
    kw.setdefault("workers", 0)
    src = write_lines(tmp_path / f"in-{model}.txt", texts)
    return run_corpus(src, model, out=tmp_path / f"out-{model}-{kw.get('engine', 'local')}-{kw['workers']}.json",
                      progress=False, log=lambda msg: None, **kw)


def assert_same(a: dict, b: dict, rtol: float, atol: float = 1e-12) -> None:
    assert (a["texts"], a["tokens"]) == (b["texts"], b["tokens"])
    for name in STATS:
        np.testing.assert_allclose(a["stats"][name], b["stats"][name], rtol=rtol, atol=atol, err_msg=name)
    assert a["special_token_mass"].keys() == b["special_token_mass"].keys()
    for tok in a["special_token_mass"]:
        np.testing.assert_allclose(a["special_token_mass"][tok], b["special_token_mass"][tok], rtol=rtol, atol=atol)
    for name in ("js_divergence", "js_distance"):
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)


# ---- an independent computation, written plainly --------------------------------------------------
def plain_corpus_stats(rt, texts):
    """Per text (one at a time), per head, per query row: the corpus means by their definitions; JS by its KL form."""
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    keys = STATS
    sums = {k: np.zeros((L, H)) for k in keys}
    special, js = {}, np.zeros((L * H, L * H))
    rows = pairs = inductive = 0
    for text in texts:
        [r] = rt.run([text])
        ids = r.token_ids
        A = r.attentions.astype(np.float64)
        T = A.shape[-1]
        punct = [not sp and all(unicodedata.category(c).startswith("P") for c in tok)
                 for tok, sp in zip(r.tokens, r.encoding.special)]
        for l in range(L):
            for h in range(H):
                for i in range(T):
                    row = A[l, h, i]
                    sums["mean_entropy"][l, h] += -sum(p * math.log(p) for p in row if p > 0)
                    sums["first_token_mass"][l, h] += row[0]
                    sums["last_token_mass"][l, h] += row[T - 1]
                    sums["diagonal_mass"][l, h] += row[i]
                    sums["previous_token_mass"][l, h] += row[i - 1] if i >= 1 else 0.0
                    sums["next_token_mass"][l, h] += row[i + 1] if i + 1 < T else 0.0
                    sums["mean_distance"][l, h] += sum(row[j] * abs(i - j) for j in range(T))
                    sums["punctuation_mass"][l, h] += sum(row[j] for j in range(T) if punct[j])
                    d = sum(row[j] * abs(i - j) for j in range(T))
                    sums["distance_variance"][l, h] += sum(row[j] * (abs(i - j) - d) ** 2 for j in range(T))
                    sums["sink_mass"][l, h] += row[0] if i >= 1 else 0.0
                    targets = [j + 1 for j in range(i - 1) if ids[j] == ids[i]]
                    sums["induction_mass"][l, h] += sum(row[t] for t in set(targets) if row[t] >= 0.01)
                    for j, (tok, sp) in enumerate(zip(r.tokens, r.encoding.special)):
                        if sp:
                            special.setdefault(tok, np.zeros((L, H)))[l, h] += row[j]
        for i in range(T):                              # JS: 0.5 KL(a || m) + 0.5 KL(b || m), all head pairs at once
            P = A[:, :, i, :].reshape(L * H, T)
            a, b = P[:, None, :], P[None, :, :]
            m = (a + b) / 2
            kl = lambda x: np.where(x > 0, x * np.log(np.where(x > 0, x, 1) / np.where(m > 0, m, 1)), 0).sum(-1)
            js += 0.5 * kl(a) + 0.5 * kl(b)
        ids = r.token_ids
        rows, pairs = rows + T, pairs + T - 1
        inductive += sum(any(ids[j] == ids[i] for j in range(i - 1)) for i in range(T))
    count = {"previous_token_mass": pairs, "next_token_mass": pairs, "sink_mass": pairs, "induction_mass": inductive}
    stats_ = {k: v / count.get(k, rows) if count.get(k, rows) else v for k, v in sums.items()}
    return {"texts": len(texts), "tokens": rows, "stats": stats_,
            "special_token_mass": {k: v / rows for k, v in special.items()},
            "js_divergence": js / rows, "js_distance": np.sqrt(js / rows)}


@pytest.mark.parametrize("model", ["tiny-gpt", "minilm"])
def test_corpus_equals_a_plain_computation_from_the_runtime_matrices(tmp_path, runtimes, model):
    rt = runtimes[model]
    mean_row_max = np.mean([r.attentions.max(-1).mean() for r in rt.run(TEXTS)])
    assert mean_row_max >= 0.5, mean_row_max              # peaked attention: the comparison is not vacuous
    got = corpus(tmp_path, model, batch_size=1, js_rows=10_000)
    want = plain_corpus_stats(rt, TEXTS)
    assert_same(got, want, rtol=1e-6, atol=1e-9)
    assert got["layers"] == rt.cfg.n_layers and got["heads"] == rt.cfg.n_heads
    assert set(got["special_token_mass"]) == {"[CLS]", "[SEP]"}
    assert np.max(got["stats"]["punctuation_mass"]) > 0.05
    if model == "tiny-gpt":                                # causal: the next token is always masked
        assert np.all(np.array(got["stats"]["next_token_mass"]) == 0)
    else:
        assert np.max(got["stats"]["next_token_mass"]) > 0.1


def test_js_matches_scipy_and_is_a_symmetric_distance(tmp_path, runtimes):
    rt = runtimes["tiny-gpt"]
    got = corpus(tmp_path, texts=["The cat sat on the mat."], js_rows=10_000)
    [r] = rt.run(["The cat sat on the mat."])
    P = r.attentions.astype(np.float64).reshape(16, *r.attentions.shape[2:])
    for a, b in [(0, 1), (2, 9), (5, 15)]:
        by_scipy = np.mean([jensenshannon(P[a, i], P[b, i]) ** 2 for i in range(P.shape[1])])   # natural log
        assert got["js_divergence"][a][b] == pytest.approx(by_scipy, rel=1e-6)   # scipy renormalises the rows
    D = np.array(got["js_distance"])
    np.testing.assert_array_equal(D, D.T)
    assert np.all(np.diag(D) == 0) and np.all(D <= math.sqrt(math.log(2)) + 1e-12)
    i, j, k = np.meshgrid(*[range(16)] * 3, indexing="ij")
    assert np.all(D[i, k] <= D[i, j] + D[j, k] + 1e-12)                      # a metric: the triangle inequality
    hm = got["js_map"]                                                       # for the page: clustering and MDS
    assert sorted(hm["order"]) == list(range(16)) and len(hm["linkage"]) == 15 and np.shape(hm["mds"]) == (16, 2)
    X = np.array(hm["mds"])
    assert np.corrcoef(np.linalg.norm(X[:, None] - X[None], axis=-1)[np.triu_indices(16, 1)],
                       D[np.triu_indices(16, 1)])[0, 1] > 0.8                # the embedding keeps the distances
    off = corpus(tmp_path, texts=["The cat sat on the mat."], js_rows=0)
    assert off["js_divergence"] is None and off["js_map"] is None and off["js_rows"] == 0


@pytest.mark.parametrize("model", ["tiny-gpt", "minilm"])
def test_one_text_corpus_is_the_api_summary(tmp_path, runtimes, model):
    text = "Hello, world! The cat sat on the mat."
    got = corpus(tmp_path, model, texts=[text])
    [r] = runtimes[model].run([text])
    api = stats.head_stats(r.attentions)                                    # what /api/attention sends
    exact = stats.head_stats(r.attentions.astype(np.float64))
    for name in stats.HEAD_STATS:
        np.testing.assert_allclose(got["stats"][name], api[name], rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(got["stats"][name], exact[name], rtol=1e-12, atol=1e-15, err_msg=name)


def test_batching_and_chunking_change_nothing_but_rounding(tmp_path):
    one = corpus(tmp_path, batch_size=1, chunk_size=64)
    padded = corpus(tmp_path, batch_size=8, chunk_size=3)
    assert_same(one, padded, rtol=1e-5, atol=1e-8)


def test_js_rows_are_evenly_spaced_and_bounded():
    np.testing.assert_array_equal(js_rows_of(5, 64), np.arange(5))
    rows = js_rows_of(300, 64)
    assert len(rows) == 64 and rows[0] == 0 and rows[-1] == 299 and np.all(np.diff(rows) > 0)
    assert len(js_rows_of(10, 0)) == 0


# ---- engines ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """minilm on TEXTS in this process: what the engines must reproduce."""
    return corpus(tmp_path_factory.mktemp("ref"), "minilm", batch_size=4, chunk_size=3)


@pytest.mark.slow
def test_local_pool_agrees_with_one_process(tmp_path, reference):
    pool = corpus(tmp_path, "minilm", workers=2, batch_size=4, chunk_size=3)
    assert pool["run"]["workers"] == 2 and pool["run"]["threads_per_worker"] >= 1
    assert_same(pool, reference, rtol=ENGINE_RTOL)


def test_a_worker_runs_the_graph_cut_after_the_last_attention():
    """An atlas reads attentions alone: a worker's runs take the graph cut after the last block's attention (not that
    block's values and MLP, the final norm or the LM head: SmolLM2's 400-text atlas 38 -> 30 s), never the whole
    model's graph, and its sums are the whole graph's bit for bit."""
    from attnscope.corpus.engines import Chunk, ChunkWorker
    from attnscope.corpus.sums import Sums
    from attnscope.runtime import Runtime
    from attnscope.sources import get
    worker = ChunkWorker("tiny-gpt", batch_size=1, cache_dir=CACHE)
    sums, problems = worker(Chunk(0, "line", list(range(len(TEXTS))), TEXTS))
    L = worker.rt.cfg.n_layers
    assert problems == [] and worker.rt.open_depths() == [L]
    assert False not in worker.rt._sessions                                # the whole graph (key: stages False)
    whole = Runtime(get("tiny-gpt"), cache_dir=CACHE)                       # stop_early_mb 0: the whole graph
    want = Sums(L, worker.rt.cfg.n_heads)
    for text in sorted(TEXTS, key=len):                                    # the worker's order
        want.add(Sums.of_result(whole.run([text])[0]))
    got, expected = sums.result(), want.result()
    for name in expected["stats"]:
        np.testing.assert_array_equal(got["stats"][name], expected["stats"][name], err_msg=name)


@pytest.mark.slow
def test_ray_engine_on_a_local_cluster_agrees(tmp_path, reference, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)                     # start a local cluster, no mocks
    got = corpus(tmp_path, "minilm", engine="ray", workers=2, batch_size=4, chunk_size=3)
    assert got["run"]["engine"] == "ray" and got["run"]["workers"] == 2
    assert_same(got, reference, rtol=ENGINE_RTOL)


# ---- input formats ------------------------------------------------------------------------------
def write_all_formats(tmp_path, texts, column="text"):
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    table = pa.table({"id": list(range(len(texts))), column: texts})
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"id": i, column: t}) + "\n" for i, t in enumerate(texts)))
    pcsv.write_csv(table, tmp_path / "c.csv")
    pcsv.write_csv(table, tmp_path / "c.tsv", pcsv.WriteOptions(delimiter="\t"))
    pq.write_table(table, tmp_path / "c.parquet")
    return [tmp_path / f"c.{ext}" for ext in ("jsonl", "csv", "tsv", "parquet")]


def test_every_input_format_gives_the_same_numbers(tmp_path):
    want = corpus(tmp_path)
    for path in write_all_formats(tmp_path, TEXTS, column="body"):
        got = run_corpus(path, "tiny-gpt", column="body", workers=0, out=tmp_path / f"{path.name}.json",
                         progress=False, log=lambda m: None)
        assert_same(got, want, rtol=0, atol=0)
        assert got["input"]["format"] == {".jsonl": "jsonl", ".csv": "csv", ".tsv": "tsv"}.get(path.suffix, "parquet")


def test_parquet_output_holds_the_same_numbers(tmp_path):
    import pyarrow.parquet as pq
    src = write_lines(tmp_path / "in.txt", TEXTS)
    job = run_corpus(src, "tiny-gpt", workers=0, out=tmp_path / "out.parquet", progress=False, log=lambda m: None)
    t = pq.read_table(tmp_path / "out.parquet")
    rows = t.to_pylist()
    prev = {(r["layer"], r["head"]): r["value"] for r in rows if r["stat"] == "previous_token_mass"}
    assert prev[(2, 3)] == job["stats"]["previous_token_mass"][2][3]
    js = [r for r in rows if r["stat"] == "js_distance" and (r["layer"], r["head"], r["key_layer"], r["key_head"])
          == (0, 1, 3, 2)]
    assert js[0]["value"] == job["js_distance"][1][14]
    assert json.loads(t.schema.metadata[b"attnscope"])["texts"] == len(TEXTS)


# ---- bad input ----------------------------------------------------------------------------------
def skipped(job) -> dict[int, str]:
    return {next(v for k, v in p.items() if k != "reason"): p["reason"] for p in job["input"]["problems"]}


def test_bad_lines_are_skipped_with_their_line_numbers(tmp_path):
    src = tmp_path / "bad.txt"
    with open(src, "wb") as f:
        f.write(b"The cat sat on the mat.\n"                      # 1
                b"\n"                                               # 2 empty
                b"   \t \n"                                         # 3 blank
                b"caf\xc3\xa9 is fine\n"                            # 4
                b"bad \xc3\x28 byte\n"                              # 5 not UTF-8
                + b"x" * 10_000_000 + b"\n"                         # 6 a 10 MB line
                + b"y" * 20_001 + b"\n"                             # 7 over the character limit
                + b"Last line, no newline")                         # 8
    job = run_corpus(src, "tiny-gpt", workers=0, out=tmp_path / "bad.json", progress=False, log=lambda m: None)
    problems = skipped(job)
    assert sorted(problems) == [2, 3, 5, 6, 7]
    assert problems[2] == "empty" and problems[3] == "empty"
    assert problems[5].startswith("not valid UTF-8 (byte 0xc3 at byte 4)")
    assert problems[6].startswith("10,000,000 bytes, over the limit of 20,000 characters")
    assert problems[7].startswith("20,001 characters, over the limit")
    assert job["input"]["skipped_by_reason"] == {"empty": 2, "not valid UTF-8": 1, "over the character limit": 2}
    clean = corpus(tmp_path, texts=["The cat sat on the mat.", "café is fine", "Last line, no newline"])
    assert_same(job, clean, rtol=0, atol=0)


def test_bad_jsonl_records_are_skipped_and_a_missing_field_is_refused(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "The cat sat."}\n{"text": ""}\n{"text": null}\n{"text": 3}\n{broken\n[1]\n'
                   '{"body": "x"}\n{"text": "Fine, too."}\n')
    job = run_corpus(src, "tiny-gpt", workers=0, out=tmp_path / "j.json", progress=False, log=lambda m: None)
    assert job["texts"] == 2
    problems = skipped(job)
    assert problems == {2: "empty", 3: "'text' is null, not a string", 4: "'text' is int, not a string",
                        5: problems[5], 6: "no 'text' field (a JSON list, not an object)", 7: "no 'text' field"}
    assert problems[5].startswith("not valid JSON")
    with pytest.raises(CorpusError, match="no line of .* has a 'title' field; name the text field with --column"):
        run_corpus(src, "tiny-gpt", column="title", workers=0, out=tmp_path / "j2.json", progress=False,
                   log=lambda m: None)


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_a_missing_column_is_refused_naming_the_columns(tmp_path, ext):
    [path] = [p for p in write_all_formats(tmp_path, TEXTS, column="body") if p.suffix == f".{ext}"]
    with pytest.raises(CorpusError, match=r"has no column 'text' \(the default\); name the text column with "
                                          r"--column. Its columns: id, body"):
        read_corpus(path)
    with pytest.raises(CorpusError, match="has no column 'title'. Its columns: id, body"):
        read_corpus(path, column="title")


def test_bad_rows_of_csv_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": pa.array([b"ok.", b"\xff\xfe", None, b"", b"fine."], pa.binary())}),
                   tmp_path / "b.parquet")
    items = list(read_corpus(tmp_path / "b.parquet"))
    assert items[0] == (1, "ok.") and items[4] == (5, "fine.")
    assert [str(p) for p in items[1:4]] == ["row 2: not valid UTF-8 (byte 0xff at byte 0); skipped",
                                            "row 3: null; skipped", "row 4: empty; skipped"]
    (tmp_path / "m.csv").write_text('id,text\n1,"ok, fine"\n2,"multi\nline"\n3,a,b\n')
    with pytest.raises(CorpusError, match="not well-formed CSV at row 3: 3 fields where the header has 2"):
        list(read_corpus(tmp_path / "m.csv"))


def test_an_unclosed_quote_is_refused_naming_its_line(tmp_path):
    """A quote opened and never closed made the rest of the file one text, silently (issue 37); now refused, naming
    the line it opens on. Quoted fields that close (newlines, doubled quotes, a field of one quote) still read."""
    (tmp_path / "open.csv").write_text('id,text\n1,first\n2,"hello\n3,world\n4,and the rest\n')
    with pytest.raises(CorpusError, match=r"the quoted field that opens on line 3 \(row 2\) is never closed"):
        list(read_corpus(tmp_path / "open.csv"))
    (tmp_path / "open.tsv").write_text('text\n"never closed\n')
    with pytest.raises(CorpusError, match="opens on line 2"):
        list(read_corpus(tmp_path / "open.tsv"))
    (tmp_path / "ok.csv").write_text('text\nfirst\n"multi\nline"\n"x""y"\n""""')
    assert list(read_corpus(tmp_path / "ok.csv")) == [(1, "first"), (2, "multi\nline"), (3, 'x"y'), (4, '"')]


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "attnscope", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_cli_writes_the_result_and_reports_bad_input_without_a_traceback(tmp_path):
    src = write_lines(tmp_path / "in.txt", TEXTS[:3] + [""])
    out = cli("corpus", str(src), "--model", "tiny-gpt", "--out", str(tmp_path / "r.json"), "--workers", "0")
    assert out.returncode == 0, out.stderr
    assert "line 4: empty; skipped" in out.stderr and "text/s" in out.stderr        # the progress bar
    job = json.loads((tmp_path / "r.json").read_text())
    assert job["model"] == "tiny-gpt" and job["texts"] == 3 and len(job["stats"]["mean_entropy"]) == 4
    assert not (tmp_path / "r.json.partial.json").exists()
    [csv_path] = [p for p in write_all_formats(tmp_path, TEXTS, column="body") if p.suffix == ".csv"]
    for args, message in [((str(csv_path),), "has no column 'text'"),
                          ((str(tmp_path / "missing.txt"),), "missing.txt: no such file"),
                          ((str(src), "--model", "nope"), "unknown model 'nope'")]:
        out = cli("corpus", *args, "--out", str(tmp_path / "x.json"))
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


# ---- partial results ----------------------------------------------------------------------------
def test_a_crash_keeps_the_finished_chunks_and_the_same_command_resumes(tmp_path):
    src = write_lines(tmp_path / "in.txt", TEXTS)
    out = tmp_path / "r.json"
    whole = run_corpus(src, "tiny-gpt", workers=0, chunk_size=2, out=tmp_path / "whole.json", progress=False,
                       log=lambda m: None)
    seen = []

    def crash_after_two(chunk, sums):
        seen.append(chunk.index)
        saved = json.loads((tmp_path / "r.json.partial.json").read_text())   # written as the job goes
        assert saved["done"][0] == [0, 0] and saved["sums"]["texts"] >= 2
        if len(seen) == 2:
            raise KeyboardInterrupt                             # e.g. Ctrl-C, or the machine going away
    with pytest.raises(KeyboardInterrupt):
        run_corpus(src, "tiny-gpt", workers=0, chunk_size=2, out=out, progress=False, log=lambda m: None,
                   on_chunk=crash_after_two)
    saved = json.loads((tmp_path / "r.json.partial.json").read_text())
    assert saved["done"] == [[0, 1]] and saved["sums"]["texts"] == 4 and not out.exists()

    resumed = []
    job = run_corpus(src, "tiny-gpt", workers=0, chunk_size=2, out=out, progress=False, log=lambda m: None,
                     on_chunk=lambda chunk, sums: resumed.append(chunk.index))
    assert resumed == [2, 3]                                    # only what was left
    assert_same(job, whole, rtol=1e-12)
    assert out.exists() and not (tmp_path / "r.json.partial.json").exists()


def test_a_partial_file_of_another_job_is_refused_unless_restarted(tmp_path):
    src = write_lines(tmp_path / "in.txt", TEXTS)
    out = tmp_path / "r.json"
    (tmp_path / "r.json.partial.json").write_text(json.dumps({"job": {"model": "other"}, "done": [], "sums": {}}))
    with pytest.raises(CorpusError, match="partial results of a different job"):
        run_corpus(src, "tiny-gpt", workers=0, out=out, progress=False, log=lambda m: None)
    job = run_corpus(src, "tiny-gpt", workers=0, out=out, restart=True, progress=False, log=lambda m: None)
    assert job["texts"] == len(TEXTS)


def test_sample_is_a_seeded_subset(tmp_path):
    a = corpus(tmp_path, sample=3, seed=1)
    b = corpus(tmp_path, sample=3, seed=1)
    assert a["texts"] == 3 and a["input"]["sample"] == 3
    assert_same(a, b, rtol=0, atol=0)
    assert corpus(tmp_path, sample=100)["texts"] == len(TEXTS)


def test_problem_text():
    assert str(Problem("line", 7, "empty")) == "line 7: empty; skipped"
