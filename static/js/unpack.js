// What a notebook output carries, unpacked: python/jupyter.py pack() undone. Base 85 over printable ASCII without
// the characters a JSON string or a <script> element would escape, then raw deflate (inflated by the browser's own
// DecompressionStream), then each `stride`-byte element's bytes gathered back from their planes. Also inlined, as
// it is, before plotly.js in a kernel's first output (jupyter.plotly_script).
const ALPHABET = [...Array(94)].map((_, i) => String.fromCharCode(33 + i)).filter((c) => !"\"\\<>&'`".includes(c))
  .slice(0, 85).join("");

export async function unpack(packed, stride = 1) {
  const index = new Uint8Array(128);
  for (let i = 0; i < 85; i++) index[ALPHABET.charCodeAt(i)] = i;
  const pad = Number(packed[0]), groups = (packed.length - 1) / 5, bytes = new Uint8Array(groups * 4);
  for (let g = 0, at = 1; g < groups; g++) {
    let word = 0;
    for (let k = 0; k < 5; k++) word = word * 85 + index[packed.charCodeAt(at++)];
    bytes[4 * g] = word >>> 24; bytes[4 * g + 1] = (word >>> 16) & 255;
    bytes[4 * g + 2] = (word >>> 8) & 255; bytes[4 * g + 3] = word & 255;
  }
  const planes = new Uint8Array(await new Response(new Blob([bytes.subarray(0, bytes.length - pad)]).stream()
    .pipeThrough(new DecompressionStream("deflate-raw"))).arrayBuffer());
  if (stride === 1) return planes;
  const n = planes.length / stride, out = new Uint8Array(planes.length);
  for (let b = 0; b < stride; b++) {
    for (let i = 0, at = b * n; i < n; i++) out[i * stride + b] = planes[at + i];
  }
  return out;
}
