// The ONE data-fetch module: every request to the backend goes through here.
// Answers are fetched in the binary tensor form (b"ATSC" | uint32 n | JSON header | 8-aligned
// tensors), decoded into Tensor objects, and cached in memory keyed by the request, so switching
// views or heads never refetches what is already here. A long text's run can take seconds: its progress is
// read first from the NDJSON stream of the same request (progress lines, then "done"), and the answer is then
// fetched in the binary form, which the server answers from its cache.

export const BINARY = "application/vnd.attnscope.tensors";
export const NDJSON = "application/x-ndjson";

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

/** A decoded n-d tensor (C order): floats held as Float32Array whatever the wire dtype, int32 as Int32Array. */
export class Tensor {
  constructor(data, shape, dtype = "float32") {
    this.data = data;
    this.shape = shape;
    this.dtype = dtype;          // the wire dtype: float16 values are float16-exact only
    this.strides = shape.map((_, i) => shape.slice(i + 1).reduce((a, b) => a * b, 1));
  }
  /** Element at a full index. */
  at(...idx) {
    let o = 0;
    for (let i = 0; i < idx.length; i++) o += idx[i] * this.strides[i];
    return this.data[o];
  }
  /** The trailing sub-array at a leading index (zero-copy): t.sub(l, h) of [L,H,T,T] is one T x T matrix. */
  sub(...idx) {
    let o = 0;
    for (let i = 0; i < idx.length; i++) o += idx[i] * this.strides[i];
    const shape = this.shape.slice(idx.length);
    return new Tensor(this.data.subarray(o, o + shape.reduce((a, b) => a * b, 1)), shape, this.dtype);
  }
  /** Row i of a matrix (zero-copy typed array). */
  row(i) {
    const n = this.shape[this.shape.length - 1];
    return this.data.subarray(i * n, (i + 1) * n);
  }
  /** Nested plain arrays (for JSON export). */
  toArray() {
    const rec = (off, dim) => dim === this.shape.length - 1
      ? Array.from(this.data.subarray(off, off + this.shape[dim]))
      : Array.from({ length: this.shape[dim] }, (_, i) => rec(off + i * this.strides[dim], dim + 1));
    return rec(0, 0);
  }
}

// ---- float16 ---------------------------------------------------------------------------------
function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

let HALF_TABLE = null;
function decodeFloat16(buffer, offset, count) {
  if (typeof Float16Array === "function") return Float32Array.from(new Float16Array(buffer, offset, count));
  HALF_TABLE ??= Float32Array.from({ length: 65536 }, (_, i) => halfToFloat(i));
  const raw = new Uint16Array(buffer, offset, count), out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = HALF_TABLE[raw[i]];
  return out;
}

/** Decode the binary form into the header's fields plus one Tensor per tensor. */
export function decodeBinary(buffer) {
  const bytes = new Uint8Array(buffer);
  if (buffer.byteLength < 8 || String.fromCharCode(...bytes.subarray(0, 4)) !== "ATSC") {
    throw new ApiError(0, "the server sent an answer this page cannot read (bad magic)");
  }
  const n = new DataView(buffer).getUint32(4, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  const base = 8 + n;
  for (const t of header.tensors || []) {
    const count = t.shape.reduce((a, b) => a * b, 1);
    const start = base + t.offset;
    const data = t.dtype === "float16" ? decodeFloat16(buffer, start, count)
      : t.dtype === "int32" ? new Int32Array(buffer.slice(start, start + 4 * count))
        : new Float32Array(buffer.slice(start, start + 4 * count));
    header[t.name] = new Tensor(data, t.shape, t.dtype);
  }
  delete header.tensors;
  header.bytes = buffer.byteLength;
  return header;
}

// ---- requests --------------------------------------------------------------------------------
const cache = new Map();      // key -> Promise of a decoded answer (in-flight requests are shared)
const MAX_ENTRIES = 40;
export const log = [];        // {path, body, bytes | stream, ms, end} of every network request (tests, benches)

function cacheKey(path, body) {
  const sorted = Object.keys(body).sort().reduce((o, k) => ((o[k] = body[k]), o), {});
  return path + " " + JSON.stringify(sorted);
}

async function post(path, body, accept, extra = {}, signal = undefined) {
  let response;
  try {
    response = await fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json", Accept: accept, ...extra }, body: JSON.stringify(body),
      signal,
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `could not reach the server (${err.message}); is it still running?`);
  }
  return checked(response);
}

/** The response, or an ApiError with the server's `detail` (its status line when the body is not JSON). */
async function checked(response) {
  if (!response.ok) {
    let detail = `${response.status} ${response.statusText}`;
    try {
      const j = await response.json();
      if (j && typeof j.detail === "string") detail = j.detail;
    } catch { /* not JSON: keep the status line */ }
    throw new ApiError(response.status, detail);
  }
  return response;
}

