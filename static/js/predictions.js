// The next-token panel (decoders with an LM head): the model's top next tokens after the last token, as bars
// of their probability (full softmax), and, when heads are knocked out, the intact run's bars beside them
// with the KL divergence between the two distributions. Pure function of (answer, state). A view may make the
// tokens buttons (pick: the effects view picks its target and distractor here).
import { h, replace, tokenLabel } from "./dom.js";
import { fmt } from "./scale.js";

/** The token's cell: its text, or with pick ({marks, choose(token, event), hint}) a button that picks it. */
function tokenCell(t, pick) {
  if (!pick) return h("th", { scope: "row", class: "tok", text: tokenLabel(t.token), title: `id ${t.id}` });
  const mark = pick.marks[t.token];
  return h("th", { scope: "row", class: "tok" }, h("button", { type: "button", class: ["pick", mark].filter(Boolean).join(" "),
    "data-token": t.token, "aria-pressed": String(Boolean(mark)), title: `id ${t.id}. ${pick.hint}`,
    "aria-label": `${tokenLabel(t.token)}${mark ? ` (${mark})` : ""}: ${pick.hint}`,
    onclick: (e) => pick.choose(t.token, e) }, tokenLabel(t.token), mark && h("span", { class: "mark", text: ` ${mark}` })));
}

/** A table of next tokens as bars of their probability; pick: see tokenCell. */
export function bars(list, cls, caption, pick = null) {
  return h("table", { class: `next-tokens ${cls}` },
    h("caption", { text: caption }),
    h("tbody", {}, list.map((t) => h("tr", { "data-token-id": t.id },
      tokenCell(t, pick),
      h("td", { class: "bar-cell" }, h("span", { class: "bar", style: `width:${(100 * t.prob).toFixed(2)}%` })),
      h("td", { class: "num", text: fmt(t.prob, 4), title: String(t.prob) })))));
}

/** Draw (or hide) the panel. ans: an /api/attention answer that may hold next_tokens and effect; pick: null, or
 *  the view's {marks, choose, hint} (its next tokens become buttons). */
export function renderPredictions(container, ans, st, pick = null) {
  if (!ans || !ans.next_tokens) {
    container.hidden = true;
    replace(container);
    return;
  }
  container.hidden = false;
  const tokens = ans.decoder_tokens ?? ans.tokens;      // an encoder-decoder predicts its decoder's next token
  const last = tokens[tokens.length - 1];
  const parts = [h("h2", { text: `${ans.decoder_tokens ? "The decoder's next token" : "Next token"} after “${tokenLabel(last)}”` })];
  if (ans.effect && ans.effect.next_tokens_before) {
    const knocked = st.ablate.map((x) => `L${x.replace(".", "H")}`).join(", ");
    parts.push(h("p", { class: "note", text: `With ${knocked} knocked out (${st.ablation} ablation): KL(intact ‖ ablated) = ` +
      `${fmt(ans.effect.kl, 4)} nats; mean change in token log-prob ${fmt(ans.effect.mean_logprob_change, 4)}.` }));
    parts.push(h("div", { class: "next-compare" },
      bars(ans.effect.next_tokens_before, "before", "intact"), bars(ans.next_tokens, "after", "ablated", pick)));
  } else {
    parts.push(bars(ans.next_tokens, "after", "probability (full softmax over the vocabulary)", pick));
  }
  if (pick) parts.push(h("p", { class: "hint", text: pick.hint }));
  replace(container, parts);
  container.dataset.top = ans.next_tokens[0].token;
}

/** Surprisal (−log p of each token given the ones before, nats) as a 0–1 shade for the token chips. */
export function surprisal(ans) {
  if (!ans || !ans.token_logprobs) return null;
  return ans.token_logprobs.map((lp) => (lp === null ? null : Math.min(1, -lp / 12)));
}
