// Model view: every layer x head as a small thumbnail, drawn on <canvas> from one binary request
// (block-averaged to 64 x 64, float16). Hover a thumbnail for the head, the tokens of the block under the
// mouse and its value; each thumbnail is a link that opens that head.
import { h, part, replace, tokenLabel } from "../dom.js";
import { localWindow, maskRule, ownMask, subMatrix, visibleTokens } from "../matrix.js";
import { colourRange, exactString, fmt, fmtExact, FRAME_LINE, LABEL_INK, LUT, lutIndex, MASKED_RGB, PAPER } from "../scale.js";
import { can } from "../boot.js";
import { toggledHead } from "../state.js";

export const title = "Model view";
export const orientation = "Each picture is one head: rows, the token looking; columns, the tokens it looks at; " +
  "bright, a strong look. Click one to open it; Shift+click to knock it out.";
export const help = "Every head of every layer at once: rows are layers, columns are heads, each thumbnail is that " +
  "head's query × key matrix (queries down, keys across). Hover one for the tokens and the value under the mouse; " +
  "click it (or focus it and press Enter) to open it in the head view. Shift+click (or K) knocks a head out: every " +
  "view then shows the model without it, and the next-token panel what changed.";

// Each head's numbers under its thumbnail (issue 48), those the answers hold: from the run's summary (the API's
// statistics, analysis/statistics.py) its attention-sink mass (the average weight on the first token), local-window
// mass and value-weighted first-token mass (how much of what the head writes comes from that token); and, once the
// retrieval box is ticked, its retrieval score from POST /api/retrieval's needle probe. [key, label, what it is]
const GRID_NUMBERS = [["first_token_mass", "sink", "first-token (sink) mass"],
  ["local_mass", "local", "local-window mass"],
  ["value_weighted_first_token_mass", "value-weighted sink", "value-weighted first-token mass"],
  ["retrieval", "retrieval", "retrieval score (needle probe on the bundled haystack, every head kept)"]];
// The probe the grid asks for: the model's own, on the bundled haystack and with every head kept (none of the run's
// text, masks or knocked-out heads, which the retrieval endpoint does not take), one draw of control heads.
const PROBE = { text: undefined, text_pair: undefined, decoder_text: undefined, causal: undefined,
  mask_tokens: undefined, ablate: undefined, ablation: undefined, controls: 1, soft: true };
const probeable = (info) => Boolean(info?.predictions) && can(info, "retrieval");

export const RESOLUTION = 64;    // 2048 tokens: blocks of 32 (the model-view request of docs/long-inputs.md)

export function requests(st, info) {
  return [{ endpoint: "attention", include: ["attention"], resolution: RESOLUTION, dtype: "float16" },
    ...(st?.retrieval && probeable(info) ? [{ endpoint: "retrieval", ...PROBE }] : [])];
}

/** Paint rows (number[][], null = masked) into a canvas on a colour range; masked cells stay white. */
function paint(canvas, rows, range) {
  const n = rows.length, w = rows[0]?.length ?? 0;
  canvas.width = w;
  canvas.height = n;
  const g = canvas.getContext("2d");
  const img = g.createImageData(w, n);
  let o = 0;
  for (const r of rows) {
    for (const v of r) {
      if (v === null) {
        img.data.set(MASKED_RGB, o);
      } else {
        const c = lutIndex(v, range) * 3;
        img.data[o] = LUT[c]; img.data[o + 1] = LUT[c + 1]; img.data[o + 2] = LUT[c + 2];
      }
      img.data[o + 3] = 255;
      o += 4;
    }
  }
  g.putImageData(img, 0, 0);
}

/**
 * The cells of every thumbnail, as shown: at block resolution each cell is the share of its query block's
 * attention that lands on its key block (block mean x key-block width: rows sum to 1, so 0–1 like a weight);
 * a block every cell of which is masked is null. Returns {cells(m) -> rows, spans, label}.
 */
