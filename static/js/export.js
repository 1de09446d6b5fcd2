// Export without a server round trip: CSV / JSON of the matrix on screen (Blob + object URL),
// PNG / SVG of a Plotly plot (Plotly.downloadImage) or of the page's own SVG / canvas drawings.
import { PAPER } from "./scale.js";

export function download(filename, blob) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  a.style.display = "none";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** One CSV cell: quoted when needed; a leading = + - @ is defused so spreadsheets show text, not formulas. */
function cell(v) {
  if (typeof v === "number") return Number.isFinite(v) ? String(v) : v > 0 ? "Infinity" : "-Infinity";
  let s = String(v ?? "");
  if (/^[=+\-@\t\r]/.test(s)) s = "'" + s;
  return /[",\n\r]/.test(s) || s !== s.trim() ? `"${s.replace(/"/g, '""')}"` : s;
}

export function toCSV(rows) {
  return rows.map((r) => r.map(cell).join(",")).join("\r\n") + "\r\n";
}

export function downloadCSV(name, rows) {
  download(`${name}.csv`, new Blob([toCSV(rows)], { type: "text/csv;charset=utf-8" }));
}

export function downloadJSON(name, obj) {
  download(`${name}.json`, new Blob([JSON.stringify(obj, null, 1)], { type: "application/json" }));
}

/** Serialise an inline SVG element (its styles must be attributes) to a standalone file. */
export function svgBlob(svgEl) {
  const clone = svgEl.cloneNode(true);
  clone.setAttribute("xmlns", "http://www.w3.org/2000/svg");
  return new Blob([new XMLSerializer().serializeToString(clone)], { type: "image/svg+xml" });
}

/** Rasterise an inline SVG element to a PNG blob (through a blob: image, which the CSP allows). */
export function svgToPng(svgEl, scale = 2) {
  return new Promise((resolve, reject) => {
    const url = URL.createObjectURL(svgBlob(svgEl));
    const img = new Image();
    img.onload = () => {
      const w = Number(svgEl.getAttribute("width")), hgt = Number(svgEl.getAttribute("height"));
      const c = document.createElement("canvas");
      c.width = w * scale;
      c.height = hgt * scale;
      const g = c.getContext("2d");
      g.fillStyle = PAPER;
      g.fillRect(0, 0, c.width, c.height);
      g.drawImage(img, 0, 0, c.width, c.height);
      URL.revokeObjectURL(url);
      c.toBlob((b) => (b ? resolve(b) : reject(new Error("PNG encoding failed"))), "image/png");
    };
    img.onerror = () => { URL.revokeObjectURL(url); reject(new Error("could not rasterise the SVG")); };
    img.src = url;
  });
}

export function canvasToPng(canvas) {
  return new Promise((resolve, reject) =>
    canvas.toBlob((b) => (b ? resolve(b) : reject(new Error("PNG encoding failed"))), "image/png"));
}
