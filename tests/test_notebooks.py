"""The docs notebooks (docs/notebooks/*.ipynb), executed headless as a reader would run them: nbclient with a real
IPython kernel (ipykernel, this interpreter), every cell in order; the tagged cells' outputs asserted. The kernel
inherits this environment (the suite's graph cache); an atlas job's files go to a temporary folder."""
from __future__ import annotations

import ast

import pytest

from .conftest import ROOT, in_thread

NOTEBOOKS = ROOT / "docs" / "notebooks"


def execute(name: str, tmp_path, monkeypatch) -> dict[str, dict]:
    """Run a notebook; tag -> that cell's last result's mime bundle; every cell's figures checked to be Plotly's."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("ATTNSCOPE_JOBS_DIR", str(tmp_path / "jobs"))
    book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    in_thread(client.execute)
    out, figures = {}, 0
    for cell in book.cells:
        if cell.cell_type != "code":
            continue
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source
        results = [o for o in cell.outputs if o.output_type in ("execute_result", "display_data")]
        figures += sum("application/vnd.plotly.v1+json" in o.data for o in results)
        for tag in cell.metadata.get("tags", []):
            out[tag] = results[-1].data
    assert figures >= 1, "a notebook draws at least one Plotly figure"
    return out


def value(bundle: dict):
    """The cell's result as Python reads its repr."""
    return ast.literal_eval(bundle["text/plain"])


@pytest.mark.slow
def test_ioi_notebook_finds_the_name_mover(tmp_path, monkeypatch):
    out = execute("ioi", tmp_path, monkeypatch)
    top = value(out["dla"])
    assert (23, 3) in [(l, h) for l, h, _ in top] and all(abs(top[i][2]) >= abs(top[i + 1][2]) for i in range(4))
    recovery, heads = value(out["patching"])
    assert len(heads) == 5 and heads[0][2] >= heads[-1][2]
    assert "L23H3 (13, 9)" in out["qk"]["text/plain"]


def test_induction_notebook_explains_the_induction_head(tmp_path, monkeypatch):
    out = execute("induction", tmp_path, monkeypatch)
    assert value(out["attention"]) == (3, "c")                    # the last "b" attends to "c", after the first "b"
    assert "L0H0" in out["qk"]["text/plain"]                      # the previous-token head's output on the key side
    composition = value(out["circuits"])                            # L0H0 -> L1H0: K-composition, 10x the others
    assert composition["k"] > 10 * max(composition["q"], composition["v"])


def test_atlas_notebook(tmp_path, monkeypatch):
    # explore_heads runs in the browser suite (tests/browser/test_notebook_view.py), which opens its head view
    state, texts = value(execute("atlas", tmp_path, monkeypatch)["job"])
    assert (state, texts) == ("done", 40)
