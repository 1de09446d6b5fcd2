"""Plotly figures from a result, for scripts and notebooks (`fig.show()` works offline in Jupyter: plotly.py
embeds its own plotly.js). The page draws the same pictures in the browser; these are their Python twins.

    r = attnscope.load("minilm")("The cat sat on the mat.")
    attnscope.figures.head(r, layer=2, head=5).show()
    attnscope.figures.model_grid(r).show()
"""
from __future__ import annotations

import numpy as np

from .thumbnails import downsample

COLORSCALE = "Cividis"   # the page's scale: sequential, perceptually uniform, colour-blind safe
PROBABILITY = {"zmin": 0.0, "zmax": 1.0}


def _labels(tokens: list[str]) -> list[str]:
    """Unique axis labels (Plotly merges equal category names): 'token #index'."""
    return [f"{t} #{i}" for i, t in enumerate(tokens)]


def head(result, layer: int, head: int, *, title: str | None = None):
    """One head's query x key matrix as a heatmap, rows = queries, on the fixed 0-1 probability scale."""
    import plotly.graph_objects as go

    p = np.asarray(result.attentions[layer, head], np.float64)
    labels = _labels(result.tokens)
    fig = go.Figure(go.Heatmap(z=p, x=labels, y=labels, colorscale=COLORSCALE, **PROBABILITY,
                               hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.6f}<extra></extra>"))
    fig.update_layout(title=title or f"{result.model} · layer {layer} · head {head}", template="none",
                      xaxis={"title": "key (attended to)", "tickangle": -60},
                      yaxis={"title": "query (attending)", "autorange": "reversed", "scaleanchor": "x"},
                      width=700, height=700)
    return fig


def model_grid(result, *, resolution: int = 48):
    """Every layer x head as a small block-averaged thumbnail (rows = layers, columns = heads)."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    L, H = result.attentions.shape[:2]
    thumbs = downsample(result.attentions, resolution)
    fig = make_subplots(rows=L, cols=H, horizontal_spacing=0.005, vertical_spacing=0.005,
                        row_titles=[f"L{l}" for l in range(L)], column_titles=[f"H{h}" for h in range(H)])
    for l in range(L):
        for h in range(H):
            fig.add_trace(go.Heatmap(z=thumbs[l, h], colorscale=COLORSCALE, showscale=False, zmin=0.0,
                                     zmax=float(thumbs.max()), hovertemplate=f"layer {l} head {h}<br>%{{z:.4f}}"
                                     "<extra></extra>"), row=l + 1, col=h + 1)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(title=f"{result.model} · every head (block means, one scale)", template="none",
                      width=80 * H + 100, height=80 * L + 100)
    return fig
