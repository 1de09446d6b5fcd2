"""POST /api/generate: text token by token, streamed with each token's probabilities (and, asked, its attention rows).
Each new token costs one position (a key/value cache, runtime/generation.py), and each step waits for a run slot like
any other run, so generations take turns with the rest. Heads in `interventions.ablate` stay knocked out in every
step. `kv_cache` generates under a cache eviction policy (StreamingLLM, H2O, SnapKV: model/kv_policies.py), the
full cache run alongside, and each token's line says what the policy kept and what it changed. The stream stops when
the client goes away, at the end of the step under way."""
from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Annotated, Iterator, Literal, Union

import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ..model import kv_policies
from ..runtime import Encoding, Runtime
from ..runtime.generation import Generator, Sampling
from ..runtime.interventions import head_masks
from . import checks
from .answers import ModelId, ToolText, number
from .base import Analysis, Context, Method, Tool
from .errors import Refused
from .runs import Runner
from .schemas import _bounded, _unicode_first, ComputeDtype, EXAMPLE_TEXT, Index, JsonBool, Strict, Text


class Interventions(Strict):
    """What is changed in every step of a generation."""
    ablate: list[Annotated[list[Index], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list, max_length=4096, examples=[[[17, 4]]],
        description="heads to knock out, as [layer, head] pairs: their output (before the output projection) is zero "
        "in the prompt's run and in every step, as `ablate` with `ablation` zero on /api/attention")


BUDGET = ("keys each key/value head keeps (its own query's key aside): one number for every layer and head, a list "
          "of one per layer, or [layer][kv_head]; a grouped-query model's query heads share their key/value head's")
Keys = _bounded(1, 1_000_000)
Budget = Union[Keys, Annotated[list[Keys], Field(min_length=1, max_length=1024)],
               Annotated[list[Annotated[list[Keys], Field(min_length=1, max_length=1024)]],
                         Field(min_length=1, max_length=1024)]]


def _odd(n: int) -> int:
    if n % 2 == 0:
        raise ValueError(f"kernel must be odd (a pooling centred on each key); got {n}")
    return n


class FullCache(Strict):
    """Every key kept: plain generation (the default)."""
    policy: Literal["full"]


class StreamingCache(Strict):
    """StreamingLLM (Xiao et al. 2023): key j is kept for query i iff j < sinks or i - j < window, the prompt's
    queries too, the same keys in every layer and head."""
    policy: Literal["streaming"]
    sinks: _bounded(0, 1_000_000) = Field(4, description="the first positions, always kept (attention sinks)")
    window: _bounded(1, 1_000_000) = Field(description="the recent positions kept, the query's own included")


class H2OCache(Strict):
    """H2O (Zhang et al. 2023) as its real-drop cache runs: the prompt with the full cache, then after the prompt and
    each step the cache cut to `budget` keys: the last `recent` positions and the budget - recent keys with the most
    attention received so far (summed over every query and the query heads sharing the key/value head)."""
    policy: Literal["h2o"]
    budget: Budget = Field(description=BUDGET, examples=[256])
    recent: _bounded(0, 1_000_000) = Field(description="the last positions always kept (at most budget)")


class SnapKVCache(Strict):
    """SnapKV (Li et al. 2024): the prompt compressed once, after it has run: the last `window` prompt queries vote
    with their attention on the earlier keys, the votes pooled along the keys (`kernel`, stride 1), and each key/value
    head keeps the budget - window best-voted keys and the window; generated tokens are never evicted."""
    policy: Literal["snapkv"]
    budget: Budget = Field(description=BUDGET + "; of the prompt", examples=[256])
    window: _bounded(1, 1_000_000) = Field(32, description="the observation window: the last prompt queries, who vote")
    kernel: Annotated[_bounded(1, 1001), AfterValidator(_odd)] = Field(
        5, description="the pooling's width, odd", json_schema_extra={"not": {"multipleOf": 2}})
    pooling: Literal["avg", "max"] = Field("avg", description="avg_pool1d or max_pool1d over the votes")


KVCache = Annotated[Union[FullCache, StreamingCache, H2OCache, SnapKVCache], Field(discriminator="policy")]
KV_EXAMPLES = [{"policy": "full"}, {"policy": "streaming", "sinks": 4, "window": 256},
               {"policy": "h2o", "budget": 256, "recent": 128},
               {"policy": "snapkv", "budget": 256, "window": 32, "kernel": 5}]


class GenerateRequest(Strict):
    """Token-by-token generation, streamed as NDJSON."""
    model: Text = Field("smollm2", description="a model id with an LM head (`predictions`)", examples=["smollm2"])
    text: Text = Field(description="the prompt", examples=["The quick brown fox"], json_schema_extra={"pattern": r"\S"})
    max_new_tokens: _bounded(1, 4096) = Field(32, description="tokens to generate at most (ATTNSCOPE_MAX_NEW_TOKENS "
                                              "caps it; the prompt and the new tokens together within the model's "
                                              "`max_tokens`)")
    greedy: JsonBool = Field(False, description="always the most probable token (temperature, top_k and top_p then "
                             "only shape the reported distribution); otherwise sampled")
    temperature: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] = Field(1.0, description="divides the logits before the "
                                                                "softmax: below 1 sharper, above 1 flatter; above 0 "
                                                                "(for the most probable token, set greedy)")
    top_k: _bounded(0, 1_000_000) = Field(0, description="sample among the k most probable tokens only; 0: off")
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(1.0, description="then among the fewest most probable tokens "
                                                       "whose probability reaches top_p (nucleus sampling); 1: off")
    seed: _bounded(0, 2**32 - 1) | None = Field(None, description="the sampling's random seed: the same seed and "
                                                "options give the same continuation; a random one when omitted (the "
                                                "last line says which)")
    stop: list[Annotated[str, Field(min_length=1, max_length=64), BeforeValidator(_unicode_first)]] = Field(
        default_factory=list, max_length=8, description="stop once the continuation contains one of these texts "
                                                        "(its token included); the model's end-of-text token always stops")
    chat: JsonBool = Field(False, description="wrap the prompt in the model's chat template as a user message, "
                           "with the assistant's turn opened (models whose files have a template)")
    interventions: Interventions | None = Field(None, description="heads knocked out while generating")
    layers: list[Index] | None = Field(None, description="with `attention`: the layers whose rows each token "
                                       "carries; all when omitted")
    heads: list[Index] | None = Field(None, description="with `attention`: the heads whose rows each token "
                                      "carries; all when omitted")
    kv_cache: KVCache | None = Field(None, examples=KV_EXAMPLES, description="a key/value-cache eviction policy: "
        "`full` (the default), `streaming`, `h2o` or `snapkv`. Evicted keys are masked (positions unchanged) and the "
        "full cache runs alongside; each token's line then carries `kv_cache` (KVCacheStep)")
    include: list[Literal["attention", "candidates"]] = Field(
        default=["candidates"], description="what each token's line carries: `candidates`, the step's most "
        "probable tokens with their probability before and after temperature, top-k and top-p; `attention`, the "
        "new token's attention row over every position so far, [layer][head][key]")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "smollm2", "text": "The quick brown fox", "max_new_tokens": 16, "greedy": True},
        {"model": "smollm2", "text": "The quick brown fox", "max_new_tokens": 16, "greedy": True,
         "kv_cache": {"policy": "streaming", "sinks": 4, "window": 8}}]})


