// Corpus view: a result file of `attnscope corpus` (opened here, read in the browser, never uploaded): one
// statistic per head averaged over the whole corpus, and the heads clustered by their Jensen–Shannon distance. The
// opened file is kept in this browser's storage (localStorage, KEPT), so a reload opens it again; Close forgets it.
import * as api from "../api.js";
import { h, part, replace } from "../dom.js";
import { colourRange, fixedTop, fmt, plotlyScale } from "../scale.js";

export const title = "Corpus";
export const help = "Per-head statistics over a whole corpus (Clark et al. 2019): start a corpus job on this server " +
  "(it runs in the Atlas tab, which follows it and opens its result), or open a .json result file of the command " +
  "line's attnscope corpus below: it is read in this browser, not uploaded. " +
  "Left: the chosen statistic for every head; right: the heads' Jensen–Shannon distances, in cluster order.";

export function requests() {
  return [];
}

const KEPT = "attnscope.corpus";      // localStorage: the last opened result file's text

/** The result file kept by an earlier visit (null: none, or not a result any more). */
function kept() {
  try {
    const job = JSON.parse(localStorage.getItem(KEPT));
    return job?.stats && job.layers && job.heads ? job : null;
  } catch {
    return null;
  }
}

/** Keep an opened file's text for the next visit; false when the browser's storage cannot hold it. */
function keep(text) {
  try {
    localStorage.setItem(KEPT, text);
    return true;
  } catch {
    localStorage.removeItem(KEPT);
    return false;
  }
}

function statMap(ctx, el, job, stat, st) {
  const z = job.stats[stat];
  let max = 0;
  for (const r of z) for (const v of r) max = Math.max(max, v);
  const range = colourRange(st, max, fixedTop(stat, 2 + job.tokens / Math.max(job.texts, 1)));
  ctx.plot(el, [{
    type: "heatmap", z, colorscale: plotlyScale, zmin: range.zmin, zmax: range.zmax, xgap: 1, ygap: 1,
    hovertemplate: `layer %{y}, head %{x}<br>${stat}: %{z:.6f}<extra></extra>`,
  }], {
    title: `${stat} over ${job.texts} texts (${range.label})`, margin: { l: 60, r: 10, t: 50, b: 50 },
    xaxis: { title: { text: "head" }, dtick: 1 }, yaxis: { title: { text: "layer" }, autorange: "reversed", dtick: 1 },
  });
}

function distanceMap(ctx, el, job) {
  const order = job.js_map.order, H = job.heads;
  const name = (k) => `L${Math.floor(k / H)}H${k % H}`;
  const z = order.map((i) => order.map((j) => job.js_distance[i][j]));
  ctx.plot(el, [{
    type: "heatmap", z, x: order.map(name), y: order.map(name), colorscale: plotlyScale, zmin: 0, zmax: 1,
    hovertemplate: "%{y} vs %{x}<br>JS distance %{z:.4f}<extra></extra>",
  }], {
    title: "Jensen–Shannon distance between heads (0–1, clustered)", margin: { l: 60, r: 10, t: 50, b: 60 },
    xaxis: { type: "category", showticklabels: order.length <= 80 }, yaxis: { type: "category", autorange: "reversed",
      showticklabels: order.length <= 80 },
  });
}

/** The button that starts a corpus job on the bundled corpus for the page's model, as the Atlas' form does, and
 *  opens the Atlas on it (which follows its progress and opens it when done); its refusal said beside it. */
function startJob(st, ctx) {
  const said = h("span", { class: "hint", id: "corpus-start-note", role: "status" });
  const able = ctx.info.capabilities?.features?.jobs !== false;
  const button = h("button", { type: "button", id: "corpus-start", disabled: !able,
    text: `Start a corpus job for ${ctx.info.title} here`,
    title: able ? "per-head statistics over 200 texts of the bundled corpus (Python docstrings), computed on this server"
      : `not for ${ctx.info.title}: ${ctx.info.capabilities.short?.jobs ?? "no corpus jobs"}`,
    onclick: async () => {
      said.textContent = " Starting…";
      try {
        const job = await api.startJob({ kind: "atlas", model: st.model, corpus: "bundled", options: { texts: 200 } });
        ctx.go({ view: "atlas", job: "" });              // its row in the jobs list: Open once done
      } catch (err) {
        said.textContent = ` The server refused: ${err.detail || err.message}`;
      }
    } });
  return [button, said];
}

