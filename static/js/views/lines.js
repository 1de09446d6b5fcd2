// Line view (BertViz style): queries on the left, keys on the right, a line per weight whose
// opacity is the weight, one colour per head. Hover or focus a token to see only its lines. A long text
// (more than TOP_K_FROM tokens) fetches only each query's TOP_K heaviest keys (the server's top_k), not T x T.
import { h, part, replace, rove, svg, tokenLabel } from "../dom.js";
import { dividerAt, keysOf, ownMask, pairView, subMatrix, visibleTokens } from "../matrix.js";
import { CAPTION_INK, DARK_TEXT, exactString, fmt, headColor, PAIR_DIVIDER, PAPER, SPECIAL_INK } from "../scale.js";

export const title = "Line view";
export const orientation = "Left: the token looking. Right: the tokens it looks at. A stronger line: a stronger look.";
export const help = "Each line joins a query (left) to a key (right); the stronger the weight, the more opaque the line. " +
  "Colours are heads. Hover or focus a token (Tab into the drawing, then the arrow keys) to show only its lines; " +
  "click it to pin it.";
export const needsMeta = true;

const LEVELS = 32;           // opacity levels for the overview (one <path> per head and level)
const MIN_WEIGHT = 1 / 64;   // lighter lines are invisible anyway: not drawn in the overview
const MAX_SEGMENTS = 6000;   // overview cap for long inputs (strongest lines kept)
export const TOP_K_FROM = 512;  // more tokens than this: only the top keys of each query are fetched and drawn
export const TOP_K = 8;

/** How many heads may be drawn at once for T tokens (keeps the transfer and the drawing light). */
export function maxHeads(T, H) {
  return Math.min(H, T <= 64 ? H : T <= 128 ? 6 : T <= 256 ? 3 : 2);
}

export function selectedHeads(st, T, H) {
  const limit = maxHeads(T, H);
  let heads = st.heads ?? (limit >= H ? [...Array(H).keys()] : [st.head]);
  heads = heads.filter((x) => x < H).slice(0, limit);
  return heads.length ? heads : [Math.min(st.head, H - 1)];
}

/** One request per head (float16): toggling a head fetches only that head; a long text asks for top_k. */
export function requests(st, info, meta) {
  const T = meta.tokens.length;
  return selectedHeads(st, T, info.heads).map((hd) => ({ endpoint: "attention", layers: [st.layer], heads: [hd],
    include: ["attention"], dtype: "float16", ...(T > TOP_K_FROM && !meta.stack ? { top_k: TOP_K } : {}) }));
}

/**
 * One head's lines between row positions a (queries) and column positions b (keys), weight w > 0:
 * {all: [[a, b, w], ...], ofQuery(a), ofKey(b) -> [[other position, w], ...]}. From the full matrix (z, rows x
 * cols as shown), or from the server's top-k keys of each query (topKeys, topWeights: Tensors [T][k]).
 */
function denseLines(z) {
  const all = [];
  z.forEach((row, a) => row.forEach((w, b) => { if (w > 0) all.push([a, b, w]); }));
  return {
    all,
    ofQuery: (a) => z[a].map((w, b) => [b, w]).filter(([, w]) => w > 0),
    ofKey: (b) => z.map((row, a) => [a, row[b]]).filter(([, w]) => w > 0),
  };
}

function topKLines(topKeys, topWeights, rows, cols, keep) {
  const T = topKeys.shape[0], k = topKeys.shape[1];
  const colPos = new Int32Array(T).fill(-1);
  cols.forEach((j, b) => { colPos[j] = b; });
  const all = [], byQuery = rows.map(() => []), byKey = cols.map(() => []);
  rows.forEach((i, a) => {
    for (let r = 0; r < k; r++) {
      const j = topKeys.at(i, r), w = topWeights.at(i, r), b = colPos[j];
      if (!(w > 0) || b < 0 || !keep(i, j)) continue;        // weight 0: a key the query cannot see
      all.push([a, b, w]);
      byQuery[a].push([b, w]);
      byKey[b].push([a, w]);
    }
  });
  return { all, ofQuery: (a) => byQuery[a], ofKey: (b) => byKey[b] };
}

