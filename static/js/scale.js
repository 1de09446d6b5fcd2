// The ONE colour-scale and number-format module. Every view takes its colours and its number
// formatting from here, so a heatmap, a canvas thumbnail and a table cell agree.

// cividis (Nuñez, Anderton & Renslow 2018): sequential, perceptually uniform, readable with every
// common form of colour blindness. Same stops as Plotly's built-in "Cividis".
const CIVIDIS = [
  [0, [0, 32, 76]], [0.058824, [0, 42, 102]], [0.117647, [0, 52, 110]], [0.176471, [39, 63, 108]],
  [0.235294, [60, 74, 107]], [0.294118, [76, 85, 107]], [0.352941, [91, 95, 109]], [0.411765, [104, 106, 112]],
  [0.470588, [117, 117, 117]], [0.529412, [131, 129, 120]], [0.588235, [146, 140, 120]],
  [0.647059, [161, 152, 118]], [0.705882, [176, 165, 114]], [0.764706, [192, 177, 109]],
  [0.823529, [209, 191, 102]], [0.882353, [225, 204, 92]], [0.941176, [243, 219, 79]], [1, [255, 233, 69]],
];

// Diverging, colour-blind safe (ColorBrewer PuOr): purple for negative, orange for positive.
const PUOR = [
  [0, [84, 39, 136]], [0.125, [128, 115, 172]], [0.25, [178, 171, 210]], [0.375, [216, 218, 235]],
  [0.5, [247, 247, 247]], [0.625, [254, 224, 182]], [0.75, [253, 184, 99]], [0.875, [224, 130, 20]],
  [1, [179, 88, 6]],
];

const rgbString = ([r, g, b]) => `rgb(${r},${g},${b})`;

/** Plotly colorscales built from the same stops. */
export const plotlyScale = CIVIDIS.map(([t, c]) => [t, rgbString(c)]);
export const plotlyDiverging = PUOR.map(([t, c]) => [t, rgbString(c)]);
export const SCALE_NAME = "cividis (colour-blind safe)";

function interpolate(stops, t) {
  if (!(t > 0)) return stops[0][1];
  if (t >= 1) return stops[stops.length - 1][1];
  let i = 1;
  while (stops[i][0] < t) i++;
  const [t0, c0] = stops[i - 1], [t1, c1] = stops[i];
  const f = (t - t0) / (t1 - t0);
  return [0, 1, 2].map((k) => Math.round(c0[k] + f * (c1[k] - c0[k])));
}

/** 256-entry RGB lookup table (Uint8ClampedArray, 3 bytes per entry) for canvas drawing. */
export const LUT = (() => {
  const lut = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) lut.set(interpolate(CIVIDIS, i / 255), i * 3);
  return lut;
})();

/** Sequential colour of t in [0, 1]. */
export function color(t) {
  return rgbString(interpolate(CIVIDIS, t));
}

/** Diverging colour of v in [-absmax, absmax]. */
export function divergingColor(v, absmax) {
  const t = absmax > 0 ? 0.5 + 0.5 * Math.max(-1, Math.min(1, v / absmax)) : 0.5;
  return rgbString(interpolate(PUOR, t));
}

function luminance([r, g, b]) {
  return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}

/** Black or white text, whichever reads on the sequential colour of t. */
export function textOn(t) {
  return luminance(interpolate(CIVIDIS, t)) > 0.45 ? DARK_TEXT : LIGHT_TEXT;
}

export function textOnDiverging(v, absmax) {
  const t = absmax > 0 ? 0.5 + 0.5 * Math.max(-1, Math.min(1, v / absmax)) : 0.5;
  return luminance(interpolate(PUOR, t)) > 0.45 ? DARK_TEXT : LIGHT_TEXT;
}

// ---- the colour-range rule -----------------------------------------------------------------------
// Probabilities and masses are coloured on a fixed 0–1 scale by default, in every view: a weight of 0.013 is
// dark in every head and every thumbnail, and yellow always means "most of the row". The "per head" option
// (state.scale = "head") stretches each picture to its own maximum, which is then named on the picture.
// Other statistics have a fixed range of their own: entropy 0 to ln T nats, distance 0 to T − 1 tokens.
export const SCALE_MODES = [["fixed", "fixed 0–1"], ["head", "per head"]];

/** Masked cells (the model could not look there; weight exactly 0): white, which cividis never reaches. */
export const MASKED_COLOR = "#ffffff";
/** Cells left out by a filter (e.g. the other sentence of a pair): a light grey, lighter than any cividis tone. */
export const FILTERED_COLOR = "#e4e6ea";
/** The same two as [r, g, b] bytes, for pictures painted pixel by pixel on a canvas. */
const bytes = (hex) => [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16));
export const MASKED_RGB = bytes(MASKED_COLOR), FILTERED_RGB = bytes(FILTERED_COLOR);

