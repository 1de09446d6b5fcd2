// Head summary: one statistic for every layer x head as a heatmap, with a sortable ranking table beside it;
// click a cell or a row to open that head.
import { h, part, replace } from "../dom.js";
import { colourRange, exactString, fixedTop, fmt, fmtExact, HIGHLIGHT, plotlyScale, TRANSPARENT } from "../scale.js";

export const title = "Head summary";
export const help = "One number per head, for the whole input: pick a statistic to find heads that behave a " +
  "certain way, and sort the ranking beside the map. Click a cell or a row to open that head.";

/** Summaries only: no matrices are transferred. */
export function requests() {
  return [{ endpoint: "attention", include: ["summary", "scores"] }];
}

const SORTS = { value: (r) => r.v, layer: (r) => r.l * 1e4 + r.hd, head: (r) => r.hd * 1e4 + r.l };

function sortButton(key, label, st, ctx) {
  const on = st.sort.replace("-", "") === key, desc = st.sort.startsWith("-");
  const next = on ? (desc ? key : `-${key}`) : key === "value" ? "-value" : key;
  return h("th", { scope: "col", "aria-sort": on ? (desc ? "descending" : "ascending") : "none" },
    h("button", { type: "button", class: "sort", "data-sort": key, onclick: () => ctx.go({ sort: next }),
      title: `Sort by ${label}` }, label, h("span", { "aria-hidden": "true", text: on ? (desc ? " ▼" : " ▲") : " ⇅" })));
}

// The numbers in the cells (issue 51: SmolLM2's 270 were drawn 11 px high in cells 10 px high, ~350 px for 30
// layers; with Large text 15 px in 17 x 10 px cells). They keep their size, never under 10 px: each row gets ROW_EM
// of it (the map grows and the page scrolls), and where a cell beside the ranking is too narrow for them the map
// stands above the ranking, the panel's whole width. Narrower still (many heads), the cells have none: the ranking
// and the hover have every number.
const GAP = 2;                  // px between cells
const ROW_EM = 1.6;             // a row's height, in the numbers' font size (their line box is ~1.2)
let measure = null;             // a canvas context that measures text as Plotly's SVG draws it

function textWidth(texts, px) {
  measure ??= document.createElement("canvas").getContext("2d");
  measure.font = `${px}px system-ui, sans-serif`;                            // the plots' font (plot.js withBase)
  return Math.max(0, ...texts.map((t) => measure.measureText(t).width));
}

/** The colour bar's share of the plot's width: its title (Plotly's ~1.2 em), or its tick labels, the bar and pads. */
function barWidth(title, font) {
  return Math.max(textWidth(title ? title.split("<br>") : [], Math.round(font * 1.25)), textWidth(["0.00"], font)) + 30;
}

/** The colour bar's title in lines of at most 13 characters (or its longest word): a narrow bar leaves the cells
 *  room for their numbers beside the ranking ("cross-sentence<br>mass", "mean entropy<br>(nats)"). */
function barLines(unit) {
  const words = unit.split(" "), most = Math.max(13, ...words.map((w) => w.length)), lines = [];
  for (const w of words) {
    if (lines.length && `${lines.at(-1)} ${w}`.length <= most) lines[lines.length - 1] += ` ${w}`;
    else lines.push(w);
  }
  return lines.join("<br>");
}

/** Whether the cells can hold their numbers at their size (px), and the map's layout and height for them. */
function numbersFit(layout, plot, z, digits, { H, L, large, font, margin, barTitle }) {
  const px = large ? 15 : H > 12 ? 10 : 11;
  const needW = textWidth([...new Set(z.flat().map((v) => v.toFixed(digits)))], px) + 2 + GAP;   // a px each side
  const needH = Math.ceil(px * ROW_EM) + GAP;
  const bar = barWidth(barTitle, font);
  const cell = (w) => (w - margin.l - margin.r - bar) / H;
  layout.classList.remove("stacked");
  plot.style.height = "";
  if (cell(plot.clientWidth || 800) < needW && cell(layout.clientWidth) >= needW) layout.classList.add("stacked");
  const numbers = cell(plot.clientWidth || 800) >= needW;
  const tall = L * needH + margin.t + margin.b;
  if (numbers && tall > plot.clientHeight) plot.style.height = `${tall}px`;
  return { numbers, px };
}

