// The view's export buttons: PNG, SVG, CSV and JSON of what the active view's render() returned
// ({name, plot | svg | canvas, csv(), json()}); a button is enabled only when the view offers that form.
// The downloads themselves are export.js's. A view that draws several pictures gives each its own small group of
// the same buttons (exportGroup).
import { $, h } from "./dom.js";
import { canvasToPng, download, downloadCSV, downloadJSON, svgBlob, svgToPng } from "./export.js";
import { setStatus, showError } from "./notices.js";

const KINDS = ["png", "svg", "csv", "json"];

/** Enable the buttons for what the view's exports `ex` offer (null: none). */
export function showExports(ex) {
  ex ||= {};
  $("export-png").disabled = !(ex.plot || ex.svg || ex.canvas);
  $("export-svg").disabled = !(ex.plot || ex.svg);
  $("export-csv").disabled = !ex.csv;
  $("export-json").disabled = !ex.json;
}

async function exportAs(kind, ex) {
  if (!ex) return;
  try {
    if (kind === "csv") downloadCSV(ex.name, ex.csv());
    else if (kind === "json") downloadJSON(ex.name, ex.json());
    else if (ex.plot) await window.Plotly.downloadImage(ex.plot, { format: kind, filename: ex.name, scale: kind === "png" ? 2 : 1 });
    else if (ex.svg) download(`${ex.name}.${kind}`, kind === "svg" ? svgBlob(ex.svg) : await svgToPng(ex.svg));
    else if (ex.canvas && kind === "png") download(`${ex.name}.png`, await canvasToPng(ex.canvas()));
    setStatus(`Downloaded ${ex.name}.${kind}`);
  } catch (err) {
    showError(err);
  }
}

/** Each button downloads its form of latest(): the exports of the view drawn last. */
export function wireExports(latest) {
  for (const kind of KINDS) $(`export-${kind}`).addEventListener("click", () => exportAs(kind, latest()));
}

/** The same buttons for one picture of a view that draws several: a group of those `ex` offers, each downloading
 *  its form of `ex` ({name, plot | svg | canvas, csv(), json()}). */
export function exportGroup(ex, label) {
  const offers = { png: ex.plot || ex.svg || ex.canvas, svg: ex.plot || ex.svg, csv: ex.csv, json: ex.json };
  return h("div", { class: "export", role: "group", "aria-label": `Export ${label}` },
    KINDS.filter((k) => offers[k]).map((kind) => h("button", { type: "button", class: "small", "data-export": kind,
      title: `Download ${label} as ${kind.toUpperCase()}`, text: kind.toUpperCase(), onclick: () => exportAs(kind, ex) })));
}
