"""POST /api/stages: every step of one head, from the layer input x to its contribution through W_O (Q, K, V, the raw
scores Q.K^T, scaled, the additive mask, masked, softmax probabilities), exactly as the model computed them: one
forward pass of the graph with the teaching outputs (or the NumPy reference). An encoder-decoder's head comes from
analyses/encoder_decoder.py."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import ConfigDict, Field

from ..model.functional import score_scale
from ..model.transformer import SQUARE_STAGES
from ..runtime.encdec import Attention, EncoderDecoderRuntime
from . import checks, encoder_decoder
from .answers import Answer, Indexed
from .base import Analysis, Computed, Context, Method, OneRunPlan, Plan, etag_of
from .errors import Refused
from .payloads import tokens
from .runs import Run
from .schemas import _bounded, EXAMPLE_TEXT, Index, Matrix, RunOptions, Text, Tokens


class StagesRequest(RunOptions):
    layer: Index = Field(description="0-based layer, below the chosen model's `layers` (GET /api/models)")
    head: Index = Field(description="0-based head, below the chosen model's `heads` (GET /api/models)")
    limit: _bounded(1, 512) | None = Field(
        None, description="return the matrices for the first `limit` tokens only (queries and keys), e.g. to show "
        "the numbers of a long text's opening; `probs` rows are then partial. All tokens when omitted")
    decoder_text: Text | None = Field(None, description="encoder-decoders only: the decoder's text, as /api/attention "
                                      "reads it (omitted or blank: the decoder start token alone)")
    attention: Attention | None = Field(
        None, description="encoder-decoders only: whose head, the encoder's self-attention, the decoder's, or "
        "cross-attention (the default: queries from the decoder's tokens, keys and values from the encoder's output). "
        "Its steps come from the NumPy reference (the served graph keeps only the probabilities)")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "tiny-gpt", "text": "The cat sat on the mat", "layer": 0, "head": 1}]})


class StagesResponse(Tokens):
    """Every step of one head, in order: x -> q, k, v -> scores -> scaled -> + mask -> softmax -> probs . v -> W_o.
    With `limit`, every matrix has its first `limit` tokens (rows, and key columns) of the run on the whole text."""
    layer: int = Field(description="the layer shown")
    head: int = Field(description="the head shown")
    d_head: int = Field(description="width of q, k, v and ctx")
    scale: float = Field(description="1 / (sqrt(d_head) * temperature), the factor applied to the raw scores (Gemma: "
                         "sqrt(query_pre_attn_scalar) in place of sqrt(d_head); Gemma 2 then soft-caps them, "
                         "cap * tanh(scaled / cap), as part of `scaled`)")
    x: Matrix = Field(description="the layer's input as its q, k and v projections read it [token][d_model]: after "
                      "the block's norm in a pre-norm model (GPT-2, Llama), the block's input itself in BERT")
    q: Matrix = Field(description="queries [token][d_head]: x W_q^T + b_q, this head's rows (after RoPE in Llama "
                      "models)")
    k: Matrix = Field(description="keys [token][d_head], as this head reads them (its key/value group's in a "
                      "grouped-query model; after RoPE in Llama models)")
    v: Matrix = Field(description="values [token][d_head], as this head reads them")
    scores: Matrix = Field(description="q . k^T [query][key]")
    scaled: Matrix = Field(description="scores * scale")
    mask: Matrix = Field(description="additive mask: 0 visible, -3.4e38 (float32 min, i.e. minus infinity) hidden")
    masked: Matrix = Field(description="scaled + mask")
    probs: Matrix = Field(description="softmax of each masked row: the attention weights")
    row_max: list[float] = Field(description="per query shown: the largest entry of its whole `masked` row (every "
                                 "key, also those past `limit`)")
    row_sum: list[float] = Field(description="per query shown: sum over its whole row of exp(masked - row_max), so "
                                 "probs[i][j] = exp(masked[i][j] - row_max[i]) / row_sum[i]")
    ctx: Matrix = Field(description="the head's output [query][d_head]: probs . v over all keys, sum_j "
                        "probs[i][j] v[j] (before any `ablate`)")
    contribution: Matrix = Field(description="the head's share of the attention output [query][d_model]: ctx "
                                 "through its d_head columns of the output projection, ctx W_o[:, head]^T. The "
                                 "heads' shares plus W_o's bias make the attention output added to the residual "
                                 "stream. Computed by the server from ctx and the model's weights")
    attention: Attention | None = Field(
        None, description="encoder-decoders: whose head this is; `tokens` are then the encoder's (as in /api/attention)")
    query_tokens: list[str] | None = Field(None, description="encoder-decoders: the queries' tokens (the rows; the "
                                           "decoder's for decoder and cross-attention)")
    key_tokens: list[str] | None = Field(None, description="encoder-decoders: the keys' tokens (the columns; the "
                                         "encoder's for encoder and cross-attention)")


@dataclass(frozen=True, kw_only=True)
class StagesPlan(OneRunPlan):
    """One forward pass with the teaching stages, for one head's every step."""
    layer: int
    head: int

    def payload(self, computed: Computed) -> dict:
        return payload(self, computed)


