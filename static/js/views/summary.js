// Head summary: one statistic for every layer x head as a heatmap; click a cell to open that head.
import { h, part, replace } from "../dom.js";
import { exactString, fmt, fmtExact, plotlyScale } from "../scale.js";

export const title = "Head summary";
export const help = "One number per head, for the whole input: pick a statistic to find heads that behave a " +
  "certain way. Click a cell (or a link in the table below) to open that head.";

export const STAT_INFO = {
  mean_entropy: ["mean entropy (nats)", "How spread out each row is, averaged over the queries: near 0 = every token looks at one key; high = attention spread over many keys."],
  first_token_mass: ["first-token mass", "Average weight on the first token ([CLS] for BERT). Many heads park their attention there when they have nothing to do."],
  last_token_mass: ["last-token mass", "Average weight on the last token ([SEP] for BERT): another common ‘no-op’ place to put attention."],
  previous_token_mass: ["previous-token mass", "Average weight a token puts on the token just before it: high for ‘previous-token’ heads."],
  diagonal_mass: ["diagonal mass", "Average weight a token puts on itself."],
  mean_distance: ["mean distance (tokens)", "How far away the attended keys are, on average, in tokens: small = local heads, large = long-range heads."],
};

/** Summaries only: no matrices are transferred. */
export function requests() {
  return [{ endpoint: "attention", include: ["summary"] }];
}

export function render(container, { results: [ans] }, st, ctx) {
  const [label, explain] = STAT_INFO[st.stat];
  const z = ans.summary[st.stat];
  const L = ans.layers.length, H = ans.heads.length;
  const note = part(container, "note", "p", { class: "note" });
  note.textContent = explain + " Computed over all tokens, special ones included.";
  const plot = part(container, "plot", "div", { class: "plot summary-plot", role: "figure" });
  plot.setAttribute("aria-label", `${label} of every head: ${L} layers by ${H} heads. The table below lists the values.`);
  const big = ctx.large;
  ctx.plot(plot, [{
    type: "heatmap", z, x: ans.heads, y: ans.layers, colorscale: plotlyScale, xgap: 2, ygap: 2,
    colorbar: { title: { text: label.replace(" (", "<br>(") }, thickness: 14 },
    texttemplate: "%{z:.2f}", textfont: { size: big ? 15 : 11 },
    hovertemplate: `layer %{y}, head %{x}<br>${label}: %{z:.6f}<extra>click to open</extra>`,
  }], {
    template: "none", font: { size: ctx.font, family: "system-ui, sans-serif" },
    title: { text: `${label} per head`, font: { size: ctx.font + 2 } },
    margin: { l: 70, r: 20, t: 50, b: 60 },
    xaxis: { title: { text: "head" }, tickmode: "array", tickvals: ans.heads, showgrid: false, zeroline: false, fixedrange: true },
    yaxis: { title: { text: "layer" }, tickmode: "array", tickvals: ans.layers, autorange: "reversed", showgrid: false, zeroline: false, fixedrange: true },
    shapes: [{ type: "rect", x0: st.head - 0.5, x1: st.head + 0.5, y0: st.layer - 0.5, y1: st.layer + 0.5,
      line: { color: "#ff7f0e", width: 3 }, fillcolor: "rgba(0,0,0,0)" }],
    paper_bgcolor: "#fff", plot_bgcolor: "#fff",
  });
  if (!plot.dataset.wired) {
    plot.dataset.wired = "1";
    plot.on("plotly_click", (ev) => {
      const p = ev.points[0];
      plot._go({ view: "head", layer: p.y, head: p.x });
    });
  }
  plot._go = ctx.go;

  const details = part(container, "table", "details", { class: "data-table" });
  replace(details,
    h("summary", { text: `Table of ${label} (exact values; each is a link to that head)` }),
    h("div", { class: "table-scroll" }, h("table", { class: "stat-table" },
      h("caption", { class: "visually-hidden", text: `${label}, layers by heads` }),
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "layer" }), ans.heads.map((hd) => h("th", { scope: "col", text: `head ${hd}` })))),
      h("tbody", {}, ans.layers.map((l, li) => h("tr", {}, h("th", { scope: "row", text: `layer ${l}` }),
        ans.heads.map((hd, hi) => h("td", { "data-layer": l, "data-head": hd, "data-value": exactString(z[li][hi]) },
          h("a", {
            href: ctx.href({ view: "head", layer: l, head: hd }), title: fmtExact(z[li][hi]),
            "aria-label": `layer ${l} head ${hd}: ${fmtExact(z[li][hi])}; open`,
            onclick: (e) => {
              if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
              e.preventDefault();
              ctx.go({ view: "head", layer: l, head: hd });
            },
          }, fmt(z[li][hi], 3))))))))));
  container.dataset.stat = st.stat;
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  return {
    plot,
    name: `attnscope-${st.model}-${st.stat}`,
    csv: () => [["layer", ...ans.heads.map((hd) => `head ${hd}`)],
      ...ans.layers.map((l, li) => [l, ...z[li].map((v) => Number(exactString(v)))])],
    json: () => ({ model: st.model, text: st.text, statistic: st.stat, layers: ans.layers, heads: ans.heads, values: z }),
  };
}
