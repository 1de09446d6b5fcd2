// "Copy permalink": the URL holds the whole state, so the link is location.href. Where the clipboard is not
// allowed, the link is shown, selected, for Ctrl+C.
import { $ } from "./dom.js";
import { setStatus } from "./notices.js";

async function copyPermalink() {
  const url = location.href;
  try {
    await navigator.clipboard.writeText(url);
    setStatus("Permalink copied: it opens this exact view, text and settings.");
  } catch {
    const field = $("permalink-field");
    field.hidden = false;
    field.value = url;
    field.focus();
    field.select();
    setStatus("Copy the selected link (Ctrl+C).");
  }
}

export function wirePermalink() {
  $("copy-link").addEventListener("click", copyPermalink);
}
