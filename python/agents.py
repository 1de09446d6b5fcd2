"""attnscope for agents: the analyses as Model Context Protocol tools (`attnscope mcp`, the official `mcp` SDK).

    attnscope mcp                                  # stdio: the models of ATTNSCOPE_MODELS, in this process
    attnscope mcp --transport http --port 8765     # streamable HTTP at http://127.0.0.1:8765/mcp
    attnscope mcp --url http://127.0.0.1:8000      # the tools answered by a running server instead

Every tool is an analysis' own (its module in analyses/, listed in analyses/registry.py) and calls the Python API
(python/api.py: an in-process Model, or a Client with --url), so its numbers are the REST API's; what it returns is sized for a model's context: the metric and the top-k heads of a map, the top pairs
of a QK table, the top tokens of a lens, never a whole [layer, head, query, key] array. Resources: the served models
(attnscope://models) and each finished atlas (attnscope://atlases, attnscope://atlas/{job_id}).
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import typing
from typing import Annotated, Any

from pydantic import Field

from ..analyses.answers import TOP, ModelId, Top, top_of
from ..analyses.registry import tools
from .api import Analyses

Result = dict[str, Any]   # a tool's answer: structured (JSON) content
GRACE_S = 5.0      # HTTP: after SIGTERM (or Ctrl-C), what open sessions and tool calls in flight get to end



def server(api: Analyses, name: str = "attnscope"):
    """The MCP server of `api`'s analyses (a Model or a Client)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from .client import ApiError

    mcp = MCPServer(name, instructions=(
        "Interpretability of transformer attention heads on real models (exact numbers, the same as attnscope's "
        "REST API and page). Read attnscope://models for the models, their layers and heads. Heads are "
        "(layer, head), 0-based; L23H3 is layer 23, head 3. Targets are tokens as next-token lists show them "
        "('␣Mary' for ' Mary') or a text that is exactly one token. Patching needs two texts of the same token "
        "count."))

    # ---- resources -------------------------------------------------------------------------------------------------
    @mcp.resource("attnscope://models", name="models", mime_type="application/json",
                  description="the served models: id, layers, heads, kind, whether they predict tokens")
    def models() -> list[dict]:
        return [{k: m.get(k) for k in ("id", "title", "kind", "layers", "heads", "kv_heads", "d_model", "max_tokens",
                                       "predictions", "unembedding")} for m in api.models()]

    @mcp.resource("attnscope://atlases", name="atlases", mime_type="application/json",
                  description="the corpus atlases (jobs): id, model, state, texts")
    def atlases() -> list[dict]:
        return [{"id": j["id"], "model": j["model"], "state": j["state"], "texts": j["progress"]["texts_total"]}
                for j in api.jobs()]

    @mcp.resource("attnscope://atlas/{job_id}", name="atlas", mime_type="application/json",
                  description="a finished atlas: for each statistic, the heads with the largest values")
    def atlas(job_id: str) -> dict:
        return _atlas_summary(api.job(job_id).result(timeout=0), TOP)

    # ---- tools: each analysis' own (analyses/registry.py), and the atlas jobs' ------------------------------------
    def tool(fn, name: str, description: str):
        """A tool whose refusals (the API's 4xx, a bad argument) reach the model as its message."""
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (ApiError, ValueError) as e:
                raise ToolError(str(e)) from None
        registered = mcp.tool(name=name, description=description, structured_output=True)(call)
        _forbid_unknown(mcp._tool_manager.get_tool(name))
        return registered

    for name, (_, t) in tools().items():
        tool(_bound(t.call, api), name, t.description)

    def atlas_start(model: ModelId = None, texts: Annotated[int, Field(ge=1, le=100000)] = 200) -> Result:
        return _job(api.atlas(model=model, texts=texts).job)

    def atlas_job(job_id: str, cancel: bool = False, top: Top = 5) -> Result:
        job = api.job(job_id)
        if cancel:
            job.cancel()
        out = _job(job.job)
        if job.state == "done":
            out["atlas"] = _atlas_summary(job.result(timeout=0), top)
        return out

    tool(atlas_start, "atlas_start", "Start a head atlas over the bundled corpus (per-head statistics over many "
         "texts); returns the job, whose progress and result atlas_job reads.")
    tool(atlas_job, "atlas_job", "A head atlas job: its state and progress; when done, the top heads of each "
         "statistic. cancel=true stops it.")
    return mcp


