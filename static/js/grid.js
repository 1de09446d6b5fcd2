// A step's table as data, drawn twice from the same description: as the page's <table> (every number, in a
// scroll box) and as a standalone SVG for the PNG / SVG exports. Colours and numbers are decided once, by
// the view that builds the grid (from scale.js), so the picture on a slide is the table on the screen.
//
// grid = {corner, cols: [{label, title}], rows: [{label, title, cls}], cells: [[{text, bg, fg, cls, attrs}]],
//         sum: [text] | null (a last "Σ" column), label: accessible name}
import { h, svg } from "./dom.js";
import { INK, MASKED_STROKE, MUTED_INK, PAPER, SOFT_INK, SUM_CELL } from "./scale.js";

/** The page's table: sticky column and row headers, one focusable cell at a time (arrow keys move). */
export function gridTable(grid, cls) {
  const head = h("tr", {}, h("th", { scope: "col", class: "corner", text: grid.corner }),
    grid.cols.map((c) => h("th", { scope: "col", title: c.title }, h("span", { class: "tok", text: c.label }))),
    grid.sum && h("th", { scope: "col", text: "Σ" }));
  let first = true;
  const body = grid.rows.map((r, a) => h("tr", { class: r.cls || null },
    h("th", { scope: "row", title: r.title }, h("span", { class: r.tok ? "tok" : null, text: r.label })),
    grid.cells[a].map((c) => {
      const td = h("td", { class: "num" + (c.cls ? " " + c.cls : ""), style: `background:${c.bg};color:${c.fg}`,
        tabindex: first ? "0" : "-1", ...c.attrs }, c.text);
      first = false;
      return td;
    }),
    grid.sum && h("td", { class: "num sum", text: grid.sum[a] })));
  return h("table", { class: `stage-table ${cls}`, "aria-label": grid.label },
    h("thead", {}, head), h("tbody", {}, body));
}

/** Arrow keys move the focus between a table's cells (the one tab stop moves with it). True when handled. */
export function moveInTable(e) {
  const td = e.target.closest?.("td[data-value]");
  const step = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] }[e.key];
  if (!td || !step) return false;
  const table = td.closest("table");
  const row = table.rows[td.parentElement.rowIndex + step[0]];
  const next = row?.cells[td.cellIndex + step[1]];
  if (!next || !next.matches("td[data-value]")) return true;   // at the edge: stay (and keep the key)
  td.tabIndex = -1;
  next.tabIndex = 0;
  next.focus();
  return true;
}

// ---- SVG ----------------------------------------------------------------------------------------
const FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Arial, sans-serif";
const MONO = "ui-monospace, 'SFMono-Regular', Menlo, Consolas, monospace";
const CHAR = 7.3;        // px per character of 12 px monospace
const ROW = 22;

function cut(s, chars) {
  return s.length > chars ? s.slice(0, Math.max(1, chars - 1)) + "…" : s;
}

function wrap(text, chars) {
  const lines = [];
  let line = "";
  for (const word of String(text).split(/\s+/)) {
    if (line && line.length + 1 + word.length > chars) {
      lines.push(line);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  if (line) lines.push(line);
  return lines;
}

/** The grid as a standalone SVG (styles as attributes), with the step's heading and sentence above it. */
export function gridSvg(grid, heading, sentence) {
  const m = 16;
  const cellChars = Math.max(4, ...grid.cells.flat().map((c) => String(c.text).length), ...(grid.sum || []).map((s) => s.length));
  const cw = Math.max(44, Math.ceil(cellChars * CHAR + 12));
  const colChars = Math.max(4, Math.floor((cw - 8) / CHAR));
  const rowChars = Math.min(18, Math.max(3, ...grid.rows.map((r) => r.label.length)));
  const rw = Math.ceil(rowChars * CHAR + 14);
  const ncol = grid.cols.length + (grid.sum ? 1 : 0);
  const width = Math.max(m * 2 + rw + ncol * cw, 420);
  const lines = wrap(sentence, Math.floor((width - 2 * m) / 7.6));   // 13 px sans: ~7 px a character, some wider
  const top = m + 22 + lines.length * 17 + 10;
  const height = top + ROW * (grid.rows.length + 1) + m;
  const text = (x, y, s, attrs = {}) => svg("text", { x, y, "font-family": FONT, "font-size": 12, fill: INK, ...attrs }, s);
  const parts = [svg("rect", { x: 0, y: 0, width, height, fill: PAPER }),
    text(m, m + 14, heading, { "font-size": 16, "font-weight": "bold" }),
    lines.map((l, k) => text(m, m + 36 + k * 17, l, { "font-size": 13, fill: SOFT_INK })),
    text(m + rw - 6, top + 15, cut(grid.corner, rowChars), { "text-anchor": "end", fill: MUTED_INK, "font-size": 11 })];
  grid.cols.forEach((c, j) => parts.push(text(m + rw + j * cw + cw / 2, top + 15, cut(c.label, colChars),
    { "text-anchor": "middle", "font-family": MONO, "font-weight": "bold" })));
  if (grid.sum) parts.push(text(m + rw + grid.cols.length * cw + cw / 2, top + 15, "Σ", { "text-anchor": "middle", "font-weight": "bold" }));
  grid.rows.forEach((r, a) => {
    const y = top + ROW * (a + 1);
    parts.push(text(m + rw - 6, y + 15, cut(r.label, rowChars), { "text-anchor": "end", "font-family": MONO }));
    grid.cells[a].forEach((c, j) => {
      const x = m + rw + j * cw;
      parts.push(svg("rect", { x: x + 0.5, y: y + 0.5, width: cw - 1, height: ROW - 1, fill: c.bg }));
      if (c.cls?.includes("masked-cell")) {
        parts.push(svg("line", { x1: x + 3, y1: y + ROW - 3, x2: x + cw - 3, y2: y + 3, stroke: MASKED_STROKE, "stroke-width": 1 }));
      }
      parts.push(text(x + cw - 6, y + 15, c.text, { "text-anchor": "end", "font-family": MONO, fill: c.fg }));
    });
    if (grid.sum) {
      const x = m + rw + grid.cols.length * cw;
      parts.push(svg("rect", { x: x + 0.5, y: y + 0.5, width: cw - 1, height: ROW - 1, fill: SUM_CELL }),
        text(x + cw - 6, y + 15, grid.sum[a], { "text-anchor": "end", "font-family": MONO }));
    }
  });
  return svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": heading }, parts);
}

