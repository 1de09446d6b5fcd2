// Head summary: one statistic for every layer x head as a heatmap; click a cell to open that head.
import { h, part, replace } from "../dom.js";
import { exactString, fmt, fmtExact, plotlyScale } from "../scale.js";

export const title = "Head summary";
export const help = "One number per head, for the whole input: pick a statistic to find heads that behave a " +
  "certain way. Click a cell (or a link in the table below) to open that head.";

/** Summaries only: no matrices are transferred. */
export function requests() {
  return [{ endpoint: "attention", include: ["summary"] }];
}

export function render(container, { results: [ans] }, st, ctx) {
  const { label, help: explain } = ctx.boot.stats.find((x) => x.id === st.stat);
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
    title: `${label} per head`,
    margin: { l: 70, r: 20, t: 50, b: 60 },
    xaxis: { title: { text: "head" }, tickmode: "array", tickvals: ans.heads, showgrid: false, zeroline: false, fixedrange: true },
    yaxis: { title: { text: "layer" }, tickmode: "array", tickvals: ans.layers, autorange: "reversed", showgrid: false, zeroline: false, fixedrange: true },
    shapes: [{ type: "rect", x0: st.head - 0.5, x1: st.head + 0.5, y0: st.layer - 0.5, y1: st.layer + 0.5,
      line: { color: "#ff7f0e", width: 3 }, fillcolor: "rgba(0,0,0,0)" }],
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
