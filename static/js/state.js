// All state lives in the URL query string: every view is a link, back/forward works, and the
// "copy permalink" button just copies location.href.
import { BOOT } from "./boot.js";
import { PAIR_FILTERS } from "./matrix.js";
import { SCALE_MODES, SIGNED_MODES } from "./scale.js";

export const STEP_TOKENS = [6, 8, 12, 16, 24, 32];
/** What POST /api/generate takes: new tokens per request (the server's ATTNSCOPE_MAX_NEW_TOKENS, from the boot
 *  block), temperature in (0, 100], seeds below 2^32. */
export const GENERATION = { max_new_tokens: BOOT.max_new_tokens ?? 256, max_temperature: 100, max_seed: 2 ** 32 - 1 };

// Name, default, kind (a list of values = one of those). Order here is the order in the URL.
//   scale: colours on the fixed 0–1 scale, or stretched to each picture's own maximum ("head")
//   pairs: which query → key cells of a sentence pair the head and line views show
//   dist_norm: mean distance divided by the longest possible (T − 1); sort: the summary's ranking order
//   present: classroom layout (present.js); lesson: the page of the guided lesson shown (lesson.js), or none
//   effects view (views/effects.js), in the API's words: the clean text is `text`; corrupt, target, distractor,
//   site and direction as POST /api/patching takes them; open_head: the patterns of head (layer, head) shown;
//   queries, keys, knockout_layers ([first, last]) as POST /api/knockout takes them; knockout: run it; receivers
//   ("layer.head") and receiver_input as POST /api/path_patching takes them (each head the sender in turn)
//   generation (generate.js), in the API's words: max_new_tokens, greedy, temperature, top_k, top_p, seed (null: a
//   random one; a sampled generation writes the one it used, so the link says how to get its text again);
//   side_by_side: with heads knocked out, also generate without them; prompt: the text a generation continued (the
//   page's text is then prompt + continuation)
//   why: the head view's cell [query, key] whose score POST /api/qk explains (views/head.js); lens: what colours the
//   logit lens (views/lens.js), the top token's probability (the API's top_probs) or the next token's (next_probs);
//   composition: the circuits view's composition map (views/circuits.js), Q-, K- or V-composition
//   atlas view (views/atlas.js): job, the atlas job's id (POST /api/jobs); x_stat and y_stat, the Head Finder's axes
//   (statistics of the atlas); y_min, its filter (heads with y_stat below it greyed); example, the top example
//   marked in the dashboard; the head is (layer, head) and the list's order `sort`
//   encoder-decoders (encdec.js): decoder_text, the decoder's text as POST /api/attention takes it; attention, which
//   of their three attentions the views draw (encoder, decoder or cross, from the boot block)
const FIELDS = [
  ["model", "", "str"], ["text", "", "str"], ["text_pair", "", "str"], ["view", "head", "view"],
  ["layer", 0, "int"], ["head", 0, "int"], ["causal", null, "tri"], ["mask_tokens", [], "ints"],
  ["pin", null, "int?"], ["hide_special", false, "bool"], ["click", "pin", "click"],
  ["stat", "mean_entropy", "stat"], ["heads", null, "ints?"], ["all_heads", false, "bool"],
  ["step", 0, "int"], ["n", 12, "int"], ["large", false, "bool"],
  ["scale", "fixed", SCALE_MODES.map(([v]) => v)], ["signed", "fitted", SIGNED_MODES.map(([v]) => v)], ["pairs", "all", PAIR_FILTERS.map(([v]) => v)],
  ["dist_norm", false, "bool"], ["sort", "-value", ["-value", "value", "layer", "-layer", "head", "-head"]],
  ["ablate", [], "heads"], ["ablation", "zero", "ablation"], ["text_b", "", "str"],
  ["present", false, "bool"], ["lesson", null, "int?"],
  ["corrupt", "", "str"], ["target", "", "str"], ["distractor", "", "str"], ["site", "head_output", "site"],
  ["direction", "denoise", "direction"], ["open_head", false, "bool"], ["queries", [], "ints"], ["keys", [], "ints"],
  ["knockout_layers", null, "range?"], ["knockout", false, "bool"],
  ["receivers", [], "heads"], ["receiver_input", "query", ["query", "key", "value"]],
  ["max_new_tokens", 32, "int"], ["greedy", false, "bool"], ["temperature", 1, "num"], ["top_k", 0, "int"],
  ["top_p", 1, "num"], ["seed", null, "int?"], ["side_by_side", false, "bool"], ["prompt", "", "str"],
  ["why", null, "pair?"], ["lens", "top", ["top", "next"]], ["composition", "k", ["q", "k", "v"]],
  ["job", "", "str"], ["x_stat", "mean_entropy", "str"], ["y_stat", "induction_mass", "str"], ["y_min", 0, "num"],
  ["example", 0, "int"], ["decoder_text", "", "str"], ["attention", "cross", "attention"],
  ["kv_policy", "h2o", ["streaming", "h2o", "snapkv"]], ["kv_budget", 16, "int"], ["kv_steps", 8, "int"],   // views/cache.js
  ["retrieval", false, "bool"],                                                                   // views/model.js
];
const ALWAYS = new Set(["model", "text", "view", "layer", "head"]);   // written even when default
let defaults = Object.fromEntries(FIELDS.map(([k, d]) => [k, d]));
// the values a "view" / "stat" / "ablation" / "site" / "direction" field may take
const choices = { view: [], stat: [], ablation: [], site: [], direction: [], attention: [] };

