// Steps view: one head, every step from the layer's input x to what the head adds to the residual stream,
// with every number the model computed. Vectors are drawn one column per token (all d numbers, scrolling,
// never cut); matrices are queries x keys. Click (or Enter on) a number for how it was computed; each step
// exports as PNG and SVG. In the classroom layout (st.present) one step fills the screen.
import { download, svgBlob, svgToPng } from "../export.js";
import { h, part, replace, tokenLabel } from "../dom.js";
import { gridSvg, gridTable, moveInTable } from "../grid.js";
import { explain } from "../readout.js";
import { LABELS } from "../encdec.js";
import { roleSentence } from "../roles.js";
import { STEP_TOKENS } from "../state.js";
import { color, divergingColor, exactString, fmt, fmtExact, isMinusInf, MASKED_COLOR, NEUTRAL_CELL, SOFT_INK, textOn, textOnDiverging } from "../scale.js";

export const title = "Causal mask & steps";
export const help = "How one head turns the layer's input into its output, step by step, with every number the model " +
  "computed: x, the query, key and value vectors, Q·Kᵀ, scaling, the mask, softmax, the weighted sum of values and " +
  "the head's share of the output projection. Click any number to see how it was computed.";

/** The steps, in order; st.step is 1-based (0: all of them). vectors: one column per token. */
export const STEPS = [
  { key: "x", kind: "vectors", short: "x" },
  { key: "q", kind: "vectors", short: "Q" },
  { key: "k", kind: "vectors", short: "K" },
  { key: "v", kind: "vectors", short: "V" },
  { key: "scores", kind: "matrix", short: "Q·Kᵀ" },
  { key: "scaled", kind: "matrix", short: "scaled" },
  { key: "mask", kind: "matrix", short: "mask" },
  { key: "masked", kind: "matrix", short: "masked" },
  { key: "probs", kind: "matrix", short: "softmax" },
  { key: "ctx", kind: "vectors", short: "weights·V" },
  { key: "contribution", kind: "vectors", short: "W_O" },
];

export function requests(st, info) {
  // Only the tokens shown travel: `limit` trims every matrix server-side (512 tokens would be 5 MB). An
  // encoder-decoder: the head of the attention chosen (encdec.js), cross-attention's Q from the decoder, K and V
  // from the encoder
  return [{ endpoint: "stages", layer: st.layer, head: st.head, limit: st.n,
    ...(info.kind === "encoder-decoder" ? { attention: st.attention } : {}) }];
}

/** What the model is, for the sentences: pre-norm or not, which norm, RoPE, q/k/v biases (the server's facts
 *  about its family: boot.architectures), and query heads sharing keys and values. */
function facts(info, st, boot) {
  const arch = boot.architectures[info.architecture];
  const group = info.heads / (info.kv_heads || info.heads);
  const first = Math.floor(st.head / group) * group;
  return { preNorm: arch.norm_first, norm: arch.norm === "rms" ? "RMSNorm" : "LayerNorm",
    rope: arch.position === "rope", bias: arch.qkv_bias, qkNorm: arch.qk_norm || null, outputNorms: !!arch.output_norms,
    rotary: arch.rotary_dim && arch.rotary_dim < arch.d_head ? arch.rotary_dim : null, shared: group > 1 ? [first, first + group - 1] : null,
    layer: st.layer, head: st.head, arch: info.architecture };
}

