// Wiring: URL state -> controls, fetches (through api.js) -> the active view's render().
//
// The view contract: each module in views/ exports
//   title, help            strings shown above the view
//   requests(st, info, meta) -> [{endpoint, ...body}]   what to fetch (merged with the run's options)
//   needsMeta              optional: true when requests() needs the tokens (meta) first
//   render(container, {meta, results}, st, ctx) -> exports
//                          a pure function of (data, state) drawing into its container; ctx gives
//                          info (the model), boot, go/href (state changes and links), font, large, plot();
//                          colours come from scale.js (the fixed 0–1 rule, st.scale), masks from matrix.js;
//                          exports = {name, plot | svg | canvas, csv(), json()} for the export buttons.
import * as api from "./api.js";
import { renderChips } from "./chips.js";
import { renderPredictions, surprisal } from "./predictions.js";
import { h, replace } from "./dom.js";
import { canvasToPng, download, downloadCSV, downloadJSON, svgBlob, svgToPng } from "./export.js";
import { longRun, ownMask, PAIR_FILTERS, runOptions } from "./matrix.js";
import { plot } from "./plot.js";
import { fmtBytes, fmtMs, SCALE_MODES, SCALE_NAME } from "./scale.js";
import { syncLesson } from "./lesson.js";
import { syncPresent, wirePresent } from "./present.js";
import { labelHeads, showExplanation } from "./roles.js";
import * as state from "./state.js";
import * as head from "./views/head.js";
import * as lines from "./views/lines.js";
import * as model from "./views/model.js";
import * as summary from "./views/summary.js";
import * as entropy from "./views/entropy.js";
import * as stages from "./views/stages.js";
import * as compare from "./views/compare.js";
import * as corpus from "./views/corpus.js";

const $ = (id) => document.getElementById(id);

// ---- what the server offers: models, views and statistics, from the page's JSON boot block -------------
const BOOT = JSON.parse($("boot").textContent);
const MODULES = { head, lines, model, summary, entropy, stages, compare, corpus };
const VIEWS = Object.fromEntries(BOOT.views.map((v) => [v.id, MODULES[v.id]]));
const MODELS = Object.fromEntries(BOOT.models.map((m) => [m.id, m]));
state.configure({ model: BOOT.default_model, text: BOOT.example_text },
  { views: BOOT.views.map((v) => v.id), stats: BOOT.stats.map((s) => s.id) });

/** Clamp a state to what the model offers; returns [state, changed]. */
function normalize(st) {
  const fixed = { ...st };
  if (!MODELS[fixed.model]) fixed.model = BOOT.default_model;
  const info = MODELS[fixed.model];
  fixed.layer = Math.min(fixed.layer, info.layers - 1);
  fixed.head = Math.min(fixed.head, info.heads - 1);
  if (fixed.heads) fixed.heads = fixed.heads.filter((x) => x < info.heads);
  fixed.ablate = fixed.ablate.filter((x) => { const [l, hd] = x.split(".").map(Number); return l < info.layers && hd < info.heads; });
  if (!info.pair) fixed.text_pair = "";
  if (!state.STEP_TOKENS.includes(fixed.n)) fixed.n = 12;
  if (fixed.step > stages.STEPS.length) fixed.step = 0;
  const changed = JSON.stringify(fixed) !== JSON.stringify(st);
  return [fixed, changed];
}

// ---- controls -------------------------------------------------------------------------------------
function options(select, n, label) {
  if (select.options.length === n) return;
  replace(select, [...Array(n).keys()].map((i) => h("option", { value: i, text: `${label} ${i}` })));
}

