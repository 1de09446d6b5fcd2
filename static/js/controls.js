// The controls above the view mirror the state, and a change to one is a state change (go): the model and its
// description, layer and head, the causal mask, special tokens, what a click on a token does, the statistic, the
// colour scale, the sentence-pair filter, "Unmask all" and "Large text".
import { BOOT, MODELS } from "./boot.js";
import { $, h, replace } from "./dom.js";
import { isEncDec } from "./encdec.js";
import { PAIR_FILTERS } from "./matrix.js";
import { labelHeads, showExplanation } from "./roles.js";
import { SCALE_MODES, SCALE_NAME, SIGNED_MODES } from "./scale.js";
import * as state from "./state.js";

/** The views whose difference or score maps take the signed-scale choice (state.signed). */
const SIGNED_VIEWS = new Set(["compare", "circuits"]);

/** The "Hide special tokens" box names the run's own special tokens ([CLS] / [SEP], <bos>...), and is not offered
 *  when the run has none. */
export function syncHideSpecial(meta) {
  const names = [...new Set(meta.tokens.filter((_, i) => meta.special?.[i]))];
  $("hide-special-field").hidden = !names.length;
  $("hide-special-label").textContent = `Hide ${names.slice(0, 3).join(" / ")}${names.length > 3 ? " …" : ""}`;
}

/** Statistics that need a sentence pair: disabled in the menu for a single text. */
const PAIR_STATS = new Set(BOOT.stats.filter((x) => x.pair_only).map((x) => x.id));

function options(select, n, label, suffix = () => "") {
  const text = (i) => `${label} ${i}${suffix(i)}`;
  if (select.options.length === n && [...select.options].every((o, i) => o.text === text(i))) return;
  replace(select, [...Array(n).keys()].map((i) => h("option", { value: i, text: text(i) })));
}

/** " (local)" after a sliding-window layer's number (Gemma 2 and 3), "" after a global one. */
const localSuffix = (info) => (l) => ((info.local_layers || []).includes(l) ? " (local)" : "");

function textHint(info) {
  return `Press Run (or Ctrl+Enter in either box). Texts are cut at ${info.max_tokens} tokens` +
    (info.trained_tokens && info.max_tokens > info.trained_tokens
      ? ` (it was trained on ${info.trained_tokens}: longer answers carry a warning).`
      : info.trained_tokens ? ", the length it was trained on." : ".");
}

function causalHint(info, causal) {
  return info.kind === "decoder"
    ? (causal ? "(the model's own setting)" : "(what-if: off for a causal model)")
    : (causal ? "(what-if: this encoder was trained without it)" : "");
}

/** Set every control to the state st of model info. */
export function syncControls(st, info) {
  $("model").value = st.model;
  $("model-desc").textContent = info.description;
  $("text-hint").textContent = textHint(info);
  $("pair-field").hidden = !info.pair;
  // an encoder-decoder: its decoder text and which of its three attentions; what reads one stack's run is hidden
  const encdec = isEncDec(info);
  $("decoder-field").hidden = $("attention-field").hidden = $("attention-note").hidden = !encdec;
  $("attention").value = st.attention;
  $("causal-field").hidden = $("click-mode").hidden = $("generate").hidden = encdec;
  options($("layer"), info.layers, "layer", localSuffix(info));
  options($("head"), info.heads, "head");
  $("layer").value = st.layer;
  $("head").value = st.head;
  labelHeads($("head"), info, st.layer);            // the teaching models' head roles
  showExplanation($("model-explanation"), info);
  const causal = st.causal ?? info.kind === "decoder";
  $("causal").checked = causal;
  $("causal-hint").textContent = causalHint(info, causal);
  $("hide-special").checked = st.hide_special;
  for (const r of document.querySelectorAll("input[name=click]")) r.checked = r.value === st.click;
  $("stat").value = st.stat;
  $("stat-field").hidden = st.view !== "summary";
  const pair = info.pair && Boolean(st.text_pair.trim());
  for (const o of $("stat").options) o.disabled = PAIR_STATS.has(o.value) && !pair;
  $("scale").value = st.scale;
  $("signed").value = st.signed;
  $("signed-field").hidden = !SIGNED_VIEWS.has(st.view);
  $("pairs").value = st.pairs;
  $("pairs-field").hidden = !pair || !["head", "lines"].includes(st.view);
  $("clear-mask").hidden = st.mask_tokens.length === 0;
  $("large-toggle").setAttribute("aria-pressed", String(st.large));
  document.documentElement.classList.toggle("large", st.large);
}

/** Fill the menus the page builds itself, and turn each control's change into go(patch). draft (draft.js): a
 *  model change keeps an edited second sentence. chooseHead(): the next run's answer chooses the head, as on a
 *  fresh visit (main.js): a model change opens the new model's clearest head on the text, never the old model's
 *  (a head of one model is nothing in particular in another). */
export function wireControls(go, draft, chooseHead) {
  $("model").addEventListener("change", (e) => {
    const info = MODELS[e.target.value];
    const st = state.get();
    const pairText = draft.edited ? $("text-pair").value : st.text_pair;
    chooseHead();
    go({ model: info.id, layer: Math.min(st.layer, info.layers - 1), head: Math.min(st.head, info.heads - 1),
      mask_tokens: [], pin: null, why: null, causal: null, heads: null, ablate: [], text_pair: info.pair ? pairText : "" });
  });
  $("layer").addEventListener("change", (e) => go({ layer: Number(e.target.value) }));
  // the queries change with the attention (encoder or decoder tokens): a pinned row is let go
  $("attention").addEventListener("change", (e) => go({ attention: e.target.value, pin: null }));
  $("head").addEventListener("change", (e) => go({ head: Number(e.target.value) }));
  $("causal").addEventListener("change", (e) => {
    const info = MODELS[state.get().model];
    go({ causal: e.target.checked === (info.kind === "decoder") ? null : e.target.checked });
  });
  $("hide-special").addEventListener("change", (e) => go({ hide_special: e.target.checked }));
  for (const r of document.querySelectorAll("input[name=click]")) {
    r.addEventListener("change", (e) => go({ click: e.target.value }));
  }
  $("clear-mask").addEventListener("click", () => go({ mask_tokens: [] }));
  $("stat").addEventListener("change", (e) => go({ stat: e.target.value }));
  $("scale").addEventListener("change", (e) => go({ scale: e.target.value }));
  $("signed").addEventListener("change", (e) => go({ signed: e.target.value }));
  $("pairs").addEventListener("change", (e) => go({ pairs: e.target.value }));
  $("large-toggle").addEventListener("click", () => go({ large: !state.get().large }));
  replace($("scale"), SCALE_MODES.map(([v, label]) => h("option", { value: v, text: label })));
  replace($("signed"), SIGNED_MODES.map(([v, label]) => h("option", { value: v, text: label })));
  replace($("pairs"), PAIR_FILTERS.map(([v, label]) => h("option", { value: v, text: label })));
  $("scale-name").textContent = SCALE_NAME;
}