/** Heading and sentence of each step, in the model's own terms. */
function texts(step, ans, info, f, n) {
  const dh = ans.d_head, D = ans.x.shape[1];
  const s = Math.sqrt(dh);
  const anyMasked = ans.mask_tokens.length > 0;
  const shared = f.shared ? ` Query heads ${f.shared[0]}–${f.shared[1]} share these ${step.key === "k" ? "keys" : "values"} (grouped-query attention).` : "";
  const qkNorm = f.qkNorm === "head" ? ` Then QK-norm: the ${dh} numbers are divided by their root mean square and scaled by learned weights (RMSNorm over this head's vector).`
    : f.qkNorm === "full" ? " Then QK-norm: all heads' numbers together are divided by their root mean square and scaled by learned weights (RMSNorm over the whole projection); these are this head's part." : "";
  const rope = !f.rope ? "" : f.rotary
    ? ` Then its first ${f.rotary} numbers are rotated in pairs by the token's position (partial RoPE); the other ${dh - f.rotary} pass unchanged. These are the rotated numbers.`
    : " Then each pair of its numbers is rotated by the token's position (RoPE); these are the rotated numbers.";
  const shown = [f.qkNorm ? "after QK-norm" : "", f.rope ? "after RoPE" : ""].filter(Boolean).join(" and ");
  const after = shown ? `, ${shown}` : "";
  const partial = n < ans.tokens.length && !ans.causal;
  switch (step.key) {
    case "x": return [`Input x (d_model = ${D})`, (f.preNorm
      ? `Each token's vector as this layer's projections read it: the residual stream after the block's ${f.norm}.`
      : f.outputNorms ? "Each token's vector as this layer reads it: the residual stream itself, not normalised (this model normalises each sublayer's output instead)."
      : f.layer === 0 ? "Each token's vector as this layer reads it: token, position and segment embeddings, added and normalised."
        : "Each token's vector as this layer reads it: the output of the layer before.") + " One column per token."];
    case "q": if (ans.attention === "cross") return [`Queries Q = x W_Q (d_head = ${dh})`, `Each decoder token's query: its x (the decoder's hidden state as this cross-attention reads it) times this head's ${dh} columns of W_Q${f.bias ? ", plus a bias" : ""}. It says what the decoder token looks for in the source text.`];
      return [`Queries Q = x W_Q${after} (d_head = ${dh})`, `Each token's query: its x times this head's ${dh} columns of W_Q${f.bias ? ", plus a bias" : ""}. It says what the token looks for.${qkNorm}${rope}`];
    case "k": if (ans.attention === "cross") return ["Keys K = encoder output W_K", `Each source token's key: the encoder's output for it (its last layer, the same in every decoder layer) times this head's columns of W_K${f.bias ? ", plus a bias" : ""}. Cross-attention's keys and values come from the encoder, its queries from the decoder.`];
      return [`Keys K = x W_K${after}`, `Each token's key: its x times this head's columns of W_K${f.bias ? ", plus a bias" : ""}. It says what the token offers to the queries.${qkNorm}${rope}${shared}`];
    case "v": if (ans.attention === "cross") return ["Values V = encoder output W_V", "Each source token's value: the encoder's output for it times W_V, what it hands on to a decoder token that attends to it."];
      return [`Values V = x W_V`, `Each token's value: what it hands on when a query attends to it.${shared}`];
    case "scores": return ["Scores Q · Kᵀ", "Each query (row) is multiplied with every key (column), number by number and added up: a dot product. A bigger number means a better match."];
    case "scaled": return [`Scaled: × 1/√${dh}`, `Every score times ${fmt(ans.scale, 4)}${Math.abs(ans.scale * s - 1) > 1e-6 ? " (1/√d_head, with the model's temperature)" : ` = 1/√${dh}`}, so the numbers do not grow with the vector size and the softmax does not become too peaked.`];
    case "mask": if (ans.attention === "cross") return ["The mask", "All zeros: the whole source text is known before decoding starts, so every decoder token may look at every encoder token."];
      if (ans.attention) return ["The mask", (ans.causal ? "−∞ above the diagonal (a decoder token cannot see the tokens after it); elsewhere 0" : "0 everywhere (the encoder reads both ways)") + (f.arch === "t5" ? ", plus T5's relative position bias: a learned number per head for each bucket of distance, added to the scores (shown here)." : ".")];
      return ["The mask", ans.causal && anyMasked ? "−∞ above the diagonal (a token cannot see the tokens after it) and in the columns of the masked tokens; 0 elsewhere."
      : ans.causal ? "The causal mask: −∞ above the diagonal, where a token would see the tokens after it; 0 elsewhere."
        : anyMasked ? `−∞ in the columns of the masked token${ans.mask_tokens.length > 1 ? "s" : ""} (a token still sees itself); 0 elsewhere.`
          : "All zeros here: the causal mask is off and no token is masked, so every token sees every other."];
    case "masked": return ["Masked: scaled + mask", ans.causal || anyMasked ? "The mask added to the scaled scores: −∞ wherever a token may not look."
      : "The mask added to the scaled scores: it hides nothing here, so these are the scaled scores."];
    case "probs": return ["Softmax: the attention weights", "Each row becomes weights: exp of each number, divided by the row's sum of exp. They are positive and add up to 1; exp(−∞) = 0, so hidden keys get exactly 0." +
      (partial ? " Σ is the part of the row shown here." : "")];
    case "ctx": return ["Output: weights · V", `Each token's output is the weighted sum of the value vectors: out_i = Σ_j p_ij v_j. One column per token, ${dh} numbers.` +
      (partial ? " The sums run over every token of the text, also those not shown." : "")];
    case "contribution": return [`Through W_O: the head's contribution (d_model = ${D})`, `The output times this head's ${dh} columns of the output projection W_O: what this head adds to each token's vector. Every head's contribution, plus W_O's bias, is added to the residual stream${f.outputNorms ? " after their sum is normalised (the block's post-attention norm)" : f.preNorm ? "" : " (then normalised)"}.`];
  }
  return [step.key, ""];
}

