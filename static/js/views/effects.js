// Effects view: which heads carry a prediction. For the page's text (the clean prompt), a corrupt prompt of the
// same token count and a target token (and, optionally, a distractor), two layer x head maps side by side: each
// head's direct logit attribution (POST /api/attention with include "attribution") and how much patching that one
// head recovers (POST /api/patching). Click a head for its attention pattern on both prompts; knock attention
// edges out (POST /api/knockout) and see the prediction before and after. With receiver heads, a third map: path
// patching (POST /api/path_patching), each head the sender of paths to the receivers' query, key or value.
// Everything chosen here is in the URL.
import { can, whyNot } from "../boot.js";
import { h, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { exportGroup } from "../exporting.js";
import { typedTarget } from "../target.js";
import { bars } from "../predictions.js";
import { colourRange, divergingRange, exactString, fmt, HIGHLIGHT, plotlyDiverging, plotlyScale, TRANSPARENT } from "../scale.js";

export const title = "Effects";
export const help = "Which heads carry the prediction of a target token. Left: each head's direct logit " +
  "attribution (its output's direct share of the target's logit, or of target minus distractor), on the clean text " +
  "(the page's text). Right: activation patching, each head patched alone between the clean and the corrupt text " +
  "(the same number of tokens), as the share of the clean−corrupt gap it recovers. Pick the target in the next-token " +
  "panel (click; shift+click: the distractor) or type it. Click a head for its attention pattern on both texts.";

/** Models the view works for: decoders with an LM head (the metric reads next-token logits). */
export const supported = (info) => info.kind === "decoder" && Boolean(info.predictions);

/** A token as the API shows it (" Mary" typed is "␣Mary" in next_tokens): how the page compares them. */
const shown = (tok) => String(tok).replace(/ /g, "␣");

/** The requests of a state, each with a name (render finds its answer by it). A refusal (a target that is not one
 *  token, texts of different lengths) is shown where its picture would be: every request is soft. */
function plan(st, info) {
  if (!supported(info)) return [];
  const out = [];
  const target = st.target.trim() ? st.target : null, corrupt = st.corrupt.trim() ? st.corrupt : null;
  const metric = target ? { target, ...(st.distractor.trim() ? { distractor: st.distractor } : {}) } : null;
  // direct logit attribution only where the model's family keeps it exact (its capability record)
  if (metric && can(info, "attribution")) out.push(["dla", { endpoint: "attention", include: ["attribution"], ...metric }]);
  if (metric && corrupt) {
    out.push(["patching", { endpoint: "patching", clean: st.text, corrupt, ...metric, site: st.site,
      direction: st.direction }]);
    if (st.receivers.length) {
      out.push(["path", { endpoint: "path_patching", clean: st.text, corrupt, ...metric,
        receivers: st.receivers.map((x) => x.split(".").map(Number)), receiver_input: st.receiver_input }]);
    }
  }
  if (st.open_head) {
    const one = { endpoint: "attention", layers: [st.layer], heads: [st.head], include: ["attention"] };
    out.push(["clean_head", one]);
    if (corrupt) out.push(["corrupt_head", { ...one, text: corrupt }]);
  }
  if (st.knockout && st.queries.length && st.keys.length) {
    out.push(["knockout", { endpoint: "knockout", queries: st.queries, keys: st.keys,
      layers: st.knockout_layers ?? [0, info.layers - 1] }]);
  }
  return out.map(([name, req]) => ({ name, req: { ...req, soft: true } }));
}

export function requests(st, info) {
  return plan(st, info).map((x) => x.req);
}

/** The next-token panel's tokens pick the target (click) and the distractor (shift+click). */
export function nextTokenPick(st, go) {
  const marks = {};
  if (st.target) marks[shown(st.target)] = "target";
  if (st.distractor) marks[shown(st.distractor)] = "distractor";
  return {
    marks, hint: "Click a token to make it the effects view's target; shift+click: its distractor.",
    choose(token, e) {
      const [t, d] = [shown(st.target), shown(st.distractor)];
      if (e.shiftKey) go({ distractor: token === d ? "" : token, target: token === t ? st.distractor : st.target });
      else go({ target: token, distractor: token === d ? st.target : st.distractor });
    },
  };
}

// ---- controls ------------------------------------------------------------------------------------------------
/** Show a state value in a box unless the box holds an edit not yet run (the box keeps what was typed). */
function show(el, value) {
  if (el.dataset.shown === value && el.value !== value) return;
  el.value = value;
  el.dataset.shown = value;
}

/** Receiver heads typed as "23.3, 23.4" or "L23H3 L23H4" -> the state's "layer.head" strings (others dropped). */
const receiversOf = (text) => [...new Set(text.split(/[\s,;]+/).map((x) => x.match(/^L?(\d+)[.H](\d+)$/i))
  .filter(Boolean).map((m) => `${Number(m[1])}.${Number(m[2])}`))];

/** What the boxes hold that differs from the state (edits not yet run): carried along by every change made here. */
function edits(form, st) {
  const patch = {};
  const box = (id) => form.querySelector(`#${id}`);
  const receivers = receiversOf(box("effects-receivers").value);
  if (receivers.join(",") !== st.receivers.join(",")) patch.receivers = receivers;
  if (box("effects-clean").value !== st.text) Object.assign(patch, { text: box("effects-clean").value, queries: [], keys: [], knockout: false });
  for (const [id, key] of [["effects-corrupt", "corrupt"], ["effects-target", "target"], ["effects-distractor", "distractor"]]) {
    if (box(id).value !== st[key]) patch[key] = box(id).value;
  }
  return patch;
}

function controls(container, st, ctx) {
  let form = container.querySelector(":scope > [data-part=controls]");
  if (!form) {
    const area = (id, label, hint) => h("label", { class: "effects-text" }, h("span", { text: label }),
      h("textarea", { id, rows: 2, spellcheck: "false", placeholder: hint }));
    const line = (id, label, hint) => h("label", {}, `${label} `, h("input", { type: "text", id, size: 12, placeholder: hint,
      spellcheck: "false" }));
    form = h("form", { class: "view-controls effects-controls", "data-part": "controls", "aria-label": "Effects: texts, target and site" },
      area("effects-clean", "Clean text (the page's text)", "the text whose prediction is explained"),
      area("effects-corrupt", "Corrupt text (same token count)", "e.g. the clean text with one name swapped"),
      h("div", { class: "effects-line" },
        line("effects-target", "Target", "␣Mary"), line("effects-distractor", "Distractor", "optional"),
        h("button", { type: "button", class: "small", id: "effects-swap", text: "Swap",
          title: "Swap the target and the distractor" }),
        h("label", {}, "Patch ", h("select", { id: "effects-site" },
          ctx.boot.sites.map((s) => h("option", { value: s.id, text: s.label })))),
        h("label", {}, "Direction ", h("select", { id: "effects-direction" },
          ctx.boot.directions.map((d) => h("option", { value: d.id, text: d.label })))),
        h("button", { type: "submit", class: "primary small", text: "Run effects" })),
      h("div", { class: "effects-line" },
        line("effects-receivers", "Path patching into", "23.3, 23.4"),
        h("label", {}, "Input ", h("select", { id: "effects-receiver-input" },
          ["query", "key", "value"].map((v) => h("option", { value: v, text: v })))),
        h("span", { class: "hint", text: "receiver heads (layer.head): each head's corrupt output sent to them along " +
          "direct paths, every other head frozen at its clean output (Wang et al. 2023)" })));
    container.prepend(form);
    for (const box of form.querySelectorAll("textarea")) {
      box.addEventListener("keydown", (e) => {                  // Ctrl/Cmd+Enter runs, as in the page's text box
        if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
          e.preventDefault();
          form.requestSubmit();
        }
      });
    }
  }
  // the listeners read the latest render's state and go (form.latest)
  form.latest = { st, go: (patch) => ctx.go({ ...edits(form, form.latest.st), ...patch }) };
  form.onsubmit = (e) => { e.preventDefault(); form.latest.go({}); };
  form.querySelector("#effects-swap").onclick = () => {
    const { st: s, go } = form.latest;
    go({ target: s.distractor, distractor: s.target, ...Object.fromEntries(Object.entries(edits(form, s))
      .filter(([k]) => k !== "target" && k !== "distractor")) });
  };
  form.querySelector("#effects-site").onchange = (e) => form.latest.go({ site: e.target.value });
  form.querySelector("#effects-direction").onchange = (e) => form.latest.go({ direction: e.target.value });
  form.querySelector("#effects-receiver-input").onchange = (e) => form.latest.go({ receiver_input: e.target.value });
  show(form.querySelector("#effects-clean"), st.text);
  show(form.querySelector("#effects-corrupt"), st.corrupt);
  show(form.querySelector("#effects-target"), st.target);
  show(form.querySelector("#effects-distractor"), st.distractor);
  form.querySelector("#effects-site").value = st.site;
  form.querySelector("#effects-direction").value = st.direction;
  show(form.querySelector("#effects-receivers"), st.receivers.join(", "));
  form.querySelector("#effects-receiver-input").value = st.receiver_input;
  return form.latest.go;
}

