// Head roles of the teaching models (GET /api/models `head_roles`, also in the page's boot block) and the
// models' explanations: the head menu names each wired head's role, the page shows how a model works. What each
// role means, in a reader's words, is the server's too: the boot block's `roles` ([{id, target, text}]).
import { h, replace } from "./dom.js";

/** The role of (layer, head) in a model, or null for a head that is not wired. */
export function roleOf(info, layer, head) {
  return (info.head_roles || []).find((r) => r.layer === layer && r.head === head)?.role ?? null;
}

/** One line about a head: "a self head: it puts its weight on the token itself (key i)", or "" when unwired.
 *  roles: the boot block's [{id, text}]. */
export function roleSentence(info, layer, head, roles) {
  const role = roleOf(info, layer, head);
  const text = roles.find((r) => r.id === role)?.text ?? role;
  return role ? `${/^[aeiou]/.test(role) ? "an" : "a"} ${role} head: it ${text}` : "";
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
