"""The package's shape, held by tests: no import cycles (between modules, and between the folders that show the
architecture), numerics that read no environment variable and know nothing of the web, and each statistic defined
once (the registry's names are the page's list, and the API summary's and the corpus result's keys, each reporting
the statistics it can compute: the API's from the probabilities and a pair's segments, the corpus's from its texts'
tokens too)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "sources", "graphs", "runtime", "analysis", "corpus", "analyses", "app", "python")
NUMERICS = ("model", "sources", "graphs", "runtime", "analysis", "corpus")
# Each folder may import the ones before it in this order, never one after it (docs/ARCHITECTURE.md).
LAYERS = ("model", "analysis", "sources", "graphs", "runtime", "corpus", "analyses", "app", "python")
WEB = {"fastapi", "starlette", "uvicorn", "httptools", "pydantic_settings", "jinja2", "anyio"}


def modules() -> dict[str, Path]:
    """attnscope.<folder>.<module> -> its file, for every module of the package (the top-level __init__ too)."""
    found = {"attnscope": ROOT / "__init__.py", "attnscope.__main__": ROOT / "__main__.py"}
    for package in PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            name = f"attnscope.{package}" + ("" if path.stem == "__init__" else f".{path.stem}")
            found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (function-level imports count too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from . import x`: the module x where there is one, else the names of the package (its __init__)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known}
    return out - {name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, set(known)) for name, path in known.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else None


def test_the_import_graph_has_no_cycle():
    edges = graph()
    assert len(edges) > 40 and edges["attnscope.app.routers"]        # the walk found the package
    assert cycle(edges) is None, f"import cycle: {' -> '.join(cycle(edges))}"


def test_the_folders_import_each_other_in_one_direction():
    """model <- analysis <- sources <- graphs <- runtime <- corpus <- analyses <- app <- python: a folder imports only
    those before it."""
    edges = graph()
    wrong = sorted((a, b) for a, targets in edges.items() for b in targets
                   if folder(a) and folder(b) and LAYERS.index(folder(b)) > LAYERS.index(folder(a)))
    assert not wrong, f"imports against the layering: {wrong}"
    between = {(folder(a), folder(b)) for a, targets in edges.items() for b in targets
               if folder(a) and folder(b) and folder(a) != folder(b)}
    assert cycle({f: {b for a, b in between if a == f} for f in PACKAGES}) is None


def test_a_cycle_is_found_when_there_is_one():
    """The walker itself: a planted cycle through a function-level import is found."""
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    tree = ast.parse("def f():\n    from ..runtime import layerwise\n")
    assert isinstance(tree.body[0].body[0], ast.ImportFrom)        # what `imports` walks into


def test_the_numerics_read_no_environment_and_know_nothing_of_the_web():
    bad_env, bad_web = [], []
    for name, path in modules().items():
        if folder(name) not in NUMERICS:
            continue
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                bad_env.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "os" and \
                    any(a.name in ("environ", "getenv") for a in node.names):
                bad_env.append(f"{name}:{node.lineno}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                roots = [a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import) else \
                    [(node.module or "").split(".")[0]] if not node.level else []
                bad_web += [f"{name}:{node.lineno} imports {r}" for r in roots if r in WEB]
                if isinstance(node, ast.ImportFrom) and node.level and (node.module or "").startswith("app"):
                    bad_web.append(f"{name}:{node.lineno} imports the app")
    assert not bad_env, f"numerics reading the environment: {bad_env}"
    assert not bad_web, f"numerics importing the web framework: {bad_web}"


# ---- each statistic defined once ----------------------------------------------------------------------------------
def boot_block(client) -> dict:
    html = client.get("/").text
    return json.loads(re.search(r'<script type="application/json" id="boot">(.*?)</script>', html, re.S).group(1))


def test_each_statistic_is_defined_once(tmp_path):
    from attnscope.analysis.statistics import SCORES, STATISTICS
    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings
    from attnscope.corpus import run_corpus
    from attnscope.corpus.sums import STATS

    from .conftest import CACHE

    registry = set(STATISTICS)
    single = {n for n, s in STATISTICS.items() if s.needs == "probabilities"}
    pair_only = {n for n, s in STATISTICS.items() if s.needs == "pair"}
    text_only = {n for n, s in STATISTICS.items() if s.needs == "text"}
    corpus = {n for n, s in STATISTICS.items() if s.needs == "corpus"}       # the corpus job's and the atlas' only
    run = {n for n, s in STATISTICS.items() if s.needs == "run"}             # the API's, with the run's value norms
    assert registry == single | pair_only | text_only | corpus | run and text_only and pair_only and corpus and run
    with TestClient(create_app(Settings(models=["minilm", "tiny-gpt"]))) as c:
        one = c.post("/api/attention", json={"text": "The cat sat, on the mat.", "include": ["summary", "scores"]})
        pair = c.post("/api/attention", json={"text": "The cat sat.", "text_pair": "It slept.", "include": ["summary"]})
        boot = boot_block(c)
    assert set(one.json()["summary"]) == single | run and set(pair.json()["summary"]) == single | pair_only | run
    assert set(one.json()["scores"]) == set(SCORES)
    assert [s["id"] for s in boot["stats"] if not s["score"]] == list(STATISTICS)
    assert [s["id"] for s in boot["stats"] if s["score"]] == list(SCORES)
    assert {s["id"] for s in boot["stats"] if s["pair_only"]} == pair_only
    assert {s["id"] for s in boot["stats"] if s["corpus_only"]} == text_only | corpus
    src = tmp_path / "texts.txt"
    src.write_text("The cat sat, on the mat.\nHello, world!\n")
    job = run_corpus(src, "tiny-gpt", out=tmp_path / "out.json", workers=0, progress=False, log=lambda m: None,
                     cache_dir=CACHE)
    assert set(job["stats"]) == set(STATS) == single | text_only | corpus   # single texts, read token by token


@pytest.mark.parametrize("model_id, pair", [("tiny-gpt", None), ("minilm", "It slept by the door, quietly.")])
def test_layer_by_layer_and_stacked_agree_on_every_statistic(model_id, pair):
    """The registry's two forms: each statistic (and score) from a layer-by-layer run's in-graph rows equals the one
    the stacked path computes from the full matrices, through the API both ways."""
    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    body = {"model": model_id, "text": "The cat sat on the mat, and then, quietly, the cat slept.",
            "text_pair": pair, "include": ["summary", "scores", "entropy"]}
    answers = []
    for layerwise_mb in (256, 0):                    # the stacked graph; every text layer by layer
        with TestClient(create_app(Settings(models=[model_id], layerwise_mb=layerwise_mb))) as c:
            answers.append(c.post("/api/attention", json=body).json())
    stacked, layered = answers
    assert set(stacked["summary"]) == set(layered["summary"]) and (pair is None) == (
        "cross_sentence_mass" not in stacked["summary"])
    for part in ("summary", "scores"):
        for name, value in stacked[part].items():
            np.testing.assert_allclose(layered[part][name], value, atol=2e-5, rtol=1e-5, err_msg=name)
    assert np.max(stacked["summary"]["previous_token_mass"]) > 0.01   # not all zeros
    for name in ("entropy", "max_weight", "normalized_entropy"):
        np.testing.assert_allclose(layered[name], stacked[name], atol=2e-5, err_msg=name)


@pytest.mark.parametrize("causal", [True, False])
def test_every_row_is_the_same_in_numpy_and_inside_the_graph(causal):
    """Each registry row's two forms, on peaked random attention: its NumPy form on the probabilities, and the
    reduction the attend graph computes (graphs/reductions.py) on the same queries and keys."""
    from attnscope.analysis.statistics import CORPUS_STATS, GRAPH_ROWS, ROWS, STATISTICS, TextKeys
    from attnscope.graphs.layers import build_attend
    from attnscope.graphs.reductions import ASKED_ROWS, key_input
    from attnscope.model.functional import softmax
    from attnscope.model.masks import causal_mask
    from attnscope.model.transformer import Transformer, TransformerConfig
    from attnscope.runtime.options import open_session

    from .conftest import PROVIDERS

    cfg = TransformerConfig(vocab_size=50, max_positions=32, d_model=32, n_heads=4, n_layers=1, d_ff=8)
    T, H, dh = 11, cfg.n_heads, cfg.d_head
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, H, T, dh)).astype(np.float32) * 3 for _ in range(3))
    mask = (causal_mask(T) if causal else np.zeros((T, T), np.float32))[None, None]
    norms = (rng.random((H, T)) * 3 + 0.1).astype(np.float32)                # each key's ||v_j W_O^h||, spread
    keys = TextKeys(rng.random(T) < 0.3, [-1, 0, 0, 0, 0, -1, 1, 1, 1, 1, -1], list(rng.integers(0, 4, T)), window=4,
                    value_norms=norms)
    outputs = tuple(GRAPH_ROWS)                  # every row but a corpus's own may be asked of the graph
    assert set(ROWS) - set(GRAPH_ROWS) <= {STATISTICS[name].row for name in CORPUS_STATS}
    feeds = {"q": q, "k": k, "v": v, "attention_mask": mask, "heads": np.arange(H), "value_norms": norms[None],
             key_input("punctuation"): keys.punctuation.astype(np.float32), "local_window": np.array([4])}
    feeds |= {key_input(s): keys.mask(s, T).astype(np.float32) for s in ("other_sentence", "same_token_before")}
    sess = open_session(build_attend(Transformer(cfg), outputs, causal).SerializeToString(), PROVIDERS, 0)
    got = dict(zip(outputs, sess.run(list(outputs), {i.name: feeds[i.name] for i in sess.get_inputs()})))
    p = softmax(np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(dh) + mask)[0]             # [H, T, T]
    assert p.max(-1).mean() > 0.5                                                    # peaked: not a vacuous test
    for name, row in GRAPH_ROWS.items():
        np.testing.assert_allclose(got[name][0], row.numpy(p.astype(np.float32), keys), atol=2e-5, rtol=1e-5,
                                   err_msg=name)
    assert set(ASKED_ROWS) <= set(GRAPH_ROWS)


def test_value_norms_are_what_each_key_writes_through_its_heads_w_o():
    """TransformerBlock.value_norms, ||v_j W_O^h|| through a [dh, dh] factor of each head's columns of W_O (its Gram
    matrix's Cholesky factor), against the [D, dh] product in float64; a W_O with a pruned head (its columns zero:
    no Cholesky factor) is factored by QR, and that head's norms are 0."""
    from attnscope.model.transformer import Transformer, TransformerConfig

    cfg = TransformerConfig(vocab_size=50, max_positions=32, d_model=32, n_heads=4, n_layers=1, d_ff=8)
    block, H, dh = Transformer(cfg).blocks[0], cfg.n_heads, cfg.d_head
    v = np.random.default_rng(5).standard_normal((2, H, 7, dh)).astype(np.float32)
    for pruned in (None, 2):
        W = np.random.default_rng(6).standard_normal((cfg.d_model, H * dh)).astype(np.float32)
        if pruned is not None:
            W[:, pruned * dh:(pruned + 1) * dh] = 0
        block.attn.params["out_proj.weight"] = W
        exact = np.linalg.norm(np.einsum("bhtd,ehd->bhte", v.astype(np.float64), W.reshape(-1, H, dh)), axis=-1)
        np.testing.assert_allclose(block.value_norms(v), exact, rtol=1e-5, atol=1e-6, err_msg=f"pruned {pruned}")
        if pruned is not None:
            assert not block.value_norms(v)[:, pruned].any()


