// The page's update loop: URL state -> controls -> fetch (api.js) -> the active view's render(). Everything else
// has a module of its own, which this one ties together: controls.js (the controls above the view), frame.js
// (tabs, heading, classroom bar, lesson), draft.js (the text boxes: an edited text is never lost), progress.js,
// notices.js (status, errors, banners), ablation.js, exporting.js, permalink.js, generate.js (the Generate control:
// while a generation streams, each new token redraws the page from the prompt's answer grown by the tokens so far,
// through the same render path). The page's global listeners (keydown, resize, popstate) are all here, and go to the
// active view through its optional hooks.
//
// The view contract: each module in views/ exports
//   title, help            strings shown above the view
//   requests(st, info, meta) -> [{endpoint, soft?, ...body}]   what to fetch (merged with the run's options); a
//                          soft request's refusal is its result ({error}) instead of the view's error
//   needsMeta              optional: true when requests() needs the tokens (meta) first
//   render(container, {meta, results}, st, ctx) -> exports
//                          a pure function of (data, state) drawing into its container; ctx gives
//                          info (the model), boot, go/href (state changes and links), font, large, plot(), and
//                          memory: the view's page memory (what is not in the URL, e.g. an opened file), the same
//                          object on every render; colours come from scale.js (the fixed 0–1 rule, st.scale),
//                          masks from matrix.js; exports = {name, plot | svg | canvas, csv(), json()} for the
//                          export buttons. No module-level state, no global listeners: those are here.
//   onKey(event, container, st, ctx)      optional: a key pressed anywhere while the view shows (before the
//                                         classroom layout's keys; preventDefault() keeps it from them)
//   nextTokenPick(st, go) optional: {marks: {token: class}, choose(token, event), hint} makes the panel's
//                          next tokens buttons while the view shows (the effects view picks its target there)
//   sketch(data, st)      optional: true when its first picture may be drawn before plotly.js has run: its
//                          render then gets ctx.sketching, and ctx.plot paints a canvas (plot.js sketch) that
//                          Plotly's figure replaces; listeners on the Plotly figure wait for the real render
//   onResize(container, st, ctx)          optional: the window was resized while the view shows
//                          (the hooks get the container, state and ctx of the view's last render)
import { showAblation, wireAblation } from "./ablation.js";
import * as api from "./api.js";
import { ableModels, BOOT, can, MODELS, whyNot } from "./boot.js";
import { clearChips, renderChips, renderChipsLegend } from "./chips.js";
import { syncControls, syncHideSpecial, wireControls } from "./controls.js";
import { $, h, replace } from "./dom.js";
import { createDraft } from "./draft.js";
import { clearestHead, syncExamples, wireExamples } from "./first.js";
import { isEncDec, stackAnswer, stackMeta } from "./encdec.js";
import { showExports, wireExports } from "./exporting.js";
import { syncFrame, syncTabs, wireFrame } from "./frame.js";
import { createGeneration, generatedFrom } from "./generate.js";
import { estimate, rateOf, showLength, tooLong } from "./length.js";
import { lessonState } from "./lesson.js";
import { grownAnswer, grownMeta, longText, runOptions } from "./matrix.js";
import * as notices from "./notices.js";
import { wirePermalink } from "./permalink.js";
import { plot, plotlyReady, sketch } from "./plot.js";
import { renderPredictions, surprisal } from "./predictions.js";
import { presentKey } from "./present.js";
import { createProgress } from "./progress.js";
import * as state from "./state.js";
import * as head from "./views/head.js";
import * as lines from "./views/lines.js";
import * as model from "./views/model.js";
import * as summary from "./views/summary.js";
import * as entropy from "./views/entropy.js";
import * as stages from "./views/stages.js";
import * as compare from "./views/compare.js";
import * as corpus from "./views/corpus.js";
import * as effects from "./views/effects.js";
import * as lens from "./views/lens.js";
import * as circuits from "./views/circuits.js";
import * as atlas from "./views/atlas.js";
import * as cache from "./views/cache.js";

