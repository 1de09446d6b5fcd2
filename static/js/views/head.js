// Head view: the query x key weights of one head as a heatmap; hover for the exact weight,
// click a row (or a token chip) to pin it and list its weights.
import { h, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { maxOf, subMatrix, thinTicks, visibleTokens } from "../matrix.js";
import { exactString, fmt, fmtExact, plotlyScale } from "../scale.js";

export const title = "Head view";
export const help = "Rows are queries (the token doing the looking), columns are keys (the tokens it looks at). " +
  "Each cell is how much weight the query puts on the key; every row of the model's matrix sums to 1. " +
  "Hover a cell for the exact weight; click a row or a token to pin it.";

const HOVER_LABEL_LIMIT = 160;  // above this many tokens the hover names indices only (keeps hover data small)
const LIST_LIMIT = 40;          // pinned rows longer than this list their top weights

/** What to fetch: only this layer and head, float32 (about 1 MB at 512 tokens). */
export function requests(st) {
  return [{ endpoint: "attention", layers: [st.layer], heads: [st.head], include: ["attention"] }];
}

function pinnedPanel(panel, { meta, idx, z, raw, rowMass }, st, renorm, ctx) {
  const pos = st.pin === null ? -1 : idx.indexOf(st.pin);
  if (pos < 0) {
    const why = st.pin !== null && st.pin < meta.tokens.length
      ? "The pinned token is hidden (special tokens are hidden). "
      : "";
    replace(panel, h("p", { class: "hint", text: why + "Click a token chip or a row of the heatmap to pin it and list its weights." }));
    panel.dataset.pin = "";
    return;
  }
  const q = st.pin;
  const rows = idx.map((k, j) => ({ k, w: z[pos][j], raw: raw[pos][j] }));
  const shown = rows.length > LIST_LIMIT ? [...rows].sort((a, b) => b.w - a.w).slice(0, LIST_LIMIT) : rows;
  const table = h("table", { class: "weights", "aria-label": `Weights of query ${q}` },
    h("thead", {}, h("tr", {},
      h("th", { scope: "col", text: "key" }), h("th", { scope: "col", text: "token" }),
      h("th", { scope: "col", text: renorm ? "weight (renormalised)" : "weight" }),
      renorm && h("th", { scope: "col", text: "model's weight" }),
      h("th", { scope: "col", "aria-hidden": "true", class: "bar-col" }))),
    h("tbody", {}, shown.map(({ k, w, raw: rw }) => h("tr", {
      "data-key": k, "data-weight": exactString(w), "data-raw": exactString(rw),
      class: [meta.mask_tokens.includes(k) && "masked", meta.special[k] && "special"].filter(Boolean).join(" "),
    },
    h("td", { class: "num", text: k }),
    h("td", { class: "tok", text: tokenLabel(meta.tokens[k]) }),
    h("td", { class: "num", text: fmtExact(w) }),
    renorm && h("td", { class: "num", text: fmtExact(rw) }),
    h("td", { class: "bar-col", "aria-hidden": "true" }, h("span", { class: "bar", style: `width:${(w * 100).toFixed(1)}%` }))))));
  const sum = rows.reduce((s, r) => s + r.w, 0);
  replace(panel,
    h("h3", {}, `Pinned query ${q}: `, h("q", { class: "tok", text: tokenLabel(meta.tokens[q]) })),
    h("p", { class: "hint" },
      rows.length > LIST_LIMIT ? `Its ${LIST_LIMIT} largest of ${rows.length} weights, largest first. ` : "Its weight on every key. ",
      renorm ? `The keys shown held ${fmt(rowMass[pos], 4)} of the row's weight before renormalising. ` : "",
      `The row ${renorm ? "as shown " : ""}sums to ${fmt(sum, 6)}.`),
    table,
    h("button", { type: "button", class: "small", onclick: () => ctx.go({ pin: null }), text: "Unpin" }));
  panel.dataset.pin = String(q);
}

export function render(container, { meta, results: [ans] }, st, ctx) {
  const renorm = st.hide_special && meta.special.some(Boolean);
  const idx = visibleTokens(ans, st.hide_special);
  const m = ans.attention.sub(0, 0);
  const { z, raw, rowMass } = subMatrix(m, idx, renorm);
  const n = idx.length;
  const labels = idx.map((i) => plotlyText(tokenLabel(meta.tokens[i])));
  const ticks = thinTicks(n, ctx.large ? 25 : 45);

  const note = part(container, "note", "p", { class: "note" });
  note.textContent = renorm
    ? "[CLS] and [SEP] are hidden. Each remaining row is renormalised to sum to 1 over the keys still shown, " +
      "so colours and numbers show how the rest of the attention is shared out (they are larger than the " +
      "model's own weights, which the hover and the pinned list also give)."
    : st.hide_special ? "No special tokens in this input: nothing is hidden."
      : "All tokens shown; these are the model's own weights (each row sums to 1).";
  const layout = part(container, "layout", "div", { class: "head-layout" });
  const plot = part(layout, "plot", "div", { class: "plot square", role: "figure" });
  const side = part(layout, "side", "div", { class: "side" });
  const readout = part(side, "readout", "p", { class: "readout" });
  const panel = part(side, "pinned", "div", { class: "pinned" });
  plot.setAttribute("aria-label", `Heatmap of layer ${st.layer}, head ${st.head}: ${n} query rows by ${n} key columns. ` +
    "Pin a token with the token chips to read its weights.");
  if (!readout.dataset.query) readout.textContent = "Hover a cell to read its exact weight.";

  const trace = {
    type: "heatmap", z, x: [...Array(n).keys()], y: [...Array(n).keys()], zmin: 0, zmax: Math.max(maxOf(z), 1e-9),
    colorscale: plotlyScale, colorbar: { title: { text: renorm ? "weight<br>(renorm.)" : "weight", side: "right" }, thickness: 14 },
    xgap: n <= 40 ? 1 : 0, ygap: n <= 40 ? 1 : 0,
  };
  if (n <= HOVER_LABEL_LIMIT) {
    trace.customdata = idx.map((qi, a) => idx.map((ki, b) => [labels[a], labels[b], qi, ki, fmtExact(raw[a][b])]));
    trace.hovertemplate = "query %{customdata[2]} “%{customdata[0]}”<br>key %{customdata[3]} “%{customdata[1]}”" +
      `<br>weight %{z:.6f}${renorm ? " (model %{customdata[4]})" : ""}<extra></extra>`;
  } else {
    trace.hovertemplate = "query row %{y}, key column %{x}<br>weight %{z:.6f}<extra></extra>";
  }
  const pinPos = st.pin === null ? -1 : idx.indexOf(st.pin);
  const shapes = pinPos < 0 ? [] : [{
    type: "rect", xref: "x", yref: "y", x0: -0.5, x1: n - 0.5, y0: pinPos - 0.5, y1: pinPos + 0.5,
    line: { color: "#ff7f0e", width: 3 }, fillcolor: "rgba(0,0,0,0)",
  }];
  const axis = (t) => ({
    title: { text: t }, tickmode: "array", tickvals: ticks, ticktext: ticks.map((i) => labels[i]),
    tickfont: { size: ctx.font - (n > 60 ? 2 : 0) }, showgrid: false, zeroline: false, fixedrange: false,
  });
  const layoutObj = {
    title: `${plotlyText(ctx.info.title)} · layer ${st.layer} · head ${st.head}`,
    margin: { l: 110, r: 20, t: 50, b: 110 },
    xaxis: { ...axis("key (attended to)"), tickangle: -60, side: "bottom", constrain: "domain" },
    yaxis: { ...axis("query (attending)"), autorange: "reversed", scaleanchor: "x", constrain: "domain" },
    shapes, uirevision: `${st.model}|${st.text}|${n}`,
  };
  ctx.plot(plot, [trace], layoutObj);
  if (!plot.dataset.wired) {
    plot.dataset.wired = "1";
    plot.on("plotly_hover", (ev) => {
      const p = ev.points[0], cur = plot._attn;
      const qi = cur.idx[p.y], ki = cur.idx[p.x], w = cur.z[p.y][p.x];
      readout.dataset.query = qi;
      readout.dataset.key = ki;
      readout.dataset.weight = exactString(w);
      readout.textContent = `query ${qi} “${tokenLabel(cur.tokens[qi])}” → key ${ki} “${tokenLabel(cur.tokens[ki])}”: ` +
        `weight ${fmtExact(w)}` + (cur.renorm ? ` (model's own ${fmtExact(cur.raw[p.y][p.x])})` : "");
    });
    plot.on("plotly_click", (ev) => {
      const qi = plot._attn.idx[ev.points[0].y];
      plot._attn.go({ pin: plot._attn.pin === qi ? null : qi });
    });
  }
  plot._attn = { idx, z, raw, renorm, tokens: meta.tokens, pin: st.pin, go: ctx.go };
  pinnedPanel(panel, { meta, idx, z, raw, rowMass }, st, renorm, ctx);
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;

  const tokensAt = idx.map((i) => meta.tokens[i]);
  return {
    plot,
    name: `attnscope-${st.model}-L${st.layer}H${st.head}`,
    csv: () => [["query\\key", ...idx.map((i, j) => `${i}:${tokensAt[j]}`)],
      ...z.map((r, a) => [`${idx[a]}:${tokensAt[a]}`, ...r.map((v) => Number(exactString(v)))])],
    json: () => ({
      model: st.model, text: st.text, text_pair: st.text_pair || null, layer: st.layer, head: st.head,
      causal: meta.causal, mask_tokens: meta.mask_tokens, renormalised: renorm,
      token_indices: idx, tokens: tokensAt, attention: z.map((r) => r.map((v) => Number(exactString(v)))),
    }),
  };
}
