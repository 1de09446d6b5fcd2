"""One table of analyses (analyses/registry.py), many surfaces: every surface serves exactly the registry's analyses,
and a new analysis is one new file and one registry line.

The toy test copies the package, adds `analyses/toy.py` and the line `"toy",` to the registry and nothing else, then,
in a process of its own on that copy, finds the toy in REST (a real uvicorn, its OpenAPI example included),
in-process (attnscope.Model), through Client, as an MCP tool, and in the page's fetch layer (the boot block)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from attnscope.analyses.registry import ANALYSES, MODULES, methods, page, tools
from attnscope.app.main import create_app
from attnscope.app.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "onnx"
JOBS_TOOLS = {"atlas_start", "atlas_job"}              # the corpus jobs: resources, not analyses (python/agents.py)
NOT_ANALYSES = {"show", "models", "atlas", "job", "jobs", "close"}   # the Python API's own methods

TOY = '''"""A toy analysis (tests/test_registry.py): the text's tokens and their count, no model run."""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from . import checks
from .answers import Answer, ModelId, ToolText
from .base import Analysis, Computed, Method, Plan, Tool, etag_of, hash_of
from .schemas import Strict, Text


class ToyRequest(Strict):
    model: Text = Field("tiny-gpt", description="a model id")
    text: Text = Field(description="the text", examples=["a b c"])


class ToyResponse(BaseModel):
    model: str
    tokens: list[str]
    count: int


@dataclass(frozen=True, kw_only=True)
class ToyPlan(Plan):
    async def compute(self, runner) -> Computed:
        return Computed(self.encoding, False, {})

    def payload(self, computed: Computed) -> dict:
        return {"model": self.request.model, "tokens": computed.result.tokens, "count": len(computed.result.ids)}


def plan(ctx, req: ToyRequest, binary: bool) -> ToyPlan:
    rt, enc = checks.text(ctx, req)
    key = hash_of(["toy", req.model, req.text])
    return ToyPlan(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary), binary=binary,
                   size=100 * len(enc.ids))


class Toy(Answer):
    pass


def body(text: str) -> dict:
    """POST /api/toy: the text's tokens and their count."""
    return {"text": text}


def tool(api, text: ToolText, model: ModelId = None) -> dict:
    return {"count": api.toy(text, model=model).count}


ANALYSIS = Analysis(name="toy", tag="toys", summary="The text's tokens", description="A toy.", request=ToyRequest,
                    response=ToyResponse, plan=plan, example={"text": "a b c"}, methods=(Method("toy", body, Toy),),
                    tools=(Tool("toy", "Count a text's tokens.", tool),))
'''

PROBE = r'''
import asyncio, json, socket, sys, threading, time
import httpx, uvicorn
import attnscope
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.python.agents import server