// ---- the views the server offers, and what the page keeps ------------------------------------------------
const MODULES = { head, lines, model, summary, entropy, stages, compare, corpus, effects, lens, circuits, atlas, cache };
const VIEWS = Object.fromEntries(BOOT.views.map((v) => [v.id, MODULES[v.id]]));
state.configure({ model: BOOT.default_model, text: BOOT.example_text },
  { views: BOOT.views.map((v) => v.id), stats: BOOT.stats.filter((s) => !s.corpus_only).map((s) => s.id), ablations: BOOT.ablations.map((a) => a.id),
    sites: BOOT.sites.map((s) => s.id), directions: BOOT.directions.map((d) => d.id),
    attentions: BOOT.attentions.map((a) => a.id) });

const draft = createDraft();
const go = draft.go;                       // every state change carries an edited text along (draft.js)
const progress = createProgress();
const memory = Object.fromEntries(Object.keys(VIEWS).map((id) => [id, {}]));   // each view's page memory
let generation = 0;                        // the update now running: an older one's answers are dropped
let drawn = null;                          // the last render: {id, view, container, st, ctx, exports}
let drawnSearch = null;                    // the address of the state last drawn: what a cancel goes back to
let cancelledTo = null;                    // the address a cancel went back to: its drawing says "Cancelled"
// a lesson link that names only its page (the header's "Lesson", /?lesson=1, with present=1 or large=1) opens that
// page's own model, text, view, layer and head (lesson.js lessonState); what else the address names stays
const lessonLink = (() => {
  const q = new URLSearchParams(location.search), page = lessonState(Number(q.get("lesson")));
  if (!page || q.has("model") || q.has("text")) return null;
  const named = state.get();
  return { ...page, ...Object.fromEntries([...q.keys()].filter((k) => k in named).map((k) => [k, named[k]])) };
})();
// a fresh visit (no text, layer or head in the address: the example text), and a model switch (controls.js): the
// next answer chooses the head (first.js clearestHead); a link that names its text (or a lesson page) shows what it
// names
let measureHead = !lessonLink && !["text", "layer", "head"].some((k) => new URLSearchParams(location.search).has(k));
const generator = createGeneration({ go, redraw, target: streamTarget });
const rates = {};                          // model -> its runs' rate on this page (length.js rateOf): a long run's estimate
const perToken = {};                       // model -> bytes a token of its last long run's answers took (the same)
let read = null;                           // the last run's text and model, and its tokens: the tabs a length refuses
const sameText = (st) => read && read.model === st.model && read.text === st.text && read.pair === st.text_pair;

// ---- the update loop --------------------------------------------------------------------------------
function fetchAll(reqs, run, opts) {
  return Promise.all(reqs.map(({ endpoint, soft, ...params }) => {
    const answer = endpoint in api.ANALYSES ? api.analysis(endpoint, { ...run, ...params }, opts)
      : api[endpoint]({ ...run, ...params }, opts);          // the corpus jobs' own: jobs, atlas
    return soft ? answer.catch((error) => ({ error })) : answer;
  }));
}

/** The run's first request: the tokens and what every view shows round the view (summary, next tokens, the
 *  effect of knocked-out heads). The per-view request does not depend on the tokens (except the line view's head
 *  limit), so both go out together; the server runs the model once and shares the run. A long text runs layer by
 *  layer and keeps only what its first request asks for: that request also asks for the model view's thumbnails
 *  (a few ms a layer), and the view's requests wait for the run (a head is then recomputed from the run's
 *  checkpoints in well under a second, instead of a second pass over every layer). */
function firstRequest(st, info, run, long) {
  if (isEncDec(info)) return { ...run, include: info.predictions ? ["predictions"] : [] };   // the tokens of both stacks
  const { include: thumbs, resolution, dtype } = model.requests()[0];
  const overview = long ? { resolution, dtype } : {};
  return { ...run, ...overview, include: [...(long ? thumbs : []), "summary",
    ...(info.predictions ? ["predictions"] : []), ...(st.ablate.length ? ["effect"] : [])] };
}

/** What a generation from st streams: the attention rows of the view's layer that it draws (and the page's head),
 *  from its requests for the prompt's answer (the update's own: shared from api.js's cache). */
