// Atlas view: head atlases over a corpus, computed by jobs on the server (POST /api/jobs, kind "atlas"), started,
// followed and cancelled here. Top, the jobs panel: a form that starts a job on the bundled corpus or a file read in
// this browser and sent with the job, and every job the server has (GET /api/jobs: the list survives a reload), each
// with its progress (texts done of the total, the rate and the time left), Cancel while it is queued or running,
// Resume once stopped, Open once done. Below, a finished atlas: left, the Head Finder: every head on two chosen
// statistics (x_stat, y_stat), those under the filter's floor (y_min on y_stat) greyed, the head list below sorted by
// `sort`; click a head for its dashboard. Right, the dashboard of head (layer, head): each of its statistics against
// every head's (percentile among the heads), and its top examples as token strips coloured by the attention from
// the example's query (its top keys). A click on an example opens that window in the head view, re-run live, with its
// query pinned. State: job, x_stat, y_stat, y_min, sort, layer, head, example (all in the URL); the jobs' progress is
// the server's, polled while one is under way (ctx.memory.timer).
import * as api from "../api.js";
import { h, part, replace } from "../dom.js";
import { color, fmt, HEAD_COLORS, textOn } from "../scale.js";

export const title = "Atlas";
export const help = "A head atlas over a corpus, computed by a job on the server: start one below on the bundled " +
  "corpus (sentences of the Python standard library's docstrings) or on a file of yours, follow it, cancel it; the " +
  "jobs stay listed after a reload. Open a finished one: left, every head on two statistics (the Head Finder) — " +
  "click one; right, its statistics against all heads and its top examples, coloured by attention from the " +
  "example's query; click an example to open it in the head view.";

const POLL_MS = 1000;
const ACTIVE = ["queued", "running", "cancelling"];
const FORMATS = { jsonl: "jsonl", csv: "csv", tsv: "tsv" };       // a file's format by its extension; else text

export function requests(st) {
  return [{ endpoint: "jobs", soft: true }, ...(st.job ? [{ endpoint: "atlas", job: st.job, soft: true }] : [])];
}

const name = (l, hd) => `L${l}H${hd}`;
const label = (s) => s.replace(/_/g, " ");

/** Each head's {layer, head, x, y}, those at or above the floor first-class, sorted as `sort` says. */
export function heads(atlas, st) {
  const out = [];
  for (let l = 0; l < atlas.layers; l++) {
    for (let hd = 0; hd < atlas.heads; hd++) {
      const y = atlas.stats[st.y_stat]?.[l][hd] ?? 0;
      out.push({ layer: l, head: hd, x: atlas.stats[st.x_stat]?.[l][hd] ?? 0, y, kept: y >= st.y_min });
    }
  }
  const by = { "-value": (a, b) => b.y - a.y, value: (a, b) => a.y - b.y, layer: (a, b) => a.layer - b.layer || a.head - b.head,
    "-layer": (a, b) => b.layer - a.layer || a.head - b.head, head: (a, b) => a.head - b.head || a.layer - b.layer,
    "-head": (a, b) => b.head - a.head || a.layer - b.layer }[st.sort];
  return out.sort(by);
}