// ---- the two maps ----------------------------------------------------------------------------------------------
/** nested arrays of an answer's field, whichever wire form it came in (a Tensor from the binary form). */
const rowsOf = (v) => (v && typeof v.toArray === "function" ? v.toArray() : v);

const refusal = (err) => (err.cancelled ? err.detail   // stopped from the progress bar (api.js cancelRuns)
  : `The server refused: ${err.detail ?? err.message}` + (err.status ? ` (HTTP ${err.status})` : ""));

/** One map's cell: heading, note, plot and its export buttons; the plot element is kept across renders. */
function cell(grid, key, heading) {
  const el = part(grid, key, "div", { class: "effects-cell", role: "group" });
  const head = part(el, "heading", "h3", { class: "effects-heading" });
  head.textContent = heading;
  const note = part(el, "note", "p", { class: "hint" });
  const plot = part(el, "plot", "div", { class: "plot effects-plot", role: "figure", "aria-label": heading });
  const tools = part(el, "tools", "div", { class: "effects-tools" });
  return { el, note, plot, tools };
}

/** No picture in this cell (yet): say why. */
function empty(c, text) {
  window.Plotly.purge(c.plot);
  c.plot.hidden = true;
  c.el.dataset.drawn = "0";
  c.note.textContent = text;
  replace(c.tools);
}

