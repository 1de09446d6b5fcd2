// The head view past OVERVIEW_TOKENS tokens (issue 48): no T x T matrix comes to the page (at 32,768 tokens one head is
// 4 GB); the head is drawn as its pooled overview (POST /api/attention with `resolution`: block means, computed by the
// server inside the run), each block coloured by the share of its query block's attention that lands on its key
// block, on a log scale (at 32k tokens most shares are tiny, a few are near 1). A box dragged over it (Plotly's box
// zoom) asks the server for the exact tile of that query range x key range (`tile`: every weight the whole row's
// softmax) and draws it on top, cell by cell, over the same axes; zooming out takes it away.
import * as api from "./api.js";
import { part, plotlyText, tokenLabel } from "./dom.js";
import { localWindow, maskRule, runOptions } from "./matrix.js";
import { AXIS_LINE, exactString, fmtSig, MASKED_COLOR, plotlyScale } from "./scale.js";

export const OVERVIEW_TOKENS = 4096;   // past this many tokens the head view draws the overview
export const OVERVIEW = 512;           // its resolution: at most 512 x 512 blocks (64 tokens a side at 32,768)
export const TILE_SIDE = 400;          // a box of at most this many queries and keys is drawn exactly
const FLOOR = -6;                      // the log scale's lowest decade: 1e-6 (smaller shares are drawn at it)

/** The overview's request for the state's head. */
export function overviewRequest(st) {
  return { endpoint: "attention", layers: [st.layer], heads: [st.head], include: ["attention"], resolution: OVERVIEW,
    dtype: "float16" };
}

// what a cell shows: null (white) where the mask hides it, else log10 of its value, at least FLOOR (a weight that
// underflowed to 0 in float32 is drawn at the floor, not as masked)
const log10 = (v, hidden) => (hidden ? null : v > 0 ? Math.max(FLOOR, Math.log10(v)) : FLOOR);
const colorbar = (font) => ({ title: { text: "share<br>(log)", side: "right" }, thickness: 14, tickfont: { size: font - 2 },
  tickvals: [0, -1, -2, -3, -4, -5, -6], ticktext: ["1", "0.1", "0.01", "1e−3", "1e−4", "1e−5", "≤1e−6"] });