function cellsOf(ans, meta, st, info) {
  // the mask of layer l (a local layer's window included), one per window width: hidden(l)(i, j)
  const rules = new Map();
  const hiddenIn = (l) => {
    const w = localWindow(info, l);
    if (!rules.has(w)) rules.set(w, maskRule(meta, info, l));
    return rules.get(w);
  };
  if (ans.blocks) {
    const spans = ans.blocks, deadBy = new Map();
    const deadIn = (l) => {
      const w = localWindow(info, l), hidden = hiddenIn(l);
      if (!deadBy.has(w)) deadBy.set(w, spans.map(([q0, q1]) => spans.map(([k0, k1]) => {
        for (let i = q0; i < q1; i++) for (let j = k0; j < k1; j++) if (!hidden(i, j)) return false;
        return true;
      })));
      return deadBy.get(w);
    };
    return {
      spans, rows: spans, cols: spans, value: "share of the block's attention",
      cells: (m, l) => { const dead = deadIn(l); return spans.map((_, a) => spans.map(([k0, k1], b) => (dead[a][b] ? null : m.at(a, b) * (k1 - k0)))); },
      mean: (m, a, b) => m.at(a, b),
    };
  }
  const idx = visibleTokens(meta, st.hide_special);
  const renorm = st.hide_special && meta.special.some(Boolean);
  const spans = idx.map((i) => [i, i + 1]);
  return {
    spans, rows: spans, cols: spans, value: renorm ? "weight (renormalised)" : "weight", renorm, idx,
    cells: (m, l) => { const hidden = hiddenIn(l); return subMatrix(m, idx, idx, renorm ? idx : null).z.map((r, a) => r.map((v, b) => (hidden(idx[a], idx[b]) ? null : v))); },
    mean: null,
  };
}

function spanText(meta, [a, b]) {
  const toks = meta.tokens.slice(a, b).map(tokenLabel);
  const words = toks.length > 4 ? [...toks.slice(0, 2), "…", ...toks.slice(-1)] : toks;
  return `${b - a > 1 ? `tokens ${a}–${b - 1}` : `token ${a}`} “${words.join(" ")}”`;
}

/** "Scroll sideways for more heads": shown while the grid is wider than its scroller. */
function showCue(scroller, cue) {
  cue.hidden = scroller.scrollWidth <= scroller.clientWidth + 2;
}

/** The window was resized while this view shows (main.js): the grid may fit now, or no longer. */
export function onResize(container) {
  const scroller = container.querySelector(":scope > [data-part=scroller]");
  const cue = container.querySelector(":scope > [data-part=cue]");
  if (scroller && cue) showCue(scroller, cue);
}