def test_no_package_file_is_over_500_lines():
    """A file that grows past 500 lines is doing two jobs (docs/ARCHITECTURE.md): split it by concern."""
    long = {str(path.relative_to(ROOT)): n for path in modules().values()
            if (n := len(path.read_text().splitlines())) > 500}
    assert not long, f"package files over 500 lines: {long}"


def test_one_registry_lists_the_analyses():
    """Every module of analyses/ with an ANALYSIS is in the registry, and nothing else lists analyses: no route,
    Python method or MCP tool is written for one by hand (tests/test_registry.py holds the surfaces to it)."""
    from attnscope.analyses.registry import ANALYSES, MODULES

    with_entry = sorted(p.stem for p in (ROOT / "analyses").glob("*.py") if "\nANALYSIS = Analysis(" in p.read_text())
    assert sorted(MODULES) == with_entry
    assert [a.name for a in ANALYSES.values()] == list(MODULES)
    for folder in ("app", "python"):
        for path in (ROOT / folder).glob("*.py"):
            text = path.read_text()
            for a in ANALYSES.values():
                assert f'"{a.path}"' not in text, f"{path.name} names {a.path}: routes come from the registry"


def _calls(path: Path) -> dict[str, set[str]]:
    """Each top-level function's and method's name -> the names it calls (f(...) and x.f(...))."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, set()).update(
                c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute)))
    return out


def test_one_attention_one_block_and_one_builder_of_each_in_onnx():
    """One NumPy attention (model/attention.attention: the only softmax over scores in model/), called by every
    attention module; one block class (TransformerBlock: decoders, encoders and encoder-decoders' blocks, no
    EncoderDecoderBlock); one ONNX attention (graphs/steps.attend: the only Softmax node) and one ONNX block builder
    (graphs/steps.transformer_block) that the stacked, per-layer, decoding and encoder-decoder graphs all call."""
    softmaxes = {(path.name, fn) for path in (ROOT / "model").glob("*.py")
                 for fn, called in _calls(path).items() if "softmax" in called}
    assert softmaxes == {("attention.py", "attention")}, softmaxes
    calls = _calls(ROOT / "model" / "attention.py")
    tree = ast.parse((ROOT / "model" / "attention.py").read_text())
    modules = [c.name for c in tree.body if isinstance(c, ast.ClassDef) and c.name.endswith("Attention")]
    assert set(modules) >= {"MultiHeadAttention", "GroupedQueryAttention", "CrossAttention"}
    for cls in (c for c in tree.body if isinstance(c, ast.ClassDef) and c.name in modules):
        call = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__call__"), None)
        assert call is None or "attention" in {c.func.id for c in ast.walk(call) if isinstance(c, ast.Call) and
                                               isinstance(c.func, ast.Name)}, f"{cls.name}.__call__ computes its own"
    assert "attention" in calls
    blocks = [n.name for p in (ROOT / "model").glob("*.py") for n in ast.parse(p.read_text()).body
              if isinstance(n, ast.ClassDef) and n.name.endswith("Block")]
    assert blocks == ["TransformerBlock"], blocks
    onnx_softmax = [(p.name, line) for p in (ROOT / "graphs").glob("*.py")
                    for line in p.read_text().splitlines() if '"Softmax"' in line]
    assert len(onnx_softmax) == 1 and onnx_softmax[0][0] == "steps.py", onnx_softmax
    assert "Softmax" in ast.get_source_segment((ROOT / "graphs" / "steps.py").read_text(), next(
        n for n in ast.parse((ROOT / "graphs" / "steps.py").read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name == "attend"))
    for graph in ("stacked", "layers", "decoding", "encdec"):
        assert "transformer_block" in set().union(*_calls(ROOT / "graphs" / f"{graph}.py").values()), graph