def plan(ctx: Context, req: StagesRequest, binary: bool) -> Plan:
    rt, enc = checks.text(ctx, req)
    if isinstance(rt, EncoderDecoderRuntime):
        return encoder_decoder.stages(ctx, req, rt, enc, binary)
    checks.only_encoder_decoders(req, rt, "decoder_text", "attention")
    checks.select("layers", [req.layer], rt.cfg.n_layers)
    checks.select("heads", [req.head], rt.cfg.n_heads)
    checks.run_options(ctx, req, rt, enc)
    checks.capable(rt, "stacked", "the stages of a head (/api/stages, which runs every layer's teaching outputs "
                                 "in one graph)")
    checks.capable(rt, "stages", "the stages of a head (/api/stages)")
    T = len(enc.ids)
    if not checks.fits_stacked(ctx, rt, T):
        raise Refused(f"this text is {T} tokens: every layer's attention together is "
                      f"{checks.stacked_bytes(rt, T) / 2**30:.1f} GiB, so it runs layer by layer "
                      f"(ATTNSCOPE_LAYERWISE_MB), and the stages of one head come from the graph that holds every "
                      f"layer; ask /api/attention for its probabilities, or shorten the text")
    n = min(req.limit or T, T)
    key = checks.run_key(req, rt, True)
    return StagesPlan(request=req, runtime=rt, encoding=enc, key=key, etag=etag_of(key, req, binary),
                      binary=binary, size=8 * n * (n + rt.cfg.d_head) * (4 if binary else 12),
                      layer=req.layer, head=req.head, run=Run(key, checks.forward(req, rt, enc, stages=True)))


def payload(plan, computed) -> dict:
    """Every intermediate of one head, for the first `limit` tokens.

    From the model run (the ONNX graph, or the NumPy reference with engine=numpy): x, q, k, v, scores, scaled,
    masked, ctx and probs; mask is the additive mask the run was fed. Computed here, in NumPy: the head's
    contribution (ctx through its columns of W_o, TransformerBlock.head_output) and each shown row's softmax
    max and sum over all its keys (the shown part of a row can be cut by `limit`)."""
    r = computed.result
    req, cfg = plan.request, plan.runtime.cfg
    l, h = req.layer, req.head
    n = req.limit or len(r.tokens)
    st = {name: v[l, :n] if name == "x" else v[l, h, :n, :n] if name in SQUARE_STAGES else v[l, h, :n]
          for name, v in r.stages.items()}
    rows = r.stages["masked"][l, h, :n].astype(np.float64)    # [n, T]: whole rows; in float64 (also on the wire)
    row_max = rows.max(axis=1)                                 # so that exp(masked - row_max) is 1 at the max
    return tokens(plan, r) | {"layer": l, "head": h, "d_head": cfg.d_head,
                        "scale": float(score_scale(cfg)),
                        **st, "mask": r.mask[:n, :n], "probs": r.attentions[l, h, :n, :n],
                        "contribution": plan.runtime.model.blocks[l].head_output(h, st["ctx"]),
                        "row_max": row_max, "row_sum": np.exp(rows - row_max[:, None]).sum(axis=1)}


class Stages(Answer):
    """POST /api/stages: every step of one head; queries and keys are positions, d_model/d_head the vectors' axes."""
    DIMS = {"x": ("position", "d_model"), "q": ("query", "d_head"), "k": ("key", "d_head"), "v": ("key", "d_head"),
            "scores": ("query", "key"), "scaled": ("query", "key"), "mask": ("query", "key"),
            "masked": ("query", "key"), "probs": ("query", "key"), "ctx": ("query", "d_head"),
            "contribution": ("query", "d_model")}

    def figure(self):
        from ..analysis import figures

        one = Indexed(Answer({**self.data, "attention": np.asarray(self.data["probs"])[None, None]}), 0, 0)
        return figures.head(one, 0, 0, title=f"{self.data['model']} · layer {self.data['layer']} · head "
                            f"{self.data['head']}: probabilities")

    def summary(self) -> str:
        return f"{self.data['model']} layer {self.data['layer']} head {self.data['head']}, {len(self.data['tokens'])} tokens"


def body(text: str, layer: int, head: int, **options) -> dict:
    """POST /api/stages: every step of one head (x, q, k, v, scores, scaled, mask, masked, probs, ctx, ...)."""
    return {"text": text, "layer": layer, "head": head, **options}


ANALYSIS = Analysis(
    name="stages", tag="attention", summary="Every step of one head, from the layer input x to its contribution "
    "through W_O", description="Q, K, raw scores Q.K^T, scaled scores, the additive mask, masked scores and softmax "
    "probabilities, exactly as the model computed them.",
    request=StagesRequest, response=StagesResponse, plan=plan, form="binary",
    example={"text": EXAMPLE_TEXT, "layer": 0, "head": 0}, methods=(Method("stages", body, Stages),))