function syncControls(st, info) {
  $("model").value = st.model;
  $("model-desc").textContent = info.description;
  if (!draft.edited) {                       // an edited text is never overwritten: it stays, marked pending
    $("text").value = st.text;
    $("text-pair").value = st.text_pair;
  }
  showDraft();
  $("text-hint").textContent = `Press Run (or Ctrl+Enter in either box). Texts are cut at ${info.max_tokens} tokens` +
    (info.trained_tokens && info.max_tokens > info.trained_tokens
      ? ` (it was trained on ${info.trained_tokens}: longer answers carry a warning).`
      : info.trained_tokens ? ", the length it was trained on." : ".");
  $("pair-field").hidden = !info.pair;
  options($("layer"), info.layers, "layer");
  options($("head"), info.heads, "head");
  $("layer").value = st.layer;
  $("head").value = st.head;
  labelHeads($("head"), info, st.layer);            // the teaching models' head roles
  showExplanation($("model-explanation"), info);
  const causal = st.causal ?? info.kind === "decoder";
  $("causal").checked = causal;
  $("causal-hint").textContent = info.kind === "decoder"
    ? (causal ? "(the model's own setting)" : "(what-if: off for a causal model)")
    : (causal ? "(what-if: this encoder was trained without it)" : "");
  $("hide-special").checked = st.hide_special;
  for (const r of document.querySelectorAll("input[name=click]")) r.checked = r.value === st.click;
  $("stat").value = st.stat;
  $("stat-field").hidden = st.view !== "summary";
  const pair = info.pair && Boolean(st.text_pair.trim());
  for (const o of $("stat").options) o.disabled = PAIR_STATS.has(o.value) && !pair;
  $("scale").value = st.scale;
  $("pairs").value = st.pairs;
  $("pairs-field").hidden = !pair || !["head", "lines"].includes(st.view);
  $("clear-mask").hidden = st.mask_tokens.length === 0;
  $("large-toggle").setAttribute("aria-pressed", String(st.large));
  document.documentElement.classList.toggle("large", st.large);
  const titles = Object.fromEntries(Object.entries(VIEWS).map(([id, v]) => [id, v.title]));
  syncPresent($("present-bar"), st, { views: Object.keys(VIEWS), titles, go });
  syncLesson($("lesson"), $("lesson-link"), st, { href: state.href, go, models: MODELS });
  for (const a of document.querySelectorAll("#tabs a")) {
    a.href = state.href({ view: a.dataset.view });
    if (a.dataset.view === st.view) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const view = VIEWS[st.view];
  $("view-title").textContent = view.title;
  $("view-help").textContent = view.help;
  for (const el of document.querySelectorAll(".view")) el.hidden = el.dataset.view !== st.view;
  document.title = `${view.title} · ${st.text.slice(0, 40)} · attnscope`;
}

// ---- status and errors ------------------------------------------------------------------------------
function setStatus(text) {
  $("status").textContent = text;
}

function showError(err) {
  const box = $("error");
  box.textContent = err instanceof api.ApiError
    ? `The server refused: ${err.detail}` + (err.status ? ` (HTTP ${err.status})` : "")
    : `Something went wrong: ${err.message}`;
  box.hidden = false;
  setStatus("");
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

/** The what-if banner: shown whenever the run's mask is not the model's own. */
function showWhatIf(meta, info) {
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

function showWarnings(meta) {
  const box = $("warnings");
  replace(box, (meta.warnings || []).map((w) => h("p", { text: `Warning: ${w}` })));
  box.hidden = !(meta.warnings || []).length;
}

function tokenInfo(meta, st) {
  const parts = [`${meta.tokens.length} tokens`];
  if (meta.truncated) parts.push(`input truncated to the model's ${MODELS[st.model].max_tokens}-token limit`);
  if (meta.mask_tokens.length) parts.push(`${meta.mask_tokens.length} masked as keys (${meta.mask_tokens.join(", ")})`);
  if (st.pin !== null && st.pin < meta.tokens.length) parts.push(`token ${st.pin} pinned`);
  $("token-info").textContent = parts.join(" · ");
}

// ---- a long run's progress: the bar appears once a run has taken over a second -------------------------
const PROGRESS_AFTER_MS = 1000;
const progress = { timer: 0, done: 0, layers: 0 };

function drawProgress() {
  const bar = $("run-progress-bar");
  if (progress.layers) bar.value = progress.done / progress.layers;
  else bar.removeAttribute("value");                   // no layer done yet: an indeterminate bar
  $("run-progress-label").textContent = progress.layers
    ? `Running the model: layer ${progress.done} of ${progress.layers}` : "Running the model…";
}

function startProgress() {
  clearTimeout(progress.timer);
  Object.assign(progress, { done: 0, layers: 0 });
  $("run-progress").hidden = true;
  progress.timer = setTimeout(() => {
    const box = $("run-progress");
    box.hidden = false;
    box.dataset.shown = String(Number(box.dataset.shown || 0) + 1);   // for tests: the bar was seen
    drawProgress();
  }, PROGRESS_AFTER_MS);
}

function stopProgress() {
  clearTimeout(progress.timer);
  $("run-progress").hidden = true;
}

/** One progress line of a streamed run: {layer, layers}, layer = the number of layers done. Several requests
 *  of one update may stream; the bar shows the furthest. */
api.onProgress(({ layer, layers }) => {
  if (layers > 0 && (layer / layers) >= (progress.layers ? progress.done / progress.layers : 0)) {
    Object.assign(progress, { done: layer, layers });
    if (!$("run-progress").hidden) drawProgress();
  }
});

// ---- drafts: an edited text is never thrown away ------------------------------------------------------
// Changing any control after editing the text runs the new text; a click on a token (which names a token of
// the text already run) leaves the edit pending, and it is marked as such until it runs.
const PAIR_STATS = new Set(BOOT.stats.filter((x) => x.pair_only).map((x) => x.id));
const draft = { edited: false };

function pending() {
  const st = state.get();
  return $("text").value !== st.text || (MODELS[st.model].pair && $("text-pair").value !== st.text_pair);
}

function showDraft() {
  if (draft.edited && !pending()) draft.edited = false;
  $("draft-note").hidden = !draft.edited;
}

/** state.go, carrying an edited text along unless the change names a token of the old one (a pin, a mask). */
function go(patch, opts) {
  const byToken = (patch.pin !== undefined && patch.pin !== null) || patch.mask_tokens?.length;
  const next = draft.edited && pending() && !byToken
    ? { text: $("text").value, text_pair: $("text-pair").value, mask_tokens: [], pin: null, ...patch } : patch;
  return state.go(next, opts);
}

// ---- the update loop ----------------------------------------------------------------------------
let generation = 0;
const current = { exports: null };

function fetchAll(reqs, run, opts) {
  return Promise.all(reqs.map(({ endpoint, ...params }) => api[endpoint]({ ...run, ...params }, opts)));
}

async function update() {
  const [st, changed] = normalize(state.get());
  if (changed) return state.go(st, { replace: true });
  const info = MODELS[st.model];
  syncControls(st, info);
  const view = VIEWS[st.view];
  const container = document.querySelector(`.view[data-view="${st.view}"]`);
  const gen = ++generation;
  if (!st.text.trim()) {
    replace($("chips"));
    $("chips")._drawn = null;
    $("whatif").hidden = $("warnings").hidden = true;
    $("token-info").textContent = "";
    setStatus("Type some text and press Run.");
    return;
  }
  clearError();
  $("view-area").setAttribute("aria-busy", "true");
  setStatus("Running the model…");
  startProgress();
  const started = performance.now();
  const run = runOptions(st, info);
  const opts = { progress: longRun(st, info) };          // a long run streams its progress first
  try {
    // The per-view request does not depend on the tokens (except the line view's head limit), so
    // both go out together; the server runs the model once and shares the run. A long text runs layer by
    // layer and keeps only what its first request asks for: that request also asks for the model view's
    // thumbnails (a few ms a layer), and the view's requests wait for the run (a head is then recomputed from
    // the run's checkpoints in well under a second, instead of a second pass over every layer).
    const { include: thumbs, resolution, dtype } = model.requests()[0];
    const overview = opts.progress ? { resolution, dtype } : {};
    const metaP = api.attention({ ...run, ...overview, include: [...(opts.progress ? thumbs : []), "summary",
      ...(info.predictions ? ["predictions"] : []), ...(st.ablate.length ? ["effect"] : [])] }, opts);
    let dataP = view.needsMeta || opts.progress ? null : fetchAll(view.requests(st, info, null), run, opts);
    dataP?.catch(() => {});
    const meta = await metaP;
    if (gen !== generation) return;
    renderChips($("chips"), meta, st, go, surprisal(meta));
    renderPredictions($("predictions"), meta, st);
    showAblation(st);
    tokenInfo(meta, st);
    showWhatIf(meta, info);
    showWarnings(meta);
    dataP ??= fetchAll(view.requests(st, info, meta), run, opts);
    const results = await dataP;
    if (gen !== generation) return;
    const drawing = [];
    const large = st.large || st.present;
    const ctx = { info, boot: BOOT, go, href: state.href, large, font: large ? 18 : 13,
      plot: (el, data, layout) => drawing.push(plot(el, data, layout, ctx.font,
        `attnscope-${st.model}-${st.view}-L${st.layer}H${st.head}`)) };
    const shownState = { ...st, pin: st.pin !== null && st.pin < meta.tokens.length ? st.pin : null };
    current.exports = null;
    current.exports = view.render(container, { meta, results }, shownState, ctx);
    await Promise.all(drawing);
    if (gen !== generation) return;
    container.dataset.renders = String(Number(container.dataset.renders || 0) + 1);
    container.dataset.state = location.search;
    const bytes = [meta, ...results].reduce((s, r) => s + (r.bytes || 0), 0);
    setStatus(`${info.title} · ${meta.tokens.length} tokens · model run ${fmtMs(meta.timing_ms.model)} · ` +
      `drawn in ${fmtMs(performance.now() - started)} · ${fmtBytes(bytes)} of data` +
      (meta.provider ? ` · ${meta.provider.replace("ExecutionProvider", "")}` : ""));
    updateExportButtons();
  } catch (err) {
    if (gen !== generation) return;
    console.warn(err);
    showError(err);
  } finally {
    if (gen === generation) {
      stopProgress();
      $("view-area").setAttribute("aria-busy", "false");
    }
  }
}

// ---- knocked-out heads ---------------------------------------------------------------------------------
function showAblation(st) {
  const bar = $("ablation-bar");
  bar.hidden = st.ablate.length === 0;
  $("ablation").value = st.ablation;
  replace($("ablation-list"), h("strong", { text: "Knocked out: " }), st.ablate.map((x) => {
    const [l, hd] = x.split(".").map(Number);
    return h("button", { type: "button", class: "small chip-ablated", title: "Restore this head",
      "aria-label": `Restore layer ${l} head ${hd}`, onclick: () => go({ ablate: state.toggledHead(st.ablate, l, hd) }),
      text: `L${l}H${hd} ×` });
  }));
}

// ---- export ------------------------------------------------------------------------------------
function updateExportButtons() {
  const ex = current.exports || {};
  $("export-png").disabled = !(ex.plot || ex.svg || ex.canvas);
  $("export-svg").disabled = !(ex.plot || ex.svg);
  $("export-csv").disabled = !ex.csv;
  $("export-json").disabled = !ex.json;
}

async function exportAs(kind) {
  const ex = current.exports;
  if (!ex) return;
  try {
    if (kind === "csv") downloadCSV(ex.name, ex.csv());
    else if (kind === "json") downloadJSON(ex.name, ex.json());
    else if (ex.plot) await window.Plotly.downloadImage(ex.plot, { format: kind, filename: ex.name, scale: kind === "png" ? 2 : 1 });
    else if (ex.svg) download(`${ex.name}.${kind}`, kind === "svg" ? svgBlob(ex.svg) : await svgToPng(ex.svg));
    else if (ex.canvas && kind === "png") download(`${ex.name}.png`, await canvasToPng(ex.canvas()));
    setStatus(`Downloaded ${ex.name}.${kind}`);
  } catch (err) {
    showError(err);
  }
}

async function copyPermalink() {
  const url = location.href;
  try {
    await navigator.clipboard.writeText(url);
    setStatus("Permalink copied: it opens this exact view, text and settings.");
  } catch {
    const field = $("permalink-field");
    field.hidden = false;
    field.value = url;
    field.focus();
    field.select();
    setStatus("Copy the selected link (Ctrl+C).");
  }
}

// ---- events ---------------------------------------------------------------------------------------
function wire() {
  $("input-form").addEventListener("submit", (e) => {
    e.preventDefault();
    draft.edited = false;
    // the same text again re-runs anyway (answered from the cache)
    if (!state.go({ text: $("text").value, text_pair: $("text-pair").value, mask_tokens: [], pin: null })) update();
  });
  for (const box of [$("text"), $("text-pair")]) {
    box.addEventListener("input", () => { draft.edited = true; showDraft(); });
    box.addEventListener("keydown", (e) => {   // Ctrl/Cmd+Enter runs, from either box
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        $("input-form").requestSubmit();
      }
    });
  }
  $("model").addEventListener("change", (e) => {
    const info = MODELS[e.target.value];
    const st = state.get();
    const pairText = draft.edited ? $("text-pair").value : st.text_pair;
    go({ model: info.id, layer: Math.min(st.layer, info.layers - 1), head: Math.min(st.head, info.heads - 1),
      mask_tokens: [], pin: null, causal: null, heads: null, ablate: [], text_pair: info.pair ? pairText : "" });
  });
  $("layer").addEventListener("change", (e) => go({ layer: Number(e.target.value) }));
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
  $("clear-ablate").addEventListener("click", () => go({ ablate: [] }));
  $("ablation").addEventListener("change", (e) => go({ ablation: e.target.value }));
  $("stat").addEventListener("change", (e) => go({ stat: e.target.value }));
  $("scale").addEventListener("change", (e) => go({ scale: e.target.value }));
  $("pairs").addEventListener("change", (e) => go({ pairs: e.target.value }));
  $("large-toggle").addEventListener("click", () => go({ large: !state.get().large }));
  $("copy-link").addEventListener("click", copyPermalink);
  wirePresent($("present-toggle"), { get: state.get, go, views: Object.keys(VIEWS) });
  for (const kind of ["png", "svg", "csv", "json"]) $(`export-${kind}`).addEventListener("click", () => exportAs(kind));
  $("tabs").addEventListener("click", (e) => {
    const a = e.target.closest("a[data-view]");
    if (!a || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    go({ view: a.dataset.view });
  });
  replace($("scale"), SCALE_MODES.map(([v, label]) => h("option", { value: v, text: label })));
  replace($("pairs"), PAIR_FILTERS.map(([v, label]) => h("option", { value: v, text: label })));
  $("scale-name").textContent = SCALE_NAME;
  state.subscribe(update);
}

wire();
// write the full state into the URL (so the first permalink is complete), then draw
if (!state.go({}, { replace: true })) update();
