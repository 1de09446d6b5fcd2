"""A request, validated once into the plan of its kind; the plan knows how to run itself.

    plan = planner.attention(req, binary)      # every check that needs only the request, the model and the tokens
    computed = await plan.compute(runner)      # its runs, from the cache or the run queue (app/runs.py)
    body = plan.payload(computed)              # pure functions (app/payload.py)

One class per kind, told apart by nobody after planning:

    AttentionPlan   /api/attention, a text whose every layer's attention fits the stacked graph's output
    EncoderDecoderPlan  /api/attention for an encoder-decoder: encoder, decoder and cross-attention in one run
    LayerwisePlan   /api/attention, a longer text: run layer by layer, keeping only what the answer needs
    StagesPlan      /api/stages, every step of one head
    EncoderDecoderStagesPlan  /api/stages for an encoder-decoder: one head of one of its three attentions
    ImportancePlan  /api/importance, every head's single-head ablation
    PatchingPlan    /api/patching, activation patching between two texts
    PathPatchingPlan  /api/path_patching, path patching from sender heads to receivers' inputs (or the logits)
    KnockoutPlan    /api/knockout, attention knockout's effect on the prediction
    GeneratePlan    /api/generate, token by token: its lines are streamed as each step is done
    QKPlan          /api/qk, one head's score at one cell split into the stream's components (a traced run)
    LensPlan        /api/lens, the logit lens of a text and of one head (the same traced run)
    CircuitsPlan    /api/circuits, weight-space circuits: OV copying and composition scores (no text)
    JobPlan         POST /api/jobs, a corpus job: its id, its corpus on disk (checked and counted), its options

The text is tokenised here, once; its token count decides the kind and sizes the answer (`size`, the bytes the
sending budget reserves), so whatever a run cannot give is refused before any work.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import orjson

from . import __version__
from ..analysis.attribution import attribution
from ..analysis import circuits as circuits_module
from ..analysis.circuits import Composition, composition, head_weights, ov_copying
from ..analysis.lens import HeadLens, Lens, head_lens, logit_lens
from ..analysis.effects import Metric
from ..analysis.scores import probe_ids
from ..model.functional import softmax
from ..model.transformer import logits
from ..model.weights import state_dict
from ..runtime import Encoding, Runtime
from ..runtime.encdec import EncoderDecoderRuntime
from ..runtime.capabilities import inexact
from ..runtime.interventions import Interventions, Trace, head_importance, head_masks, reference_trace
from ..runtime.generation import Generator, Sampling
from ..runtime.patching import knock_out, patch, path_patch
from ..runtime.layerwise import LayerwiseResult, Want, checkpoint_spacing
from . import payload
from .errors import LOADING_RETRY_S, Loading, Refused, TooLarge, UnknownModel
from ..corpus import bundled
from ..corpus.atlas import CorpusError, ExampleOptions, count_texts
from ..sources import get as zoo_model
from .runs import Run, RunProgress, Runner
from .schemas import (AttentionRequest, CircuitsRequest, GenerateRequest, ImportanceRequest, JobRequest,
                      KnockoutRequest, LensRequest, PatchingRequest, PathPatchingRequest, QKRequest,
                      StagesRequest)
from .settings import Settings

UP_TO_LAYER = {"attention", "entropy", "summary", "scores"}   # answer parts of the asked layers alone: a run for them
#                                                               stops at the last (Runtime.depth_of)
PROBE_TOKENS = 50   # the induction probe: this many random tokens, repeated once
CHECKPOINTS_SHARE = 0.5   # of the result cache one layer-by-layer run's checkpoints may take (checkpoint_spacing): the
#                           rest of its kept parts (rows, thumbnails, the ends) and other results need the remainder


@dataclass(frozen=True)
class JobPlan:
    """A corpus job, checked: its id (a hash of what it computes), the corpus file it reads (the bundled corpus, or
    the upload stored under its content's hash) with its format and column, its name in the API, how many texts it
    reads, and the store's options. staged: an upload's temporary file, which becomes `path` when the job is queued
    (app/jobs.py Jobs.submit) and is removed otherwise."""
    id: str
    request: JobRequest
    runtime: Runtime
    path: object
    fmt: str
    column: str | None
    corpus: str
    texts: int
    examples: ExampleOptions
    staged: object = None


@dataclass(frozen=True)
class Computed:
    """A plan's results: its own run's and the extra runs the answer compares it with."""
    result: object
    hit: bool
    extra: dict[str, object]

    @property
    def tokens(self) -> list[str]:
        return self.result.tokens


@dataclass(frozen=True)
class Importance:
    """Every head's single-head ablation effect on one text (runtime.interventions.head_importance)."""
    tokens: list[str]
    values: np.ndarray     # [L, H]
    baseline: float
    seconds: float
    lm: bool               # measured on log-probs (an LM head) or on the embedding


@dataclass(frozen=True)
class Attributed:
    """Direct logit attribution of one run (analysis/attribution.py), with the model's own logit (difference)."""
    tokens: list[str]
    metric: Metric
    position: int
    parts: object          # attribution.Attribution
    logit: float
    typed: str = ""        # the target as the request gave it
    ranks: dict = field(default_factory=dict)   # id -> (rank, probability) at the position: the target's, and the
    #                                             other spelling's (Vocabulary.respelled) when there is one
    other: int | None = None


@dataclass(frozen=True)
class Lensed:
    """The logit lens of a traced text, and one head's when asked (analysis/lens.py)."""
    tokens: list[str]
    lens: Lens
    head: HeadLens | None
    seconds: float


@dataclass(frozen=True)
class Circuits:
    """A model's weight-space circuits (analysis/circuits.py): no text."""
    ov_copying: np.ndarray | None     # [L, H]; None without an unembedding
    composition: Composition
    seconds: float
    tokens: tuple = ()


# ---- the plans --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Plan:
    """What every plan has: its model, its runs' key, how its answer is sent and how big it is."""
    request: AttentionRequest | StagesRequest | ImportanceRequest
    runtime: Runtime
    encoding: Encoding | None        # None: a plan of the model alone (circuits)
    key: str              # content hash of the model run (the cache key)
    etag: str             # of the answer: the run, every option, the wire form
    binary: bool
    size: int             # bytes of the answer: its share of the sending budget

    @property
    def dtype(self) -> str:
        return getattr(self.request, "dtype", "float32")

    @property
    def precision(self) -> int | None:
        return self.request.precision

    def progress(self, runner: Runner) -> RunProgress | None:
        """What a progress stream shows while the plan runs (None: nothing to show)."""
        return None

    def progress_line(self, progress: RunProgress) -> dict:
        """One progress line of the NDJSON stream: the blocks of a layer-by-layer run done."""
        return {"layer": progress.done, "layers": progress.total}

    async def compute(self, runner: Runner) -> Computed:
        raise NotImplementedError

    def payload(self, computed: Computed) -> dict:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class AttentionPlan(Plan):
    """One forward pass of the stacked graph (or the NumPy reference), and the extra runs the answer needs: the
    intact run an ablation is compared with ("baseline"), the induction probe ("probe")."""
    layers: list[int]
    heads: list[int]
    run: Run
    extras: dict[str, Run]

    async def compute(self, runner: Runner) -> Computed:
        whole = runner.cache.get(self.key) if self.run.key != self.key else None   # a run that stops early: a
        result, hit = (whole, True) if whole is not None else await runner.result(self.run)   # whole one answers too
        return Computed(result, hit, {name: (await runner.result(run))[0] for name, run in self.extras.items()})

    def payload(self, computed: Computed) -> dict:
        return payload.attention(self, computed)


@dataclass(frozen=True, kw_only=True)
class EncoderDecoderPlan(Plan):
    """/api/attention for an encoder-decoder: one run of both stacks (runtime/encdec.py)."""
    layers: list[int]
    heads: list[int]
    run: Run

    async def compute(self, runner: Runner) -> Computed:
        result, hit = await runner.result(self.run)
        return Computed(result, hit, {})

    def payload(self, computed: Computed) -> dict:
        return payload.encoder_decoder(self, computed)


@dataclass(frozen=True, kw_only=True)
class LayerwisePlan(Plan):
    """A long text, layer by layer (runtime/layerwise.py). Its kept parts (rows, checkpoints, thumbnails) are cached
    under `key`, shared by every request on this text; what a request asks of its heads (want) is computed in the
    same pass on a first run, recomputed from the checkpoints later."""
    layers: list[int]
    heads: list[int]
    extras: dict[str, Run]
    want: Want
    every: int
    group_mb: float
    head_mask: np.ndarray | None
    head_mean: np.ndarray | None

    @property
    def walk_key(self) -> str:
        """The key of the run that computes this plan's asked parts (the kept parts' key is `key`)."""
        return _hash([self.key, repr(self.want), self.every])

    def progress(self, runner: Runner) -> RunProgress:
        return runner.watch(self.walk_key)

    async def compute(self, runner: Runner) -> Computed:
        base = runner.cache.get(self.key)
        try:
            if base is not None and not _lacks(base, self.want):
                result, hit = base, True
            else:
                result, hit = await runner.result(Run(self.walk_key, self._walk(base, self.progress(runner))))
                if base is None:
                    runner.cache.put(self.key, replace(result, asked=None))
        finally:
            runner.unwatch(self.walk_key)
        return Computed(result, hit, {name: (await runner.result(run))[0] for name, run in self.extras.items()})

    def _walk(self, base: LayerwiseResult | None, progress: RunProgress) -> Callable[[], LayerwiseResult]:
        """The run: from scratch, or the asked parts from a cached run's checkpoints."""
        req, lw = self.request, self.runtime.layerwise(self.every, self.group_mb)
        if base is not None:
            return lambda: lw.recompute(base, self.want, progress.update)
        return lambda: lw.forward(self.encoding, causal=req.causal, mask_tokens=req.mask_tokens or None,
                                  head_mask=self.head_mask, head_mean=self.head_mean, want=self.want,
                                  progress=progress.update)

    def payload(self, computed: Computed) -> dict:
        return payload.layerwise_attention(self, computed)


def _lacks(base: LayerwiseResult, want: Want) -> bool:
    """Whether a run's kept parts miss something `want` asks for (its heads' parts are never kept)."""
    thumbs = base.thumbnails.get(want.resolution, {})
    return bool(want.block_outputs()) or bool(want.resolution and any(l not in thumbs for l in want.layers))


@dataclass(frozen=True, kw_only=True)
class OneRunPlan(Plan):
    """A plan whose answer comes from one run."""
    run: Run

    async def compute(self, runner: Runner) -> Computed:
        result, hit = await runner.result(self.run)
        return Computed(result, hit, {})


@dataclass(frozen=True, kw_only=True)
class StagesPlan(OneRunPlan):
    """One forward pass with the teaching stages, for one head's every step."""
    layer: int
    head: int

    def payload(self, computed: Computed) -> dict:
        return payload.stages(self, computed)


@dataclass(frozen=True, kw_only=True)
class EncoderDecoderStagesPlan(StagesPlan):
    """/api/stages for an encoder-decoder: one head of its encoder's, its decoder's or its cross-attention."""
    attention: str

    def payload(self, computed: Computed) -> dict:
        return payload.encoder_decoder_stages(self, computed)


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


@dataclass(frozen=True, kw_only=True)
class ImportancePlan(ManyRunsPlan):
    """Every head's single-head ablation, batched along the batch axis."""

    def payload(self, computed: Computed) -> dict:
        return payload.importance(self, computed)


@dataclass(frozen=True, kw_only=True)
class PatchingPlan(ManyRunsPlan):
    """Every (layer, head) of a site patched between two texts (runtime/patching.py)."""
    corrupt: Encoding
    metric: Metric

    def payload(self, computed: Computed) -> dict:
        return payload.patching(self, computed)


@dataclass(frozen=True, kw_only=True)
class PathPatchingPlan(PatchingPlan):
    """Path patching from senders to receivers (runtime/patching.py path_patch)."""

    def payload(self, computed: Computed) -> dict:
        return payload.path_patching(self, computed)


@dataclass(frozen=True, kw_only=True)
class KnockoutPlan(OneRunPlan):
    """One run with queries blocked from keys in a range of layers, and the intact one."""

    def payload(self, computed: Computed) -> dict:
        return payload.knockout(self, computed)


@dataclass(frozen=True, kw_only=True)
class QKPlan(OneRunPlan):
    """One head's scaled score at one cell split into the stream's components (analysis/qk.py), from the text's
    traced run: the run is shared by every head and cell of the text (and by the lens); the split is the payload's."""

    def payload(self, computed: Computed) -> dict:
        return payload.qk(self, computed)


@dataclass(frozen=True, kw_only=True)
class LensPlan(Plan):
    """The logit lens (and one head's) of the text's traced run: two cached runs, the trace and the lens of it."""
    run: Run                                  # the trace
    lens_key: str
    lens: Callable[[Trace], Lensed]

    async def compute(self, runner: Runner) -> Computed:
        trace, _ = await runner.result(self.run)
        result, hit = await runner.result(Run(self.lens_key, functools.partial(self.lens, trace)))
        return Computed(result, hit, {})

    def payload(self, computed: Computed) -> dict:
        return payload.lens(self, computed)


@dataclass(frozen=True, kw_only=True)
class CircuitsPlan(Plan):
    """The model's OV copying and composition scores, from its weights: computed once per model, in the background
    (Planner.circuits_of), never in a run slot; the request waits for it when it is still under way."""
    circuits: Future

    async def compute(self, runner: Runner) -> Computed:
        ready = self.circuits.done()
        # shielded: a client that goes away must not cancel the shared result while it waits in the thread's queue
        return Computed(await asyncio.shield(asyncio.wrap_future(self.circuits)), ready, {})

    def payload(self, computed: Computed) -> dict:
        return payload.circuits(self, computed)


def _block_flops(rt: Runtime, T: int) -> float:
    """Float operations of one token through one block: a multiply and an add per weight, and the scores and the
    weighted values against T keys."""
    cfg = rt.cfg
    weights = sum(w.size for name, w in state_dict(rt.model).items() if name.startswith("blocks.")) / cfg.n_layers
    return 2 * weights + 4 * T * cfg.n_heads * cfg.d_head


def _circuits_file(rt: Runtime) -> Path:
    """Where a model's circuits are kept beside its graphs: keyed by its weights and graphs (GraphCache.key) and by
    the code that computes them."""
    code = Path(circuits_module.__file__).read_bytes()
    return rt.cache_dir / f"circuits-{_hash([rt.key, hashlib.sha256(code).hexdigest()])}.npz"


def _circuits(rt: Runtime) -> Circuits:
    """A model's weight-space circuits (analysis/circuits.py): read from the cache folder, or computed (seconds for
    SmolLM2: 500 GFLOP of weight products) and kept there (written under a name of its own, then renamed; a
    read-only cache folder only means computing again next time)."""
    t0 = time.perf_counter()
    path = _circuits_file(rt)
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


# ---- planning -------------------------------------------------------------------------------------------------
@dataclass
class GeneratePlan:
    """/api/generate: the prompt's tokens and the generation's options, checked; `lines` runs it, a step at a time,
    each step waiting for a run slot like any run (app/runs.py Runner.step)."""
    request: GenerateRequest
    runtime: Runtime
    encoding: Encoding
    sampling: Sampling
    ablate: list[tuple[int, int]]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    seconds: float
    chunk_bytes: int

    def generator(self) -> Generator:
        L, H = self.runtime.cfg.n_layers, self.runtime.cfg.n_heads
        keep = head_masks(self.ablate, "zero", L, H)[0]
        return Generator(self.runtime, list(self.encoding.ids), self.sampling, self.request.max_new_tokens, keep,
                         tuple(self.request.stop), self.layers, self.heads, time.monotonic() + self.seconds,
                         self.chunk_bytes)

    async def lines(self, runner: Runner, started: float):
        """A line per new token ({"token": ...}), then {"done": ...}; a client that goes away stops it between two
        steps (the response stops asking for lines)."""
        gen = self.generator()
        await runner.step(gen.prefill)
        prompt = time.perf_counter()
        while gen.stop_reason is None:
            token = await runner.step(gen.__next__, admit=False)
            yield payload.generated(self, token, gen.text)
        end = time.perf_counter()
        n = max(len(gen.new_ids), 1)
        yield payload.generation_done(self, gen, {"prompt": (prompt - started) * 1000, "total": (end - started) * 1000,
                                                  "per_token": (end - prompt) * 1000 / n})


def chat_prompt(generation, text: str) -> str:
    """The prompt as a user message in the model's chat template (its own files' Jinja2, rendered as transformers'
    apply_chat_template renders it: sandboxed, trim_blocks and lstrip_blocks), with the assistant's turn opened."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if generation is None or not generation.chat_template:
        raise Refused("this model's files have no chat template: send the prompt as it is (chat false)")

    def raise_exception(message):
        raise TemplateError(message)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(generation.chat_template).render(
            messages=[{"role": "user", "content": text}], add_generation_prompt=True,
            bos_token=generation.bos_token, eos_token=generation.eos_token)
    except TemplateError as e:
        raise Refused(f"the model's chat template refused this prompt: {e}") from None


def _hash(material) -> str:
    return hashlib.sha256(orjson.dumps(material)).hexdigest()[:32]


def _etag(key: str, req, binary: bool) -> str:
    return 'W/"' + _hash([__version__, key, req.model_dump(mode="json"), binary]) + '"'


def attention_size(req: AttentionRequest, layers: int, heads: int, T: int, binary: bool) -> tuple[int, int]:
    """The one estimate of an attention answer's size over T tokens: (attention values, bytes on the wire)."""
    side = min(T, req.resolution or T)
    cells = layers * heads * (T * min(req.top_k, T) if req.top_k else side * side) if "attention" in req.include else 0
    per = (4 if req.dtype == "float32" or req.top_k else 2) if binary else (req.precision or 9) + 3
    values = cells * (2 if req.top_k else 1)                       # top_k: its keys and its weights
    return cells, values * per + 64 * T * layers * heads + 100 * T


def _select(name: str, asked: list[int] | None, n: int) -> list[int]:
    if asked is None:
        return list(range(n))
    if not asked:
        raise Refused(f"{name} is empty: leave it out for all {n}, or list indices 0..{n - 1}")
    bad = [i for i in asked if i >= n]
    if bad:
        raise Refused(f"{name} {bad} out of range: this model has {n} {name} (0..{n - 1})")
    return list(dict.fromkeys(asked))


class Planner:
    """Validates each kind of request into its plan, against the served models and the settings' limits."""

    def __init__(self, runtimes: dict[str, Runtime], settings: Settings, states: dict[str, str] | None = None):
        """runtimes: the loaded models (the service replaces the dict as each loads); states: every configured model's
        state while it loads (app/service.py), so that a request for one still loading is told to retry."""
        self.runtimes, self.settings = runtimes, settings
        self.states = {} if states is None else states
        self.specs: dict = {}                              # every configured model's spec (the service's resolve)
        self._circuits: dict[str, Future] = {}             # model id -> its circuits, computed once
        self._circuits_lock = threading.Lock()
        self._one_at_a_time = threading.Lock()             # one model's weight products at a time

    @property
    def max_chars(self) -> int:
        """Characters of text (+ text_pair) a request may send: ATTNSCOPE_MAX_CHARS, or derived from the models."""
        specs = self.specs or {i: rt.spec for i, rt in self.runtimes.items()}   # loaded or not: one limit from start
        return self.settings.chars_limit([spec.max_tokens for spec in specs.values()])

    # ---- what every kind checks --------------------------------------------------------------------------------
    def runtime(self, model_id: str, what: str | None = None) -> Runtime:
        """The served model; `what`: the feature asked, which an encoder-decoder refuses (only /api/attention
        serves them)."""
        rt = self.runtimes.get(model_id)
        if rt is None:
            state = self.states.get(model_id)
            if state is not None and state != "ready":
                raise Loading(f"model {model_id!r} is still loading ({state}); retry in a few seconds (GET /healthz "
                              f"shows each model's state)", headers={"Retry-After": str(LOADING_RETRY_S)})
            shown = model_id if len(model_id) <= 64 else model_id[:64] + "…"
            raise UnknownModel(f"unknown model {shown!r}; available: {', '.join(self.states or self.runtimes)}")
        if what is not None and isinstance(rt, EncoderDecoderRuntime):
            raise Refused(f"{what} is not available for encoder-decoders ({model_id!r} is one): /api/attention "
                          f"gives their encoder, decoder and cross-attention")
        return rt

    def graph_file(self, model_id: str, stages: bool) -> Path:
        """The exported graph the model runs (GET /api/models/{id}/onnx), opened when it loaded; a graph its
        capabilities did not let it build is refused, never built here."""
        rt = self.runtime(model_id)
        if not isinstance(rt, EncoderDecoderRuntime):
            what = f"the {'stages ' if stages else ''}graph (GET /api/models/{{id}}/onnx)"
            self._capable(rt, "stacked", what)
            if stages:
                self._capable(rt, "stages", what)
        return rt.onnx_path(stages)

    def _capable(self, rt: Runtime, feature: str, what: str) -> None:
        """Refuse `what` where the model's size does not allow `feature` on this machine (runtime/capabilities.py),
        before any work, with the sentence that names the limit."""
        caps = getattr(rt, "capabilities", None)
        reason = caps.refusal(feature) if caps is not None else None
        if reason is not None:
            raise Refused(f"{what} is not available for model {rt.spec.id!r}: {reason}")

    def _text(self, req, what: str | None = None) -> tuple[Runtime, Encoding]:
        """The model and the text's tokens (the text's one tokenisation), within the character limit."""
        rt = self.runtime(req.model, what)
        pair = getattr(req, "text_pair", None)          # knockout takes one text
        self._chars(rt, "text is", req.text, pair)
        return rt, rt.vocabulary.encode(req.text, pair)

    def _chars(self, rt: Runtime, what: str, *texts: str | None) -> None:
        """The character limit, over every text of a request."""
        chars = sum(len(t or "") for t in texts)
        if chars > self.max_chars:
            raise TooLarge(f"{what} {chars} characters; the limit is {self.max_chars} (ATTNSCOPE_MAX_CHARS). "
                           f"The model reads at most {rt.spec.max_tokens} tokens anyway")

    def _run_options(self, req, rt: Runtime, enc: Encoding) -> None:
        """The options a forward pass takes (masks, ablations), checked against the model and the tokens."""
        if len(req.mask_tokens) > self.settings.max_mask_tokens:
            raise Refused(f"mask_tokens has {len(req.mask_tokens)} entries; the limit is "
                          f"{self.settings.max_mask_tokens} (ATTNSCOPE_MAX_MASK_TOKENS)")
        T = len(enc.ids)
        for j in req.mask_tokens:
            if j >= T:
                raise Refused(f"mask_tokens index {j} is out of range: this text has {T} tokens (0..{T - 1})")
        L, H = rt.cfg.n_layers, rt.cfg.n_heads
        bad = [pair for pair in req.ablate if pair[0] >= L or pair[1] >= H]
        if bad:
            raise Refused(f"ablate {bad[:5]} out of range: this model has layers 0..{L - 1} and heads 0..{H - 1}")

    def _run_key(self, req, rt: Runtime, stages: bool, ids=None) -> str:
        """Content hash of everything that determines a model run (and of the model's weights and graph)."""
        return _hash([req.model, rt.key, req.engine, req.text, req.text_pair, req.causal,
                      sorted(set(req.mask_tokens)), stages, sorted(map(tuple, req.ablate)),
                      req.ablation if req.ablate else None, ids])

    def _forward(self, req, rt: Runtime, enc: Encoding, stages: bool = False, want: Want | None = None) -> Callable:
        """The forward pass a request asks for, as a call for the run queue (want: what leaves the device;
        without its ends the run stops after the last asked layer, Runtime.depth_of)."""
        keep, mean = head_masks(req.ablate, req.ablation, rt.cfg.n_layers, rt.cfg.n_heads)
        options = dict(causal=req.causal, mask_tokens=[req.mask_tokens] if req.mask_tokens else None,
                       engine=req.engine, stages=stages, head_mask=keep, head_mean=mean, want=want)
        return lambda: rt.forward([enc], **options)[0]

    def _stacked_bytes(self, rt: Runtime, tokens: int) -> int:
        """What the stacked graph's attention output holds for a text of this many tokens (float32)."""
        return rt.cfg.n_layers * rt.cfg.n_heads * tokens * tokens * 4

    def fits_stacked(self, rt: Runtime, tokens: int) -> bool:
        return self._stacked_bytes(rt, tokens) <= self.settings.layerwise_mb * 2**20

    def _check_cells(self, req: AttentionRequest, cells: int, binary: bool) -> None:
        limit = self.settings.max_binary_cells if binary else self.settings.max_json_cells
        if cells > limit:
            raise Refused(f"this answer would hold {cells:,} attention values; the "
                          f"{'binary' if binary else 'JSON'} limit is {limit:,} "
                          f"(ATTNSCOPE_MAX_{'BINARY' if binary else 'JSON'}_CELLS). Ask for fewer layers or heads, "
                          f"set resolution" + ("" if binary else ", or ask for the binary form (Accept: "
                                                                 "application/vnd.attnscope.tensors)"))

    # ---- /api/attention -------------------------------------------------------------------------------------
    def attention(self, req: AttentionRequest, binary: bool) -> AttentionPlan:
        rt, enc = self._text(req)
        if isinstance(rt, EncoderDecoderRuntime):
            return self._encoder_decoder(req, rt, enc, binary)
        if req.decoder_text is not None:
            raise Refused(f"decoder_text is for encoder-decoders (T5, BART, Marian); {req.model!r} is "
                          f"{'an' if rt.spec.kind == 'encoder' else 'a'} {rt.spec.kind}: leave it out")
        layers = _select("layers", req.layers, rt.cfg.n_layers)
        heads = _select("heads", req.heads, rt.cfg.n_heads)
        self._run_options(req, rt, enc)
        if req.engine == "numpy":
            self._capable(rt, "numpy", "the NumPy reference (engine: numpy)")
        T = len(enc.ids)
        if req.position is not None and req.position >= T:
            raise Refused(f"position {req.position} is out of range: this text has {T} tokens (0..{T - 1})")
        cells, size = attention_size(req, len(layers), len(heads), T, binary)
        key = self._run_key(req, rt, False)
        common = dict(request=req, runtime=rt, encoding=enc, key=key, etag=_etag(key, req, binary), binary=binary,
                      size=size, layers=layers, heads=heads)
        want = Want(tuple(layers), tuple(heads), ends=not (set(req.include) <= UP_TO_LAYER and req.engine == "onnx"))
        depth = rt.depth_of(want)
        if rt.capabilities.stacked and self.fits_stacked(rt, T) and not self._walks(req, rt, want, depth, T):
            self._check_cells(req, cells, binary)
            # a run that stops early keeps the asked blocks' attentions only (Runtime.forward): its key says which
            run = Run(key if depth is None else _hash([key, depth, layers]), self._forward(req, rt, enc, want=want))
            return AttentionPlan(run=run, extras=self._extras(req, rt, enc), **common)
        return self._layerwise(req, rt, enc, cells, common)

    def _walks(self, req: AttentionRequest, rt: Runtime, want: Want, depth: int | None, T: int) -> bool:
        """Whether a text the stacked graph takes runs layer by layer all the same (ATTNSCOPE_PREFER_LAYERWISE): the
        stacked run would fetch every layer's matrices for an answer that holds fewer -- some layers' matrices, or
        none (statistics, thumbnails, top-k keys: the walk computes them in the graph) -- and the walk gives it all."""
        prefer = self.settings.prefer_layerwise
        prefer = rt.weights.device != "cpu" if prefer is None else prefer
        matrices = "attention" in req.include and not req.top_k and not (req.resolution and T > req.resolution)
        held = len(want.layers) if matrices else 0                  # layers whose full matrices the answer holds
        return (prefer and depth is None and held < rt.cfg.n_layers and req.engine == "onnx"
                and not {"rollout", "attribution"} & set(req.include))

    def _encoder_decoder(self, req: AttentionRequest, rt: EncoderDecoderRuntime, enc: Encoding,
                         binary: bool) -> EncoderDecoderPlan:
        """/api/attention for an encoder-decoder: its three attentions, the layers and heads asked of each (a layer
        must be in both stacks). What reads one text's single stack (masks, ablation, statistics, ...) is refused."""
        given = req.model_fields_set
        unsupported = [name for name in ("text_pair", "causal", "resolution", "top_k", "target", "distractor",
                                         "position") if getattr(req, name) is not None]
        unsupported += [name for name in ("mask_tokens", "ablate") if getattr(req, name)]
        if "include" in given:
            unsupported += [f"include {part!r}" for part in req.include if part not in ("attention", "predictions")]
        if unsupported:
            raise Refused(f"{', '.join(unsupported)}: not available for encoder-decoders ({req.model!r} is one); "
                          f"they answer `attention`, `decoder_attention`, `cross_attention` and `predictions`")
        self._chars(rt, "text and decoder_text are", req.text, req.decoder_text)
        dec = rt.encode_decoder(req.decoder_text)
        layers = _select("layers", req.layers, min(rt.cfg.n_layers, rt.cfg.n_decoder_layers))
        heads = _select("heads", req.heads, rt.cfg.n_heads)
        S, T = len(enc.ids), len(dec.ids)
        cells = len(layers) * len(heads) * (S * S + T * T + T * S) if "attention" in req.include else 0
        self._check_cells(req, cells, binary)
        key = _hash([req.model, rt.key, req.engine, req.text, dec.ids])
        run = Run(key, lambda: rt.forward([enc], [dec], engine=req.engine)[0])
        per = 4 if binary else (req.precision or 9) + 3
        return EncoderDecoderPlan(request=req, runtime=rt, encoding=enc, key=key, etag=_etag(key, req, binary),
                                  binary=binary, size=cells * per + 100 * (S + T), layers=layers, heads=heads, run=run)

    def _extras(self, req: AttentionRequest, rt: Runtime, enc: Encoding) -> dict[str, Run]:
        """The runs an answer compares its run with: the text intact (`effect` of an ablation), the induction probe
        (`scores`)."""
        extras = {}
        if "effect" in req.include and req.ablate:
            intact = req.model_copy(update={"ablate": []})
            extras["baseline"] = Run(self._run_key(intact, rt, False), self._forward(intact, rt, enc))
        if "scores" in req.include:
            extras["probe"] = self._probe(req, rt)
        if "attribution" in req.include:
            extras["attribution"] = self._attribution(req, rt, enc)
        return extras

    def _attribution(self, req: AttentionRequest, rt: Runtime, enc: Encoding) -> Run:
        """Direct logit attribution of `target` (minus `distractor`) at `position`: a run that keeps every layer's
        head outputs and residual stream (runtime/interventions.py Trace)."""
        self._lm(rt, "attribution")
        if req.target is None:
            raise Refused("attribution needs `target`: the token whose logit is attributed (as next_tokens shows it)")
        if req.ablate:
            raise Refused("attribution is of the intact model: leave `ablate` out (or `attribution` out of include)")
        self._decomposable(rt, "direct logit attribution", direct=True, logits=True)
        self._capable(rt, "stacked", "direct logit attribution")
        T = len(enc.ids)
        self._patching_tokens(T, "attribution")
        position = T - 1 if req.position is None else req.position
        if position >= T:
            raise Refused(f"position {position} is out of range: this text has {T} tokens (0..{T - 1})")
        metric = self._metric(rt, req.target, req.distractor)
        other = rt.vocabulary.respelled(req.target, metric.target)    # "Mary" typed where " Mary" is a token too

        def call() -> Attributed:
            if req.engine == "numpy":       # the NumPy reference, as the request's own run
                trace = reference_trace(rt, enc, causal=req.causal, mask_tokens=req.mask_tokens or None)
            else:
                trace = Interventions(rt).trace(enc, causal=req.causal, mask_tokens=req.mask_tokens or None,
                                                keep=("residual", "head_output"))
            W = rt.model.unembedding                                       # [V, D]: two rows of it are read
            u = W[metric.target].astype(np.float64) - (0 if metric.distractor is None else W[metric.distractor])
            parts = attribution(rt.model, trace.sites["head_output"][:, :, position],
                                trace.sites["residual"][:, position], u)
            p = softmax(logits(rt.model, trace.hidden[position]).astype(np.float64))   # the next-token distribution
            ranks = {i: (int((p > p[i]).sum()) + 1, float(p[i])) for i in (metric.target, other) if i is not None}
            return Attributed(enc.tokens, metric, position, parts, float(trace.hidden[position] @ u), req.target,
                              ranks, other)
        key = _hash(["attribution", self._run_key(req, rt, False), metric.target, metric.distractor, position,
                     req.target])
        return Run(key, call)

    def _decomposable(self, rt: Runtime, what: str, qk: bool = False, scores: bool = False, direct: bool = False,
                      logits: bool = False) -> None:
        """Refuse `what` where the model's features make its decomposition inexact, in one line naming them all.
        qk: it splits a score bilinearly into stream components (QK-norm puts a norm of each query and key between
        them); scores: it is that split of the score itself (attention soft-capping bends the score after it);
        direct: it reads a head's output as its share of the stream (output norms, OLMo 2's and Gemma's, normalise
        the heads' sum before it joins); logits: it sums direct effects on a logit (final soft-capping bends it)."""
        cfg, m = rt.cfg, rt.spec.id
        over = "each head's" if cfg.qk_norm == "head" else "the whole projection's"
        long = {   # what `what` does that the field breaks, the field at length (capabilities.BENDS in few words)
            "qk_norm": ("splits the score bilinearly into stream components",
                        f"QK-norm (an RMSNorm over {over} queries and keys before the dot product)"),
            "attn_softcap": ("splits the score bilinearly into stream components",
                             "attention logit soft-capping (scores -> cap * tanh(scores / cap))"),
            "output_norms": ("reads each head's output as its direct share of the residual stream",
                             "post-norms (each attention and MLP output normed before it joins the residual stream)"),
            "final_softcap": ("sums each part's direct effect on the logit",
                              "final logit soft-capping (logits -> cap * tanh(logits / cap))")}
        found = [long[f] for f in inexact(cfg, qk=qk, scores=scores, direct=direct, logits=logits)]
        if not found:
            return
        does = " and ".join(dict.fromkeys(d for d, _ in found))
        norms = f", and model {m!r} normalises each sublayer's output before it joins the stream" \
            if direct and cfg.output_norms else ""
        raise Refused(f"{what} {does}{norms}: not exact for model {m!r}, which has {'; '.join(f for _, f in found)}")

    def _lm(self, rt: Runtime, what: str) -> None:
        if not rt.cfg.lm_head:
            with_lm = [m for m, r in self.runtimes.items() if r.cfg.lm_head]
            raise Refused(f"{what} reads next-token logits, and model {rt.spec.id!r} has no LM head; models with one: "
                          f"{', '.join(with_lm) or 'none served'}")

    def _patching_tokens(self, T: int, what: str) -> None:
        limit = self.settings.max_patching_tokens
        if T > limit:
            raise Refused(f"this text is {T} tokens; {what} keeps every layer's values of each token and takes at most "
                          f"{limit} (ATTNSCOPE_MAX_PATCHING_TOKENS)")

    def _metric(self, rt: Runtime, target: str, distractor: str | None) -> Metric:
        t = rt.vocabulary.token_id(target, "target")
        d = None if distractor is None else rt.vocabulary.token_id(distractor, "distractor")
        if d == t:
            raise Refused(f"target and distractor are the same token ({target!r}): the difference would be 0")
        return Metric(t, d)

    def _probe(self, req: AttentionRequest, rt: Runtime) -> Run:
        """The induction probe: PROBE_TOKENS random non-special tokens repeated twice, wrapped in the specials the
        tokenizer puts around any text (so [CLS] ... [SEP] for BERT), under this request's masks and ablations. It
        does not depend on the text: one run per model (and causal/ablation choice), cached."""
        ids = self._probe_ids(rt)
        probe = req.model_copy(update={"text": "", "text_pair": None, "mask_tokens": []})
        return Run(self._run_key(probe, rt, False, ids), self._forward(probe, rt, rt.encode_ids(ids)))

    @functools.cache   # noqa: B019 - one probe per model for the server's life
    def _probe_ids(self, rt: Runtime) -> tuple[int, ...]:
        n = min(PROBE_TOKENS, (rt.spec.max_tokens - 2) // 2)
        opening = rt.vocabulary.encode("a")
        first = opening.special.index(False)
        return tuple(opening.ids[:first] + probe_ids(rt.cfg.vocab_size, n, set(rt.special_ids()))
                     + opening.ids[first + 1:])

    def _layerwise(self, req: AttentionRequest, rt: Runtime, enc: Encoding, cells: int, common: dict) -> LayerwisePlan:
        """A text whose stacked attention would pass ATTNSCOPE_LAYERWISE_MB runs layer by layer; what such a run
        cannot give is refused here, before any work."""
        T = len(enc.ids)
        why = (f"this text is {T} tokens: every layer's attention together is "
               f"{self._stacked_bytes(rt, T) / 2**30:.1f} GiB, so it runs layer by layer (ATTNSCOPE_LAYERWISE_MB)"
               if rt.capabilities.stacked else f"model {rt.spec.id!r} runs layer by layer: "
               f"{rt.capabilities.refusal('stacked')}")
        if req.engine == "numpy":
            raise Refused(f"{why} on the onnx engine only; leave `engine` out")
        if "attribution" in req.include:
            self._patching_tokens(T, "attribution")
        if "rollout" in req.include:
            raise Refused(f"{why}, and rollout multiplies every layer's full matrices; leave `rollout` out of "
                          f"include, or shorten the text")
        self._check_cells(req, cells, common["binary"])
        include = set(req.include)
        attention = "attention" in include and not req.top_k
        thumbnails = attention and bool(req.resolution) and T > req.resolution
        want = Want(tuple(common["layers"]), tuple(common["heads"]), attention=attention and not thumbnails,
                    top_k=req.top_k if "attention" in include and req.top_k else 0, duplicate="scores" in include,
                    resolution=req.resolution if thumbnails else 0)
        every = checkpoint_spacing(rt.cfg, T, self.settings.checkpoint_every,
                                   self.settings.cache_mb * 2**20 * CHECKPOINTS_SHARE)
        group_mb = self.settings.layerwise_group_mb
        lw = rt.layerwise(every, group_mb)
        keep, mean = head_masks(req.ablate, req.ablation, rt.cfg.n_layers, rt.cfg.n_heads)
        extras = {}
        if "effect" in include and req.ablate:   # the same text intact: layer by layer too, asking nothing of its heads
            intact = req.model_copy(update={"ablate": []})
            extras["baseline"] = Run(self._run_key(intact, rt, False), lambda: lw.forward(
                enc, causal=req.causal, mask_tokens=req.mask_tokens or None, want=Want()))
        if "scores" in include:
            extras["probe"] = self._probe(req, rt)
        return LayerwisePlan(extras=extras, want=want, every=every, group_mb=group_mb, head_mask=keep,
                             head_mean=mean, **common)

    # ---- /api/stages ----------------------------------------------------------------------------------------------
    def stages(self, req: StagesRequest, binary: bool) -> StagesPlan:
        rt, enc = self._text(req)
        if isinstance(rt, EncoderDecoderRuntime):
            return self._encoder_decoder_stages(req, rt, enc, binary)
        given = [name for name in ("decoder_text", "attention") if getattr(req, name) is not None]
        if given:
            raise Refused(f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} for encoder-decoders (T5, BART, "
                          f"Marian); {req.model!r} is {'an' if rt.spec.kind == 'encoder' else 'a'} {rt.spec.kind}: "
                          f"leave {'them' if len(given) > 1 else 'it'} out")
        _select("layers", [req.layer], rt.cfg.n_layers)
        _select("heads", [req.head], rt.cfg.n_heads)
        self._run_options(req, rt, enc)
        self._capable(rt, "stacked", "the stages of a head (/api/stages, which runs every layer's teaching outputs "
                                     "in one graph)")
        self._capable(rt, "stages", "the stages of a head (/api/stages)")
        T = len(enc.ids)
        if not self.fits_stacked(rt, T):
            raise Refused(f"this text is {T} tokens: every layer's attention together is "
                          f"{self._stacked_bytes(rt, T) / 2**30:.1f} GiB, so it runs layer by layer "
                          f"(ATTNSCOPE_LAYERWISE_MB), and the stages of one head come from the graph that holds every "
                          f"layer; ask /api/attention for its probabilities, or shorten the text")
        n = min(req.limit or T, T)
        key = self._run_key(req, rt, True)
        return StagesPlan(request=req, runtime=rt, encoding=enc, key=key, etag=_etag(key, req, binary),
                          binary=binary, size=8 * n * (n + rt.cfg.d_head) * (4 if binary else 12),
                          layer=req.layer, head=req.head, run=Run(key, self._forward(req, rt, enc, stages=True)))

    def _encoder_decoder_stages(self, req: StagesRequest, rt: EncoderDecoderRuntime, enc: Encoding,
                                binary: bool) -> EncoderDecoderStagesPlan:
        """The steps of one head of an encoder-decoder's `attention` (cross by default), from the NumPy reference run
        with every step kept (runtime/encdec.py). What reads one stack's run (masks, ablation, pairs) is refused."""
        unsupported = [name for name in ("text_pair", "causal") if getattr(req, name) is not None]
        unsupported += [name for name in ("mask_tokens", "ablate") if getattr(req, name)]
        if unsupported:
            raise Refused(f"{', '.join(unsupported)}: not available for encoder-decoders ({req.model!r} is one); "
                          f"their steps take text, decoder_text, attention, layer, head and limit")
        self._chars(rt, "text and decoder_text are", req.text, req.decoder_text)
        dec = rt.encode_decoder(req.decoder_text)
        which = req.attention or "cross"
        _select("layers", [req.layer], rt.cfg.n_layers if which == "encoder" else rt.cfg.n_decoder_layers)
        _select("heads", [req.head], rt.cfg.n_heads)
        nq, nk = (min(req.limit or n, n) for n in ((len(dec.ids) if which != "encoder" else len(enc.ids)),
                                                   (len(dec.ids) if which == "decoder" else len(enc.ids))))
        key = _hash(["stages", req.model, rt.key, req.text, dec.ids])
        run = Run(key, lambda: rt.forward([enc], [dec], stages=True)[0])
        return EncoderDecoderStagesPlan(request=req, runtime=rt, encoding=enc, key=key, etag=_etag(key, req, binary),
                                        binary=binary, size=8 * nq * (nk + rt.cfg.d_model) * (4 if binary else 12),
                                        layer=req.layer, head=req.head, run=run, attention=which)

    # ---- /api/importance ------------------------------------------------------------------------------------------
    def importance(self, req: ImportanceRequest, binary: bool) -> ImportancePlan:
        rt, enc = self._text(req, "head importance (/api/importance)")
        self._capable(rt, "importance", "head importance over every head (/api/importance)")
        T = len(enc.ids)
        self._patching_tokens(T, "importance")       # its run keeps every layer's values (runtime/interventions.py)
        layer = rt.cfg.n_heads * T * T * 4             # one copy's attention in one layer: what a batch holds at once
        if layer * req.batch > self.settings.layerwise_mb * 2**20:
            fits = int(self.settings.layerwise_mb * 2**20 // layer)
            fix = f"set batch to {fits} or less" if fits else "shorten the text"
            raise Refused(f"importance runs {req.batch} copies of this {T}-token text a layer at a time: their "
                          f"attention in one layer is {layer * req.batch / 2**20:.1f} MB, over ATTNSCOPE_LAYERWISE_MB "
                          f"({self.settings.layerwise_mb} MB); {fix}")
        key = _hash(["importance", req.model, rt.key, req.text, req.text_pair, req.ablation])

        def call(progress, stopped) -> Importance:
            t0 = time.perf_counter()
            values, baseline = head_importance(rt, enc, ablation=req.ablation, batch=req.batch, progress=progress,
                                               stop=stopped)
            return Importance(enc.tokens, values, baseline, time.perf_counter() - t0, rt.cfg.lm_head)
        return ImportancePlan(request=req, runtime=rt, encoding=enc, key=key, etag=_etag(key, req, binary),
                              binary=binary, size=16 * rt.cfg.n_layers * rt.cfg.n_heads + 100 * T,
                              run=Run(key, call, steps=True))

    # ---- /api/patching, /api/path_patching ------------------------------------------------------------------------
    def _two_texts(self, req, what: str) -> tuple[Runtime, Encoding, Encoding, Metric]:
        """A patching request's model (one with an LM head that runs the stacked graph), its two texts of one token
        count, tokenised, and its metric."""
        rt = self.runtime(req.model, what)
        self._lm(rt, "patching")
        self._capable(rt, "stacked", what)
        self._chars(rt, "clean and corrupt are", req.clean, req.corrupt)
        clean, corrupt = rt.vocabulary.encode(req.clean), rt.vocabulary.encode(req.corrupt)
        if len(clean.ids) != len(corrupt.ids):
            raise Refused(f"clean and corrupt must have the same token count: clean has {len(clean.ids)} tokens, "
                          f"corrupt has {len(corrupt.ids)}; patching puts each position's value into the same position")
        self._patching_tokens(len(clean.ids), "patching")
        return rt, clean, corrupt, self._metric(rt, req.target, req.distractor)

    def _patching_work(self, rt: Runtime, rows: int, T: int, passes: int = 1,
                       fix: str = "patch per (layer, head) (per_position false), or shorten the texts") -> None:
        """Every row runs the blocks from its own layer up, over every token (path patching: twice): L (L + 1) / 2
        block runs per row of each layer's rows. What that takes, in float operations, bounds how long the answer
        takes."""
        L = rt.cfg.n_layers
        gflop = passes * (rows // L) * L * (L + 1) // 2 * T * _block_flops(rt, T) / 1e9
        if gflop > self.settings.max_patching_gflop:
            raise Refused(f"this patching is {gflop:,.0f} GFLOP ({rows} rows, each running the blocks from its own "
                          f"layer up over {T} tokens); the limit is {self.settings.max_patching_gflop:,g} "
                          f"(ATTNSCOPE_MAX_PATCHING_GFLOP): {fix}")

    def patching(self, req: PatchingRequest, binary: bool) -> PatchingPlan:
        rt, clean, corrupt, metric = self._two_texts(req, "activation patching (/api/patching)")
        T, L, H = len(clean.ids), rt.cfg.n_layers, rt.cfg.n_heads
        rows = L * T if req.site == "residual" else L * H * (T if req.per_position else 1)
        if rows > self.settings.max_patching_runs:
            raise Refused(f"this patching is {rows} runs ({L} layers x {H} heads x {T} positions); the limit is "
                          f"{self.settings.max_patching_runs} (ATTNSCOPE_MAX_PATCHING_RUNS): patch per (layer, head) "
                          f"(per_position false), or shorten the texts")
        self._patching_work(rt, rows, T)
        key = _hash(["patching", req.model, rt.key, req.clean, req.corrupt, metric.target, metric.distractor,
                     req.site, req.per_position, req.direction])

        def call(progress, stopped):
            return patch(rt, clean, corrupt, metric, site=req.site, per_position=req.per_position,
                         direction=req.direction, progress=progress, stop=stopped)
        return PatchingPlan(request=req, runtime=rt, encoding=clean, key=key, etag=_etag(key, req, binary),
                            binary=binary, size=24 * rows + 200 * T, run=Run(key, call, steps=True),
                            corrupt=corrupt, metric=metric)

    def path_patching(self, req: PathPatchingRequest, binary: bool) -> PatchingPlan:
        rt, clean, corrupt, metric = self._two_texts(req, "path patching (/api/path_patching)")
        T, L, H = len(clean.ids), rt.cfg.n_layers, rt.cfg.n_heads
        pairs = {}
        for name in ("senders", "receivers"):
            asked = getattr(req, name)
            bad = [pair for pair in asked or () if pair[0] >= L or pair[1] >= H]
            if bad:
                raise Refused(f"{name} {bad[:5]} out of range: this model has layers 0..{L - 1} and heads 0..{H - 1}")
            pairs[name] = None if asked is None else tuple(sorted({(l, h) for l, h in asked}))
        rows = L * H if pairs["senders"] is None else 1
        self._patching_work(rt, max(rows, L), T, passes=2 if pairs["receivers"] else 1,
                            fix="name the senders (one run, not one per head), or shorten the texts")
        key = _hash(["path_patching", req.model, rt.key, req.clean, req.corrupt, metric.target, metric.distractor,
                     pairs["senders"], pairs["receivers"], req.receiver_input if pairs["receivers"] else None])

        def call():
            return path_patch(rt, clean, corrupt, metric, senders=pairs["senders"], receivers=pairs["receivers"],
                              receiver_input=req.receiver_input)
        return PathPatchingPlan(request=req, runtime=rt, encoding=clean, key=key, etag=_etag(key, req, binary),
                                binary=binary, size=24 * rows + 200 * T + 20 * len(req.senders or ()) + 20 * len(
                                    req.receivers or ()), run=Run(key, call), corrupt=corrupt, metric=metric)

    # ---- /api/knockout --------------------------------------------------------------------------------------------
    def knockout(self, req: KnockoutRequest, binary: bool) -> KnockoutPlan:
        rt, enc = self._text(req, "attention knockout (/api/knockout)")
        self._lm(rt, "knockout")
        self._capable(rt, "stacked", "attention knockout (/api/knockout)")
        T, L = len(enc.ids), rt.cfg.n_layers
        self._patching_tokens(T, "knockout")
        for name in ("queries", "keys"):
            bad = [j for j in getattr(req, name) if j >= T]
            if bad:
                raise Refused(f"{name} {bad[:5]} out of range: this text has {T} tokens (0..{T - 1})")
        first, last = req.layers or (0, L - 1)
        if not first <= last < L:
            raise Refused(f"layers [{first}, {last}] must be [first, last] with first <= last <= {L - 1}")
        queries, keys = sorted(set(req.queries)), sorted(set(req.keys))
        mask = rt.build_mask([T], rt.cfg.causal)[0, 0] > -1.0
        left = [q for q in queries if not np.any(mask[q] & ~np.isin(np.arange(T), keys))]
        if left:
            raise Refused(f"queries {left[:5]} would read no key at all: every key they see is knocked out; keep "
                          f"at least one (a causal query {left[0]} sees keys 0..{left[0]})")
        key = _hash(["knockout", req.model, rt.key, req.text, queries, keys, first, last])

        def call():
            return knock_out(rt, enc, queries, keys, (first, last))
        return KnockoutPlan(request=req, runtime=rt, encoding=enc, key=key, etag=_etag(key, req, binary),
                            binary=binary, size=2000 + 40 * T, run=Run(key, call))


    # ---- /api/qk, /api/lens: a traced run of the text --------------------------------------------------------------
    def _traced(self, rt: Runtime, enc: Encoding, what: str) -> Run:
        """The text's run with the stream entering every block, each head's output, queries and keys kept
        (runtime/interventions.py Trace): one per text, shared by QK attribution and the lens."""
        self._capable(rt, "stacked", what)
        self._patching_tokens(len(enc.ids), what)
        key = _hash(["trace", rt.spec.id, rt.key, enc.ids, enc.type_ids])
        return Run(key, lambda: Interventions(rt).trace(enc, keep=("residual", "query", "key", "head_output"),
                                                        final=False))

    def qk(self, req: QKRequest, binary: bool) -> QKPlan:
        rt, enc = self._text(req, "QK attribution (/api/qk)")
        _select("layers", [req.layer], rt.cfg.n_layers)
        _select("heads", [req.head], rt.cfg.n_heads)
        self._decomposable(rt, "QK attribution", qk=True, scores=True, direct=True)
        T = len(enc.ids)
        for name in ("query", "key"):
            if getattr(req, name) >= T:
                raise Refused(f"{name} {getattr(req, name)} is out of range: this text has {T} tokens (0..{T - 1})")
        run = self._traced(rt, enc, "QK attribution")
        C = 3 + req.layer * (rt.cfg.n_heads + 1)                          # the components
        size = 200 * (C + req.top) + (C * C * (4 if binary else 12) if req.table else 0) + 40 * T
        return QKPlan(request=req, runtime=rt, encoding=enc, key=run.key, etag=_etag(run.key, req, binary),
                      binary=binary, size=size, run=run)

    def lens(self, req: LensRequest, binary: bool) -> LensPlan:
        rt, enc = self._text(req, "the logit lens (/api/lens)")
        if not rt.cfg.has_unembedding:
            with_one = [m for m, r in self.runtimes.items() if r.cfg.has_unembedding]
            raise Refused(f"the logit lens reads tokens out of the residual stream, and model {rt.spec.id!r} has no "
                          f"unembedding (no LM head); models with one: {', '.join(with_one) or 'none served'}")
        if req.head_lens is not None:
            self._decomposable(rt, "the head lens", direct=True)
            _select("layers", req.head_lens[:1], rt.cfg.n_layers)
            _select("heads", req.head_lens[1:], rt.cfg.n_heads)
        run = self._traced(rt, enc, "the logit lens")
        k, L, T = req.top, rt.cfg.n_layers, len(enc.ids)

        def call(trace: Trace) -> Lensed:
            t0 = time.perf_counter()
            residual = trace.sites["residual"]
            lens = logit_lens(rt.model, residual, enc.ids, k)
            head = None if req.head_lens is None else head_lens(rt.model, trace.sites["head_output"][tuple(req.head_lens)],
                                                                residual[-1], *req.head_lens, k)
            return Lensed(enc.tokens, lens, head, time.perf_counter() - t0)
        per = 4 if binary else 30                                         # a token's id, string and probability
        return LensPlan(request=req, runtime=rt, encoding=enc, key=run.key, etag=_etag(run.key, req, binary),
                        binary=binary, size=(L + 3) * T * (k * per + 12) + 100 * T, run=run,
                        lens_key=_hash(["lens", run.key, k, req.head_lens]), lens=call)

    def circuits(self, req: CircuitsRequest, binary: bool) -> CircuitsPlan:
        rt = self.runtime(req.model, "circuits (/api/circuits)")
        self._decomposable(rt, "weight-space circuits (QK = W_Q W_K^T, OV = W_V W_O)", qk=True, direct=True)
        self._capable(rt, "circuits", "weight-space circuits (/api/circuits)")
        key = _hash(["circuits", rt.spec.id, rt.key])
        n = rt.cfg.n_layers * rt.cfg.n_heads
        return CircuitsPlan(request=req, runtime=rt, encoding=None, key=key, etag=_etag(key, req, binary),
                            binary=binary, size=3 * n * n * (4 if binary else 12) + 12 * n,
                            circuits=self.circuits_of(rt))

    def circuits_of(self, rt: Runtime) -> Future:
        """The model's circuits: computed once, in a background thread (a daemon: it never holds up the server's
        exit), first asked for at start-up (precompute) or by the first request; every later request reads the same
        result."""
        with self._circuits_lock:
            fut = self._circuits.get(rt.spec.id)
            if fut is None:
                fut = self._circuits[rt.spec.id] = Future()
                threading.Thread(target=self._compute_circuits, args=(fut, rt), daemon=True,
                                 name=f"attnscope-circuits-{rt.spec.id}").start()
            return fut

    def _compute_circuits(self, fut: Future, rt: Runtime) -> None:
        with self._one_at_a_time:
            try:
                fut.set_result(_circuits(rt))
            except BaseException as e:  # noqa: BLE001 - every waiting request gets it (a 500: a bug)
                fut.set_exception(e)

    def precompute(self) -> None:
        """At start-up, in the background: what each model's first request would otherwise wait for, its circuits
        (seconds of weight products for SmolLM2), where they fit ATTNSCOPE_PRECOMPUTE_MB; larger models' come with
        their first /api/circuits. The server answers meanwhile; a request for them waits for the result."""
        for rt in self.runtimes.values():
            cfg = rt.cfg
            # the largest of composition's products: one writer layer against every later reader, float32
            mb = 4 * cfg.d_model * cfg.n_layers * cfg.n_heads * cfg.d_head / 2 ** 20
            if isinstance(rt, EncoderDecoderRuntime) or mb > self.settings.precompute_mb or \
                    not rt.capabilities.allows("circuits"):      # a request for them is refused (its TFLOP)
                continue
            try:
                self._decomposable(rt, "circuits", qk=True, direct=True)
            except Refused:
                continue
            self.circuits_of(rt)

    # ---- /api/generate --------------------------------------------------------------------------------------------
    def generate(self, req: GenerateRequest) -> GeneratePlan:
        rt = self.runtime(req.model, "generation (/api/generate)")
        self._lm(rt, "generation")
        self._capable(rt, "stacked", "generation (/api/generate, whose every step runs the whole model)")
        self._chars(rt, "text is", req.text)
        st, L, H = self.settings, rt.cfg.n_layers, rt.cfg.n_heads
        if "max_new_tokens" not in req.model_fields_set:      # the default (32) within ATTNSCOPE_MAX_NEW_TOKENS
            req = req.model_copy(update={"max_new_tokens": min(req.max_new_tokens, st.max_new_tokens)})
        if req.max_new_tokens > st.max_new_tokens:
            raise Refused(f"max_new_tokens {req.max_new_tokens} is over the limit of {st.max_new_tokens} "
                          f"(ATTNSCOPE_MAX_NEW_TOKENS)")
        enc = rt.vocabulary.encode(chat_prompt(rt.generation, req.text) if req.chat else req.text)
        T, room = len(enc.ids), rt.spec.max_tokens
        if enc.truncated or T + req.max_new_tokens > room:
            raise Refused(f"the prompt is {'over ' if enc.truncated else ''}{T} tokens and {req.max_new_tokens} new "
                          f"ones would pass {rt.spec.id}'s {room} (its max_tokens): ask for at most "
                          f"{max(room - T, 0)} new tokens, or shorten the prompt")
        cfg = rt.cfg
        cache = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.d_head * 4 * (T + req.max_new_tokens)
        if cache > st.layerwise_mb * 2**20:
            raise Refused(f"this generation's key/value cache would hold {cache / 2**20:.0f} MB ({T} + "
                          f"{req.max_new_tokens} tokens), over ATTNSCOPE_LAYERWISE_MB ({st.layerwise_mb:g} MB): "
                          f"shorten the prompt or ask for fewer new tokens")
        ablate = [tuple(pair) for pair in (req.interventions.ablate if req.interventions else [])]
        bad = [list(pair) for pair in ablate if pair[0] >= L or pair[1] >= H]
        if bad:
            raise Refused(f"interventions.ablate {bad[:5]} out of range: this model has layers 0..{L - 1} and heads "
                          f"0..{H - 1}")
        layers, heads = tuple(_select("layers", req.layers, L)), tuple(_select("heads", req.heads, H))
        if "attention" not in req.include:
            layers = heads = ()
        else:
            cells = len(layers) * len(heads) * req.max_new_tokens * (T + req.max_new_tokens)
            if cells > st.max_json_cells:
                raise Refused(f"the attention rows of this generation are {cells} numbers, over the limit of "
                              f"{st.max_json_cells} (ATTNSCOPE_MAX_JSON_CELLS): ask for fewer layers or heads, or "
                              f"fewer new tokens")
        seed = req.seed if req.seed is not None else int(np.random.default_rng().integers(2**32))
        sampling = Sampling(req.greedy, req.temperature, req.top_k, req.top_p, seed)
        return GeneratePlan(req, rt, enc, sampling, sorted(set(ablate)), layers, heads, st.max_generate_seconds,
                            int(st.layerwise_group_mb * 2**20))

    def job(self, req: JobRequest, stage: Callable[[str, str], tuple]) -> JobPlan:
        """The job's model (served and in the zoo: the workers build it by its id), its corpus on disk, counted
        (a malformed upload, an upload with no text and a corpus over ATTNSCOPE_MAX_JOB_TEXTS are refused here),
        and its id. stage(data, format) writes an upload to a temporary file: (that file, its name once queued);
        a refused upload's file is removed here."""
        st = self.settings
        rt = self.runtime(req.model, "corpus jobs (/api/jobs)")
        try:
            zoo_model(rt.spec.id)
        except KeyError:
            raise Refused(f"model {req.model!r} is not a zoo model; corpus jobs run zoo models (their workers build "
                          f"the model by its id)") from None
        folder, staged = st.jobs_folder(), None
        if req.corpus == "bundled":
            path, fmt, column = bundled.bundled_path(folder / "corpora"), "text", None
            corpus = bundled.NAME
        else:
            up = req.corpus
            fmt, column = up.format, None if up.format == "text" else up.column   # a text file has no columns
            staged, path = stage(up.data, fmt)
            corpus = f"upload:{path.name[:16]}"
        try:
            return self._counted(req, rt, path, staged, fmt, column, corpus)
        except BaseException:
            if staged is not None:
                staged.unlink(missing_ok=True)
            raise

    def _counted(self, req: JobRequest, rt: Runtime, path, staged, fmt: str, column: str | None,
                 corpus: str) -> JobPlan:
        st = self.settings
        read = staged or path
        try:
            texts, problems = count_texts(read, fmt, column)
        except CorpusError as e:
            raise Refused("the corpus cannot be read: " + str(e).replace(str(read), "the upload").replace(
                "--column", "corpus.column")) from None
        if texts == 0:
            raise Refused("the corpus has no text to read" + (f": {'; '.join(problems)}" if problems else ""))
        o = req.options
        if o.texts is not None:
            texts = min(texts, o.texts)
        if texts > st.max_job_texts:
            raise TooLarge(f"the corpus has {texts:,} texts; a job reads at most {st.max_job_texts:,} "
                           f"(ATTNSCOPE_MAX_JOB_TEXTS): set options.texts to sample fewer")
        examples = ExampleOptions(o.top, o.per_decile, o.rank_by, o.window)
        key = {"kind": req.kind, "model": rt.spec.id, "graph": rt.key, "corpus": corpus, "fmt": fmt,
               "column": column, "python": path.name if corpus == bundled.NAME else None,
               "options": o.model_dump()}
        job_id = _hash(key)[:16]
        return JobPlan(job_id, req, rt, path, fmt, column, corpus, texts, examples, staged)
