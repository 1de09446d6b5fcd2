// Head roles of the teaching models (GET /api/models `head_roles`, also in the page's boot block) and the
// models' explanations: the head menu names each wired head's role, the page shows how a model works.
import { h, replace } from "./dom.js";

/** What each role attends to (the documented set, model/teaching.py ROLE_TARGETS), for a reader. */
export const ROLE_TEXT = {
  "previous-token": "puts its weight on the token just before (key i−1)",
  "first-token": "puts its weight on the first token (key 0)",
  "self": "puts its weight on the token itself (key i)",
  "two-back": "puts its weight on the token two back (key i−2)",
  "same-token": "spreads its weight over the earlier copies of the same token (itself included)",
  "induction": "looks at the token right after the latest earlier copy of the current token (key j+1)",
  "uniform": "spreads its weight evenly over every visible token",
};

/** The role of (layer, head) in a model, or null for a head that is not wired. */
export function roleOf(info, layer, head) {
  return (info.head_roles || []).find((r) => r.layer === layer && r.head === head)?.role ?? null;
}

/** One line about a head: "head 2 · self: puts its weight on the token itself (key i)", or "" when unwired. */
export function roleSentence(info, layer, head) {
  const role = roleOf(info, layer, head);
  return role ? `${/^[aeiou]/.test(role) ? "an" : "a"} ${role} head: it ${ROLE_TEXT[role] ?? role}` : "";
}

/** Name the role of each head of `layer` in the head menu ("head 0 · previous-token"). */
export function labelHeads(select, info, layer) {
  for (const o of select.options) {
    const role = roleOf(info, layer, Number(o.value));
    const text = `head ${o.value}` + (role ? ` · ${role}` : "");
    if (o.textContent !== text) o.textContent = text;
    o.dataset.role = role ?? "";
  }
}

/** Show a model's explanation (teaching models: how it works), or hide the box when it has none. */
export function showExplanation(box, info) {
  box.hidden = !info.explanation;
  if (box.hidden || box.dataset.model === info.id) return;
  box.dataset.model = info.id;
  replace(box, h("summary", { text: `How ${info.title} works` }), h("p", { text: info.explanation }));
}