/** A layer x head (or layer x position) map on the diverging scale, 0 white in the middle, its unit on the colour
 *  bar. Clicking a head's cell opens that head (memory.open, the latest render's). */
function divergingMap(ctx, c, { z, x, y, xTitle, unit, hover, st, heads, memory }) {
  c.plot.hidden = false;
  c.el.dataset.drawn = "1";
  const range = divergingRange(z);
  const L = z.length;
  ctx.plot(c.plot, [{
    type: "heatmap", z, x, y, colorscale: plotlyDiverging, zmin: range.zmin, zmid: 0, zmax: range.zmax, xgap: 1, ygap: 1,
    // the bar's title in a word (the whole definition is the hover's and the note's): a long one ran off the plot
    colorbar: { title: { text: unit.split(":")[0], side: "right" }, thickness: 12 },
    hovertemplate: `layer %{y}, ${hover}<br>${unit}: %{z:.4f}<extra>${heads ? "click: its pattern" : ""}</extra>`,
  }], {
    height: Math.max(300, 16 * L + 110), margin: { l: 50, r: 10, t: 20, b: heads ? 45 : 90 },
    xaxis: { title: { text: xTitle }, ...(heads ? { tickmode: "array", tickvals: x } : { type: "category", tickangle: -60 }),
      showgrid: false, zeroline: false, fixedrange: true },
    yaxis: { title: { text: "layer" }, autorange: "reversed", showgrid: false, zeroline: false, fixedrange: true, dtick: L > 16 ? 2 : 1 },
    shapes: heads && st.open_head ? [{ type: "rect", x0: st.head - 0.5, x1: st.head + 0.5, y0: st.layer - 0.5,
      y1: st.layer + 0.5, line: { color: HIGHLIGHT, width: 3 }, fillcolor: TRANSPARENT }] : [],
  });
  if (heads && !c.plot.dataset.wired) {         // Plotly's listener is added once; it opens what the latest render says
    c.plot.dataset.wired = "1";
    c.plot.on("plotly_click", (ev) => memory.open?.(ev.points[0].y, ev.points[0].x));
  }
  return range;
}

