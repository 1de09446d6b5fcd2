// The first screen: on a fresh visit (no text, layer or head in the address) the head shown is chosen by measurement on
// the text, the one with the clearest pattern (clearestHead); the bar offers example texts for the model (the boot
// block's examples: an indirect-object sentence, a repeated text for induction, a garden-path sentence...).
import { BOOT } from "./boot.js";
import { $, h, replace } from "./dom.js";

/** The (layer, head) whose pattern is clearest in an answer's summary (GET /api/attention's per-head statistics):
 *  low entropy (sharp rows) and little weight parked on the first or last token (the attention sinks) or on the
 *  query itself (a plain diagonal): both draw a dull stripe. Scored (1 − mean entropy / ln T) × (1 − the largest of
 *  those masses); null without a summary. */
export function clearestHead(summary, T) {
  if (!summary?.mean_entropy) return null;
  const lnT = Math.log(Math.max(T, 2));
  let best = null;
  summary.mean_entropy.forEach((row, l) => row.forEach((ent, hd) => {
    const sink = Math.max(summary.first_token_mass?.[l][hd] ?? 0, summary.last_token_mass?.[l][hd] ?? 0,
      summary.diagonal_mass?.[l][hd] ?? 0);
    const score = (1 - ent / lnT) * (1 - sink);
    if (best === null || score > best.score) best = { layer: l, head: hd, score };
  }));
  return best;
}

/** The examples offered for model info: those of its kind (and pairs only where it takes one). */
const examplesFor = (info) => BOOT.examples.filter((e) => e.kinds.includes(info.kind) && (!e.text_pair || info.pair));

/** Fill the Examples menu for model info. */
export function syncExamples(info) {
  const select = $("examples");
  if (select.dataset.model === info.id) return;
  select.dataset.model = info.id;
  const list = examplesFor(info);
  $("examples-field").hidden = !list.length;
  replace(select, h("option", { value: "", text: "choose a text…" }),
    list.map((e) => h("option", { value: e.id, text: e.label, title: e.text })));
}

/** An example chosen: it becomes the page's text (and second sentence), the boxes with it. */
export function wireExamples(go, models, current) {
  $("examples").addEventListener("change", (e) => {
    const ex = BOOT.examples.find((x) => x.id === e.target.value);
    e.target.value = "";
    if (!ex) return;
    const info = models[current().model];
    const patch = { text: ex.text, text_pair: info.pair ? ex.text_pair ?? "" : "", pin: null, why: null,
      mask_tokens: [], prompt: "", ...(ex.decoder_text !== undefined ? { decoder_text: ex.decoder_text } : {}) };
    $("text").value = patch.text;
    $("text-pair").value = patch.text_pair;
    go(patch);
  });
}
