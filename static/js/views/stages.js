// Causal-mask view / stepper: for one head, every step from Q and K to the attention weights,
// with the exact numbers: Q·Kᵀ, scaled by 1/√d_head, mask added, softmax.
import { h, part, replace, tokenLabel } from "../dom.js";
import { STEP_TOKENS } from "../state.js";
import { color, divergingColor, exactString, fmt, fmtExact, isMinusInf, MASKED_COLOR, textOn, textOnDiverging } from "../scale.js";

export const title = "Causal mask & steps";
export const help = "How one head turns queries and keys into attention weights, step by step, with the numbers the " +
  "model computed. Turn the causal mask on and off to see what it changes. Use the step buttons to reveal one step at a time.";

export function requests(st) {
  // Only the tokens shown travel: `limit` trims every matrix server-side (512 tokens would be 5 MB).
  return [{ endpoint: "stages", layer: st.layer, head: st.head, limit: st.n }];
}

function sentences(ans, info, n) {
  const s = Math.sqrt(ans.d_head);
  const anyMasked = ans.mask_tokens.length > 0;
  let maskText;
  if (ans.causal && anyMasked) {
    maskText = "The mask adds −∞ above the diagonal (a token cannot see the tokens after it) and in the columns of the masked tokens; elsewhere it adds 0.";
  } else if (ans.causal) {
    maskText = "The causal mask adds −∞ above the diagonal: a token cannot see the tokens after it. Everything else gets + 0.";
  } else if (anyMasked) {
    maskText = `The mask adds −∞ in the columns of the masked token${ans.mask_tokens.length > 1 ? "s" : ""} (except on the diagonal: a token still sees itself) and 0 elsewhere.`;
  } else {
    maskText = "The mask adds 0 everywhere here: the causal mask is off and no token is masked, so this equals step 2.";
  }
  return [
    ["1. Scores: Q · Kᵀ", "scores", "Each query vector is multiplied with every key vector (a dot product). A bigger number means the query matches that key better. Rows are queries, columns are keys."],
    [`2. Scaled: × 1/√${ans.d_head}`, "scaled", `Every score is multiplied by ${fmt(ans.scale, 4)}${Math.abs(ans.scale * s - 1) > 1e-6 ? " (1/√d_head, with the model's temperature)" : ` = 1/√${ans.d_head}`}, so the numbers don't grow with the vector size and the softmax doesn't become too peaky.`],
    ["3. Mask added", "masked", maskText],
    ["4. Softmax", "probs", "Each row is turned into weights: exp(x) divided by the row's sum of exp. They are positive and add up to 1; exp(−∞) = 0, so hidden keys get exactly 0." +
      (n < ans.tokens.length ? " Σ is the part of the row shown here." : "")],
  ];
}

function matrixTable(kind, t, n, tokens, st, mask) {
  const diverging = kind !== "probs";
  let absmax = 0;
  if (diverging) {
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
      const v = t.at(i, j);
      if (!isMinusInf(v)) absmax = Math.max(absmax, Math.abs(v));
    }
  }
  const digits = kind === "probs" ? 4 : kind === "scores" ? 2 : 3;
  const head = h("tr", {}, h("th", { scope: "col", class: "corner", text: "q \\ k" }),
    tokens.slice(0, n).map((tok, j) => h("th", { scope: "col", title: `key ${j}: ${tok}` }, h("span", { class: "tok", text: tokenLabel(tok) }))),
    kind === "probs" && h("th", { scope: "col", text: "Σ" }));
  const rows = [];
  for (let i = 0; i < n; i++) {
    const cells = [];
    let sum = 0;
    for (let j = 0; j < n; j++) {
      const v = t.at(i, j);
      const inf = isMinusInf(v);
      const masked = inf || (kind !== "scores" && kind !== "scaled" && isMinusInf(mask.at(i, j)));   // drawn alike
      if (kind === "probs") sum += v;
      const bg = masked ? MASKED_COLOR : diverging ? divergingColor(v, absmax) : color(v);
      const fg = masked ? "#333" : diverging ? textOnDiverging(v, absmax) : textOn(v);
      cells.push(h("td", {
        class: "num" + (inf ? " neg-inf" : "") + (masked ? " masked-cell" : ""), style: `background:${bg};color:${fg}`,
        "data-q": i, "data-k": j, "data-value": exactString(v), title: `query ${i}, key ${j}: ${fmtExact(v)}`,
      }, fmt(v, digits)));
    }
    rows.push(h("tr", { class: st.pin === i ? "pinned" : null },
      h("th", { scope: "row", title: `query ${i}: ${tokens[i]}` }, h("span", { class: "tok", text: tokenLabel(tokens[i]) })),
      cells, kind === "probs" && h("td", { class: "num sum", text: fmt(sum, 3) })));
  }
  return h("div", { class: "table-scroll" }, h("table", { class: `stage-table ${kind}` }, h("thead", {}, head), h("tbody", {}, rows)));
}