const headCSV = (z) => [["layer", ...z[0].map((_, hd) => `head ${hd}`)], ...z.map((r, l) => [l, ...r.map((v) => (v === null ? "" : Number(exactString(v))))])];

function dlaMap(ctx, c, ans, st, info) {
  if (!can(info, "attribution")) return empty(c, `Not available for ${info.title}: ${whyNot(info, "attribution")}.`);
  if (!ans) return empty(c, "Pick a target: click a token in the Next token panel (Shift+click: a distractor), or type one.");
  if (ans.error) return empty(c, refusal(ans.error));
  const a = ans.attribution, z = rowsOf(a.heads);
  const diff = a.metric === "logit_difference";
  const what = diff ? `logit(${tokenLabel(a.target.token)}) − logit(${tokenLabel(a.distractor.token)})` : `logit(${tokenLabel(a.target.token)})`;
  const unit = "DLA (logit units)";
  const heads = z.flat().reduce((s, v) => s + v, 0), mlps = rowsOf(a.mlps).reduce((s, v) => s + v, 0);
  const range = divergingMap(ctx, c, { z, x: z[0].map((_, i) => i), y: z.map((_, i) => i), xTitle: "head", unit,
    hover: "head %{x}", st, heads: true, memory: ctx.memory });
  c.note.textContent = `Each head's direct share of ${what} after token ${a.position} “${tokenLabel(ans.tokens[a.position])}”` +
    ` (through the final norm, its scale frozen). Heads together ${fmt(heads, 3)}, MLPs ${fmt(mlps, 3)}, embeddings ` +
    `${fmt(a.embeddings, 3)}: all parts sum to ${fmt(a.sum, 3)}; the model's own ${diff ? "logit difference" : "logit"} is ` +
    `${fmt(a.logit, 3)}. Colours: ${range.label}.`;
  c.note.append(" ", typedTarget(a.target, ctx.go));   // the token a typed target became, and the other spelling
  c.el.dataset.logit = String(a.logit);
  const ex = { plot: c.plot, name: `attnscope-${st.model}-dla-${shown(a.target.token)}`,
    csv: () => headCSV(z), json: () => ({ model: st.model, text: st.text, ...a, unit, colour_scale: { zmin: range.zmin, zmax: range.zmax } }) };
  replace(c.tools, exportGroup(ex, "the DLA map"));
  return ex;
}

function differences(p) {
  const out = [];
  p.clean_tokens.forEach((t, i) => {
    if (t !== p.corrupt_tokens[i]) out.push(`${i} “${tokenLabel(t)}” → “${tokenLabel(p.corrupt_tokens[i])}”`);
  });
  return out;
}

