// Head view: the query x key weights of one head as a heatmap across the panel's width; hover a cell for
// both tokens and the exact weight, zoom in (drag a box) and every token is labelled again, click a row
// (or a token chip) to pin it and list its weights below. A long text's matrix (up to 4096 x 4096) is painted
// into a canvas, one pixel per cell, and drawn as one Plotly image under the same axes, hover and zoom. A click on a
// cell of the pinned row (or its "Why?" button in the list) asks why the head attends there (state.why): the panel
// below splits the cell's score into the parts of the residual stream that made it (why.js, POST /api/qk).
import { can, whyNot } from "../boot.js";
import { h, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { dividerAt, keysOf, localWindow, longText, maskRule, matrixCells, ownMask, pairView, sentences, ticksIn, visibleTokens } from "../matrix.js";
import { leaveOverview, OVERVIEW_TOKENS, overviewRequest, renderOverview } from "../overview.js";
import { renderWhy, WHY_TOP } from "../why.js";
import { AXIS_LINE, color, colourRange, exactString, FILTERED_COLOR, FILTERED_RGB, fmt, fmtExact, fmtSig, HIGHLIGHT, LUT, lutIndex, MASKED_COLOR, MASKED_RGB, PAIR_DIVIDER, plotlyScale, textOn, TRANSPARENT } from "../scale.js";

export const title = "Head view";

export const orientation = "Rows: the token looking (its query). Columns: the tokens it looks at (their keys). " +
  "Bright: a strong look.";
export const help = "Each cell is how much weight the query puts on the key; every row of the model's matrix sums to 1. " +
  "Hover a cell for both tokens and the exact weight; drag a box to zoom in (double-click to zoom out); " +
  "click a row or a token to pin it, then a cell of the pinned row (or a “Why?” in its list) to see why the head " +
  "attends there.";

const LIST_LIMIT = 40;          // pinned rows longer than this list their top weights
const LABEL_CHARS = 14;         // tick labels longer than this are shortened (the hover has the whole token)
const MAX_CELL = 56;            // short texts: cells no larger than this (px), the plot narrower than the panel
const IMAGE_CELLS = 320 * 320;  // larger matrices are painted as one image, not sent to Plotly as numbers
const MIN_TICK_FONT = 10;       // never smaller (issue 51): a taller plot (READ_ROW), or every k-th label
const READ_ROW = 13;            // px a row gets at least, up to READ_ROWS rows (the page scrolls): labels stay >= 10 px
const READ_ROWS = 120;
const TEXT_TOKENS = 600;        // the coloured text shows at most this many keys        // zoomed in: tick labels shrink down to this (px) before some are left out

/** Does the state show a sentence pair? POST /api/qk explains one text. */
const shownPair = (st, info) => info.pair && Boolean(st.text_pair);

/** What to fetch: only this layer and head, float32 (about 0.25 MB at 256 tokens); a long text's matrix in
 *  float16 (8 MB at 2048 tokens, 32 MB at 4096). With a cell asked about (why), its QK attribution: a refusal (an
 *  index past the text's end) is shown in its panel. */
export function requests(st, info, meta) {
  if (meta && meta.tokens.length > OVERVIEW_TOKENS && !meta.stack) return [overviewRequest(st)];   // overview.js
  const out = [{ endpoint: "attention", layers: [st.layer], heads: [st.head], include: ["attention"],
    ...(longText(st, info) ? { dtype: "float16" } : {}) }];
  if (st.why && !shownPair(st, info) && can(info, "why")) {
    out.push({ endpoint: "qk", layer: st.layer, head: st.head, query: st.why[0], key: st.why[1], top: WHY_TOP, soft: true });
  }
  return out;
}

const shortLabel = (tok, n = LABEL_CHARS) => {
  const s = tokenLabel(tok);
  return plotlyText(s.length > n ? s.slice(0, n - 1) + "…" : s);
};

/** Tick values, labels and font size for positions lo..hi of an axis px pixels long: every label at the tick
 *  font (`font` px, `font` + 6 apart) when they fit; else every label at a smaller font, down to MIN_TICK_FONT,
 *  when that fits (a zoomed window of a long text); else every k-th label. */
function axisTicks(labels, lo, hi, px, font) {
  const n = Math.min(labels.length - 1, Math.floor(hi)) - Math.max(0, Math.ceil(lo)) + 1;
  const fit = Math.floor(px / Math.max(1, n)) - 2;                  // labels 2 px apart at this size
  const tight = n * (font + 6) > px && fit >= MIN_TICK_FONT;
  const size = tight ? Math.min(fit, font) : font;
  const vals = ticksIn(lo, Math.min(hi, labels.length - 1), px, tight ? size + 2 : font + 6);
  return { tickvals: vals, ticktext: vals.map((p) => labels[p]), tickfont: { size } };
}

/** The text itself, each key token coloured by the weight one query puts on it (BertViz's and CircuitsVis'
 *  colored_tokens): the pinned query's row, else the last one's. A click on a token pins it (not across
 *  cross-attention, whose keys are the encoder's). shown(a, b): the drawn value of row a, column b. */
function coloredText(el, meta, keys, rows, cols, shown, range, st, ctx) {
  const a = rows.includes(st.pin) ? rows.indexOf(st.pin) : rows.length - 1;
  const q = rows[a], own = keys === meta;
  el.dataset.query = q;
  const items = cols.slice(0, TEXT_TOKENS).map((j, b) => {
    const v = shown(a, b), masked = !(v >= 0);
    const t = masked ? 0 : Math.min(1, v / range.zmax);
    return h("span", { class: `ct${masked ? " masked" : ""}${own && j === q ? " query" : ""}`, "data-index": j,
      "data-weight": masked ? "" : exactString(v), style: masked ? null : `background:${color(t)};color:${textOn(t)}`,
      title: masked ? `${tokenLabel(keys.tokens[j])}: masked or left out` : `${tokenLabel(keys.tokens[j])}: weight ${fmtSig(v)}`,
      onclick: own ? () => ctx.go({ pin: j, why: null }) : null, text: tokenLabel(keys.tokens[j]) });
  });
  replace(el, h("span", { class: "ct-label", text: `${st.pin === q ? "Pinned" : "Last"} query “${tokenLabel(meta.tokens[q])}” reads: ` }),
    items, cols.length > TEXT_TOKENS ? h("span", { class: "hint", text: ` … (${cols.length - TEXT_TOKENS} more keys)` }) : "");
}

function pinnedPanel(panel, d, st, ctx) {
  const { meta, rows, cols, cells, renorm, hidden } = d;
  // the model's capability record says whether a cell can be asked why (POST /api/qk; not an encoder-decoder's)
  const keys = keysOf(meta), asks = can(ctx.info, "why");
  const pos = st.pin === null ? -1 : rows.indexOf(st.pin);
  if (pos < 0) {
    const why = st.pin === null || st.pin >= meta.tokens.length ? ""
      : meta.special[st.pin] && st.hide_special ? "The pinned token is hidden (special tokens are hidden). "
        : "The pinned token is not a query of this filter. ";
    replace(panel, h("p", { class: "hint", text: why + "Click a token chip or a row of the heatmap to pin it and list its weights." }));
    panel.dataset.pin = "";
    return;
  }
  const q = st.pin;
  const whyKey = st.why?.[0] === q ? st.why[1] : null;
  const items = cols.map((k, j) => ({ k, w: cells.value(pos, j), raw: cells.raw(pos, j), masked: hidden(q, k) }));
  const shown = items.length > LIST_LIMIT ? [...items].sort((a, b) => b.w - a.w).slice(0, LIST_LIMIT) : items;
  const table = h("table", { class: "weights", "aria-label": `Weights of query ${q}` },
    h("thead", {}, h("tr", {},
      h("th", { scope: "col", text: "key" }), h("th", { scope: "col", text: "token" }),
      h("th", { scope: "col", text: renorm ? "weight (renormalised)" : "weight" }),
      renorm && h("th", { scope: "col", text: "model's weight" }),
      h("th", { scope: "col", "aria-hidden": "true", class: "bar-col" }),
      asks && h("th", { scope: "col", class: "why-col" }, h("span", { class: "visually-hidden", text: "why" })))),
    h("tbody", {}, shown.map(({ k, w, raw: rw, masked }) => h("tr", {
      "data-key": k, "data-weight": exactString(w), "data-raw": exactString(rw),
      class: [masked && "masked", keys.special[k] && "special", k === whyKey && "why"].filter(Boolean).join(" "),
      title: masked ? "masked: hidden from this query, weight exactly 0" : null,
    },
    h("td", { class: "num", text: k }),
    h("td", { class: "tok", text: tokenLabel(keys.tokens[k]) }),
    h("td", { class: "num", text: masked ? "0 (masked)" : fmtSig(w), title: masked ? null : `exactly ${fmtExact(w)}` }),
    renorm && h("td", { class: "num", text: fmtSig(rw), title: `exactly ${fmtExact(rw)}` }),
    h("td", { class: "bar-col", "aria-hidden": "true" }, h("span", { class: "bar", style: `width:${(w * 100).toFixed(1)}%` })),
    asks && h("td", { class: "why-col" }, h("button", { type: "button", class: "small why-button", "data-why-key": k, text: "Why?",
      "aria-pressed": String(k === whyKey), title: "Why does the head attend here? Its score split into the parts that made it",
      "aria-label": `Why does query ${q} attend to key ${k}?`, onclick: () => ctx.go({ why: [q, k] }) }))))));
  const sum = items.reduce((s, r) => s + r.w, 0);
  replace(panel,
    h("h3", {}, `Pinned query ${q}: `, h("q", { class: "tok", text: tokenLabel(meta.tokens[q]) })),
    h("p", { class: "hint" },
      items.length > LIST_LIMIT ? `Its ${LIST_LIMIT} largest of ${items.length} weights, largest first. ` : "Its weight on every key shown. ",
      renorm ? `The visible keys held ${fmt(cells.rowMass[pos], 4)} of the row's weight before renormalising. ` : "",
      `The keys listed hold ${fmt(sum, 6)} of the row${renorm ? " as shown" : ""}. ` +
      (asks ? "Click a cell of this row, or a “Why?”, to see why the head attends there."
        : `“Why?” is not available for ${ctx.info.title}: ${whyNot(ctx.info, "why")}.`)),
    table,
    h("button", { type: "button", class: "small", onclick: () => ctx.go({ pin: null, why: null }), text: "Unpin" }));
  panel.dataset.pin = String(q);
}

function noteText(meta, st, ctx, renorm, view) {
  const own = ownMask(meta, ctx.info);
  const parts = meta.stack ? [meta.stack.note] : [];
  if (renorm) {
    parts.push("[CLS] and [SEP] are hidden. Each remaining row is renormalised to sum to 1 over the keys still shown, " +
      "so colours and numbers show how the rest of the attention is shared out (the hover and the pinned list also " +
      "give the weight before renormalising).");
  } else if (st.hide_special) {
    parts.push("No special tokens in this input: nothing is hidden.");
  } else {
    parts.push(own ? "All tokens shown; these are the model's own weights (each row sums to 1)."
      : "All tokens shown; these are the weights of the what-if run above (each row sums to 1 over the keys it " +
        "could see), not the model's own.");
  }
  if (view.filter === "ab") parts.push("Queries of sentence A (rows) → keys of sentence B (columns): each row shows the part of its weight that goes to B.");
  if (view.filter === "ba") parts.push("Queries of sentence B (rows) → keys of sentence A (columns): each row shows the part of its weight that goes to A.");
  if (view.filter === "within") parts.push("Only weights within each sentence are coloured; the other sentence's cells are grey.");
  const w = localWindow(ctx.info, st.layer);
  if (w) parts.push(`Layer ${st.layer} is a local layer (sliding window): each token sees only itself and the ` +
    `${w - 1} tokens before it. Keys further back are part of this layer's own mask, like the causal mask: white, ` +
    "weight exactly 0." + (globalLayers(ctx.info) ? ` Global layers (every earlier token): ${globalLayers(ctx.info)}.` : ""));
  return parts.join(" ");
}

/** The global layers of a model with local ones, as "5, 11, 17". */
function globalLayers(info) {
  return [...Array(info.layers).keys()].filter((l) => !info.local_layers.includes(l)).join(", ");
}

function legend(el, meta, view, anyMasked, range, renorm, window = 0) {
  const s = sentences(meta), b = meta.segments.indexOf(1);
  const items = [h("span", { class: "legend-item", "data-scale": range.perHead ? "head" : "fixed" },
    h("span", { class: "swatch scale-swatch", "aria-hidden": "true" }),
    `colours: ${renorm ? "renormalised weight" : "weight"}, ${range.label}`)];
  if (b >= 0) {
    const span = (k) => { const is = s.map((x, i) => (x === k ? i : -1)).filter((i) => i >= 0); return `${is[0]}–${is[is.length - 1]}`; };
    items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch seg-a", "aria-hidden": "true" }), `sentence A: tokens ${span(0)}`),
      h("span", { class: "legend-item" }, h("span", { class: "swatch seg-b", "aria-hidden": "true" }), `sentence B: tokens ${span(1)}`));
    if (view.filter === "all" || view.filter === "within") {
      items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch divider", style: `border-color:${PAIR_DIVIDER}`, "aria-hidden": "true" }), "dashed line: where B starts"));
    }
  }
  if (anyMasked) items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch", style: `background:${MASKED_COLOR}`, "aria-hidden": "true" }), "white: masked (the query cannot see the key; weight exactly 0)" +
    (window ? `, the sliding window of ${window} keys included` : "")));
  if (view.filter === "within") items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch", style: `background:${FILTERED_COLOR}`, "aria-hidden": "true" }), "grey: the other sentence (filtered out)"));
  replace(el, items);
}

