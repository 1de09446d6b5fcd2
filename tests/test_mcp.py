"""`attnscope mcp` driven by the official MCP SDK's client over stdio, as an agent's host runs it: the tools are
listed with typed inputs, and patching and QK attribution on SmolLM2 answer what the REST API answers (the tools'
numbers are rounded to 6 decimals and travel as float32, the binary wire form the Python API reads; the REST JSON's
are float64: they agree to 1e-5). Here the tools ask the suite's SmolLM2 server (--url); test_readme drives the
in-process tools (the README's MCP example)."""
from __future__ import annotations

import contextlib
import json
import os
import sys

import httpx
import numpy as np
import pytest

from .conftest import ROOT, run_in_fresh_loop

IOI = {"clean": "When Mary and John went to the store, John gave a drink to",
       "corrupt": "When Mary and John went to the store, Mary gave a drink to", "target": "␣Mary",
       "distractor": "␣John"}
QK = {"text": "The cat sat on the mat. The cat", "layer": 1, "head": 0, "query": 8, "key": 2}


async def _session(url: str, calls):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    # the tools answered by the suite's SmolLM2 server (--url: no second SmolLM2 in the suite; the in-process tools
    # run in test_readme's MCP example)
    params = StdioServerParameters(command=sys.executable, args=["-m", "attnscope", "mcp", "--url", url],
                                   env=dict(os.environ), cwd=str(ROOT))
    with open(os.devnull, "w") as quiet:
        async with stdio_client(params, errlog=quiet) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = (await session.list_tools()).tools
                answers = [await session.call_tool(name, args) for name, args in calls]
                models = json.loads((await session.read_resource("attnscope://models")).contents[0].text)
                return tools, answers, models


@pytest.mark.slow
def test_mcp_over_stdio_answers_what_the_rest_api_answers(live_server_smollm2):
    calls = [("patching", {**IOI, "top": 5}), ("qk", {**QK, "top": 4}),
             ("patching", {**IOI, "corrupt": "Mary gave a drink to"})]
    tools, answers, models = run_in_fresh_loop(_session(live_server_smollm2, calls))
    by_name = {t.name: t for t in tools}
    assert {"attention", "patching", "path_patching", "attribution", "qk", "lens", "knockout", "circuits", "generate",
            "atlas_start", "atlas_job"} <= set(by_name)
    schema = by_name["qk"].input_schema
    assert set(schema["required"]) == {"text", "layer", "head", "query", "key"}
    assert schema["properties"]["layer"]["type"] == "integer" and schema["properties"]["layer"]["minimum"] == 0
    assert by_name["patching"].input_schema["properties"]["site"]["enum"][0] == "head_output"
    assert [m["id"] for m in models] == ["smollm2", "tiny-gpt"] and models[0]["layers"] == 30 and models[0]["heads"] == 9

    patched, qk, refused = answers
    assert not patched.is_error and not qk.is_error
    p = patched.structured_content
    ref = httpx.post(f"{live_server_smollm2}/api/patching", json={"model": "smollm2", **IOI}, timeout=300).json()
    assert p["clean"] == pytest.approx(ref["clean"], abs=1e-5) and p["corrupt"] == pytest.approx(ref["corrupt"], abs=1e-5)
    recovery = np.asarray(ref["recovery"])
    assert len(p["top_heads"]) == 5                                 # compact: 5 heads, not 270 numbers
    for h in p["top_heads"]:
        assert h["recovery"] == pytest.approx(recovery[h["layer"], h["head"]], abs=1e-5)
        assert h["patched"] == pytest.approx(ref["patched"][h["layer"]][h["head"]], abs=1e-5)
    largest = np.sort(np.abs(recovery).ravel())[::-1][:5]
    np.testing.assert_allclose([abs(h["recovery"]) for h in p["top_heads"]], largest, atol=1e-5)

    q = qk.structured_content
    ref = httpx.post(f"{live_server_smollm2}/api/qk", json={"model": "smollm2", **QK, "top": 4}, timeout=300).json()
    names = [c["name"] for c in ref["components"]]
    assert q["score"] == pytest.approx(ref["score"], abs=1e-5) and q["probability"] == pytest.approx(
        ref["probability"], abs=1e-5)
    assert [(t["query_component"], t["key_component"]) for t in q["top"]] == [
        (names[t["query"]], names[t["key"]]) for t in ref["top"]]
    np.testing.assert_allclose([t["value"] for t in q["top"]], [t["value"] for t in ref["top"]], atol=1e-5)
    assert q["query_token"] == ref["tokens"][8] and q["key_token"] == ref["tokens"][2]

    # a refusal reaches the agent as the API's message, and the server goes on
    assert refused.is_error and "same token count" in refused.content[0].text



async def _call_then(url: str, then):
    """Open an MCP session over streamable HTTP (its GET stream held open, as an agent's host holds it), start a
    tool call, then run `then()` in a thread with the session open and the call in flight; its result."""
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    out = {}
    with contextlib.suppress(Exception):                        # the server goes away under the session: expected
        async with streamable_http_client(url) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert "qk" in [t.name for t in (await session.list_tools()).tools]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(session.call_tool, "qk", {**QK, "top": 4})
                    await anyio.sleep(0.5)
                    out["took"] = await anyio.to_thread.run_sync(then)
                    tg.cancel_scope.cancel()
    return out.get("took")


def test_mcp_over_http_exits_on_sigterm_with_a_session_open(tmp_path):
    """SIGTERM with a client's session open and its tool call in flight (to a server that never answers: the call's
    thread cannot be cancelled): the server ends within its grace period (--grace 1: one second for the calls, one
    for the shutdown), where it waited for the call (the client's 120 s timeout) before."""
    import signal
    import socket
    import subprocess
    import time

    from bench.common import free_port

    port, mute = free_port(), socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)                                              # takes connections, never answers
    log = tmp_path / "mcp.log"
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "mcp", "--transport", "http", "--port", str(port),
                             "--grace", "1", "--url", f"http://127.0.0.1:{mute.getsockname()[1]}"], cwd=str(ROOT),
                            env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)

        def terminate():
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                return None
            return time.monotonic() - started

        took = run_in_fresh_loop(_call_then(f"http://127.0.0.1:{port}/mcp", terminate))
        assert took is not None, "still running 20 s after SIGTERM: " + log.read_text()[-2000:]
        assert took < 5 and proc.returncode == 128 + signal.SIGTERM, (took, proc.returncode)
        assert "a tool call was still running" in log.read_text()
    finally:
        mute.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
