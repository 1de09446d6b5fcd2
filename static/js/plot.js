// The ONE Plotly setup: the config every chart gets and the base layout every view's layout extends.
// Views pass only what is theirs (title text, margin, axes, shapes); this adds the rest.
import { fmtSig, PAPER } from "./scale.js";

export const PLOT_CONFIG = {
  responsive: true, displaylogo: false, scrollZoom: false,
  showSendToCloud: false,          // Plotly 4 offers "Share chart" (an upload to Plotly Cloud) by default: never
  modeBarButtonsToRemove: ["lasso2d", "select2d"],
  toImageButtonOptions: { format: "png", scale: 2, filename: "attnscope" },
};

/** A view's layout on the shared base: no Plotly template, the page's font at `font` px, white paper, and a
 *  string title turned into a title one size up. */
export function withBase(layout, font) {
  const title = typeof layout.title === "string" ? { text: layout.title, font: { size: font + 2 } } : layout.title;
  return {
    template: "none", font: { size: font, family: "system-ui, sans-serif" },
    paper_bgcolor: PAPER, plot_bgcolor: PAPER, ...layout, title,
  };
}

/** Plotly, once its script has run. The page preloads plotly.js (4.8 MB, templates/index.html: its bytes arrive
 *  while the first request is under way) and runs it only when first asked here: its ~1 s of parsing and running
 *  would otherwise hold the first picture (a head view's sketch, below) back. main.js waits for this before a view
 *  draws with Plotly. Outside the page (a notebook's output, embed.js) plotly.js is a script of an earlier output:
 *  waited for a while, frame by frame. */
let plotlyLoad = null;
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!document.getElementById("plotly-js")) {
    const until = performance.now() + 20_000;
    return new Promise((resolve, reject) => {
      const look = () => (window.Plotly ? resolve(window.Plotly)
        : performance.now() > until ? reject(new Error("plotly.js did not load")) : requestAnimationFrame(look));
      look();
    });
  }
  plotlyLoad ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = document.getElementById("plotly-js").href;      // the preloaded bytes
    script.addEventListener("load", () => resolve(window.Plotly), { once: true });
    script.addEventListener("error", () => { plotlyLoad = null; reject(new Error("plotly.js did not load")); }, { once: true });
    document.head.append(script);
  });
  return plotlyLoad;
}

// ---- the first picture before plotly.js has run -------------------------------------------------------------
// A chart of heatmap traces on one pair of axes, painted into a canvas of the figure's size: the same
// cells in the same colours (the traces' own colorscale, zmin and zmax), the tick labels, title, shapes and colour
// bar where Plotly puts them (near enough: Plotly's own figure replaces it as soon as plotly.js has run).

const SKETCH_BAR = 56;          // the colour bar's width beyond its thickness (Plotly's pad, tick labels)
const unescape = (s) => String(s ?? "").replace(/<br>/g, " ").replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");

function rgbOf(c) {
  const m = /^rgb\((\d+),\s*(\d+),\s*(\d+)\)$/.exec(c);
  if (m) return [Number(m[1]), Number(m[2]), Number(m[3])];
  const x = /^#([0-9a-f]{6})$/i.exec(c);
  if (x) return [0, 2, 4].map((k) => parseInt(x[1].slice(k, k + 2), 16));
  throw new Error(`sketch: colour ${c}`);
}

/** The colour of v on a Plotly colorscale [[t, colour], ...] over [zmin, zmax] (linear in RGB between the stops,
 *  as Plotly's heatmaps). */
function scaleColour(stops, zmin, zmax, v) {
  const t = zmax > zmin ? Math.max(0, Math.min(1, (v - zmin) / (zmax - zmin))) : 0;
  let i = 1;
  while (i < stops.length - 1 && stops[i][0] < t) i++;
  const [t0, c0] = stops[i - 1], [t1, c1] = stops[i];
  const f = t1 > t0 ? Math.max(0, Math.min(1, (t - t0) / (t1 - t0))) : 0;
  return `rgb(${[0, 1, 2].map((k) => Math.round(c0[k] + f * (c1[k] - c0[k]))).join(",")})`;
}

/** Paint `traces` (heatmaps on the x/y axes, no other kind) with `layout` as Plotly would, into a canvas that fills
 *  `el`; true once painted, false for a figure it does not sketch (nothing drawn). */
