// The guided lesson: a short sequence of pre-set views, each with one sentence, from a dot product to an
// induction head. Every page is a link (the whole state is in the URL, plus lesson=K), so a teacher can
// bookmark or project any of them; the panel above the view says where the class is and links on.
import { h, replace } from "./dom.js";

// Every page sets what it shows and resets what would change it (a pin, a mask, a what-if, a "why" cell).
const BASE = { text_pair: "", causal: null, mask_tokens: [], pin: null, why: null, hide_special: false, heads: null,
  all_heads: false, n: 12, step: 0, scale: "fixed", ablate: [], text_b: "" };
const TINY = { model: "tiny-gpt", text: "the cat sat on the mat and then the cat slept", view: "stages", layer: 0, head: 0 };
const INDUCTION = { model: "induction", text: "Harry Potter met Ron Weasley at school. Then Harry Potter", view: "head" };

export const LESSON = [
  { title: "Query and key: dot products", state: { ...TINY, step: 5 },
    text: "Each token asks and offers. Its query (a row of Q) is what it is looking for; its key (a column of Kᵀ) is " +
      "what it offers to the others. Attention starts by comparing them: each query is multiplied with every key, " +
      "number by number, and the products are added up: a dot product. A big score means a good match, and later a " +
      "bright cell: the row of the token looking, the column of the token it looks at. Click any number to see all " +
      "its products. This head (tiny-gpt, layer 0, head 0) is built so that each query matches the key of the token " +
      "just before it." },
  { title: "Scaling", state: { ...TINY, step: 6 },
    text: "The scores are multiplied by 1/√d_head = 1/√32 ≈ 0.18. Dot products of longer vectors are bigger; scaling " +
      "keeps them in the range where the softmax can still spread its weight." },
  { title: "Masking", state: { ...TINY, step: 7 },
    text: "tiny-gpt is a causal model: a token may look only at itself and the tokens before it. The mask adds −∞ to " +
      "every score above the diagonal (the future) and 0 everywhere else." },
  { title: "Softmax", state: { ...TINY, step: 9 },
    text: "Softmax turns each row into weights: exp of each number, divided by the row's sum. The weights are " +
      "positive and add up to 1 (the Σ column), and exp(−∞) = 0, so the future gets exactly 0. Here nearly all of " +
      "each row's weight lands on the previous token." },
  { title: "Weights × values", state: { ...TINY, step: 10 },
    text: "The head's output for each token is the weighted sum of the value vectors: out_i = Σ_j p_ij v_j. With all " +
      "its weight on the previous token, each token's output is that token's value: the head copies information " +
      "one step forward." },
  { title: "Heads differ", state: { ...TINY, view: "model" },
    text: "Every head of tiny-gpt on the same text. Each draws its own pattern: in layer 0 a previous-token head (the " +
      "stripe below the diagonal), a first-token head (the first column), a self head (the diagonal) and a uniform " +
      "head; in layer 1 a same-token head and a two-back head. The others have random weights: attention before " +
      "any training." },
  { title: "Induction, part 1: the previous-token head", state: { ...INDUCTION, layer: 0, head: 0 },
    text: "A second model, two heads in a row. Its first head looks one token back and writes into each position " +
      "which token came before it: “potter” now carries “harry was before me”." },
  { title: "Induction, part 2: the induction head", state: { ...INDUCTION, layer: 1, head: 0 },
    text: "The second head looks, from each token, at the token that followed the same token earlier: from the second " +
      "“potter” it looks at “met”, and the model predicts “met” next. It finds that position only because the first " +
      "head wrote “the token before me” into every position: the two heads compose (an induction circuit)." },
  // positions from the tokenizer: [CLS] harry potter met ron weasley at school . then harry potter (0..11)
  { title: "Induction, part 3: why the head looks at “met”", state: { ...INDUCTION, layer: 1, head: 0, pin: 11, why: [11, 3] },
    text: "Why does the second “potter” look at “met”? The chart below splits the head's score for that cell (2427.1, " +
      "before the softmax) into pairs: a part of the stream at “potter” times a part at “met”. The largest part on the " +
      "key side is the output of layer 0's previous-token head (L0H0) at “met”, 3168.0: the copy of “potter” that layer " +
      "0 wrote there. The key reads what layer 0 wrote (K-composition); the biases × positions pair (−759.3) is the " +
      "head's preference for recent keys." },
];

/** The full state of lesson page k (1-based), keeping how the page is shown (present, large). */
export function lessonState(k) {
  const page = LESSON[k - 1];
  return page ? { ...BASE, ...page.state, lesson: k } : null;
}

/** A lesson page as a link that navigates in place (the page's own go()). */
function pageLink(k, text, href, go, rel) {
  const st = lessonState(k);
  return h("a", { href: href(st), rel, class: "lesson-nav", "data-lesson": k, text,
    onclick: (e) => {
      if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
      e.preventDefault();
      go(st);
    } });
}

/** The lesson panel (or nothing outside a lesson), and the header's "Lesson" link. */
export function syncLesson(box, link, st, { href, go, models }) {
  link.href = href(lessonState(1));
  if (!link.dataset.wired) {
    link.dataset.wired = "1";
    link.addEventListener("click", (e) => {
      if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
      e.preventDefault();
      go(lessonState(1));
    });
  }
  const k = st.lesson;
  const page = k ? LESSON[k - 1] : null;
  box.hidden = !page;
  document.documentElement.classList.toggle("in-lesson", Boolean(page));
  if (!page) return;
  const missing = !models[page.state.model];
  replace(box,
    h("p", { class: "lesson-count", text: `Lesson · ${k} of ${LESSON.length}` }),
    h("h2", { text: page.title }),
    h("p", { class: "lesson-text", text: page.text }),
    missing && h("p", { class: "warn", text: `This page needs the ${page.state.model} model, which this server does not load: ` +
      `start it with ATTNSCOPE_MODELS=${[...Object.keys(models), page.state.model].join(",")}.` }),
    h("nav", { class: "lesson-links", "aria-label": "Lesson pages" },
      k > 1 ? pageLink(k - 1, "◀ Previous", href, go, "prev") : null,
      k < LESSON.length ? pageLink(k + 1, "Next ▶", href, go, "next") : null,
      h("a", { href: href({ lesson: null }), class: "lesson-leave", text: "Leave the lesson",
        onclick: (e) => { e.preventDefault(); go({ lesson: null }); } })));
  box.dataset.lesson = String(k);
}
