// The page's views drawn outside the page: a notebook's output (python/jupyter.py) mounts them on the answers it
// carries. The view contract is main.js's: a view's requests() say what it needs, answered here from the carried
// answers instead of the server (an /api/attention answer of several layers and heads gives each request its
// layers and heads); render() draws; ctx.go() changes the state, which draws again. The state is the output's own
// (no URL), changed by its controls (view, layer, head, pinned query) and by the views themselves; what would need
// a new run (another text, knocked-out heads) is not the output's to change. A generation it carries (its token lines,
// with their attention rows) grows the prompt's answer as the page's Generate control does (matrix.js grownMeta,
// grownAnswer): the views of one head draw the prompt and its continuation. python/jupyter.py bundles this module (with
// everything it imports) into the output's script, which calls mount() with the output's data.
import { decodeBinary, Tensor } from "./api.js";
import { can } from "./boot.js";
import { h, replace, tokenLabel } from "./dom.js";
import { grownAnswer, grownMeta } from "./matrix.js";
import { plot, plotlyReady } from "./plot.js";
import * as state from "./state.js";
import { unpack } from "./unpack.js";
import * as effects from "./views/effects.js";
import * as head from "./views/head.js";
import * as lens from "./views/lens.js";
import * as lines from "./views/lines.js";
import * as model from "./views/model.js";

/** The views an output can draw, by the answers they need (the carried answers' endpoints: the attention answer is
 *  every view's meta too). */
export const VIEWS = { head, lines, model, lens, effects };
const NEEDS = { head: ["attention"], lines: ["attention"], model: ["attention"], lens: ["attention", "lens"],
  effects: ["attention"] };
/** What a new run would change: the output keeps its answers, so these stay as they were drawn. */
const RUN = ["model", "text", "text_pair", "decoder_text", "ablate", "ablation", "causal", "mask_tokens", "attention",
  "corrupt", "target", "distractor", "site", "direction", "receivers", "receiver_input"];

/** A carried answer as api.js gives the page its own: the binary form (packed, float16) decoded, or the JSON form as
 *  is. */
export async function decoded({ packed, json }) {
  if (json) return json;
  return decodeBinary((await unpack(packed, 2)).buffer);
}

/** Layers `layers` and heads `heads` (model indices; undefined: all it has) of an /api/attention answer, as the
 *  server answers a request for just those. */
export function sliceAttention(ans, layers = ans.layers, heads = ans.heads) {
  const li = layers.map((l) => ans.layers.indexOf(l)), hi = heads.map((x) => ans.heads.indexOf(x));
  if (li.includes(-1) || hi.includes(-1)) {
    throw new Error(`this output holds layers ${ans.layers.join(", ")} and heads ${ans.heads.join(", ")} only ` +
      `(asked: layers ${layers.join(", ")}, heads ${heads.join(", ")})`);
  }
  const [, , T, K] = ans.attention.shape, n = T * K;
  const data = new Float32Array(li.length * hi.length * n);
  li.forEach((a, i) => hi.forEach((b, j) => data.set(ans.attention.sub(a, b).data, (i * hi.length + j) * n)));
  return { ...ans, layers, heads, attention: new Tensor(data, [li.length, hi.length, T, K], ans.attention.dtype) };
}

/** A logit lens answer for a request of the head lens of (layer, head): the carried one's head lens is of one head. */
function lensOf(ans, { head_lens: asked }) {
  const hl = ans.head_lens;
  return !asked || !hl || (hl.layer === asked[0] && hl.head === asked[1]) ? ans : { ...ans, head_lens: null };
}

/** One of a view's requests, answered from the output's answers; a soft request's refusal is its result. */
function answer(request, answers) {
  const { endpoint, soft } = request;
  try {
    if (!answers[endpoint]) throw new Error(`this output holds no ${endpoint.replace("_", " ")} answer`);
    if (endpoint === "lens") return lensOf(answers.lens, request);
    if (endpoint !== "attention") return answers[endpoint];
    if (request.include?.includes("attribution")) {      // the effects view's direct logit attribution
      if (!answers.attribution) throw new Error("this output holds no direct logit attribution");
      return answers.attribution;
    }
    if (request.text !== undefined) throw new Error("this output holds the attention of its own text only");
    return sliceAttention(answers.attention, request.layers, request.heads);
  } catch (error) {
    if (soft) return { error };
    throw error;
  }
}

