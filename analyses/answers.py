"""Typed answers of the Python API, the same in-process and through Client: built from an endpoint's payload as the
binary wire form decodes it (a dict of JSON fields and NumPy arrays). Each analysis' module subclasses Answer.

    a = m.attention("The cat sat on the mat.", layers=[2])
    a.tokens, a["attention"]                  # the payload's fields, by attribute or by key
    a.to_xarray()                             # xarray.Dataset: dims layer, head, query, key; coords the indices
    a.to_pandas()                             # pandas.DataFrame, one row per cell (tidy)
    a.figure()                                # a Plotly figure (analysis/figures.py draws it)

Each class names its arrays' axes (DIMS) and where their coordinates come from (coords); pandas, xarray and plotly
are imported on first use.
"""
from __future__ import annotations

import html
from typing import Annotated

import numpy as np
from pydantic import Field

# ---- compact answers for agents (the MCP tools of each analysis) ---------------------------------------------------
TOP = 10           # heads, pairs, tokens a tool lists unless asked for another number
ModelId = Annotated[str | None, Field(description="a model id from attnscope://models; the default model when "
                                                  "omitted")]
Top = Annotated[int, Field(ge=1, le=100, description="how many of the largest entries to list")]
ToolText = Annotated[str, Field(description="the text, as the model reads it")]
Layer = Annotated[int, Field(ge=0, description="a layer (0-based)")]
Head = Annotated[int, Field(ge=0, description="a head (0-based)")]
Position = Annotated[int, Field(ge=0, description="a token position (0-based), as the answer's tokens count")]
Pairs = Annotated[list[tuple[int, int]] | None, Field(description="[layer, head] pairs")]


def number(x, digits: int = 6):
    """A number as a model reads it best: rounded (6 significant decimals); None, NaN and infinities as None (JSON
    has no NaN)."""
    return None if x is None or not np.isfinite(float(x)) else round(float(x), digits)


def top_of(z, k: int, name: str, by_abs: bool = True) -> list[dict]:
    """The k heads of a [layer, head] map with the largest |value| (or value), as a tool lists them."""
    return [{"layer": l, "head": h, name: number(v)} for l, h, v in top_heads(z, k, by_abs)]



