"""POST /api/circuits: weight-space circuits (Elhage et al. 2021), from the weights alone, norms' weights folded in: how
much each head copies the tokens it attends to (OV copying), and how much each head's output feeds each later head's
queries, keys and values (Q-, K- and V-composition; grouped-query aware: a head's keys and values are its key/value
head's). Computed once per model in a background thread (seconds of weight products for SmolLM2), kept beside its
graphs, never in a run slot; a request waits for it when it is still under way."""
from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..analysis import circuits as circuits_module
from ..analysis.circuits import Composition, composition, head_weights, ov_copying
from ..runtime import Runtime
from ..runtime.encdec import EncoderDecoderRuntime
from . import checks
from .answers import Answer, ModelId, TOP, Top, number, top_heads, top_of
from .base import Analysis, Computed, Context, Method, Plan, Tool, etag_of, hash_of
from .errors import Refused
from .runs import Runner
from .schemas import Matrix, Strict, Text, _bounded


class CircuitsRequest(Strict):
    """Weight-space circuits of a model: no text."""
    model: Text = Field("smollm2", description="a model id from GET /api/models", examples=["smollm2"])
    precision: _bounded(1, 8) | None = Field(None, description="round every number to this many decimals")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"model": "smollm2"}]})


class CircuitsResponse(BaseModel):
    model: str = Field(description="the model id that answered")
    layers: int
    heads: int
    kv_heads: int
    ov_copying: list[list[float | None]] | None = Field(
        description="[layer][head] the OV copying score (Elhage et al. 2021): the eigenvalues of the OV circuit "
        "from tokens to logits (W_E W_V W_O W_U), their sum over the sum of their absolute values, in [-1, 1]; "
        "positive: the head raises the logit of the token it attends to. Null for a model without an unembedding "
        "(null entries: a head whose circuit is zero)")
    composition_q: Matrix = Field(description="[writer][reader] Q-composition ||OV_w QK_r|| / (||OV_w|| ||QK_r||), "
                                  "heads by flat index layer * heads + head; 0 unless the reader's layer is later")
    composition_k: Matrix = Field(description="[writer][reader] K-composition ||OV_w QK_r^T|| / (||OV_w|| ||QK_r||)")
    composition_v: Matrix = Field(description="[writer][reader] V-composition ||OV_w OV_r|| / (||OV_w|| ||OV_r||)")
    timing_ms: dict[str, float]


@dataclass(frozen=True)
class Circuits:
    """A model's weight-space circuits (analysis/circuits.py): no text."""
    ov_copying: np.ndarray | None     # [L, H]; None without an unembedding
    composition: Composition
    seconds: float
    tokens: tuple = ()


@dataclass(frozen=True, kw_only=True)
class CircuitsPlan(Plan):
    """The model's OV copying and composition scores, from its weights: computed once per model, in the background
    (circuits_of), never in a run slot; the request waits for it when it is still under way."""
    circuits: Future

    async def compute(self, runner: Runner) -> Computed:
        ready = self.circuits.done()
        # shielded: a client that goes away must not cancel the shared result while it waits in the thread's queue
        return Computed(await asyncio.shield(asyncio.wrap_future(self.circuits)), ready, {})

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def circuits_file(rt: Runtime) -> Path:
    """Where a model's circuits are kept beside its graphs: keyed by its weights and graphs (GraphCache.key) and by
    the code that computes them."""
    code = Path(circuits_module.__file__).read_bytes()
    return rt.cache_dir / f"circuits-{hash_of([rt.key, hashlib.sha256(code).hexdigest()])}.npz"


def _circuits(rt: Runtime) -> Circuits:
    """A model's weight-space circuits (analysis/circuits.py): read from the cache folder, or computed (seconds for
    SmolLM2: 500 GFLOP of weight products) and kept there (written under a name of its own, then renamed; a
    read-only cache folder only means computing again next time)."""
    t0 = time.perf_counter()
    path = circuits_file(rt)
    try:
        with np.load(path) as f:
            ov = f["ov_copying"] if "ov_copying" in f else None
            return Circuits(ov, Composition(f["q"], f["k"], f["v"]), time.perf_counter() - t0)
    except (OSError, KeyError, ValueError):
        pass
    w = head_weights(rt.model)
    ov = ov_copying(rt.model, w) if rt.cfg.has_unembedding else None
    comp = composition(rt.model, w)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.npz")
    try:
        np.savez(tmp, q=comp.q, k=comp.k, v=comp.v, **({} if ov is None else {"ov_copying": ov}))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
    return Circuits(ov, comp, time.perf_counter() - t0)


