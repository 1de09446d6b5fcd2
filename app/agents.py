"""attnscope for agents: the analyses as Model Context Protocol tools (`attnscope mcp`, the official `mcp` SDK).

    attnscope mcp                                  # stdio: the models of ATTNSCOPE_MODELS, in this process
    attnscope mcp --transport http --port 8765     # streamable HTTP at http://127.0.0.1:8765/mcp
    attnscope mcp --url http://127.0.0.1:8000      # the tools answered by a running server instead

Every tool calls the Python API (app/analyses.py: an in-process Model, or a Client with --url), so its numbers are
the REST API's; what it returns is sized for a model's context: the metric and the top-k heads of a map, the top pairs
of a QK table, the top tokens of a lens, never a whole [layer, head, query, key] array. Resources: the served models
(attnscope://models) and each finished atlas (attnscope://atlases, attnscope://atlas/{job_id}).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from .analyses import Analyses
from .answers import top_heads

Result = dict[str, Any]   # a tool's answer: structured (JSON) content
TOP = 10           # heads, pairs, tokens a tool lists unless asked for another number
GRACE_S = 5.0      # HTTP: after SIGTERM (or Ctrl-C), what open sessions and tool calls in flight get to end

Text = Annotated[str, Field(description="the text, as the model reads it")]
ModelId = Annotated[str | None, Field(description="a model id from attnscope://models; the default model when "
                                                  "omitted")]
Top = Annotated[int, Field(ge=1, le=100, description="how many of the largest entries to list")]
Layer = Annotated[int, Field(ge=0, description="a layer (0-based)")]
Head = Annotated[int, Field(ge=0, description="a head (0-based)")]
Position = Annotated[int, Field(ge=0, description="a token position (0-based), as the answer's tokens count")]
Pairs = Annotated[list[tuple[int, int]] | None, Field(description="[layer, head] pairs")]


def _r(x, digits: int = 6):
    """A number as a model reads it best: rounded (6 significant decimals); None, NaN and infinities as None (JSON
    has no NaN)."""
    return None if x is None or not np.isfinite(float(x)) else round(float(x), digits)


def _heads(z, k: int, name: str, by_abs: bool = True) -> list[dict]:
    return [{"layer": l, "head": h, name: _r(v)} for l, h, v in top_heads(z, k, by_abs)]


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

    # ---- tools -----------------------------------------------------------------------------------------------------
    def tool(description: str):
        """A tool whose refusals (the API's 4xx, a bad argument) reach the model as its message."""
        def register(fn):
            @functools.wraps(fn)
            def call(*args, **kwargs):
                try:
                    return fn(*args, **kwargs)
                except (ApiError, ValueError) as e:
                    raise ToolError(str(e)) from None
            return mcp.tool(description=description, structured_output=True)(call)
        return register

    @tool("Per-head attention statistics of a text (means over its queries): the top heads by one "
                          "statistic, and one head's strongest (query -> key) links.")
    def attention(text: Text, model: ModelId = None,
                  statistic: Annotated[str, Field(description="a summary statistic: mean_entropy, first_token_mass, "
                                                              "previous_token_mass, ... (the API's `summary`)")] =
                  "previous_token_mass",
                  layer: Layer | None = None, head: Head | None = None, top: Top = TOP) -> Result:
        a = api.attention(text, model=model, include=["summary"] + (["attention"] if layer is not None else []),
                          **({"layers": [layer], "heads": [head or 0]} if layer is not None else {}))
        out = {"model": a.model, "tokens": a.tokens}
        if layer is None:
            summary = a["summary"]
            if statistic not in summary:
                raise ValueError(f"unknown statistic {statistic!r}; one of {', '.join(summary)}")
            out["top_heads"] = _heads(summary[statistic], top, statistic, by_abs=False)
        else:
            p = np.asarray(a["attention"])[0, 0]
            out["links"] = [{"query": q, "key": k, "weight": _r(w), "query_token": a.tokens[q],
                             "key_token": a.tokens[k]} for q, k, w in top_heads(p, top, by_abs=False)]
        return out

    @tool("Activation patching: each head's output (or another site) patched alone between a clean "
                          "and a corrupt text of the same token count; the metric (logit difference, or log-prob) on "
                          "both and the heads that recover most of the gap.")
    def patching(clean: Text, corrupt: Text, target: str, distractor: str | None = None, model: ModelId = None,
                 site: Literal["head_output", "query", "key", "value", "pattern"] = "head_output",
                 direction: Literal["denoise", "noise"] = "denoise", top: Top = TOP) -> Result:
        a = api.patching(clean, corrupt, target, distractor, site=site, direction=direction, model=model)
        return _patched(a, top)

    @tool("Path patching (Wang et al. 2023): sender heads' corrupt outputs reach receiver heads' "
                          "query, key or value (or the logits, without receivers) along direct paths only, every "
                          "other head frozen. Without senders, each head alone: the senders that matter most.")
    def path_patching(clean: Text, corrupt: Text, target: str, distractor: str | None = None,
                      senders: Pairs = None, receivers: Pairs = None,
                      receiver_input: Literal["query", "key", "value"] = "query", model: ModelId = None,
                      top: Top = TOP) -> Result:
        a = api.path_patching(clean, corrupt, target, distractor, senders=senders, receivers=receivers,
                              receiver_input=receiver_input, model=model)
        return _patched(a, top)

    @tool("Direct logit attribution: each head's direct share of logit(target) (minus "
                          "logit(distractor)) at a position (default: the last); the top heads and MLPs.")
    def attribution(text: Text, target: str, distractor: str | None = None, position: Position | None = None,
                    model: ModelId = None, top: Top = TOP) -> Result:
        a = api.attribution(text, target, distractor, position=position, model=model)
        p = a.parts
        mlps = np.asarray(p["mlps"], np.float64)
        return {"model": a.model, "metric": p["metric"], "position": p["position"], "logit": _r(p["logit"]),
                "target": p["target"]["token"], "distractor": (p.get("distractor") or {}).get("token"),
                "embeddings": _r(p["embeddings"]), "heads_total": _r(np.sum(p["heads"])),
                "mlps_total": _r(mlps.sum()), "top_heads": _heads(p["heads"], top, "share"),
                "top_mlps": [{"layer": int(l), "share": _r(mlps[l])} for l in np.argsort(-np.abs(mlps))[:top]]}

    @tool("QK attribution: why one head attends from a query position to a key position: its "
                          "score split into query-side x key-side components (embeddings, earlier heads, MLPs); the "
                          "top pairs.")
    def qk(text: Text, layer: Layer, head: Head, query: Position, key: Position, model: ModelId = None,
           top: Top = 8) -> Result:
        a = api.qk(text, layer, head, query, key, top=top, model=model)
        names = [c["name"] for c in a.components]
        return {"model": a.model, "layer": layer, "head": head, "query": query, "key": key,
                "query_token": a.tokens[query], "key_token": a.tokens[key], "score": _r(a.score),
                "scaled": _r(a.scaled), "probability": _r(a.probability), "explained": _r(a.explained),
                "top": [{"query_component": names[t["query"]], "key_component": names[t["key"]],
                         "value": _r(t["value"])} for t in a.top]}

    @tool("Logit lens: the residual stream after each block read as next-token predictions, at one "
                          "position (default: the last); optionally one head's promoted tokens there.")
    def lens(text: Text, position: Position | None = None, head_lens: Pairs = None, model: ModelId = None,
             top: Annotated[int, Field(ge=1, le=10)] = 3) -> Result:
        a = api.lens(text, top=top, head_lens=None if not head_lens else head_lens[0], model=model)
        i = len(a.tokens) - 1 if position is None else position
        if not 0 <= i < len(a.tokens):
            raise ValueError(f"position {i} is out of range: the text has {len(a.tokens)} tokens")
        probs = np.asarray(a["top_probs"])
        out = {"model": a.model, "position": i, "token": a.tokens[i],
               "rows": [{"row": r, "top": [{"token": t, "prob": _r(p)} for t, p in zip(a.top_tokens[n][i],
                                                                                        probs[n, i])]}
                        for n, r in enumerate(a.rows)]}
        if a.data.get("head_lens"):
            h = a["head_lens"]
            out["head_lens"] = {"layer": h["layer"], "head": h["head"], "promoted": list(h["promoted_tokens"][i]),
                                "suppressed": list(h["suppressed_tokens"][i])}
        return out

    @tool("Attention knockout: chosen query positions stop reading chosen key positions in a range "
                          "of layers; the next-token prediction before and after.")
    def knockout(text: Text, queries: list[int], keys: list[int], layers: tuple[int, int] | None = None,
                 model: ModelId = None, top: Annotated[int, Field(ge=1, le=10)] = 5) -> Result:
        a = api.knockout(text, queries, keys, layers=layers, model=model)
        e = a.effect
        pick = lambda ts: [{"token": t["token"], "prob": _r(t["prob"])} for t in ts[:top]]   # noqa: E731
        return {"model": a.model, "layers": a.layers, "kl": _r(e["kl"]), "before": pick(e["next_tokens_before"]),
                "after": pick(e["next_tokens_after"]), "mean_logprob_change": _r(e.get("mean_logprob_change"))}

    @tool("Weight-space circuits (no text): the heads that copy the tokens they attend to most (OV "
                          "copying), and the strongest K-, Q- or V-composition between heads.")
    def circuits(model: ModelId = None, composition: Literal["q", "k", "v"] = "k", top: Top = TOP) -> Result:
        a = api.circuits(model=model)
        names = a.coords()["writer"]
        out = {"model": a.model, "layers": a.layers, "heads": a.heads,
               f"top_{composition}_composition": [{"writer": names[i], "reader": names[j], "score": _r(v)} for i, j, v
                                                  in top_heads(a[f"composition_{composition}"], top, by_abs=False)]}
        if a.data.get("ov_copying") is not None:
            out["top_ov_copying"] = _heads(a["ov_copying"], top, "score", by_abs=False)
        return out

    @tool("Generate text from a prompt (greedy by default); each new token with its probability.")
    def generate(text: Text, max_new_tokens: Annotated[int, Field(ge=1, le=256)] = 16, greedy: bool = True,
                 model: ModelId = None) -> Result:
        g = api.generate(text, max_new_tokens=max_new_tokens, greedy=greedy, model=model)
        tokens = [{"token": t["token"], "probability": _r(t["probability"])} for t in g]
        return {"text": g.done["text"], "tokens": tokens, "stop_reason": g.done["stop_reason"]}

    @tool("Start a head atlas over the bundled corpus (per-head statistics over many texts); "
                          "returns the job, whose progress and result atlas_job reads.")
    def atlas_start(model: ModelId = None, texts: Annotated[int, Field(ge=1, le=100000)] = 200) -> Result:
        return _job(api.atlas(model=model, texts=texts).job)

    @tool("A head atlas job: its state and progress; when done, the top heads of each statistic. "
                          "cancel=true stops it.")
    def atlas_job(job_id: str, cancel: bool = False, top: Top = 5) -> Result:
        job = api.job(job_id)
        if cancel:
            job.cancel()
        out = _job(job.job)
        if job.state == "done":
            out["atlas"] = _atlas_summary(job.result(timeout=0), top)
        return out

    return mcp


def _patched(a, top: int) -> dict:
    out = {"model": a.model, "metric": a.metric, "target": a.target["token"],
           "distractor": (a.data.get("distractor") or {}).get("token"), "clean": _r(a.clean),
           "corrupt": _r(a.corrupt)}
    if np.ndim(a.patched) == 0:
        return out | {"patched": _r(a.patched), "recovery": _r(a.recovery)}
    z = a.recovery if a.data.get("recovery") is not None else np.asarray(a.patched, np.float64) - a.corrupt
    patched = np.asarray(a.patched, np.float64)
    heads = [{"layer": l, "head": h, "recovery" if a.data.get("recovery") is not None else "change": _r(v),
              "patched": _r(patched[l, h])} for l, h, v in top_heads(z, top)]
    return out | {"top_heads": heads}


def _job(job: dict) -> dict:
    return {"id": job["id"], "model": job["model"], "state": job["state"], **job["progress"]}


def _atlas_summary(atlas, top: int) -> dict:
    return {"model": atlas.model, "texts": atlas.data.get("texts"),
            "top_heads": {name: _heads(value, top, name, by_abs=False) for name, (_, value) in atlas.arrays().items()}}


def main(transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765, url: str | None = None,
         grace: float | None = None) -> None:
    """`attnscope mcp`: the served models (ATTNSCOPE_MODELS) in this process, or a server's (url)."""
    if url:
        from .client import Client
        api = Client(url)
    else:
        from .local import Model
        from .settings import get_settings
        api = Model(settings=get_settings())
    mcp = server(api)
    if transport == "stdio":
        mcp.run("stdio")
    else:
        serve_http(mcp, host, port, GRACE_S if grace is None else grace)


def serve_http(mcp, host: str, port: int, grace: float = GRACE_S) -> None:
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

    app = mcp.streamable_http_app(host=host)
    Server(uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=grace,
                          log_level=mcp.settings.log_level.lower())).run()


def _exit_after_grace(sig: int, grace: float) -> None:
    """The watchdog of serve_http's shutdown (a thread of its own; it runs only if the process is still there)."""
    logging.getLogger(__name__).warning("a tool call was still running %.0f s after the shutdown began: exiting "
                                        "without it", 2 * grace)
    logging.shutdown()
    os._exit(128 + sig)