/** The top of a quantity's fixed scale: 1 for probabilities and masses, ln T for entropy, T − 1 for distance. */
export function fixedTop(stat, T, distNorm = false) {
  if (stat === "mean_entropy") return Math.log(Math.max(T, 2));
  if (stat === "mean_distance") return distNorm ? 1 : Math.max(T - 1, 1);
  return 1;
}

/** The colour range of one picture: {zmin, zmax, perHead, label} where label says which scale it is on.
 *  max: the picture's largest value; top: the quantity's fixed top (fixedTop). */
export function colourRange(st, max, top = 1) {
  const perHead = st.scale === "head";
  const zmax = perHead ? Math.max(max, 1e-9) : top;
  return { zmin: 0, zmax, perHead,
    label: perHead ? `scaled to its maximum ${fmt(max, 3)}` : `fixed scale 0–${top === 1 ? 1 : fmt(top, 2)}` };
}

// Differences, signed maps and scores that are not probabilities (the Compare difference map, attributions, the
// circuits' maps) are drawn on a range fitted to the data by default, symmetric round 0 for a signed map: its largest
// absolute value is the scale's end, so a difference of 0.15 is not drawn as blank on ±1. "fixed" (state.signed)
// draws a quantity with a known bound on that bound instead (an attention difference, a copying score: ±1).
export const SIGNED_MODES = [["fitted", "fitted to the data"], ["fixed", "fixed (±1)"]];

/** The largest |v| of nested arrays of numbers (nulls skipped). */
export function absMax(rows) {
  let m = 0;
  for (const v of rows.flat(Infinity)) if (v !== null && Number.isFinite(v)) m = Math.max(m, Math.abs(v));
  return m;
}

/** The range of a signed quantity (attributions, effects, differences) on the diverging scale: symmetric round 0,
 *  so 0 is the scale's middle (white) and equal sizes of either sign are equally strong: {zmin, zmid: 0, zmax,
 *  absmax, fixed, label}. rows: nested arrays of numbers (nulls skipped); bound: the quantity's own bound, used when
 *  st.signed is "fixed" (none: always fitted). */
export function divergingRange(rows, st = null, bound = null) {
  const absmax = absMax(rows);
  const fixed = bound !== null && st?.signed === "fixed";
  const top = fixed ? bound : absmax > 0 ? absmax : bound ?? 1;     // all zero: its bound (no scale of 1e-9)
  return { zmin: -top, zmid: 0, zmax: top, absmax, fixed,
    label: absmax === 0 && !fixed ? `all 0 (shown on ${MINUS}${fmtSig(top)} to +${fmtSig(top)}, 0 white)` : `${fixed ? "fixed" : "fitted"} symmetric scale ${MINUS}${fmtSig(top)} to +${fmtSig(top)}` +
      `${fixed ? ` (largest |value| ${fmtSig(absmax)})` : " (its largest |value|)"}, 0 white (purple: negative, orange: positive)` };
}

/** The range of a score from 0 to its bound that is not a probability (a composition score): fitted 0 to its
 *  largest value, or with st.signed "fixed", 0 to bound: {zmin, zmax, fixed, label}. */
export function scoreRange(rows, st, bound = 1) {
  const max = absMax(rows), fixed = st.signed === "fixed";
  const top = fixed ? bound : Math.max(max, 1e-9);
  return { zmin: 0, zmax: top, fixed,
    label: fixed ? `fixed scale 0–${fmtSig(bound)} (largest ${fmtSig(max)})` : `fitted scale 0–${fmtSig(top)} (its largest value)` };
}

/** 0..255 index into LUT of value v on a colour range. */
export function lutIndex(v, range) {
  return Math.min(255, Math.max(0, Math.round((v / range.zmax) * 255)));
}

/** Bars of a signed quantity (the head view's "why" chart): one tone of the diverging scale for each sign, orange
 *  for positive and purple for negative, as on its maps. */
export const POSITIVE = rgbString(PUOR[7][1]), NEGATIVE = rgbString(PUOR[1][1]);
export const signColor = (v) => (v < 0 ? NEGATIVE : POSITIVE);

// Categorical colours for heads (line view, entropy view): Paul Tol's "muted" palette plus three
// Okabe–Ito colours; distinguishable with colour blindness when only a few are shown at once.
export const HEAD_COLORS = ["#332288", "#CC6677", "#117733", "#DDAA33", "#88CCEE", "#882255",
  "#44AA99", "#999933", "#AA4499", "#0072B2", "#E69F00", "#555555"];
export const headColor = (h) => HEAD_COLORS[h % HEAD_COLORS.length];

