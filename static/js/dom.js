// Small DOM helpers. Token strings and user text are untrusted: they only ever reach the page
// through textContent / attributes set here, never through innerHTML.

/** The page's element with this id. */
export const $ = (id) => document.getElementById(id);

/** Create an element: h("button", {class: "chip", "aria-pressed": "true", onclick: fn}, "text", child...). */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  return h("svg:" + tag, attrs, ...children);
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replace all children of el. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Find or create a direct child with a data-part name (views reuse their DOM between renders). */
export function part(container, name, tag = "div", attrs = {}) {
  let el = container.querySelector(`:scope > [data-part="${name}"]`);
  if (!el) {
    el = h(tag, { ...attrs, "data-part": name });
    container.append(el);
  }
  return el;
}

/** Escape text for Plotly, which renders pseudo-HTML (<b>, <br>, <a href>) in labels and hover text. */
export function plotlyText(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

/** The one mark of a space in a token, for every model: whitespace, and SentencePiece's "▁" (Gemma, T5, Llama 2
 *  vocabularies spell a leading space so), are shown as it. */
export const SPACE_MARK = "␣";

/** A token as shown on screen: visible quotes-free text, whitespace made visible (SPACE_MARK). */
export function tokenLabel(tok) {
  const s = String(tok);
  return s === "" ? "∅" : s.replace(/[\s\u2581]/g, SPACE_MARK);
}

/** Roving tabindex (one tab stop per list): arrow keys, Home and End move the focus along `items`, from
 *  item i. `keys` maps arrow keys to steps. Returns true when the key was one of these (and handled). */
export function rove(e, items, i, keys = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }) {
  const n = items.length;
  const to = e.key === "Home" ? 0 : e.key === "End" ? n - 1 : e.key in keys ? i + keys[e.key] : null;
  if (to === null) return false;
  e.preventDefault();
  const j = Math.max(0, Math.min(n - 1, to));
  items[i].setAttribute("tabindex", "-1");
  items[j].setAttribute("tabindex", "0");
  items[j].focus();
  items[j].scrollIntoView?.({ block: "nearest" });
  return true;
}

/** A view's one-menu control row, kept across renders: a labelled <select> of [value, text] options showing `value`;
 *  choosing one calls go(value) (the views write it into the URL state). */
export function menuControl(container, { aria, label, id, options, value, go }) {
  const form = part(container, "controls", "div", { class: "view-controls", role: "group", "aria-label": aria });
  if (!form.firstChild) {
    replace(form, h("label", {}, label, h("select", { id }, options.map(([v, text]) => h("option", { value: v, text })))));
  }
  const select = form.querySelector(`#${id}`);
  select.value = value;
  select.onchange = (e) => go(e.target.value);
  return form;
}
