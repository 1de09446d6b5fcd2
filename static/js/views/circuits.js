// Circuits view: what the model's weights say about its heads, whatever the text (POST /api/circuits). Left: each
// head's OV copying score (Elhage et al. 2021: do the tokens it attends to come out as themselves?) as a layer x head
// map on the diverging scale, fixed to [−1, 1]. Right: how much each earlier head's output feeds a later head's
// queries, keys or values (Q-, K-, V-composition: state.composition) as a writer x reader map. Click a head in either
// map: it becomes the page's layer and head (a composition cell: its reader; shift+click: its writer).
import { h, menuControl, part, replace } from "../dom.js";
import { exportGroup } from "../exporting.js";
import { divergingRange, exactString, HIGHLIGHT, MASKED_COLOR, plotlyDiverging, plotlyScale, scoreRange, SIG_FORMAT, TRANSPARENT } from "../scale.js";

export const title = "Circuits";
export const help = "Read from the weights alone, the same for every text. Left: each head's OV copying score, from " +
  "−1 to 1: positive when the tokens it attends to come out as themselves (a copying head). Right: the composition of " +
  "every earlier head (writer, rows) into every later head (reader, columns): how much of what the writer writes the " +
  "reader's queries, keys or values read. Click a head to make it the page's layer and head (a composition cell: its " +
  "reader; shift+click: its writer).";

/** Composition kinds (state.composition), as the API names their maps (composition_q, _k, _v) and in words. */
export const COMPOSITIONS = [["q", "Q-composition (queries read the writer)"], ["k", "K-composition (keys read the writer)"],
  ["v", "V-composition (values read the writer)"]];
/** Each kind's score as POST /api/circuits defines it (Frobenius norms; OV, QK: a head's circuits). */
const FORMULAS = { q: "‖OV_w QK_r‖ / (‖OV_w‖ ‖QK_r‖)", k: "‖OV_w QK_rᵀ‖ / (‖OV_w‖ ‖QK_r‖)", v: "‖OV_w OV_r‖ / (‖OV_w‖ ‖OV_r‖)" };

export function requests() {
  return [{ endpoint: "circuits" }];
}

const headName = (l, hd) => `L${l}H${hd}`;

function controls(container, st, ctx) {
  return menuControl(container, { aria: "Circuits: composition", label: "Composition: ", id: "circuits-composition",
    options: COMPOSITIONS, value: st.composition, go: (composition) => ctx.go({ composition }) });
}

/** One map's cell: heading, note, plot, export buttons (kept across renders). */
function cell(grid, key, heading) {
  const el = part(grid, key, "div", { class: "effects-cell", role: "group" });
  part(el, "heading", "h3", { class: "effects-heading" }).textContent = heading;
  return { el, note: part(el, "note", "p", { class: "hint" }),
    plot: part(el, "plot", "div", { class: "plot circuits-plot", role: "figure", "aria-label": heading }),
    tools: part(el, "tools", "div", { class: "circuits-tools" }) };
}

/** Listen once to a map's clicks; what a click does is the latest render's (memory[key]). */
function onClick(plot, memory, key) {
  if (plot.dataset.wired) return;
  plot.dataset.wired = "1";
  plot.on("plotly_click", (ev) => memory[key]?.(ev.points[0], ev.event));
}

function copyingMap(ctx, c, ans, st) {
  const L = ans.layers, H = ans.heads;
  if (!ans.ov_copying) {
    window.Plotly.purge(c.plot);
    c.plot.hidden = true;
    c.el.dataset.drawn = "0";
    c.note.textContent = `${ctx.info.title} has no unembedding: the copying score reads each head's OV circuit from the ` +
      "embedding through to the unembedding.";
    replace(c.tools);
    return null;
  }
  const z = ans.ov_copying;
  const range = divergingRange(z, st, 1);             // fitted to its largest |score| (or fixed: ±1)
  c.plot.hidden = false;
  c.el.dataset.drawn = "1";
  c.plot.dataset.zmax = String(range.zmax);
  ctx.plot(c.plot, [{
    type: "heatmap", z, x: [...Array(H).keys()], y: [...Array(L).keys()], colorscale: plotlyDiverging,
    zmin: range.zmin, zmid: 0, zmax: range.zmax, xgap: 1, ygap: 1,
    colorbar: { title: { text: "OV copying score", side: "right" }, thickness: 12 },
    hovertemplate: `L%{y}H%{x}: OV copying score %{z:${SIG_FORMAT}}<extra>click: make it the page's head</extra>`,
  }], {
    height: Math.max(300, 16 * L + 110), margin: { l: 50, r: 10, t: 20, b: 45 },
    xaxis: { title: { text: "head" }, tickmode: "array", tickvals: [...Array(H).keys()], showgrid: false, zeroline: false, fixedrange: true },
    yaxis: { title: { text: "layer" }, autorange: "reversed", showgrid: false, zeroline: false, fixedrange: true, dtick: L > 16 ? 2 : 1 },
    shapes: [{ type: "rect", x0: st.head - 0.5, x1: st.head + 0.5, y0: st.layer - 0.5, y1: st.layer + 0.5,
      line: { color: HIGHLIGHT, width: 3 }, fillcolor: TRANSPARENT }],
  });
  onClick(c.plot, ctx.memory, "copying");
  ctx.memory.copying = (pt) => ctx.go({ layer: pt.y, head: pt.x });
  c.note.textContent = "Σ eigenvalues / Σ |eigenvalues| of each head's OV circuit read from the embedding to the " +
    "unembedding (Elhage et al. 2021): 1 when every token it attends to raises its own logit, −1 when it lowers it " +
    "(blank: a head whose circuit is zero). " +
    `Colours: ${range.label}.`;
  const ex = { plot: c.plot, name: `attnscope-${st.model}-ov-copying`,
    csv: () => [["layer", ...z[0].map((_, hd) => `head ${hd}`)], ...z.map((r, l) => [l, ...r.map((v) => (v === null ? "" : Number(exactString(v))))])],
    json: () => ({ model: st.model, layers: L, heads: H, ov_copying: z }) };
  replace(c.tools, exportGroup(ex, "the copying map"));
  return ex;
}

