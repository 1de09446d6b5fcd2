// The frame round the active view: the tabs, the view's heading and help, which view panel shows, the window's
// title, the classroom bar (present.js) and the lesson panel (lesson.js).
import { can, MODELS, whyNot } from "./boot.js";
import { $ } from "./dom.js";
import { tooLong } from "./length.js";
import { syncLesson } from "./lesson.js";
import { syncPresent, wirePresent } from "./present.js";
import * as state from "./state.js";

const SEEN = "attnscope.visited";   // localStorage: this browser has been here before
/** A first visit to the page (this browser's): "How to read it" starts open, with the view's one-line orientation. */
const FIRST_VISIT = (() => {
  try {
    const first = !localStorage.getItem(SEEN);
    localStorage.setItem(SEEN, "1");
    return first;
  } catch {
    return false;                    // no storage: say nothing about visits
  }
})();
let helpOpened = false;

/** Show the frame of st's view; views: id -> view module; T: the text's tokens on this model, when a run told. */
export function syncFrame(st, views, go, T = null) {
  const titles = Object.fromEntries(Object.entries(views).map(([id, v]) => [id, v.title]));
  syncPresent($("present-bar"), st, { views: Object.keys(views), titles, go });
  syncLesson($("lesson"), $("lesson-link"), st, { href: state.href, go, models: MODELS });
  syncTabs(st, T);
  const view = views[st.view];
  $("view-title").textContent = view.title;
  $("view-help").textContent = view.help;
  // the view's orientation (what rows, columns and colours mean) in one line; open on a first visit
  $("orientation").textContent = view.orientation ?? "";
  $("orientation").hidden = !view.orientation;
  if (FIRST_VISIT && !helpOpened && !st.present) {
    helpOpened = true;
    $("view-help-box").open = true;
  }
  for (const el of document.querySelectorAll(".view")) el.hidden = el.dataset.view !== st.view;
  document.title = `${view.title} · ${st.text.slice(0, 40)} · attnscope`;
}

/** The tabs: each a link to its view; a view the model cannot do (its capability record), or cannot do for a text of
 *  T tokens (length.js tooLong: the server's limits), shown disabled with its reason in plain words on it; opened,
 *  the view says the reason where the picture would be. */
export function syncTabs(st, T = null) {
  const info = MODELS[st.model];
  for (const a of document.querySelectorAll("#tabs a")) {
    a.href = state.href({ view: a.dataset.view });
    const why = whyNot(info, a.dataset.view), long = why ? "" : tooLong(info, a.dataset.view, T);
    if (why || long) {
      a.setAttribute("aria-disabled", "true");
      a.title = why ? `Not for ${info.title}: ${why}` : `Not at this length: ${long}`;
    } else {
      a.removeAttribute("aria-disabled");
      a.title = a.dataset.help ?? "";
    }
    if (a.dataset.view === st.view) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

/** A plain click on a tab changes the view in place (a modified click opens the link as usual); the header's
 *  "Present" button enters the classroom layout. */
export function wireFrame(go) {
  $("tabs").addEventListener("click", (e) => {
    const a = e.target.closest("a[data-view]");
    if (!a || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    go({ view: a.dataset.view });
  });
  wirePresent($("present-toggle"), go);
}
