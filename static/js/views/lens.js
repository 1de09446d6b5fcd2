// Logit lens view: what the model would predict at each position if the residual stream stopped after the
// embeddings or after a block (POST /api/lens: every row through the final norm and the unembedding). A layer x
// position grid, each cell annotated with its top token and coloured by that token's probability (or by the
// probability of the token that actually comes next: state.lens); hover for the top k. Below it, the head lens of the
// page's layer and head: the tokens its output pushes up and down most at each position. Click a row of the grid: its
// layer becomes the page's layer (the head lens follows).
import { can, whyNot } from "../boot.js";
import { h, menuControl, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { exportGroup } from "../exporting.js";
import { ownRunNote } from "../matrix.js";
import { colourRange, exactString, fmt, HIGHLIGHT, plotlyScale, TRANSPARENT } from "../scale.js";

export const title = "Logit lens";
export const help = "Each row is the residual stream after the embeddings or after a block, read out as the model " +
  "reads its last one: through the final norm and the unembedding. Each cell names the token that row would predict " +
  "next at that position, coloured by its probability (or by the probability of the token that really comes next). " +
  "The top row is the model's own prediction. Hover a cell for its top tokens; click a row to make its layer the " +
  "page's. Below: what the page's head writes, read out the same way.";

const TOP = 5;                  // tokens per cell (POST /api/lens's `top`)
const LABEL_CHARS = 8;          // a cell's top token is shortened to this many characters (the hover has it whole)
const ANNOTATED_CELLS = 2400;   // grids larger than this are coloured without their tokens written in
const TABLE_ROWS = 400;         // the head lens lists at most this many positions

/** What the grid colours by (state.lens), in the page's words: the API's top_probs or next_probs. */
export const COLOURINGS = [["top", "probability of the top token"], ["next", "probability of the actual next token"]];

/** Models the view works for: those with an unembedding (GET /api/models' `unembedding`: an LM head, or a decoder's
 *  tied token embeddings), that can run whole (the model's capability record: `lens`). */
export const supported = (info) => Boolean(info.unembedding) && can(info, "lens");

/** The lens, and the head lens of the page's head where the model's family allows it (capability `head_lens`). */
export function requests(st, info) {
  if (!supported(info)) return [];
  return [{ endpoint: "lens", top: TOP, ...(can(info, "head_lens") ? { head_lens: [st.layer, st.head] } : {}), soft: true }];
}

const short = (tok, n = LABEL_CHARS) => {
  const s = tokenLabel(tok);
  return plotlyText(s.length > n ? s.slice(0, n - 1) + "…" : s);
};

function controls(container, st, ctx) {
  return menuControl(container, { aria: "Logit lens: colours", label: "Colour: ", id: "lens-colour",
    options: COLOURINGS, value: st.lens, go: (lens) => ctx.go({ lens }) });
}

/** Nothing to draw: hide the grid and the head lens, say why in the note. */
function clear(container) {
  for (const k of ["controls", "plot", "tools", "heads"]) {
    const el = container.querySelector(`:scope > [data-part=${k}]`);
    if (el) el.hidden = true;
  }
  for (const plot of container.querySelectorAll(".js-plotly-plot")) window.Plotly.purge(plot);
  return part(container, "note", "p", { class: "note" });
}

function unsupported(container, st, ctx) {
  const info = ctx.info, able = ctx.boot.models.filter(supported);
  replace(clear(container),
    `${info.title} is ${info.kind === "decoder" ? "a decoder without an unembedding (no LM head, no tied token embeddings)"
      : "an encoder without an unembedding"}: the logit lens reads the residual stream out as next-token predictions ` +
    "through the model's unembedding. ",
    able.length ? "Served models that have one: " : "No served model has one.",
    able.map((m, k) => [k ? ", " : "", h("a", { href: ctx.href({ model: m.id }), text: m.title })]));
  container.dataset.supported = "0";
  return { name: `attnscope-${st.model}-lens` };
}

/** The head lens of (layer, head): per position, the tokens its output promotes and suppresses most. */
function headLens(box, hl, meta, st, info) {
  if (!can(info, "head_lens")) {
    replace(box, h("h3", { text: "Head lens" }), h("p", { class: "note refused", "data-feature": "head_lens",
      text: `Not for ${info.title}: ${whyNot(info, "head_lens")}.` }));
    return;
  }
  if (!hl) {
    replace(box);
    return;
  }
  const T = hl.promoted_tokens.length, shown = Math.min(T, TABLE_ROWS);
  const list = (toks, logits, cls) => h("td", { class: cls }, toks.map((t, j) => h("span", { class: "tok",
    title: `logit ${exactString(logits[j])}`, text: `${tokenLabel(t)} ${fmt(logits[j], 2)}` })));
  replace(box,
    h("h3", { text: `Layer ${hl.layer}, head ${hl.head}: what its output writes, read out through the unembedding` }),
    h("p", { class: "hint", text: "At each position, the tokens whose logits this head's output raises most (promoted) " +
      "and lowers most (suppressed), through the final norm with its scale frozen at this run's and the unembedding " +
      "(logit units). Change the head with the Layer and Head menus above." +
      (shown < T ? ` The first ${shown} of ${T} positions are listed.` : "") }),
    h("div", { class: "table-scroll" }, h("table", { class: "head-lens-table", "aria-label": `Head lens of layer ${hl.layer}, head ${hl.head}` },
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "position" }), h("th", { scope: "col", text: "token" }),
        h("th", { scope: "col", text: "promoted" }), h("th", { scope: "col", text: "suppressed" }))),
      h("tbody", {}, Array.from({ length: shown }, (_, p) => h("tr", { "data-position": p },
        h("td", { class: "num", text: p }), h("td", { class: "tok", text: tokenLabel(meta.tokens[p] ?? "") }),
        list(hl.promoted_tokens[p], hl.promoted_logits[p], "promoted"),
        list(hl.suppressed_tokens[p], hl.suppressed_logits[p], "suppressed")))))));
  box.dataset.layer = hl.layer;
  box.dataset.head = hl.head;
}

