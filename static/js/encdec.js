// Encoder-decoders (T5, BART, Marian) on the page. One /api/attention answer holds their three attentions
// (`attention`: the encoder's self-attention, `decoder_attention`, `cross_attention`); the state's `attention`
// (encoder, decoder or cross: the page's control, in the URL) picks the one the views draw. Here it becomes the
// one-stack answer the head, line and steps views already draw: the queries' tokens are `meta.tokens` (the chips,
// the rows), and cross-attention's keys, the encoder's tokens, are `meta.keys` (the columns; matrix.js keysOf).
// Which views apply is the model's capability record's (boot.js can); the attentions' names come from the boot block.
import { BOOT } from "./boot.js";

/** Is this model (GET /api/models' info) an encoder-decoder? */
export const isEncDec = (info) => info.kind === "encoder-decoder";

/** What each attention is, in the page's words: the axes, and a sentence for the view's note. */
const STACKS = {
  encoder: { causal: false, query: "encoder token (query)", key: "encoder token (key)", queries: "encoder", keys: "encoder",
    note: "Encoder self-attention: the source text's tokens attend to each other, both ways (no causal mask)." },
  decoder: { causal: true, query: "decoder token (query)", key: "decoder token (key)", queries: "decoder", keys: "decoder",
    note: "Decoder self-attention: the decoder's tokens (its start token, then the decoder text shifted right) " +
      "attend to themselves and the tokens before them (a causal mask: white cells are the future, weight exactly 0)." },
  cross: { causal: false, query: "decoder token (query)", key: "encoder token (key)", queries: "decoder", keys: "encoder",
    note: "Cross-attention: queries come from the decoder's tokens, keys and values from the encoder's output (its " +
      "last layer, the same for every decoder layer). Each row is one decoder token's attention over the source " +
      "text's tokens and sums to 1; nothing is masked, since the whole source is known before decoding starts." },
};

/** The label of each attention (the control's options, from the boot block). */
export const LABELS = Object.fromEntries(BOOT.attentions.map((a) => [a.id, a.label]));

/** The tokens of one stack of an /api/attention answer: {tokens, token_ids, special}. */
function side(meta, which) {
  return which === "encoder" ? { tokens: meta.tokens, token_ids: meta.token_ids, special: meta.special }
    : { tokens: meta.decoder_tokens, token_ids: meta.decoder_token_ids,
      special: meta.decoder_special ?? meta.decoder_tokens.map(() => false) };
}

/** An encoder-decoder's answer as the one-stack answer of the attention `which`: tokens (the queries'), special,
 *  segments, causal; `keys` ({tokens, special}: the encoder's) for cross-attention; `stack` (what it is, in words);
 *  `encoder` and `decoder` (both token lists). The next-token fields stay: they are the decoder's. */
export function stackMeta(meta, which) {
  const enc = side(meta, "encoder"), dec = side(meta, "decoder");
  const queries = which === "encoder" ? enc : dec;
  return {
    ...meta, ...queries, segments: queries.tokens.map(() => 0), offsets: null, mask_tokens: [],
    causal: STACKS[which].causal, token_logprobs: which === "encoder" ? null : meta.token_logprobs,
    keys: which === "cross" ? enc : undefined,
    stack: { which, title: LABELS[which], ...STACKS[which] }, encoder: enc, decoder: dec,
  };
}

/** A view's /api/attention answer with the attention `which` as its `attention` (others pass unchanged). */
export function stackAnswer(ans, which) {
  if (!ans || !ans.decoder_attention) return ans;
  const attention = { encoder: ans.attention, decoder: ans.decoder_attention, cross: ans.cross_attention }[which];
  return { ...ans, attention };
}
