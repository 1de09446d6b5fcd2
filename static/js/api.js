// The ONE data-fetch module: every request to the backend goes through here.
// Answers are fetched in the binary tensor form (b"ATSC" | uint32 n | JSON header | 8-aligned
// tensors), decoded into Tensor objects, and cached in memory keyed by the request, so switching
// views or heads never refetches what is already here. A long text's run can take seconds: its progress is
// read first from the NDJSON stream of the same request (progress lines, then "done"), and the answer is then
// fetched in the binary form, which the server answers from its cache.

import { BOOT } from "./boot.js";

export const BINARY = "application/vnd.attnscope.tensors";
export const NDJSON = "application/x-ndjson";

/** An API's refusal as the page says it: `detail` in a visitor's words (plainWords), `api` the answer's own. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(plainWords(detail));
    this.status = status;
    this.detail = plainWords(detail);
    this.api = detail;
  }
}

const SETTING = /ATTNSCOPE_\w+/, ENDPOINT = /\/api\/[\w/{}.-]*[\w}]/;
/** The API's message without the names a program's author needs (its settings, ATTNSCOPE_*, and endpoints, /api/...):
 *  a parenthesis that names one goes, "ask /api/attention for" becomes "ask for", any other name a plain word. */
export function plainWords(detail) {
  return String(detail)
    .replace(new RegExp(String.raw`\s*\([^()]*(?:${SETTING.source}|${ENDPOINT.source})[^()]*\)`, "g"), "")
    .replace(new RegExp(String.raw`\b(ask|use) ${ENDPOINT.source} for`, "g"), "$1 for")
    .replace(new RegExp(ENDPOINT.source, "g"), "another request")
    .replace(new RegExp(SETTING.source, "g"), "a server setting");
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

// ---- the analyses: one function for all, from the registry -------------------------------------------------
/** The server's analyses (the boot block's `analyses`, made from analyses/registry.py): name -> {path, fields (the
 *  request fields the page sends; all when empty), form (binary or json), stream (what its NDJSON form streams)}. */
export const ANALYSES = Object.fromEntries((BOOT.analyses ?? []).map((a) => [a.name, a]));

function described(name) {
  const a = ANALYSES[name];
  if (!a) throw new ApiError(0, `this server has no analysis named ${name}`);
  return a;
}

/** POST an analysis' request (a view's {endpoint: name, ...}), cached here by its body: binary or JSON as the
 *  registry says, with only the fields it takes (a request merged with the page's run options carries more). An
 *  analysis of many runs (patching: one per head) streams its progress first (the page's bar) and can be cancelled
 *  (cancelRuns); with {progress: true} so does a long text's attention (matrix.js longText). The answer then comes
 *  from the server's cache. */
export function analysis(name, body, { progress = false } = {}) {
  const a = described(name);
  if (a.stream === "tokens") {                  // a generation a view draws (views/cache.js): {tokens, done}, cached
    const tokens = [];
    return cached(a.path, only(body, a.fields), (path, sent) => generate(sent, (t) => tokens.push(t))
      .then((done) => ({ tokens, done })));
  }
  const load = a.form === "binary" ? fetchBinary : fetchJSON;
  const streamed = a.stream === "runs" || (a.stream === "layers" && progress);
  return cached(a.path, a.fields.length ? only(body, a.fields) : body,
    streamed ? (path, sent) => runWithProgress(path, sent).then(() => load(path, sent)) : load);
}

/** POST /api/generate (NDJSON, never cached: a generation is streamed, not looked up). onToken(token) is called
 *  with each new token's line as it arrives; resolves to the last line's `done`. A refusal before the stream (4xx)
 *  or in it (an {"error"} line) rejects with an ApiError; signal (an AbortSignal) stops it, rejecting with an
 *  AbortError (the server stops at the end of the step under way). */
export async function generate(body, onToken, { signal } = {}) {
  const started = performance.now();
  const a = described("generate");
  const response = await post(a.path, only(body, a.fields), NDJSON, {}, signal);
  let done = null;
  await readLines(response, (msg) => {
    if (msg.token) onToken(msg.token);
    if (msg.done) done = msg.done;
  });
  log.push({ path: a.path, body, stream: true, ms: performance.now() - started, end: performance.now() });
  if (!done) throw new ApiError(0, "the generation's stream ended before its last line; is the server still running?");
  return done;
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

/** POST /api/jobs/{id}/cancel (JSON): cancel a queued or running job (a running one stops after the chunk under way;
 *  DELETE /api/jobs/{id} removes a job and its files). */
export async function cancelJob(id) {
  return (await post(`/api/jobs/${encodeURIComponent(id)}/cancel`, {}, "application/json")).json();
}