/** Set the page's defaults and the views, statistics, ablations and patching sites and directions it offers (all
 *  from the server's boot block). */
export function configure(patch, { views, stats, ablations, sites = [], directions = [], attentions = [] }) {
  defaults = { ...defaults, ...patch };
  choices.view = views;
  choices.stat = stats;
  choices.ablation = ablations;
  choices.site = sites;
  choices.direction = directions;
  choices.attention = attentions;
}

/** Knocked-out heads are "layer.head" strings in the state and the URL ("3.1,5.0"). */
function byHead(a, b) {
  const [la, ha] = a.split(".").map(Number), [lb, hb] = b.split(".").map(Number);
  return la - lb || ha - hb;
}

/** The state's list of knocked-out heads with (layer, head) toggled. */
export function toggledHead(list, layer, head) {
  const key = `${layer}.${head}`;
  return list.includes(key) ? list.filter((x) => x !== key) : [...list, key].sort(byHead);
}

function parseInts(s) {
  return [...new Set(s.split(",").map((x) => x.trim()).filter((x) => /^\d+$/.test(x)).map(Number))]
    .sort((a, b) => a - b);
}

/** "first,last" (first <= last) as [first, last], else null. */
function parseRange(s) {
  const m = /^(\d+),(\d+)$/.exec(s);
  return m && Number(m[1]) <= Number(m[2]) ? [Number(m[1]), Number(m[2])] : null;
}

/** "a,b" (any two indices) as [a, b], else null. */
function parsePair(s) {
  const m = /^(\d+),(\d+)$/.exec(s);
  return m ? [Number(m[1]), Number(m[2])] : null;
}

// A text too long for an address the server takes (ATTNSCOPE_MAX_URL_BYTES, 65,000 bytes: ~13,000 English tokens; a
// 32k-token text is ~130,000 characters) is kept in this tab's sessionStorage, and the address names it (textref=its
// hash): a reload, back and forward find it there (issue 48: a long run survives a reload). A link copied to another
// browser does not carry such a text.
const URL_TEXT_CHARS = 30_000;
const TEXT_KEY = "attnscope:text:";
const stored = new Set();     // names already written this session (links are made many times a render)

/** A short, stable name for a text (FNV-1a, 32 bits, and its length). */
function textName(text) {
  let x = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) x = Math.imul(x ^ text.charCodeAt(i), 0x01000193) >>> 0;
  return `${x.toString(16)}-${text.length}`;
}

/** State object from a query string. Unknown or malformed values fall back to defaults. */
export function parse(search = location.search) {
  const q = new URLSearchParams(search);
  if (!q.has("text") && q.has("textref")) {
    let kept = null;
    try { kept = sessionStorage.getItem(TEXT_KEY + q.get("textref")); } catch { /* storage off: the default text */ }
    if (kept !== null) q.set("text", kept);
  }
  const st = {};
  for (const [k, , kind] of FIELDS) {
    const d = defaults[k];
    const raw = q.get(k);
    if (raw === null) { st[k] = Array.isArray(d) ? [...d] : d; continue; }
    if (Array.isArray(kind)) { st[k] = kind.includes(raw) ? raw : d; continue; }
    switch (kind) {
      case "str": st[k] = raw; break;
      case "view": case "stat": case "ablation": case "site": case "direction": case "attention":
        st[k] = choices[kind].includes(raw) ? raw : d; break;
      case "click": st[k] = raw === "mask" ? "mask" : "pin"; break;
      case "int": st[k] = /^\d+$/.test(raw) ? Number(raw) : d; break;
      case "int?": st[k] = /^\d+$/.test(raw) ? Number(raw) : null; break;
      case "num": st[k] = /^(\d+\.?\d*|\.\d+)$/.test(raw) ? Number(raw) : d; break;
      case "tri": st[k] = raw === "1" || raw === "true" ? true : raw === "0" || raw === "false" ? false : null; break;
      case "bool": st[k] = raw === "1" || raw === "true"; break;
      case "ints": st[k] = parseInts(raw); break;
      case "ints?": st[k] = raw === "" ? null : parseInts(raw); break;
      case "heads": st[k] = [...new Set(raw.split(",").filter((x) => /^\d+\.\d+$/.test(x)))].sort(byHead); break;
      case "range?": st[k] = parseRange(raw); break;
      case "pair?": st[k] = parsePair(raw); break;
    }
  }
  return st;
}