def plan(ctx: Context, req: CircuitsRequest, binary: bool) -> CircuitsPlan:
    rt = checks.runtime(ctx, req.model, "circuits (/api/circuits)")
    checks.decomposable(rt, "weight-space circuits (QK = W_Q W_K^T, OV = W_V W_O)", qk=True, direct=True)
    checks.capable(rt, "circuits", "weight-space circuits (/api/circuits)")
    key = hash_of(["circuits", rt.spec.id, rt.key])
    n = rt.cfg.n_layers * rt.cfg.n_heads
    return CircuitsPlan(request=req, runtime=rt, encoding=None, key=key, etag=etag_of(key, req, binary),
                        binary=binary, size=3 * n * n * (4 if binary else 12) + 12 * n,
                        circuits=circuits_of(ctx, rt))


class Kept:
    """A server's circuits, one per model, and the lock that computes one model's weight products at a time."""

    def __init__(self):
        self.futures: dict[str, Future] = {}
        self.lock = threading.Lock()
        self.one_at_a_time = threading.Lock()

    def compute(self, fut: Future, rt: Runtime) -> None:
        with self.one_at_a_time:
            try:
                fut.set_result(_circuits(rt))
            except BaseException as e:  # noqa: BLE001 - every waiting request gets it (a 500: a bug)
                fut.set_exception(e)


def circuits_of(ctx: Context, rt: Runtime) -> Future:
    """The model's circuits: computed once, in a background thread (a daemon: it never holds up the server's
    exit), first asked for at start-up (warm) or by the first request; every later request reads the same
    result."""
    kept = ctx.keep("circuits", Kept)
    with kept.lock:
        fut = kept.futures.get(rt.spec.id)
        if fut is None:
            fut = kept.futures[rt.spec.id] = Future()
            threading.Thread(target=kept.compute, args=(fut, rt), daemon=True,
                             name=f"attnscope-circuits-{rt.spec.id}").start()
        return fut


def warm(ctx: Context) -> None:
    """At start-up, in the background: what each model's first request would otherwise wait for, its circuits
    (seconds of weight products for SmolLM2), where they fit ATTNSCOPE_PRECOMPUTE_MB; larger models' come with
    their first /api/circuits. The server answers meanwhile; a request for them waits for the result."""
    for rt in ctx.runtimes.values():
        cfg = rt.cfg
        # the largest of composition's products: one writer layer against every later reader, float32
        mb = 4 * cfg.d_model * cfg.n_layers * cfg.n_heads * cfg.d_head / 2 ** 20
        if isinstance(rt, EncoderDecoderRuntime) or mb > ctx.settings.precompute_mb or \
                not rt.capabilities.allows("circuits"):      # a request for them is refused (its TFLOP)
            continue
        try:
            checks.decomposable(rt, "circuits", qk=True, direct=True)
        except Refused:
            continue
        circuits_of(ctx, rt)


def payload(plan, computed) -> dict:
    """Weight-space circuits (Circuits)."""
    r, cfg = computed.result, plan.runtime.cfg
    ov = None if r.ov_copying is None else [[None if np.isnan(x) else float(x) for x in row] for row in r.ov_copying]
    return {"model": plan.request.model, "layers": cfg.n_layers, "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
            "ov_copying": ov, "composition_q": r.composition.q.astype(np.float32),
            "composition_k": r.composition.k.astype(np.float32), "composition_v": r.composition.v.astype(np.float32)}


class WeightCircuits(Answer):
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


def body() -> dict:
    """POST /api/circuits: each head's OV copying score and Q/K/V-composition between every pair of heads."""
    return {}


def tool(api, model: ModelId = None, composition: Literal["q", "k", "v"] = "k", top: Top = TOP) -> dict:
    a = api.circuits(model=model)
    names = a.coords()["writer"]
    out = {"model": a.model, "layers": a.layers, "heads": a.heads,
           f"top_{composition}_composition": [{"writer": names[i], "reader": names[j], "score": number(v)} for i, j, v
                                              in top_heads(a[f"composition_{composition}"], top, by_abs=False)]}
    if a.data.get("ov_copying") is not None:
        out["top_ov_copying"] = top_of(a["ov_copying"], top, "score", by_abs=False)
    return out


ANALYSIS = Analysis(
    name="circuits", tag="circuits", summary="Weight-space circuits: each head's OV copying score, and Q-, K- and "
    "V-composition between heads", description=__doc__.split("\n", 1)[0][len("POST /api/circuits: "):] + " " +
    __doc__.split("\n", 1)[1].replace("\n", " ").strip(), request=CircuitsRequest, response=CircuitsResponse,
    plan=plan, example={}, methods=(Method("circuits", body, WeightCircuits),), warm=warm,
    tools=(Tool("circuits", "Weight-space circuits (no text): the heads that copy the tokens they attend to most "
                "(OV copying), and the strongest K-, Q- or V-composition between heads.", tool),),
    page=("model", "precision"))
