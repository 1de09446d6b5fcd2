// The token strip: one chip per token. A click pins the token's row or masks it as a key
// (the "Clicking a token" switch); keyboard: arrows / Home / End move, Enter pins or masks,
// "m" always toggles the mask, "p" always pins.
import { h, replace, rove, SPACE_MARK, tokenLabel } from "./dom.js";

function toggled(list, i) {
  return list.includes(i) ? list.filter((x) => x !== i) : [...list, i].sort((a, b) => a - b);
}

/** Draw the chips for an answer's tokens under state st; go(patch) changes the state. shade: null, or each
 *  token's surprisal as 0–1 (decoders: −log p(token | before) / 12 nats), drawn as the chip's underline.
 *  generated: null, or the index of the first token a generation made (those chips are marked). */
export function renderChips(container, meta, st, go, shade = null, generated = null) {
  const drawn = [meta, st.pin, st.click, generated];   // a long text has thousands of chips: redrawn only when
                                                       // these change (shade comes from meta)
  if (container._drawn?.every((x, k) => x === drawn[k])) return;
  container._drawn = drawn;
  const hadFocus = container.contains(document.activeElement)
    ? Number(document.activeElement.dataset.index) : null;
  const masked = new Set(meta.mask_tokens);
  const focusIndex = hadFocus ?? st.pin ?? 0;
  const act = (i, how) => {
    if (how === "mask") go({ mask_tokens: toggled(st.mask_tokens, i) });
    else go({ pin: st.pin === i ? null : i });
  };
  const chips = meta.tokens.map((tok, i) => {
    const special = meta.special[i], isMasked = masked.has(i), pinned = st.pin === i;
    const states = [special && "special token", isMasked && "masked", pinned && "pinned",
      generated !== null && i >= generated && "generated"].filter(Boolean);
    return h("button", {
      type: "button",
      class: ["chip", special && "special", meta.segments[i] === 1 && "seg1", isMasked && "masked",
        pinned && "pinned", generated !== null && i >= generated && "generated"].filter(Boolean).join(" "),
      "data-index": i,
      "aria-pressed": st.click === "mask" ? String(isMasked) : String(pinned),
      "aria-label": `token ${i}: ${tok}${states.length ? " (" + states.join(", ") + ")" : ""}`,
      style: shade && shade[i] !== null ? `--surprisal:${shade[i].toFixed(3)}` : null,
      title: shade && shade[i] !== null ? `surprisal −log p = ${(-meta.token_logprobs[i]).toFixed(3)} nats` : null,
      tabindex: i === focusIndex ? "0" : "-1",
      onclick: () => act(i, st.click),
    }, h("span", { class: "tok", text: tokenLabel(tok) }), h("span", { class: "idx", "aria-hidden": "true", text: i }));
  });
  replace(container, chips);
  container.onkeydown = (e) => {
    const i = Number(e.target.dataset?.index);
    if (Number.isNaN(i)) return;
    if (rove(e, chips, i)) return;
    if (e.key === "m" || e.key === "M") {
      e.preventDefault();
      act(i, "mask");
    } else if (e.key === "p" || e.key === "P") {
      e.preventDefault();
      act(i, "pin");
    }
  };
  if (hadFocus !== null && chips[hadFocus]) chips[hadFocus].focus();
}

/** The legend of every mark the chips carry for this answer: the space mark always, then those present (the
 *  surprisal underline, special tokens, the pair's second sentence, masked, pinned, generated tokens). */
export function renderChipsLegend(container, meta, st, shade = null, generated = null) {
  const item = (cls, sample, text, style = null) => h("span", { class: "legend-item", "data-mark": cls },
    h("span", { class: `chip legend-chip ${cls}`, style, "aria-hidden": "true", text: sample }), " ", text);
  const items = [h("span", { class: "legend-item", "data-mark": "space" },
    h("span", { class: "tok", text: SPACE_MARK }), " a space (in every model's tokens)")];
  if (shade?.some((v) => v !== null)) {
    items.push(item("surprisal", "tok", "red underline: surprisal, −log p(token | the tokens before); darker = more " +
      "surprising", "--surprisal:0.8"));
  }
  if (meta.special.some(Boolean)) items.push(item("special", "[ ]", "special token"));
  if (meta.segments.some((s) => s === 1)) items.push(item("seg1", "B", "second sentence"));
  if (meta.mask_tokens.length) items.push(item("masked", "tok", "masked as a key"));
  if (st.pin !== null && st.pin < meta.tokens.length) items.push(item("pinned", "tok", "pinned query"));
  if (generated !== null) items.push(item("generated", "tok", "generated"));
  replace(container, items);
}

/** No text, no chips (and the next answer draws them afresh). */
export function clearChips(container) {
  replace(container);
  container._drawn = null;
}