export function sketch(el, traces, layout, font) {
  const first = traces.find((t) => t.z?.[0]?.length);
  if (!first || traces.some((t) => t.type !== "heatmap")) return false;
  const full = withBase(layout, font);
  const W = Math.round(full.width ?? el.clientWidth), H = Math.round(full.height ?? el.clientHeight);
  if (!(W > 0 && H > 0)) return false;
  const m = { l: 80, r: 80, t: 100, b: 80, ...full.margin };
  const withBar = traces.find((t) => t.type === "heatmap" && t.showscale !== false && t.colorbar);
  const thick = withBar ? withBar.colorbar.thickness ?? 30 : 0;
  const px = m.l, py = m.t, pw = W - m.l - m.r - (withBar ? thick + SKETCH_BAR : 0), ph = H - m.t - m.b;
  if (!(pw > 0 && ph > 0)) return false;
  const nr = first.z.length, nc = first.z[0].length;
  const cw = pw / nc, ch = ph / nr;
  const canvas = document.createElement("canvas");
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(W * dpr);
  canvas.height = Math.round(H * dpr);
  canvas.className = "plot-sketch";
  canvas.style.width = `${W}px`;
  canvas.style.height = `${H}px`;
  canvas.setAttribute("aria-hidden", "true");
  canvas.dataset.area = [px, py, pw, ph, nr, nc].join(" ");       // the plot area (CSS px) and its cells
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.fillStyle = full.paper_bgcolor;
  g.fillRect(0, 0, W, H);
  g.fillStyle = full.plot_bgcolor;
  g.fillRect(px, py, pw, ph);
  const x = (b) => px + (b + 0.5) * cw, y = (a) => py + (a + 0.5) * ch;      // cell centres (the y axis reversed)
  traces.forEach((t) => {
    if (t.opacity === 0 || !t.z?.[0]?.length) return;
    const stops = t.colorscale.map(([s, c]) => [s, rgbOf(c)]);
    const gx = t.xgap || 0, gy = t.ygap || 0;
    t.z.forEach((row, a) => row.forEach((v, b) => {
      if (v === null || v === undefined || Number.isNaN(v)) return;
      g.fillStyle = scaleColour(stops, t.zmin, t.zmax, v);
      g.fillRect(px + b * cw + gx / 2, py + a * ch + gy / 2, Math.max(0.5, cw - gx), Math.max(0.5, ch - gy));
    }));
  });
  for (const s of full.shapes ?? []) {
    const sx = (v, ref) => (ref === "paper" ? px + v * pw : px + (v + 0.5) * cw);
    const sy = (v, ref) => (ref === "paper" ? py + (1 - v) * ph : py + (v + 0.5) * ch);
    g.strokeStyle = s.line?.color ?? "#000";
    g.lineWidth = s.line?.width ?? 2;
    g.setLineDash(s.line?.dash === "dash" ? [9, 9] : s.line?.dash === "dot" ? [3, 3] : []);
    const [x0, x1, y0, y1] = [sx(s.x0, s.xref), sx(s.x1, s.xref), sy(s.y0, s.yref), sy(s.y1, s.yref)];
    if (s.type === "rect") g.strokeRect(Math.min(x0, x1), Math.min(y0, y1), Math.abs(x1 - x0), Math.abs(y1 - y0));
    else { g.beginPath(); g.moveTo(x0, y0); g.lineTo(x1, y1); g.stroke(); }
  }
  g.setLineDash([]);
  g.strokeStyle = full.xaxis?.linecolor ?? "#444";
  g.lineWidth = 1;
  g.strokeRect(px, py, pw, ph);
  // ticks, axis titles and the title, in the page's font
  const family = full.font.family, ink = "#444";
  g.fillStyle = ink;
  const xa = full.xaxis ?? {}, ya = full.yaxis ?? {};
  g.font = `${xa.tickfont?.size ?? font}px ${family}`;
  (xa.tickvals ?? []).forEach((v, k) => {
    g.save();
    g.translate(x(v), py + ph + 6);
    g.rotate(((xa.tickangle ?? 0) * Math.PI) / 180);
    g.textAlign = xa.tickangle ? "right" : "center";
    g.textBaseline = xa.tickangle ? "middle" : "top";
    g.fillText(unescape(xa.ticktext?.[k] ?? v), 0, 0);
    g.restore();
  });
  g.font = `${ya.tickfont?.size ?? font}px ${family}`;
  g.textAlign = "right";
  g.textBaseline = "middle";
  (ya.tickvals ?? []).forEach((v, k) => g.fillText(unescape(ya.ticktext?.[k] ?? v), px - 6, y(v)));
  g.font = `${font}px ${family}`;
  g.textAlign = "center";
  g.textBaseline = "bottom";
  if (xa.title?.text) g.fillText(unescape(xa.title.text), px + pw / 2, H - 4);
  if (ya.title?.text) {
    g.save();
    g.translate(12 + font / 2, py + ph / 2);
    g.rotate(-Math.PI / 2);
    g.textBaseline = "middle";
    g.fillText(unescape(ya.title.text), 0, 0);
    g.restore();
  }
  if (full.title?.text) {
    g.font = `${full.title.font?.size ?? font + 2}px ${family}`;
    g.textBaseline = "middle";
    g.fillText(unescape(full.title.text), W / 2, m.t / 2);
  }
  if (withBar) {                                 // the colour bar: its scale from zmin (bottom) to zmax (top)
    const bx = px + pw + 0.02 * pw + 10;
    const stops = withBar.colorscale.map(([s, c]) => [s, rgbOf(c)]);
    const grad = g.createLinearGradient(0, py + ph, 0, py);
    for (const [s] of stops) grad.addColorStop(s, scaleColour(stops, 0, 1, s));
    g.fillStyle = grad;
    g.fillRect(bx, py, thick, ph);
    g.fillStyle = ink;
    g.font = `${withBar.colorbar.tickfont?.size ?? font}px ${family}`;
    g.textAlign = "left";
    g.textBaseline = "middle";
    g.fillText(fmtSig(withBar.zmax), bx + thick + 4, py + 6);
    g.fillText(fmtSig(withBar.zmin), bx + thick + 4, py + ph - 6);
  }
  el.querySelector(":scope > canvas.plot-sketch")?.remove();
  el.append(canvas);
  return true;
}

/** Draw (or redraw in place) a chart; `filename` names its PNG download. */
export function plot(el, data, layout, font, filename) {
  el.querySelector(":scope > canvas.plot-sketch")?.remove();    // the first picture's sketch, replaced
  return window.Plotly.react(el, data, withBase(layout, font),
    { ...PLOT_CONFIG, toImageButtonOptions: { ...PLOT_CONFIG.toImageButtonOptions, filename } });
}
