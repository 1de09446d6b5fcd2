// "Why does this head attend here?": the head view's panel for one cell (state.why = [query, key]). POST /api/qk
// splits the head's pre-softmax score at the cell into pairs, a component of the residual stream at the query (what
// wrote it: the embeddings, a head's output, an MLP's output, the biases) times a component at the key; the panel
// draws the largest pairs as signed bars, each named in words, with the score, the model's own scaled score and how
// much of the score's absolute mass the pairs shown explain. Pure function of (answer, state), like a view.
import { h, part, plotlyText, replace, tokenLabel } from "./dom.js";
import { exportGroup } from "./exporting.js";
import { ownRunNote } from "./matrix.js";
import { exactString, fmt, signColor } from "./scale.js";

/** How many pairs the chart shows (POST /api/qk's `top`). */
export const WHY_TOP = 12;

/** A component of the residual stream at a token, in words: "embedding of “met”", "L0H0 output at “met”". */
export function componentAt(c, tok) {
  const t = `“${tokenLabel(tok)}”`;
  switch (c.kind) {
    case "embed": return `embedding of ${t}`;
    case "pos_embed": return `position embedding at ${t}`;
    case "type_embed": return `segment embedding at ${t}`;
    case "bias": return `biases at ${t}`;
    default: return `${c.name} output at ${t}`;          // a head ("L3H4") or an MLP ("L3 MLP")
  }
}

/** One pair of the answer's `top` in words: "<query component> at “q” × <key component> at “k”". */
export function pairLabel(ans, p) {
  return `${componentAt(ans.components[p.query], ans.tokens[ans.query])} × ${componentAt(ans.components[p.key], ans.tokens[ans.key])}`;
}

/** The index of the largest |value| of a list. */
const argmaxAbs = (xs) => xs.reduce((best, v, i) => (Math.abs(v) > Math.abs(xs[best]) ? i : best), 0);

/** Draw the panel into its section of the head view (hidden when no cell is asked about). ans: the /api/qk answer
 *  ({error} for a refusal), or undefined when none was asked. */
export function renderWhy(box, ans, st, ctx, meta) {
  box.hidden = !st.why;
  if (!st.why) {
    for (const el of box.querySelectorAll(".js-plotly-plot")) window.Plotly.purge(el);
    replace(box);
    box.dataset.query = box.dataset.key = "";
    return null;
  }
  const [q, k] = st.why;
  const tok = (i) => (i < meta.tokens.length ? `“${tokenLabel(meta.tokens[i])}”` : "");
  const bar = part(box, "bar", "div", { class: "why-bar" });
  const note = part(box, "note", "p", { class: "note" });
  const plot = part(box, "plot", "div", { class: "plot why-plot", role: "figure" });
  const sides = part(box, "sides", "p", { class: "hint why-sides" });
  const tools = part(box, "tools", "div", { class: "why-tools" });
  box.dataset.query = q;
  box.dataset.key = k;
  replace(bar, h("h3", { text: `Why does query ${q} ${tok(q)} attend to key ${k} ${tok(k)}?` }),
    h("button", { type: "button", class: "small", id: "why-close", text: "Close", onclick: () => ctx.go({ why: null }) }));
  const empty = (text) => {
    window.Plotly.purge(plot);
    plot.hidden = true;
    box.dataset.drawn = "0";
    note.textContent = text;
    replace(sides);
    replace(tools);
    return null;
  };
  if (ans?.refused) return empty(`Not available for ${ctx.info.title}: ${ans.refused}.`);
  if (!ans) return empty("A sentence pair: the attribution (POST /api/qk) is of one text. Clear the second sentence to ask why.");
  if (ans.error) {
    const e = ans.error;
    return empty(`The server refused: ${e.detail ?? e.message}` + (e.status ? ` (HTTP ${e.status})` : ""));
  }
  const top = ans.top, n = top.length;
  const labels = top.map((p) => plotlyText(pairLabel(ans, p)));
  const values = top.map((p) => p.value);
  plot.hidden = false;
  box.dataset.drawn = "1";
  box.dataset.score = exactString(ans.score);
  plot.setAttribute("aria-label", `The ${n} largest pairs of layer ${ans.layer}, head ${ans.head}'s score at query ` +
    `${ans.query}, key ${ans.key}, as bars of their signed share of the score.`);
  ctx.plot(plot, [{
    type: "bar", orientation: "h", x: values, y: labels, marker: { color: values.map(signColor) },
    customdata: values.map((v) => (ans.score ? (100 * v) / ans.score : null)),
    hovertemplate: "%{y}<br>%{x:.4f}" + (ans.score ? " (%{customdata:.1f} % of the score)" : "") + "<extra></extra>",
  }], {
    height: Math.max(220, 26 * n + 90), margin: { l: 10, r: 20, t: 10, b: 50 },
    // short enough to stay in the chart under Large text; the colours are said in the note
    xaxis: { title: { text: "share of the scaled score" },
      zeroline: true, zerolinewidth: 2, fixedrange: true, automargin: true },
    yaxis: { type: "category", autorange: "reversed", automargin: true, fixedrange: true },
    bargap: 0.25,
  });
  const qs = argmaxAbs(ans.query_sums), ks = argmaxAbs(ans.key_sums);
  note.textContent = `Layer ${ans.layer}, head ${ans.head}${ans.kv_head !== ans.head ? ` (key/value head ${ans.kv_head})` : ""}: ` +
    `its pre-softmax score at this cell, the query's vector times the key's (scaled by 1/√d_head), splits into pairs: ` +
    `a part of the residual stream at the query (what wrote it) times a part at the key (a bar: orange raises the ` +
    `score, purple lowers it). The pairs add up to the score ` +
    `${fmt(ans.score, 4)}; the model's own scaled score is ${fmt(ans.scaled, 4)}. ` +
    (ans.visible ? `The head's weight on this key is ${fmt(ans.probability, 4)}. `
      : "This key is masked for this query: its weight is 0 whatever the score. ") +
    `The top ${n} pairs explain ${fmt(100 * ans.explained, 1)} % of the score's absolute mass.` + ownRunNote(st, meta, ctx.info);
  box.dataset.explained = exactString(ans.explained);
  box.dataset.queryComponent = ans.components[qs].name;
  box.dataset.keyComponent = ans.components[ks].name;
  replace(sides, `Largest on the query side: ${componentAt(ans.components[qs], ans.tokens[ans.query])} ` +
    `(${fmt(ans.query_sums[qs], 3)} with the whole key). Largest on the key side: ` +
    `${componentAt(ans.components[ks], ans.tokens[ans.key])} (${fmt(ans.key_sums[ks], 3)} with the whole query).`);
  const ex = {
    plot, name: `attnscope-${st.model}-qk-L${ans.layer}H${ans.head}-q${ans.query}-k${ans.key}`,
    csv: () => [["rank", "query component", "key component", "pair", "value"],
      ...top.map((p, r) => [r + 1, ans.components[p.query].name, ans.components[p.key].name, pairLabel(ans, p), p.value]),
      [], ["score", ans.score], ["scaled", ans.scaled], ["probability", ans.probability], ["explained", ans.explained]],
    json: () => {
      const { bytes: _bytes, ...rest } = ans;
      return { text: st.text, ...rest, pairs: top.map((p) => ({ ...p, words: pairLabel(ans, p) })) };
    },
  };
  replace(tools, exportGroup(ex, "the why chart"));
  return ex;
}
