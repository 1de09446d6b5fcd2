// "How was this number computed?": the large readout of one cell of the steps view, written out term by
// term from the numbers the server sent (a score as its dot product, a weight as its softmax, an output
// entry as its weighted sum). The sums are redone here in double precision from the float32 inputs; the
// model's own float32 value is shown beside them, so a class sees both agree.
import { h, tokenLabel } from "./dom.js";
import { fmt, fmtExact, isMinusInf } from "./scale.js";

const SUB = "₀₁₂₃₄₅₆₇₈₉";
/** i as a subscript: q₁₂. */
export const sub = (i) => String(i).replace(/\d/g, (c) => SUB[c]);
/** A number as a factor: negative ones in brackets. */
const factor = (v, d) => (v < 0 ? `(${fmt(v, d)})` : fmt(v, d));
const tok = (ans, i) => h("q", { class: "tok", text: tokenLabel(ans.tokens[i]) });

/** Digits that show a vector's numbers without losing them: 3, fewer for big numbers. */
function digitsFor(values) {
  const big = Math.max(...values.map((v) => Math.abs(v)));
  return big >= 100 ? 1 : big >= 10 ? 2 : 3;
}

function terms(list) {
  // one span per term, joined by " + ", wrapping freely; each names its index on hover
  return h("p", { class: "terms" }, list.map(([text, tip], k) => [k ? " + " : "", h("span", { class: "term", title: tip, text })]));
}

function result(value, exact, partial = "") {
  return h("p", { class: "result" }, "= ", h("strong", { text: value }), h("span", { class: "exact",
    text: partial ? ` (the ${partial.shown} keys shown). ${partial.rest}; the model's value over all ${partial.T} keys: ${exact}`
      : ` the model's float32 value: ${exact}` }));
}

/** What a row cut by "Tokens shown" leaves out: {shown, rest, T}, or "" when the whole row is shown. */
function cutRow(env) {
  if (env.n >= env.T) return "";
  return { shown: env.n, T: env.T, rest: env.n === env.T - 1 ? `Key ${env.n} is not shown`
    : `Keys ${env.n}–${env.T - 1} are not shown` };
}

/** {title, body: Node[]} for the cell (a, b) of step `key`: matrices (query a, key b), vectors (token a, number b). */
export function explain(key, ans, a, b, env) {
  const fn = EXPLAIN[key];
  return fn ? fn(ans, a, b, env) : { title: key, body: [] };
}

