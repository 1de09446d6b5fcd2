"""Typed answers of the Python API (app/analyses.py), the same on both sides: built from an endpoint's payload as
the binary wire form decodes it (a dict of JSON fields and NumPy arrays).

    a = m.attention("The cat sat on the mat.", layers=[2])
    a.tokens, a["attention"]                  # the payload's fields, by attribute or by key
    a.to_xarray()                             # xarray.Dataset: dims layer, head, query, key; coords the indices
    a.to_pandas()                             # pandas.DataFrame, one row per cell (tidy)
    a.figure()                                # a Plotly figure (app/figures.py draws it)

Each class names its arrays' axes (DIMS) and where their coordinates come from (coords); pandas, xarray and plotly
are imported on first use.
"""
from __future__ import annotations

import html
from typing import Iterator

import numpy as np


class Answer:
    """An endpoint's answer. DIMS: array field -> its axes' names."""
    DIMS: dict[str, tuple[str, ...]] = {}

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


def _heads_map(fig_title: str, z, unit: str):
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



class Attention(Answer):
    """POST /api/attention: the asked layers' and heads' attention probabilities [layer, head, query, key], entropy
    and the other per-query rows [layer, head, query], and each summary statistic [layer, head]."""
    DIMS = {"attention": ("layer", "head", "query", "key"), "entropy": ("layer", "head", "query"),
            "normalized_entropy": ("layer", "head", "query"), "max_weight": ("layer", "head", "query")}

    def arrays(self):
        out = super().arrays()
        for name, value in (self.data.get("summary") or {}).items():
            out[name] = (("layer", "head"), np.asarray(value, np.float64))
        return out

    @property
    def attentions(self) -> np.ndarray:
        """[asked layer, asked head, query, key], as runtime results name them (app/figures.py draws them)."""
        return self.data["attention"]

    def figure(self, layer: int | None = None, head: int | None = None):
        """One head's matrix (layer and head as the model numbers them; the first asked when only one was), or
        every asked head as the model grid."""
        from . import figures

        layers, heads = self.data["layers"], self.data["heads"]
        if layer is None and head is None and (len(layers) > 1 or len(heads) > 1):
            return figures.model_grid(self)
        layer, head = layers[0] if layer is None else layer, heads[0] if head is None else head
        return figures.head(_Indexed(self, layers.index(layer), heads.index(head)), 0, 0,
                            title=f"{self.data['model']} · layer {layer} · head {head}")

    def summary(self) -> str:
        a = self.data.get("attention")
        return (f"{self.data.get('model')}: {len(self.data.get('tokens', []))} tokens, layers {self.data.get('layers')}, "
                f"heads {self.data.get('heads')}" + ("" if a is None else f", attention {list(np.shape(a))}"))


class _Indexed:
    """One (asked layer, asked head) of an answer, shaped as figures.head reads a result."""

    def __init__(self, answer: Answer, i: int, j: int):
        self.attentions = np.asarray(answer["attention"])[i:i + 1, j:j + 1]
        self.tokens, self.model = answer["tokens"], answer["model"]


class Stages(Answer):
    """POST /api/stages: every step of one head; queries and keys are positions, d_model/d_head the vectors' axes."""
    DIMS = {"x": ("position", "d_model"), "q": ("query", "d_head"), "k": ("key", "d_head"), "v": ("key", "d_head"),
            "scores": ("query", "key"), "scaled": ("query", "key"), "mask": ("query", "key"),
            "masked": ("query", "key"), "probs": ("query", "key"), "ctx": ("query", "d_head"),
            "contribution": ("query", "d_model")}

    def figure(self):
        from . import figures

        one = _Indexed(Attention({**self.data, "attention": np.asarray(self.data["probs"])[None, None]}), 0, 0)
        return figures.head(one, 0, 0, title=f"{self.data['model']} · layer {self.data['layer']} · head "
                            f"{self.data['head']}: probabilities")

    def summary(self) -> str:
        return f"{self.data['model']} layer {self.data['layer']} head {self.data['head']}, {len(self.data['tokens'])} tokens"


