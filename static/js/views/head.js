// Head view: the query x key weights of one head as a heatmap across the panel's width; hover a cell for
// both tokens and the exact weight, zoom in (drag a box) and every token is labelled again, click a row
// (or a token chip) to pin it and list its weights below.
import { h, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { dividerAt, maskRule, maxOf, ownMask, pairView, sentences, subMatrix, ticksIn, visibleTokens } from "../matrix.js";
import { colourRange, exactString, FILTERED_COLOR, fmt, fmtExact, MASKED_COLOR, plotlyScale } from "../scale.js";

export const title = "Head view";
export const help = "Rows are queries (the token doing the looking), columns are keys (the tokens it looks at). " +
  "Each cell is how much weight the query puts on the key; every row of the model's matrix sums to 1. " +
  "Hover a cell for both tokens and the exact weight; drag a box to zoom in (double-click to zoom out); " +
  "click a row or a token to pin it.";

const LIST_LIMIT = 40;          // pinned rows longer than this list their top weights
const LABEL_CHARS = 14;         // tick labels longer than this are shortened (the hover has the whole token)
const DIVIDER = "#e7298a";      // the line between the sentences of a pair
const MAX_CELL = 56;            // short texts: cells no larger than this (px), the plot narrower than the panel

/** What to fetch: only this layer and head, float32 (about 0.25 MB at 256 tokens). */
export function requests(st) {
  return [{ endpoint: "attention", layers: [st.layer], heads: [st.head], include: ["attention"] }];
}

const shortLabel = (tok, n = LABEL_CHARS) => {
  const s = tokenLabel(tok);
  return plotlyText(s.length > n ? s.slice(0, n - 1) + "…" : s);
};

/** Tick values and labels for positions lo..hi of an axis px pixels long. */
function axisTicks(labels, lo, hi, px, perLabel) {
  const vals = ticksIn(lo, hi, px, perLabel);
  return { tickvals: vals, ticktext: vals.map((p) => labels[p]) };
}

function pinnedPanel(panel, d, st, ctx) {
  const { meta, rows, cols, z, raw, rowMass, renorm, hidden } = d;
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
  const items = cols.map((k, j) => ({ k, w: z[pos][j], raw: raw[pos][j], masked: hidden(q, k) }));
  const shown = items.length > LIST_LIMIT ? [...items].sort((a, b) => b.w - a.w).slice(0, LIST_LIMIT) : items;
  const table = h("table", { class: "weights", "aria-label": `Weights of query ${q}` },
    h("thead", {}, h("tr", {},
      h("th", { scope: "col", text: "key" }), h("th", { scope: "col", text: "token" }),
      h("th", { scope: "col", text: renorm ? "weight (renormalised)" : "weight" }),
      renorm && h("th", { scope: "col", text: "model's weight" }),
      h("th", { scope: "col", "aria-hidden": "true", class: "bar-col" }))),
    h("tbody", {}, shown.map(({ k, w, raw: rw, masked }) => h("tr", {
      "data-key": k, "data-weight": exactString(w), "data-raw": exactString(rw),
      class: [masked && "masked", meta.special[k] && "special"].filter(Boolean).join(" "),
      title: masked ? "masked: hidden from this query, weight exactly 0" : null,
    },
    h("td", { class: "num", text: k }),
    h("td", { class: "tok", text: tokenLabel(meta.tokens[k]) }),
    h("td", { class: "num", text: masked ? "0 (masked)" : fmtExact(w) }),
    renorm && h("td", { class: "num", text: fmtExact(rw) }),
    h("td", { class: "bar-col", "aria-hidden": "true" }, h("span", { class: "bar", style: `width:${(w * 100).toFixed(1)}%` }))))));
  const sum = items.reduce((s, r) => s + r.w, 0);
  replace(panel,
    h("h3", {}, `Pinned query ${q}: `, h("q", { class: "tok", text: tokenLabel(meta.tokens[q]) })),
    h("p", { class: "hint" },
      items.length > LIST_LIMIT ? `Its ${LIST_LIMIT} largest of ${items.length} weights, largest first. ` : "Its weight on every key shown. ",
      renorm ? `The visible keys held ${fmt(rowMass[pos], 4)} of the row's weight before renormalising. ` : "",
      `The keys listed hold ${fmt(sum, 6)} of the row${renorm ? " as shown" : ""}.`),
    table,
    h("button", { type: "button", class: "small", onclick: () => ctx.go({ pin: null }), text: "Unpin" }));
  panel.dataset.pin = String(q);
}

function noteText(meta, st, ctx, renorm, view) {
  const own = ownMask(meta, ctx.info);
  const parts = [];
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
  return parts.join(" ");
}

function legend(el, meta, view, anyMasked, range, renorm) {
  const s = sentences(meta), b = meta.segments.indexOf(1);
  const items = [h("span", { class: "legend-item", "data-scale": range.perHead ? "head" : "fixed" },
    h("span", { class: "swatch scale-swatch", "aria-hidden": "true" }),
    `colours: ${renorm ? "renormalised weight" : "weight"}, ${range.label}`)];
  if (b >= 0) {
    const span = (k) => { const is = s.map((x, i) => (x === k ? i : -1)).filter((i) => i >= 0); return `${is[0]}–${is[is.length - 1]}`; };
    items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch seg-a", "aria-hidden": "true" }), `sentence A: tokens ${span(0)}`),
      h("span", { class: "legend-item" }, h("span", { class: "swatch seg-b", "aria-hidden": "true" }), `sentence B: tokens ${span(1)}`));
    if (view.filter === "all" || view.filter === "within") {
      items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch divider", style: `border-color:${DIVIDER}`, "aria-hidden": "true" }), "dashed line: where B starts"));
    }
  }
  if (anyMasked) items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch", style: `background:${MASKED_COLOR}`, "aria-hidden": "true" }), "white: masked (the query cannot see the key; weight exactly 0)"));
  if (view.filter === "within") items.push(h("span", { class: "legend-item" }, h("span", { class: "swatch", style: `background:${FILTERED_COLOR}`, "aria-hidden": "true" }), "grey: the other sentence (filtered out)"));
  replace(el, items);
}

