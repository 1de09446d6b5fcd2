// Pure helpers on decoded answers: which tokens are shown, sub-matrices, renormalisation, the mask,
// sentence pairs, tick labels, a generation's growing answer.
import { Tensor } from "./api.js";

/** Indices of the tokens to show: all, or all but the special tokens ([CLS], [SEP]). */
export function visibleTokens(meta, hideSpecial) {
  const idx = [];
  meta.tokens.forEach((_, i) => { if (!(hideSpecial && meta.special[i])) idx.push(i); });
  return idx.length ? idx : meta.tokens.map((_, i) => i);
}

/**
 * The rows x cols of a T x T matrix (a Tensor of shape [T, T]), read in place: no copy, so it serves a
 * 4096 x 4096 matrix as well as a small one.
 * renormOver: null, or the keys over which each row is renormalised to sum to 1 (the visible ones).
 * Returns {value(a, b) (shown), raw(a, b) (the model's own), rowMass: kept mass per row (Float64Array)}, with a and
 * b positions in rows and cols.
 */
export function matrixCells(m, rows, cols = rows, renormOver = null) {
  const data = m.data, T = m.shape[m.shape.length - 1];
  const rowMass = new Float64Array(rows.length);
  rows.forEach((i, a) => {
    let s = 0;
    for (const j of renormOver ?? cols) s += data[i * T + j];
    rowMass[a] = s;
  });
  const raw = (a, b) => data[rows[a] * T + cols[b]];
  const value = renormOver ? (a, b) => (rowMass[a] > 0 ? raw(a, b) / rowMass[a] : raw(a, b)) : raw;
  return { value, raw, rowMass };
}

/**
 * The same as nested arrays (small matrices: tables, exports, Plotly heatmaps).
 * Returns {z: number[][] (shown), raw: number[][] (the model's own), rowMass: kept mass per row}.
 */
export function subMatrix(m, rows, cols = rows, renormOver = null) {
  const c = matrixCells(m, rows, cols, renormOver);
  const raw = rows.map((_, a) => cols.map((_, b) => c.raw(a, b)));
  const z = renormOver ? rows.map((_, a) => cols.map((_, b) => c.value(a, b))) : raw;
  return { z, raw, rowMass: Array.from(c.rowMass) };
}

export function maxOf(rows) {
  let m = 0;
  for (const r of rows) for (const v of r) if (v > m) m = v;
  return m;
}

/** The keys' tokens ({tokens, special}): the queries' own, except for an encoder-decoder's cross-attention, whose
 *  keys are the encoder's tokens (encdec.js stackMeta). */
export function keysOf(meta) {
  return meta.keys ?? meta;
}

/** The sliding window of `layer` when it is a local layer of model `info` (Gemma 2 and 3), else 0: there a query
 *  sees only its last `window` keys, its own included, a band that is part of the model's own mask. */
export function localWindow(info, layer) {
  return info && (info.local_layers || []).includes(layer) ? info.sliding_window : 0;
}

/** Is key j hidden from query i? The runtime's rule: causal (j > i), a masked key (not on the diagonal), or, on a
 *  local layer (localWindow), a key `window` or more tokens back. */
export function maskRule(meta, info = null, layer = null) {
  const masked = new Set(meta.mask_tokens), w = localWindow(info, layer);
  return (i, j) => (meta.causal && j > i) || (w > 0 && i - j >= w) || (i !== j && masked.has(j));
}

/** Is this run's mask the model's own? False for a what-if: causal switched, or tokens masked. */
export function ownMask(meta, info) {
  return meta.causal === (meta.stack ? meta.stack.causal : info.kind === "decoder") && meta.mask_tokens.length === 0;
}

/** For an answer of the model's own run (the QK attribution, the logit lens: they take no mask and no knocked-out
 *  heads): " It shows the model's own run: … do not apply to it." naming what of the page's run it leaves out, or "". */
export function ownRunNote(st, meta, info) {
  const left = [];
  if (!ownMask(meta, info)) left.push("the mask chosen above");
  if (st.ablate.length) left.push("the knocked-out heads");
  return left.length ? ` It shows the model's own run: ${left.join(" and ")} do${left.length > 1 ? "" : "es"} not apply to it.` : "";
}

/** Index where sentence B starts (BertViz's split: [CLS] A [SEP] | B [SEP]), or -1 for a single text. */
export function pairStart(meta) {
  return meta.segments.indexOf(1);
}

/** Sentence of each token, 0 (A) or 1 (B). */
export function sentences(meta) {
  const b = pairStart(meta);
  return meta.tokens.map((_, i) => (b >= 0 && i >= b ? 1 : 0));
}

export const PAIR_FILTERS = [["all", "all pairs"], ["ab", "A → B"], ["ba", "B → A"], ["within", "within each sentence"]];

/**
 * The queries (rows) and keys (cols) a pair filter shows, from the visible tokens idx, and keep(i, j):
 * false for a cell the filter leaves out ("within": the other sentence). No pair: everything. keyIdx: the visible keys
 * when they are other tokens than the queries (cross-attention: meta.keys).
 */
export function pairView(meta, idx, filter, keyIdx = idx) {
  const s = sentences(meta), all = { rows: idx, cols: keyIdx, keep: () => true, filter: "all" };
  if (meta.keys || pairStart(meta) < 0 || filter === "all") return all;
  const A = idx.filter((i) => s[i] === 0), B = idx.filter((i) => s[i] === 1);
  if (filter === "ab" && A.length && B.length) return { rows: A, cols: B, keep: () => true, filter };
  if (filter === "ba" && A.length && B.length) return { rows: B, cols: A, keep: () => true, filter };
  if (filter === "within") return { rows: idx, cols: idx, keep: (i, j) => s[i] === s[j], filter };
  return all;
}