async function getJSON(path) {
  const started = performance.now();
  let response;
  try {
    response = await fetch(path, { headers: { Accept: "application/json" } });
  } catch (err) {
    throw new ApiError(0, `could not reach the server (${err.message}); is it still running?`);
  }
  const answer = await (await checked(response)).json();
  log.push({ path, body: null, ms: performance.now() - started, end: performance.now() });
  if (log.length > 200) log.shift();
  return answer;
}

async function fetchBinary(path, body) {
  const started = performance.now();
  const response = await post(path, body, `${BINARY}, application/json;q=0.5`);
  const answer = decodeBinary(await response.arrayBuffer());
  log.push({ path, body, bytes: answer.bytes, ms: performance.now() - started, end: performance.now() });
  if (log.length > 200) log.shift();
  return answer;
}

async function fetchJSON(path, body) {
  const started = performance.now();
  const response = await post(path, body, "application/json");
  const text = await response.text();
  const answer = JSON.parse(text);
  answer.bytes = text.length;
  log.push({ path, body, bytes: answer.bytes, ms: performance.now() - started, end: performance.now() });
  if (log.length > 200) log.shift();
  return answer;
}

/** Only the fields of `body` that `fields` names (a request merged with the page's run options carries more). */
const only = (body, fields) => Object.fromEntries(fields.filter((k) => body[k] !== undefined && body[k] !== null)
  .map((k) => [k, body[k]]));

// ---- progress of a layer-by-layer run ----------------------------------------------------------------------
let progressListener = () => {};
/** fn({layer, layers}) is called for every layer a layer-by-layer run finishes (one listener: the page's progress bar). */
export function onProgress(fn) {
  progressListener = fn;
}

/** Read an NDJSON response a line at a time as it arrives: fn(message) for each; an {"error"} line throws its
 *  ApiError (a refusal that came once the stream had begun). */
async function readLines(response, fn) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  const line = (text) => {
    if (!text.trim()) return;
    const msg = JSON.parse(text);
    if (msg.error) {
      const { status, detail } = msg.error;
      throw new ApiError(status, typeof detail === "string" ? detail : JSON.stringify(detail));
    }
    fn(msg);
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        line(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
      }
    }
    line(buf);
  } catch (err) {
    reader.cancel().catch(() => {});             // an error line (or an abort): stop reading the rest
    throw err;
  }
}

/** The streamed runs under way: cancelRuns() aborts them all (the page's Cancel button). */
const streaming = new Set();

/** Read the request's NDJSON stream (progress lines, then done or error) without its result: the run is then
 *  in the server's cache. Cancelled (cancelRuns), it rejects with an ApiError of status 0 saying so; the server
 *  stops a run of many before its next batch once nobody waits for it. */
async function runWithProgress(path, body) {
  const started = performance.now();
  const abort = new AbortController();
  streaming.add(abort);
  try {
    const response = await post(path, body, NDJSON, { Prefer: "return=minimal" }, abort.signal);
    await readLines(response, (msg) => { if (msg.progress) progressListener(msg.progress); });
  } catch (err) {
    if (abort.signal.aborted) throw Object.assign(new ApiError(0, "Cancelled: the runs stopped. Press Run to start them again."), { cancelled: true });
    throw err;
  } finally {
    streaming.delete(abort);
  }
  log.push({ path, body, stream: true, ms: performance.now() - started, end: performance.now() });   // the run is done
}

/** Stop every streamed run under way (their requests reject; nothing of them is cached here). */
export function cancelRuns() {
  for (const abort of streaming) abort.abort();
  return streaming.size;
}

const progressThenBinary = (path, body) => runWithProgress(path, body).then(() => fetchBinary(path, body));
const progressThenJSON = (path, body) => runWithProgress(path, body).then(() => fetchJSON(path, body));

function cached(path, body, load = fetchBinary) {
  const key = cacheKey(path, body);
  let p = cache.get(key);
  if (p) {
    cache.delete(key);           // refresh its place in the LRU order
  } else {
    p = load(path, body);
    p.catch(() => cache.delete(key));
  }
  cache.set(key, p);
  while (cache.size > MAX_ENTRIES) cache.delete(cache.keys().next().value);
  return p;
}

/** POST /api/attention (binary). Options: layers, heads, include, resolution, top_k, dtype. With
 *  {progress: true} (a long text, matrix.js longText) an answer not cached here streams its run's progress first. */
export function attention(body, { progress = false } = {}) {
  return cached("/api/attention", body, progress ? progressThenBinary : fetchBinary);
}

/** POST /api/stages (binary): q, k, scores, scaled, mask, masked, probs for one layer and head. */
export function stages(body) {
  return cached("/api/stages", body);
}