/** ctx.memory holds the opened result (loaded: page memory only, a file is not a link) and its statistic on show
 *  (picked: one of the file's own names). */
export function render(container, _data, st, ctx) {
  const memory = ctx.memory;
  if (!memory.loaded && !memory.closed) memory.loaded = kept();        // a reload: the file opened before
  const { loaded, picked } = memory;
  const controls = part(container, "controls", "div", { class: "view-controls" });
  const input = h("input", { type: "file", accept: ".json,application/json", id: "corpus-file" });
  const stats = loaded ? Object.keys(loaded.stats) : [];
  const chosen = stats.includes(picked) ? picked : stats.includes(st.stat) ? st.stat : stats[0];
  const close = loaded && h("button", { type: "button", id: "corpus-close", text: "Close",
    title: "forget this file (it is kept in this browser until closed)",
    onclick: () => { localStorage.removeItem(KEPT); Object.assign(memory, { loaded: null, closed: true }); render(container, _data, st, ctx); } });
  replace(controls, h("label", { for: "corpus-file", text: "Result file: " }), input, close,
    loaded && h("label", {}, " statistic ", h("select", { id: "corpus-stat",
      onchange: (e) => { memory.picked = e.target.value; render(container, _data, st, ctx); } },
      stats.map((s) => h("option", { value: s, selected: s === chosen, text: s.replace(/_/g, " ") })))));
  const note = part(container, "note", "p", { class: "note" });
  const grid = part(container, "grid", "div", { class: "compare-grid" });
  input.onchange = async () => {
    const file = input.files[0];
    if (!file) return;
    try {
      const text = await file.text();
      const job = JSON.parse(text);
      if (!job.stats || !job.layers || !job.heads) throw new Error("not an attnscope corpus result (no stats)");
      Object.assign(memory, { loaded: job, closed: false, unkept: !keep(text) && text.length });
    } catch (err) {
      note.textContent = `Could not read ${file.name}: ${err.message}`;
      return;
    }
    render(container, _data, st, ctx);
  };
  if (!loaded) {
    replace(note, "No corpus opened yet. ", startJob(st, ctx), " Or open a result file of the command line's ",
      h("code", { text: `attnscope corpus texts.txt --model ${st.model}` }), " here.");
    replace(grid);
    return { name: "attnscope-corpus" };
  }
  const job = loaded;
  container.dataset.texts = String(job.texts);
  note.textContent = `${job.title || job.model}: ${job.texts} texts, ${job.tokens} tokens` +
    (job.input?.skipped ? `, ${job.input.skipped} skipped (see the file's input.problems)` : "") +
    `. Special-token mass: ${Object.keys(job.special_token_mass || {}).join(", ") || "none"}; mean of each head ` +
    `over all query rows of all texts. ${job.run?.texts_per_s ? `Computed at ${fmt(job.run.texts_per_s, 1)} texts/s.` : ""}` +
    (memory.unkept ? ` This file (${(memory.unkept / 2 ** 20).toFixed(1)} MB) is too big for this browser's storage: ` +
      "a reload will not reopen it." : " Kept in this browser: a reload opens it again.");
  const [a, b] = ["stat", "js"].map((k) => part(grid, k, "div", { class: "plot compare-plot", role: "figure" }));
  statMap(ctx, a, job, chosen, st);
  if (job.js_distance && job.js_map) distanceMap(ctx, b, job);
  else replace(b, h("p", { class: "note", text: "This result has no Jensen–Shannon distances (js_rows 0)." }));
  return {
    plot: a, name: `attnscope-corpus-${job.model}-${chosen}`,
    json: () => job,
    csv: () => [["layer", ...Array.from({ length: job.heads }, (_, i) => `head ${i}`)],
      ...job.stats[chosen].map((r, l) => [l, ...r])],
  };
}