const EXPLAIN = {
  x(ans, i, d, env) {
    return { title: [`x${sub(i)}[${d}] = ${fmtExact(ans.x.at(i, d))}`],
      body: [h("p", {}, `Number ${d} of the input vector of token ${i} `, tok(ans, i), ` to layer ${env.layer}: `,
        env.preNorm ? "the residual stream after this block's normalisation (the numbers the projections read)."
          : env.outputNorms ? "the residual stream itself, not normalised (this model normalises each sublayer's output instead)."
          : env.layer === 0 ? "the embeddings, normalised." : "the output of the layer before.",
        ` Each token's vector has d_model = ${ans.x.shape[1]} numbers.`)] };
  },
  q: projection("q", "query", "W_Q"),
  k: projection("k", "key", "W_K"),
  v: projection("v", "value", "W_V"),

  scores(ans, i, j) {
    const dh = ans.q.shape[1], q = [], k = [];
    for (let d = 0; d < dh; d++) { q.push(ans.q.at(i, d)); k.push(ans.k.at(j, d)); }
    const digits = digitsFor([...q, ...k]);
    let sum = 0;
    const list = q.map((x, d) => {
      sum += x * k[d];
      return [`${factor(x, digits)}·${factor(k[d], digits)}`, `d = ${d}: ${fmtExact(x)} × ${fmtExact(k[d])} = ${fmt(x * k[d], 5)}`];
    });
    return { title: [`q${sub(i)} · k${sub(j)} = Σ_d q${sub(i)}[d] · k${sub(j)}[d]`],
      body: [h("p", {}, "The query of token ", tok(ans, i), ` (row ${i}) times the key of token `, tok(ans, j),
        ` (column ${j}), number by number, all ${dh} products added up:`),
      terms(list), result(fmt(sum, 4), fmtExact(ans.scores.at(i, j)))] };
  },

  scaled(ans, i, j) {
    const s = ans.scores.at(i, j);
    return { title: [`scaled[${i}, ${j}] = score[${i}, ${j}] × 1/√${ans.d_head}`],
      body: [h("p", { class: "terms" }, `${fmt(s, 4)} × ${fmt(ans.scale, 6)}`),
        result(fmt(s * ans.scale, 4), fmtExact(ans.scaled.at(i, j)))] };
  },

  mask(ans, i, j) {
    const hidden = isMinusInf(ans.mask.at(i, j));
    const why = !hidden ? `token ${i} may look at token ${j}, so nothing changes.`
      : ans.causal && j > i ? `token ${j} comes after token ${i}: a causal model cannot look ahead.`
        : `token ${j} is masked as a key (a what-if): no other token may look at it.`;
    return { title: [`mask[${i}, ${j}] = ${hidden ? "−∞" : "0"}`],
      body: [h("p", {}, "Query ", tok(ans, i), ", key ", tok(ans, j), `: ${why}`),
        h("p", { class: "hint", text: "The mask is added to the scaled scores: 0 keeps a score, −∞ removes it (exp(−∞) = 0 in the softmax). The model adds the largest negative float32, −3.4 × 10³⁸." })] };
  },

  masked(ans, i, j) {
    const s = ans.scaled.at(i, j), m = ans.mask.at(i, j);
    const hidden = isMinusInf(m);
    return { title: [`masked[${i}, ${j}] = scaled[${i}, ${j}] + mask[${i}, ${j}]`],
      body: [h("p", { class: "terms" }, `${fmt(s, 4)} + ${hidden ? "(−∞)" : "0"}`),
        result(hidden ? "−∞" : fmt(s, 4), fmtExact(ans.masked.at(i, j)))] };
  },

  probs(ans, i, j, env) {
    const max = ans.row_max[i], total = ans.row_sum[i];
    const m = ans.masked.at(i, j), p = ans.probs.at(i, j);
    const shown = [];
    for (let k = 0; k < env.n; k++) {
      const x = ans.masked.at(i, k);
      shown.push(isMinusInf(x) ? ["0", `key ${k}: masked, exp(−∞) = 0`]
        : [fmt(Math.exp(x - max), 4), `key ${k}: exp(${fmt(x, 3)} − ${fmt(max, 3)})`]);
    }
    const cut = ans.causal ? "" : cutRow(env);   // the row goes on past the tokens shown
    const top = isMinusInf(m) ? 0 : Math.exp(m - max);
    return { title: [`p[${i}, ${j}] = exp(m[${i}, ${j}] − max) / Σ_k exp(m[${i}, k] − max)`],
      body: [h("p", {}, "Softmax of row ", tok(ans, i), `: each number of the masked row minus the row's largest (${fmt(max, 4)}), exponentiated, divided by the row's sum of those.`),
        h("p", { class: "terms" }, isMinusInf(m) ? `exp(−∞) / ${fmt(total, 4)} = 0 / ${fmt(total, 4)}`
          : `exp(${fmt(m, 4)} − ${fmt(max, 4)}) / ${fmt(total, 4)} = ${fmt(top, 4)} / ${fmt(total, 4)}`),
        result(fmt(top / total, 4), fmtExact(p)),
        h("p", {}, `The row's sum Σ_k exp(m[${i}, k] − max):`),
        terms(shown), h("p", { class: "result" }, `= ${fmt(total, 4)}` + (cut ? ` over all ${env.T} keys (${cut.rest.toLowerCase()} here)` : ""))] };
  },

  ctx(ans, i, d, env) {
    const list = [];
    let sum = 0;
    const vs = [];
    for (let j = 0; j < env.n; j++) if (!isMinusInf(ans.mask.at(i, j))) vs.push(ans.v.at(j, d));
    const digits = digitsFor(vs);
    for (let j = 0; j < env.n; j++) {
      if (isMinusInf(ans.mask.at(i, j))) continue;
      const p = ans.probs.at(i, j), v = ans.v.at(j, d);
      sum += p * v;
      list.push([`${fmt(p, 4)}·${factor(v, digits)}`, `key ${j} (${tokenLabel(ans.tokens[j])}): p = ${fmtExact(p)}, v[${d}] = ${fmtExact(v)}`]);
    }
    const cut = ans.causal ? "" : cutRow(env);   // causal: query i < n sees no key past the ones shown
    return { title: [`out${sub(i)}[${d}] = Σ_j p[${i}, j] · v_j[${d}]`],
      body: [h("p", {}, "The head's output for token ", tok(ans, i), `, number ${d}: every value vector's number ${d}, weighted by how much token ${i} attends to that token (masked keys, weight 0, left out):`),
        terms(list), result(fmt(sum, 4), fmtExact(ans.ctx.at(i, d)), cut)] };
  },

  contribution(ans, i, e, env) {
    const dh = ans.ctx.shape[1];
    return { title: [`c${sub(i)}[${e}] = Σ_d out${sub(i)}[d] · W_O[${e}, ${env.head * dh} + d]`],
      body: [h("p", {}, "What this head adds to number ", String(e), " of token ", tok(ans, i), "'s vector: its output (", String(dh),
        ` numbers) times row ${e} of the head's ${dh} columns of the output projection W_O. The heads' contributions, plus W_O's bias, are added to the residual stream` +
        (env.preNorm ? "." : env.outputNorms ? " after their sum is normalised." : " (then normalised)."), " W_O's numbers are not sent to the page."),
        h("p", { class: "result" }, "= ", h("strong", { text: fmtExact(ans.contribution.at(i, e)) }))] };
  },
};

function projection(key, word, W) {
  return (ans, i, d, env) => ({
    title: [`${key}${sub(i)}[${d}] = ${fmtExact(ans[key].at(i, d))}`],
    body: [h("p", {}, `Number ${d} of the ${word} vector of token `, tok(ans, i), `: x${sub(i)} (d_model = ${ans.x.shape[1]} numbers) times column ${d} of this head's ${W}` +
      (env.bias ? ", plus its bias" : "") + (env.qkNorm && key !== "v" ? `, then RMS-normalised (QK-norm, over ${env.qkNorm === "head" ? "this head's numbers" : "all heads' numbers together"})` : "") +
      (env.rope && key !== "v" ? (env.rotary ? `, then, for numbers below ${env.rotary}, rotated by the token's position (partial RoPE)` : ", then rotated by the token's position (RoPE)") : "") +
      `. ${W}'s numbers are not sent to the page.`)],
  });
}