def _bound(call, api):
    """An analysis' tool call(api, ...) as a tool of `api`: its signature without `api`, its annotations evaluated in
    its own module (so that the MCP SDK reads them as they are)."""
    hints = typing.get_type_hints(call, include_extras=True)
    sig = inspect.signature(call)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in list(sig.parameters.values())[1:]]

    def bound(**kwargs):
        return call(api, **kwargs)
    bound.__signature__ = sig.replace(parameters=params, return_annotation=Result)   # structured content
    bound.__name__, bound.__doc__ = call.__name__, call.__doc__
    return bound

def _forbid_unknown(tool) -> None:
    """A tool refuses an argument it does not take, naming it, where the SDK's argument model ignored it; its input
    schema says so (additionalProperties: false). The SDK reads fn_metadata.arg_model live, on each call."""
    from pydantic import ConfigDict

    base = tool.fn_metadata.arg_model
    strict = type(base.__name__, (base,), {"model_config": ConfigDict(**base.model_config, extra="forbid"),
                                          "__module__": base.__module__})
    tool.fn_metadata.arg_model = strict
    tool.parameters = {**tool.parameters, "additionalProperties": False}


def _job(job: dict) -> dict:
    return {"id": job["id"], "model": job["model"], "state": job["state"], **job["progress"]}


def _atlas_summary(atlas, top: int) -> dict:
    return {"model": atlas.model, "texts": atlas.data.get("texts"),
            "top_heads": {name: top_of(value, top, name, by_abs=False) for name, (_, value) in atlas.arrays().items()}}


TOKEN_ENV = "ATTNSCOPE_MCP_TOKEN"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1; 127.1 is 127.0.0.1); 0.0.0.0 and ::
    bind every interface, a host name whatever it resolves to."""
    import ipaddress
    import socket
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def transport_security(host: str, allowed: list[str] | None = None):
    """Host and Origin checks on whatever host the server binds (the SDK turns them on only for the literal strings
    127.0.0.1, localhost and ::1): the loopback names, the bound host itself unless it is a wildcard (0.0.0.0, ::),
    and `allowed` (ATTNSCOPE_ALLOWED_HOSTS: the names a client reaches it by; "*" turns the checks off), each on any
    port; an Origin of any of them, http or https."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = [*LOOPBACK_NAMES]
    bound = host.strip("[]")
    if bound not in ("0.0.0.0", "::", ""):
        names.append(f"[{bound}]" if ":" in bound else bound)
    names += [h for h in allowed or [] if h != "*"]
    if "*" in (allowed or []):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = [f"{n}:*" for n in names] + names
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=[f"{s}://{n}{p}" for n in names for s in ("http", "https")
                                                      for p in (":*", "")])


class RequireToken:
    """ASGI: every HTTP request carries `Authorization: Bearer TOKEN` (compared in constant time), else 401."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token.encode()

    async def __call__(self, scope, receive, send):
        import hmac
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, value = sent.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), self.token):
            return await self.app(scope, receive, send)
        body = (b'{"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": "unauthorized: send '
                b'Authorization: Bearer TOKEN (attnscope mcp --token, or ' + TOKEN_ENV.encode() + b')"}}')
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="attnscope mcp"')]})
        await send({"type": "http.response.body", "body": body})


def main(transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765, url: str | None = None,
         grace: float | None = None, token: str | None = None) -> None:
    """`attnscope mcp`: the served models (ATTNSCOPE_MODELS) in this process, or a server's (url). Over HTTP, a host
    beyond loopback needs a token (`token`, or ATTNSCOPE_MCP_TOKEN), checked on every request (given on loopback,
    it is checked there too)."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if transport != "stdio" and token is None and not loopback(host):
        raise SystemExit(f"attnscope mcp: --host {host} reaches beyond this machine's loopback, and the tools run "
                         f"models and jobs for whoever calls them: give a token (--token TOKEN, or {TOKEN_ENV}); "
                         f"clients then send Authorization: Bearer TOKEN")
    if url:
        from .client import Client
        api = Client(url)
    else:
        from .local import Model
        from ..app.settings import get_settings
        api = Model(settings=get_settings())
    mcp = server(api)
    if transport == "stdio":
        import anyio
        anyio.run(run_stdio, mcp)
    else:
        serve_http(mcp, host, port, GRACE_S if grace is None else grace, token)


