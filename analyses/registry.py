"""The analyses, one line each: every surface is made from this list. The REST routers (one per OpenAPI tag) and
their OpenAPI examples (app/routers.py, app/openapi.py), the Python API's methods in-process and through Client
(python/api.py), the MCP tools (python/agents.py) and the page's fetch layer (the boot block's `analyses`, read by
static/js/api.js) all read ANALYSES; tests/test_registry.py fails when any of them misses one or names one it does
not have. Adding an analysis: its module in analyses/, and its line here."""
from __future__ import annotations

from importlib import import_module

from .base import Analysis

MODULES = (
    "attention",
    "stages",
    "importance",
    "patching",
    "path_patching",
    "knockout",
    "retrieval",
    "qk",
    "lens",
    "circuits",
    "generate",
    "kv_compare",
)

ANALYSES: dict[str, Analysis] = {a.name: a for a in (import_module(f"{__package__}.{m}").ANALYSIS for m in MODULES)}


def methods() -> dict:
    """Every Python method of every analysis: name -> (its analysis, its Method)."""
    return {m.name: (a, m) for a in ANALYSES.values() for m in a.methods}


def tools() -> dict:
    """Every MCP tool of every analysis: name -> (its analysis, its Tool)."""
    return {t.name: (a, t) for a in ANALYSES.values() for t in a.tools}


def page() -> list[dict]:
    """What the page's fetch layer needs of each analysis (the boot block's `analyses`): its path, the fields it
    sends (all when empty), how it fetches the answer, and what its NDJSON form streams."""
    return [{"name": a.name, "path": a.path, "fields": list(a.page), "form": a.form, "stream": a.stream}
            for a in ANALYSES.values()]


class Plans:
    """Each analysis' planning by its name, on one context: `plans.attention(req, binary)` is
    ANALYSES["attention"].plan(context, req, binary) (the service's `plans`; what benches and tests call)."""

    def __init__(self, context):
        self.context = context

    def __getattr__(self, name: str):
        analysis = ANALYSES.get(name)
        if analysis is None:
            raise AttributeError(f"no analysis {name!r}; the registry has {', '.join(ANALYSES)}")
        return lambda req, binary=False: analysis.plan(self.context, req, binary)
