"""attnscope: what every attention head of a real transformer looks at, with the exact numbers.

The import package maps the repository's top level, one concern per folder (docs/ARCHITECTURE.md):
`model` (the NumPy transformer), `sources` (where models come from), `graphs` (the same model as ONNX), `runtime`
(text in, results out), `analysis` (statistics and scores), `corpus` (corpus jobs), `analyses` (one module per
analysis, and their registry), `app` (the HTTP server), `python` (the Python API, notebook views, MCP tools, the
command line), and the page's `static/` and `templates/` as package data.

In a script or notebook (no server needed):

    import attnscope
    m = attnscope.load("minilm")
    r = m.run("The cat sat on the mat.")
    r.tokens, r.token_ids, r.attentions.shape      # [...], [...], (layers, heads, T, T)
    r.summary()["previous_token_mass"]              # [layers, heads]
    attnscope.figures.head(r, layer=2, head=5).show()
    m.attention("The cat sat.", layers=[2]).to_xarray()   # every analysis, as the REST API answers it (analyses/registry.py)

Against a running server: `attnscope.Client("http://127.0.0.1:8000")` (standard library + NumPy only), with the same
methods and answers.
"""
from __future__ import annotations

__all__ = ["load", "Model", "Runtime", "AttentionResult", "Client", "figures", "__version__"]


def __getattr__(name: str):
    """Import on first use: `import attnscope` stays cheap, and the client needs neither onnxruntime nor FastAPI."""
    if name == "__version__":        # kept in analyses/ (read there as a literal, and by every answer's ETag)
        from .analyses import __version__
        return __version__
    if name in ("load", "Model"):
        from .python import local
        return getattr(local, name)
    if name in ("Runtime", "AttentionResult"):
        from . import runtime
        return getattr(runtime, name)
    if name == "Client":
        from .python.client import Client
        return Client
    if name == "figures":
        from .analysis import figures
        return figures
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