/** Draw the overview of ans (one head at `resolution`, with its `blocks`) into the head view's container. */
export function renderOverview(container, meta, ans, st, ctx) {
  for (const c of container.children) c.hidden = c.dataset.part !== "overview";
  const box = part(container, "overview", "div", { class: "overview" });
  box.hidden = false;
  const T = meta.tokens.length, blocks = ans.blocks, R = blocks.length;
  const m = ans.attention.sub(0, 0);
  const centres = blocks.map(([a, b]) => (a + b - 1) / 2);
  // each block's share of its query block's attention (block mean x key-block width: rows sum to 1); null where the
  // mask hides every cell of the block (its corners: the mask is causal and banded)
  const hidden = maskRule(meta, ctx.info, st.layer);
  const out = ([q0, q1], [k0, k1]) => hidden(q1 - 1, k0) && hidden(q0, k1 - 1) && hidden(q0, k0) && hidden(q1 - 1, k1 - 1);
  const shares = blocks.map((qb, a) => blocks.map((kb, b) => (out(qb, kb) ? null : m.at(a, b) * (kb[1] - kb[0]))));
  const z = shares.map((r) => r.map((v) => log10(v, v === null)));
  const w = localWindow(ctx.info, st.layer);
  const note = part(box, "note", "p", { class: "note" });
  note.textContent = `${T.toLocaleString("en-US")} tokens: the whole head at once, each cell a block of about ` +
    `${Math.round(T / R)} × ${Math.round(T / R)} tokens (${R} × ${R} blocks), coloured by the share of the query ` +
    "block's attention that lands on the key block, on a log scale (1, 0.1, 0.01, …). White: masked (weight exactly 0)." +
    (w ? ` Layer ${st.layer} is a local layer: each token sees only its last ${w} tokens (the band by the diagonal).` : "") +
    ` Drag a box over at most ${TILE_SIDE} queries and ${TILE_SIDE} keys to draw their exact weights; double-click to zoom out.`;
  const status = part(box, "status", "p", { class: "hint overview-status", role: "status" });
  const readout = part(box, "readout", "p", { class: "readout" });
  if (!readout.textContent) readout.textContent = "Hover the picture for the tokens and the value under the mouse.";
  const plot = part(box, "plot", "div", { class: "plot head-plot", role: "figure" });
  plot.dataset.drawn = "overview";
  plot.setAttribute("aria-label", `Overview of layer ${st.layer}, head ${st.head}: ${T} queries by ${T} keys in ` +
    `${R} × ${R} blocks. Drag a box to draw the exact weights of a smaller range.`);
  const height = Math.round(Math.max(420, Math.min(window.innerHeight * 0.85, (box.clientWidth || 800) - 40)));
  plot.style.height = `${height}px`;
  const rev = `${st.model}|${st.text}|${st.layer}|${st.head}|${T}`;
  const axis = (title) => ({ title: { text: title }, showgrid: false, zeroline: false, showline: true, linecolor: AXIS_LINE,
    mirror: true, tickformat: ",d", tickfont: { size: ctx.font - 1 } });
  const traces = [{ type: "heatmap", name: "overview", z, x: centres, y: centres, zmin: FLOOR, zmax: 0, colorscale: plotlyScale,
    hoverinfo: "none", colorbar: colorbar(ctx.font) }];
  ctx.plot(plot, traces, {
    title: `${plotlyText(ctx.info.title)} · layer ${st.layer} · head ${st.head} · overview`, height, autosize: true,
    margin: { l: 86, r: 16, t: 46, b: 70 }, plot_bgcolor: MASKED_COLOR, dragmode: "zoom", uirevision: rev,
    xaxis: { ...axis("key (attended to)"), range: [-0.5, T - 0.5] },
    yaxis: { ...axis("query (attending)"), range: [T - 0.5, -0.5] },
  });
  const memory = ctx.memory;
  memory.overview = { rev, T, blocks, shares, hidden, tokens: meta.tokens, run: runOptions(st, ctx.info), st, status, readout, plot };
  if (!plot.dataset.wired && !ctx.sketching) {
    plot.dataset.wired = "1";
    plot.on("plotly_relayout", (ev) => zoomed(memory.overview, ev));
    plot.on("plotly_hover", (ev) => hovered(memory.overview, ev.points?.[0]));
  }
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  container.dataset.window = w;
  delete box.dataset.tile;
  return {
    plot, name: `attnscope-${st.model}-L${st.layer}H${st.head}-overview`,
    csv: () => [["query block\\key block", ...blocks.map(([a, b]) => `${a}-${b - 1}`)],
      ...shares.map((r, a) => [`${blocks[a][0]}-${blocks[a][1] - 1}`, ...r.map((v) => (v === null ? 0 : Number(exactString(v))))])],
    json: () => ({ model: st.model, text: st.text, layer: st.layer, head: st.head, tokens: meta.tokens, blocks,
      share: shares.map((r) => r.map((v) => (v === null ? 0 : Number(exactString(v))))) }),
  };
}

/** The readout under the mouse: a block of the overview, or a cell of the exact tile. */
function hovered(cur, pt) {
  if (!cur || !pt) return;
  const tok = (i) => `${i} “${tokenLabel(cur.tokens[i])}”`;
  if (pt.data.name === "tile") {
    const q = pt.y, k = pt.x, v = pt.data.customdata[pt.pointIndex[0]][pt.pointIndex[1]];
    cur.readout.textContent = `query ${tok(q)} → key ${tok(k)}: ` +
      (cur.hidden(q, k) ? "masked (weight exactly 0)" : `weight ${fmtSig(v)} (exact)`);
  } else {
    const [a, b] = pt.pointIndex, [q0, q1] = cur.blocks[a], [k0, k1] = cur.blocks[b], v = cur.shares[a][b];
    cur.readout.textContent = `queries ${q0}–${q1 - 1} → keys ${k0}–${k1 - 1}: ` +
      (v === null ? "masked" : `share ${fmtSig(v)} of those queries' attention`);
  }
}

