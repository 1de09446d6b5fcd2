// The classroom layout (present=1 in the URL): large type, the form and controls hidden, one step or view per
// screen, a bar with ◀ ▶ and a visible way out. Arrow keys (and Page Up/Down) step: through the lesson's
// pages in a lesson, through the steps in the steps view, through the views otherwise; Escape leaves.
import { h, replace } from "./dom.js";
import { LESSON, lessonState } from "./lesson.js";
import { STEPS } from "./views/stages.js";

/** The state one step forward (dir 1) or back (-1) from st, or null at an end. */
export function neighbour(st, dir, views) {
  if (st.lesson) {
    const k = st.lesson + dir;
    return k >= 1 && k <= LESSON.length ? lessonState(k) : null;
  }
  if (st.view === "stages") {
    const k = (st.step || (dir > 0 ? 0 : 1)) + dir;
    return k >= 1 && k <= STEPS.length ? { step: k } : null;
  }
  const i = views.indexOf(st.view) + dir;
  return i >= 0 && i < views.length ? { view: views[i] } : null;
}

/** Where the class is, in words: "Lesson 3 of 8 · Masking", "Step 5 of 11 · Q·Kᵀ", or the view's title. */
function where(st, titles) {
  if (st.lesson && LESSON[st.lesson - 1]) return `Lesson ${st.lesson} of ${LESSON.length} · ${LESSON[st.lesson - 1].title}`;
  const head = `layer ${st.layer}, head ${st.head}`;
  if (st.view === "stages") {
    const k = st.step || 1;
    return `Step ${k} of ${STEPS.length} · ${STEPS[k - 1].short} · ${head}`;
  }
  return (titles[st.view] ?? st.view) + (st.view === "head" ? ` · ${head}` : "");
}

/** Show or hide the classroom layout for st, and fill its bar. */
export function syncPresent(bar, st, { views, titles, go }) {
  document.documentElement.classList.toggle("present", st.present);
  bar.hidden = !st.present;
  if (!st.present) return;
  const prev = neighbour(st, -1, views), next = neighbour(st, 1, views);
  replace(bar,
    h("button", { type: "button", class: "present-prev", disabled: !prev, "aria-label": "Previous", title: "Previous (←)",
      text: "◀", onclick: () => prev && go(prev) }),
    h("p", { class: "present-where", "aria-live": "polite", text: where(st, titles) }),
    h("button", { type: "button", class: "present-next", disabled: !next, "aria-label": "Next", title: "Next (→)",
      text: "▶", onclick: () => next && go(next) }),
    h("button", { type: "button", class: "present-exit", text: "Exit presentation (Esc)", onclick: () => go({ present: false }) }));
}

/** The header's "Present" button. */
export function wirePresent(button, go) {
  button.addEventListener("click", () => go({ present: true }));
}

/** The keys of the classroom layout, for the page's one keydown listener (main.js): Escape leaves it, the arrows
 *  and Page Up/Down step. A key something else has handled (defaultPrevented) is left alone. */
export function presentKey(e, st, { go, views }) {
  if (!st.present || e.defaultPrevented || e.altKey || e.ctrlKey || e.metaKey) return;
  if (e.key === "Escape") {
    e.preventDefault();
    go({ present: false });
    return;
  }
  if (e.target.closest?.("input, textarea, select, [contenteditable], td[data-value]")) return;   // cells: arrows move
  const dir = { ArrowRight: 1, PageDown: 1, ArrowLeft: -1, PageUp: -1 }[e.key];
  if (!dir) return;
  const to = neighbour(st, dir, views);
  e.preventDefault();
  if (to) go(to);
}