/** POST /api/patching (JSON): activation patching of `site` between clean and corrupt texts of the same token
 *  count; the metric reads target (minus distractor). Fields other than the endpoint's own are dropped. Its runs
 *  (one per head) stream their progress first (runs done of all, the time left: the page's bar), and can be
 *  cancelled (cancelRuns); the answer then comes from the server's cache. */
export function patching(body) {
  return cached("/api/patching", only(body, ["model", "clean", "corrupt", "target", "distractor", "site",
    "per_position", "direction", "precision"]), progressThenJSON);
}

/** POST /api/path_patching (JSON): each head in turn the sender of paths to `receivers`' `receiver_input`
 *  ([layer, head] pairs), every other head frozen at its clean output. */
export function path_patching(body) {
  return cached("/api/path_patching", only(body, ["model", "clean", "corrupt", "target", "distractor", "receivers",
    "receiver_input", "precision"]), fetchJSON);
}

/** POST /api/knockout (JSON): `queries` stop reading `keys` in layers [first, last]; the prediction before and
 *  after. The page's text is the knocked-out text. */
export function knockout(body) {
  return cached("/api/knockout", only(body, ["model", "text", "queries", "keys", "layers", "precision"]), fetchJSON);
}

/** POST /api/generate (NDJSON, never cached: a generation is streamed, not looked up). onToken(token) is called
 *  with each new token's line as it arrives; resolves to the last line's `done`. A refusal before the stream (4xx)
 *  or in it (an {"error"} line) rejects with an ApiError; signal (an AbortSignal) stops it, rejecting with an
 *  AbortError (the server stops at the end of the step under way). */
export async function generate(body, onToken, { signal } = {}) {
  const started = performance.now();
  const response = await post("/api/generate", only(body, ["model", "text", "max_new_tokens", "greedy", "temperature",
    "top_k", "top_p", "seed", "stop", "chat", "interventions", "layers", "heads", "include"]), NDJSON, {}, signal);
  let done = null;
  await readLines(response, (msg) => {
    if (msg.token) onToken(msg.token);
    if (msg.done) done = msg.done;
  });
  log.push({ path: "/api/generate", body, stream: true, ms: performance.now() - started, end: performance.now() });
  if (!done) throw new ApiError(0, "the generation's stream ended before its last line; is the server still running?");
  return done;
}

/** POST /api/qk (JSON): the pre-softmax score of head (layer, head) at cell (query, key), split into pairs of a
 *  query-side and a key-side component of the residual stream (the top pairs, each side's sums). The page's run
 *  options other than the text are not the endpoint's: dropped (the attribution is of the model's own run). */
export function qk(body) {
  return cached("/api/qk", only(body, ["model", "text", "layer", "head", "query", "key", "top", "table", "precision"]),
    fetchJSON);
}

/** POST /api/lens (JSON): the logit lens (every layer's residual stream through the final norm and the
 *  unembedding), and with layer and head that head's output through the same (its promoted and suppressed tokens:
 *  the API's head_lens [layer, head]). */
export function lens({ layer, head, ...body }) {
  const asked = only(body, ["model", "text", "top", "precision"]);
  return cached("/api/lens", layer === undefined ? asked : { ...asked, head_lens: [layer, head] }, fetchJSON);
}

/** POST /api/circuits (JSON): the model's weight-space circuits, no text: each head's OV copying score and the Q-, K-
 *  and V-composition of every earlier head into every later one. */
export function circuits(body) {
  return cached("/api/circuits", only(body, ["model", "precision"]), fetchJSON);
}

/** GET /api/jobs (JSON, never cached: jobs move on): every corpus job, newest first. */
export function jobs() {
  return getJSON("/api/jobs");
}

/** GET /api/jobs/{job}/result (JSON): a finished atlas job's result (cached: a finished job never changes). */
export function atlas({ job }) {
  return cached("/api/jobs/result", { job }, () => getJSON(`/api/jobs/${encodeURIComponent(job)}/result?format=json`));
}

/** POST /api/jobs (JSON): start a corpus job, {kind, model, corpus: "bundled" | {format, data, column?}, options}.
 *  The same request is the same job: posting a stopped one again resumes it from its finished chunks. */
export async function startJob(body) {
  return (await post("/api/jobs", body, "application/json")).json();
}

/** DELETE /api/jobs/{id} (JSON): cancel a queued or running job (a running one stops after the chunk under way). */
export async function cancelJob(id) {
  let response;
  try {
    response = await fetch(`/api/jobs/${encodeURIComponent(id)}`, { method: "DELETE", headers: { Accept: "application/json" } });
  } catch (err) {
    throw new ApiError(0, `could not reach the server (${err.message}); is it still running?`);
  }
  return (await checked(response)).json();
}