async function streamTarget(st, info) {
  const run = runOptions(st, info), opts = { progress: longText(st, info) };
  const meta = await api.analysis("attention", firstRequest(st, info, run, opts.progress), opts);
  const heads = new Set([st.head]);
  for (const r of can(info, st.view) ? VIEWS[st.view].requests(st, info, meta) : []) {
    if (r.endpoint === "attention" && r.layers?.length === 1 && r.layers[0] === st.layer) r.heads?.forEach((hd) => heads.add(hd));
  }
  return { layer: st.layer, heads: [...heads].sort((a, b) => a - b) };
}

/** Are these a view's requests for the page's own run only (no other text, mask or knocked-out heads)? Only those
 *  answers grow with a generation's tokens. */
const ownRun = (reqs) => reqs.length > 0 && reqs.every((r) => !["text", "text_pair", "ablate", "causal", "mask_tokens"].some((k) => k in r));

/** What the page shows round the view, from the run's first answer. */
function showRun(meta, st, info, view) {
  const shade = surprisal(meta), generated = generatedFrom(meta, st);
  renderChips($("chips"), meta, st, go, shade, generated);
  renderChipsLegend($("chips-legend"), meta, st, shade, generated);
  showLength($("length-note"), meta, st, MODELS[st.model]);
  syncHideSpecial(meta);
  renderPredictions($("predictions"), meta, st, view.nextTokenPick?.(st, go));
  showAblation(st, go);
  notices.showTokenInfo(meta, st, info);
  notices.showWhatIf(meta, info);
  notices.showWarnings(meta);
}

/** The ctx a view renders with (the view contract above); its charts' promises go to `charts`. */
function viewContext(st, info, charts, draw = plot) {
  const large = st.large || st.present;
  const ctx = { info, boot: BOOT, go, href: state.href, large, font: large ? 18 : 13, memory: memory[st.view],
    plot: (el, traces, layout) => charts.push(draw(el, traces, layout, ctx.font,
      `attnscope-${st.model}-${st.view}-L${st.layer}H${st.head}`)) };
  return ctx;
}

/** The page's first picture, once: a performance mark the bench (bench/browser.py) reads. */
let firstPicture = false;
function markFirstPicture(how) {
  if (firstPicture) return;
  firstPicture = true;
  performance.mark("attnscope:first-picture", { detail: how });
}

/** Before plotly.js has run, a view that can (view.sketch) draws its picture as a canvas sketch (plot.js sketch);
 *  Plotly's figure replaces it in the same place. Not counted as drawn (renders, state): the tests and the page's
 *  "drawn" signal wait for the figure itself. */
async function drawSketch(view, container, data, st, info) {
  const charts = [];
  const ctx = { ...viewContext(st, info, charts, sketch), sketching: true };
  try {
    view.render(container, data, st, ctx);
    if ((await Promise.all(charts)).some(Boolean)) {
      markFirstPicture("sketch");
      container.dataset.sketch = "1";        // shown at full strength while the page is still busy (app.css)
      progress.stop();                       // the run is done: what is left is plotly.js
      notices.setStatus("Drawn; the interactive chart (hover, zoom) follows…");
    }
  } catch (err) {
    console.warn("sketch", err);           // the figure comes next either way
  }
}

/** Render the view and wait for its charts; false when a newer update started meanwhile. */
async function draw(view, container, data, st, info, gen) {
  const shownState = { ...st, pin: st.pin !== null && st.pin < data.meta.tokens.length ? st.pin : null };
  if (!window.Plotly && view.sketch?.(data, shownState)) await drawSketch(view, container, data, shownState, info);
  await plotlyReady();                     // runs plotly.js the first time (its bytes are preloaded)
  if (gen !== generation) return false;
  const charts = [];
  const ctx = viewContext(st, info, charts);
  drawn = { id: st.view, view, container, st: shownState, ctx, exports: null };
  drawn.exports = view.render(container, data, shownState, ctx);
  await Promise.all(charts);
  delete container.dataset.sketch;
  if (gen !== generation) return false;
  container.dataset.renders = String(Number(container.dataset.renders || 0) + 1);
  container.dataset.state = drawnSearch = location.search;
  markFirstPicture("figure");
  return true;
}

/** A view the model cannot do (its capability record, boot.js can), or cannot do for a text this long (length.js
 *  tooLong): the reason where its picture would be, and links to the served models that can; nothing is asked of the
 *  server for it. */
