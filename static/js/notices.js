// The lines round the view that say what happened: the status line, the error box, the what-if banner, the
// model's warnings and the token count line.
import { ApiError } from "./api.js";
import { $, h, replace } from "./dom.js";
import { ownMask } from "./matrix.js";
import { fmtBytes, fmtMs } from "./scale.js";

export function setStatus(text) {
  $("status").textContent = text;
}

export function showError(err) {
  const box = $("error");
  box.textContent = err instanceof ApiError
    ? `The server refused: ${err.detail}` + (err.status ? ` (HTTP ${err.status})` : "")
    : `Something went wrong: ${err.message}`;
  box.hidden = false;
  setStatus("Not drawn: the reason is below.");
}

export function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

/** No text to run: nothing to say about a run, only how to start one. */
export function showNoText() {
  $("whatif").hidden = $("warnings").hidden = true;
  $("token-info").textContent = "";
  setStatus("Type some text and press Run.");
}

/** The what-if banner: shown whenever the run's mask is not the model's own. */
export function showWhatIf(meta, info) {
  const parts = [];
  if (meta.causal !== (info.kind === "decoder")) {
    parts.push(info.kind === "decoder"
      ? `${info.title} is a causal model; here its mask is switched off, so every token also sees the tokens after it.`
      : `${info.title} was trained without a causal mask; here it is applied in every layer, so each token sees only itself and the tokens before it.`);
  }
  const m = meta.mask_tokens;
  if (m.length) parts.push(`Token${m.length > 1 ? "s" : ""} ${m.join(", ")} ${m.length > 1 ? "are" : "is"} hidden as keys from every other query, and the model re-ran without ${m.length > 1 ? "them" : "it"}.`);
  const box = $("whatif");
  box.hidden = ownMask(meta, info);
  box.textContent = box.hidden ? "" : `What-if: ${parts.join(" ")} Every view shows this run, not the model's own weights; white cells are masked (weight exactly 0).`;
}

export function showWarnings(meta) {
  const box = $("warnings");
  replace(box, (meta.warnings || []).map((w) => h("p", { text: `Warning: ${w}` })));
  box.hidden = !(meta.warnings || []).length;
}

export function showTokenInfo(meta, st, info) {
  const parts = meta.stack   // an encoder-decoder: the chips are the queries of the attention shown (encdec.js)
    ? [`${meta.encoder.tokens.length} encoder tokens`, `${meta.decoder.tokens.length} decoder tokens`,
      `the chips are the ${meta.stack.queries}'s tokens (the queries of the ${meta.stack.title.toLowerCase()})`]
    : [`${meta.tokens.length} tokens`];
  if (meta.truncated) parts.push(`input truncated to the model's ${info.max_tokens}-token limit`);
  if (meta.mask_tokens.length) parts.push(`${meta.mask_tokens.length} masked as keys (${meta.mask_tokens.join(", ")})`);
  if (st.pin !== null && st.pin < meta.tokens.length) parts.push(`token ${st.pin} pinned`);
  $("token-info").textContent = parts.join(" · ");
}

/** The status line of a drawn view: the model, the run's time, the time to draw since `started`, the data. */
export function showDrawn(info, meta, results, started) {
  const bytes = [meta, ...results].reduce((s, r) => s + (r.bytes || 0), 0);
  setStatus(`${info.title} · ${meta.tokens.length} tokens · model run ${fmtMs(meta.timing_ms.model)} · ` +
    `drawn in ${fmtMs(performance.now() - started)} · ${fmtBytes(bytes)} of data` +
    (meta.provider ? ` · ${meta.provider.replace("ExecutionProvider", "")}` : ""));
}