class Attribution(Answer):
    """Direct logit attribution: each head's share [layer, head], each MLP's and attention bias' [layer]."""

    @property
    def parts(self) -> dict:
        return self.data["attribution"]

    def arrays(self):
        a = self.data["attribution"]
        return {"heads": (("layer", "head"), np.asarray(a["heads"], np.float64)),
                "mlps": (("layer",), np.asarray(a["mlps"], np.float64)),
                "attention_bias": (("layer",), np.asarray(a["attention_bias"], np.float64))}

    def coords(self):
        L, H = np.shape(self.data["attribution"]["heads"])
        return {"layer": list(range(L)), "head": list(range(H))}

    def top_heads(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k heads of largest |share|: (layer, head, share)."""
        return top_heads(self.data["attribution"]["heads"], k)

    def figure(self):
        a = self.data["attribution"]
        what = a["target"]["token"] + (f" − {a['distractor']['token']}" if a.get("distractor") else "")
        return _heads_map(f"{self.data['model']} · direct logit attribution of {what}", a["heads"], "logit units")

    def summary(self) -> str:
        a = self.data["attribution"]
        top = ", ".join(f"L{l}H{h} {v:+.3f}" for l, h, v in self.top_heads(3))
        return f"{a['metric']} {a['logit']:.4f} at position {a['position']}; top heads {top}"


class Knockout(Answer):
    """POST /api/knockout: the prediction before and after, and each token's log-prob change [position]."""

    def arrays(self):
        change = self.data["effect"].get("token_logprob_change")
        if change is None:
            return {}
        return {"token_logprob_change": (("position",), np.array([np.nan if v is None else v for v in change]))}

    def coords(self):
        return {"position": list(range(len(self.data["tokens"])))}

    def to_pandas(self):
        """The next tokens before and after, side by side (rank, token, prob)."""
        import pandas as pd

        e = self.data["effect"]
        rows = [{"rank": i, "when": when, **t} for when in ("before", "after")
                for i, t in enumerate(e[f"next_tokens_{when}"])]
        return pd.DataFrame(rows)

    def figure(self):
        import plotly.graph_objects as go

        e = self.data["effect"]
        fig = go.Figure([go.Bar(name=when, x=[t["token"] for t in e[f"next_tokens_{when}"]],
                                y=[t["prob"] for t in e[f"next_tokens_{when}"]]) for when in ("before", "after")])
        fig.update_layout(title=f"{self.data['model']} · knockout: next token before and after (KL {e['kl']:.4g})",
                          template="none", yaxis={"title": "probability"})
        return fig

    def summary(self) -> str:
        e = self.data["effect"]
        return (f"queries {self.data['queries']} stop reading keys {self.data['keys']} in layers {self.data['layers']}:"
                f" KL {e['kl']:.4g}, top after {e['next_tokens_after'][0]['token']!r}")


class QK(Answer):
    """POST /api/qk: one head's score at one cell, split into query-side x key-side components."""

    def coords(self):
        return {"component": [c["name"] for c in self.data["components"]],
                "query_component": [c["name"] for c in self.data["components"]],
                "key_component": [c["name"] for c in self.data["components"]]}

    def arrays(self):
        out = {"query_sums": (("query_component",), np.asarray(self.data["query_sums"], np.float64)),
               "key_sums": (("key_component",), np.asarray(self.data["key_sums"], np.float64))}
        if self.data.get("table") is not None:
            out["table"] = (("query_component", "key_component"), np.asarray(self.data["table"], np.float64))
        return out

    def to_pandas(self):
        """The top pairs: query component, key component, contribution."""
        import pandas as pd

        names = [c["name"] for c in self.data["components"]]
        return pd.DataFrame([{"query_component": names[t["query"]], "key_component": names[t["key"]],
                              "value": t["value"]} for t in self.data["top"]])

    def figure(self):
        import plotly.graph_objects as go

        df = self.to_pandas()
        fig = go.Figure(go.Bar(x=df["value"], y=df["query_component"] + " · " + df["key_component"], orientation="h"))
        fig.update_layout(title=f"{self.data['model']} · L{self.data['layer']}H{self.data['head']} score at "
                          f"({self.data['query']}, {self.data['key']}) = {self.data['scaled']:.4f}: top pairs",
                          template="none", yaxis={"autorange": "reversed"})
        return fig

    def summary(self) -> str:
        names = [c["name"] for c in self.data["components"]]
        top = self.data["top"][0] if self.data["top"] else None
        return (f"L{self.data['layer']}H{self.data['head']} ({self.data['query']}, {self.data['key']}): score "
                f"{self.data['score']:.4f}, p {self.data['probability']:.4f}" +
                (f"; top {names[top['query']]} · {names[top['key']]} {top['value']:+.4f}" if top else ""))


class Lens(Answer):
    """POST /api/lens: each row (the stream after the embeddings, after each block) as next-token predictions:
    top_probs [row, position, rank], next_probs [row, position]."""
    DIMS = {"top_probs": ("row", "position", "rank"), "next_probs": ("row", "position")}

    def coords(self):
        out = super().coords()
        out["row"] = list(self.data["rows"])
        out["rank"] = list(range(np.shape(self.data["top_probs"])[-1]))
        return out

    def figure(self):
        import plotly.graph_objects as go

        p = np.asarray(self.data["top_probs"])[..., 0]
        text = [[t[0] for t in row] for row in self.data["top_tokens"]]
        fig = go.Figure(go.Heatmap(z=p, x=[f"{t} #{i}" for i, t in enumerate(self.data["tokens"])],
                                   y=self.data["rows"], text=text, texttemplate="%{text}", colorscale="Cividis",
                                   zmin=0, zmax=1))
        fig.update_layout(title=f"{self.data['model']} · logit lens: top token after each block", template="none",
                          yaxis={"autorange": "reversed"})
        return fig

    def summary(self) -> str:
        return f"{len(self.data['rows'])} rows x {len(self.data['tokens'])} positions"


class Patching(Answer):
    """POST /api/patching: the patched metric and its recovery per [layer, head] ([layer, head, position] per
    position; residual [layer, position])."""

    def _dims(self) -> tuple[str, ...]:
        n = np.ndim(self.data["patched"])
        return ("layer", "position") if self.data.get("site") == "residual" else ("layer", "head", "position")[:n]

    def arrays(self):
        dims = self._dims()
        return {name: (dims, np.asarray(self.data[name], np.float64)) for name in ("patched", "recovery")
                if self.data.get(name) is not None and np.ndim(self.data[name]) == len(dims)}

    def coords(self):
        shape = np.shape(self.data["patched"])
        return {d: list(range(n)) for d, n in zip(self._dims(), shape)}

    def top_heads(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k (layer, head) of largest recovery (|patched - corrupt| when recovery is undefined)."""
        z = self.data["recovery"] if self.data.get("recovery") is not None else \
            np.asarray(self.data["patched"], np.float64) - self.data["corrupt"]
        return top_heads(z, k)

    def figure(self):
        z = self.data["recovery"] if self.data.get("recovery") is not None else \
            np.asarray(self.data["patched"], np.float64) - self.data["corrupt"]
        return _heads_map(f"{self.data['model']} · {type(self).__name__.lower()}", np.asarray(z).reshape(
            np.shape(z)[0], -1), "recovery" if self.data.get("recovery") is not None else "patched − corrupt")

    def summary(self) -> str:
        top = ", ".join(f"L{l}H{h} {v:+.3f}" for l, h, v in self.top_heads(3)) if np.ndim(self.data["patched"]) == 2 \
            and self.data.get("site") != "residual" else ""
        return (f"{self.data['metric']}: clean {self.data['clean']:.4f}, corrupt {self.data['corrupt']:.4f}"
                + (f"; top {top}" if top else ""))


class PathPatching(Patching):
    """POST /api/path_patching: with senders, one patched metric (and recovery); without, each head alone as the
    sender: [layer, head]."""

    def _dims(self):
        return ("layer", "head") if np.ndim(self.data["patched"]) == 2 else ()

    def figure(self):
        if np.ndim(self.data["patched"]) == 2:
            return super().figure()
        import plotly.graph_objects as go

        fig = go.Figure(go.Bar(x=["clean", "patched", "corrupt"], y=[self.data["clean"], self.data["patched"],
                                                                      self.data["corrupt"]]))
        fig.update_layout(title=f"{self.data['model']} · path patching from {self.data['senders']}", template="none",
                          yaxis={"title": self.data["metric"]})
        return fig

    def summary(self) -> str:
        if np.ndim(self.data["patched"]) == 2:
            return super().summary()
        return (f"{self.data['metric']}: clean {self.data['clean']:.4f}, corrupt {self.data['corrupt']:.4f}, "
                f"patched {self.data['patched']:.4f}")


class Circuits(Answer):
    """POST /api/circuits: OV copying [layer, head], Q/K/V composition [writer head, reader head] (heads named
    L{layer}H{head}, layer by layer)."""

    def coords(self):
        L, H = self.data["layers"], self.data["heads"]
        names = [f"L{l}H{h}" for l in range(L) for h in range(H)]
        return {"layer": list(range(L)), "head": list(range(H)), "writer": names, "reader": names}

    def arrays(self):
        out = {f"composition_{x}": (("writer", "reader"), np.asarray(self.data[f"composition_{x}"], np.float64))
               for x in "qkv"}
        if self.data.get("ov_copying") is not None:
            out["ov_copying"] = (("layer", "head"), np.array(self.data["ov_copying"], np.float64))
        return out

    def figure(self, which: str = "k"):
        import plotly.graph_objects as go

        names = self.coords()["writer"]
        fig = go.Figure(go.Heatmap(z=np.asarray(self.data[f"composition_{which}"]), x=names, y=names,
                                   colorscale="Cividis"))
        fig.update_layout(title=f"{self.data['model']} · {which.upper()}-composition (writer rows, reader columns)",
                          template="none", yaxis={"autorange": "reversed"})
        return fig

    def summary(self) -> str:
        return f"{self.data['layers']} layers x {self.data['heads']} heads"


class Generation:
    """POST /api/generate's stream: iterate for each new token's line ({index, id, token, text, probability,
    candidates, ...}); `done` is the stream's last line once it has ended (tokens, text, stop_reason, seed, ...)."""

    def __init__(self, lines: Iterator[dict]):
        self._lines = lines
        self.done: dict | None = None
        self.tokens: list[dict] = []

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        line = next(self._lines)
        if "done" in line:
            self.done = line["done"]
            getattr(self._lines, "close", lambda: None)()     # the stream has ended: its connection or run too
            raise StopIteration
        self.tokens.append(line["token"])
        return line["token"]

    def result(self) -> dict:
        """Run it to the end: the done line."""
        for _ in self:
            pass
        return self.done

    @property
    def text(self) -> str:
        return self.tokens[-1]["text"] if self.tokens else ""

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in t.items() if k not in ("candidates", "attention")} for t in self.tokens])

    def _repr_html_(self) -> str:
        return f"<div><b>Generation</b>: {html.escape(self.text)}</div>"