function drawRefused(container, st, info, long = "") {
  for (const el of container.querySelectorAll(".js-plotly-plot")) window.Plotly.purge(el);
  const able = ableModels(st.view);
  replace(container, long
    ? h("p", { class: "note refused", "data-feature": st.view, text: `${VIEWS[st.view].title} is not available at this length: ${long}.` })
    : h("p", { class: "note refused", "data-feature": st.view },
      `${VIEWS[st.view].title} is not available for ${info.title}: ${whyNot(info, st.view)}. `,
      able.length ? "Served models that can: " : "No served model can.",
      able.map((m, k) => [k ? ", " : "", h("a", { href: state.href({ model: m.id }), text: m.title })])));
  drawn = { id: st.view, view: VIEWS[st.view], container, st, ctx: null, exports: null };
  container.dataset.renders = String(Number(container.dataset.renders || 0) + 1);
  container.dataset.state = drawnSearch = location.search;
}

/** Cancel pressed (progress.js; the run's request rejects with {cancelled}): the page goes back to the state it last
 *  drew (model, text, layer, head and the address, replacing the cancelled one: the controls never show a state the
 *  picture is not of), its answers from api.js's cache, and says "Cancelled" plainly: nothing was refused. A text
 *  the cancelled run was of stays in its box, pending (draft.js). */
function cancelled() {
  measureHead = false;                     // a model switch's head is measured on the run that was cancelled
  const back = drawnSearch;
  if (back === null || back === location.search) {
    notices.setStatus("Cancelled: the run stopped. Press Run to start it again.");
    return;
  }
  draft.keep();
  cancelledTo = back;
  state.go(state.parse(back), { replace: true });
}

async function update() {
  const [st, changed] = state.normalize(state.get(), MODELS, BOOT.default_model, stages.STEPS.length);
  if (changed) return state.go(st, { replace: true });
  const info = MODELS[st.model];
  draft.sync(st);
  syncControls(st, info);
  syncExamples(info);
  syncFrame(st, VIEWS, go, sameText(st) ? read.T : null);
  const live = generator.live(st);         // a generation streaming from this text: its tokens so far grow the answer
  const steps = live?.steps.slice();
  const view = VIEWS[st.view];
  const container = document.querySelector(`.view[data-view="${st.view}"]`);
  const gen = ++generation;
  if (!st.text.trim()) {
    generator.sync(st, info);
    clearChips($("chips"));
    notices.showNoText();
    $("length-note").hidden = true;
    return;
  }
  notices.clearError();
  generator.sync(st, info);                // after clearError: a generation's refusal stays shown
  $("view-area").setAttribute("aria-busy", "true");
  notices.setStatus(live ? `Generating: ${steps.length} new tokens…` : "Running the model…");
  const started = performance.now();
  const run = runOptions(st, info);
  const opts = { progress: longText(st, info) };          // a long text runs layer by layer: its progress streams first
  // a long run says beforehand about how many tokens and how long (at the rate this page measured, else a guess)
  const guess = opts.progress && !sameText(st) ? estimate(info, st, rates[st.model] ?? Math.max(0, ...Object.values(rates)), perToken[st.model]) : null;
  if (guess && !live) notices.setStatus(`Running ${guess.text}…`);
  progress.start(guess);
  try {
    const metaP = api.analysis("attention", firstRequest(st, info, run, opts.progress), opts);
    const able = can(info, st.view);
    // a view a length may refuse waits for the tokens when the text could be that long (a token has a character at
    // least): it is never asked for what it would refuse
    const mayRefuse = tooLong(info, st.view, sameText(st) ? read.T : st.text.length + (st.text_pair || "").length + 4);
    let dataP = !able || mayRefuse || view.needsMeta || opts.progress ? null : fetchAll(view.requests(st, info, null), run, opts);
    dataP?.catch(() => {});
    const answer = await metaP;
    if (gen !== generation) return;
    // an encoder-decoder's answer as the one stack the views draw (encdec.js): st.attention's queries and keys
    if (measureHead) {                     // the first screen: the head with the clearest pattern on this text
      measureHead = false;
      const best = answer.summary && clearestHead(answer.summary, answer.tokens.length);
      if (best && state.go({ layer: best.layer, head: best.head }, { replace: true })) return;
    }
    const meta = isEncDec(info) ? stackMeta(answer, st.attention) : answer;
    if (!isEncDec(info)) {
      read = { model: st.model, text: st.text, pair: st.text_pair, T: meta.tokens.length };
      const rate = rateOf(info, meta);
      if (rate) rates[st.model] = rate;
      syncTabs(st, read.T);
    }
    const long = isEncDec(info) ? "" : tooLong(info, st.view, meta.tokens.length);
    const shown = live ? grownMeta(meta, steps, st.text) : meta;
    showRun(shown, st, info, view);
    if (!able || long) {
      await plotlyReady();
      if (gen !== generation) return;
      drawRefused(container, st, info, long);
      notices.showDrawn(info, meta, [], started);
      showExports(null);
      return;
    }
    dataP ??= fetchAll(view.requests(st, info, meta), run, opts);
    const results = (await dataP).map((r) => (isEncDec(info) ? stackAnswer(r, st.attention) : r));
    if (gen !== generation) return;
    // streaming: the view grows when each of its answers is one head the stream carries; any other view keeps the
    // prompt's drawing (drawn once for this state)
    const grown = live && ownRun(view.requests(st, info, meta)) && results.map((r) => grownAnswer(r, steps, live.layers, live.heads));
    const data = grown?.every(Boolean) ? { meta: shown, results: grown } : { meta, results };
    if (live && data.meta === meta && container.dataset.state === location.search) {
      notices.setStatus(`Generating: ${steps.length} new tokens…`);
      return;
    }
    if (!await draw(view, container, data, st, info, gen)) return;
    if (live) notices.setStatus(`Generating: ${steps.length} new tokens…`);
    else if (cancelledTo === location.search) notices.setStatus(`Cancelled: the run stopped; shown again is what was drawn before it (${info.title}).`);
    else {
      notices.showDrawn(info, meta, results, started);
      // a long run's data per token, for the next long run's estimate of its size (length.js estimate)
      if (opts.progress) perToken[st.model] = [meta, ...results].reduce((s, r) => s + (r.bytes || 0), 0) / meta.tokens.length;
    }
    showExports(drawn.exports);
  } catch (err) {
    if (gen !== generation) return;
    if (err.cancelled) {
      cancelled();
      return;
    }
    console.warn(err);
    notices.showError(err);
  } finally {
    if (gen === generation) {
      cancelledTo = null;                  // said once, by the drawing it went back to
      progress.stop();
      $("view-area").setAttribute("aria-busy", "false");
    }
  }
}

