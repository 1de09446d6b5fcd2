// Model view: every layer x head as a small thumbnail, drawn on <canvas> from one binary request
// (block-averaged to 48 x 48, float16). Each thumbnail is a link that opens that head.
import { h, part, replace } from "../dom.js";
import { subMatrix, visibleTokens } from "../matrix.js";
import { LUT, exactString } from "../scale.js";

export const title = "Model view";
export const help = "Every head of every layer at once: rows are layers, columns are heads, each thumbnail is that " +
  "head's query × key matrix (queries down, keys across). Each thumbnail is coloured to its own largest weight. " +
  "Click one (or focus it and press Enter) to open it in the head view.";

export const RESOLUTION = 48;

export function requests() {
  return [{ endpoint: "attention", include: ["attention"], resolution: RESOLUTION, dtype: "float16" }];
}

/** Paint matrix rows (number[][]) into a canvas, colour scaled to the matrix maximum. */
function paint(canvas, rows) {
  const n = rows.length;
  canvas.width = n;
  canvas.height = n;
  const g = canvas.getContext("2d");
  const img = g.createImageData(n, n);
  let max = 0;
  for (const r of rows) for (const v of r) if (v > max) max = v;
  const k = max > 0 ? 255 / max : 0;
  let o = 0;
  for (const r of rows) {
    for (const v of r) {
      const c = Math.min(255, Math.max(0, Math.round(v * k))) * 3;
      img.data[o] = LUT[c]; img.data[o + 1] = LUT[c + 1]; img.data[o + 2] = LUT[c + 2]; img.data[o + 3] = 255;
      o += 4;
    }
  }
  g.putImageData(img, 0, 0);
  return max;
}

export function render(container, { meta, results: [ans] }, st, ctx) {
  const L = ans.layers.length, H = ans.heads.length, T = meta.tokens.length;
  const blocked = Boolean(ans.blocks);
  const renorm = !blocked && st.hide_special && meta.special.some(Boolean);
  const idx = blocked ? null : visibleTokens(meta, st.hide_special);

  const note = part(container, "note", "p", { class: "note" });
  note.textContent = (blocked
    ? `${T} tokens: each thumbnail cell is the mean weight of a block of about ${(T / ans.blocks.length).toFixed(1)} × ` +
      `${(T / ans.blocks.length).toFixed(1)} tokens (${RESOLUTION} × ${RESOLUTION} blocks).` +
      (st.hide_special ? " Special tokens cannot be hidden at this scale; open a head to hide them." : "")
    : renorm ? "[CLS] and [SEP] are hidden and each row renormalised over the remaining keys."
      : `${T} tokens: every weight shown (one pixel per query/key pair).`) + " Colours are scaled per thumbnail.";

  const grid = part(container, "grid", "div", { class: "thumb-grid", role: "group", "aria-label": `${L} layers by ${H} heads` });
  grid.style.setProperty("--heads", H);
  const items = [h("span", { class: "corner", "aria-hidden": "true", text: "layer \\ head" }),
    ...ans.heads.map((hd) => h("span", { class: "col-head", "aria-hidden": "true", text: `H${hd}` }))];
  const canvases = [];
  ans.layers.forEach((l, li) => {
    items.push(h("span", { class: "row-head", "aria-hidden": "true", text: `L${l}` }));
    ans.heads.forEach((hd, hi) => {
      const m = ans.attention.sub(li, hi);
      const rows = blocked ? Array.from({ length: m.shape[0] }, (_, i) => Array.from(m.row(i)))
        : subMatrix(m, idx, renorm).z;
      const canvas = h("canvas", { class: "thumb-canvas", "aria-hidden": "true" });
      const max = paint(canvas, rows);
      canvases.push({ canvas, l, hd });
      const current = l === st.layer && hd === st.head;
      items.push(h("a", {
        class: "thumb" + (current ? " current" : ""), href: ctx.href({ view: "head", layer: l, head: hd }),
        "data-layer": l, "data-head": hd, "data-max": exactString(max),
        "aria-label": `Layer ${l}, head ${hd}: open in the head view`, "aria-current": current ? "true" : null,
        title: `Layer ${l} · head ${hd} (largest ${blocked ? "block mean" : "weight"} ${max.toFixed(3)})`,
        onclick: (e) => {
          if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
          e.preventDefault();
          ctx.go({ view: "head", layer: l, head: hd });
        },
      }, canvas));
    });
  });
  replace(grid, items);
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;

  const composite = () => {                      // one PNG of the whole grid, with labels
    const cell = 96, gap = 6, left = 40, top = 28;
    const c = document.createElement("canvas");
    c.width = left + H * (cell + gap);
    c.height = top + L * (cell + gap);
    const g = c.getContext("2d");
    g.fillStyle = "#fff";
    g.fillRect(0, 0, c.width, c.height);
    g.fillStyle = "#222";
    g.font = "14px sans-serif";
    g.imageSmoothingEnabled = false;
    ans.heads.forEach((hd, hi) => g.fillText(`H${hd}`, left + hi * (cell + gap) + cell / 2 - 10, 18));
    ans.layers.forEach((l, li) => g.fillText(`L${l}`, 6, top + li * (cell + gap) + cell / 2 + 5));
    canvases.forEach(({ canvas }, k) => {
      const li = Math.floor(k / H), hi = k % H;
      g.drawImage(canvas, left + hi * (cell + gap), top + li * (cell + gap), cell, cell);
    });
    return c;
  };
  return {
    canvas: composite,
    name: `attnscope-${st.model}-model-view`,
    csv: () => {
      const rows = [["layer", "head", "query_block", "key_block", "query_tokens", "key_tokens", "mean_weight"]];
      const spans = ans.blocks ?? meta.tokens.map((_, i) => [i, i + 1]);
      ans.layers.forEach((l, li) => ans.heads.forEach((hd, hi) => {
        const m = ans.attention.sub(li, hi);
        for (let a = 0; a < m.shape[0]; a++) for (let b = 0; b < m.shape[1]; b++) {
          rows.push([l, hd, a, b, spans[a].join("-"), spans[b].join("-"), Number(exactString(m.at(a, b)))]);
        }
      }));
      return rows;
    },
    json: () => ({
      model: st.model, text: st.text, resolution: RESOLUTION, dtype: "float16", blocks: ans.blocks ?? null,
      layers: ans.layers, heads: ans.heads, tokens: meta.tokens, attention: ans.attention.toArray(),
    }),
  };
}