export function render(container, { meta, results: [ans] }, st, ctx) {
  const info = ctx.boot.stats.find((x) => x.id === st.stat);
  const { label, help: explain } = info;
  const T = meta.tokens.length, L = ans.layers.length, H = ans.heads.length;
  const controls = part(container, "controls", "div", { class: "view-controls" });
  replace(controls, st.stat === "mean_distance" && h("label", { class: "check" },
    h("input", { type: "checkbox", id: "dist-norm", checked: st.dist_norm, onchange: (e) => ctx.go({ dist_norm: e.target.checked }) }),
    ` Divide by the longest possible distance (${T - 1} tokens), so texts of any length compare`));
  const note = part(container, "note", "p", { class: "note" });
  const layout = part(container, "layout", "div", { class: "summary-layout" });
  const plot = part(layout, "plot", "div", { class: "plot summary-plot", role: "figure" });
  const rank = part(layout, "rank", "div", { class: "rank" });
  const raw = info.score ? ans.scores[st.stat] : ans.summary[st.stat];
  container.dataset.stat = st.stat;
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  if (!raw) {                                                    // a pair statistic on a single text
    note.textContent = `${explain} This input is a single text: add a second sentence to compute it.`;
    window.Plotly.purge(plot);
    replace(rank);
    return { name: `attnscope-${st.model}-${st.stat}` };
  }
  const norm = st.stat === "mean_distance" && st.dist_norm ? Math.max(T - 1, 1) : 1;
  const z = raw.map((r) => r.map((v) => v / norm));
  const unit = norm === 1 ? label : `${label.replace(" (tokens)", "")} ÷ ${T - 1}`;
  let max = 0;
  for (const r of z) for (const v of r) max = Math.max(max, v);
  const range = colourRange(st, max, fixedTop(st.stat, T, norm !== 1));
  // the induction score is the API's own probe's (random tokens repeated twice), not this text's
  const over = st.stat === "induction" ? "Computed on a probe of random tokens repeated twice, not on this text."
    : `Computed over all ${T} tokens of this text, special ones included.`;
  note.textContent = `${explain} ${over} Colours: ${range.label}` +
    (st.stat === "mean_entropy" ? ` (ln ${T} = ${fmt(Math.log(T), 2)} nats: uniform over every key).` : ".");

  const digits = st.stat === "mean_distance" && norm === 1 ? 1 : 2;
  const narrow = layout.clientWidth < 600;
  const barTitle = narrow ? "" : barLines(unit);
  const margin = narrow ? { l: 44, r: 4, t: 36, b: 44 } : { l: 56, r: 10, t: 44, b: 50 };
  const fit = numbersFit(layout, plot, z, digits, { H, L, large: ctx.large, font: ctx.font, margin, barTitle });
  ctx.plot(plot, [{
    type: "heatmap", z, x: ans.heads, y: ans.layers, colorscale: plotlyScale, xgap: GAP, ygap: GAP,
    zmin: range.zmin, zmax: range.zmax,
    colorbar: { title: { text: barTitle }, thickness: narrow ? 8 : 12 },
    // the numbers in the cells only where they fit (the ranking has them all)
    texttemplate: fit.numbers ? `%{z:.${digits}f}` : "", textfont: { size: fit.px },
    hovertemplate: `layer %{y}, head %{x}<br>${unit}: %{z:.6f}<extra>click to open</extra>`,
  }], {
    title: narrow ? unit : `${unit} per head`,
    margin,
    xaxis: { title: { text: "head" }, tickmode: "array", tickvals: ans.heads, showgrid: false, zeroline: false, fixedrange: true },
    yaxis: { title: { text: "layer" }, tickmode: "array", tickvals: ans.layers, autorange: "reversed", showgrid: false, zeroline: false, fixedrange: true },
    shapes: [{ type: "rect", x0: st.head - 0.5, x1: st.head + 0.5, y0: st.layer - 0.5, y1: st.layer + 0.5,
      line: { color: HIGHLIGHT, width: 3 }, fillcolor: TRANSPARENT }],
  });
  if (!plot.dataset.wired) {                // Plotly's listener is added once; it goes where the latest render says
    plot.dataset.wired = "1";
    const memory = ctx.memory;
    plot.on("plotly_click", (ev) => {
      const p = ev.points[0];
      memory.go({ view: "head", layer: p.y, head: p.x });
    });
  }
  ctx.memory.go = ctx.go;

  // The ranking: every head, sorted as the URL says (largest value first by default).
  const list = ans.layers.flatMap((l, li) => ans.heads.map((hd, hi) => ({ l, hd, v: z[li][hi] })));
  const key = st.sort.replace("-", ""), sign = st.sort.startsWith("-") ? -1 : 1;
  list.sort((a, b) => sign * (SORTS[key](a) - SORTS[key](b)) || a.l - b.l || a.hd - b.hd);
  const byValue = [...list].sort((a, b) => b.v - a.v);
  const place = new Map(byValue.map((r, k) => [`${r.l}/${r.hd}`, k + 1]));
  const open = (l, hd) => (e) => {
    if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    ctx.go({ view: "head", layer: l, head: hd });
  };
  replace(rank,
    h("div", { class: "table-scroll rank-scroll" }, h("table", { class: "stat-table rank-table" },
      h("caption", { text: `${L * H} heads ranked by ${unit}` }),
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "rank" }), sortButton("layer", "layer", st, ctx),
        sortButton("head", "head", st, ctx), sortButton("value", unit, st, ctx))),
      h("tbody", {}, list.map(({ l, hd, v }) => h("tr", {
        class: l === st.layer && hd === st.head ? "current" : null,
      },
      h("td", { class: "num", text: place.get(`${l}/${hd}`) }),
      h("td", { class: "num", text: l }), h("td", { class: "num", text: hd }),
      h("td", { class: "num", "data-layer": l, "data-head": hd, "data-value": exactString(v) },
        h("a", { href: ctx.href({ view: "head", layer: l, head: hd }), title: fmtExact(v),
          "aria-label": `layer ${l} head ${hd}: ${fmtExact(v)}; open`, onclick: open(l, hd) }, fmt(v, 4)))))))));
  return {
    plot,
    name: `attnscope-${st.model}-${st.stat}`,
    csv: () => [["layer", ...ans.heads.map((hd) => `head ${hd}`)],
      ...ans.layers.map((l, li) => [l, ...z[li].map((v) => Number(exactString(v)))])],
    json: () => ({ model: st.model, text: st.text, statistic: st.stat, normalised_by: norm, layers: ans.layers,
      heads: ans.heads, values: z, colour_scale: { zmin: range.zmin, zmax: range.zmax, mode: range.perHead ? "per map" : "fixed" } }),
  };
}
