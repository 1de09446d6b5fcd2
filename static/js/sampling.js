// The sampling panel: one step of a generation (POST /api/generate's token line) as grouped bars, for each of the
// step's most probable tokens its probability under the model and the probability it was drawn with after
// temperature, top-k and top-p, the chosen token outlined; the same numbers as a table, and a sentence saying what
// each setting did. Pure function of (steps, the step shown, the settings used); a range picks the step.
import { h, part, plotlyText, replace, tokenLabel } from "./dom.js";
import { exportGroup } from "./exporting.js";
import { plot } from "./plot.js";
import { fmt, HIGHLIGHT, PROB_BAR, PROB_BAR_BEFORE, TRANSPARENT } from "./scale.js";

/** What the settings make of the logits, in words. */
export function settingsText(g) {
  const t = g.temperature;
  return `logits ÷ temperature ${t} (${t < 1 ? "sharper" : t > 1 ? "flatter" : "unchanged"}), ` +
    (g.top_k ? `only the ${g.top_k} most probable kept, ` : "no top-k, ") +
    (g.top_p < 1 ? `then the fewest most probable whose probability reaches ${g.top_p} (top-p), ` : "no top-p, ") +
    "renormalised to sum to 1";
}

/** The step's bars: its candidates, and the chosen token after them when it is not one of them. */
function rowsOf(step) {
  const rows = step.candidates.map((c, rank) => ({ ...c, rank: rank + 1, chosen: c.id === step.id }));
  if (!rows.some((r) => r.chosen)) {
    rows.push({ token: step.token, id: step.id, probability: step.probability,
      sampling_probability: step.sampling_probability, rank: null, chosen: true });
  }
  return rows;
}

/** Draw step `at` of `steps` (0-based) into container; settings: the generation's {greedy, temperature, top_k, top_p,
 *  seed}; what: words after the heading; font: the page's font size; name: the downloads' name; onStep(k): the range
 *  moved. Returns the picture's exports ({name, plot, csv, json}). */