/** The step's table as a grid (grid.js): rows and columns, each cell's text and colours. */
function stepGrid(step, ans, n, st, nk = n) {
  const tokens = ans.tokens, keyTokens = ans.keyTokens ?? tokens;   // an encoder-decoder's cross-attention: keys
  const mask = ans.mask;                                             // are the encoder's tokens (nk of them shown)
  const keySide = step.key === "k" || step.key === "v";
  const side = (list, count) => [...Array(count).keys()].map((i) => ({ label: tokenLabel(list[i]), title: `token ${i}: ${list[i]}` }));
  const cols = step.kind === "matrix" || keySide ? side(keyTokens, nk) : side(tokens, n);
  if (step.kind === "vectors") {
    n = cols.length;
    const t = ans[step.key], dims = t.shape[1];
    let absmax = 0;
    for (let i = 0; i < n; i++) for (let d = 0; d < dims; d++) absmax = Math.max(absmax, Math.abs(t.at(i, d)));
    const digits = absmax >= 100 ? 1 : absmax >= 10 ? 2 : 3;
    const rows = [...Array(dims).keys()].map((d) => ({ label: String(d), title: `number ${d}` }));
    const cells = rows.map((_, d) => cols.map((_, i) => {
      const v = t.at(i, d);
      return { text: fmt(v, digits), bg: divergingColor(v, absmax), fg: textOnDiverging(v, absmax),
        attrs: { "data-t": i, "data-d": d, "data-value": exactString(v), title: `token ${i}, number ${d}: ${fmtExact(v)}` } };
    }));
    return { corner: "d", cols, rows, cells, sum: null, label: `${step.short}: one column per token, ${dims} numbers each` };
  }
  const kind = step.key;
  const t = ans[kind];
  const diverging = kind !== "probs" && kind !== "mask";
  let absmax = 0;
  if (diverging) {
    for (let i = 0; i < n; i++) for (let j = 0; j < nk; j++) {
      const v = t.at(i, j);
      if (!isMinusInf(v)) absmax = Math.max(absmax, Math.abs(v));
    }
  }
  const digits = kind === "probs" ? 4 : kind === "scores" ? 2 : kind === "mask" ? 0 : 3;
  const rows = [...Array(n).keys()].map((i) => ({ label: tokenLabel(tokens[i]), title: `query ${i}: ${tokens[i]}`, tok: true,
    cls: st.pin === i ? "pinned" : null }));
  const sum = kind === "probs" ? [] : null;
  const cells = rows.map((_, i) => {
    let s = 0;
    const row = cols.map((_, j) => {
      const v = t.at(i, j);
      const inf = isMinusInf(v);
      const masked = inf || (kind !== "scores" && kind !== "scaled" && isMinusInf(mask.at(i, j)));   // drawn alike
      if (kind === "probs") s += v;
      const bg = masked ? MASKED_COLOR : kind === "mask" ? NEUTRAL_CELL : diverging ? divergingColor(v, absmax) : color(v);
      const fg = masked || kind === "mask" ? SOFT_INK : diverging ? textOnDiverging(v, absmax) : textOn(v);
      return { text: kind === "mask" && !inf ? (v === 0 ? "0" : fmt(v, 2)) : fmt(v, digits), bg, fg,   // T5's bias
        cls: (inf ? "neg-inf" : "") + (masked ? " masked-cell" : ""),
        attrs: { "data-q": i, "data-k": j, "data-value": exactString(v), title: `query ${i}, key ${j}: ${fmtExact(v)}` } };
    });
    sum?.push(fmt(s, 3));
    return row;
  });
  return { corner: "q \\ k", cols, rows, cells, sum, label: `${step.short}: queries (rows) by keys (columns)` };
}