cache = sys.argv[1]
settings = Settings(models=["tiny-gpt"], default_model="tiny-gpt", cache=cache)
app = create_app(settings)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
threading.Thread(target=srv.run, daemon=True).start()
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if httpx.get(url + "/healthz", timeout=1).json()["status"] == "ok":
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.1)
out = {}
rest = httpx.post(url + "/api/toy", json={"text": "a b c"}, timeout=60)
out["rest"] = [rest.status_code, rest.json()]
op = httpx.get(url + "/openapi.json").json()["paths"]["/api/toy"]["post"]
out["openapi"] = {"tags": op["tags"], "example": op["requestBody"]["content"]["application/json"].get("example")}
page = httpx.get(url + "/").text
boot = json.loads(page.split('id="boot"', 1)[1].split(">", 1)[1].split("</script>", 1)[0])
out["page"] = [a for a in boot["analyses"] if a["name"] == "toy"]
out["client"] = attnscope.Client(url).toy("a b c").count
model = attnscope.Model(settings=settings)
out["local"] = model.toy("a b c").count
mcp = server(model)
tools = asyncio.run(mcp.list_tools())
out["mcp_tools"] = [t.name for t in tools]
content = asyncio.run(mcp.call_tool("toy", {"text": "a b c"}))
out["mcp"] = json.loads(json.dumps(content[1] if isinstance(content, tuple) else content, default=str))
model.close()
srv.should_exit = True
print("RESULT " + json.dumps(out))
'''


def _copy_package(to: Path) -> Path:
    """The package's own files (what git has or would add, less tests, benches and docs), as an importable
    `attnscope`."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    pkg = to / "attnscope"
    for name in files:
        if name.split("/")[0] in ("tests", "bench", "docs", ".ci") or not (ROOT / name).is_file():
            continue
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, pkg / name)
    return pkg


@pytest.mark.slow
def test_a_toy_analysis_is_one_file_and_one_registry_line(tmp_path):
    pkg = _copy_package(tmp_path)
    before = {p.relative_to(pkg): p.read_bytes() for p in pkg.rglob("*") if p.is_file()}
    (pkg / "analyses" / "toy.py").write_text(TOY)
    registry = pkg / "analyses" / "registry.py"
    text = registry.read_text()
    assert text.count('    "generate",\n') == 1
    registry.write_text(text.replace('    "generate",\n', '    "generate",\n    "toy",\n'))
    after = {p.relative_to(pkg): p.read_bytes() for p in pkg.rglob("*") if p.is_file()}
    changed = {p for p in after if before.get(p) != after[p]}
    assert changed == {Path("analyses/toy.py"), Path("analyses/registry.py")}
    assert len(registry.read_text().splitlines()) == len(text.splitlines()) + 1      # one line

    run = subprocess.run([sys.executable, "-c", PROBE, str(CACHE)], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
                              "ATTNSCOPE_CACHE": str(CACHE)}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.split("RESULT ", 1)[1])
    status, answer = out["rest"]
    assert status == 200 and answer["count"] == len(answer["tokens"]) >= 3
    assert out["openapi"] == {"tags": ["toys"], "example": {"text": "a b c"}}
    assert out["page"] == [{"name": "toy", "path": "/api/toy", "fields": [], "form": "json", "stream": None}]
    assert out["client"] == out["local"] == answer["count"]
    assert "toy" in out["mcp_tools"]
    assert json.dumps(out["mcp"]).count(str(answer["count"])) >= 1


# ---- the real registry against every surface -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served():
    with TestClient(create_app(Settings(models=["tiny-gpt"], default_model="tiny-gpt", cache=CACHE))) as c:
        yield c


def test_every_route_is_an_analysis_and_every_analysis_a_route_with_an_example(served):
    paths = served.get("/openapi.json").json()["paths"]
    jobs = ("/api/jobs", "/api/jobs/{job_id}/cancel")       # the corpus jobs' own routes: a job is a resource
    posted = {p for p, ops in paths.items() if "post" in ops and p not in jobs}
    assert posted == {a.path for a in ANALYSES.values()}
    for a in ANALYSES.values():
        op = paths[a.path]["post"]
        assert op["tags"] == [a.tag] and op["summary"] == a.summary
        assert op["requestBody"]["content"]["application/json"]["example"] == a.example, a.name
    assert list(ANALYSES) == list(MODULES)


def test_the_python_api_has_every_analysis_method_and_no_other(served, runtimes):
    import attnscope
    from attnscope.python.api import Analyses

    model = attnscope.Model(runtimes["tiny-gpt"])
    try:
        public = {n for n in dir(type(model)) if not n.startswith("_") and callable(getattr(type(model), n))}
        public -= {n for n in dir(type(model)) if n in type(model).__dict__ and n not in Analyses.__dict__}
        assert public - NOT_ANALYSES == set(methods())
        client = attnscope.Client("http://127.0.0.1:1")
        assert {n for n in methods() if callable(getattr(client, n))} == set(methods())
        for name, (_, m) in methods().items():       # each method's signature is its body's, with `model=`
            params = list(__import__("inspect").signature(getattr(Analyses, name)).parameters)
            assert params[0] == "self" and "model" in params, name
    finally:
        model.close()


def test_the_mcp_tools_are_the_registry_s_and_the_jobs(runtimes):
    import asyncio

    import attnscope
    from attnscope.python.agents import server

    model = attnscope.Model(runtimes["tiny-gpt"])
    try:
        names = {t.name for t in asyncio.run(server(model).list_tools())}
    finally:
        model.close()
    assert names == set(tools()) | JOBS_TOOLS


def test_the_page_fetches_analyses_from_the_boot_block_alone(served):
    page_js = (ROOT / "static" / "js" / "api.js").read_text()
    boot = served.get("/").text
    assert json.loads(boot.split('id="boot"', 1)[1].split(">", 1)[1].split("</script>", 1)[0])["analyses"] == page()
    for a in ANALYSES.values():                       # no analysis path written into the page's scripts
        for js in (ROOT / "static" / "js").rglob("*.js"):
            assert f'"{a.path}"' not in js.read_text(), (a.path, js.name)
    assert "export function analysis(" in page_js
    views = " ".join(js.read_text() for js in (ROOT / "static" / "js" / "views").glob("*.js"))
    import re
    asked = set(re.findall(r'endpoint: "(\w+)"', views))
    assert asked - {"jobs", "atlas"} <= set(ANALYSES), asked     # every view asks by a registry name