/** Position in `list` (shown indices) after which sentence B starts, or -1: where a divider goes. */
export function dividerAt(meta, list) {
  const b = pairStart(meta);
  if (b < 0) return -1;
  const p = list.findIndex((i) => i >= b);
  return p > 0 ? p : -1;
}

/** Keep at most ~n labels along an axis: returns the positions to label. */
export function thinTicks(count, n = 40) {
  const step = Math.max(1, Math.ceil(count / n));
  const out = [];
  for (let i = 0; i < count; i += step) out.push(i);
  return out;
}

/** Positions to label along an axis of `px` pixels showing positions lo..hi: every one when they fit
 *  (`perLabel` pixels each), else every k-th. */
export function ticksIn(lo, hi, px, perLabel) {
  const a = Math.max(0, Math.ceil(lo)), b = Math.floor(hi);
  if (b < a) return [];
  const step = Math.max(1, Math.ceil((b - a + 1) / Math.max(1, Math.floor(px / perLabel))));
  const out = [];
  for (let i = Math.ceil(a / step) * step; i <= b; i += step) out.push(i);
  return out;
}

/** Characters of text (with the second sentence) past which a run may be long, on a model that reads more than
 *  LONG_TOKENS tokens (SmolLM2: 2048 tokens take seconds). */
export const LONG_TEXT = 1500, LONG_TOKENS = 512;

/** May this state's run take over a second? Then its progress is streamed, and its T x T matrices travel as float16.
 *  Never an encoder-decoder's: both its stacks run at once, not layer by layer. */
export function longText(st, info) {
  return info.kind !== "encoder-decoder" && info.max_tokens > LONG_TOKENS && st.text.length + (st.text_pair || "").length > LONG_TEXT;
}

/** The run options shared by every request for a state. */
export function runOptions(st, info) {
  const body = { model: st.model, text: st.text };
  if (info.pair && st.text_pair) body.text_pair = st.text_pair;
  if (info.kind === "encoder-decoder" && st.decoder_text.trim()) body.decoder_text = st.decoder_text;
  if (st.causal !== null) body.causal = st.causal;
  if (st.mask_tokens.length) body.mask_tokens = st.mask_tokens;
  if (st.ablate.length) {                                  // knocked-out heads change every view's run
    body.ablate = st.ablate.map((x) => x.split(".").map(Number));
    body.ablation = st.ablation;
  }
  return body;
}

// ---- a generation's growing answer ---------------------------------------------------------------------------
/** The prompt's answer (meta) with a generation's new tokens appended (steps: POST /api/generate's token lines,
 *  in order): tokens, ids, offsets in the text prompt + continuation (code points, as the API counts them), and
 *  each token's log-probability (the chips' surprisal). The next-token panel and the knock-out effect speak of
 *  the prompt's last token: left out. `generated` is the index of the first new token. */
export function grownMeta(meta, steps, prompt) {
  const T0 = meta.tokens.length, base = Array.from(prompt).length;
  const more = (list, f) => (list ? [...list, ...steps.map(f)] : list);
  let end = base;
  const offsets = steps.map((s) => {
    const start = end;
    end = base + Array.from(s.text).length;
    return [start, end];
  });
  const { next_tokens: _next, effect: _effect, ...rest } = meta;
  return { ...rest, tokens: more(meta.tokens, (s) => s.token), token_ids: more(meta.token_ids, (s) => s.id),
    special: more(meta.special, () => false), segments: more(meta.segments, () => 0),
    offsets: meta.offsets && [...meta.offsets, ...offsets],
    token_logprobs: more(meta.token_logprobs, (s) => (s.probability > 0 ? Math.log(s.probability) : -Infinity)),
    generated: T0 };
}

/** One view answer grown by the streamed rows: r must be one head's full T0 x T0 matrix (layers [l], heads [h])
 *  of a head the stream carries (steps' attention is [layer][head][key] over `layers` x `heads`); each new token
 *  adds its row, zeros right of it (a causal model puts exactly 0 on future keys), and its key column. null when r
 *  is anything else (several heads, top keys, block means) or the stream does not carry its head. */
export function grownAnswer(r, steps, layers, heads) {
  const li = r.layers?.length === 1 ? layers.indexOf(r.layers[0]) : -1;
  const hi = r.heads?.length === 1 ? heads.indexOf(r.heads[0]) : -1;
  const m = r.attention;
  if (li < 0 || hi < 0 || !m || m.shape.length !== 4 || r.top_keys || r.blocks) return null;
  const T0 = m.shape[3], T = T0 + steps.length;
  if (steps.some((s, k) => s.index !== T0 + k || !s.attention)) return null;    // not this prompt's tokens
  const data = new Float32Array(T * T);
  for (let i = 0; i < T0; i++) data.set(m.data.subarray(i * T0, (i + 1) * T0), i * T);
  steps.forEach((s, k) => data.set(s.attention[li][hi], (T0 + k) * T));
  return { ...r, tokens: r.tokens && [...r.tokens, ...steps.map((s) => s.token)],
    attention: new Tensor(data, [1, 1, T, T]) };
}