// ---- the readout: one cell at a time, kept across renders (same step, same place) ------------------------
// memory.selected: the cell explained ({key, a, b}) or null; memory is the view's page memory (ctx.memory).

function showReadout(panel, ans, env, memory) {
  const selected = memory.selected;
  if (!selected || !ans[selected.key] || (STEPS.find((s) => s.key === selected.key).kind === "matrix"
    ? selected.a >= env.nq || selected.b >= env.n
    : selected.a >= (["k", "v"].includes(selected.key) ? env.n : env.nq) || selected.b >= ans[selected.key].shape[1])) {
    memory.selected = null;
    panel.hidden = true;
    return;
  }
  const { title: heading, body } = explain(selected.key, ans, selected.a, selected.b, env);
  const step = STEPS.findIndex((s) => s.key === selected.key) + 1;
  replace(panel,
    h("div", { class: "readout-head" },
      h("h3", { id: "readout-title", text: heading.join(" ") }),
      h("button", { type: "button", class: "small", "aria-label": "Close the readout", text: "✕ Close",
        onclick: () => closeReadout(panel.parentElement, memory) })),
    h("p", { class: "readout-where", text: `Step ${step} · ${STEPS[step - 1].short} · layer ${env.layer}, head ${env.head}` }),
    body);
  panel.hidden = false;
  panel.dataset.cell = `${selected.key}:${selected.a}:${selected.b}`;
}

function closeReadout(container, memory) {
  memory.selected = null;
  container.querySelector(":scope > [data-part=readout]").hidden = true;
  markSelected(container, memory.selected);
}

function markSelected(container, selected) {
  for (const el of container.querySelectorAll("td.selected")) el.classList.remove("selected");
  if (!selected) return;
  const s = STEPS.find((x) => x.key === selected.key);
  const sel = s.kind === "matrix" ? `[data-q="${selected.a}"][data-k="${selected.b}"]` : `[data-t="${selected.a}"][data-d="${selected.b}"]`;
  container.querySelector(`[data-stage="${selected.key}"] td${sel}`)?.classList.add("selected");
}

/** The page's keys, while this view shows (main.js): Escape closes an open readout before anything else, so the
 *  classroom layout's Escape leaves it only on the next press. */
export function onKey(e, container, st, ctx) {
  const panel = container.querySelector(":scope > [data-part=readout]");
  if (e.key === "Escape" && panel && !panel.hidden) {
    e.preventDefault();
    closeReadout(container, ctx.memory);
  }
}

// ---- export ---------------------------------------------------------------------------------------
function pngScale(svgEl) {
  const big = Math.max(Number(svgEl.getAttribute("width")), Number(svgEl.getAttribute("height")));
  return Math.max(0.25, Math.min(2, 16000 / big));   // canvases stop at 32767 px a side
}

async function exportStep(kind, name, svgEl) {
  try {
    download(`${name}.${kind}`, kind === "svg" ? svgBlob(svgEl) : await svgToPng(svgEl, pngScale(svgEl)));
  } catch (err) {
    console.warn(err);
  }
}

