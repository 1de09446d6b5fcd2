"""The command line: attend prints tokens and the matrix; export builds the graphs; bad input exits 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "attnscope", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_attend_prints_the_matrix_that_the_runtime_computes(runtimes):
    out = cli("attend", "The cat sat on the mat.", "--layer", "2", "--head", "5")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "layer 2  head 5  9 tokens" in lines[0]
    [ref] = runtimes["minilm"].run(["The cat sat on the mat."])
    rows = [line.split() for line in lines[2:]]
    assert [r[1] for r in rows] == ref.tokens
    shown = np.array([[float(v) for v in r[2:-1]] for r in rows])
    np.testing.assert_allclose(shown, ref.attentions[2, 5], atol=5e-4)


def test_attend_top_k_for_long_text_and_causal_decoder():
    out = cli("attend", "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
              "--model", "tiny-gpt", "--top", "2")
    assert out.returncode == 0, out.stderr
    assert "causal=True" in out.stdout
    first = out.stdout.splitlines()[1]
    assert "[CLS]:1.000" in first  # the first token can only see itself


def test_attend_bad_input_exits_2_with_a_message():
    out = cli("attend", "   ")
    assert out.returncode == 2 and "text is empty" in out.stderr
    out = cli("attend", "hi", "--layer", "9")
    assert out.returncode == 2 and "layers 0..5" in out.stderr
    out = cli("attend", "hi", "--model", "nope")
    assert out.returncode == 2 and "unknown model 'nope'" in out.stderr


def test_export_prints_cached_graph_paths():
    out = cli("export", "tiny-gpt")
    assert out.returncode == 0, out.stderr
    paths = [Path(p) for p in out.stdout.split()]
    assert len(paths) == 2 and all(p.is_file() and p.suffix == ".onnx" for p in paths)
