// The token strip: one chip per token. A click pins the token's row or masks it as a key
// (the "Clicking a token" switch); keyboard: arrows / Home / End move, Enter pins or masks,
// "m" always toggles the mask, "p" always pins.
import { h, replace, rove, SPACE_MARK, tokenLabel } from "./dom.js";

const VIRTUAL_TOKENS = 4096;      // more tokens than this (past the whole-matrix head view): only the rows in view are in the page

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
  const chip = (i) => {
    const tok = meta.tokens[i], special = meta.special[i], isMasked = masked.has(i), pinned = st.pin === i;
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
  };
  const keys = (e, chips, i) => {
    if (e.key === "m" || e.key === "M") {
      e.preventDefault();
      act(i, "mask");
    } else if (e.key === "p" || e.key === "P") {
      e.preventDefault();
      act(i, "pin");
    }
  };
  if (meta.tokens.length > VIRTUAL_TOKENS) {
    virtualChips(container, meta, chip, focusIndex, hadFocus, keys);
    return;
  }
  container.classList.remove("virtual");
  delete container.dataset.virtual;
  container.onscroll = null;
  const chips = meta.tokens.map((_, i) => chip(i));
  replace(container, chips);
  container.onkeydown = (e) => {
    const i = Number(e.target.dataset?.index);
    if (Number.isNaN(i)) return;
    if (rove(e, chips, i)) return;
    keys(e, chips, i);
  };
  if (hadFocus !== null && chips[hadFocus]) chips[hadFocus].focus();
}

/** A long text's chips (issue 48: 32,768 tokens), virtualised: the tokens are packed into rows of the strip's width
 *  (each chip's width measured on a canvas in the chips' font), the strip scrolls over all the rows, and only the rows
 *  in view (and a few either side) are in the page; they are drawn again as it scrolls. The keys move through every
 *  token, bringing its row into view. */
function virtualChips(container, meta, chip, focusIndex, hadFocus, keys) {
  container.classList.add("virtual");
  container.dataset.virtual = "1";
  const probe = chip(0);
  replace(container, probe);
  const cs = getComputedStyle(probe), rowH = probe.offsetHeight + 4;
  const g = document.createElement("canvas").getContext("2d");
  g.font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  const tokPx = (i) => g.measureText(tokenLabel(meta.tokens[i])).width;
  const idx = probe.querySelector(".idx"), idxFont = parseFloat(getComputedStyle(idx).fontSize);
  const extra = probe.offsetWidth - probe.querySelector(".tok").offsetWidth - idx.offsetWidth;   // padding, gap, border
  const room = Math.max(200, container.clientWidth - 10);
  const starts = [0];                                       // the first token of each row
  for (let i = 0, x = 0; i < meta.tokens.length; i++) {
    const w = tokPx(i) * 1.06 + String(i).length * idxFont * 0.62 + extra + 4;
    if (x > 0 && x + w > room) { starts.push(i); x = 0; }
    x += w;
  }
  const rowOf = (i) => { let lo = 0, hi = starts.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (starts[mid] <= i) lo = mid; else hi = mid - 1; } return lo; };
  const spacer = h("div", { class: "chips-spacer", style: `height:${starts.length * rowH}px` });
  replace(container, spacer);
  container.dataset.rows = String(starts.length);
  let shown = "";
  const draw = () => {
    const first = Math.max(0, Math.floor(container.scrollTop / rowH) - 4);
    const last = Math.min(starts.length, Math.ceil((container.scrollTop + container.clientHeight) / rowH) + 4);
    if (shown === `${first}-${last}`) return;
    shown = `${first}-${last}`;
    replace(spacer, [...Array(last - first).keys()].map((k) => {
      const r = first + k, end = r + 1 < starts.length ? starts[r + 1] : meta.tokens.length;
      return h("div", { class: "chip-row", style: `top:${r * rowH}px` },
        [...Array(end - starts[r]).keys()].map((j) => chip(starts[r] + j)));
    }));
  };
  const focus = (i) => {
    const r = rowOf(i);
    if (r * rowH < container.scrollTop || (r + 1) * rowH > container.scrollTop + container.clientHeight) {
      container.scrollTop = Math.max(0, r * rowH - container.clientHeight / 2);
    }
    draw();
    const el = container.querySelector(`.chip[data-index="${i}"]`);
    container.querySelectorAll('.chip[tabindex="0"]').forEach((c) => c.setAttribute("tabindex", "-1"));
    el?.setAttribute("tabindex", "0");
    el?.focus();
  };
  container.onscroll = draw;
  container.onkeydown = (e) => {
    const i = Number(e.target.dataset?.index);
    if (Number.isNaN(i)) return;
    const n = meta.tokens.length, step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[e.key];
    const to = e.key === "Home" ? 0 : e.key === "End" ? n - 1 : step ? i + step : null;
    if (to !== null) {
      e.preventDefault();
      focus(Math.max(0, Math.min(n - 1, to)));
      return;
    }
    keys(e, null, i);
  };
  draw();
  if (hadFocus !== null) focus(hadFocus);
  else if (focusIndex > 0) container.scrollTop = Math.max(0, rowOf(focusIndex) * rowH - container.clientHeight / 2);
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