export function render(container, { results: [answer] }, st, ctx) {
  // an encoder-decoder's head: the queries' tokens (rows) and the keys' (columns; the encoder's for cross-attention)
  const ans = answer.attention ? { ...answer, tokens: answer.query_tokens, keyTokens: answer.key_tokens } : answer;
  const K = (ans.keyTokens ?? ans.tokens).length, nk = Math.min(K, st.n);
  const T = ans.tokens.length;
  const n = Math.min(T, st.n);
  const N = STEPS.length;
  // The classroom layout shows one step per screen, and so does a lesson's page; otherwise steps 1 to st.step.
  const single = st.present || (st.lesson !== null && st.step > 0);
  const cur = st.present && st.step === 0 ? 1 : st.step;
  const f = facts(ctx.info, st, ctx.boot);
  const env = { ...f, n: nk, T: K, nq: n, info: ctx.info };   // n, T: the keys (shown, all); nq: queries shown

  const controls = part(container, "controls", "div", { class: "view-controls stepper", role: "group", "aria-label": "Steps" });
  const stepBtn = (k, text, label) => h("button", {
    type: "button", class: "small", "aria-pressed": String(st.step === k), "data-step": k, text, title: label,
    onclick: () => ctx.go({ step: k }),
  });
  replace(controls,
    h("button", { type: "button", class: "small", disabled: st.step === 1, text: "◀ Previous step",
      onclick: () => ctx.go({ step: st.step <= 1 ? N : st.step - 1 }) }),
    STEPS.map((s, k) => stepBtn(k + 1, `${k + 1} ${s.short}`, `Step ${k + 1}: ${s.short}`)),
    stepBtn(0, "All steps", "Every step at once"),
    h("button", { type: "button", class: "small", disabled: st.step === 0 || st.step === N, text: "Next step ▶",
      onclick: () => ctx.go({ step: st.step === 0 ? 1 : st.step + 1 }) }),
    h("label", {}, "Tokens shown ", h("select", { id: "stage-n", onchange: (e) => ctx.go({ n: Number(e.target.value) }) },
      STEP_TOKENS.map((k) => h("option", { value: k, selected: k === st.n, text: k })))));

  const note = part(container, "note", "p", { class: "note" });
  const whatIf = ctx.info.kind === "encoder" && ans.causal
    ? `What-if: ${ctx.info.title} was trained without a causal mask; these are the numbers of a real run with the mask applied in every layer. `
    : ctx.info.kind === "decoder" && !ans.causal
      ? `What-if: ${ctx.info.title} is a causal model; here its mask is switched off so every token sees the future. ` : "";
  const role = roleSentence(ctx.info, st.layer, st.head, ctx.boot.roles);
  const knocked = (st.ablate || []).includes(`${st.layer}.${st.head}`)
    ? "This head is knocked out in this run: steps 10 and 11 show what it computed; the model used " +
      (st.ablation === "mean" ? "its average output" : "zeros") + " instead. " : "";
  const stack = ans.attention ? `${LABELS[ans.attention]} of the ${ans.attention === "encoder" ? "encoder" : "decoder"}'s ` : "";
  note.textContent = whatIf + knocked + `${stack}${stack ? "l" : "L"}ayer ${st.layer}, head ${st.head}${role ? `: ${role}` : ""}. ` +
    (ans.attention === "cross" ? "Queries come from the decoder's tokens (rows), keys and values from the encoder's output (columns); these numbers come from the NumPy reference, whose probabilities are the served graph's. " : "") + (n < T
    ? `Showing the first ${n} of ${T} tokens; the numbers come from the run on the whole input.`
    : `All ${T} tokens; d_head = ${ans.d_head}.`) + " Click a number to see how it was computed.";

  const grid = part(container, "grid", "div", { class: "stage-grid" });
  const name = (k) => `attnscope-${st.model}-L${st.layer}H${st.head}-step${k + 1}-${STEPS[k].key}`;
  const pictures = new Map();   // step index -> its SVG, built on first use
  const picture = (k) => {
    if (!pictures.has(k)) {
      const [heading, sentence] = texts(STEPS[k], ans, ctx.info, f, n);
      pictures.set(k, gridSvg(stepGrid(STEPS[k], ans, n, st, nk), `${k + 1}. ${heading} · ${ctx.info.title}, layer ${st.layer}, head ${st.head}`, sentence));
    }
    return pictures.get(k);
  };
  const shown = STEPS.map((_, k) => (cur === 0 ? true : single ? k + 1 === cur : k + 1 <= cur));
  replace(grid, STEPS.map((step, k) => {
    if (!shown[k]) return null;
    const [heading, sentence] = texts(step, ans, ctx.info, f, n);
    const exportBtn = (kind) => h("button", { type: "button", class: "small", text: kind.toUpperCase(),
      "aria-label": `Download step ${k + 1} as ${kind.toUpperCase()}`, "data-export": kind,
      onclick: () => exportStep(kind, name(k), picture(k)) });
    return h("section", {
      class: `stage ${step.kind}` + (cur === k + 1 ? " current" : ""), "data-stage": step.key, "aria-labelledby": `stage-${step.key}-h`,
    }, h("div", { class: "stage-head" }, h("h3", { id: `stage-${step.key}-h`, text: `${k + 1}. ${heading}` }),
      h("span", { class: "stage-export" }, exportBtn("png"), exportBtn("svg"))),
    h("p", { class: "explain", text: sentence }),
    h("div", { class: "table-scroll" + (step.kind === "vectors" ? " vector-scroll" : "") },
      gridTable(stepGrid(step, ans, n, st, nk), step.kind === "vectors" ? `vectors ${step.key}` : step.key)));
  }));
  const readout = part(container, "readout", "section", { class: "readout-panel", role: "region", "aria-labelledby": "readout-title", hidden: true });
  const open = (td) => {
    const section = td.closest("[data-stage]");
    const key = section.dataset.stage;
    ctx.memory.selected = STEPS.find((s) => s.key === key).kind === "matrix"
      ? { key, a: Number(td.dataset.q), b: Number(td.dataset.k) } : { key, a: Number(td.dataset.t), b: Number(td.dataset.d) };
    showReadout(readout, ans, env, ctx.memory);
    markSelected(container, ctx.memory.selected);
  };
  grid.onclick = (e) => {
    const td = e.target.closest("td[data-value]");
    if (td) open(td);
  };
  grid.onkeydown = (e) => {
    if (moveInTable(e)) e.preventDefault();
    else if ((e.key === "Enter" || e.key === " ") && e.target.matches("td[data-value]")) {
      e.preventDefault();
      open(e.target);
    }
  };
  showReadout(readout, ans, env, ctx.memory);
  markSelected(container, ctx.memory.selected);
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  container.dataset.causal = String(ans.causal);
  container.dataset.step = String(cur);

  const kinds = ["scores", "scaled", "mask", "masked", "probs"];
  const vectors = ["x", "q", "k", "v", "ctx", "contribution"];
  const exportK = cur === 0 ? STEPS.findIndex((s) => s.key === "probs") : cur - 1;
  return {
    name: name(exportK),
    get svg() { return picture(exportK); },   // the PNG / SVG buttons: the step shown (softmax when all are)
    csv: () => {
      const rows = [["query_index", "query_token", "key_index", "key_token", ...kinds]];
      for (let i = 0; i < n; i++) for (let j = 0; j < nk; j++) {
        rows.push([i, ans.tokens[i], j, (ans.keyTokens ?? ans.tokens)[j], ...kinds.map((k) => Number(exactString(ans[k].at(i, j))))]);
      }
      return rows;
    },
    json: () => {
      const cut = (t, cols, rows = n) => [...Array(rows).keys()].map((i) => [...Array(cols ?? nk).keys()].map((j) => {
        const v = t.at(i, j);
        return isMinusInf(v) ? "-Infinity" : Number(exactString(v));
      }));
      return { model: st.model, text: st.text, layer: st.layer, head: st.head, causal: ans.causal,
        mask_tokens: ans.mask_tokens, d_head: ans.d_head, scale: ans.scale, tokens_shown: n, tokens: ans.tokens.slice(0, n),
        ...(ans.keyTokens ? { attention: ans.attention, key_tokens: ans.keyTokens.slice(0, nk) } : {}),
        ...Object.fromEntries(vectors.map((k) => [k, cut(ans[k], ans[k].shape[1], ans[k].shape[0])])),
        ...Object.fromEntries(kinds.map((k) => [k, cut(ans[k])])) };
    },
  };
}