function select(label, name, options, value, onchange) {
  return h("label", { class: "embed-control" }, label,
    h("select", { name, onchange: (e) => onchange(e.target.value) },
      options.map(([v, text]) => h("option", { value: String(v), text, selected: String(v) === String(value) }))));
}

/** Draw the output: its controls, then the view of its state. `data`: {info (the model's GET /api/models entry),
 *  state (the first state: view, layer, head, ...), answers: {endpoint: {binary} | {json}}}. Resolves once the first
 *  view has drawn; root.dataset.renders counts the drawings. */
export async function mount(root, data) {
  const info = data.info;
  const answers = Object.fromEntries(await Promise.all(Object.entries(data.answers)
    .map(async ([k, v]) => [k, await decoded(v)])));
  const prompt = answers.attention, generation = answers.generation;
  const meta = generation ? grownMeta(prompt, generation.steps, data.state.text) : prompt;
  // the views the carried answers draw and the model can do (its capability record, as the page's tabs)
  const views = Object.keys(VIEWS).filter((v) => NEEDS[v].every((e) => answers[e]) && can(info, v));
  let st = { ...state.parse(""), model: info.id, text: meta.text ?? "", ...data.state };
  const memory = Object.fromEntries(views.map((v) => [v, {}]));
  const bar = h("div", { class: "embed-controls" });
  const containers = Object.fromEntries(views.map((v) => [v, h("div", { class: "view", "data-view": v,
    hidden: true })]));
  const error = h("p", { class: "error", role: "alert", hidden: true });
  replace(root, bar, error, Object.values(containers));
  let drawing = Promise.resolve();

  const go = (patch) => {
    const kept = Object.fromEntries(Object.entries(patch).filter(([k]) => !RUN.includes(k)));
    st = { ...st, ...kept };
    drawing = drawing.then(draw);
    return true;
  };

  function controls() {
    const layers = answers.attention?.layers ?? [], heads = answers.attention?.heads ?? [];
    replace(bar,
      select("View ", "view", views.map((v) => [v, VIEWS[v].title]), st.view, (view) => go({ view })),
      select(" Layer ", "layer", layers.map((l) => [l, String(l)]), st.layer,
        (l) => go({ layer: Number(l), why: null })),
      select(" Head ", "head", heads.map((x) => [x, String(x)]), st.head, (x) => go({ head: Number(x), why: null })),
      select(" Query ", "pin", [["", "none"], ...meta.tokens.map((t, i) => [i, `${i}: ${tokenLabel(t)}`])],
        st.pin ?? "",
        (q) => go({ pin: q === "" ? null : Number(q), why: null })));
  }

  async function draw() {
    await plotlyReady();
    controls();
    const view = VIEWS[st.view] ? st.view : views[0];
    st = { ...st, view };
    for (const [v, el] of Object.entries(containers)) el.hidden = v !== view;
    const container = containers[view], charts = [];
    const ctx = { info, boot: data.boot, go, href: () => "#", large: false, font: 13, memory: memory[view],
      plot: (el, traces, layout) => charts.push(plot(el, traces, layout, ctx.font,
        `attnscope-${st.model}-${view}-L${st.layer}H${st.head}`)) };
    try {
      const results = VIEWS[view].requests(st, info, meta).map((r) => answer(r, answers));
      // with a generation, the views of one head it carries draw the grown answer; any other, the prompt's
      const grown = generation && results.map((r) => grownAnswer(r, generation.steps, generation.layers,
        generation.heads));
      const shown = grown?.every(Boolean) ? { meta, results: grown } : { meta: prompt, results };
      VIEWS[view].render(container, shown, { ...st, pin: st.pin < shown.meta.tokens.length ? st.pin : null }, ctx);
      await Promise.all(charts);
      error.hidden = true;
    } catch (err) {
      error.textContent = `The ${VIEWS[view].title.toLowerCase()} cannot be drawn: ${err.message}`;
      error.hidden = false;
    }
    root.dataset.view = view;
    root.dataset.layer = st.layer;
    root.dataset.head = st.head;
    root.dataset.renders = String(Number(root.dataset.renders || 0) + 1);
  }

  drawing = drawing.then(draw);
  return drawing;
}
