// A layer-by-layer run's progress bar: it appears only once a run has taken over a second (a quick run never flashes it),
// and shows the layers done as the server streams them (api.js onProgress).
import { $ } from "./dom.js";

const PROGRESS_AFTER_MS = 1000;

/** The bar's controls: start() when a run begins, stop() when it ends, report({layer, layers}) per progress line. */
export function createProgress() {
  const seen = { timer: 0, done: 0, layers: 0 };

  const draw = () => {
    const bar = $("run-progress-bar");
    if (seen.layers) bar.value = seen.done / seen.layers;
    else bar.removeAttribute("value");                   // no layer done yet: an indeterminate bar
    $("run-progress-label").textContent = seen.layers
      ? `Running the model: layer ${seen.done} of ${seen.layers}` : "Running the model…";
  };

  const start = () => {
    clearTimeout(seen.timer);
    Object.assign(seen, { done: 0, layers: 0 });
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

  /** One progress line of a streamed run: layer = the number of layers done. Several requests of one update
   *  may stream; the bar shows the furthest. */
  const report = ({ layer, layers }) => {
    if (layers > 0 && (layer / layers) >= (seen.layers ? seen.done / seen.layers : 0)) {
      Object.assign(seen, { done: layer, layers });
      if (!$("run-progress").hidden) draw();
    }
  };

  return { start, stop, report };
}