class AtlasJob:
    """A corpus job (POST /api/jobs): `job` is its last known state (GET /api/jobs/{id})."""

    def __init__(self, api, job: dict):
        self.api, self.job = api, job

    @property
    def id(self) -> str:
        return self.job["id"]

    @property
    def state(self) -> str:
        return self.job["state"]

    def progress(self) -> dict:
        """The job now: its state and progress (texts done of the total, rate, time left)."""
        self.job = self.api._job_get(self.id)
        return self.job["progress"]

    def cancel(self) -> dict:
        self.job = self.api._job_cancel(self.id)
        return self.job

    def wait(self, timeout: float = 600) -> dict:
        """Until it is done (or failed, cancelled, interrupted), or timeout seconds: the job then."""
        self.job = self.api._wait(self.id, timeout)
        return self.job

    def result(self, timeout: float = 600) -> "Atlas":
        """The finished atlas (waits for it)."""
        self.wait(timeout)
        return Atlas(self.api._job_result(self.id))

    def __repr__(self) -> str:
        return f"<AtlasJob {self.id} {self.state}>"


class Atlas(Answer):
    """A finished head atlas (docs/atlas.md): each statistic [layer, head] over the corpus."""

    def coords(self):
        return {"layer": list(range(self.data["layers"])), "head": list(range(self.data["heads"]))}

    def arrays(self):
        return {name: (("layer", "head"), np.asarray(v, np.float64)) for name, v in self.data["stats"].items()
                if np.ndim(v) == 2}

    def figure(self, stat: str | None = None):
        stat = stat or next(iter(self.data["stats"]))
        return _heads_map(f"{self.data['model']} · {stat} over {self.data.get('texts')} texts",
                          self.data["stats"][stat], stat)

    def summary(self) -> str:
        return f"{self.data['model']}: {self.data.get('texts')} texts, {len(self.data['stats'])} statistics"