function patchingMap(ctx, c, ans, st) {
  if (!st.corrupt.trim()) return empty(c, "Type a corrupt text (the same number of tokens as the clean one, e.g. with one name swapped) and press Run effects.");
  if (!ans) return empty(c, "Pick a target first.");
  if (ans.error) return empty(c, refusal(ans.error));
  const per = ans.site === "residual";              // [layer][position]; every other site [layer][head]
  const gap = ans.recovery !== null && ans.recovery !== undefined;
  const z = gap ? rowsOf(ans.recovery) : rowsOf(ans.patched).map((r) => r.map((v) => v - ans.corrupt));
  const unit = gap ? "recovery: (patched − corrupt)/(clean − corrupt)" : "patched − corrupt";
  const x = per ? ans.clean_tokens.map((t, i) => `${i} ${plotlyText(tokenLabel(t))}`) : z[0].map((_, i) => i);
  const range = divergingMap(ctx, c, { z, x, y: z.map((_, i) => i), xTitle: per ? "position" : "head", unit,
    hover: per ? "position %{x}" : "head %{x}", st, heads: !per, memory: ctx.memory });
  const metric = ans.metric === "logit_difference"
    ? `logit(${tokenLabel(ans.target.token)}) − logit(${tokenLabel(ans.distractor.token)})` : `log p(${tokenLabel(ans.target.token)})`;
  const diff = differences(ans);
  c.note.textContent = `Metric ${metric}: clean ${fmt(ans.clean, 3)}, corrupt ${fmt(ans.corrupt, 3)}. ` +
    (ans.direction === "denoise" ? `Each ${per ? "layer's residual stream at one position" : "head"} (${ans.hook}) takes its clean value in the corrupt run: 1 = it alone restores the clean metric, 0 = no effect. `
      : `Each ${per ? "layer's residual stream at one position" : "head"} (${ans.hook}) takes its corrupt value in the clean run: 1 = no effect, 0 = it alone gives the corrupt metric. `) +
    (gap ? "" : "Clean and corrupt give the same metric, so recovery is undefined: the map shows patched − corrupt. ") +
    (diff.length ? `The texts differ at ${diff.join(", ")}. ` : "The two texts make the same tokens. ") + `Colours: ${range.label}.`;
  const ex = { plot: c.plot, name: `attnscope-${st.model}-patching-${ans.site}-${ans.direction}`,
    csv: () => (per ? [["layer", ...ans.clean_tokens.map((t, i) => `${i} ${t}`)], ...z.map((r, l) => [l, ...r])] : headCSV(z)),
    json: () => ({ model: st.model, clean_text: st.text, corrupt_text: st.corrupt, ...ans, shown: unit }) };
  replace(c.tools, exportGroup(ex, "the patching map"));
  return ex;
}

/** Path patching's map: each head the one sender, the share of the clean−corrupt gap its paths leave. */
function pathMap(ctx, c, ans, st) {
  if (!ans) return empty(c, "Pick a target and type a corrupt text first.");
  if (ans.error) return empty(c, refusal(ans.error));
  const gap = ans.recovery !== null && ans.recovery !== undefined;
  const z = gap ? rowsOf(ans.recovery) : rowsOf(ans.patched).map((r) => r.map((v) => v - ans.corrupt));
  const unit = gap ? "recovery: (patched − corrupt)/(clean − corrupt)" : "patched − corrupt";
  const range = divergingMap(ctx, c, { z, x: z[0].map((_, i) => i), y: z.map((_, i) => i), xTitle: "sender head", unit,
    hover: "sender head %{x}", st, heads: true, memory: ctx.memory });
  const into = ans.receivers.map(([l, hd]) => `L${l}H${hd}`).join(", ");
  c.note.textContent = `Each head alone sends its corrupt output (${ans.hooks.senders}) to ${into}'s ${ans.receiver_input} ` +
    `(${ans.hooks.receivers}) along direct paths, every other head frozen at its clean output, the MLPs recomputed; ` +
    `the rest of the clean run is computed afresh. 1 = the paths carry nothing of the corruption, 0 = all of it. ` +
    `Clean ${fmt(ans.clean, 3)}, corrupt ${fmt(ans.corrupt, 3)}. Colours: ${range.label}.`;
  const ex = { plot: c.plot, name: `attnscope-${st.model}-path-patching-${ans.receiver_input}`, csv: () => headCSV(z),
    json: () => ({ model: st.model, clean_text: st.text, corrupt_text: st.corrupt, ...ans, shown: unit }) };
  replace(c.tools, exportGroup(ex, "the path patching map"));
  return ex;
}

