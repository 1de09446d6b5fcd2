// The Generate control, for decoders with an LM head: its settings are state (the URL: max_new_tokens, greedy,
// temperature, top_k, top_p, seed, side_by_side), Generate continues the page's text with POST /api/generate
// (api.generate, streamed) and Stop ends it. While it streams, the page's update loop (main.js) draws the prompt's
// answer grown by each new token and its attention row (matrix.js grownMeta, grownAnswer), so the token strip, the
// head view and the line view grow a row and a key column per token. When it ends, the page's text becomes prompt +
// continuation (the answer's `sequence`) and `prompt` names the prompt: every view shows the final text, and the
// link holds it (and the seed a sampled text used). Knocked-out heads stay knocked out (zeros) in every step
// (interventions.ablate); with side_by_side a second stream without them runs beside it, and both texts show.
// What the streams sent is page memory (rec), never auto-generated again on load.
import * as api from "./api.js";
import { ableModels, can, MODELS, whyNot } from "./boot.js";
import { $, h, replace, tokenLabel } from "./dom.js";
import { showError } from "./notices.js";
import { clearSampling, renderSampling } from "./sampling.js";
import { fmt, fmtMs } from "./scale.js";
import * as state from "./state.js";

const STOPPED_BY = { max_new_tokens: "as many as asked for", eos: "stopped by the model's end-of-text token",
  stop: "stopped by a stop text", time: "stopped by the server's time limit" };

/** The boxes, each with its state field and its reading of the box (undefined: not a valid value). */
const BOXES = [
  ["gen-max", "max_new_tokens", (v) => (/^\d+$/.test(v) && v >= 1 && v <= state.GENERATION.max_new_tokens ? Number(v) : undefined)],
  ["gen-temperature", "temperature", (v) => (v !== "" && v > 0 && v <= state.GENERATION.max_temperature ? Number(v) : undefined)],
  ["gen-top-k", "top_k", (v) => (/^\d+$/.test(v) ? Number(v) : undefined)],
  ["gen-top-p", "top_p", (v) => (v !== "" && v > 0 && v <= 1 ? Number(v) : undefined)],
  ["gen-seed", "seed", (v) => (v === "" ? null : /^\d+$/.test(v) && v <= state.GENERATION.max_seed ? Number(v) : undefined)],
];

/** Pairs [layer, head] of the state's knocked-out heads. */
const pairs = (ablate) => ablate.map((x) => x.split(".").map(Number));

const knockedOut = (ablate) => ablate.map((x) => `L${x.replace(".", "H")}`).join(", ");

/** Index of the first token the model generated in meta: a streaming answer's (grownMeta), or the first token past
 *  the state's prompt (by the tokens' offsets); null when the text is not a generation's. */
export function generatedFrom(meta, st) {
  if (meta.generated !== undefined) return meta.generated;
  if (!st.prompt || !meta.offsets) return null;
  const n = Array.from(st.prompt).length;
  const i = meta.offsets.findIndex(([, end]) => end > n);
  return i < 0 ? null : i;
}

/** Show a state value in a box unless the box holds an edit the state has not taken yet. */
function show(el, value) {
  const v = value === null ? "" : String(value);
  if (el.dataset.shown === v && el.value !== v) return;
  el.value = v;
  el.dataset.shown = v;
}

/** The page's generation: {sync(st, info), live(st), wire()}. go: state changes (main.js draft.go); redraw(): draw
 *  the page again (coalesced); target(st, info) -> Promise of {layer, heads}: the attention rows the page draws. */
