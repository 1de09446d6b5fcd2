// The progress bar of a long run: it appears only once a run has taken over a second (a quick run never flashes it),
// and shows what the server streams (api.js onProgress): the layers done of a layer-by-layer run, or the runs done of
// a run of many (activation patching: one per head) with the time left; its Cancel button stops the streamed runs
// (api.js cancelRuns: the server stops them before their next batch).
import { cancelRuns } from "./api.js";
import { $, h } from "./dom.js";

const PROGRESS_AFTER_MS = 1000;

/** "about 12 s left" (nothing before the server knows). */
const left = (s) => (s === null || s === undefined ? "" : ` · about ${s < 60 ? `${Math.ceil(s)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`} left`);

/** The bar's controls: start(estimate?) when a run begins (a long run's estimate: length.js estimate, said until the
 *  first layer is done), stop() when it ends, report(line) per progress line: {layer, layers} or {runs, runs_total,
 *  eta_s}. A layer-by-layer run's time left is the time its layers so far took, per layer. */
export function createProgress() {
  const seen = { timer: 0, done: 0, total: 0, unit: "layer", eta: null, estimate: null, t0: 0 };

  const draw = () => {
    const bar = $("run-progress-bar");
    if (seen.total) bar.value = seen.done / seen.total;
    else bar.removeAttribute("value");                   // nothing done yet: an indeterminate bar
    $("run-progress-label").textContent = !seen.total
      ? (seen.estimate ? `Running ${seen.estimate.text}…` : "Running the model…")
      : seen.unit === "layer" ? `Running the model: layer ${seen.done} of ${seen.total}${left(seen.eta)}`
        : `Running the model: ${seen.done} of ${seen.total} runs${left(seen.eta)}`;
    const box = $("run-progress");
    if (!box.querySelector("#run-cancel")) {
      box.append(h("button", { type: "button", id: "run-cancel", text: "Cancel", title: "stop the runs under way",
        onclick: () => { if (cancelRuns()) $("run-progress-label").textContent = "Cancelling…"; } }));
    }
  };

  const start = (estimate = null) => {
    clearTimeout(seen.timer);
    Object.assign(seen, { done: 0, total: 0, unit: "layer", eta: estimate?.seconds ?? null, estimate, t0: performance.now() });
    $("run-progress").hidden = true;
    seen.timer = setTimeout(() => {
      const box = $("run-progress");
      box.hidden = false;
      box.dataset.shown = String(Number(box.dataset.shown || 0) + 1);   // for tests: the bar was seen
      draw();
    }, PROGRESS_AFTER_MS);
  };

  const stop = () => {
    clearTimeout(seen.timer);
    $("run-progress").hidden = true;
  };

  /** One progress line of a streamed run. Several requests of one update may stream; the bar shows the furthest. */
  const report = (line) => {
    const [done, total, unit] = "runs" in line ? [line.runs, line.runs_total, "run"] : [line.layer, line.layers, "layer"];
    if (total > 0 && (done / total) >= (seen.total ? seen.done / seen.total : 0)) {
      const took = (performance.now() - seen.t0) / 1000;
      const eta = line.eta_s ?? (unit === "layer" && done > 0 ? took / done * (total - done) : null);
      Object.assign(seen, { done, total, unit, eta });
      if (!$("run-progress").hidden) draw();
    }
  };

  return { start, stop, report };
}