// ---- one head on both texts --------------------------------------------------------------------------------------
function patternMap(ctx, c, ans, st, which) {
  if (!ans) return empty(c, "Type a corrupt text to see this head on it too.");
  if (ans.error) return empty(c, refusal(ans.error));
  const m = ans.attention.sub(0, 0), T = m.shape[0];
  const z = Array.from({ length: T }, (_, i) => Array.from(m.row(i)));
  let max = 0;
  for (const r of z) for (const v of r) max = Math.max(max, v);
  const range = colourRange(st, max);
  const labels = ans.tokens.map((t, i) => `${i} ${plotlyText(tokenLabel(t))}`);
  c.plot.hidden = false;
  c.el.dataset.drawn = "1";
  c.el.dataset.tokens = String(T);
  ctx.plot(c.plot, [{
    type: "heatmap", z, x: labels, y: labels, colorscale: plotlyScale, zmin: range.zmin, zmax: range.zmax,
    colorbar: { title: { text: "weight", side: "right" }, thickness: 10 },
    hovertemplate: "query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>",
  }], {
    height: 360, margin: { l: 90, r: 10, t: 10, b: 90 },
    xaxis: { type: "category", tickangle: -60, automargin: true }, yaxis: { type: "category", autorange: "reversed", automargin: true },
  });
  c.note.textContent = `Queries (rows) × keys (columns) on the ${which} text; colours: ${range.label}.`;
  const ex = { plot: c.plot, name: `attnscope-${st.model}-${which}-L${st.layer}H${st.head}`,
    csv: () => [["query", ...ans.tokens], ...z.map((r, i) => [ans.tokens[i], ...r])],
    json: () => ({ model: st.model, text: which === "clean" ? st.text : st.corrupt, layer: st.layer, head: st.head, tokens: ans.tokens, attention: z }) };
  replace(c.tools, exportGroup(ex, `the ${which} pattern`));
  return ex;
}

function patterns(container, got, st, ctx, go) {
  const box = part(container, "patterns", "section", { class: "effects-patterns", "aria-label": "One head on both texts" });
  box.hidden = false;
  const bar = part(box, "bar", "div", { class: "effects-bar" });
  const grid = part(box, "grid", "div", { class: "compare-grid" });
  if (!st.open_head) {                 // closed: a way in without the mouse (the head the layer and head menus name)
    box.dataset.layer = box.dataset.head = "";
    grid.hidden = true;
    for (const plot of grid.querySelectorAll(".js-plotly-plot")) window.Plotly.purge(plot);
    replace(bar, h("button", { type: "button", class: "small", id: "effects-open-head", onclick: () => go({ open_head: true }),
      text: `Show layer ${st.layer}, head ${st.head} on both texts` }),
    h("span", { class: "hint", text: "or click a head in either map." }));
    return [];
  }
  grid.hidden = false;
  box.dataset.layer = st.layer;
  box.dataset.head = st.head;
  replace(bar, h("h3", { text: `Layer ${st.layer}, head ${st.head} on both texts` }),
    h("button", { type: "button", class: "small", id: "effects-close-head", text: "Close", onclick: () => go({ open_head: false }) }));
  const cells = [cell(grid, "clean", "clean"), cell(grid, "corrupt", "corrupt")];
  return [patternMap(ctx, cells[0], got.clean_head, st, "clean"), patternMap(ctx, cells[1], got.corrupt_head, st, "corrupt")];
}

// ---- knockout ------------------------------------------------------------------------------------------------------
/** The knockout's choice after clicking token i: the first click picks the query, later ones toggle keys before
 *  it; a token after the query becomes the query; clicking the query clears the choice. */