/** Draw the page again for the same state (a generation's new token): one update at a time, the latest tokens
 *  each time, at most one a frame. */
let redrawing = null, again = false;
function redraw() {
  again = true;
  redrawing ??= (async () => {
    while (again) {
      again = false;
      await update();
      await new Promise((resolve) => requestAnimationFrame(resolve));
    }
    redrawing = null;
  })();
}

// ---- the page's global listeners --------------------------------------------------------------------
/** The view the state shows, as it was last drawn (null before its first render). */
function active() {
  return drawn?.id === state.get().view ? drawn : null;
}

function onKey(e) {
  const v = active();
  if (v?.ctx) v.view.onKey?.(e, v.container, v.st, v.ctx);
  presentKey(e, state.get(), { go, views: Object.keys(VIEWS) });
}

function onResize() {
  const v = active();
  if (v?.ctx) v.view.onResize?.(v.container, v.st, v.ctx);
}

function wire() {
  draft.wire(update);
  wireControls(go, draft, () => { measureHead = true; });
  wireExamples(go, MODELS, state.get);
  wireFrame(go);
  wireAblation(go);
  wireExports(() => drawn?.exports);
  wirePermalink();
  generator.wire();
  api.onProgress(progress.report);
  document.addEventListener("keydown", onKey);
  window.addEventListener("resize", onResize);
  window.addEventListener("popstate", state.reload);
  state.subscribe(update);
}

wire();
// plotly.js's bytes are preloaded; a view that cannot sketch its first picture runs them at once (a head view, after
// its sketch: the 1 s plotly.js takes to run would otherwise come before it)
if (!VIEWS[state.get().view]?.sketch) plotlyReady();
// write the full state into the URL (so the first permalink is complete), then draw
if (!state.go(lessonLink ?? {}, { replace: true })) update();