function showTip(tip, wrap, e, lines) {
  replace(tip, lines.map((t) => h("div", { text: t })));
  tip.hidden = false;
  const box = wrap.getBoundingClientRect();
  const x = e.clientX - box.left, y = e.clientY - box.top;
  const w = tip.offsetWidth, hgt = tip.offsetHeight;
  tip.style.left = `${Math.max(0, x + 14 + w > box.width ? x - w - 14 : x + 14)}px`;
  tip.style.top = `${Math.max(0, y + 14 + hgt > box.height ? y - hgt - 14 : y + 14)}px`;
}

/** Paint the matrix as shown into a canvas, one pixel per cell: colours from the LUT, masked cells white,
 *  filtered-out cells grey; returns a PNG data URL for a Plotly image trace. */
function paintImage(nr, nc, shown, range) {
  const canvas = document.createElement("canvas");
  canvas.width = nc;
  canvas.height = nr;
  const g = canvas.getContext("2d");
  const img = g.createImageData(nc, nr), px = img.data;
  for (let a = 0, o = 0; a < nr; a++) {
    for (let b = 0; b < nc; b++, o += 4) {
      const v = shown(a, b);
      if (v === MASKED) px.set(MASKED_RGB, o);
      else if (v === FILTERED) px.set(FILTERED_RGB, o);
      else {
        const c = lutIndex(v, range) * 3;
        px[o] = LUT[c]; px[o + 1] = LUT[c + 1]; px[o + 2] = LUT[c + 2];
      }
      px[o + 3] = 255;
    }
  }
  g.putImageData(img, 0, 0);
  return canvas.toDataURL("image/png");
}
const MASKED = -1, FILTERED = -2;       // shown(a, b) for a cell the query cannot see, or a filter leaves out