function chosen(st, i) {
  const q = st.queries[0];
  if (q === undefined) return { queries: [i], keys: [] };
  if (i === q) return { queries: [], keys: [] };
  if (i > q) return { queries: [i], keys: st.keys.filter((k) => k < i) };
  return { keys: st.keys.includes(i) ? st.keys.filter((k) => k !== i) : [...st.keys, i].sort((a, b) => a - b) };
}

function knockoutPanel(container, meta, got, st, ctx, go) {
  const L = ctx.info.layers;
  const box = part(container, "knockout", "section", { class: "effects-knockout", "aria-labelledby": "knockout-h" });
  box.hidden = false;
  const [first, last] = st.knockout_layers ?? [0, L - 1];
  const T = meta.tokens.length, q = st.queries[0];
  const chips = meta.tokens.map((tok, i) => {
    const role = st.queries.includes(i) ? "query" : st.keys.includes(i) ? "key" : null;
    return h("button", { type: "button", class: ["chip", role].filter(Boolean).join(" "), "data-index": i,
      "aria-pressed": String(Boolean(role)), "aria-label": `token ${i}: ${tok}${role ? ` (${role})` : ""}`,
      onclick: () => go({ ...chosen(st, i), knockout: false }) },
    h("span", { class: "tok", text: tokenLabel(tok) }), h("span", { class: "idx", "aria-hidden": "true", text: role ? `${i} ${role}` : i }));
  });
  const layerBox = (id, value) => h("input", { type: "number", id, min: 0, max: L - 1, value, class: "narrow" });
  const from = layerBox("knockout-first", first), to = layerBox("knockout-last", last);
  const setLayers = () => {
    const a = Math.max(0, Math.min(L - 1, Number(from.value) || 0)), b = Math.max(0, Math.min(L - 1, Number(to.value) || 0));
    go({ knockout_layers: [Math.min(a, b), Math.max(a, b)], knockout: false });
  };
  from.onchange = to.onchange = setLayers;
  const ready = q !== undefined && q < T && st.keys.length > 0;
  const what = q === undefined ? "Click the query token (the one that stops reading), then the key tokens it stops reading."
    : !st.keys.length ? `Query ${q} “${tokenLabel(meta.tokens[q])}”: now click the keys (tokens before it) it stops reading.`
      : `Query ${q} “${tokenLabel(meta.tokens[q])}” stops reading ${st.keys.map((k) => `${k} “${tokenLabel(meta.tokens[k])}”`).join(", ")} in every head of layers ${first}–${last}.`;
  const result = part(box, "result", "div", { class: "knockout-result", "aria-live": "polite" });
  replace(box,
    h("h3", { id: "knockout-h", text: "Attention knockout" }),
    h("p", { class: "hint", text: what }),
    h("div", { class: "chips knockout-chips", role: "group", "aria-label": "Tokens of the clean text: query, then keys" }, chips),
    h("div", { class: "view-controls" },
      h("label", { for: "knockout-first", text: "Layers " }), from, h("label", { for: "knockout-last", text: " to " }), to,
      h("button", { type: "button", class: "primary small", id: "knockout-run", disabled: !ready, text: "Run knockout",
        onclick: () => go({ knockout: true }) }),
      st.queries.length + st.keys.length > 0 && h("button", { type: "button", class: "small", text: "Clear",
        onclick: () => go({ queries: [], keys: [], knockout: false }) })),
    result);
  const ans = got.knockout;
  if (!ans) {
    replace(result);
    result.dataset.kl = "";
    return null;
  }
  if (ans.error) {
    replace(result, h("p", { class: "error", text: refusal(ans.error) }));
    return null;
  }
  const e = ans.effect;
  result.dataset.kl = String(e.kl);
  replace(result,
    h("p", { class: "note", text: `Knocked out in layers ${ans.layers[0]}–${ans.layers[1]}: KL(before ‖ after) = ${fmt(e.kl, 4)} nats; ` +
      `mean change in token log-prob ${fmt(e.mean_logprob_change, 4)}.` }),
    h("div", { class: "next-compare" }, bars(e.next_tokens_before, "before", "before"), bars(e.next_tokens_after, "after", "after")));
  return ans;
}