function headPicker(el, st, T, H, heads, ctx) {
  const limit = maxHeads(T, H);
  const set = new Set(heads);
  const boxes = [...Array(H).keys()].map((hd) => {
    const on = set.has(hd);
    return h("label", { class: "head-check" },
      h("input", {
        type: "checkbox", checked: on, disabled: !on && set.size >= limit, "data-head": hd,
        onchange: (e) => {
          const next = e.target.checked ? [...set, hd] : [...set].filter((x) => x !== hd);
          ctx.go({ heads: next.sort((a, b) => a - b) });
        },
      }),
      h("span", { class: "swatch", style: `background:${headColor(hd)}`, "aria-hidden": "true" }),
      `head ${hd}`);
  });
  replace(el,
    h("fieldset", { class: "heads" }, h("legend", { text: `Heads of layer ${st.layer}` }), boxes,
      h("span", { class: "buttons" },
        limit >= H && h("button", { type: "button", class: "small", text: "All", onclick: () => ctx.go({ heads: null }) }),
        h("button", { type: "button", class: "small", text: "Only the current head", onclick: () => ctx.go({ heads: [st.head] }) }))),
    h("p", { class: "hint", text: limit < H
      ? `For ${T} tokens at most ${limit} heads are drawn at once, so the drawing stays light; untick one to pick another.`
      : "Lines lighter than 1/64 are not drawn in the overview (they would be invisible)." }));
}

