// The knocked-out heads bar: each knocked-out head as a button that restores it, what replaces their output
// (zeros or their mean) and "Restore all heads". Heads are knocked out in the model view (shift+click or K).
import { $, h, replace } from "./dom.js";
import { toggledHead } from "./state.js";

export function showAblation(st, go) {
  const bar = $("ablation-bar");
  bar.hidden = st.ablate.length === 0;
  $("ablation").value = st.ablation;
  replace($("ablation-list"), h("strong", { text: "Knocked out: " }), st.ablate.map((x) => {
    const [l, hd] = x.split(".").map(Number);
    return h("button", { type: "button", class: "small chip-ablated", title: "Restore this head",
      "aria-label": `Restore layer ${l} head ${hd}`, onclick: () => go({ ablate: toggledHead(st.ablate, l, hd) }),
      text: `L${l}H${hd} ×` });
  }));
}

export function wireAblation(go) {
  $("clear-ablate").addEventListener("click", () => go({ ablate: [] }));
  $("ablation").addEventListener("change", (e) => go({ ablation: e.target.value }));
}