// ---- the view ---------------------------------------------------------------------------------------------------
export function render(container, { meta, results }, st, ctx) {
  const info = ctx.info;
  const go = controls(container, st, ctx);
  container.querySelector(":scope > [data-part=controls]").hidden = !supported(info);
  const note = part(container, "note", "p", { class: "note" });
  const grid = part(container, "maps", "div", { class: "compare-grid effects-maps" });
  container.dataset.site = st.site;
  container.dataset.target = st.target;
  if (!supported(info)) {
    const able = ctx.boot.models.filter(supported);
    replace(note, `${info.title} is ${info.kind === "decoder" ? "a decoder without an LM head" : "an encoder"}: effects read ` +
      "the next-token logits of a decoder with an LM head. ", able.length ? "Served models that have one: " : "No served model has one.",
    able.map((m, k) => [k ? ", " : "", h("a", { href: ctx.href({ model: m.id }), text: m.title })]));
    for (const k of ["patterns", "knockout"]) {
      const el = container.querySelector(`:scope > [data-part=${k}]`);
      if (el) el.hidden = true;
    }
    for (const plot of container.querySelectorAll(".js-plotly-plot")) window.Plotly.purge(plot);
    replace(grid);
    return { name: `attnscope-${st.model}-effects` };
  }
  const names = plan(st, info).map((x) => x.name);
  const got = Object.fromEntries(names.map((n, i) => [n, results[i]]));
  note.textContent = `Clean text: the page's text, ${meta.tokens.length} tokens. Metric: ` +
    (st.target ? (st.distractor ? `logit(${tokenLabel(shown(st.target))}) − logit(${tokenLabel(shown(st.distractor))})`
      : `logit(${tokenLabel(shown(st.target))}) (DLA), log p(${tokenLabel(shown(st.target))}) (patching)`) : "none yet: pick a target") +
    " at the last position.";
  // the maps' clicks open a head; memory holds the latest render's way to do it (the listeners are added once)
  ctx.memory.open = (layer, hd) => go({ layer, head: hd, open_head: true });
  // both cells first, then the plots: each is drawn at its cell's final width
  const site = ctx.boot.sites.find((s) => s.id === st.site)?.label ?? st.site;
  const cells = [cell(grid, "dla", "Direct logit attribution"), cell(grid, "patching", `Patching: ${site}, ${st.direction}`)];
  const dla = dlaMap(ctx, cells[0], got.dla, st, info);
  const patch = patchingMap(ctx, cells[1], got.patching, st);
  const path = st.receivers.length ? pathMap(ctx, cell(grid, "path", `Path patching into ${st.receivers.map((x) =>
    `L${x.replace(".", "H")}`).join(", ")} (${st.receiver_input})`), got.path, st) : null;
  const stale = st.receivers.length ? null : grid.querySelector(":scope > [data-part=path]");
  if (stale) {
    for (const plot of stale.querySelectorAll(".js-plotly-plot")) window.Plotly.purge(plot);
    stale.remove();
  }
  const pats = patterns(container, got, st, ctx, go);
  const ko = knockoutPanel(container, meta, got, st, ctx, go);
  const all = { model: st.model, clean: st.text, corrupt: st.corrupt, target: st.target, distractor: st.distractor || null,
    site: st.site, direction: st.direction, dla: dla ? got.dla.attribution : null, patching: patch ? got.patching : null,
    path_patching: path ? got.path : null,
    head: st.open_head ? { layer: st.layer, head: st.head } : null, knockout: ko };
  const maps = [["dla", dla], ["patching", patch], ["path_patching", path]].filter(([, ex]) => ex);
  return {
    plot: (dla ?? patch ?? pats.find(Boolean))?.plot, name: `attnscope-${st.model}-effects`,
    json: () => all,
    csv: maps.length ? () => maps.flatMap(([k, ex], n) => [...(n ? [[]] : []), [k], ...ex.csv()]) : null,
  };
}
