// What the server offers, from the page's boot block (<script type="application/json" id="boot">, built by
// app/pages.py): models, views, statistics, head roles and each served architecture's facts. Read once, here;
// the page never re-declares these lists.
import { $ } from "./dom.js";

export const BOOT = JSON.parse($("boot").textContent);
/** id -> the model's info (as GET /api/models gives it). */
export const MODELS = Object.fromEntries(BOOT.models.map((m) => [m.id, m]));
