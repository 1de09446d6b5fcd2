// A typed target says which token it became. Where a word is one token both with and without its leading space
// ("Mary" and " Mary" in SmolLM2's vocabulary), the two answer differently; the answer (POST /api/attention's
// attribution.target) names the token used, its rank among the next tokens, and the other spelling, which this
// offers with one click. (A text that is no single token is refused by the server, its pieces named.)
import { h, tokenLabel } from "./dom.js";
import { fmtSig } from "./scale.js";

const ranked = (t) => `rank ${t.rank.toLocaleString("en")} among the next tokens (p = ${fmtSig(t.probability)})`;

/** The sentence for target t ({token, id, rank, probability, typed, other}); go(patch) changes the state. */
export function typedTarget(t, go) {
  if (!t?.rank) return "";
  const same = t.typed === t.token || tokenLabel(t.typed) === tokenLabel(t.token);
  return h("span", { class: "typed-target", "data-token": t.token, "data-rank": t.rank },
    `Target ${same ? "" : `“${t.typed}” is the token `}“${tokenLabel(t.token)}” (id ${t.id}): ${ranked(t)}.`,
    t.other && [` “${tokenLabel(t.other.token)}” is a token too: ${ranked(t.other)}. `,
      h("button", { type: "button", class: "small use-other", "data-token": t.other.token,
        text: `Use “${tokenLabel(t.other.token)}”`, onclick: () => go({ target: t.other.token }) })]);
}