export function render(container, { meta, results: [ans, probe] }, st, ctx) {
  const L = ans.layers.length, H = ans.heads.length, T = meta.tokens.length;
  const blocked = Boolean(ans.blocks);
  const shape = cellsOf(ans, meta, st, ctx.info);
  const scores = probe && !probe.error ? probe.scores : null;          // [layer][head], all of them
  const number = (k, l, hd) => (k === "retrieval" ? scores?.[l]?.[hd] : meta.summary?.[k]?.[l]?.[hd]);

  const controls = part(container, "controls", "div", { class: "view-controls" });
  replace(controls, probeable(ctx.info) && h("label", { class: "check" },
    h("input", { type: "checkbox", id: "grid-retrieval", checked: st.retrieval,
      onchange: (e) => ctx.go({ retrieval: e.target.checked }) }),
    " Retrieval scores under each head (runs the needle-in-a-haystack probe on the bundled haystack)"),
  probe?.error && h("span", { class: "hint", "data-part": "probe-error", text: ` The probe was refused: ${probe.error.message}` }));

  const note = part(container, "note", "p", { class: "note" });
  const width = blocked ? T / ans.blocks.length : 1;
  note.textContent = (blocked
    ? `${T} tokens: each thumbnail cell is a block of about ${width.toFixed(1)} × ${width.toFixed(1)} tokens ` +
      `(${RESOLUTION} × ${RESOLUTION} blocks), coloured by the share of the query block's attention that goes to ` +
      "the key block (rows sum to 1, like weights)." +
      (st.hide_special ? " Special tokens cannot be hidden at this scale; open a head to hide them." : "")
    : shape.renorm ? "[CLS] and [SEP] are hidden and each row renormalised over the remaining keys."
      : `${T} tokens: every weight shown (one pixel per query/key pair)${ownMask(meta, ctx.info) ? "" : " of the what-if run"}.`) +
    (st.scale === "head" ? " Colours are stretched to each thumbnail's own maximum (hover for it)."
      : " Colours are on the fixed 0–1 scale in every thumbnail.") +
    (meta.causal || meta.mask_tokens.length ? " White: masked (weight exactly 0)." : "") +
    ((ctx.info.local_layers || []).length ? ` Rows marked "local" are sliding-window layers: each token sees only ` +
      `its last ${ctx.info.sliding_window} tokens, and the keys further back are masked like future ones.` : "");

  const scroller = part(container, "scroller", "div", { class: "thumb-scroll" });
  const cue = part(container, "cue", "p", { class: "scroll-cue hint", "aria-hidden": "true", text: "Scroll sideways for more heads →" });
  const grid = part(scroller, "grid", "div", { class: "thumb-grid", role: "group", "aria-label": `${L} layers by ${H} heads` });
  const tip = part(container, "tip", "div", { class: "tip", role: "tooltip", hidden: true });
  grid.style.setProperty("--heads", H);
  // grouped-query attention: heads that read the same keys and values share a group (and a shade)
  const perGroup = ctx.info.heads / ctx.info.kv_heads, group = (hd) => Math.floor(hd / perGroup);
  const gqa = ctx.info.kv_heads < ctx.info.heads;
  const items = [h("span", { class: "corner", "aria-hidden": "true", text: "layer \\ head" }),
    ...ans.heads.map((hd) => h("span", {
      class: `col-head${gqa ? ` kv-group kv-${group(hd) % 2}` : ""}`, "aria-hidden": "true",
      title: gqa ? `head ${hd} reads key/value group ${group(hd)} (shared with heads ${group(hd) * perGroup}–${(group(hd) + 1) * perGroup - 1})` : null,
      text: gqa ? `H${hd} · kv${group(hd)}` : `H${hd}`,
    }))];
  const knocked = new Set(st.ablate);
  const canvases = [];
  ans.layers.forEach((l, li) => {
    const w = localWindow(ctx.info, l);                     // a local layer: its rows end in its window's band
    items.push(h("span", { class: "row-head" + (w ? " local" : ""), "aria-hidden": "true", "data-window": w,
      title: w ? `layer ${l} is local: each token sees only its last ${w} tokens (sliding window)` : null,
      text: w ? `L${l} · local` : `L${l}` }));
    ans.heads.forEach((hd, hi) => {
      const m = ans.attention.sub(li, hi);
      const rows = shape.cells(m, l);
      let max = 0;
      for (const r of rows) for (const v of r) if (v !== null && v > max) max = v;
      const range = colourRange(st, max);
      const canvas = h("canvas", { class: "thumb-canvas", "aria-hidden": "true" });
      paint(canvas, rows, range);
      canvases.push({ canvas, l, hd, li, hi, rows, max });
      const current = l === st.layer && hd === st.head;
      const out = knocked.has(`${l}.${hd}`);
      const nums = GRID_NUMBERS.filter(([k]) => number(k, l, hd) !== undefined && number(k, l, hd) !== null);
      items.push(h("div", { class: "thumb-cell" }, h("a", {
        class: "thumb" + (current ? " current" : "") + (out ? " ablated" : ""),
        href: ctx.href({ view: "head", layer: l, head: hd }), title: out ? "knocked out (shift+click or K restores it)" : null,
        "data-layer": l, "data-head": hd, "data-max": exactString(max), "data-k": canvases.length - 1,
        "aria-label": `Layer ${l}, head ${hd}: open in the head view`, "aria-current": current ? "true" : null,
        onclick: (e) => {
          if (e.button === 0 && e.shiftKey) {                 // shift+click: knock the head out (or back in)
            e.preventDefault();
            ctx.go({ ablate: toggledHead(st.ablate, l, hd) });
            return;
          }
          if (e.button !== 0 || e.metaKey || e.ctrlKey || e.altKey) return;
          e.preventDefault();
          ctx.go({ view: "head", layer: l, head: hd });
        },
        onkeydown: (e) => {
          if (e.key !== "k" && e.key !== "K") return;          // K: knock the focused head out (or back in)
          e.preventDefault();
          ctx.go({ ablate: toggledHead(st.ablate, l, hd) });
        },
      }, canvas), nums.length ? h("span", { class: "thumb-nums", "data-layer": l, "data-head": hd,
        title: nums.map(([k, , what]) => `${what}: ${fmtExact(number(k, l, hd))}`).join("; "),
        text: nums.map(([k, name]) => `${name} ${fmt(number(k, l, hd), 2)}`).join(" · "),
        ...Object.fromEntries(nums.map(([k]) => [`data-${k.replaceAll("_", "-")}`, exactString(number(k, l, hd))])) })
        : null));
    });
  });
  replace(grid, items);

  // Hover: which head, which tokens, what value (one listener for the grid).
  grid.onmousemove = (e) => {
    const a = e.target.closest?.("a.thumb");
    if (!a) { tip.hidden = true; return; }
    const c = canvases[Number(a.dataset.k)], r = c.canvas.getBoundingClientRect();
    const nq = c.rows.length, nk = c.rows[0].length;
    const qa = Math.min(nq - 1, Math.floor(((e.clientY - r.top) / r.height) * nq));
    const kb = Math.min(nk - 1, Math.floor(((e.clientX - r.left) / r.width) * nk));
    if (qa < 0 || kb < 0) return;
    const v = c.rows[qa][kb];
    const m = ans.attention.sub(c.li, c.hi);
    const value = v === null ? "masked (weight exactly 0)"
      : `${shape.value} ${fmtExact(v)}` + (shape.mean ? ` (mean weight ${fmt(shape.mean(m, qa, kb), 4)})` : "");
    const lines = [`layer ${c.l} · head ${c.hd}` + (st.scale === "head" ? ` · scaled to its maximum ${fmt(c.max, 3)}` : ""),
      `queries: ${spanText(meta, shape.rows[qa])}`, `keys: ${spanText(meta, shape.cols[kb])}`, value];
    replace(tip, lines.map((t) => h("div", { text: t })));
    Object.assign(tip.dataset, { layer: c.l, head: c.hd, query: shape.rows[qa][0], key: shape.cols[kb][0] });
    tip.hidden = false;
    const box = container.getBoundingClientRect();
    const x = e.clientX - box.left, y = e.clientY - box.top;
    tip.style.left = `${Math.max(0, x + 16 + tip.offsetWidth > box.width ? x - tip.offsetWidth - 16 : x + 16)}px`;
    tip.style.top = `${y + 16}px`;
  };
  grid.onmouseleave = () => { tip.hidden = true; };
  showCue(scroller, cue);
  scroller.onscroll = () => { if (scroller.scrollLeft + scroller.clientWidth >= scroller.scrollWidth - 4) cue.hidden = true; };
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;

  const composite = () => {                      // one PNG of the whole grid, with labels, as on screen
    const cell = 96, gap = 6, left = 40, top = 28;
    const c = document.createElement("canvas");
    c.width = left + H * (cell + gap);
    c.height = top + L * (cell + gap);
    const g = c.getContext("2d");
    g.fillStyle = PAPER;
    g.fillRect(0, 0, c.width, c.height);
    g.fillStyle = LABEL_INK;
    g.font = "14px sans-serif";
    g.imageSmoothingEnabled = false;
    ans.heads.forEach((hd, hi) => g.fillText(`H${hd}`, left + hi * (cell + gap) + cell / 2 - 10, 18));
    ans.layers.forEach((l, li) => g.fillText(`L${l}`, 6, top + li * (cell + gap) + cell / 2 + 5));
    canvases.forEach(({ canvas }, k) => {
      const li = Math.floor(k / H), hi = k % H;
      g.strokeStyle = FRAME_LINE;
      g.strokeRect(left + hi * (cell + gap) - 0.5, top + li * (cell + gap) - 0.5, cell + 1, cell + 1);
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
      colour_scale: st.scale === "head" ? "per thumbnail, to its maximum" : "fixed 0-1",
      layers: ans.layers, heads: ans.heads, tokens: meta.tokens, attention: ans.attention.toArray(),
    }),
  };
}
