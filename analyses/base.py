"""What every analysis is made of: its entry in the registry (Analysis), the plan a request is validated into (Plan),
what the plan's runs computed (Computed), and the context planning reads (Context).

    plan = analysis.plan(ctx, req, binary)     # every check that needs only the request, the model and the tokens
    computed = await plan.compute(runner)      # its runs, from the cache or the run queue (analyses/runs.py)
    body = plan.payload(computed)              # pure functions of the analysis' own module

A module of analyses/ holds one analysis whole: its request and answer models, its checks and price, its plan, its
payload, its Python answer class, its Python methods and its MCP tools. analyses/registry.py lists them; the REST
routes, the Python API (in-process and Client), the MCP tools, the OpenAPI examples and the page's fetch layer are
all made from that list, so an analysis is added in its own file and one registry line.
"""
from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Literal

import orjson

from . import __version__
from .runs import Run, RunProgress, Runner


def fields(**given) -> dict:
    """A request body of the fields given (None: the API's default)."""
    return {k: v for k, v in given.items() if v is not None}


def hash_of(material) -> str:
    """A content hash (a run's cache key) of JSON-able material."""
    return hashlib.sha256(orjson.dumps(material)).hexdigest()[:32]


def etag_of(key: str, req, binary: bool) -> str:
    """The ETag of an answer: its run, every option of the request, the wire form."""
    return 'W/"' + hash_of([__version__, key, req.model_dump(mode="json"), binary]) + '"'


# ---- the registry's entries ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """A Python method of the analysis (in-process Model and Client alike): `body(*args, **kwargs)` builds the
    request body from the method's arguments (its signature and docstring are the method's, plus `model=`), and
    `answer` reads the decoded payload. lines: the answer is a stream of lines (generation)."""
    name: str
    body: Callable[..., dict]
    answer: type
    lines: bool = False


@dataclass(frozen=True)
class Tool:
    """An MCP tool: `call(api, **arguments)` answers a compact dict from the Python API's answers (never a whole
    [layer, head, query, key] array); its signature past `api` is the tool's input schema."""
    name: str
    description: str
    call: Callable[..., dict]


@dataclass(frozen=True)
class Analysis:
    """One analysis, as every surface serves it. POST /api/{name} takes `request` and answers `response`."""
    name: str                              # the endpoint's last segment, the Python method's and the MCP tool's name
    tag: str                               # the OpenAPI tag, one router per tag
    summary: str                           # one line, the OpenAPI summary
    description: str                       # the OpenAPI description
    request: type                          # its pydantic request model
    response: type | None                  # its pydantic answer model (None: a stream of lines)
    plan: Callable[[Context, Any, bool], Any]    # (ctx, request, binary) -> its plan: validated and priced
    example: dict                          # a request body (without `model`) every model it serves takes
    methods: tuple[Method, ...] = ()
    tools: tuple[Tool, ...] = ()
    stream: Literal["layers", "runs", "tokens"] | None = None   # what its NDJSON form streams, if it has one
    needs: tuple[str, str] | None = None   # the ModelInfo flag a model needs for it and its words ("predictions",
    #                                        "an LM head"): the OpenAPI lists only those models in its request body
    page: tuple[str, ...] = ()             # the request fields the page sends (its fetch layer keeps only these)
    form: Literal["binary", "json"] = "json"   # how the page fetches the answer
    warm: Callable[[Context], None] | None = None   # at start-up, after the models load: work its first request
    #                                                  would otherwise wait for

    @property
    def path(self) -> str:
        return f"/api/{self.name}"


