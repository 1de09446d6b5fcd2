// Pure helpers on decoded answers: which tokens are shown, sub-matrices, renormalisation.

/** Indices of the tokens to show: all, or all but the special tokens ([CLS], [SEP]). */
export function visibleTokens(meta, hideSpecial) {
  const idx = [];
  meta.tokens.forEach((_, i) => { if (!(hideSpecial && meta.special[i])) idx.push(i); });
  return idx.length ? idx : meta.tokens.map((_, i) => i);
}

/**
 * The rows/columns idx of a T x T matrix (a Tensor of shape [T, T]).
 * renorm: divide each row by its sum over the kept keys, so it sums to 1 again.
 * Returns {z: number[][] (shown), raw: number[][] (the model's own), rowMass: kept mass per row}.
 */
export function subMatrix(m, idx, renorm) {
  const z = [], raw = [], rowMass = [];
  for (const i of idx) {
    const row = m.row(i);
    const r = idx.map((j) => row[j]);
    let s = 0;
    for (const v of r) s += v;
    raw.push(r);
    rowMass.push(s);
    z.push(renorm && s > 0 ? r.map((v) => v / s) : r);
  }
  return { z, raw, rowMass };
}

export function maxOf(rows) {
  let m = 0;
  for (const r of rows) for (const v of r) if (v > m) m = v;
  return m;
}

/** Keep at most ~n labels along an axis: returns the positions to label. */
export function thinTicks(count, n = 40) {
  const step = Math.max(1, Math.ceil(count / n));
  const out = [];
  for (let i = 0; i < count; i += step) out.push(i);
  return out;
}

/** The run options shared by every request for a state. */
export function runOptions(st, info) {
  const body = { model: st.model, text: st.text };
  if (info.pair && st.text_pair) body.text_pair = st.text_pair;
  if (st.causal !== null) body.causal = st.causal;
  if (st.mask_tokens.length) body.mask_tokens = st.mask_tokens;
  return body;
}
