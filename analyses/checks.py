"""The checks every analysis shares, as small functions of the planning context (analyses/base.py Context): the model
(404, or 503 while it loads), the character limit (413), layers and heads, masks and ablations against the model and
the tokens, what the model's size and family allow (422, naming the limit), and the runs a forward pass makes.
Each refuses before any work, with a message that says what to change."""
from __future__ import annotations

from typing import Callable

from ..analysis.effects import Metric
from ..model.weights import state_dict
from ..runtime import Encoding, Runtime
from ..runtime.capabilities import inexact
from ..runtime.encdec import EncoderDecoderRuntime
from ..runtime.interventions import Interventions, head_masks
from ..runtime.layerwise import Want
from .base import Context, hash_of
from .errors import LOADING_RETRY_S, Loading, Refused, TooLarge, UnknownModel
from .runs import Run


def runtime(ctx: Context, model_id: str, what: str | None = None) -> Runtime:
    """The served model; `what`: the feature asked, which an encoder-decoder refuses (only /api/attention and
    /api/stages serve them)."""
    rt = ctx.runtimes.get(model_id)
    if rt is None:
        state = ctx.states.get(model_id)
        if state is not None and state != "ready":
            raise Loading(f"model {model_id!r} is still loading ({state}); retry in a few seconds (GET /healthz "
                          f"shows each model's state)", headers={"Retry-After": str(LOADING_RETRY_S)})
        shown = model_id if len(model_id) <= 64 else model_id[:64] + "…"
        raise UnknownModel(f"unknown model {shown!r}; available: {', '.join(ctx.states or ctx.runtimes)}")
    if what is not None and isinstance(rt, EncoderDecoderRuntime):
        raise Refused(f"{what} is not available for encoder-decoders ({model_id!r} is one): /api/attention "
                      f"gives their encoder, decoder and cross-attention")
    return rt


def only_encoder_decoders(req, rt: Runtime, *names: str) -> None:
    """Refuse the fields only encoder-decoders take (decoder_text, attention) when a decoder or an encoder is asked."""
    given = [name for name in names if getattr(req, name) is not None]
    if given:
        many = len(given) > 1
        raise Refused(f"{' and '.join(given)} {'are' if many else 'is'} for encoder-decoders (T5, BART, Marian); "
                      f"{req.model!r} is {'an' if rt.spec.kind == 'encoder' else 'a'} {rt.spec.kind}: leave "
                      f"{'them' if many else 'it'} out")


def capable(rt: Runtime, feature: str, what: str) -> None:
    """Refuse `what` where the model's size does not allow `feature` on this machine (runtime/capabilities.py),
    before any work, with the sentence that names the limit."""
    caps = getattr(rt, "capabilities", None)
    reason = caps.refusal(feature) if caps is not None else None
    if reason is not None:
        raise Refused(f"{what} is not available for model {rt.spec.id!r}: {reason}")


def chars(ctx: Context, rt: Runtime, what: str, *texts: str | None) -> None:
    """The character limit, over every text of a request."""
    n = sum(len(t or "") for t in texts)
    if n > ctx.max_chars:
        raise TooLarge(f"{what} {n} characters; the limit is {ctx.max_chars} (ATTNSCOPE_MAX_CHARS). "
                       f"The model reads at most {rt.spec.max_tokens} tokens anyway")


def text(ctx: Context, req, what: str | None = None) -> tuple[Runtime, Encoding]:
    """The model and the text's tokens (the text's one tokenisation), within the character limit."""
    rt = runtime(ctx, req.model, what)
    pair = getattr(req, "text_pair", None)          # knockout takes one text
    chars(ctx, rt, "text is", req.text, pair)
    return rt, rt.vocabulary.encode(req.text, pair)


def select(name: str, asked: list[int] | None, n: int) -> list[int]:
    """The asked indices of `name` (all n when None), each below n, without repeats."""
    if asked is None:
        return list(range(n))
    if not asked:
        raise Refused(f"{name} is empty: leave it out for all {n}, or list indices 0..{n - 1}")
    bad = [i for i in asked if i >= n]
    if bad:
        raise Refused(f"{name} {bad} out of range: this model has {n} {name} (0..{n - 1})")
    return list(dict.fromkeys(asked))


def position(name: str, i: int, T: int) -> None:
    """A token position below the text's token count."""
    if i >= T:
        raise Refused(f"{name} {i} is out of range: this text has {T} tokens (0..{T - 1})")


def run_options(ctx: Context, req, rt: Runtime, enc: Encoding) -> None:
    """The options a forward pass takes (masks, ablations), checked against the model and the tokens."""
    if len(req.mask_tokens) > ctx.settings.max_mask_tokens:
        raise Refused(f"mask_tokens has {len(req.mask_tokens)} entries; the limit is "
                      f"{ctx.settings.max_mask_tokens} (ATTNSCOPE_MAX_MASK_TOKENS)")
    T = len(enc.ids)
    for j in req.mask_tokens:
        if j >= T:
            raise Refused(f"mask_tokens index {j} is out of range: this text has {T} tokens (0..{T - 1})")
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    bad = [pair for pair in req.ablate if pair[0] >= L or pair[1] >= H]
    if bad:
        raise Refused(f"ablate {bad[:5]} out of range: this model has layers 0..{L - 1} and heads 0..{H - 1}")


