// Cache view: what a key/value-cache eviction policy (StreamingLLM, H2O, SnapKV) forgets while the model generates,
// and what that changes. A policy and budget chooser; the kept-keys map of the page's head (its key/value head) over
// the steps of the policy's own greedy generation (POST /api/generate with kv_cache: each token's evicted keys); the
// divergence from the full cache per step for every policy at the budget, and the tokens where they part from it
// (POST /api/kv_compare: each policy teacher-forced on the full cache's greedy continuation, so every curve scores the
// same tokens).
import { h, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { exactString, fmtExact, headColor, plotlyScale, SIG_FORMAT } from "../scale.js";
import { GENERATION } from "../state.js";

export const title = "KV cache";
export const help = "A key/value-cache eviction policy keeps only some keys per key/value head (the budget) while " +
  "the model generates; an evicted key is masked for every later query (positions unchanged). The map shows, for the " +
  "page's head, which keys the query of each step still saw under the chosen policy (its own greedy generation). " +
  "The curve: KL(full cache || policy) of each step's next-token distribution, every policy at the budget, each fed " +
  "the full cache's greedy continuation; the table marks the steps where a policy's most probable token parts from " +
  "the full cache's.";

export const POLICIES = [["streaming", "StreamingLLM (sinks + window)"], ["h2o", "H2O (heavy hitters)"],
  ["snapkv", "SnapKV (prompt votes)"]];
export const BUDGETS = [8, 16, 32, 64, 128, 256, 512, 1024, 2048];
export const STEPS = [4, 8, 16, 32];
/** The state's budget and new tokens, each one of the chooser's. */
const chosen = (st) => ({ budget: BUDGETS.includes(st.kv_budget) ? st.kv_budget : 16,
  steps: Math.min(STEPS.includes(st.kv_steps) ? st.kv_steps : 8, GENERATION.max_new_tokens) });
const SINKS = 4;

/** The comparison's options for a budget (as POST /api/kv_compare takes them): sinks 4, H2O's recent window half
 *  the budget, SnapKV's observation window 32 or half a smaller budget. */
export function compareOptions(budget) {
  return { policies: POLICIES.map(([p]) => p), budgets: [budget], sinks: SINKS,
    snapkv_window: Math.min(32, Math.max(1, budget >> 1)) };
}

/** The policy at a budget as /api/generate's kv_cache: the comparison's rule for it (analyses/kv_compare.py grid). */
export function kvCache(policy, budget) {
  const o = compareOptions(budget);
  if (policy === "streaming") return { policy, sinks: o.sinks, window: budget - o.sinks };
  if (policy === "h2o") return { policy, budget, recent: budget >> 1 };
  return { policy, budget, window: o.snapkv_window, kernel: 5, pooling: "avg" };
}

export function requests(st) {
  const { budget, steps } = chosen(st);
  return [
    { endpoint: "kv_compare", max_new_tokens: steps, ...compareOptions(budget) },
    { endpoint: "generate", max_new_tokens: steps, greedy: true, kv_cache: kvCache(st.kv_policy, budget) },
  ];
}

/** keys x steps: 1 where the step's query saw the key, 0 where the policy had evicted it, null past the query.
 *  steps: /api/generate's token lines (each `kv_cache.evicted`: the positions evicted since the previous one's). */
export function keptMap(steps, layer, kvHead) {
  const last = steps.length ? steps[steps.length - 1].index : 0;
  const gone = new Set();
  const columns = steps.map((s) => {
    for (const k of s.kv_cache.evicted[layer][kvHead]) gone.add(k);
    return Array.from({ length: last }, (_, k) => (k < s.index ? (gone.has(k) ? 0 : 1) : null));
  });
  return Array.from({ length: last }, (_, k) => columns.map((c) => c[k]));      // [key][step]
}

function chooser(container, st, ctx) {
  const form = part(container, "controls", "div", { class: "view-controls", role: "group", "aria-label": "Cache policy" });
  const select = (id, options, value, go) => h("select", { id, onchange: (e) => go(e.target.value) },
    options.map(([v, text]) => h("option", { value: v, text, selected: String(v) === String(value) })));
  const { budget, steps } = chosen(st);
  replace(form,
    h("label", {}, "Policy ", select("kv-policy", POLICIES, st.kv_policy, (v) => ctx.go({ kv_policy: v }))),
    h("label", {}, " Budget ", select("kv-budget", BUDGETS.map((b) => [b, `${b} keys`]), budget,
      (v) => ctx.go({ kv_budget: Number(v) }))),
    h("span", { class: "hint", text: " per key/value head " }),
    h("label", {}, " New tokens ", select("kv-steps", STEPS.filter((n) => n <= GENERATION.max_new_tokens)
      .map((n) => [n, String(n)]), steps,
      (v) => ctx.go({ kv_steps: Number(v) }))));
}

export function render(container, { meta, results: [cmp, gen] }, st, ctx) {
  chooser(container, st, ctx);
  const info = ctx.info, group = info.heads / (info.kv_heads || info.heads), kvHead = Math.floor(st.head / group);
  const steps = gen.tokens, tokens = [...meta.tokens, ...steps.map((s) => s.token)];
  const note = part(container, "note", "p", { class: "note" });
  note.textContent = `Layer ${st.layer}, head ${st.head} (key/value head ${kvHead}): the keys each step's query saw ` +
    `under ${st.kv_policy} at ${chosen(st).budget} keys, while it generated “${gen.done.text}”. ` +
    `The full cache continues “${cmp.answer_tokens.map(tokenLabel).join("")}”.`;

  const map = part(container, "map", "div", { class: "plot cache-map", role: "figure" });
  map.setAttribute("aria-label", `Kept keys of layer ${st.layer}, key/value head ${kvHead}, per generation step`);
  const z = keptMap(steps, st.layer, kvHead);
  const xs = steps.map((s, i) => `${i} ${plotlyText(tokenLabel(s.token))}`);
  const ys = z.map((_, k) => `${k} ${plotlyText(tokenLabel(tokens[k]))}`);
  ctx.plot(map, [{ type: "heatmap", z, x: xs, y: ys, colorscale: plotlyScale, zmin: 0, zmax: 1, showscale: false,
    xgap: 1, hovertemplate: "step %{x}<br>key %{y}<br>%{z}<extra>1 kept · 0 evicted</extra>" }], {
    title: `Kept keys · layer ${st.layer} · key/value head ${kvHead} · ${st.kv_policy} ${chosen(st).budget}`,
    margin: { l: 110, r: 10, t: 40, b: 90 }, xaxis: { type: "category", tickangle: -60, title: { text: "step (the token it chose)" } },
    yaxis: { type: "category", autorange: "reversed", automargin: true },
  });

  const rows = cmp.rows.filter((r) => r.policy !== "full");
  const curve = part(container, "curve", "div", { class: "plot cache-kl", role: "figure" });
  curve.setAttribute("aria-label", "KL from the full cache per step, one line per policy");
  const answer = cmp.answer_tokens.map((t, i) => `${i} ${plotlyText(tokenLabel(t))}`);
  ctx.plot(curve, rows.map((r, i) => ({ type: "scatter", mode: "lines+markers", x: answer, y: r.kl, name: r.policy,
    line: { color: headColor(i), width: r.policy === st.kv_policy ? 3 : 1.5 },
    hovertemplate: `${r.policy}: KL %{y:${SIG_FORMAT}} nats<extra></extra>` })), {
    title: `KL(full ‖ policy) per step · budget ${rows[0]?.budget}`, margin: { l: 70, r: 10, t: 40, b: 90 },
    xaxis: { type: "category", tickangle: -60 }, yaxis: { title: { text: "nats" }, rangemode: "tozero" },
    legend: { orientation: "h", y: 1.1 },
  });

  const table = part(container, "parts", "div", { class: "table-scroll cache-parts" });
  replace(table, h("table", { class: "cache-parts-table" },
    h("thead", {}, h("tr", {}, ["step", "full cache", ...rows.map((r) => `${r.policy} (p of the full token)`)]
      .map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, cmp.answer_tokens.map((t, i) => h("tr", { "data-step": i },
      h("td", { class: "num", text: i }), h("td", { class: "tok", text: tokenLabel(t) }),
      ...rows.map((r) => h("td", { class: r.top1[i] ? "tok" : "tok parted", "data-policy": r.policy,
        "data-kl": exactString(r.kl[i]), "data-top": r.top_tokens[i],
        text: `${r.top1[i] ? "" : "≠ "}${tokenLabel(r.top_tokens[i])} (${fmtExact(r.probabilities[i])})` })))))),
    h("p", { class: "hint", text: "≠: the policy's most probable token is not the full cache's (they part there); in " +
      "brackets, the policy's probability of the full cache's token." }));
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  return {
    plot: curve,
    name: `attnscope-${st.model}-cache-${st.kv_policy}-${chosen(st).budget}`,
    csv: () => [["policy", "budget", "step", "token", "kl", "top1_agree", "probability"],
      ...rows.flatMap((r) => cmp.answer_tokens.map((t, i) => [r.policy, r.budget, i, t, r.kl[i], r.top1[i], r.probabilities[i]]))],
    json: () => ({ model: st.model, text: st.text, comparison: cmp, kept: z, layer: st.layer, kv_head: kvHead }),
  };
}
