// Compare view: one head, two runs side by side and their difference A − B. B is the same text with every
// head kept (when heads are knocked out: what the ablation changed), or a second text typed here.
import { h, part, plotlyText, replace, tokenLabel } from "../dom.js";
import { colourRange, divergingRange, fmtSig, plotlyDiverging, plotlyScale, SIG_FORMAT } from "../scale.js";

export const title = "Compare";
export const help = "One head in two runs, side by side, and the difference A − B (purple: A lower, orange: A " +
  "higher). B is the run with every head kept when heads are knocked out (Shift+click a head in the Model view), or a " +
  "second text typed below. Texts of different lengths are compared over their common first tokens.";

/** A: the page's run (with its knocked-out heads); B: a second text, or the intact run. */
export function requests(st) {
  const one = { endpoint: "attention", layers: [st.layer], heads: [st.head], include: ["attention"] };
  if (st.text_b.trim()) return [one, { ...one, text: st.text_b }];
  if (st.ablate.length) return [one, { ...one, ablate: [] }];
  return [one];
}

function matrix(ans) {
  const m = ans.attention.sub(0, 0), T = m.shape[0];
  return Array.from({ length: T }, (_, i) => Array.from(m.row(i)));
}

/** One map; range: its colour range (scale.js colourRange for A and B, divergingRange for A − B). */
function heat(ctx, el, z, xs, ys, titleText, diverging, range) {
  const labels = (toks) => toks.map((t, i) => `${i} ${plotlyText(tokenLabel(t))}`);
  el.dataset.zmin = String(range.zmin);
  el.dataset.zmax = String(range.zmax);
  ctx.plot(el, [{
    type: "heatmap", z, x: labels(xs), y: labels(ys), colorscale: diverging ? plotlyDiverging : plotlyScale,
    zmin: range.zmin, zmax: range.zmax, ...(diverging ? { zmid: 0 } : {}), xgap: 0, ygap: 0,
    hovertemplate: `query %{y}<br>key %{x}<br>%{z:${SIG_FORMAT}}<extra></extra>`,
    colorbar: { thickness: 10, len: 0.8 },
  }], {
    title: titleText, margin: { l: 90, r: 10, t: 40, b: 90 },
    xaxis: { tickangle: -60, automargin: true, type: "category" },
    yaxis: { autorange: "reversed", automargin: true, type: "category" },
  });
}

export function render(container, { results }, st, ctx) {
  const controls = part(container, "controls", "form", { class: "view-controls compare-controls" });
  const field = h("input", { type: "text", id: "text-b", value: st.text_b, size: 60, "aria-label": "Text B",
    placeholder: "a second text (B) to compare with" });
  replace(controls, h("label", { for: "text-b", text: "Text B: " }), field,
    h("button", { type: "submit", class: "small", text: "Compare" }),
    st.text_b && h("button", { type: "button", class: "small", text: "Clear B", onclick: () => ctx.go({ text_b: "" }) }));
  controls.onsubmit = (e) => { e.preventDefault(); ctx.go({ text_b: field.value }); };
  const note = part(container, "note", "p", { class: "note" });
  const grid = part(container, "grid", "div", { class: "compare-grid" });
  const [A, B] = results;
  container.dataset.layer = st.layer;
  container.dataset.head = st.head;
  if (!B) {
    replace(note, "Nothing to compare yet. Type a text B above, or knock a head out: in the ",
      h("a", { href: ctx.href({ view: "model" }), text: "Model view" }), ", hold Shift and click a head's picture " +
      "(again to bring it back). The page then runs without that head, and here B is the run with every head kept.");
    replace(grid);
    return { name: `attnscope-${st.model}-compare` };
  }
  const za = matrix(A), zb = matrix(B);
  const n = Math.min(za.length, zb.length);
  const diff = za.slice(0, n).map((r, i) => r.slice(0, n).map((v, j) => v - zb[i][j]));
  const range = divergingRange(diff, st, 1);          // fitted to its largest |A − B| (or fixed: ±1)
  const worst = range.absmax;
  const what = st.text_b.trim() ? "text B" : `every head kept (A has ${st.ablate.map((x) => `L${x.replace(".", "H")}`).join(", ")} knocked out)`;
  note.textContent = `Layer ${st.layer}, head ${st.head}. A: this page's run; B: ${what}. ` +
    `Largest |A − B| = ${fmtSig(worst)}` + (za.length !== zb.length ? `; compared over the first ${n} tokens.` : ".") +
    ` A − B colours: ${range.label}.`;
  container.dataset.maxDiff = String(worst);
  // a layer up to the first knocked-out head's: nothing can differ there (a head's output changes only the layers
  // after it; its own layer's patterns are computed before it)
  const first = Math.min(...st.ablate.map((x) => Number(x.split(".")[0])));
  if (!st.text_b.trim() && st.ablate.length && st.layer <= first) {
    const after = first + 1 < ctx.info.layers ? first + 1 : null;
    replace(note, `Layer ${st.layer} is not after the knocked-out head${st.ablate.length > 1 ? "s" : ""} ` +
      `(${st.ablate.map((x) => `L${x.replace(".", "H")}`).join(", ")}): a head's output changes only what the layers ` +
      "after it compute, so A and B are the same here and A − B is 0 everywhere. ",
    after === null ? "It is the last layer: nothing comes after it." : h("a", { href: ctx.href({ layer: after }), text: `Show layer ${after}` }));
    container.dataset.before = "1";
  } else delete container.dataset.before;
  const [pa, pb, pd] = ["a", "b", "d"].map((k) => part(grid, k, "div", { class: "plot compare-plot", role: "figure" }));
  const peak = (z) => Math.max(0, ...z.flat());
  heat(ctx, pa, za, A.tokens, A.tokens, "A", false, colourRange(st, peak(za)));
  heat(ctx, pb, zb, B.tokens, B.tokens, "B", false, colourRange(st, peak(zb)));
  heat(ctx, pd, diff, A.tokens.slice(0, n), A.tokens.slice(0, n), "A − B", true, range);
  return {
    plot: pd, name: `attnscope-${st.model}-compare-L${st.layer}H${st.head}`,
    csv: () => [["query", ...A.tokens.slice(0, n)], ...diff.map((r, i) => [A.tokens[i], ...r])],
    json: () => ({ model: st.model, layer: st.layer, head: st.head, a: za, b: zb, difference: diff,
      tokens_a: A.tokens, tokens_b: B.tokens }),
  };
}