class Answer:
    """An endpoint's answer. DIMS: array field -> its axes' names. VIEW: for an answer the page's views draw in a
    notebook (python/jupyter.py), the name they find it by and the form the page fetches it in (binary or json)."""
    DIMS: dict[str, tuple[str, ...]] = {}
    VIEW: tuple[str, str] | None = None

    def __init__(self, data: dict):
        self.data = data

    def __getitem__(self, key):
        return self.data[key]

    def __contains__(self, key) -> bool:
        return key in self.data

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "data":
            raise AttributeError(name)
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; fields: {', '.join(self.data)}"
                                 ) from None

    def keys(self):
        return self.data.keys()

    # ---- named axes ------------------------------------------------------------------------------------------------
    def coords(self) -> dict[str, list]:
        """Each axis' coordinates: layer and head indices as asked, query and key the token positions."""
        out = {}
        tokens = self.data.get("tokens")
        if tokens is not None:
            out["query"] = out["key"] = out["position"] = list(range(len(tokens)))
        if "layers" in self.data and isinstance(self.data["layers"], list):
            out["layer"] = list(self.data["layers"])
        if "heads" in self.data and isinstance(self.data["heads"], list):
            out["head"] = list(self.data["heads"])
        return out

    def arrays(self) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """field -> (its axes, its values) for every field DIMS names that the answer has."""
        out = {}
        for name, dims in self.DIMS.items():
            value = self.data.get(name)
            if value is None:
                continue
            value = np.asarray(value, dtype=np.float64 if not isinstance(value, np.ndarray) else value.dtype)
            if value.ndim == len(dims):
                out[name] = (dims, value)
        return out

    def to_xarray(self):
        """An xarray.Dataset of the answer's arrays on named axes (layer, head, query, key, ...), with coordinates."""
        import xarray as xr

        coords = self.coords()
        variables, used = {}, set()
        for name, (dims, value) in self.arrays().items():
            variables[name] = (dims, value)
            used.update(dims)
        tokens = self.data.get("tokens")
        ds = xr.Dataset(variables, coords={d: coords[d] for d in used if d in coords and
                                           len(coords[d]) == _size(variables, d)})
        if tokens is not None:
            for d in ("query", "key", "position"):
                if d in ds.dims and ds.sizes[d] == len(tokens):
                    ds = ds.assign_coords({f"{d}_token": (d, list(tokens))})
        ds.attrs.update({k: v for k, v in self.data.items() if isinstance(v, (str, int, float, bool))})
        return ds

    def to_pandas(self):
        """A pandas.DataFrame: one row per cell of the answer's arrays (tidy: an axis per column, a column per
        array of the same axes); for a single array of one axis, that Series' frame."""
        ds = self.to_xarray()
        if not ds.data_vars:
            import pandas as pd
            return pd.DataFrame([{k: v for k, v in self.data.items() if not isinstance(v, (list, dict, np.ndarray))}])
        groups: dict[tuple, list[str]] = {}
        for name, var in ds.data_vars.items():
            groups.setdefault(var.dims, []).append(name)
        dims, names = max(groups.items(), key=lambda kv: (len(kv[0]), len(kv[1])))
        if not dims:                                        # numbers alone: one row
            import pandas as pd
            return pd.DataFrame([{name: ds[name].item() for name in names}])
        return ds[names].to_dataframe().reset_index()[[*dims, *names]]

    def figure(self):
        raise NotImplementedError(f"{type(self).__name__} has no figure")

    def summary(self) -> str:
        """One line for a person (and for _repr_html_)."""
        return f"{type(self).__name__} of {self.data.get('model', '?')}"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{' x '.join(html.escape(d) for d in dims)}</td>"
                       f"<td>{' x '.join(map(str, value.shape))}</td></tr>" for name, (dims, value) in
                       self.arrays().items())
        table = f"<table><tr><th>array</th><th>axes</th><th>shape</th></tr>{rows}</table>" if rows else ""
        return f"<div><b>{html.escape(type(self).__name__)}</b>: {html.escape(self.summary())}{table}</div>"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.summary()}>"


def _size(variables: dict, dim: str) -> int:
    for dims, value in variables.values():
        if dim in dims:
            return value.shape[dims.index(dim)]
    return -1


def heads_map(fig_title: str, z, unit: str):
    """A layer x head map on a diverging scale centred on 0 (the page's Effects maps)."""
    import plotly.graph_objects as go

    z = np.asarray(z, np.float64)
    top = float(np.nanmax(np.abs(z))) or 1.0
    fig = go.Figure(go.Heatmap(z=z, colorscale="RdBu", zmid=0, zmin=-top, zmax=top, colorbar={"title": unit},
                               hovertemplate="layer %{y} head %{x}<br>%{z:.4f}<extra></extra>"))
    fig.update_layout(title=fig_title, template="none", xaxis={"title": "head"},
                      yaxis={"title": "layer", "autorange": "reversed"})
    return fig


def top_heads(z, k: int = 5, by_abs: bool = True) -> list[tuple[int, int, float]]:
    """The k (row, column) cells of a 2-D map ([layer, head], [query, key], [writer, reader]) with the largest
    |value| (or value), largest first; NaN cells last."""
    z = np.asarray(z, np.float64)
    key = np.nan_to_num(np.abs(z) if by_abs else z, nan=-np.inf)
    order = np.argsort(-key, axis=None, kind="stable")[:k]
    return [(int(i), int(j), float(z[i, j])) for i, j in zip(*np.unravel_index(order, z.shape))]


class Indexed:
    """One (asked layer, asked head) of an answer, shaped as figures.head reads a result."""

    def __init__(self, answer: Answer, i: int, j: int):
        self.attentions = np.asarray(answer["attention"])[i:i + 1, j:j + 1]
        self.tokens, self.model = answer["tokens"], answer["model"]