/** Query string for a state (defaults left out, except the fields that make a link self-contained). */
export function serialize(st) {
  const q = new URLSearchParams();
  for (const [k, , kind] of FIELDS) {
    const v = st[k], d = defaults[k];
    const same = Array.isArray(v) ? Array.isArray(d) && v.join() === d.join() : v === d;
    if (same && !ALWAYS.has(k)) continue;
    if (v === null || v === undefined) continue;
    if (kind === "tri" || kind === "bool") q.set(k, v ? "1" : "0");
    else if (Array.isArray(v)) q.set(k, v.join(","));
    else q.set(k, String(v));
  }
  const text = q.get("text");
  if (text && text.length > URL_TEXT_CHARS) {
    const name = textName(text);
    try {
      if (!stored.has(name)) sessionStorage.setItem(TEXT_KEY + name, text);
      stored.add(name);
      q.delete("text");
      q.set("textref", name);
    } catch { /* storage full or off: the text stays in the address */ }
  }
  return "?" + q.toString();
}

let current = null;
const listeners = [];

/** The current state (parsed once per URL change). */
export function get() {
  return (current ??= parse());
}

/** A link to the current state changed by patch. */
export function href(patch = {}) {
  return location.pathname + serialize({ ...get(), ...patch });
}

/** Change state: push a history entry (or replace it) and tell the listeners; false if nothing changed. */
export function go(patch, { replace = false } = {}) {
  const next = { ...get(), ...patch };
  const url = location.pathname + serialize(next);
  if (url === location.pathname + location.search) return false;
  history[replace ? "replaceState" : "pushState"](null, "", url);
  reload();
  return true;
}

/** Read the state from the URL again and tell the listeners (after go(), and on back/forward: main.js calls it
 *  on popstate). */
export function reload() {
  current = parse();
  listeners.forEach((cb) => cb(current));
}

/** Call cb(state) after every change, including back/forward. */
export function subscribe(cb) {
  listeners.push(cb);
}

/** A state clamped to what its model offers (an unknown model: the default one); returns [state, changed].
 *  models: id -> model info; steps: how many steps the steps view has. */
export function normalize(st, models, defaultModel, steps) {
  const fixed = { ...st };
  if (!models[fixed.model]) fixed.model = defaultModel;
  const info = models[fixed.model];
  fixed.layer = Math.min(fixed.layer, info.layers - 1);
  fixed.head = Math.min(fixed.head, info.heads - 1);
  if (fixed.heads) fixed.heads = fixed.heads.filter((x) => x < info.heads);
  const fits = (x) => { const [l, hd] = x.split(".").map(Number); return l < info.layers && hd < info.heads; };
  fixed.ablate = fixed.ablate.filter(fits);
  fixed.receivers = fixed.receivers.filter(fits);
  if (!info.pair) fixed.text_pair = "";
  if (info.kind === "encoder-decoder") {    // what reads one stack's run does not apply (encdec.js): left out
    Object.assign(fixed, { causal: null, mask_tokens: [], ablate: [], why: null, click: "pin" });
  } else fixed.decoder_text = "";
  if (!STEP_TOKENS.includes(fixed.n)) fixed.n = 12;
  if (fixed.step > steps) fixed.step = 0;
  if (fixed.knockout_layers) {
    const [a, b] = fixed.knockout_layers.map((x) => Math.min(x, info.layers - 1));
    fixed.knockout_layers = a === 0 && b === info.layers - 1 ? null : [a, b];   // every layer: the default
  }
  // the generation's settings within what POST /api/generate takes (GENERATION); a prompt the text no longer
  // continues is forgotten
  const g = GENERATION;
  fixed.max_new_tokens = Math.max(1, Math.min(g.max_new_tokens, fixed.max_new_tokens));
  if (!(fixed.temperature > 0 && fixed.temperature <= g.max_temperature)) fixed.temperature = defaults.temperature;
  if (!(fixed.top_p > 0 && fixed.top_p <= 1)) fixed.top_p = defaults.top_p;
  if (fixed.seed !== null && fixed.seed > g.max_seed) fixed.seed = null;
  if (fixed.prompt && (fixed.prompt === fixed.text || !fixed.text.startsWith(fixed.prompt))) fixed.prompt = "";
  const changed = JSON.stringify(fixed) !== JSON.stringify(st);
  return [fixed, changed];
}