class Candidate(BaseModel):
    token: str = Field(description="the token as a person reads it")
    id: int
    probability: float = Field(description="its probability under the model (softmax of the logits)")
    sampling_probability: float = Field(description="after temperature, top-k and top-p: what it is drawn with")


class KVCacheStep(BaseModel):
    """Under a cache policy, what it did in the step that chose the token (the query one position before it)."""
    kept: list[list[int]] = Field(description="keys that query saw, [layer][key/value head], its own included")
    evicted: list[list[list[int]]] = Field(description="positions evicted since the previous token's query, "
                                           "[layer][key/value head][...]; the first token's: every position its "
                                           "query did not see")
    kl: float = Field(description="KL(full || policy) of the next-token distributions, in nats")
    top1_agree: bool = Field(description="the policy's and the full cache's most probable tokens are the same")
    full_probability: float = Field(description="the token's probability under the full cache")
    full_token: dict = Field(description="the full cache's most probable token: {id, token}")
    head_change: list[list[float]] = Field(description="each head's output change ||z_policy - z_full|| / ||z_full||, "
                                           "[layer][head] (z: blocks.{l}.attn.hook_z at that query)")


class GeneratedToken(BaseModel):
    """One line of the stream per new token: `{"token": GeneratedToken}`."""
    index: int = Field(description="its position in the sequence (prompt tokens first)")
    id: int
    token: str = Field(description="the token as a person reads it")
    text: str = Field(description="the continuation so far, decoded")
    probability: float = Field(description="its probability under the model")
    sampling_probability: float = Field(description="its probability under the sampling distribution")
    candidates: list[Candidate] | None = Field(None, description="with `candidates`: the step's most probable tokens")
    attention: list | None = Field(None, description="with `attention`: its attention row, [layer][head][key] over "
                                   "positions 0..index")
    kv_cache: KVCacheStep | None = Field(None, description="with a `kv_cache` policy other than full")


