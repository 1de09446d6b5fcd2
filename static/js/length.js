// How much of the text a model reads, said on screen: the banner over the view when the text was cut at the model's
// token limit (and which served models read more), the tabs that would refuse a text this long (disabled before they
// are asked, in plain words), and a long run's estimate before it starts (its tokens and time, from the capability
// record's parameter count and the rate this page measured). The server's limits come from the boot block
// (BOOT.limits: the most tokens a patching-style run keeps, the most a run of every layer at once may hold).
import { BOOT, MODELS } from "./boot.js";
import { h, replace } from "./dom.js";
import { LONG_TOKENS } from "./matrix.js";
import { fmtBytes } from "./scale.js";
import * as state from "./state.js";

const CHARS_PER_TOKEN = 4.2;         // English prose, a BPE or WordPiece vocabulary: before a model has read any of it
const DEFAULT_FLOPS = 4e10;          // operations a second, until this page has timed a long enough run (SmolLM2 on
//                                      3,240 tokens, a 2-core machine under load: 4.2e10)
const TIMED_TOKENS = 64;             // a shorter run's time is mostly overhead: it says nothing of the rate
const count = (n) => Math.round(n).toLocaleString("en-US");

/** Where the text's first segment stops being read: the characters the tokens cover, of how many. */
function covered(meta, st) {
  let end = 0;
  meta.tokens.forEach((_, i) => {
    if (!meta.special[i] && meta.segments[i] === 0) end = Math.max(end, meta.offsets[i][1]);
  });
  return { end, chars: st.text.length };
}

/** How many tokens the whole text is: the server's count (text_tokens: it tokenised all of a cut single text), else
 *  about how many, from the share of its characters a cut run read (the same tokenizer's rate over the part it read). */
export function totalTokens(meta, st) {
  if (meta.truncated && meta.text_tokens) return meta.text_tokens;
  const { end, chars } = covered(meta, st);
  if (!meta.truncated || end <= 0) return meta.tokens.length;
  return Math.max(meta.tokens.length + 1, Math.round(meta.tokens.length * chars / end));
}

/** The banner: shown when the run cut the text (how much was read, of about how much, and which served models read
 *  more: links that switch to them, with the same text), or read all of a long one. */
export function showLength(box, meta, st, info) {
  if (meta.stack || (!meta.truncated && meta.tokens.length <= LONG_TOKENS)) {
    box.hidden = true;
    replace(box);
    return;
  }
  if (!meta.truncated) {
    replace(box, h("strong", { text: `Read all ${count(meta.tokens.length)} tokens of the text` }),
      ` (${info.title} reads up to ${count(info.max_tokens)}).`);
    box.dataset.read = box.dataset.total = String(meta.tokens.length);
    box.hidden = false;
    return;
  }
  const T = meta.tokens.length, total = totalTokens(meta, st), { end, chars } = covered(meta, st);
  const more = BOOT.models.filter((m) => m.id !== info.id && m.max_tokens > info.max_tokens && m.kind !== "encoder-decoder")
    .sort((a, b) => b.max_tokens - a.max_tokens);
  const pct = Math.max(1, Math.floor(100 * end / Math.max(chars, 1)));
  replace(box,
    h("strong", { text: meta.text_tokens ? `Read ${count(T)} of ${count(total)} tokens. `
      : `Read ${count(T)} of about ${count(total)} tokens (an estimate from the characters read). ` }),
    `${info.title} reads at most ${count(info.max_tokens)}: every view shows the first ${pct} % of the text ` +
      `(${count(end)} of ${count(chars)} characters); the rest was not run. `,
    more.length ? readsMore(more, total) : "No served model reads more.");
  box.dataset.read = String(T);
  box.dataset.total = String(total);
  box.dataset.exact = String(Boolean(meta.text_tokens));
  box.hidden = false;
}

/** "SmolLM2-135M-Instruct and Gemma 3 270M read 4,096 tokens (enough for all of it); Tiny GPT (teaching) reads 512.":
 *  the served models that read more, most first, each a link to the same text on that model. */
function readsMore(more, total) {
  const link = (m) => h("a", { href: state.href({ model: m.id }), text: m.title });
  const join = (items, last = " and ") => items.map((x, k) => [k ? (k === items.length - 1 ? last : ", ") : "", x]);
  const counts = [...new Set(more.map((m) => m.max_tokens))];
  return [join(counts.map((n) => {
    const group = more.filter((m) => m.max_tokens === n);
    return [join(group.map(link)), ` read${group.length > 1 ? "" : "s"} ${count(n)} tokens${n >= total ? " (enough for all of it)" : ""}`];
  }), "; "), "."];
}

/** Why view cannot take a text of T tokens on model info ("" when it can), in plain words: the server's limits
 *  (BOOT.limits) as the API applies them, so the tab is disabled before it is asked. */
export function tooLong(info, view, T) {
  if (!T || info.kind === "encoder-decoder") return "";
  const { patching_tokens: most, stacked_mb: mb } = BOOT.limits || {};
  if ((view === "lens" || view === "effects") && most && T > most) {
    const what = view === "lens" ? "the logit lens" : "the effects of heads";
    return `this text is ${count(T)} tokens, and ${what} keeps every layer's values of each token: at most ${count(most)} here. Shorten the text to try it`;
  }
  if (view === "stages" && mb) {
    const fits = Math.floor(Math.sqrt(mb * 2 ** 20 / (4 * info.layers * info.heads)));
    if (T > fits) return `this text is ${count(T)} tokens; the steps of one head come from a run of every layer at once, which takes at most ${count(fits)} tokens of ${info.title} here. Shorten the text to try it`;
  }
  return "";
}

/** Floating-point operations of one run over T tokens: two per weight and token, and the attention's scores and
 *  weighted values (T^2 per layer and head dimension, twice). */
const work = (info, T) => 2 * (info.capabilities?.parameters || 0) * T + 4 * info.layers * info.heads * (info.d_head || 64) * T * T;

/** A finished run's rate (operations a second), from its answer's time. */
export function rateOf(info, meta) {
  const ms = meta.timing_ms?.model;
  return ms > 0 && meta.tokens?.length >= TIMED_TOKENS ? work(info, meta.tokens.length) / (ms / 1000) : null;
}

/** Before a long run: about how many tokens it reads, how long it takes at `rate` (operations a second; null: not
 *  measured yet) and, once a long run of this model was measured (`perToken`: bytes a token), how much data it brings. */
export function estimate(info, st, rate, perToken = null) {
  const T = Math.min(info.max_tokens, Math.ceil((st.text.length + (st.text_pair || "").length) / CHARS_PER_TOKEN));
  const seconds = work(info, T) / (rate || DEFAULT_FLOPS);
  const size = perToken ? ` and ${fmtBytes(perToken * T)}` : "";
  return { tokens: T, seconds, text: `${MODELS[info.id]?.title ?? info.title} on about ${count(T)} tokens: about ${fmtSeconds(seconds)}${size}` };
}

export const fmtSeconds = (s) => (s < 60 ? `${Math.max(1, Math.ceil(s))} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`);
