"""The README's curl examples work as written, against a real server."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def curl_commands() -> list[str]:
    text = README.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    joined = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    return [line.strip() for line in joined if line.strip().startswith("curl ")]


def test_readme_has_curl_for_every_endpoint():
    cmds = " ".join(curl_commands())
    for path in ("/api/models", "/api/attention", "/api/stages", "/api/importance", "/api/patching", "/api/knockout",
                 "/api/generate", "/api/models/minilm/onnx", "/healthz", "/api/jobs"):
        assert path in cmds, path


@pytest.fixture(scope="module")
def live_server_t5(tmp_path_factory):
    """A real uvicorn serving a tiny T5 folder as `t5`, as the README's encoder-decoder example has it."""
    from bench.common import server
    from tests.test_encdec import build

    folder = build("t5", tmp_path_factory.mktemp("readme") / "t5")
    with server({"ATTNSCOPE_MODELS": f"t5={folder}"}) as (url, _pid):
        yield url


@pytest.mark.parametrize("cmd", curl_commands())
def test_readme_curl_example(cmd, request, tmp_path):
    # the suite's server serves the quick models; SmolLM2's examples go to the SmolLM2 server, T5's to a tiny T5's
    server = request.getfixturevalue("live_server_smollm2" if '"smollm2"' in cmd else
                                     "live_server_t5" if '"t5"' in cmd else "live_server")
    cmd = cmd.replace("http://127.0.0.1:8000", server).replace("curl ", "curl --fail-with-body ", 1)
    out = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout[-500:] + out.stderr[-500:]
    produced = out.stdout or b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert produced, "the example printed and wrote nothing"