class GenerateDone(BaseModel):
    """The stream's last line: `{"done": GenerateDone}` (or `{"error": {"status", "detail"}}`)."""
    model: str
    compute_dtype: ComputeDtype = Field("float32", description="what the steps' matrix products ran in: float32 "
                                        "(exact), or the server's fast mode (ATTNSCOPE_COMPUTE_DTYPE)")
    prompt_tokens: list[str] = Field(description="the prompt's tokens (after the chat template, with `chat`)")
    tokens: list[str] = Field(description="the new tokens")
    ids: list[int] = Field(description="the new tokens' ids")
    text: str = Field(description="the continuation, decoded")
    sequence: str = Field(description="prompt and continuation, decoded")
    stop_reason: Literal["max_new_tokens", "eos", "stop", "time"]
    seed: int = Field(description="the seed used")
    layers: list[int] | None = Field(None, description="with `attention`: the layers of each row")
    heads: list[int] | None = Field(None, description="with `attention`: the heads of each row")
    ablate: list[list[int]] = Field(description="the heads knocked out")
    kv_cache: dict | None = Field(None, description="with a policy other than full: the policy, and over the tokens "
                                  "kl_mean and top1_agreement (the fraction that agreed)")
    timing_ms: dict[str, float] = Field(description="prompt (its run), total, and per_token (the mean step)")
    tokens_per_second: float