function finder(ctx, el, atlas, list, st) {
  const kept = list.filter((p) => p.kept), out = list.filter((p) => !p.kept);
  const trace = (pts, extra) => ({
    type: "scatter", mode: "markers", x: pts.map((p) => p.x), y: pts.map((p) => p.y),
    text: pts.map((p) => name(p.layer, p.head)), customdata: pts.map((p) => [p.layer, p.head]),
    hovertemplate: `%{text}<br>${label(st.x_stat)}: %{x:.4f}<br>${label(st.y_stat)}: %{y:.4f}<extra></extra>`, ...extra,
  });
  const selected = list.filter((p) => p.layer === st.layer && p.head === st.head);
  ctx.plot(el, [
    trace(out, { name: `below ${st.y_min}`, marker: { color: "#c8ccd4", size: 6 } }),
    trace(kept, { name: "heads", marker: { color: kept.map((p) => p.layer), colorscale: "Cividis", size: 8,
      colorbar: { title: { text: "layer" }, thickness: 12 } } }),
    trace(selected, { name: "selected", marker: { color: HEAD_COLORS[1], size: 16, symbol: "circle-open",
      line: { width: 3 } } }),
  ], {
    title: `Head Finder: ${atlas.layers * atlas.heads} heads over ${atlas.texts} texts`, showlegend: false,
    margin: { l: 60, r: 10, t: 50, b: 50 }, xaxis: { title: { text: label(st.x_stat) } },
    yaxis: { title: { text: label(st.y_stat) } },
  });
}

/** The head's value of every statistic as a percentile among all heads (grey: every head; marked: this one). */
function profile(ctx, el, atlas, st) {
  const stats = Object.keys(atlas.stats), all = [], mine = [];
  for (const s of stats) {
    const values = atlas.stats[s].flat().sort((a, b) => a - b), v = atlas.stats[s][st.layer][st.head];
    const pct = (x) => (100 * values.filter((u) => u < x).length) / Math.max(1, values.length - 1);
    for (const u of values) all.push([pct(u), label(s), u]);
    mine.push([pct(v), label(s), v]);
  }
  const trace = (pts, marker) => ({ type: "scatter", mode: "markers", x: pts.map((p) => p[0]), y: pts.map((p) => p[1]),
    customdata: pts.map((p) => p[2]), hovertemplate: "%{y}: %{customdata:.4f} (percentile %{x:.0f})<extra></extra>",
    marker });
  ctx.plot(el, [trace(all, { color: "#c8ccd4", size: 5 }), trace(mine, { color: HEAD_COLORS[1], size: 12 })], {
    title: `${name(st.layer, st.head)} against all heads`, showlegend: false, margin: { l: 150, r: 10, t: 50, b: 40 },
    xaxis: { title: { text: "percentile among the heads" }, range: [-3, 103] }, yaxis: { type: "category" },
  });
}

/** One example as a strip of tokens, each coloured by the weight the example's query puts on it. */
function strip(ex, chosen, open) {
  const weight = new Map(ex.keys.map((k, i) => [k, ex.weights[i]]));
  return h("li", { class: "atlas-example" + (chosen ? " chosen" : ""), tabindex: 0, role: "link",
    title: `score ${fmt(ex.score, 4)} · text ${ex.number} · open it in the head view`, onclick: open,
    onkeydown: (e) => { if (e.key === "Enter") open(); } },
  h("span", { class: "atlas-score", text: fmt(ex.score, 3) }),
  ex.tokens.map((t, j) => {
    const w = weight.get(j) ?? 0;
    return h("span", { class: "atlas-token" + (j === ex.query ? " query" : ""),
      style: `background:${color(w)};color:${textOn(w)}`, title: `${t}: ${fmt(w, 3)}`, text: t });
  }));
}