function vectorTable(name, t, n, tokens) {
  const dims = Math.min(8, t.shape[1]);
  return h("div", { class: "table-scroll" }, h("table", { class: "stage-table vectors" },
    h("caption", { text: `${name}: first ${dims} of ${t.shape[1]} numbers per token` }),
    h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "token" }), [...Array(dims).keys()].map((d) => h("th", { scope: "col", text: d })))),
    h("tbody", {}, [...Array(n).keys()].map((i) => h("tr", {},
      h("th", { scope: "row" }, h("span", { class: "tok", text: tokenLabel(tokens[i]) })),
      [...Array(dims).keys()].map((d) => h("td", { class: "num", title: fmtExact(t.at(i, d)), text: fmt(t.at(i, d), 3) })))))));
}

export function render(container, { results: [ans] }, st, ctx) {
  const T = ans.tokens.length;
  const n = Math.min(T, st.n);
  const steps = sentences(ans, ctx.info, n);

  const controls = part(container, "controls", "div", { class: "view-controls stepper", role: "group", "aria-label": "Steps" });
  const stepBtn = (k, text) => h("button", {
    type: "button", class: "small", "aria-pressed": String(st.step === k), "data-step": k, text,
    onclick: () => ctx.go({ step: k }),
  });
  replace(controls,
    h("button", { type: "button", class: "small", disabled: st.step === 1, text: "◀ Previous step",
      onclick: () => ctx.go({ step: st.step <= 1 ? 4 : st.step - 1 }) }),
    stepBtn(1, "1"), stepBtn(2, "2"), stepBtn(3, "3"), stepBtn(4, "4"), stepBtn(0, "All steps"),
    h("button", { type: "button", class: "small", disabled: st.step === 0 || st.step === 4, text: "Next step ▶",
      onclick: () => ctx.go({ step: st.step === 0 ? 1 : st.step + 1 }) }),
    h("label", {}, "Tokens shown ", h("select", { id: "stage-n", onchange: (e) => ctx.go({ n: Number(e.target.value) }) },
      STEP_TOKENS.map((k) => h("option", { value: k, selected: k === st.n, text: k })))));

  const note = part(container, "note", "p", { class: "note" });
  const whatIf = ctx.info.kind === "encoder" && ans.causal
    ? `What-if: ${ctx.info.title} was trained without a causal mask; these are the numbers of a real run with the mask applied in every layer. `
    : ctx.info.kind === "decoder" && !ans.causal
      ? `What-if: ${ctx.info.title} is a causal model; here its mask is switched off so every token sees the future. ` : "";
  note.textContent = whatIf + (n < T
    ? `Showing the first ${n} of ${T} tokens (rows and columns); the numbers come from the run on the whole input.`
    : `All ${T} tokens. Layer ${st.layer}, head ${st.head}; d_head = ${ans.d_head}.`) +
    " Hover a number for its exact value.";

  const vectors = part(container, "vectors", "details", { class: "data-table" });
  replace(vectors, h("summary", { text: "The query (Q) and key (K) vectors these steps start from" }),
    h("div", { class: "vectors-row" }, vectorTable("Q", ans.q, n, ans.tokens), vectorTable("K", ans.k, n, ans.tokens)));

  const grid = part(container, "grid", "div", { class: "stage-grid" });
  replace(grid, steps.map(([heading, kind, sentence], k) => {
    const hidden = st.step !== 0 && k + 1 > st.step;
    return h("section", {
      class: "stage" + (st.step === k + 1 ? " current" : ""), "data-stage": kind, hidden,
      "aria-labelledby": `stage-${kind}-h`,
    }, h("h3", { id: `stage-${kind}-h`, text: heading }), h("p", { class: "explain", text: sentence }),
    matrixTable(kind, ans[kind], n, ans.tokens, st, ans.mask));
  }));
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  container.dataset.causal = String(ans.causal);

  const kinds = ["scores", "scaled", "mask", "masked", "probs"];
  return {
    name: `attnscope-${st.model}-L${st.layer}H${st.head}-stages`,
    csv: () => {
      const rows = [["query_index", "query_token", "key_index", "key_token", ...kinds]];
      for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
        rows.push([i, ans.tokens[i], j, ans.tokens[j], ...kinds.map((k) => Number(exactString(ans[k].at(i, j))))]);
      }
      return rows;
    },
    json: () => {
      const cut = (t) => [...Array(n).keys()].map((i) => [...Array(n).keys()].map((j) => {
        const v = t.at(i, j);
        return isMinusInf(v) ? "-Infinity" : Number(exactString(v));
      }));
      return { model: st.model, text: st.text, layer: st.layer, head: st.head, causal: ans.causal,
        mask_tokens: ans.mask_tokens, d_head: ans.d_head, scale: ans.scale, tokens_shown: n, tokens: ans.tokens.slice(0, n),
        ...Object.fromEntries(kinds.map((k) => [k, cut(ans[k])])) };
    },
  };
}