@dataclass
class GeneratePlan:
    """/api/generate: the prompt's tokens and the generation's options, checked; `lines` runs it, a step at a time,
    each step waiting for a run slot like any run (analyses/runs.py Runner.step)."""
    request: GenerateRequest
    runtime: Runtime
    encoding: Encoding
    sampling: Sampling
    ablate: list[tuple[int, int]]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    seconds: float
    chunk_bytes: int
    policy: object = None

    def generator(self) -> Generator:
        L, H = self.runtime.cfg.n_layers, self.runtime.cfg.n_heads
        keep = head_masks(self.ablate, "zero", L, H)[0]
        return Generator(self.runtime, list(self.encoding.ids), self.sampling, self.request.max_new_tokens, keep,
                         tuple(self.request.stop), self.layers, self.heads, time.monotonic() + self.seconds,
                         self.chunk_bytes, policy=self.policy)

    async def lines(self, runner: Runner, started: float):
        """A line per new token ({"token": ...}), then {"done": ...}; a client that goes away stops it between two
        steps (the response stops asking for lines)."""
        gen = self.generator()
        await runner.step(gen.prefill)
        prompt = time.perf_counter()
        while gen.stop_reason is None:
            token = await runner.step(gen.__next__, admit=False)
            yield generated(self, token, gen.text)
        end = time.perf_counter()
        n = max(len(gen.new_ids), 1)
        yield generation_done(self, gen, {"prompt": (prompt - started) * 1000, "total": (end - started) * 1000,
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


def plan(ctx: Context, req: GenerateRequest) -> GeneratePlan:
    rt = checks.runtime(ctx, req.model, "generation (/api/generate)")
    checks.lm(ctx, rt, "generation")
    checks.capable(rt, "stacked", "generation (/api/generate, whose every step runs the whole model)")
    checks.chars(ctx, rt, "text is", req.text)
    st, L, H = ctx.settings, rt.cfg.n_layers, rt.cfg.n_heads
    if "max_new_tokens" not in req.model_fields_set:      # the default (32) within ATTNSCOPE_MAX_NEW_TOKENS
        req = req.model_copy(update={"max_new_tokens": min(req.max_new_tokens, st.max_new_tokens)})
    if req.max_new_tokens > st.max_new_tokens:
        raise Refused(f"max_new_tokens {req.max_new_tokens} is over the limit of {st.max_new_tokens} "
                      f"(ATTNSCOPE_MAX_NEW_TOKENS)")
    enc = rt.vocabulary.encode(chat_prompt(rt.generation, req.text) if req.chat else req.text)
    T, room = len(enc.ids), rt.spec.max_tokens
    if enc.truncated or T + req.max_new_tokens > room:
        raise Refused(f"the prompt is {'over ' if enc.truncated else ''}{T} tokens and {req.max_new_tokens} new "
                      f"ones would pass {rt.spec.id}'s {room} (its max_tokens; it has {rt.cfg.max_positions} "
                      f"positions): ask for at most {max(room - T, 0)} new tokens, or shorten the prompt")
    checks.long_text(rt, T)                  # the prompt's run fits here (422 naming the longest prompt that fits)
    cfg = rt.cfg
    policy = cache_policy(req.kv_cache, cfg)
    rows = 1 if isinstance(policy, kv_policies.Full) else 2     # a policy runs the full cache alongside
    cache = rows * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.d_head * 4 * (T + req.max_new_tokens)
    if cache > st.layerwise_mb * 2**20:
        raise Refused(f"this generation's key/value cache would hold {cache / 2**20:.0f} MB ({T} + "
                      f"{req.max_new_tokens} tokens), over ATTNSCOPE_LAYERWISE_MB ({st.layerwise_mb:g} MB): "
                      f"shorten the prompt or ask for fewer new tokens")
    ablate = [tuple(pair) for pair in (req.interventions.ablate if req.interventions else [])]
    bad = [list(pair) for pair in ablate if pair[0] >= L or pair[1] >= H]
    if bad:
        raise Refused(f"interventions.ablate {bad[:5]} out of range: this model has layers 0..{L - 1} and heads "
                      f"0..{H - 1}")
    layers, heads = tuple(checks.select("layers", req.layers, L)), tuple(checks.select("heads", req.heads, H))
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
                        int(st.layerwise_group_mb * 2**20), policy)


def cache_policy(kv_cache, cfg, name: str = "kv_cache"):
    """The request's kv_cache as a model/kv_policies.py policy, its fields checked against each other and its budget
    against the model's layers and key/value heads (422s)."""
    if kv_cache is None or kv_cache.policy == "full":
        return kv_policies.Full()
    if kv_cache.policy == "streaming":
        return kv_policies.Streaming(kv_cache.sinks, kv_cache.window)
    budget = budget_of(kv_cache.budget, cfg, name)
    least = int(np.min(budget))
    which = "" if isinstance(budget, int) else "smallest "
    if kv_cache.policy == "h2o":
        if kv_cache.recent > least:
            raise Refused(f"{name}.recent ({kv_cache.recent}) is over the {which}budget ({least}): the recent "
                          f"window is part of the budget")
        return kv_policies.H2O(budget, kv_cache.recent)
    if kv_cache.window >= least:
        raise Refused(f"{name}.window ({kv_cache.window}) must be under the {which}budget ({least}): SnapKV "
                      f"keeps the observation window and budget - window voted keys")
    return kv_policies.SnapKV(budget, kv_cache.window, kv_cache.kernel, kv_cache.pooling)


def budget_of(budget, cfg, name: str = "kv_cache"):
    """A budget as the policy holds it (a number, or tuples: per layer, or per layer and key/value head), its
    lengths the model's layers and key/value heads (422 naming them)."""
    if isinstance(budget, int):
        return budget
    L, Hkv = cfg.n_layers, cfg.n_kv_heads
    shapes = f"one number, {L} numbers (one per layer) or {L} lists of {Hkv} (one per key/value head)"
    if len(budget) != L:
        raise Refused(f"{name}.budget has {len(budget)} entries; this model has {L} layers: give {shapes}")
    if isinstance(budget[0], int):
        return tuple(budget)
    bad = [i for i, b in enumerate(budget) if len(b) != Hkv]
    if bad:
        raise Refused(f"{name}.budget[{bad[0]}] has {len(budget[bad[0]])} numbers; this model has {Hkv} key/value "
                      f"heads per layer: give {shapes}")
    return tuple(tuple(b) for b in budget)


def generated(plan, token, text: str) -> dict:
    """One line of a generation (runtime/generation.py Generated): the token, and what the request included."""
    line = {"index": token.index, "id": token.id, "token": token.token, "text": text,
            "probability": token.probability, "sampling_probability": token.sampling_probability}
    if "candidates" in plan.request.include:
        line["candidates"] = [{"token": c.token, "id": c.id, "probability": c.probability,
                               "sampling_probability": c.sampling_probability} for c in token.candidates]
    if token.attention is not None:
        line["attention"] = token.attention
    view = token.kv_cache
    if view is not None:
        line["kv_cache"] = {"kept": view.kept.tolist(), "evicted": view.evicted, "kl": view.kl,
                            "top1_agree": view.top1, "full_probability": view.full_probability,
                            "full_token": {"id": view.full_top, "token": plan.runtime.token_string(view.full_top)},
                            "head_change": view.head_change.tolist()}
    return {"token": line}


def generation_done(plan, gen, timing_ms: dict) -> dict:
    """A generation's last line: the whole continuation and why it stopped."""
    rt, n = plan.runtime, len(gen.new_ids)
    return {"done": {
        "model": plan.request.model, "compute_dtype": rt.compute_dtype, "prompt_tokens": plan.encoding.tokens,
        "tokens": [rt.token_string(i) for i in gen.new_ids], "ids": list(gen.new_ids), "text": gen.text,
        "sequence": rt.tokenizer.decode(list(plan.encoding.ids) + gen.new_ids, skip_special_tokens=False),
        "stop_reason": gen.stop_reason, "seed": plan.sampling.seed, "layers": list(gen.layers) or None,
        "heads": list(gen.heads) or None, "ablate": [list(p) for p in plan.ablate], "timing_ms": timing_ms,
        "kv_cache": None if not gen.views else {
            "policy": plan.request.kv_cache.model_dump(), "kl_mean": float(np.mean([v.kl for v in gen.views])),
            "top1_agreement": float(np.mean([v.top1 for v in gen.views]))},
        "tokens_per_second": n / max(timing_ms["total"] - timing_ms["prompt"], 1e-9) * 1000}}


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


def body(text: str, **options) -> dict:
    """POST /api/generate: an iterator of the new tokens (each the stream's token line), as they are made;
    `.done` holds the last line once it has ended. Options as the API takes them (max_new_tokens, greedy,
    temperature, top_k, top_p, seed, stop, chat, interventions, kv_cache, attention)."""
    return {"text": text, **options}


def tool(api, text: ToolText, max_new_tokens: Annotated[int, Field(ge=1, le=256)] = 16, greedy: bool = True,
         model: ModelId = None, kv_cache: KVCache | None = None) -> dict:
    options = {} if kv_cache is None else {"kv_cache": kv_cache.model_dump()}
    g = api.generate(text, max_new_tokens=max_new_tokens, greedy=greedy, model=model, **options)
    tokens = []
    for t in g:
        tokens.append({"token": t["token"], "probability": number(t["probability"])})
        if t.get("kv_cache"):     # under a policy: its divergence from the full cache at this token
            c = t["kv_cache"]
            tokens[-1] |= {"kl": number(c["kl"]), "full_token": c["full_token"]["token"],
                           "full_probability": number(c["full_probability"])}
    out = {"text": g.done["text"], "tokens": tokens, "stop_reason": g.done["stop_reason"]}
    return out | ({"kv_cache": g.done["kv_cache"]} if g.done.get("kv_cache") else {})


ANALYSIS = Analysis(
    name="generate", tag="generation", summary="Generate text token by token, streamed with each token's "
    "probabilities and attention", description=__doc__.split("\n", 1)[1].replace("\n", " ").strip(),
    request=GenerateRequest, response=None, plan=lambda ctx, req, binary: plan(ctx, req), stream="tokens",
    needs=("predictions", "an LM head"), example={"text": EXAMPLE_TEXT, "max_new_tokens": 8},
    methods=(Method("generate", body, Generation, lines=True),),
    tools=(Tool("generate", "Generate text from a prompt (greedy by default); each new token with its probability. "
                "kv_cache replays it under a key/value-cache eviction policy (streaming, h2o, snapkv): each token "
                "then says how far the policy's next-token distribution is from the full cache's (KL).", tool),),
    page=("model", "text", "max_new_tokens", "greedy", "temperature", "top_k", "top_p", "seed", "stop", "chat",
          "interventions", "layers", "heads", "include", "kv_cache"))