/** After a zoom: the exact tile of the box, when it is small enough; zoomed out, the overview alone. */
async function zoomed(cur, ev) {
  if (!cur || !Object.keys(ev).some((k) => /range|autorange/.test(k))) return;
  const fl = cur.plot._fullLayout, box = cur.plot.closest(".overview");
  const clamp = (v, lo, hi) => Math.max(lo, Math.min(hi, v));
  const span = (r) => { const a = clamp(Math.ceil(Math.min(...r) - 0.5), 0, cur.T - 1);
    return [a, clamp(Math.floor(Math.max(...r) + 0.5), a + 1, cur.T)]; };
  const [q0, q1] = span(fl.yaxis.range), [k0, k1] = span(fl.xaxis.range);
  const drop = () => { const i = cur.plot.data.findIndex((t) => t.name === "tile"); if (i >= 0) window.Plotly.deleteTraces(cur.plot, i); };
  if (ev["xaxis.autorange"] || ev["yaxis.autorange"] || (q1 - q0 >= cur.T && k1 - k0 >= cur.T)) {
    drop();
    delete box.dataset.tile;
    cur.status.textContent = "";
    return;
  }
  if (q1 - q0 > TILE_SIDE || k1 - k0 > TILE_SIDE) {
    drop();
    delete box.dataset.tile;
    cur.status.textContent = `This box is ${q1 - q0} queries by ${k1 - k0} keys: zoom in to at most ${TILE_SIDE} of each to draw the exact weights.`;
    return;
  }
  const asked = `${q0},${q1},${k0},${k1}`;
  cur.asked = asked;
  cur.status.textContent = `Computing the exact weights of queries ${q0}–${q1 - 1} on keys ${k0}–${k1 - 1}…`;
  let ans;
  try {
    ans = await api.analysis("attention", { ...cur.run, layers: [cur.st.layer], heads: [cur.st.head], include: [],
      tile: { queries: [q0, q1], keys: [k0, k1] } });
  } catch (err) {
    if (cur.asked === asked) cur.status.textContent = `The exact weights could not be computed: ${err.message}`;
    return;
  }
  if (cur.asked !== asked || cur.plot.dataset.drawn !== "overview") return;     // another box (or head) since
  const t = ans.tile.sub(0, 0), rows = [...Array(q1 - q0).keys()].map((a) => Array.from(t.row(a)));
  drop();
  window.Plotly.addTraces(cur.plot, { type: "heatmap", name: "tile", z: rows.map((r, a) => r.map((v, b) => log10(v, cur.hidden(q0 + a, k0 + b)))), customdata: rows,
    x: [...Array(k1 - k0).keys()].map((b) => k0 + b), y: [...Array(q1 - q0).keys()].map((a) => q0 + a),
    zmin: FLOOR, zmax: 0, colorscale: plotlyScale, showscale: false, hoverinfo: "none" });
  box.dataset.tile = asked;
  cur.status.textContent = `Exact weights of queries ${q0}–${q1 - 1} on keys ${k0}–${k1 - 1} (each the whole row's ` +
    "softmax, on the same log scale); double-click to zoom out.";
}

/** The head view's other parts back (a text short enough for the whole matrix). */
export function leaveOverview(container) {
  const box = container.querySelector(':scope > [data-part="overview"]');
  if (!box) return;
  const plot = box.querySelector(".js-plotly-plot");
  if (plot) window.Plotly.purge(plot);
  box.remove();
  for (const c of container.children) c.hidden = false;
}