def run_key(req, rt: Runtime, stages: bool, ids=None) -> str:
    """Content hash of everything that determines a model run (and of the model's weights and graph)."""
    return hash_of([req.model, rt.key, req.engine, req.text, req.text_pair, req.causal,
                    sorted(set(req.mask_tokens)), stages, sorted(map(tuple, req.ablate)),
                    req.ablation if req.ablate else None, ids])


def forward(req, rt: Runtime, enc: Encoding, stages: bool = False, want: Want | None = None) -> Callable:
    """The forward pass a request asks for, as a call for the run queue (want: what leaves the device; without its
    ends the run stops after the last asked layer, Runtime.depth_of)."""
    keep, mean = head_masks(req.ablate, req.ablation, rt.cfg.n_layers, rt.cfg.n_heads)
    options = dict(causal=req.causal, mask_tokens=[req.mask_tokens] if req.mask_tokens else None,
                   engine=req.engine, stages=stages, head_mask=keep, head_mean=mean, want=want)
    return lambda: rt.forward([enc], **options)[0]


def stacked_bytes(rt: Runtime, tokens: int) -> int:
    """What the stacked graph's attention output holds for a text of this many tokens (float32)."""
    return rt.cfg.n_layers * rt.cfg.n_heads * tokens * tokens * 4


def fits_stacked(ctx: Context, rt: Runtime, tokens: int) -> bool:
    return stacked_bytes(rt, tokens) <= ctx.settings.layerwise_mb * 2**20


def long_text(rt: Runtime, T: int) -> None:
    """A text within what one run of the model fits here (Capabilities.long_tokens: memory and work), else a 422
    naming the limit and the longest text that fits."""
    from ..model.weights import state_dict
    from ..runtime.capabilities import forward_flop, walk_bytes
    caps, cfg = rt.capabilities, rt.cfg
    if not caps.long_tokens or T <= caps.long_tokens:
        return
    blocks = sum(int(a.size) for name, a in state_dict(rt.model).items() if name.startswith("blocks."))
    raise Refused(f"this text is {T:,} tokens; a run of model {rt.spec.id!r} over it takes ~"
                  f"{forward_flop(cfg, blocks, T) / 1e12:.1f} TFLOP and ~{walk_bytes(cfg, T) / 2**30:.1f} GB besides "
                  f"its weights, more than this server allows (ATTNSCOPE_WORK_TFLOP, ATTNSCOPE_MEMORY_MB): the longest "
                  f"text that fits is {caps.long_tokens:,} tokens. Shorten the text, or raise those limits")


def cells(ctx: Context, n: int, binary: bool) -> None:
    """An answer's attention values within its wire form's limit."""
    limit = ctx.settings.max_binary_cells if binary else ctx.settings.max_json_cells
    if n > limit:
        raise Refused(f"this answer would hold {n:,} attention values; the "
                      f"{'binary' if binary else 'JSON'} limit is {limit:,} "
                      f"(ATTNSCOPE_MAX_{'BINARY' if binary else 'JSON'}_CELLS). Ask for fewer layers or heads, "
                      f"set resolution" + ("" if binary else ", or ask for the binary form (Accept: "
                                                             "application/vnd.attnscope.tensors)"))


def decomposable(rt: Runtime, what: str, qk: bool = False, scores: bool = False, direct: bool = False,
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


def lm(ctx: Context, rt: Runtime, what: str) -> None:
    """A model with an LM head (next-token logits)."""
    if not rt.cfg.lm_head:
        with_lm = [m for m, r in ctx.runtimes.items() if r.cfg.lm_head]
        raise Refused(f"{what} reads next-token logits, and model {rt.spec.id!r} has no LM head; models with one: "
                      f"{', '.join(with_lm) or 'none served'}")


def patching_tokens(ctx: Context, T: int, what: str) -> None:
    """A text short enough for a run that keeps every layer's values of each token."""
    limit = ctx.settings.max_patching_tokens
    if T > limit:
        raise Refused(f"this text is {T} tokens; {what} keeps every layer's values of each token and takes at most "
                      f"{limit} (ATTNSCOPE_MAX_PATCHING_TOKENS)")


def metric(rt: Runtime, target: str, distractor: str | None) -> Metric:
    """The metric an intervention reads: log p(target), or logit(target) - logit(distractor)."""
    t = rt.vocabulary.token_id(target, "target")
    d = None if distractor is None else rt.vocabulary.token_id(distractor, "distractor")
    if d == t:
        raise Refused(f"target and distractor are the same token ({target!r}): the difference would be 0")
    return Metric(t, d)


def block_flops(rt: Runtime, T: int) -> float:
    """Float operations of one token through one block: a multiply and an add per weight, and the scores and the
    weighted values against T keys."""
    cfg = rt.cfg
    weights = sum(w.size for name, w in state_dict(rt.model).items() if name.startswith("blocks.")) / cfg.n_layers
    return 2 * weights + 4 * T * cfg.n_heads * cfg.d_head


def traced(ctx: Context, rt: Runtime, enc: Encoding, what: str) -> Run:
    """The text's run with the stream entering every block, each head's output, queries and keys kept
    (runtime/interventions.py Trace): one per text, shared by QK attribution and the lens."""
    capable(rt, "stacked", what)
    patching_tokens(ctx, len(enc.ids), what)
    key = hash_of(["trace", rt.spec.id, rt.key, enc.ids, enc.type_ids])
    return Run(key, lambda: Interventions(rt).trace(enc, keep=("residual", "query", "key", "head_output"),
                                                    final=False))