// ---- the page's other colours ----------------------------------------------------------------------
// Every colour a view, a chart or an export draws with, by what it is for; the names that match a variable of
// static/css/app.css say so, and must keep its value (a picture and the page around it agree).
/** Backgrounds of charts, drawings and exported pictures (app.css --panel). */
export const PAPER = "#fff";
/** Text on a light background: token labels, numbers on light cells. */
export const DARK_TEXT = "#111";
/** Text on a dark background: numbers on dark cells. */
export const LIGHT_TEXT = "#fff";
/** The page's text colour, in exported pictures (app.css --fg). */
export const INK = "#1b1b1f";
/** Quieter text in exported pictures: a corner label (app.css --muted). */
export const MUTED_INK = "#555a64";
/** Secondary text: an exported step's sentence, the numbers of a masked cell and of the mask step. */
export const SOFT_INK = "#333";
/** The "query" and "key" captions over the line view. */
export const CAPTION_INK = "#555";
/** Special tokens ([CLS], [SEP]) in the line view: greyer than the others. */
export const SPECIAL_INK = "#666";
/** The labels of the model view's PNG. */
export const LABEL_INK = "#222";
/** The frame round each thumbnail of the model view's PNG (app.css --line). */
export const FRAME_LINE = "#d5d8de";
/** The head view's axis lines. */
export const AXIS_LINE = "#c9ccd3";
/** The diagonal stroke through a masked cell of an exported step. */
export const MASKED_STROKE = "#dfe2e7";
/** The mask step's cells that hide nothing (0): neutral, so the −∞ cells stand out. */
export const NEUTRAL_CELL = "#eef0f3";
/** The Σ column of an exported step. */
export const SUM_CELL = "#f4f5f7";
/** The line between the sentences of a pair (head and line views). */
export const PAIR_DIVIDER = "#e7298a";
/** What the page points at on a chart: the pinned row, the current head. */
export const HIGHLIGHT = "#ff7f0e";
/** Probability bars: the next-token panel's (app.css .next-tokens .bar), and the sampling panel's "sampled with". */
export const PROB_BAR = "#3b5b8c";
/** The bars they are compared with: the intact run (app.css .next-tokens.before .bar), the model's own probability. */
export const PROB_BAR_BEFORE = "#999";
/** No fill (an outline only). */
export const TRANSPARENT = "rgba(0,0,0,0)";

// ---- numbers ----------------------------------------------------------------------------------
const MINUS = "\u2212";
/** The additive mask's "minus infinity": float32 lowest (-3.4028235e38) or anything below -1e38. */
export const isMinusInf = (v) => v === -Infinity || v <= -1e38;

/** Fixed decimals for tables and labels; −∞ for masked scores; a true minus sign. */
export function fmt(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (isMinusInf(v)) return MINUS + "∞";
  if (v === Infinity) return "∞";
  const s = v !== 0 && Math.abs(v) < 0.5 * 10 ** -digits ? v.toExponential(1) : v.toFixed(digits);
  return s.replace(/-/g, MINUS);
}

/** v to `digits` significant digits (3-4 on the page), in plain decimals down to 1e-4 and with an exponent below (as
 *  Python's %g), a true minus sign: 0.1482, 12.35, 0.0004127, 2.049e−6. Plotly's hover and tick formats use d3's
 *  ".4r" (decimals throughout). */
export function fmtSig(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (isMinusInf(v)) return MINUS + "∞";
  if (!Number.isFinite(v)) return v > 0 ? "∞" : MINUS + "∞";
  if (v === 0) return "0";
  const r = Number(v.toPrecision(digits));
  // one format for a list of weights: an exponent below 1e-4 (Python's %g rule), so 2.049e-6 sits beside 3.331e-7
  const s = Math.abs(r) < 1e-4 ? r.toExponential(digits - 1).replace(/\.?0+e/, "e") : String(r);
  return s.replace(/-/g, MINUS);
}
export const SIG_FORMAT = ".4r";   // d3-format: 4 significant digits, decimal notation (fmtSig's rule)

/** The shortest decimal that reads back as the same float32: the exact value the model produced. */
export function fmtExact(v) {
  if (isMinusInf(v)) return MINUS + "∞";
  const f = Math.fround(v);
  for (let p = 1; p <= 9; p++) {
    const s = f.toPrecision(p);
    if (Math.fround(Number(s)) === f) return String(Number(s)).replace(/-/g, MINUS);
  }
  return String(f).replace(/-/g, MINUS);
}

/** Plain ASCII version of fmtExact for CSV / JSON / data attributes (parseFloat reads it back). */
export function exactString(v) {
  if (isMinusInf(v)) return "-Infinity";
  return fmtExact(v).replaceAll(MINUS, "-");
}

export function fmtMs(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

export function fmtBytes(n) {
  return n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MB` : n >= 1024 ? `${Math.round(n / 1024)} KB` : `${n} B`;
}