class _CheckedLines:
    """stdin for the SDK's stdio transport: each line read as bytes, and one that is not UTF-8, not JSON or not a
    JSON-RPC message answered at once with the protocol's error (-32700 parse error, -32600 invalid request; its id
    when it has one) instead of passed on, which the SDK answered with nothing: its client waited forever."""

    def __init__(self):
        import anyio
        self.ready, self.out = anyio.Event(), None

    async def _error(self, code: int, message: str, request_id) -> None:
        import mcp_types as types
        from mcp.shared.message import SessionMessage

        await self.ready.wait()
        await self.out.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(
            code=code, message=message))))

    async def __aiter__(self):
        import json
        import sys

        import anyio
        import mcp_types as types

        async for raw in anyio.wrap_file(sys.stdin.buffer):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                await self._error(types.PARSE_ERROR, f"Parse error: the line is not UTF-8 (byte {e.start})", None)
                continue
            if not line.strip():
                continue
            try:
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except Exception:  # noqa: BLE001 - whatever the SDK's own reading would have dropped
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError):
                    await self._error(types.PARSE_ERROR, "Parse error: the line is not JSON (or nested too deeply)",
                                      None)
                    continue
                request_id = obj.get("id") if isinstance(obj, dict) else None
                if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
                    request_id = None
                what = ("a batch (a JSON array): send one message a line" if isinstance(obj, list) else
                        "not a JSON-RPC 2.0 message the protocol defines (or a text that is not UTF-8: \\ud800)")
                await self._error(types.INVALID_REQUEST, f"Invalid request: {what}", request_id)
                continue
            yield line


async def run_stdio(mcp) -> None:
    """MCP over stdio (the SDK's transport), every line it cannot use answered (_CheckedLines)."""
    from mcp.server.stdio import stdio_server

    lines = _CheckedLines()
    async with stdio_server(stdin=lines) as (read_stream, write_stream):
        lines.out = write_stream
        lines.ready.set()
        server = mcp._lowlevel_server                 # what MCPServer.run_stdio_async runs on its own transport
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve_http(mcp, host: str, port: int, grace: float = GRACE_S, token: str | None = None) -> None:
    """Streamable HTTP at http://host:port/mcp, with a bounded shutdown. On SIGTERM (or Ctrl-C) the server stops
    taking connections and gives the open sessions (an agent's host holds one open, with its GET stream) and the
    calls in flight `grace` seconds to end (uvicorn's timeout_graceful_shutdown), then cancels them and shuts the
    session manager down. A tool call still running then (a call to a server that does not answer, a long patching:
    its thread cannot be cancelled) held the process, and the manager's shutdown with it, until it returned; the
    process now exits `grace` seconds after that all the same, with the signal's status (128 + signal)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not self.should_exit:                  # the first signal: the watchdog, after uvicorn's own grace
                watchdog = threading.Timer(2 * grace, _exit_after_grace, args=(sig, grace))
                watchdog.daemon = True                    # a process that ends in time is not held by it
                watchdog.start()
            super().handle_exit(sig, frame)

    from ..app.settings import get_settings
    app = mcp.streamable_http_app(host=host, transport_security=transport_security(host, get_settings().allowed_hosts))
    if token:
        app = RequireToken(app, token)
    Server(uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=grace,
                          log_level=mcp.settings.log_level.lower())).run()


def _exit_after_grace(sig: int, grace: float) -> None:
    """The watchdog of serve_http's shutdown (a thread of its own; it runs only if the process is still there)."""
    logging.getLogger(__name__).warning("a tool call was still running %.0f s after the shutdown began: exiting "
                                        "without it", 2 * grace)
    logging.shutdown()
    os._exit(128 + sig)
