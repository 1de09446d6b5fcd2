// The models still loading (templates/models_loading.html): their states from /healthz once a second, and then
// either a reload (the page waited for its model: it opens once that one is ready) or a line saying every model
// is ready. The server answers from its first second while the models load (app/service.py).
import { $, h, replace } from "./dom.js";

const POLL_MS = 1000;

async function poll() {
  const box = $("models-loading");
  const wait = box.dataset.wait;
  let health;
  try {
    health = await (await fetch("/healthz", { cache: "no-store" })).json();
  } catch {
    setTimeout(poll, POLL_MS);                 // the server restarting, or busy: ask again
    return;
  }
  const loading = health.loading || {};
  if (wait && !(wait in loading)) {
    location.reload();
    return;
  }
  replace(box.querySelector("ul"), Object.entries(loading).map(([id, state]) =>
    h("li", { "data-model": id }, h("strong", { text: id }), ": ", h("span", { text: state }))));
  if (health.status === "ok") {
    replace(box.querySelector(".models-loading-head"), "Every model is ready: ",
      h("a", { href: location.href, text: "reload the page" }), " to choose them.");
    box.dataset.ready = "1";
    return;
  }
  setTimeout(poll, POLL_MS);
}

setTimeout(poll, POLL_MS);
