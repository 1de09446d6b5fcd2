"""The API's refusals of requests its OpenAPI calls valid: every rule JSON Schema cannot state, listed once, each with
the reason it cannot. tests/test_openapi.py (schemathesis' CLI, `--checks all`, against a live server) and
tests/test_fuzz.py (schemathesis in-process and live) fail on any schema-valid request refused for a reason not here.

What JSON Schema can state, the OpenAPI states: each served model has its own request schema (its layers, heads,
positions and token limits as bounds, `text_pair` only for a model that reads pairs, encoder-decoder options only for
encoder-decoders), integers are JSON Schema's (4 and 4.0 alike), blank texts are refused by a pattern.
"""
from __future__ import annotations

import re
from typing import NamedTuple


class Rule(NamedTuple):
    pattern: str      # the refusal's message (a regular expression)
    reason: str       # why no JSON Schema can state it


RULES = [
    # how a text tokenises: the token count, a token's identity
    Rule(r"^mask_tokens index \d+ is out of range: this text has \d+ tokens \(0\.\.\d+\)$",
         "a token index below the text's token count: the count depends on the text and the model's tokenizer"),
    Rule(r"^(queries|keys) \[[\d, ]+\] out of range: this text has \d+ tokens \(0\.\.\d+\)$",
         "knockout positions below the text's token count (the same)"),
    Rule(r"^queries: \d+ is out of range: this text has \d+ tokens \(0\.\.\d+\)$",
         "exact rows' query positions below the text's token count (the same)"),
    Rule(r"^tile (queries|keys) \[\d+, \d+\) must be a range first < end <= \d+, this text's token count$",
         "a tile's ranges within the text's token count (the same)"),
    Rule(r"^(position|query|key) \d+ is out of range: this text has \d+ tokens \(0\.\.\d+\)$",
         "attribution's position, QK attribution's query and key below the text's token count (the same)"),
    Rule(r"^clean and corrupt must have the same token count: clean has \d+ tokens, corrupt has \d+",
         "patching's two texts tokenise to the same count: a relation between two strings through a tokenizer"),
    Rule(r"^(target|distractor) .* is not one token: it splits into \d+",
         "a target or distractor that is one token of the model's vocabulary: a tokenizer's property"),
    Rule(r"^target and distractor are the same token",
         "two fields that must tokenise differently"),
    Rule(r"^queries \[[\d, ]+\] would read no key at all",
         "a knockout must leave each query a key it sees: depends on the causal mask and the token count"),
    Rule(r"^(clean and corrupt are|this text is) \d+ (characters|tokens).*ATTNSCOPE_MAX_(CHARS|PATCHING_TOKENS)",
         "a token limit: a text's token count is not its length (the character limit is stated: maxLength)"),
    Rule(r"^text is \d+ characters; the limit is \d+ \(ATTNSCOPE_MAX_CHARS\)",
         "the character limit over text and text_pair together: JSON Schema bounds each string alone"),
    Rule(r"^the prompt is (over )?\d+ tokens and \d+ new ones would pass .*'s \d+ \(its max_tokens",
         "a generation's prompt tokens and max_new_tokens together within the model's length (a token count)"),
    Rule(r"^the (needle|answer) reads as no token of model ",
         "retrieval's needle and answer must tokenise to something: a tokenizer's property"),
    Rule(r"^the probe is over \d+ tokens, what model .* reads \(its max_tokens\)",
         "retrieval's probe (haystack, needle, question, answer) within the model's length: a token count"),
    # relations between fields, or sizes that follow from several of them and the text
    Rule(r"^layers \[\d+, \d+\] must be \[first, last\] with first <= last",
         "knockout's layers in order: JSON Schema cannot compare two items of an array"),
    Rule(r"^this answer would hold [\d,]+ attention values; the (JSON|binary) limit is [\d,]+",
         "the answer's size: layers x heads x tokens^2, a product of fields and the token count"),
    Rule(r"^this patching is \d+ runs .*ATTNSCOPE_MAX_PATCHING_RUNS",
         "patching's rows: layers x heads x the token count (per position)"),
    Rule(r"^this patching is [\d,.]+ GFLOP .*ATTNSCOPE_MAX_PATCHING_GFLOP",
         "patching's work: its rows x the blocks each runs x the token count"),
    Rule(r"^this generation's key/value cache would hold \d+ MB .*ATTNSCOPE_LAYERWISE_MB",
         "a generation's memory: the token count times the model's layers and width"),
    Rule(r"^the attention rows of this generation are \d+ numbers, over the limit of \d+ \(ATTNSCOPE_MAX_JSON_CELLS\)",
         "a generation's attention rows: new tokens x layers x heads x positions"),
    Rule(r"^answer .* is not in the needle: ", "retrieval's answer is a substring of its needle: a relation between "
         "two strings"),
    Rule(r"^top \d+ is more than half of the \d+ heads of model ",
         "retrieval's top heads at most half of layers x heads: a product the per-model schemas do not bound"),
    Rule(r"^this retrieval probe is [\d.]+ TFLOP .*ATTNSCOPE_WORK_TFLOP",
         "retrieval's work: its walks (depths x (2 + controls)) x the probe's token count"),
    Rule(r"^kv_cache\.recent \(\d+\) is over the (smallest )?budget \(\d+\)",
         "H2O's recent window within its budget: JSON Schema cannot compare two fields"),
    Rule(r"^kv_cache\.window \(\d+\) must be under the (smallest )?budget \(\d+\)",
         "SnapKV's observation window under its budget: the same"),
    Rule(r"^the prompt is \d+ tokens and the answer \d+, past .*'s \d+ \(its max_tokens",
         "kv_compare's prompt and answer (or max_new_tokens) within the model's length: a token count"),
    Rule(r"^the answer is \d+ tokens, over the limit of \d+ new tokens \(ATTNSCOPE_MAX_NEW_TOKENS\)",
         "kv_compare's answer text within the new-token limit: a token count"),
    Rule(r"^the answer changes how the prompt's last tokens are read",
         "kv_compare's answer tokenised after the prompt as alone: a tokenizer's property"),
    Rule(r"^(sinks|recent|snapkv_window) \(\d+\) (must be under every|is over the smallest) budget",
         "kv_compare's sinks, recent and observation window under its smallest budget: comparing a field with an "
         "array's items"),
    Rule(r"^this comparison's key/value caches would hold \d+ MB .*ATTNSCOPE_LAYERWISE_MB",
         "kv_compare's memory: the token count times the model's layers and width"),
    Rule(r"^attribution needs `target`",
         "`include` naming attribution requires `target`: a dependency on an array's content"),
    Rule(r"^attribution is of the intact model",
         "`include` naming attribution excludes `ablate`: the same"),
    # white space as Python reads it
    Rule(r"^text is empty: give at least one non-blank character$",
         "the schema's pattern \\S is ECMA-262's: it counts U+001C..U+001F and U+0085 as non-blank, which Python's "
         "str.strip (the tokenizers' white space) removes"),
    Rule(r"^text_pair is blank: leave it out or give at least one non-blank character$",
         "the same, for text_pair"),
    Rule(r"^(text|needle|question|answer) is blank: give at least one non-blank character$",
         "the same, for retrieval's four texts"),
    # what an upload holds is read when it comes
    Rule(r"^the corpus cannot be read: ", "a corpus upload's content (CSV, JSONL) is parsed, not matched"),
    Rule(r"^the corpus has no text to read", "the same: texts found in the upload"),
    Rule(r"^the corpus has [\d,]+ texts; a job reads at most [\d,]+ \(ATTNSCOPE_MAX_JOB_TEXTS\)",
         "the same: the number of texts in the upload"),
]
REFUSED = re.compile("|".join(f"(?:{rule.pattern})" for rule in RULES))

# Schemathesis' stateful check (ST301, "Deleted resource still available") once reported DELETE /api/jobs/{id}, which
# cancelled a job that stayed listed; since issue 50 DELETE removes the job (a GET is then 404) and cancelling is
# POST /api/jobs/{id}/cancel, so no deleted resource may stay: the pattern stays for that check's parsing.
KEPT_AFTER_DELETE = re.compile(r"/api/jobs/[0-9a-f]+")


def unstatable(detail: str) -> bool:
    """Whether a refusal's message is one of the RULES."""
    return bool(REFUSED.search(detail))
