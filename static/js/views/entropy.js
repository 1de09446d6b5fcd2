// Entropy view: how spread out each query's attention is, for the selected head (and optionally
// every head of the layer), raw in nats and normalised to 0..1.
import { h, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { thinTicks, visibleTokens } from "../matrix.js";
import { exactString, fmtExact, headColor, HIGHLIGHT, SIG_FORMAT } from "../scale.js";

export const title = "Entropy view";
export const help = "Entropy measures how spread out a token's attention is: 0 nats means it looks at a single key, " +
  "log(number of keys) means it looks at all keys equally. Normalised entropy divides by that maximum, so 0 = focused " +
  "and 1 = uniform, comparable across tokens (a causal model's early tokens see few keys).";

export function requests(st) {
  return [{ endpoint: "attention", layers: [st.layer], include: ["entropy"] }];
}

export function render(container, { meta, results: [ans] }, st, ctx) {
  const hi = ans.heads.indexOf(st.head);
  const idx = visibleTokens(meta, st.hide_special);
  const xs = idx.map((_, p) => p);
  const labels = idx.map((i) => plotlyText(tokenLabel(meta.tokens[i])));
  const ticks = thinTicks(idx.length, ctx.large ? 25 : 45);
  const pick = (t, head) => idx.map((i) => t.at(0, head, i));

  const controls = part(container, "controls", "div", { class: "view-controls" });
  replace(controls, h("label", { class: "check" },
    h("input", { type: "checkbox", id: "all-heads", checked: st.all_heads, onchange: (e) => ctx.go({ all_heads: e.target.checked }) }),
    ` Show every head of layer ${st.layer}`));
  const note = part(container, "note", "p", { class: "note" });
  note.textContent = st.hide_special && meta.special.some(Boolean)
    ? "[CLS] and [SEP] rows are left out; the values are the model's own, over all keys."
    : "One point per query token.";
  const plot = part(container, "plot", "div", { class: "plot entropy-plot", role: "figure" });
  plot.setAttribute("aria-label", `Entropy per query token for layer ${st.layer}, head ${st.head}. The table below lists the values.`);

  const traces = [];
  const heads = st.all_heads ? ans.heads.map((_, k) => k) : [hi];
  for (const k of heads) {
    const main = k === hi;
    const line = { color: headColor(ans.heads[k]), width: main ? 3 : 1.2 };
    const common = {
      type: "scatter", mode: main && idx.length <= 80 ? "lines+markers" : "lines", x: xs, line,
      name: `head ${ans.heads[k]}`, legendgroup: `h${k}`, opacity: main || !st.all_heads ? 1 : 0.55,
      customdata: labels.map((t, p) => [t, idx[p]]),
    };
    traces.push({ ...common, y: pick(ans.entropy, k), yaxis: "y", showlegend: st.all_heads,
      hovertemplate: `head ${ans.heads[k]} · query %{customdata[1]} “%{customdata[0]}”<br>entropy %{y:${SIG_FORMAT}} nats<extra></extra>` });
    traces.push({ ...common, y: pick(ans.normalized_entropy, k), yaxis: "y2", showlegend: false,
      hovertemplate: `head ${ans.heads[k]} · query %{customdata[1]} “%{customdata[0]}”<br>normalised %{y:${SIG_FORMAT}}<extra></extra>` });
  }
  const pinPos = st.pin === null ? -1 : idx.indexOf(st.pin);
  // on its own scale by default, 0 to ln(keys) (uniform over every key): noise of a focused head stays near 0 instead
  // of filling the plot; "fitted" colours (the page's Colours menu) fit it to its largest value
  const top = Math.log(Math.max(meta.tokens.length, 2));
  const own = st.scale === "fixed";
  ctx.plot(plot, traces, {
    title: `Entropy per token · layer ${st.layer} · head ${st.head}`,
    margin: { l: 70, r: 20, t: 50, b: 110 }, showlegend: st.all_heads, legend: { orientation: "h", y: 1.08 },
    xaxis: { anchor: "y2", tickmode: "array", tickvals: ticks, ticktext: ticks.map((p) => labels[p]), tickangle: -60, zeroline: false },
    yaxis: { title: { text: own ? `entropy (nats, 0–ln ${meta.tokens.length})` : "entropy (nats)" }, zeroline: false,
      domain: [0.55, 1], anchor: "x", ...(own ? { range: [0, top * 1.05] } : { rangemode: "tozero" }) },
    yaxis2: { title: { text: "normalised (0–1)" }, range: [0, 1.05], zeroline: false, domain: [0, 0.45], anchor: "x" },
    shapes: pinPos < 0 ? [] : [{ type: "line", xref: "x", yref: "paper", x0: pinPos, x1: pinPos, y0: 0, y1: 1,
      line: { color: HIGHLIGHT, width: 2, dash: "dot" } }],
    hovermode: "closest",
  });

  const e = pick(ans.entropy, hi), ne = pick(ans.normalized_entropy, hi), mw = pick(ans.max_weight, hi);
  const details = part(container, "table", "details", { class: "data-table" });
  replace(details,
    h("summary", { text: `Table for head ${st.head} (exact values)` }),
    h("div", { class: "table-scroll" }, h("table", { class: "entropy-table" },
      h("thead", {}, h("tr", {}, ["query", "token", "entropy (nats)", "normalised", "largest weight"].map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", {}, idx.map((i, p) => h("tr", {
        "data-query": i, "data-entropy": exactString(e[p]), "data-normalized": exactString(ne[p]), "data-max": exactString(mw[p]),
        class: st.pin === i ? "pinned" : null,
      }, h("td", { class: "num", text: i }), h("td", { class: "tok", text: tokenLabel(meta.tokens[i]) }),
      h("td", { class: "num", text: fmtExact(e[p]) }), h("td", { class: "num", text: fmtExact(ne[p]) }),
      h("td", { class: "num", text: fmtExact(mw[p]) })))))));
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  return {
    plot,
    name: `attnscope-${st.model}-L${st.layer}-entropy`,
    csv: () => [["layer", "head", "query_index", "token", "entropy_nats", "normalized_entropy", "max_weight"],
      ...ans.heads.flatMap((hd, k) => idx.map((i) => [st.layer, hd, i, meta.tokens[i],
        Number(exactString(ans.entropy.at(0, k, i))), Number(exactString(ans.normalized_entropy.at(0, k, i))),
        Number(exactString(ans.max_weight.at(0, k, i)))]))],
    json: () => ({ model: st.model, text: st.text, layer: st.layer, heads: ans.heads, tokens: meta.tokens,
      entropy: ans.entropy.toArray()[0], normalized_entropy: ans.normalized_entropy.toArray()[0],
      max_weight: ans.max_weight.toArray()[0] }),
  };
}