export function render(container, { meta, results: [ans] }, st, ctx) {
  if (!supported(ctx.info)) return unsupported(container, st, ctx);
  container.dataset.supported = "1";
  if (ans.error) {                             // a refusal (a text too long to trace): said where the grid would be
    const e = ans.error;
    clear(container).textContent = `The server refused: ${e.detail ?? e.message}` + (e.status ? ` (HTTP ${e.status})` : "");
    return { name: `attnscope-${st.model}-lens` };
  }
  const form = controls(container, st, ctx);
  const note = part(container, "note", "p", { class: "note" });
  const plot = part(container, "plot", "div", { class: "plot lens-plot", role: "figure" });
  const tools = part(container, "tools", "div", { class: "lens-tools" });
  const heads = part(container, "heads", "section", { class: "head-lens", "aria-label": "Head lens" });
  for (const el of [form, plot, tools, heads]) el.hidden = false;

  const R = ans.rows.length, T = ans.tokens.length, next = st.lens === "next";
  // z[row][position]: the top token's probability, or the next token's (none after the last position: empty)
  const z = ans.rows.map((_, r) => Array.from({ length: T }, (_, p) => (next ? (p < T - 1 ? ans.next_probs[r][p] : null)
    : ans.top_probs[r][p][0])));
  const text = ans.rows.map((_, r) => ans.top_tokens[r].map((toks) => short(toks[0])));
  const hover = ans.rows.map((row, r) => Array.from({ length: T }, (_, p) => {
    const head = `${row} (${ans.hooks[r]}) at ${p} “${plotlyText(tokenLabel(ans.tokens[p]))}”`;
    const tops = ans.top_tokens[r][p].map((t, k) => `${plotlyText(tokenLabel(t))}  ${fmt(ans.top_probs[r][p][k], 4)}`);
    const real = p < T - 1 ? `next token “${plotlyText(tokenLabel(ans.tokens[p + 1]))}”: ${fmt(ans.next_probs[r][p], 4)}`
      : "nothing comes next";
    return [head, ...tops, real].join("<br>");
  }));
  let max = 0;
  for (const row of z) for (const v of row) if (v !== null && v > max) max = v;
  const range = colourRange(st, max);
  const annotate = R * T <= ANNOTATED_CELLS;
  const layerRow = (l) => ans.rows.indexOf(`L${l}`);
  const font = ctx.font;
  const height = Math.max(320, Math.min(22 * R, 1400) + 150);
  plot.style.height = `${height}px`;
  plot.dataset.rows = R;
  plot.dataset.positions = T;
  plot.dataset.lastTop = ans.top_tokens[R - 1][T - 1][0];
  const ticks = (n, every) => Array.from({ length: n }, (_, i) => i).filter((i) => i % every === 0);
  const xv = ticks(T, Math.max(1, Math.ceil(T / 60)));
  const yv = ticks(R, R > 34 ? 2 : 1);
  ctx.plot(plot, [{
    type: "heatmap", z, x: [...Array(T).keys()], y: [...Array(R).keys()], zmin: range.zmin, zmax: range.zmax,
    colorscale: plotlyScale, xgap: T <= 60 ? 1 : 0, ygap: R <= 60 ? 1 : 0, customdata: hover, hoverongaps: false,
    hovertemplate: "%{customdata}<extra></extra>",
    ...(annotate ? { text, texttemplate: "%{text}", textfont: { size: Math.max(8, font - 4) } } : {}),
    colorbar: { title: { text: next ? "p(next token)" : "p(top token)", side: "right" }, thickness: 12, tickfont: { size: font - 2 } },
  }], {
    // margins grow with the font (Large text), and with the tick labels (automargin): nothing outside the plot
    height, margin: { l: Math.round(60 * font / 13), r: 10, t: 10, b: Math.round(100 * font / 13) },
    xaxis: { automargin: true, title: { text: "position (token)" }, tickmode: "array", tickvals: xv, ticktext: xv.map((p) => `${p} ${short(ans.tokens[p], 12)}`),
      tickangle: -60, showgrid: false, zeroline: false, fixedrange: false },
    yaxis: { automargin: true, title: { text: "residual stream after" }, tickmode: "array", tickvals: yv, ticktext: yv.map((r) => ans.rows[r]),
      showgrid: false, zeroline: false, fixedrange: false },
    shapes: layerRow(st.layer) >= 0 ? [{ type: "rect", xref: "paper", yref: "y", x0: 0, x1: 1, y0: layerRow(st.layer) - 0.5,
      y1: layerRow(st.layer) + 0.5, line: { color: HIGHLIGHT, width: 2 }, fillcolor: TRANSPARENT }] : [],
    uirevision: `${st.model}|${st.text}`,
  });
  if (!plot.dataset.wired) {                   // a row's layer becomes the page's; the latest render's (memory.rows)
    plot.dataset.wired = "1";
    plot.on("plotly_click", (ev) => {
      const m = /^L(\d+)$/.exec(ctx.memory.rows?.[ev.points[0].y] ?? "");
      if (m) ctx.memory.go(Number(m[1]));
    });
  }
  ctx.memory.rows = ans.rows;
  ctx.memory.go = (layer) => ctx.go({ layer });
  note.textContent = `${T} positions × ${R} rows: the embeddings (${ans.rows[0]}) and the residual stream after each of ` +
    `the ${R - 1} blocks; the top row is the model's own next-token prediction. ` +
    (next ? "Colours: the probability each row gives the token that really comes next (the last position has none). "
      : "Colours: the probability of each cell's top token. ") +
    `${annotate ? "Each cell names its top token. " : "Too many cells to name each one's top token: hover them. "}` +
    `Colour scale: ${range.label}.` + ownRunNote(st, meta, ctx.info);
  headLens(heads, ans.head_lens, ans, st, ctx.info);

  const csv = () => [["row", ...ans.tokens.map((t, p) => `${p}:${t}`)],
    ...ans.rows.flatMap((row, r) => [[`${row} top token`, ...ans.top_tokens[r].map((toks) => toks[0])],
      [`${row} p(top)`, ...ans.top_probs[r].map((ps) => ps[0])], [`${row} p(next)`, ...ans.next_probs[r].map((v, p) => (p < T - 1 ? v : ""))]])];
  const json = () => {
    const { bytes: _bytes, ...rest } = ans;
    return { text: st.text, colour: st.lens, colour_scale: { zmin: range.zmin, zmax: range.zmax }, ...rest };
  };
  const ex = { plot, name: `attnscope-${st.model}-lens-${st.lens}`, csv, json };
  replace(tools, exportGroup(ex, "the logit lens"));
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  return ex;
}