/** "12 s", "3 min 20 s", "1 h 5 min". */
function duration(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

/** A job's progress in words: texts done of the total, and while it runs its rate and the time left. */
export function progressText(job) {
  const p = job.progress;
  const parts = [`${p.texts_done.toLocaleString("en")} of ${p.texts_total.toLocaleString("en")} texts`];
  if (p.rate) parts.push(`${fmt(p.rate, 1)} texts/s`);
  if (p.eta_s !== null && p.eta_s !== undefined && job.state === "running") parts.push(`about ${duration(p.eta_s)} left`);
  return parts.join(" · ");
}

/** The request that made a job (what POSTing again resumes): known for the bundled corpus only (an upload's text
 *  stays with the server, which needs it sent again). */
const again = (job) => (job.corpus === "bundled" ? { kind: job.kind, model: job.model, corpus: "bundled",
  options: job.options } : null);

/** The form that starts a job: the model (a served model; the server refuses those outside the zoo), the corpus
 *  (bundled, or a file read here and sent with the job) and how many texts to sample. */
function jobForm(panel, st, ctx) {
  const form = part(panel, "form", "form", { class: "view-controls atlas-new", "aria-label": "Start an atlas job" });
  if (form.dataset.wired) return form;                 // built once: what the user typed stays between renders
  form.dataset.wired = "1";
  const models = ctx.boot.models.filter((m) => m.kind !== "encoder-decoder");
  const file = h("input", { type: "file", id: "atlas-file", accept: ".txt,.jsonl,.csv,.tsv,text/plain", hidden: true });
  const corpus = h("select", { id: "atlas-corpus", onchange: () => { file.hidden = corpus.value !== "file"; } },
    h("option", { value: "bundled", text: "the bundled corpus (Python docstrings)" }),
    h("option", { value: "file", text: "a file of mine…" }));
  const note = h("span", { class: "hint", id: "atlas-form-note", role: "status" });
  replace(form,
    h("label", {}, "New atlas: model ", h("select", { id: "atlas-model" },
      models.map((m) => h("option", { value: m.id, selected: m.id === st.model, text: m.title })))),
    h("label", {}, " corpus ", corpus), file,
    h("label", {}, " texts ", h("input", { id: "atlas-texts", type: "number", min: 1, step: 1, value: 200,
      title: "a random sample of this many texts (seeded); empty: all" })),
    h("button", { type: "submit", id: "atlas-start", text: "Start" }), note);
  form.onsubmit = async (e) => {
    e.preventDefault();
    const texts = Number(form.querySelector("#atlas-texts").value);
    const body = { kind: "atlas", model: form.querySelector("#atlas-model").value, corpus: "bundled",
      options: texts > 0 ? { texts: Math.round(texts) } : {} };
    if (corpus.value === "file") {
      const chosen = file.files[0];
      if (!chosen) { note.textContent = "Choose a file first."; return; }
      const ext = chosen.name.split(".").pop().toLowerCase();
      body.corpus = { format: FORMATS[ext] || "text", data: await chosen.text() };
    }
    note.textContent = "Starting…";
    try {
      const job = await api.startJob(body);
      note.textContent = `Job ${job.id} started: its progress is in the list below.`;   // (its state there, kept current)
      ctx.memory.refresh?.();                        // the latest render's: the list polled from now on
    } catch (err) {
      note.textContent = `The server refused: ${err.detail || err.message}`;
    }
  };
  return form;
}

/** One row per job: its state, a progress bar, its progress in words, and what can be done with it. */
function jobRows(list, st, ctx, act) {
  return list.map((job) => {
    const p = job.progress;
    const actions = [];
    if (["queued", "running"].includes(job.state)) {
      actions.push(h("button", { type: "button", class: "atlas-cancel", text: "Cancel", onclick: () => act(() => api.cancelJob(job.id)) }));
    } else if (["cancelled", "interrupted", "failed"].includes(job.state) && again(job)) {
      actions.push(h("button", { type: "button", class: "atlas-resume", text: "Resume",
        title: "start it again from its finished chunks", onclick: () => act(() => api.startJob(again(job))) }));
    } else if (job.state === "done") {
      actions.push(h("a", { class: "atlas-open", href: ctx.href({ job: job.id, layer: 0, head: 0, example: 0 }),
        text: job.id === st.job ? "shown below" : "Open" }));
    }
    return h("li", { class: `atlas-job ${job.state}`, "data-job": job.id, "data-state": job.state,
      "data-done": p.texts_done },
    h("span", { class: "atlas-job-what", text: `${job.model} · ${job.corpus === "bundled" ? "bundled corpus" : job.corpus}` }),
    h("span", { class: "atlas-job-state", text: job.state }),
    h("progress", { max: Math.max(p.texts_total, 1), value: p.texts_done }),
    h("span", { class: "atlas-job-progress", text: progressText(job) + (job.error ? ` · ${job.error}` : "") }),
    actions);
  });
}

/** The jobs panel, kept current while a job is under way: the list is polled once a second and redrawn in place;
 *  when a job finishes the whole view is drawn again (its job menu gains it). */
function jobsPanel(container, list, st, ctx, redraw) {
  const memory = ctx.memory;
  clearTimeout(memory.timer);
  const mine = memory.renders = (memory.renders || 0) + 1;          // a later render's polling replaces this one's
  const panel = part(container, "jobs", "section", { class: "atlas-jobs", "aria-label": "Atlas jobs" });
  const rows = () => panel.querySelector(".atlas-job-list");
  const poll = async () => {
    clearTimeout(memory.timer);
    memory.timer = 0;
    if (memory.renders !== mine || container.hidden || !container.isConnected) return;   // left, or drawn again
    if (memory.asking) { memory.again = true; return; }              // one request at a time: ask again after it
    memory.asking = true;
    let fresh;
    try {
      fresh = await api.jobs();
    } catch {
      memory.timer = setTimeout(poll, POLL_MS * 3);
      return;
    } finally {
      memory.asking = false;
    }
    if (memory.renders !== mine) return;
    if (memory.again) { memory.again = false; poll(); return; }
    const finished = fresh.some((j) => j.state === "done" && !memory.list?.some((k) => k.id === j.id && k.state === "done"));
    memory.list = fresh;
    if (finished) { redraw(fresh); return; }
    replace(rows(), jobRows(fresh, st, ctx, act));
    if (fresh.some((j) => ACTIVE.includes(j.state))) memory.timer = setTimeout(poll, POLL_MS);
  };
  const act = async (call) => {
    try {
      await call();
    } catch (err) {
      panel.querySelector("#atlas-form-note").textContent = `The server refused: ${err.detail || err.message}`;
    }
    clearTimeout(memory.timer);
    await poll();
  };
  memory.refresh = () => { clearTimeout(memory.timer); poll(); };
  jobForm(panel, st, ctx);
  memory.list = list;
  part(panel, "list", "ol", { class: "atlas-job-list", "aria-label": "Atlas jobs, newest first" });
  replace(rows(), list.length ? jobRows(list, st, ctx, act)
    : [h("li", { class: "hint", text: "No atlas job yet: start one above." })]);
  if (list.some((j) => ACTIVE.includes(j.state))) memory.timer = setTimeout(poll, POLL_MS);
}

export function render(container, data, st, ctx) {
  const [list, atlas] = data.results;
  const all = Array.isArray(list) ? list.filter((j) => j.kind === "atlas") : [];
  jobsPanel(container, all, st, ctx, (fresh) => render(container, { ...data, results: [fresh, atlas] }, st, ctx));
  const jobs = all.filter((j) => j.state === "done");
  const controls = part(container, "controls", "div", { class: "view-controls" });
  const note = part(container, "note", "p", { class: "note" });
  const grid = part(container, "grid", "div", { class: "compare-grid" });
  const ready = atlas && !atlas.error && atlas.stats;
  const stats = ready ? Object.keys(atlas.stats) : [];
  const select = (id, value, options, onchange, text = label) => h("select", { id, onchange: (e) => onchange(e.target.value) },
    options.map((o) => h("option", { value: o, selected: o === value, text: text(o) })));
  replace(controls,
    h("label", {}, "atlas ", select("atlas-job", st.job, ["", ...jobs.map((j) => j.id)], (job) => ctx.go({ job }),
      (id) => { const j = jobs.find((x) => x.id === id); return j ? `${j.model} · ${j.corpus} · ${j.progress.texts_total} texts · ${id}` : "choose a finished job"; })),
    ready && h("label", {}, " x ", select("atlas-x", st.x_stat, stats, (x_stat) => ctx.go({ x_stat }))),
    ready && h("label", {}, " y ", select("atlas-y", st.y_stat, stats, (y_stat) => ctx.go({ y_stat }))),
    ready && h("label", {}, " y ≥ ", h("input", { id: "atlas-min", type: "number", step: "any", value: st.y_min,
      onchange: (e) => ctx.go({ y_min: Number(e.target.value) || 0 }) })));
  if (!ready) {
    note.textContent = atlas?.error ? `Could not open atlas ${st.job}: ${atlas.error.message}`
      : jobs.length ? "Choose a finished atlas job above."
        : "No finished atlas job yet: start one above (or with POST /api/jobs, see the README).";
    replace(grid);
    return { name: "attnscope-atlas" };
  }
  const layer = Math.min(st.layer, atlas.layers - 1), head = Math.min(st.head, atlas.heads - 1);
  const shown = { ...st, layer, head };
  const ordered = heads(atlas, shown);
  container.dataset.heads = String(ordered.length);
  note.textContent = `${atlas.title || atlas.model}: ${atlas.texts} texts, ${atlas.tokens} tokens. Examples ranked by ` +
    `${label(atlas.example_options.rank_by)}. ${ordered.filter((p) => p.kept).length} heads with ${label(st.y_stat)} ≥ ${st.y_min}.`;
  const left = part(grid, "left", "div", { class: "atlas-left" });
  const right = part(grid, "right", "div", { class: "atlas-right" });
  const scatter = part(left, "finder", "div", { class: "plot compare-plot atlas-finder", role: "figure",
    "aria-label": "Head Finder" });
  ctx.memory.pick = (p) => ctx.go({ layer: p.customdata[0], head: p.customdata[1], example: 0 });
  finder(ctx, scatter, atlas, ordered, shown);
  if (!scatter.dataset.wired && scatter.on) {          // clicks: what a click does is the latest render's (memory)
    scatter.dataset.wired = "1";
    scatter.on("plotly_click", (ev) => ctx.memory.pick?.(ev.points[0]));
  }
  const table = part(left, "list", "ol", { class: "atlas-heads" });
  replace(table, ordered.filter((p) => p.kept).slice(0, 30).map((p) => h("li", {},
    h("a", { href: ctx.href({ layer: p.layer, head: p.head, example: 0 }), class: "atlas-head",
      text: `${name(p.layer, p.head)} ${fmt(p.y, 4)}` }))));
  const dash = part(right, "profile", "div", { class: "plot compare-plot atlas-profile", role: "figure" });
  profile(ctx, dash, atlas, shown);
  const ex = atlas.examples[layer][head];
  const open = (e) => ctx.go({ view: "head", text: e.text, layer, head, pin: e.query, text_pair: "" });
  part(right, "heading", "h3", { class: "effects-heading" }).textContent = `Top examples of ${name(layer, head)}`;
  const examples = part(right, "examples", "ol", { class: "atlas-examples" });
  replace(examples, ex.top.map((e, i) => strip(e, i === st.example, () => open(e))));
  part(right, "deciles-heading", "h3", { class: "effects-heading" }).textContent = "By decile of the score";
  const deciles = part(right, "deciles", "ol", { class: "atlas-examples atlas-deciles" });
  replace(deciles, ex.deciles.map((d, i) => [d, i]).reverse().filter(([d]) => d.length)
    .map(([d, i]) => h("li", {}, h("span", { class: "hint", text: `${i / 10}–${(i + 1) / 10}` }),
      h("ol", {}, d.map((e) => strip(e, false, () => open(e)))))));
  return {
    plot: scatter, name: `attnscope-atlas-${atlas.model}-${name(layer, head)}`, json: () => atlas,
    csv: () => [["layer", "head", ...stats], ...ordered.map((p) => [p.layer, p.head,
      ...stats.map((s) => atlas.stats[s][p.layer][p.head])])],
  };
}