export function renderSampling(container, { steps, at, what = "", settings, font, name, onStep }) {
  const step = steps[at], rows = rowsOf(step);
  const chosen = rows.find((r) => r.chosen);
  container.hidden = false;
  container.querySelector(":scope > .sampling-wait")?.remove();
  container.dataset.step = String(at);
  container.dataset.token = step.token;
  const head = part(container, "heading", "div", { class: "sampling-head" });
  const range = steps.length > 1 && h("input", { type: "range", id: "sampling-step", min: 1, max: steps.length, value: at + 1,
    "aria-label": "Step shown", oninput: (e) => onStep(Number(e.target.value) - 1) });
  replace(head, h("h3", { text: `Sampling: step ${at + 1} of ${steps.length}, token ${step.index} “${tokenLabel(step.token)}”${what}` }),
    range);
  const inTop = rows.filter((r) => r.rank !== null);
  const sum = (k) => inTop.reduce((s, r) => s + r[k], 0);
  const open = inTop.filter((r) => r.sampling_probability > 0).length;
  const note = part(container, "note", "p", { class: "note" });
  note.textContent = (settings.greedy
    ? `Greedy: the most probable token is taken, “${tokenLabel(step.token)}” (model probability ${fmt(step.probability, 4)}). ` +
      `The dark bars show what sampling would draw from: ${settingsText(settings)}. `
    : `Drawn (seed ${settings.seed}): “${tokenLabel(step.token)}”, model probability ${fmt(step.probability, 4)}, ` +
      `drawn with probability ${fmt(step.sampling_probability, 4)}${chosen.rank === null ? ", from outside the ten most probable" : ""}. ` +
      `The sampling distribution: ${settingsText(settings)}. `) +
    `${open} of these ${inTop.length} tokens can be drawn; they hold ${fmt(sum("probability"), 4)} of the model's ` +
    `probability and ${fmt(sum("sampling_probability"), 4)} of the sampling distribution.`;

  const body = part(container, "body", "div", { class: "sampling-body" });
  const el = part(body, "plot", "div", { class: "plot sampling-plot", role: "figure",
    "aria-label": "The step's most probable tokens: model probability and sampling probability" });
  const x = rows.map((_, i) => i), labels = rows.map((r) => plotlyText(tokenLabel(r.token)) + (r.chosen ? " ◀" : ""));
  const c = rows.indexOf(chosen), cy = Math.max(chosen.probability, chosen.sampling_probability);
  const hover = (what) => `%{customdata}<br>${what}: %{y:.4f}<extra></extra>`;
  const custom = rows.map((r) => `${plotlyText(tokenLabel(r.token))} (id ${r.id}${r.rank ? `, rank ${r.rank}` : ""})${r.chosen ? ", chosen" : ""}`);
  const top = Math.max(...rows.map((r) => Math.max(r.probability, r.sampling_probability)), 1e-6);
  // the table first: the plot is drawn at the width the row leaves it
  const table = part(body, "table", "table", { class: "sampling-table" });
  replace(table,
    h("caption", { text: "The same numbers (◀: the chosen token)" }),
    h("thead", {}, h("tr", {}, ["rank", "token", "id", "model probability", "sampling probability"]
      .map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, rows.map((r) => h("tr", { class: r.chosen ? "chosen" : null, "data-token-id": r.id },
      h("td", { class: "num", text: r.rank ?? ">10" }),
      h("th", { scope: "row", class: "tok", text: tokenLabel(r.token) + (r.chosen ? " ◀" : "") }),
      h("td", { class: "num", text: r.id }),
      h("td", { class: "num", text: fmt(r.probability, 4), title: String(r.probability) }),
      h("td", { class: "num", text: r.sampling_probability === 0 ? "0 (cut)" : fmt(r.sampling_probability, 4),
        title: r.sampling_probability === 0 ? "left out by top-k or top-p: never drawn" : String(r.sampling_probability) })))));

  plot(el, [
    { type: "bar", name: "model: softmax of the logits", x, y: rows.map((r) => r.probability), customdata: custom,
      marker: { color: PROB_BAR_BEFORE }, hovertemplate: hover("model") },
    { type: "bar", name: "sampled with: after temperature, top-k, top-p", x, y: rows.map((r) => r.sampling_probability),
      customdata: custom, marker: { color: PROB_BAR }, hovertemplate: hover("sampling") },
  ], {
    barmode: "group", height: 300, margin: { l: 55, r: 10, t: 36, b: 90 },
    legend: { orientation: "h", x: 0, y: 1, yanchor: "bottom" },
    xaxis: { tickmode: "array", tickvals: x, ticktext: labels, tickangle: -45, fixedrange: true },
    yaxis: { title: { text: "probability" }, range: [0, top * 1.15], fixedrange: true },
    shapes: [{ type: "rect", x0: c - 0.46, x1: c + 0.46, y0: 0, y1: cy, line: { color: HIGHLIGHT, width: 2 },
      fillcolor: TRANSPARENT }],
    annotations: [{ x: c, y: cy, yanchor: "bottom", text: settings.greedy ? "chosen (greedy)" : "chosen",
      showarrow: false, font: { color: HIGHLIGHT } }],
  }, font, name);

  const ex = { plot: el, name,
    csv: () => [["rank", "token", "id", "chosen", "model_probability", "sampling_probability"],
      ...rows.map((r) => [r.rank ?? "", r.token, r.id, r.chosen ? 1 : 0, r.probability, r.sampling_probability])],
    json: () => ({ settings, step: at, index: step.index, token: step.token, id: step.id, probability: step.probability,
      sampling_probability: step.sampling_probability, candidates: step.candidates }) };
  replace(part(container, "tools", "div", { class: "sampling-tools" }), exportGroup(ex, "the sampling step"));
  return ex;
}

/** No step to show. */
export function clearSampling(container) {
  const el = container.querySelector("[data-part=plot]");
  if (el) window.Plotly.purge(el);
  replace(container);
  container.hidden = true;
}
