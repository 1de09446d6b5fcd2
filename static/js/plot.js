// The ONE Plotly setup: the config every chart gets and the base layout every view's layout extends.
// Views pass only what is theirs (title text, margin, axes, shapes); this adds the rest.
import { PAPER } from "./scale.js";

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

/** Plotly, once its script has run: the page loads it async (templates/index.html), so the first request goes out
 *  while its 4.8 MB are read; main.js waits for this before a view draws. Outside the page (a notebook's output,
 *  embed.js) plotly.js is a script of an earlier output: waited for a while, frame by frame. */
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  const script = document.getElementById("plotly-js");
  if (!script) {
    const until = performance.now() + 20_000;
    return new Promise((resolve, reject) => {
      const look = () => (window.Plotly ? resolve(window.Plotly)
        : performance.now() > until ? reject(new Error("plotly.js did not load")) : requestAnimationFrame(look));
      look();
    });
  }
  return new Promise((resolve, reject) => {
    script.addEventListener("load", () => resolve(window.Plotly), { once: true });
    script.addEventListener("error", () => reject(new Error("plotly.js did not load")), { once: true });
  });
}

/** Draw (or redraw in place) a chart; `filename` names its PNG download. */
export function plot(el, data, layout, font, filename) {
  return window.Plotly.react(el, data, withBase(layout, font),
    { ...PLOT_CONFIG, toImageButtonOptions: { ...PLOT_CONFIG.toImageButtonOptions, filename } });
}