function compositionMap(ctx, c, ans, st) {
  const L = ans.layers, H = ans.heads, N = L * H;
  const kind = COMPOSITIONS.find(([v]) => v === st.composition);
  const full = ans[`composition_${st.composition}`];
  const names = Array.from({ length: N }, (_, f) => headName(Math.floor(f / H), f % H));
  // a reader in the writer's layer or before it cannot read it: no composition there (left white)
  const z = full.map((row, w) => row.map((v, r) => (Math.floor(r / H) > Math.floor(w / H) ? v : null)));
  const values = z.flat().filter((v) => v !== null);
  const signed = values.some((v) => v < 0);
  // fitted to the data (the induction model's K-composition of 0.04 is its map's brightest), or fixed on the bound
  const range = signed ? divergingRange(z, st, 1) : scoreRange(z, st, 1);
  c.plot.dataset.zmax = String(range.zmax);
  const every = Math.max(1, Math.ceil(L / 16));                 // a tick at the first head of every k-th layer
  const ticks = H === 1 || N <= 40 ? names : names.filter((_, f) => f % H === 0 && (f / H) % every === 0);
  const tickText = H === 1 || N <= 40 ? ticks : ticks.map((n) => n.replace(/H0$/, ""));
  const cur = st.layer * H + st.head;
  const side = Math.min(760, Math.max(320, 7 * N + 140));
  const label = kind[1].replace(/ \(.*/, "");
  c.plot.hidden = false;
  c.el.dataset.drawn = "1";
  c.el.dataset.kind = st.composition;
  ctx.plot(c.plot, [{
    type: "heatmap", z, x: names, y: names, colorscale: signed ? plotlyDiverging : plotlyScale, zmin: range.zmin,
    zmax: range.zmax, ...(signed ? { zmid: 0 } : {}), xgap: N <= 60 ? 1 : 0, ygap: N <= 60 ? 1 : 0, hoverongaps: false,
    colorbar: { title: { text: label, side: "right" }, thickness: 12 },
    hovertemplate: `%{y} → %{x}, ${label} %{z:${SIG_FORMAT}}<extra>click: the reader; shift+click: the writer</extra>`,
  }], {
    height: side, margin: { l: 70, r: 10, t: 20, b: 70 }, plot_bgcolor: MASKED_COLOR,
    xaxis: { title: { text: "reader (later head)" }, type: "category", tickmode: "array", tickvals: ticks, ticktext: tickText,
      tickangle: -60, showgrid: false, zeroline: false, fixedrange: true },
    yaxis: { title: { text: "writer (earlier head)" }, type: "category", autorange: "reversed", tickmode: "array",
      tickvals: ticks, ticktext: tickText, showgrid: false, zeroline: false, fixedrange: true },
    // the page's head: its column (as a reader) and its row (as a writer)
    shapes: [{ type: "rect", xref: "x", yref: "paper", x0: cur - 0.5, x1: cur + 0.5, y0: 0, y1: 1, line: { color: HIGHLIGHT, width: 1.5 }, fillcolor: TRANSPARENT },
      { type: "rect", xref: "paper", yref: "y", x0: 0, x1: 1, y0: cur - 0.5, y1: cur + 0.5, line: { color: HIGHLIGHT, width: 1.5 }, fillcolor: TRANSPARENT }],
  });
  onClick(c.plot, ctx.memory, "composition");
  ctx.memory.composition = (pt, e) => {
    const m = /^L(\d+)H(\d+)$/.exec(e?.shiftKey ? pt.y : pt.x);
    if (m) ctx.go({ layer: Number(m[1]), head: Number(m[2]) });
  };
  c.note.textContent = `${kind[1]}: ${FORMULAS[st.composition]} for every earlier writer w and later reader r ` +
    `(Elhage et al. 2021; Frobenius norms), ${N} heads. White: the reader is not in a later layer. Colours: ${range.label}.`;
  const ex = { plot: c.plot, name: `attnscope-${st.model}-composition-${st.composition}`,
    csv: () => [[`writer\\reader (${label})`, ...names], ...full.map((row, w) => [names[w], ...row.map((v) => Number(exactString(v)))])],
    json: () => ({ model: st.model, kind: st.composition, heads: names, [`composition_${st.composition}`]: full }) };
  replace(c.tools, exportGroup(ex, `the ${label} map`));
  return ex;
}

export function render(container, { results: [ans] }, st, ctx) {
  controls(container, st, ctx);
  const grid = part(container, "maps", "div", { class: "compare-grid circuits-maps" });
  const cells = [cell(grid, "copying", "OV copying score"), cell(grid, "composition", "Composition")];
  const ov = copyingMap(ctx, cells[0], ans, st);
  const comp = compositionMap(ctx, cells[1], ans, st);
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  const { bytes: _bytes, timing_ms: _timing, ...numbers } = ans;
  return {
    plot: (ov ?? comp).plot, name: `attnscope-${st.model}-circuits`,
    csv: () => [...(ov ? [["ov_copying"], ...ov.csv(), []] : []), [`composition_${st.composition}`], ...comp.csv()],
    json: () => numbers,
  };
}