export function render(container, { meta, results }, st, ctx) {
  const T = meta.tokens.length;
  const heads = results.map((r) => r.heads[0]);
  const keys = keysOf(meta);                         // the queries' own tokens, or (cross-attention) the encoder's
  const renorm = st.hide_special && keys.special.some(Boolean);
  const idx = visibleTokens(meta, st.hide_special), keyIdx = visibleTokens(keys, st.hide_special);
  const view = pairView(meta, idx, st.pairs, keyIdx);
  const { rows, cols } = view;                       // queries on the left, keys on the right
  const n = Math.max(rows.length, cols.length);
  const topK = results[0].top_keys ? results[0].top_keys.shape[3] : 0;    // 0: full matrices
  const mats = topK ? null : results.map((r) => subMatrix(r.attention.sub(0, 0), rows, cols, renorm ? keyIdx : null).z
    .map((row, a) => row.map((w, b) => (view.keep(rows[a], cols[b]) ? w : 0))));
  const headLines = topK                                                    // each head's lines
    ? results.map((r) => topKLines(r.top_keys.sub(0, 0), r.top_weights.sub(0, 0), rows, cols, view.keep))
    : mats.map(denseLines);

  headPicker(part(container, "picker", "div", { class: "picker" }), st, T, ctx.info.heads, heads, ctx);
  const note = part(container, "note", "p", { class: "note" });
  note.textContent = (meta.stack ? `${meta.stack.note} ` : "") + (topK
    ? `${T} tokens: each query's ${topK} heaviest keys are drawn, with the model's own weights${renorm ? " ([CLS] and [SEP] hidden, not renormalised)" : ""}.`
    : renorm ? "[CLS] and [SEP] are hidden; each query's remaining weights are renormalised to sum to 1."
    : ownMask(meta, ctx.info) ? "All tokens shown; line opacity is the model's own weight."
      : "All tokens shown; line opacity is the weight of the what-if run above (masked pairs have no line).") +
    ({ ab: " Sentence A's queries (left) → sentence B's keys (right).", ba: " Sentence B's queries (left) → sentence A's keys (right).",
      within: " Only lines within each sentence are drawn.", all: "" }[view.filter]) +
    (view.filter !== "ab" && view.filter !== "ba" && dividerAt(meta, idx) > 0 ? " The dashed line separates sentence A (above) from B." : "");
  const wrap = part(container, "wrap", "div", { class: "lines-layout" });
  const scroller = part(wrap, "scroller", "div", { class: "lines-scroll" });
  const aside = part(wrap, "focus", "div", { class: "side focus-list", "aria-live": "polite" });

  const rh = ctx.large ? 28 : 20, fs = ctx.large ? 18 : 13;
  const colW = ctx.large ? 190 : 150, pad = fs + 12;          // room above the first row for the captions
  const gap = Math.max(80, Math.min(240, (container.clientWidth || 800) - 2 * colW - 24));   // narrow screens: closer
  const W = colW * 2 + gap, H = n * rh + pad * 2;
  const xl = colW, xr = colW + gap;
  const y = (p) => pad + p * rh + rh / 2;
  const list = (side) => (side === "q" ? rows : cols);
  const tokensOf = (side) => (side === "q" ? meta : keys);

  // Overview: bucket every visible line by head and opacity level into one path each.
  let segs = [];
  headLines.forEach((ln, hi) => ln.all.forEach(([a, b, w]) => {   // a: row position, b: column position
    if (w >= MIN_WEIGHT) segs.push([hi, a, b, w]);
  }));
  const capped = segs.length > MAX_SEGMENTS;
  if (capped) segs = segs.sort((s1, s2) => s2[3] - s1[3]).slice(0, MAX_SEGMENTS);
  const buckets = new Map();
  for (const [hi, a, b, w] of segs) {
    const key = hi * (LEVELS + 1) + Math.min(LEVELS, Math.round(w * LEVELS));
    (buckets.get(key) ?? buckets.set(key, []).get(key)).push(`M${xl + 6} ${y(a)}L${xr - 6} ${y(b)}`);
  }
  const overview = svg("g", { class: "overview" }, [...buckets].map(([key, d]) => svg("path", {
    d: d.join(""), stroke: headColor(heads[Math.floor(key / (LEVELS + 1))]),
    "stroke-opacity": ((key % (LEVELS + 1)) / LEVELS).toFixed(3), "stroke-width": 2, fill: "none",
  })));
  const focusG = svg("g", { class: "focus-lines" });

  const tokenText = (p, side) => {
    const i = list(side)[p], toks = tokensOf(side);
    const masked = meta.mask_tokens.includes(i), pinned = (side === "q" || !meta.keys) && st.pin === i;
    return svg("text", {
      x: side === "q" ? xl - 4 : xr + 4, y: y(p), "text-anchor": side === "q" ? "end" : "start",
      "dominant-baseline": "central", "font-size": fs, "font-family": "system-ui, sans-serif",
      fill: toks.special[i] ? SPECIAL_INK : DARK_TEXT, "font-weight": pinned ? "bold" : "normal",
      "text-decoration": masked ? "line-through" : "none",
      class: "tok-label", tabindex: p === 0 ? "0" : "-1", role: "button", "data-side": side, "data-pos": p, "data-index": i,
      "aria-label": `${side === "q" ? "query" : "key"} ${i}: ${toks.tokens[i]}${masked ? " (masked)" : ""}`,
    }, tokenLabel(toks.tokens[i]));
  };
  const qLabels = rows.map((_, p) => tokenText(p, "q"));
  const kLabels = cols.map((_, p) => tokenText(p, "k"));
  const dividers = ["q", "k"].map((side) => {
    const d = dividerAt(meta, list(side));
    if (d <= 0) return null;
    const x0 = side === "q" ? 4 : xr + 4, x1 = side === "q" ? xl - 4 : W - 4;
    return svg("line", { x1: x0, x2: x1, y1: y(d) - rh / 2, y2: y(d) - rh / 2, stroke: PAIR_DIVIDER, "stroke-width": 2,
      "stroke-dasharray": "6 4", class: "divider" });
  });
  const drawing = svg("svg", {
    width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "lines-svg", role: "group",
    "aria-label": `Attention lines of layer ${st.layer}, heads ${heads.join(", ")}: ${rows.length} queries on the left, ${cols.length} keys on the right`,
  },
  svg("rect", { x: 0, y: 0, width: W, height: H, fill: PAPER }),
  svg("text", { x: xl - 4, y: pad - 8, "text-anchor": "end", "font-size": fs - 2, fill: CAPTION_INK, "font-family": "system-ui, sans-serif" }, meta.stack?.query ?? "query"),
  svg("text", { x: xr + 4, y: pad - 8, "font-size": fs - 2, fill: CAPTION_INK, "font-family": "system-ui, sans-serif" }, meta.stack?.key ?? "key"),
  overview, focusG, svg("g", {}, dividers), svg("g", {}, qLabels), svg("g", {}, kLabels));
  replace(scroller, drawing);

  // Focus: one token's lines, each with its exact weight as opacity, and the numbers beside.
  const focus = (side, p) => {
    [...qLabels, ...kLabels].forEach((t) => t.classList.remove("active"));
    if (p === null) {
      overview.setAttribute("opacity", "1");
      replace(focusG);
      replace(aside, h("p", { class: "hint", text: "Hover or focus a token to see its lines and their exact weights." }));
      aside.dataset.focus = "";
      return;
    }
    (side === "q" ? qLabels : kLabels)[p].classList.add("active");
    const other = side === "q" ? "k" : "q";
    overview.setAttribute("opacity", "0.12");
    const lines = [], items = [];
    headLines.forEach((ln, hi) => {
      const ws = side === "q" ? ln.ofQuery(p) : ln.ofKey(p);          // [other side's position, weight]
      ws.forEach(([o, w]) => {
        const [a, b] = side === "q" ? [p, o] : [o, p];
        lines.push(svg("line", {
          x1: xl + 6, y1: y(a), x2: xr - 6, y2: y(b), stroke: headColor(heads[hi]),
          "stroke-opacity": Math.min(1, w).toFixed(4), "stroke-width": 2.5,
        }));
      });
      const top = ws.map(([o, w]) => [w, o]).sort((u, v) => v[0] - u[0]).slice(0, 5);
      items.push(h("li", {},
        h("span", { class: "swatch", style: `background:${headColor(heads[hi])}`, "aria-hidden": "true" }),
        h("strong", { text: `head ${heads[hi]}: ` }),
        top.map(([w, o], r) => h("span", {
          class: "w", "data-head": heads[hi], "data-other": list(other)[o], "data-weight": exactString(w),
        }, r ? ", " : "", tokenLabel(tokensOf(other).tokens[list(other)[o]]), ` ${fmt(w, 3)}`))));
    });
    replace(focusG, lines);
    const i = list(side)[p];
    replace(aside,
      h("h3", {}, side === "q" ? `Query ${i} ` : `Key ${i} `, h("q", { class: "tok", text: tokenLabel(tokensOf(side).tokens[i]) })),
      h("p", { class: "hint", text: side === "q" ? "Where it looks: its strongest keys per head (weights sent as float16, 3 decimals; the head view has the exact float32):"
        : topK ? `Who looks at it: the strongest queries per head among those that have it in their top ${topK} (float16 weights, 3 decimals):`
          : "Who looks at it: the strongest queries per head (float16 weights, 3 decimals):" }),
      h("ul", { class: "focus-items" }, items));
    aside.dataset.focus = `${side}${i}`;
  };
  const pinPos = st.pin === null ? -1 : rows.indexOf(st.pin);
  const rest = () => focus("q", pinPos >= 0 ? pinPos : null);
  const onLabel = (e) => {
    const t = e.target.closest?.(".tok-label");
    return t ? [t.dataset.side, Number(t.dataset.pos), Number(t.dataset.index)] : null;
  };
  drawing.addEventListener("mouseover", (e) => { const l = onLabel(e); if (l) focus(l[0], l[1]); });
  drawing.addEventListener("mouseleave", rest);
  drawing.addEventListener("focusin", (e) => { const l = onLabel(e); if (l) focus(l[0], l[1]); });
  drawing.addEventListener("focusout", (e) => { if (!drawing.contains(e.relatedTarget)) rest(); });
  const pin = (l) => (l[0] === "q" || !meta.keys) && ctx.go({ pin: st.pin === l[2] ? null : l[2] });   // a query
  drawing.addEventListener("click", (e) => { const l = onLabel(e); if (l) pin(l); });
  drawing.addEventListener("keydown", (e) => {
    const l = onLabel(e);
    if (!l) return;
    if (rove(e, l[0] === "q" ? qLabels : kLabels, l[1], { ArrowDown: 1, ArrowUp: -1 })) return;
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      pin(l);
    }
  });
  rest();
  if (capped) note.textContent += ` Long input: the overview draws the ${MAX_SEGMENTS} strongest lines; hover a token for all of its lines.`;
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  container.dataset.heads = heads.join(",");
  container.dataset.topK = String(topK);
  container.dataset.attention = meta.stack?.which ?? "";

  return {
    svg: drawing,
    name: `attnscope-${st.model}-L${st.layer}-lines`,
    csv: () => [["layer", "head", "query_index", "query_token", "key_index", "key_token", "weight"],
      ...(topK ? headLines.flatMap((ln, hi) => ln.all.map(([a, b, w]) => [hi, a, b, w]))
        : mats.flatMap((z, hi) => z.flatMap((row, a) => row.map((w, b) => [hi, a, b, w]))))
        .map(([hi, a, b, w]) => [st.layer, heads[hi], rows[a], meta.tokens[rows[a]], cols[b], keys.tokens[cols[b]],
          Number(exactString(w))])],
    json: () => ({
      model: st.model, text: st.text, layer: st.layer, heads, dtype: "float16", renormalised: renorm && !topK,
      pairs: view.filter, query_indices: rows, key_indices: cols, tokens: meta.tokens,
      ...(meta.stack ? { decoder_text: st.decoder_text, attention_of: meta.stack.which, key_tokens: keys.tokens } : {}),
      ...(topK   // [query index, key index, weight] of each query's top keys, per head
        ? { top_k: topK, lines: headLines.map((ln) => ln.all.map(([a, b, w]) => [rows[a], cols[b], Number(exactString(w))])) }
        : { attention: mats.map((z) => z.map((r) => r.map((w) => Number(exactString(w))))) }),
    }),
  };
}