export function createGeneration({ go, redraw, target }) {
  let rec = null;        // the generation streaming, or the last one
  let stepShown = null;  // the sampling panel's step (null: the latest)

  const sameRun = (st, r) => r.model === st.model && r.ablate.join() === st.ablate.join();
  /** The record the page shows for st: streaming from its text, or ended on it (or refused on it). */
  const recordFor = (st) => (rec && sameRun(st, rec) && (rec.running || rec.error ? rec.prompt === st.text : rec.sequence === st.text)
    ? rec : null);

  /** The generation streaming from st's text, whose tokens grow the page's answer; null when none. */
  const live = (st) => (rec?.running && rec.streaming && sameRun(st, rec) && rec.prompt === st.text ? rec : null);

  /** Read the boxes: the state patch of their valid values (an invalid box goes back to the state's value). */
  function boxes() {
    const patch = {};
    for (const [id, key, read] of BOXES) {
      const v = read($(id).value.trim());
      if (v === undefined) $(id).value = $(id).dataset.shown ?? "";
      else patch[key] = v;
    }
    return { ...patch, greedy: $("gen-greedy").checked, side_by_side: $("gen-side").checked };
  }

  async function start() {
    if (rec?.running) return;
    const before = state.get();
    go({ ...boxes(), mask_tokens: [], causal: null,           // generation runs the model's own mask
      ...(before.ablate.length && before.ablation !== "zero" ? { ablation: "zero" } : {}) });
    const st = state.get(), info = MODELS[st.model];
    if (!info?.predictions || !st.text.trim()) return;
    const controller = new AbortController();
    const mine = rec = { model: st.model, prompt: st.text, ablate: [...st.ablate], running: true, streaming: false,
      controller, steps: [], plain: null, done: null, error: null, first: null,
      settings: { greedy: st.greedy, temperature: st.temperature, top_k: st.top_k, top_p: st.top_p, seed: st.seed,
        max_new_tokens: st.max_new_tokens } };
    stepShown = null;
    sync(st, info);
    let rows;
    try {
      rows = await target(st, info);          // the prompt's run (shared with the page's update): its tokens first
    } catch (err) {
      rows = null;                            // the page's update shows why the prompt did not run
    }
    if (controller.signal.aborted) return end(mine, st);
    const seed = st.seed ?? (st.greedy ? null : crypto.getRandomValues(new Uint32Array(1))[0]);
    mine.settings.seed = seed;
    const body = { model: st.model, text: st.text, max_new_tokens: st.max_new_tokens, greedy: st.greedy,
      temperature: st.temperature, top_k: st.top_k, top_p: st.top_p, seed };
    const ablate = pairs(st.ablate);
    const onToken = (list) => (t) => {
      mine.first ??= performance.now();
      list.push(t);
      if (rec === mine) redraw();
    };
    mine.streaming = true;
    mine.layers = rows ? [rows.layer] : [];
    mine.heads = rows ? rows.heads : [];
    const streams = [api.generate({ ...body, ...(ablate.length ? { interventions: { ablate } } : {}),
      include: ["candidates", ...(rows ? ["attention"] : [])], ...(rows ? { layers: [rows.layer], heads: rows.heads } : {}) },
    onToken(mine.steps), { signal: controller.signal })];
    if (ablate.length && st.side_by_side) {
      mine.plain = { steps: [], done: null, error: null };
      streams.push(api.generate({ ...body, include: ["candidates"] }, onToken(mine.plain.steps), { signal: controller.signal }));
    }
    const [main, plain] = await Promise.allSettled(streams);
    if (main.status === "fulfilled") mine.done = main.value;
    else mine.error = main.reason;
    if (plain) {
      if (plain.status === "fulfilled") mine.plain.done = plain.value;
      else mine.plain.error = plain.reason;
    }
    end(mine, st);
  }

  /** A generation ended: the page's text becomes prompt + continuation (also after Stop, with the tokens so far),
   *  unless the page moved on meanwhile; a refusal is shown with the page's notices. */
  function end(r, st) {
    r.running = false;
    if (rec !== r) return;
    const aborted = (e) => e?.name === "AbortError";
    if (aborted(r.error)) r.error = null;
    if (r.plain && aborted(r.plain.error)) r.plain.error = null;
    r.sequence = r.done ? r.done.sequence : !r.error && r.steps.length ? r.prompt + r.steps[r.steps.length - 1].text : null;
    r.seed = r.done?.seed ?? r.settings.seed;
    if (r.sequence && !r.superseded) {
      go({ text: r.sequence, prompt: r.prompt, pin: null, mask_tokens: [], ...(st.greedy ? {} : { seed: r.seed }) });
    } else {
      redraw();
    }
    // a refusal is shown with the page's notices until the state next changes (sync shows it after every update's
    // clearError: a redraw still queued would otherwise wipe it)
    r.failure = r.superseded ? null : r.error ?? r.plain?.error ?? null;
    r.failedAt = location.search;
    if (r.failure) showError(r.failure);
  }

  function stop() {
    if (rec?.running) {
      rec.stopped = true;
      rec.controller.abort();
    }
  }

  // ---- drawing ------------------------------------------------------------------------------------------------
  function reason(st, info) {
    if (can(info, "generate")) {
      const parts = ["Continues the page's text a token at a time: the tokens, the head view and the line view grow as " +
        "they come; then the text becomes prompt + continuation, and every view shows it."];
      if (st.ablate.length) {
        parts.push(`${knockedOut(st.ablate)} stay${st.ablate.length > 1 ? "" : "s"} knocked out in every step (their output zero` +
          `${st.ablation === "zero" ? "" : "; Generate sets “replaced by” to zeros"}).`);
      }
      return parts.join(" ");
    }
    const able = ableModels("generate");
    return [`Generation is not available for ${info.title}: ${whyNot(info, "generate")}. `,
      able.length ? "Served models that can: " : "No served model can.",
    able.map((m, k) => [k ? ", " : "", h("a", { href: state.href({ model: m.id, prompt: "" }), text: m.title })])];
  }

  /** Where two streams' tokens first differ (an index into both), or -1. */
  const partAt = (a, b) => a.findIndex((s, k) => b[k] && b[k].id !== s.id);

  /** One continuation: the prompt, then each new token (its probability in the title), from new token `parted` on
   *  underlined (where it parts from the other stream's); done: its stream's last line, for the side-by-side view. */
  function continuation(r, steps, label, cls, parted = -1, done = undefined) {
    let prev = "";
    return h("div", { class: `gen-text ${cls}`, "data-tokens": steps.length },
      h("h3", { text: label }),
      h("p", { class: "gen-sequence" }, h("span", { class: "gen-prompt", text: r.prompt }),
        steps.map((s, k) => {
          const piece = s.text.startsWith(prev) ? s.text.slice(prev.length) : tokenLabel(s.token);
          prev = s.text;
          return h("span", { class: ["gen-token", parted >= 0 && k >= parted && "parted"].filter(Boolean).join(" "),
            title: `token ${s.index} “${tokenLabel(s.token)}”: model probability ${fmt(s.probability, 4)}, ` +
              `sampling probability ${fmt(s.sampling_probability, 4)}`, text: piece });
        })),
      done !== undefined && h("p", { class: "hint", text: `${steps.length} new token${steps.length === 1 ? "" : "s"}` +
        (done ? ` (${STOPPED_BY[done.stop_reason] ?? done.stop_reason})` : r.running ? "…" : "") }));
  }

  function statusText(r) {
    const n = r.steps.length, s = r.settings;
    const how = s.greedy ? "greedy" : `seed ${r.seed ?? s.seed}`;
    if (r.running) {
      const rate = r.first && n > 1 ? ` · ${((n - 1) / ((performance.now() - r.first) / 1000)).toFixed(1)} tokens/s` : "";
      return r.streaming ? `Generating: ${n} of at most ${s.max_new_tokens} new tokens (${how})${rate}…` : "Running the prompt…";
    }
    if (r.error) return `Refused after ${n} new token${n === 1 ? "" : "s"}: see the message above.`;
    if (r.done) {
      return `${n} new token${n === 1 ? "" : "s"} (${STOPPED_BY[r.done.stop_reason] ?? r.done.stop_reason}) in ` +
        `${fmtMs(r.done.timing_ms.total)} (prompt ${fmtMs(r.done.timing_ms.prompt)}, ${r.done.tokens_per_second.toFixed(1)} ` +
        `tokens/s) · ${how}.`;
    }
    return `Stopped after ${n} new token${n === 1 ? "" : "s"} (${how}).`;
  }

  function output(st, r) {
    const box = $("gen-output");
    const back = st.prompt && h("button", { type: "button", class: "small", id: "gen-back", text: "Back to the prompt",
      title: "Make the prompt the page's text again", onclick: () => go({ text: st.prompt, prompt: "" }) });
    if (!r) {
      replace(box, st.prompt && h("p", { class: "note gen-from" },
        `This text continues the prompt “${st.prompt}”: the rest was generated` +
        (st.greedy ? " (greedy)" : st.seed !== null ? ` (seed ${st.seed}, with the settings above)` : "") +
        ". Generate continues it further. ", back));
      return;
    }
    const parted = r.plain ? partAt(r.steps, r.plain.steps) : -1;
    const texts = !r.steps.length && !r.plain?.steps.length ? null : r.plain
      ? [h("div", { class: "gen-compare" },
        continuation(r, r.steps, `With ${knockedOut(r.ablate)} knocked out`, "ablated", parted, r.done),
        continuation(r, r.plain.steps, "Intact model", "plain", parted, r.plain.done)),
      h("p", { class: "hint gen-parted", "data-parted": parted, text: parted >= 0
        ? `The two part at new token ${parted + 1} (underlined): the same seed and settings, so the knocked-out heads made the difference.`
        : "The two are the same so far." })]
      : continuation(r, r.steps, r.ablate.length ? `With ${knockedOut(r.ablate)} knocked out` : "Continuation", "ablated");
    replace(box, h("p", { class: "gen-status", text: statusText(r) }), texts, !r.running && back);
  }

  function sampling(st, r) {
    const box = $("sampling");
    if (!r?.steps.length) {
      clearSampling(box);
      if (r?.running) {                       // its room kept from the start: the view below does not jump later
        box.hidden = false;
        box.append(h("p", { class: "hint sampling-wait", text: "Each step's sampling shows here as its token comes." }));
      }
      return;
    }
    const at = Math.min(stepShown ?? r.steps.length - 1, r.steps.length - 1);
    renderSampling(box, { steps: r.steps, at, what: r.plain ? ` (with ${knockedOut(r.ablate)} knocked out)` : "", settings: { ...r.settings, seed: r.seed ?? r.settings.seed },
      font: st.large || st.present ? 18 : 13, name: `attnscope-${r.model}-sampling-step${at + 1}`,
      onStep: (k) => { stepShown = k === r.steps.length - 1 ? null : k; sampling(state.get(), r); } });
  }

  /** Draw the control and what the last generation made, for state st of model info; a generation whose text the
   *  page no longer shows (another text, model or knocked-out heads) is stopped. */
  function sync(st, info) {
    if (rec?.running && !(sameRun(st, rec) && rec.prompt === st.text)) {
      rec.superseded = true;
      rec.controller.abort();
    }
    const r = recordFor(st), running = Boolean(rec?.running);
    const section = $("generate");
    // a panel that folds: open on a model that generates (and while it does), folded with its reason on one that
    // cannot; the user's own folding is kept until the model changes
    const able = can(info, "generate");
    if (section.dataset.model !== st.model) section.open = able;
    if (running) section.open = true;
    section.dataset.model = st.model;
    $("gen-summary").textContent = able ? "" : `not for this model: ${whyNot(info, "generate")}`;
    section.dataset.state = !r ? "idle" : r.running ? "running" : r.error ? "error" : r.done ? "done" : "stopped";
    section.dataset.tokens = String(r?.steps.length ?? 0);
    for (const [id, key] of BOXES) show($(id), st[key]);
    $("gen-greedy").checked = st.greedy;
    $("gen-side").checked = st.side_by_side;
    $("gen-side-field").hidden = !st.ablate.length;
    for (const el of $("generate-form").elements) el.disabled = !able || running;
    $("gen-run").disabled = !able || running || !st.text.trim();
    $("gen-new-seed").disabled ||= st.seed === null;
    $("gen-stop").hidden = !running;
    $("gen-stop").disabled = false;
    replace($("gen-note"), reason(st, info));
    if (r?.failure && r.failedAt === location.search) showError(r.failure);
    output(st, r);
    sampling(st, r);
  }

  function wire() {
    const form = $("generate-form");
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      start();
    });
    for (const [id] of BOXES) $(id).addEventListener("change", () => go(boxes()));
    $("gen-greedy").addEventListener("change", (e) => go({ greedy: e.target.checked }));
    $("gen-side").addEventListener("change", (e) => go({ side_by_side: e.target.checked }));
    $("gen-new-seed").addEventListener("click", () => go({ seed: null }));
    $("gen-stop").addEventListener("click", stop);
  }

  return { sync, live, wire };
}
