// The text boxes (an encoder-decoder's decoder text among them), and their drafts: an edited text is never thrown
// away. Changing any control after editing the text runs the new text; a click on a token (which names a token of
// the text already run) leaves the edit pending, and it is marked as such until it runs. Run (or Ctrl+Enter in any
// box) runs it.
import { MODELS } from "./boot.js";
import { $ } from "./dom.js";
import * as state from "./state.js";

/** The draft of the page's text boxes: {edited, sync(st), go(patch, opts), wire(rerun)}. */
export function createDraft() {
  let edited = false;

  const pending = () => {
    const st = state.get();
    const info = MODELS[st.model];
    return $("text").value !== st.text || (info.pair && $("text-pair").value !== st.text_pair) ||
      (info.kind === "encoder-decoder" && $("decoder-text").value !== st.decoder_text);
  };

  const show = () => {
    if (edited && !pending()) edited = false;
    $("draft-note").hidden = !edited;
  };

  /** What the boxes hold, as state. */
  const texts = () => ({ text: $("text").value, text_pair: $("text-pair").value, decoder_text: $("decoder-text").value });

  /** The boxes show the state's texts, except an edited text: that stays, marked pending. */
  const sync = (st) => {
    if (!edited) {
      $("text").value = st.text;
      $("text-pair").value = st.text_pair;
      $("decoder-text").value = st.decoder_text;
    }
    show();
  };

  /** state.go, carrying an edited text along unless the change names a token of the old one (a pin, a mask). A
   *  new text forgets what named the old one's tokens (a pin, a mask, the head view's "why" cell). */
  const go = (patch, opts) => {
    const byToken = (patch.pin !== undefined && patch.pin !== null) || patch.mask_tokens?.length;
    const next = edited && pending() && !byToken
      ? { ...texts(), mask_tokens: [], pin: null, why: null, ...patch } : patch;
    return state.go(next, opts);
  };

  /** Run on submit (rerun(): the same text again, which changes no state, still re-runs); mark edits. */
  const wire = (rerun) => {
    $("input-form").addEventListener("submit", (e) => {
      e.preventDefault();
      edited = false;
      // the same text again re-runs anyway (answered from the cache)
      if (!state.go({ ...texts(), mask_tokens: [], pin: null, why: null })) rerun();
    });
    for (const box of [$("text"), $("text-pair"), $("decoder-text")]) {
      box.addEventListener("input", () => { edited = true; show(); });
      box.addEventListener("keydown", (e) => {   // Ctrl/Cmd+Enter runs, from either box
        if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
          e.preventDefault();
          $("input-form").requestSubmit();
        }
      });
    }
  };

  /** Keep what the boxes hold as an edit when the state goes back under them (a cancelled run's text): the next
   *  sync leaves it in its box, marked pending, unless it is the text the state goes back to. */
  const keep = () => { edited = true; };

  return { get edited() { return edited; }, sync, go, wire, keep };
}