function showTip(tip, wrap, ev, lines) {
  replace(tip, lines.map((t) => h("div", { text: t })));
  tip.hidden = false;
  const box = wrap.getBoundingClientRect(), e = ev.event || {};
  const x = (e.clientX ?? box.left) - box.left, y = (e.clientY ?? box.top) - box.top;
  const w = tip.offsetWidth, hgt = tip.offsetHeight;
  tip.style.left = `${Math.max(0, x + 14 + w > box.width ? x - w - 14 : x + 14)}px`;
  tip.style.top = `${Math.max(0, y + 14 + hgt > box.height ? y - hgt - 14 : y + 14)}px`;
}

export function render(container, { meta, results: [ans] }, st, ctx) {
  const idx = visibleTokens(meta, st.hide_special);
  const renorm = st.hide_special && meta.special.some(Boolean);
  const view = pairView(meta, idx, st.pairs);
  const { rows, cols } = view;
  const m = ans.attention.sub(0, 0);
  const { z: vals, raw, rowMass } = subMatrix(m, rows, cols, renorm ? idx : null);
  const hidden = maskRule(meta);
  let anyMasked = false;
  // drawn: null where the key is masked (white background) or filtered out (grey trace underneath)
  const z = rows.map((i, a) => cols.map((j, b) => {
    if (hidden(i, j)) { anyMasked = true; return null; }
    return view.keep(i, j) ? vals[a][b] : null;
  }));
  const range = colourRange(st, maxOf(z));
  const nr = rows.length, nc = cols.length;

  const note = part(container, "note", "p", { class: "note" });
  note.textContent = noteText(meta, st, ctx, renorm, view);
  legend(part(container, "legend", "p", { class: "legend" }), meta, view, anyMasked, range, renorm);
  const layout = part(container, "layout", "div", { class: "head-layout" });
  const wrap = part(layout, "wrap", "div", { class: "plot-wrap" });
  const plot = part(wrap, "plot", "div", { class: "plot head-plot", role: "figure" });
  const tip = part(wrap, "tip", "div", { class: "tip", role: "tooltip", hidden: true });
  const side = part(layout, "side", "div", { class: "side" });
  const readout = part(side, "readout", "p", { class: "readout" });
  const panel = part(side, "pinned", "div", { class: "pinned" });
  plot.setAttribute("aria-label", `Heatmap of layer ${st.layer}, head ${st.head}: ${nr} query rows by ${nc} key columns. ` +
    "Pin a token with the token chips to read its weights.");
  if (!readout.dataset.query) readout.textContent = "Hover a cell to read both tokens and the exact weight.";

  // Size: the panel's whole width; cells square when the window is tall enough, else as tall as it allows.
  const width = Math.max(260, layout.clientWidth || container.clientWidth || 800);
  const narrow = width < 640, font = ctx.font;
  const chars = narrow ? 8 : LABEL_CHARS;
  const rowLabels = rows.map((i) => shortLabel(meta.tokens[i], chars)), colLabels = cols.map((i) => shortLabel(meta.tokens[i], chars));
  const margin = narrow ? { l: 64, r: 4, t: 36, b: 64 } : { l: 118, r: 16, t: 46, b: 112 };
  const bar = narrow ? 48 : 86;                                               // the colour bar's share
  const cell = Math.min((width - margin.l - margin.r - bar) / nc, MAX_CELL);
  const plotW = cell * nc;
  const height = Math.round(Math.max(narrow ? 300 : 380,
    Math.min(cell * nr + margin.t + margin.b, window.innerHeight * (narrow ? 0.7 : 0.9))));
  const figWidth = cell < MAX_CELL ? undefined : Math.round(plotW + margin.l + margin.r + bar);   // short texts
  plot.style.height = `${height}px`;
  const perX = font + 5, perY = font + 5;                                    // pixels per tick label
  const rev = `${st.model}|${st.text}|${st.text_pair}|${nr}x${nc}|${st.pairs}|${st.hide_special}`;
  const zoom = plot._zoom?.rev === rev ? plot._zoom : null;                  // kept across heads (uirevision)
  const xt = axisTicks(colLabels, ...(zoom?.x ?? [0, nc - 1]), plotW, perX);
  const yt = axisTicks(rowLabels, ...(zoom?.y ?? [0, nr - 1]), height - margin.t - margin.b, perY);

  const traces = [];
  if (view.filter === "within") {
    traces.push({ type: "heatmap", z: rows.map((i) => cols.map((j) => (view.keep(i, j) ? null : 1))), showscale: false,
      colorscale: [[0, FILTERED_COLOR], [1, FILTERED_COLOR]], zmin: 0, zmax: 1, hoverinfo: "skip" });
  }
  traces.push({
    type: "heatmap", z, x: [...Array(nc).keys()], y: [...Array(nr).keys()], zmin: range.zmin, zmax: range.zmax,
    colorscale: plotlyScale, hoverinfo: "none", hoverongaps: true, xgap: nc <= 40 ? 1 : 0, ygap: nr <= 40 ? 1 : 0,
    colorbar: { title: { text: narrow ? "" : (renorm ? "weight<br>(renorm.)" : "weight"), side: "right" },
      thickness: narrow ? 8 : 14, tickfont: { size: font - 2 } },
  });
  const shapes = [];
  const pinPos = st.pin === null ? -1 : rows.indexOf(st.pin);
  if (pinPos >= 0) {
    shapes.push({ type: "rect", xref: "x", yref: "y", x0: -0.5, x1: nc - 0.5, y0: pinPos - 0.5, y1: pinPos + 0.5,
      line: { color: "#ff7f0e", width: 3 }, fillcolor: "rgba(0,0,0,0)" });
  }
  if (view.filter === "all" || view.filter === "within") {
    const dx = dividerAt(meta, cols), dy = dividerAt(meta, rows);
    const line = { color: DIVIDER, width: 2, dash: "dash" };
    if (dx > 0) shapes.push({ type: "line", xref: "x", yref: "paper", x0: dx - 0.5, x1: dx - 0.5, y0: 0, y1: 1, line });
    if (dy > 0) shapes.push({ type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: dy - 0.5, y1: dy - 0.5, line });
  }
  const axis = (t, ticks) => ({
    title: { text: narrow ? "" : t }, tickmode: "array", ...ticks, tickfont: { size: font - 1 },
    showgrid: false, zeroline: false, fixedrange: false, showline: true, linecolor: "#c9ccd3", mirror: true,
  });
  const axisTitle = (side) => view.filter === "ab" ? (side === "x" ? "key in sentence B" : "query in sentence A")
    : view.filter === "ba" ? (side === "x" ? "key in sentence A" : "query in sentence B")
      : side === "x" ? "key (attended to)" : "query (attending)";
  ctx.plot(plot, traces, {
    title: `${plotlyText(ctx.info.title)} · layer ${st.layer} · head ${st.head}`,
    margin, height, width: figWidth, autosize: figWidth === undefined, plot_bgcolor: MASKED_COLOR,
    xaxis: { ...axis(axisTitle("x"), xt), tickangle: -60, side: "bottom", ...(zoom ? { range: zoom.xr } : {}) },
    yaxis: { ...axis(axisTitle("y"), yt), autorange: zoom ? false : "reversed", ...(zoom ? { range: zoom.yr } : {}) },
    shapes, uirevision: rev, dragmode: "zoom",
  });

  if (!plot.dataset.wired) {
    plot.dataset.wired = "1";
    plot.on("plotly_hover", (ev) => {
      const p = ev.points[0], cur = plot._attn;
      const a = p.y, b = p.x;
      if (!(a >= 0 && a < cur.rows.length && b >= 0 && b < cur.cols.length)) return;
      const qi = cur.rows[a], ki = cur.cols[b], w = cur.vals[a][b];
      const masked = cur.hidden(qi, ki), out = !cur.keep(qi, ki);
      const pairText = `query ${qi} “${tokenLabel(cur.tokens[qi])}” → key ${ki} “${tokenLabel(cur.tokens[ki])}”`;
      const value = masked ? "masked: this query cannot see this key (weight exactly 0)"
        : `weight ${fmtExact(w)}` + (cur.renorm ? ` (model's own ${fmtExact(cur.raw[a][b])})` : "") +
          (out ? " · the other sentence" : "");
      readout.dataset.query = qi;
      readout.dataset.key = ki;
      readout.dataset.weight = exactString(w);
      readout.textContent = `${pairText}: ${value}`;
      tip.dataset.query = qi;
      tip.dataset.key = ki;
      showTip(tip, wrap, ev, [pairText, value]);
    });
    plot.on("plotly_unhover", () => { tip.hidden = true; });
    plot.on("plotly_click", (ev) => {
      const qi = plot._attn.rows[ev.points[0].y];
      if (qi !== undefined) plot._attn.go({ pin: plot._attn.pin === qi ? null : qi });
    });
    // Zooming relabels the axes: every token gets its label back once they fit.
    plot.on("plotly_relayout", (ev) => {
      if (!Object.keys(ev).some((k) => /range|autosize/.test(k))) return;
      const cur = plot._attn, fl = plot._fullLayout;
      const xr = [...fl.xaxis.range], yr = [...fl.yaxis.range];
      const reset = ev["xaxis.autorange"] || ev["yaxis.autorange"];
      const zoomed = !reset && (plot._zoom || Object.keys(ev).some((k) => k.includes(".range")));
      plot._zoom = zoomed
        ? { rev: cur.rev, xr, yr, x: [Math.min(...xr), Math.max(...xr)], y: [Math.min(...yr), Math.max(...yr)] } : null;
      const x = plot._zoom?.x ?? [0, cur.cols.length - 1], y = plot._zoom?.y ?? [0, cur.rows.length - 1];
      const xt2 = axisTicks(cur.colLabels, ...x, fl.xaxis._length, cur.perX);
      const yt2 = axisTicks(cur.rowLabels, ...y, fl.yaxis._length, cur.perY);
      window.Plotly.relayout(plot, { "xaxis.tickvals": xt2.tickvals, "xaxis.ticktext": xt2.ticktext,
        "yaxis.tickvals": yt2.tickvals, "yaxis.ticktext": yt2.ticktext });
    });
  }
  plot._attn = { rows, cols, vals, raw, renorm, hidden, keep: view.keep, tokens: meta.tokens, pin: st.pin, go: ctx.go,
    rev, rowLabels, colLabels, perX, perY };
  pinnedPanel(panel, { meta, rows, cols, z: vals, raw, rowMass, renorm, hidden }, st, ctx);
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  container.dataset.zmax = exactString(range.zmax);

  const tok = (i) => meta.tokens[i];
  return {
    plot,
    name: `attnscope-${st.model}-L${st.layer}H${st.head}`,
    csv: () => [["query\\key", ...cols.map((i) => `${i}:${tok(i)}`)],
      ...vals.map((r, a) => [`${rows[a]}:${tok(rows[a])}`, ...r.map((v) => Number(exactString(v)))])],
    json: () => ({
      model: st.model, text: st.text, text_pair: st.text_pair || null, layer: st.layer, head: st.head,
      causal: meta.causal, mask_tokens: meta.mask_tokens, renormalised: renorm, pairs: view.filter,
      colour_scale: { zmin: range.zmin, zmax: range.zmax, mode: range.perHead ? "per head" : "fixed" },
      query_indices: rows, key_indices: cols, tokens: meta.tokens,
      attention: vals.map((r) => r.map((v) => Number(exactString(v)))),
    }),
  };
}
