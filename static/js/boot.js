// What the server offers, from the page's boot block (<script type="application/json" id="boot">, built by
// app/pages.py): models, views, statistics, head roles and each served architecture's facts. Read once, here;
// the page never re-declares these lists. A view drawn outside the page (a notebook's output, python/jupyter.py) has no
// such element: its output's script puts its data, boot block included, at globalThis.attnscopeOutput before this runs.
import { $ } from "./dom.js";

export const BOOT = $("boot") ? JSON.parse($("boot").textContent) : globalThis.attnscopeOutput.boot;
/** id -> the model's info (as GET /api/models gives it). */
export const MODELS = Object.fromEntries(BOOT.models.map((m) => [m.id, m]));

/** Can model info do feature (a tab's view id, or a part: why, head_lens, attribution, generate...)? Its capability
 *  record (GET /api/models: runtime/capabilities.py, each view by app/pages.py VIEW_NEEDS) says; the page never asks
 *  for what it cannot do. */
export const can = (info, feature) => info.capabilities?.features?.[feature] !== false;

/** Why model info cannot do feature, in a few words ("" when it can). */
export const whyNot = (info, feature) => (can(info, feature) ? ""
  : info.capabilities.short?.[feature] ?? info.capabilities.reasons?.[feature] ?? "not available for this model");

/** The served models that can do feature. */
export const ableModels = (feature) => BOOT.models.filter((m) => can(m, feature));