/** Its first picture may be a canvas sketch before plotly.js has run (main.js drawSketch): a matrix Plotly gets as
 *  numbers, without the "why" panel (a chart of its own). A long text's image is painted once, for the figure. */
export function sketch({ meta }, st) {
  return !st.why && keysOf(meta).tokens.length * meta.tokens.length <= IMAGE_CELLS;
}

export function render(container, { meta, results: [ans, whyAns] }, st, ctx) {
  if (ans.blocks) return renderOverview(container, meta, ans, st, ctx);     // past OVERVIEW_TOKENS: overview.js
  leaveOverview(container);
  const keys = keysOf(meta);                         // the queries' own tokens, or (cross-attention) the encoder's
  const idx = visibleTokens(meta, st.hide_special), keyIdx = visibleTokens(keys, st.hide_special);
  const renorm = st.hide_special && keys.special.some(Boolean);
  const view = pairView(meta, idx, st.pairs, keyIdx);
  const { rows, cols } = view;
  const m = ans.attention.sub(0, 0);
  const cells = matrixCells(m, rows, cols, renorm ? keyIdx : null);
  const hidden = maskRule(meta, ctx.info, st.layer);       // a local layer's window too
  const nr = rows.length, nc = cols.length;
  // what each cell shows, worked out once (a long text has millions): its weight, or MASKED (the key is hidden
  // from the query), or FILTERED (the other sentence)
  const values = new Float64Array(nr * nc);
  let anyMasked = false, max = 0;
  for (let a = 0, o = 0; a < nr; a++) {
    const i = rows[a];
    for (let b = 0; b < nc; b++, o++) {
      const j = cols[b];
      const v = hidden(i, j) ? MASKED : view.keep(i, j) ? cells.value(a, b) : FILTERED;
      values[o] = v;
      if (v === MASKED) anyMasked = true;
      else if (v > max) max = v;
    }
  }
  const shown = (a, b) => values[a * nc + b];
  const range = colourRange(st, max);
  const image = nr * nc > IMAGE_CELLS;

  const note = part(container, "note", "p", { class: "note" });
  note.textContent = noteText(meta, st, ctx, renorm, view) + (m.dtype === "float16"
    ? " Long text: the weights travel as float16 (about 3 significant digits)." : "");
  legend(part(container, "legend", "p", { class: "legend" }), meta, view, anyMasked, range, renorm,
    localWindow(ctx.info, st.layer));
  coloredText(part(container, "text", "p", { class: "colored-tokens" }), meta, keys, rows, cols, shown, range, st, ctx);
  const layout = part(container, "layout", "div", { class: "head-layout" });
  const wrap = part(layout, "wrap", "div", { class: "plot-wrap" });
  const plot = part(wrap, "plot", "div", { class: "plot head-plot", role: "figure" });
  const tip = part(wrap, "tip", "div", { class: "tip", role: "tooltip", hidden: true });
  const side = part(layout, "side", "div", { class: "side" });
  const readout = part(side, "readout", "p", { class: "readout" });
  const panel = part(side, "pinned", "div", { class: "pinned" });
  plot.setAttribute("aria-label", `Heatmap of layer ${st.layer}, head ${st.head}: ${nr} query rows by ${nc} key columns. ` +
    "Pin a token with the token chips to read its weights.");
  plot.dataset.drawn = image ? "image" : "heatmap";
  if (!readout.dataset.query) readout.textContent = "Hover a cell to read both tokens and the exact weight.";

  // Size: the panel's whole width; cells square when the window is tall enough, else as tall as it allows.
  const width = Math.max(260, layout.clientWidth || container.clientWidth || 800);
  const narrow = width < 640, font = ctx.font;
  const chars = narrow ? 8 : LABEL_CHARS;
  const rowLabels = rows.map((i) => shortLabel(meta.tokens[i], chars)), colLabels = cols.map((i) => shortLabel(keys.tokens[i], chars));
  const margin = narrow ? { l: 64, r: 4, t: 36, b: 64 } : { l: 118, r: 16, t: 46, b: 112 };
  const bar = narrow ? 48 : 86;                                               // the colour bar's share
  const cell = Math.min((width - margin.l - margin.r - bar) / nc, MAX_CELL);
  const plotW = cell * nc;
  const readable = Math.min(nr, READ_ROWS) * READ_ROW + margin.t + margin.b;     // every row label at 10 px or more
  // where the first screen has room for the whole picture (1440x900), it ends there, its key labels in view; else as
  // tall as most of the window (the page scrolls)
  const room = window.innerHeight - (plot.getBoundingClientRect().top + window.scrollY) - 8;
  const screen = !narrow && room >= 380 ? room : window.innerHeight * (narrow ? 0.7 : 0.9);
  const height = Math.round(Math.max(narrow ? 300 : 380,
    Math.min(cell * nr + margin.t + margin.b, Math.max(screen, readable))));
  const figWidth = cell < MAX_CELL ? undefined : Math.round(plotW + margin.l + margin.r + bar);   // short texts
  plot.style.height = `${height}px`;
  const tickFont = font - 1;
  const rev = `${st.model}|${st.text}|${st.text_pair}|${nr}x${nc}|${st.pairs}|${st.hide_special}`;
  const zoom = ctx.memory.zoom?.rev === rev ? ctx.memory.zoom : null;        // kept across heads (uirevision)
  const xt = axisTicks(colLabels, ...(zoom?.x ?? [0, nc - 1]), plotW, tickFont);
  const yt = axisTicks(rowLabels, ...(zoom?.y ?? [0, nr - 1]), height - margin.t - margin.b, tickFont);

  const colorbar = { title: { text: narrow ? "" : (renorm ? "weight<br>(renorm.)" : "weight"), side: "right" },
    thickness: narrow ? 8 : 14, tickfont: { size: font - 2 } };
  const traces = [];
  if (image) {
    // the colour bar, from an invisible one-cell heatmap on the same scale; the picture is the image on top
    traces.push({ type: "heatmap", z: [[range.zmin]], x: [0], y: [0], zmin: range.zmin, zmax: range.zmax,
      colorscale: plotlyScale, opacity: 0, hoverinfo: "skip", colorbar });
    traces.push({ type: "image", source: paintImage(nr, nc, shown, range), x0: 0, y0: 0, dx: 1, dy: 1,
      hoverinfo: "skip", name: `${nr}x${nc}` });
  } else {
    const z = rows.map((_, a) => cols.map((_, b) => { const v = shown(a, b); return v < 0 ? null : v; }));
    if (view.filter === "within") {
      traces.push({ type: "heatmap", z: rows.map((i) => cols.map((j) => (view.keep(i, j) ? null : 1))), showscale: false,
        colorscale: [[0, FILTERED_COLOR], [1, FILTERED_COLOR]], zmin: 0, zmax: 1, hoverinfo: "skip" });
    }
    traces.push({
      type: "heatmap", z, x: [...Array(nc).keys()], y: [...Array(nr).keys()], zmin: range.zmin, zmax: range.zmax,
      colorscale: plotlyScale, hoverinfo: "none", hoverongaps: true, xgap: nc <= 40 ? 1 : 0, ygap: nr <= 40 ? 1 : 0,
      colorbar,
    });
  }
  const shapes = [];
  const pinPos = st.pin === null ? -1 : rows.indexOf(st.pin);
  if (pinPos >= 0) {
    shapes.push({ type: "rect", xref: "x", yref: "y", x0: -0.5, x1: nc - 0.5, y0: pinPos - 0.5, y1: pinPos + 0.5,
      line: { color: HIGHLIGHT, width: 3 }, fillcolor: TRANSPARENT });
  }
  const whyAt = st.why ? [rows.indexOf(st.why[0]), cols.indexOf(st.why[1])] : [-1, -1];
  if (whyAt[0] >= 0 && whyAt[1] >= 0) {               // the cell the "why" panel explains
    shapes.push({ type: "rect", xref: "x", yref: "y", x0: whyAt[1] - 0.5, x1: whyAt[1] + 0.5, y0: whyAt[0] - 0.5,
      y1: whyAt[0] + 0.5, line: { color: HIGHLIGHT, width: 3, dash: "dot" }, fillcolor: TRANSPARENT });
  }
  if (view.filter === "all" || view.filter === "within") {
    const dx = dividerAt(meta, cols), dy = dividerAt(meta, rows);
    const line = { color: PAIR_DIVIDER, width: 2, dash: "dash" };
    if (dx > 0) shapes.push({ type: "line", xref: "x", yref: "paper", x0: dx - 0.5, x1: dx - 0.5, y0: 0, y1: 1, line });
    if (dy > 0) shapes.push({ type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: dy - 0.5, y1: dy - 0.5, line });
  }
  const axis = (t, ticks) => ({
    title: { text: narrow ? "" : t }, tickmode: "array", ...ticks,
    showgrid: false, zeroline: false, fixedrange: false, showline: true, linecolor: AXIS_LINE, mirror: true,
    scaleanchor: false,                  // an image trace would otherwise keep its pixels square
  });
  const axisTitle = (side) => meta.stack ? meta.stack[side === "x" ? "key" : "query"] : view.filter === "ab" ? (side === "x" ? "key in sentence B" : "query in sentence A")
    : view.filter === "ba" ? (side === "x" ? "key in sentence A" : "query in sentence B")
      : side === "x" ? "key (attended to)" : "query (attending)";
  ctx.plot(plot, traces, {
    title: `${plotlyText(ctx.info.title)}${meta.stack ? ` · ${meta.stack.which === "cross" ? "cross-attention" : meta.stack.which}` : ""} · layer ${st.layer} · head ${st.head}`,
    margin, height, width: figWidth, autosize: figWidth === undefined, plot_bgcolor: MASKED_COLOR,
    xaxis: { ...axis(axisTitle("x"), xt), tickangle: -60, side: "bottom", ...(zoom ? { range: zoom.xr } : {}) },
    yaxis: { ...axis(axisTitle("y"), yt), autorange: zoom ? false : "reversed", ...(zoom ? { range: zoom.yr } : {}) },
    shapes, uirevision: rev, dragmode: "zoom",
  });

  if (!plot.dataset.wired && !ctx.sketching) {        // a sketch is no Plotly figure yet: the figure gets them
    plot.dataset.wired = "1";
    const memory = ctx.memory;
    // the listeners are added once; memory (the same object on every render) holds the latest drawing (shown)
    // and the zoom
    // Hover and click from the mouse position on the axes (the same for the heatmap and the image).
    const cellAt = (e) => {
      const cur = memory.shown, fl = plot._fullLayout, r = plot.getBoundingClientRect();
      if (!cur || !fl?.xaxis?.p2l) return null;
      const px = e.clientX - r.left - fl.xaxis._offset, py = e.clientY - r.top - fl.yaxis._offset;
      if (px < 0 || py < 0 || px > fl.xaxis._length || py > fl.yaxis._length) return null;
      const a = Math.round(fl.yaxis.p2l(py)), b = Math.round(fl.xaxis.p2l(px));
      return a >= 0 && a < cur.rows.length && b >= 0 && b < cur.cols.length ? [a, b] : null;
    };
    plot.addEventListener("mousemove", (e) => {
      const at = cellAt(e), cur = memory.shown;
      if (!at) { tip.hidden = true; return; }
      const [a, b] = at;
      const qi = cur.rows[a], ki = cur.cols[b], w = cur.cells.value(a, b);
      const masked = cur.hidden(qi, ki), out = !cur.keep(qi, ki);
      const pairText = `query ${qi} “${tokenLabel(cur.tokens[qi])}” → key ${ki} “${tokenLabel(cur.keyTokens[ki])}”`;
      const value = masked ? "masked: this query cannot see this key (weight exactly 0)"
        : `weight ${fmtSig(w)}` + (cur.renorm ? ` (model's own ${fmtSig(cur.cells.raw(a, b))})` : "") +
          (out ? " · the other sentence" : "");
      readout.dataset.query = qi;
      readout.dataset.key = ki;
      readout.dataset.weight = exactString(w);
      readout.textContent = `${pairText}: ${value}`;
      tip.dataset.query = qi;
      tip.dataset.key = ki;
      showTip(tip, wrap, e, [pairText, value]);
    });
    plot.addEventListener("mouseleave", () => { tip.hidden = true; });
    // a click pins the row under it, and on the pinned row asks why the head attends to that key (not the end of a
    // zoom drag, nor the second click of a double-click)
    let down = null;
    plot.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; }, true);
    plot.addEventListener("click", (e) => {
      const at = cellAt(e), cur = memory.shown;
      if (!at || e.detail > 1 || !down || Math.hypot(e.clientX - down[0], e.clientY - down[1]) > 4) return;
      const qi = cur.rows[at[0]], ki = cur.cols[at[1]];
      if (cur.pin !== qi) cur.go({ pin: qi });
      else if (cur.asks) cur.go({ why: [qi, ki] });
    });
    // Zooming relabels the axes: every token gets its label back once they fit.
    plot.on("plotly_relayout", (ev) => {
      if (!Object.keys(ev).some((k) => /range|autosize/.test(k))) return;
      const cur = memory.shown, fl = plot._fullLayout;
      const xr = [...fl.xaxis.range], yr = [...fl.yaxis.range];
      const reset = ev["xaxis.autorange"] || ev["yaxis.autorange"];
      const zoomed = !reset && (memory.zoom || Object.keys(ev).some((k) => k.includes(".range")));
      memory.zoom = zoomed
        ? { rev: cur.rev, xr, yr, x: [Math.min(...xr), Math.max(...xr)], y: [Math.min(...yr), Math.max(...yr)] } : null;
      const x = memory.zoom?.x ?? [0, cur.cols.length - 1], y = memory.zoom?.y ?? [0, cur.rows.length - 1];
      const xt2 = axisTicks(cur.colLabels, ...x, fl.xaxis._length, cur.tickFont);
      const yt2 = axisTicks(cur.rowLabels, ...y, fl.yaxis._length, cur.tickFont);
      window.Plotly.relayout(plot, { "xaxis.tickvals": xt2.tickvals, "xaxis.ticktext": xt2.ticktext,
        "xaxis.tickfont.size": xt2.tickfont.size, "yaxis.tickvals": yt2.tickvals, "yaxis.ticktext": yt2.ticktext,
        "yaxis.tickfont.size": yt2.tickfont.size });
    });
  }
  ctx.memory.shown = { rows, cols, cells, renorm, hidden, keep: view.keep, tokens: meta.tokens, keyTokens: keys.tokens,
    asks: can(ctx.info, "why"), pin: st.pin, go: ctx.go,
    rev, rowLabels, colLabels, tickFont };
  pinnedPanel(panel, { meta, rows, cols, cells, renorm, hidden }, st, ctx);
  renderWhy(part(container, "why", "section", { class: "why", "aria-label": "Why the head attends to a key" }),
    !can(ctx.info, "why") ? { refused: whyNot(ctx.info, "why") } : shownPair(st, ctx.info) ? undefined : whyAns, st, ctx, meta);
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  container.dataset.window = localWindow(ctx.info, st.layer);   // 0: a global layer (or a model without local ones)
  container.dataset.zmax = exactString(range.zmax);

  const tok = (i) => meta.tokens[i], keyTok = (i) => keys.tokens[i];
  const valueRows = () => rows.map((_, a) => cols.map((_, b) => Number(exactString(cells.value(a, b)))));
  container.dataset.attention = meta.stack?.which ?? "";
  return {
    plot,
    name: `attnscope-${st.model}-${meta.stack ? `${meta.stack.which}-` : ""}L${st.layer}H${st.head}`,
    csv: () => [["query\\key", ...cols.map((i) => `${i}:${keyTok(i)}`)],
      ...valueRows().map((r, a) => [`${rows[a]}:${tok(rows[a])}`, ...r])],
    json: () => ({
      model: st.model, text: st.text, text_pair: st.text_pair || null, layer: st.layer, head: st.head,
      causal: meta.causal, mask_tokens: meta.mask_tokens, renormalised: renorm, pairs: view.filter,
      colour_scale: { zmin: range.zmin, zmax: range.zmax, mode: range.perHead ? "per head" : "fixed" },
      query_indices: rows, key_indices: cols, tokens: meta.tokens, attention: valueRows(),
      ...(meta.stack ? { decoder_text: st.decoder_text, attention_of: meta.stack.which, key_tokens: keys.tokens } : {}),
    }),
  };
}