def signature_of(body: Callable[..., dict]) -> inspect.Signature:
    """A Method's Python signature: its body's, with `model` keyword-only at the end."""
    sig = inspect.signature(body)
    params = list(sig.parameters.values())
    model = inspect.Parameter("model", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None")
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    return sig.replace(parameters=params[:at] + [model] + params[at:])


# ---- planning ------------------------------------------------------------------------------------------------------
class Context:
    """What planning reads: the served models (`runtimes`, replaced as each loads), every configured model's state
    while it loads (`states`) and spec (`specs`), the settings' limits, and what an analysis keeps for the server's
    life (`kept`: a model's circuits, its induction probe's tokens)."""

    def __init__(self, runtimes: dict, settings, states: dict[str, str] | None = None):
        self.runtimes, self.settings = runtimes, settings
        self.states = {} if states is None else states
        self.specs: dict = {}
        self.kept: dict[str, Any] = {}

    def keep(self, name: str, make: Callable[[], Any]) -> Any:
        """What an analysis keeps under `name` for the server's life, made once."""
        if name not in self.kept:
            self.kept[name] = make()
        return self.kept[name]

    @property
    def max_chars(self) -> int:
        """Characters of text (+ text_pair) a request may send: ATTNSCOPE_MAX_CHARS, or derived from the models."""
        specs = self.specs or {i: rt.spec for i, rt in self.runtimes.items()}   # loaded or not: one limit from start
        return self.settings.chars_limit([spec.max_tokens for spec in specs.values()])


@dataclass(frozen=True)
class Computed:
    """A plan's results: its own run's and the extra runs the answer compares it with."""
    result: object
    hit: bool
    extra: dict[str, object]

    @property
    def tokens(self) -> list[str]:
        return self.result.tokens


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What every plan has: its request, its model, its runs' key, how its answer is sent and how big it is."""
    request: Any
    runtime: Any
    encoding: Any                    # the text's tokens; None: a plan of the model alone (circuits)
    key: str                         # content hash of the model run (the cache key)
    etag: str                        # of the answer: the run, every option, the wire form
    binary: bool
    size: int                        # bytes of the answer: its share of the sending budget

    @property
    def dtype(self) -> str:
        return getattr(self.request, "dtype", "float32")

    @property
    def kept(self) -> bool:
        """Whether its binary answer is kept on disk (app/kept.py): a long text's, run layer by layer (its plan has a
        walk_key: analyses/attention.LayerwisePlan), worth minutes to run again."""
        return hasattr(type(self), "walk_key")

    @property
    def precision(self) -> int | None:
        return getattr(self.request, "precision", None)

    @property
    def light(self) -> bool:
        """Whether its payload and encoding take a millisecond or two: then they are built on the event loop, where
        a worker thread's two hand-offs would be a fair share of the answer (app/sending.py). False by default."""
        return False

    def progress(self, runner: Runner) -> RunProgress | None:
        """What a progress stream shows while the plan runs (None: nothing to show)."""
        return None

    def progress_line(self, progress: RunProgress) -> dict:
        """One progress line of the NDJSON stream: the blocks of a layer-by-layer run done."""
        return {"layer": progress.done, "layers": progress.total}

    async def compute(self, runner: Runner) -> Computed:
        raise NotImplementedError

    def payload(self, computed: Computed) -> dict:
        """The answer as a plain dict (pure: the analysis' payload functions)."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class OneRunPlan(Plan):
    """A plan whose answer comes from one run."""
    run: Run

    async def compute(self, runner: Runner) -> Computed:
        result, hit = await runner.result(self.run)
        return Computed(result, hit, {})


@dataclass(frozen=True, kw_only=True)
class ManyRunsPlan(OneRunPlan):
    """A plan whose one run is many runs (Run.steps: every head knocked out, every head patched): its progress is
    the runs done of all, with the time left; it stops between them once nobody waits for it."""

    def progress(self, runner: Runner) -> RunProgress:
        return runner.watch(self.run.key)

    def progress_line(self, progress: RunProgress) -> dict:
        return {"runs": progress.done, "runs_total": progress.total, "eta_s": progress.eta()}

    async def compute(self, runner: Runner) -> Computed:
        try:
            return await super().compute(runner)
        finally:
            runner.unwatch(self.run.key)
