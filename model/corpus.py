"""Corpus statistics: per-head summaries averaged over thousands of texts, on a process pool or on Ray.

    job = run_corpus("texts.txt", "minilm", out="minilm.corpus.json")           # engine="local" by default
    job["stats"]["previous_token_mass"][layer][head], job["js_distance"][a][b]  # a, b = layer * H + head

Every statistic is a token-weighted mean over ALL query rows of ALL texts (Clark et al. 2019, "What Does BERT
Look At?"), so a one-text corpus gives exactly model.stats.head_stats for that text. Workers never send
attention matrices: each text becomes per-head float64 sums and counts (`Sums`), sums are added per chunk on
the worker, and the driver adds the chunks up. Both engines run the same `ChunkWorker` on the same chunks (same
batches, same padding), so they give the same numbers.

    sum over query rows i of ...                       denominator
    mean_entropy         H(p_i) = -sum_j p_ij log p_ij   rows (= tokens)
    first/last_token_mass  p_i,0 / p_i,T-1               rows
    diagonal_mass        p_ii                            rows
    previous_token_mass  p_i,i-1 for i >= 1              pairs (= sum over texts of T - 1)
    next_token_mass      p_i,i+1 for i <= T-2            pairs (0 for causal models: the future is masked)
    mean_distance        sum_j p_ij |i - j|              rows
    punctuation_mass     sum_j p_ij over punctuation keys      rows
    special_token_mass[tok]  sum_j p_ij over keys that are special token `tok` ([CLS], [SEP], ...)   rows
    js_divergence[a, b]  JS(p^a_i, p^b_i) = H((p^a_i + p^b_i) / 2) - (H(p^a_i) + H(p^b_i)) / 2   js_rows

js_divergence is the Jensen-Shannon divergence in nats (0 .. log 2) averaged over query rows, Clark et al.'s
head-to-head measure. js_distance is its square root: a metric (a root of a sum of squared metrics), the one
to cluster or embed heads with. JS costs (L*H)^2 * T per row, so it is taken over at most `js_rows` query rows
of each text (evenly spaced; all rows of a text that has no more; 0 turns it off).

Input: one text per line (.txt and anything else), JSON Lines with a text field (.jsonl, .ndjson), CSV/TSV or
Parquet with a text column (via pyarrow). Bad records (empty, not UTF-8, invalid JSON, no such field, null,
over `max_chars` characters) are skipped and reported with their line (text, JSONL) or row (CSV, Parquet)
number; a missing column or an unreadable file is refused with a CorpusError. A line is never read into memory
beyond the limit, so a 10 GB line costs nothing.

Partial results: after each finished chunk the running sums and the finished chunk numbers are written
(atomically, at most once a second) to OUT.partial.json; running the same job again with the same out resumes
from it, so a crash at 90 % keeps 90 %. The finished job writes OUT and removes the partial file.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal

import numpy as np

from . import stats
from . import zoo

Engine = Literal["local", "ray"]
STATS = stats.HEAD_STATS + ("next_token_mass", "punctuation_mass")
PER_PAIR = ("previous_token_mass", "next_token_mass")      # averaged over the T - 1 queries that have a neighbour
MAX_CHARS = 20_000        # the API's default text limit (ATTNSCOPE_MAX_CHARS)
CHUNK_SIZE = 64           # texts per unit of work, of progress and of the partial file
BATCH_SIZE = 16           # texts per model run (sorted by length within a chunk, so padding is small)
JS_ROWS = 64              # query rows per text that enter the JS matrix
FORMATS = ("text", "jsonl", "csv", "tsv", "parquet")
KEPT_PROBLEMS = 1000      # problems listed in the output (all are counted)


class CorpusError(ValueError):
    """The job cannot run as asked (missing column, unreadable file, no texts, ...); the message says why."""


def cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# ---- one text -> sums ---------------------------------------------------------------------------
def is_punctuation(piece: str) -> bool:
    """A token whose characters (spaces aside) are all Unicode punctuation (categories P*)."""
    piece = piece.strip()
    return bool(piece) and all(unicodedata.category(c).startswith("P") for c in piece)


def js_rows_of(T: int, js_rows: int) -> np.ndarray:
    """The query rows that enter the JS matrix: all when T <= js_rows, else js_rows evenly spaced ones."""
    if js_rows <= 0:
        return np.zeros(0, int)
    if T <= js_rows:
        return np.arange(T)
    return np.unique(np.linspace(0, T - 1, js_rows).round().astype(int))


def js_sums(p: np.ndarray, block: int = 1 << 18) -> np.ndarray:
    """Sum over query rows of the JS divergence between every two heads' rows. p [L, H, R, T] -> [LH, LH]

    JS(a, b) = H(m) - (H(a) + H(b)) / 2 with m = (a + b) / 2, in nats (0 when a = b, log 2 when disjoint).
    Head pairs go in blocks of about `block` numbers."""
    L, H, R, T = p.shape
    P = np.asarray(p, np.float64).reshape(L * H, R, T)
    h = stats.entropy(P).sum(-1)                                        # [LH] summed over the rows
    A, B = np.triu_indices(L * H, 1)                                    # every pair a < b
    out = np.zeros((L * H, L * H))
    step = max(1, block // P[0].size)
    for s in range(0, len(A), step):
        a, b = A[s:s + step], B[s:s + step]
        m = P[a]                                                        # [pairs, R, T], a copy
        m += P[b]
        m *= 0.5
        out[a, b] = stats.entropy(m).sum(-1) - 0.5 * (h[a] + h[b])
    return out + out.T


def head_map(distance: np.ndarray) -> dict:
    """What a page needs to show heads by their JS distance [LH, LH]: an average-linkage clustering (scipy's
    linkage rows [a, b, height, size] and its leaf order, to reorder the matrix or draw a dendrogram) and a
    2-D classical MDS embedding (Clark et al.'s head map; signs fixed so the result is deterministic)."""
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import squareform
    D = np.asarray(distance, np.float64)
    n = len(D)
    if n < 2:
        return {"method": "average linkage; classical MDS", "order": list(range(n)), "linkage": [],
                "mds": [[0.0, 0.0]] * n}
    Z = linkage(squareform(D, checks=False), method="average")
    J = np.eye(n) - 1.0 / n
    w, v = np.linalg.eigh(-0.5 * J @ (D ** 2) @ J)                      # ascending eigenvalues
    w, v = w[::-1][:2], v[:, ::-1][:, :2]
    v *= np.sign(v[np.abs(v).argmax(0), range(v.shape[1])])            # largest entry of each axis positive
    return {"method": "average linkage; classical MDS", "order": leaves_list(Z).tolist(), "linkage": Z.tolist(),
            "mds": (v * np.sqrt(np.maximum(w, 0))).tolist()}


@dataclass
class Sums:
    """Per-head sums over query rows and their counts: what a worker sends instead of T x T matrices.

    Adding two Sums is adding corpora; `result()` divides. All sums are float64."""
    layers: int
    heads: int
    texts: int = 0
    tokens: int = 0                  # query rows, special tokens included (denominator of most stats)
    pairs: int = 0                   # sum over texts of T - 1 (denominator of previous/next token mass)
    js_rows: int = 0                 # query rows that entered the JS sums
    truncated: int = 0               # texts cut at the model's max_tokens
    head: dict[str, np.ndarray] = field(default_factory=dict)      # stat -> [L, H]
    special: dict[str, np.ndarray] = field(default_factory=dict)   # special token -> [L, H] mass
    js: np.ndarray | None = None                                    # [LH, LH]

    def __post_init__(self):
        for name in STATS:
            self.head.setdefault(name, np.zeros((self.layers, self.heads)))
        if self.js is None:
            self.js = np.zeros((self.layers * self.heads,) * 2)

    @classmethod
    def of_text(cls, p: np.ndarray, punctuation: np.ndarray, special: dict[str, np.ndarray],
                js_rows: int = JS_ROWS, truncated: bool = False) -> "Sums":
        """One text's sums. p [L, H, T, T] (rows sum to 1); punctuation [T] bool over keys;
        special {token: [T] bool over keys}. Layer by layer in float64, so the extra memory is one layer's."""
        L, H, T, _ = p.shape
        i = np.arange(T)
        distance = np.abs(i[:, None] - i[None, :]).astype(np.float64)                    # |i - j|
        punctuation = np.asarray(punctuation, bool)
        s = cls(L, H, texts=1, tokens=T, pairs=T - 1, truncated=int(truncated))
        s.special = {tok: np.zeros((L, H)) for tok in special}
        for l in range(L):
            q = np.asarray(p[l], np.float64)                                              # [H, T, T]
            s.head["mean_entropy"][l] = stats.entropy(q).sum(-1)
            s.head["first_token_mass"][l] = q[:, :, 0].sum(-1)
            s.head["last_token_mass"][l] = q[:, :, -1].sum(-1)
            s.head["diagonal_mass"][l] = q[:, i, i].sum(-1)
            s.head["previous_token_mass"][l] = q[:, i[1:], i[:-1]].sum(-1)
            s.head["next_token_mass"][l] = q[:, i[:-1], i[1:]].sum(-1)
            s.head["mean_distance"][l] = np.einsum("hqk,qk->h", q, distance)
            s.head["punctuation_mass"][l] = q[:, :, punctuation].sum((-1, -2))
            for tok, keys in special.items():
                s.special[tok][l] = q[:, :, np.asarray(keys, bool)].sum((-1, -2))
        rows = js_rows_of(T, js_rows)
        s.js_rows = len(rows)
        if len(rows):
            s.js = js_sums(p[:, :, rows])                                                 # [L, H, R, T] in
        return s

    @classmethod
    def of_result(cls, res, text: str, js_rows: int = JS_ROWS) -> "Sums":
        """One runtime.AttentionResult's sums; punctuation from the token's characters in `text`."""
        e = res.encoding
        punct = np.array([not sp and is_punctuation(text[a:b]) for sp, (a, b) in zip(e.special, e.offsets)])
        special: dict[str, np.ndarray] = {}
        for j, (tok, sp) in enumerate(zip(e.tokens, e.special)):
            if sp:
                special.setdefault(tok, np.zeros(len(e.tokens), bool))[j] = True
        return cls.of_text(res.attentions, punct, special, js_rows, e.truncated)

    def add(self, other: "Sums") -> "Sums":
        if (other.layers, other.heads) != (self.layers, self.heads):
            raise ValueError(f"cannot add sums of {other.layers}x{other.heads} heads to {self.layers}x{self.heads}")
        self.texts += other.texts
        self.tokens += other.tokens
        self.pairs += other.pairs
        self.js_rows += other.js_rows
        self.truncated += other.truncated
        for name, v in other.head.items():
            self.head[name] = self.head[name] + v
        for tok, v in other.special.items():
            self.special[tok] = self.special[tok] + v if tok in self.special else v.copy()
        self.js = self.js + other.js
        return self

    def result(self) -> dict:
        """Means: {texts, tokens, truncated, js_rows, stats {name: [L, H]}, special_token_mass {tok: [L, H]},
        js_divergence, js_distance [LH, LH] (None without JS rows)} as numpy arrays; 0 where a denominator is 0."""
        def mean(v, n):
            return v / n if n else np.zeros_like(v)
        div = None
        if self.js_rows:
            div = np.maximum(self.js / self.js_rows, 0.0)       # clip float rounding below 0 (identical rows)
            np.fill_diagonal(div, 0.0)
        return {"texts": self.texts, "tokens": self.tokens, "truncated": self.truncated, "js_rows": self.js_rows,
                "stats": {name: mean(v, self.pairs if name in PER_PAIR else self.tokens)
                          for name, v in self.head.items()},
                "special_token_mass": {tok: mean(v, self.tokens) for tok, v in sorted(self.special.items())},
                "js_divergence": div, "js_distance": None if div is None else np.sqrt(div)}

    # JSON for the partial file: Python floats round-trip exactly through repr
    def to_json(self) -> dict:
        return {"layers": self.layers, "heads": self.heads, "texts": self.texts, "tokens": self.tokens,
                "pairs": self.pairs, "js_rows": self.js_rows, "truncated": self.truncated,
                "head": {k: v.tolist() for k, v in self.head.items()},
                "special": {k: v.tolist() for k, v in self.special.items()}, "js": self.js.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> "Sums":
        return cls(d["layers"], d["heads"], d["texts"], d["tokens"], d["pairs"], d["js_rows"], d["truncated"],
                   {k: np.array(v, np.float64) for k, v in d["head"].items()},
                   {k: np.array(v, np.float64) for k, v in d["special"].items()}, np.array(d["js"], np.float64))


# ---- reading a corpus ---------------------------------------------------------------------------
@dataclass
class Problem:
    """A record that was skipped: where (unit 'line' or 'row', 1-based number) and why."""
    unit: str
    number: int
    reason: str

    def __str__(self) -> str:
        return f"{self.unit} {self.number}: {self.reason}; skipped"

    def to_json(self) -> dict:
        return {self.unit: self.number, "reason": self.reason}


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet",
            ".pq": "parquet"}.get(suffix, "text")


def _check_text(text: str, unit: str, n: int, max_chars: int) -> str | Problem:
    if not text.strip():
        return Problem(unit, n, "empty")
    if len(text) > max_chars:
        return Problem(unit, n, f"{len(text):,} characters, over the limit of {max_chars:,} (--max-chars)")
    return text


def _decode(raw: bytes, unit: str, n: int) -> str | Problem:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Problem(unit, n, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start})")


def _lines(path: Path, max_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, bytes without the newline, or None when the line is over max_bytes; its length in bytes).
    A long line is skipped in 1 MB pieces, never held in memory."""
    with open(path, "rb") as f:
        n = 0
        while True:
            raw = f.readline(max_bytes + 2)
            if not raw:
                return
            n += 1
            if raw.endswith(b"\n") or len(raw) <= max_bytes:
                raw = raw.rstrip(b"\r\n") if raw.endswith(b"\n") else raw
                if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]                            # a UTF-8 byte-order mark
                yield n, raw, len(raw)
                continue
            size = len(raw)
            while not raw.endswith(b"\n"):                    # the rest of an over-long line, piece by piece
                raw = f.readline(1 << 20)
                if not raw:
                    break
                size += len(raw)
            yield n, None, size - raw.endswith(b"\n")


def _too_long(n: int, size: int, unit: str, max_chars: int) -> Problem:
    return Problem(unit, n, f"{size:,} bytes, over the limit of {max_chars:,} characters (--max-chars)")


def _read_text(path: Path, max_chars: int) -> Iterator[tuple[int, str] | Problem]:
    for n, raw, size in _lines(path, 4 * max_chars):       # UTF-8 takes at most 4 bytes a character
        if raw is None:
            yield _too_long(n, size, "line", max_chars)
            continue
        text = _decode(raw, "line", n)
        if not isinstance(text, Problem):
            text = _check_text(text, "line", n, max_chars)
        yield text if isinstance(text, Problem) else (n, text)


def _read_jsonl(path: Path, column: str, max_chars: int) -> Iterator[tuple[int, str] | Problem]:
    found = False
    for n, raw, size in _lines(path, 6 * max_chars + 4096):  # JSON escapes (\uXXXX) take 6 bytes a character
        if raw is None:
            yield _too_long(n, size, "line", max_chars)
            continue
        line = _decode(raw, "line", n)
        if isinstance(line, Problem):
            yield line
            continue
        if not line.strip():
            yield Problem("line", n, "empty")
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            yield Problem("line", n, f"not valid JSON ({str(e).split(':')[0]})")
            continue
        if not isinstance(record, dict) or column not in record:
            yield Problem("line", n, f"no {column!r} field" + ("" if isinstance(record, dict) else
                                                               f" (a JSON {type(record).__name__}, not an object)"))
            continue
        found = True
        text = record[column]
        if not isinstance(text, str):
            yield Problem("line", n, f"{column!r} is {'null' if text is None else type(text).__name__}, not a string")
            continue
        text = _check_text(text, "line", n, max_chars)
        yield text if isinstance(text, Problem) else (n, text)
    if not found:
        raise CorpusError(f"no line of {path} has a {column!r} field; name the text field with --column")


def _binary_rows(values, start: int, max_chars: int) -> Iterator[tuple[int, str] | Problem]:
    """Rows of a pyarrow binary array (decoded here, so a bad row is one problem, not a failed file)."""
    for k, raw in enumerate(values.to_pylist()):
        n = start + k
        if raw is None:
            yield Problem("row", n, "null")
            continue
        if len(raw) > 4 * max_chars:
            yield Problem("row", n, f"{len(raw):,} bytes, over the limit of {max_chars:,} characters (--max-chars)")
            continue
        text = _decode(raw, "row", n)
        if not isinstance(text, Problem):
            text = _check_text(text, "row", n, max_chars)
        yield text if isinstance(text, Problem) else (n, text)


def _missing(column: str, path: Path, columns: list[str], given: bool) -> CorpusError:
    hint = "" if given else " (the default); name the text column with --column"
    return CorpusError(f"{path} has no column {column!r}{hint}. Its columns: {', '.join(columns) or 'none'}")


def _read_parquet(path: Path, column: str, given: bool, max_chars: int) -> Iterator[tuple[int, str] | Problem]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        raise CorpusError(f"cannot read {path} as Parquet: {e}") from None
    names = f.schema_arrow.names
    if column not in names:
        raise _missing(column, path, names, given)
    typ = f.schema_arrow.field(column).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ)
            or pa.types.is_large_binary(typ)):
        raise CorpusError(f"column {column!r} of {path} holds {typ}, not text; name the text column with --column")

    def rows():
        n = 1
        for batch in f.iter_batches(columns=[column], batch_size=4096, use_threads=False):
            values = batch.column(0).cast(pa.large_binary())       # decoded row by row: a bad row is one problem
            yield from _binary_rows(values, n, max_chars)
            n += len(values)
    return rows()


def _read_csv(path: Path, column: str, given: bool, max_chars: int,
              delimiter: str) -> Iterator[tuple[int, str] | Problem]:
    """CSV/TSV rows. A row with the wrong number of fields is refused (CorpusError naming its line): skipping it
    would shift the row numbers that every later problem is reported with."""
    import pyarrow as pa
    from pyarrow import csv
    malformed: list[str] = []

    def bad_row(row):
        where = f"row {row.number - 1}" if row.number else "a row"     # pyarrow counts the header as row 1
        malformed.append(f"{where}: {row.actual_columns} fields where the header has {row.expected_columns}")
        return "skip"

    parse = csv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=bad_row)
    convert = csv.ConvertOptions(column_types={column: pa.binary()}, include_columns=[column])
    try:
        reader = csv.open_csv(path, parse_options=parse, convert_options=convert,
                              read_options=csv.ReadOptions(block_size=1 << 22, use_threads=False))
    except Exception as e:  # noqa: BLE001 - pyarrow's errors
        if "include_columns" in str(e) or "does not exist" in str(e):
            with open(path, "rb") as fh:
                header = fh.readline().decode("utf-8", "replace").strip().split(delimiter)
            raise _missing(column, path, [h.strip('"') for h in header], given) from None
        raise CorpusError(f"cannot read {path} as CSV: {str(e).splitlines()[0]}") from None

    def rows():
        n = 1
        try:
            for batch in reader:
                if malformed:
                    break
                yield from _binary_rows(batch.column(0), n, max_chars)
                n += batch.num_rows
        except Exception as e:  # noqa: BLE001 - a malformed block past the first
            raise CorpusError(f"cannot read {path} as CSV after row {n - 1}: {str(e).splitlines()[0]}") from None
        if malformed:
            raise CorpusError(f"{path} is not well-formed CSV at {malformed[0]}"
                              + (f" (and {len(malformed) - 1} more rows)" if len(malformed) > 1 else "")
                              + "; quote fields that hold the delimiter or a newline")
    return rows()


def read_corpus(path, column: str | None = None, fmt: str | None = None,
                max_chars: int = MAX_CHARS) -> Iterator[tuple[int, str] | Problem]:
    """The texts of a corpus file, in order: (line or row number, text) for each good record, a Problem for
    each skipped one. Raises CorpusError at once when the file cannot be used at all (no such file, no such
    column), and while reading when a JSONL file turns out to have no record with the field."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise CorpusError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if max_chars < 1:
        raise CorpusError(f"max_chars must be at least 1; got {max_chars}")
    if fmt == "text":
        if column:
            raise CorpusError("--column is for JSONL, CSV and Parquet input; a text file has one text per line")
        return _read_text(path, max_chars)
    if fmt == "jsonl":
        return _read_jsonl(path, column or "text", max_chars)
    if fmt == "parquet":
        return _read_parquet(path, column or "text", bool(column), max_chars)
    return _read_csv(path, column or "text", bool(column), max_chars, "\t" if fmt == "tsv" else ",")


def count_records(path, fmt: str | None = None) -> int:
    """Lines or rows in the file (for the progress bar's total; a fast newline count for text formats)."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq
        return pq.ParquetFile(path).metadata.num_rows
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n") - (fmt in ("csv", "tsv"))


# ---- chunks and the worker that reduces them ---------------------------------------------------
@dataclass
class Chunk:
    """A unit of work: consecutive texts of the corpus (after sampling) and their line/row numbers."""
    index: int
    unit: str
    numbers: list[int]
    texts: list[str]


def chunks(records: Iterable[tuple[int, str] | Problem], unit: str, size: int = CHUNK_SIZE,
           sample: int | None = None, seed: int = 0,
           on_problem: Callable[[Problem], None] = lambda p: None) -> Iterator[Chunk]:
    """Group the good records into chunks of `size`; with `sample`, a uniform random sample (reservoir,
    seeded, kept in file order) of that many texts first."""
    def good_records():
        for r in records:
            if isinstance(r, Problem):
                on_problem(r)
            else:
                yield r
    good = good_records()
    if sample is not None:
        rng, kept = random.Random(seed), []
        for k, item in enumerate(good):
            if k < sample:
                kept.append(item)
            else:
                j = rng.randrange(k + 1)
                if j < sample:
                    kept[j] = item
        good = iter(sorted(kept))
    buf: list[tuple[int, str]] = []
    index = 0
    for item in good:
        buf.append(item)
        if len(buf) == size:
            yield Chunk(index, unit, [n for n, _ in buf], [t for _, t in buf])
            buf, index = [], index + 1
    if buf:
        yield Chunk(index, unit, [n for n, _ in buf], [t for _, t in buf])


class ChunkWorker:
    """One Runtime; turns a chunk into its Sums (and the texts the model refused). Both engines run this."""

    def __init__(self, model_id: str, threads: int = 1, batch_size: int = BATCH_SIZE, js_rows: int = JS_ROWS,
                 runtime=None, cache_dir=None):
        from .runtime import DEFAULT_CACHE, Runtime
        self.rt = runtime if runtime is not None else Runtime(zoo.get(model_id), threads=threads,
                                                              cache_dir=cache_dir or DEFAULT_CACHE)
        self.batch_size, self.js_rows = max(1, batch_size), js_rows

    def __call__(self, chunk: Chunk) -> tuple[Sums, list[Problem]]:
        cfg = self.rt.cfg
        total, problems = Sums(cfg.n_layers, cfg.n_heads), []
        order = sorted(range(len(chunk.texts)), key=lambda k: (len(chunk.texts[k]), k))   # similar lengths together
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            try:
                results = self.rt.run([chunk.texts[k] for k in batch])
            except ValueError:                                  # find the text the runtime refuses; keep the rest
                results = []
                for k in batch:
                    try:
                        results += self.rt.run([chunk.texts[k]])
                    except ValueError as e:
                        problems.append(Problem(chunk.unit, chunk.numbers[k], f"the model refused it ({e})"))
                        results.append(None)
            for k, res in zip(batch, results):
                if res is not None:
                    total.add(Sums.of_result(res, chunk.texts[k], self.js_rows))
        return total, problems


# ---- engines: each yields (chunk, sums, problems) as chunks finish -----------------------------------
_POOL_WORKER: ChunkWorker | Exception | None = None


def _pool_init(model_id: str, threads: int, batch_size: int, js_rows: int, cache_dir) -> None:
    global _POOL_WORKER
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the driver's: it saves the partial sums and stops
    try:
        _POOL_WORKER = ChunkWorker(model_id, threads, batch_size, js_rows, cache_dir=cache_dir)
    except Exception as e:  # noqa: BLE001 - reported with the first chunk, not as a broken pool
        _POOL_WORKER = CorpusError(f"a worker could not load {model_id!r}: {type(e).__name__}: {e}")


def _pool_run(chunk: Chunk) -> tuple[Chunk, Sums, list[Problem]]:
    if isinstance(_POOL_WORKER, Exception):
        raise _POOL_WORKER
    sums, problems = _POOL_WORKER(chunk)
    return Chunk(chunk.index, chunk.unit, [], []), sums, problems   # send back the index, not the texts


def run_inprocess(work: Iterable[Chunk], worker: ChunkWorker) -> Iterator[tuple[Chunk, Sums, list[Problem]]]:
    for chunk in work:
        yield (chunk, *worker(chunk))


def run_local(work: Iterable[Chunk], model_id: str, workers: int, threads: int, batch_size: int,
              js_rows: int, cache_dir=None) -> Iterator[tuple[Chunk, Sums, list[Problem]]]:
    """A process pool (spawned, so no onnxruntime state is forked), one Runtime per process."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_pool_init,
                               initargs=(model_id, threads, batch_size, js_rows, cache_dir))
    try:
        pending, work = set(), iter(work)
        while True:
            while len(pending) < 2 * workers and (chunk := next(work, None)) is not None:
                pending.add(pool.submit(_pool_run, chunk))
            if not pending:
                return
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class RayChunks:
    """Ray Data's callable class for map_batches: one ChunkWorker (one Runtime, one onnxruntime session) per
    actor. A batch of text rows (chunk, number, text) becomes one row of pickled Sums per chunk it touches."""

    def __init__(self, model_id: str, threads: int, batch_size: int, js_rows: int, unit: str, cache_dir=None):
        self.worker = ChunkWorker(model_id, threads, batch_size, js_rows, cache_dir=cache_dir)
        self.unit = unit

    def __call__(self, batch):
        import pyarrow as pa
        ids, numbers, texts = (batch.column(c).to_pylist() for c in ("chunk", "number", "text"))
        out = {"chunk": [], "texts": [], "result": []}
        for index in sorted(set(ids)):
            keep = [k for k, c in enumerate(ids) if c == index]
            chunk = Chunk(index, self.unit, [numbers[k] for k in keep], [texts[k] for k in keep])
            out["chunk"].append(index)
            out["texts"].append(len(keep))
            out["result"].append(pickle.dumps(self.worker(chunk)))
        return pa.table({"chunk": pa.array(out["chunk"], pa.int64()), "texts": pa.array(out["texts"], pa.int64()),
                         "result": pa.array(out["result"], pa.binary())})


def ray_start(num_cpus: int | None = None) -> bool:
    """Join the cluster at RAY_ADDRESS, else start a local one; True when this call started Ray."""
    import logging

    import ray
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(address="local", num_cpus=num_cpus or cores(), include_dashboard=False,  # a new one, even
                     log_to_driver=False, logging_level=logging.WARNING)      # if `ray start` runs here too
    except Exception as e:  # noqa: BLE001 - ConnectionError, auth and version mismatches alike
        where = f"join the Ray cluster at RAY_ADDRESS={address}" if address else "start a local Ray cluster"
        raise CorpusError(f"cannot {where}: {type(e).__name__}: {str(e).strip().splitlines()[0]}") from None
    return True


def run_ray(work: Iterable[Chunk], model_id: str, workers: int, threads: int, batch_size: int,
            js_rows: int, chunk_size: int, cache_dir=None) -> Iterator[tuple[Chunk, Sums, list[Problem]]]:
    """Ray Data: one block per chunk, map_batches over an actor pool of `workers` RayChunks actors."""
    import logging

    import pyarrow as pa
    import ray
    import ray.data                              # configures its loggers on import: quieten them after

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").addFilter(
        lambda record: not record.getMessage().startswith("Progress bars disabled"))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False             # ours shows texts/s and the ETA
    ctx.print_on_execution_start = False
    blocks, sizes, unit = [], {}, "line"
    for chunk in work:
        unit = chunk.unit
        sizes[chunk.index] = len(chunk.texts)
        blocks.append(pa.table({"chunk": pa.array([chunk.index] * len(chunk.texts), pa.int64()),
                                "number": pa.array(chunk.numbers, pa.int64()), "text": pa.array(chunk.texts)}))
    if not blocks:
        return
    ds = ray.data.from_arrow(blocks).map_batches(
        RayChunks, batch_size=chunk_size, batch_format="pyarrow", num_cpus=threads,
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(blocks))),     # no idle actors to start
        fn_constructor_kwargs={"model_id": model_id, "threads": threads, "batch_size": batch_size,
                               "js_rows": js_rows, "unit": unit, "cache_dir": cache_dir})
    partial: dict[int, tuple[int, Sums, list[Problem]]] = {}
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        for index, n, blob in zip(*(batch.column(c).to_pylist() for c in ("chunk", "texts", "result"))):
            sums, problems = pickle.loads(blob)
            if index in partial:                 # a chunk that Ray split across two batches
                m, s, p = partial[index]
                n, sums, problems = m + n, s.add(sums), p + problems
            if n < sizes[index]:
                partial[index] = (n, sums, problems)
                continue
            partial.pop(index, None)
            yield Chunk(index, unit, [], []), sums, problems


def _engine(engine: Engine, work: Iterable[Chunk], model_id: str, workers: int | None, batch_size: int,
            js_rows: int, chunk_size: int, rt, say) -> tuple[Iterator, int, int]:
    """The chosen engine's stream of finished chunks, its workers and each worker's onnxruntime threads."""
    n_cores = cores()
    if engine == "ray":
        if workers is None:
            import ray
            workers = max(1, int(ray.cluster_resources().get("CPU", n_cores)))
        return run_ray(work, model_id, workers, 1, batch_size, js_rows, chunk_size, rt.cache_dir), workers, 1
    workers = n_cores if workers is None else workers
    if workers == 0:
        return run_inprocess(work, ChunkWorker(model_id, batch_size=batch_size, js_rows=js_rows, runtime=rt)), 0, \
            rt.threads or n_cores
    if workers > n_cores:
        say(f"{workers} workers on {n_cores} cores: they will compete for the cores")
    threads = max(1, n_cores // workers)
    return run_local(work, model_id, workers, threads, batch_size, js_rows, rt.cache_dir), workers, threads


# ---- the job ---------------------------------------------------------------------------------
def default_out(path, model_id: str) -> Path:
    return Path(Path(path).stem + f".{model_id}.corpus.json")


def partial_path(out) -> Path:
    return Path(str(out) + ".partial.json")


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _ranges(done: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in sorted(done):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _lists(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    return x


def _write_parquet(path: Path, job: dict) -> None:
    """Long form: one row per (stat, layer, head[, key_layer, key_head]); scalars in the schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    H = job["heads"]
    rows = {"stat": [], "layer": [], "head": [], "key_layer": [], "key_head": [], "value": []}

    def put(name, arr, pairs=False):
        arr = np.asarray(arr)
        for idx in np.ndindex(arr.shape):
            a = idx[0] if pairs else idx[0] * H + idx[1]
            rows["stat"].append(name)
            rows["layer"].append(a // H)
            rows["head"].append(a % H)
            rows["key_layer"].append(idx[1] // H if pairs else None)
            rows["key_head"].append(idx[1] % H if pairs else None)
            rows["value"].append(float(arr[idx]))
    for name, v in job["stats"].items():
        put(name, v)
    for tok, v in job["special_token_mass"].items():
        put(f"special_token_mass:{tok}", v)
    for name in ("js_divergence", "js_distance"):
        if job[name] is not None:
            put(name, job[name], pairs=True)
    meta = {k: v for k, v in job.items() if k not in ("stats", "special_token_mass", "js_divergence", "js_distance")}
    table = pa.table(rows).replace_schema_metadata({"attnscope": json.dumps(meta)})
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def run_corpus(path, model_id: str, *, engine: Engine = "local", out=None, sample: int | None = None,
               seed: int = 0, column: str | None = None, fmt: str | None = None, workers: int | None = None,
               batch_size: int = BATCH_SIZE, chunk_size: int = CHUNK_SIZE, max_chars: int = MAX_CHARS,
               js_rows: int = JS_ROWS, restart: bool = False, progress: bool = True,
               on_chunk: Callable[[Chunk, Sums], None] | None = None,
               log: Callable[[str], None] | None = None, runtime=None, cache_dir=None) -> dict:
    """Run the corpus job and write its result to `out` (JSON, or Parquet when out ends in .parquet; default
    INPUT_STEM.MODEL.corpus.json in the current folder). Returns the result (lists, as written).

    workers: local engine, processes (default: one per core; 0 runs in this process); Ray, actors (default: the
    cluster's CPUs). Each worker's onnxruntime gets cores // workers threads (local) or 1 thread (Ray actors,
    one CPU each). on_chunk(chunk, sums) is called after each finished chunk. runtime: an open Runtime of
    this model to use in this process (workers=0), e.g. the server's."""
    from tqdm import tqdm

    path = Path(path)
    try:
        spec = zoo.get(model_id)
    except KeyError as e:
        raise CorpusError(e.args[0]) from None
    if engine not in ("local", "ray"):
        raise CorpusError(f"engine must be 'local' or 'ray'; got {engine!r}")
    if sample is not None and sample < 1:
        raise CorpusError(f"--sample must be at least 1; got {sample}")
    if batch_size < 1 or chunk_size < 1:
        raise CorpusError("--batch-size and the chunk size must be at least 1")
    if workers is not None and workers < (1 if engine == "ray" else 0):
        raise CorpusError(f"--workers must be at least {1 if engine == 'ray' else 0} for the {engine} engine "
                          f"(0: in this process, local engine only); got {workers}")
    fmt = fmt or detect_format(path)
    records = read_corpus(path, column, fmt, max_chars)     # checks the file and column; reads nothing yet
    out = Path(out) if out else default_out(path, model_id)
    part = partial_path(out)
    st = path.stat() if path.is_file() else None
    job_key = {"model": model_id, "input": str(path.resolve()), "size": st and st.st_size,
               "mtime_ns": st and st.st_mtime_ns, "format": fmt, "column": column, "sample": sample, "seed": seed,
               "chunk_size": chunk_size, "max_chars": max_chars, "js_rows": js_rows}
    say = log or (lambda msg: tqdm.write(f"attnscope corpus: {msg}", file=sys.stderr))
    problems: list[Problem] = []          # the reader's, found again on a resumed run
    refused: list[Problem] = []           # the model's, kept in the partial file

    shown = [0]

    def report(p: Problem) -> None:
        shown[0] += 1
        if shown[0] <= 20:
            say(str(p))
        elif shown[0] == 21:
            say(f"more records skipped; all are counted (and the first {KEPT_PROBLEMS} listed) in {out}")

    def on_problem(p: Problem) -> None:
        problems.append(p)
        report(p)

    total, done = None, set()
    if part.exists() and not restart:
        try:
            saved = json.loads(part.read_text())
        except ValueError:
            saved = None
        if not saved or saved.get("job") != job_key:
            raise CorpusError(f"{part} holds partial results of a different job (input, model or options differ); "
                              f"delete it or pass --restart")
        total = Sums.from_json(saved["sums"])
        done = {i for a, b in saved["done"] for i in range(a, b + 1)}
        refused = [Problem(**p) for p in saved["refused"]]
        say(f"resuming from {part}: {total.texts} texts in {len(done)} chunks already done")

    # the model, built here once so that its ONNX graph is exported once, not by every worker at the same time
    from .runtime import DEFAULT_CACHE, Runtime
    n_cores = cores()
    if runtime is not None and runtime.spec.id != model_id:
        raise CorpusError(f"the runtime given is {runtime.spec.id!r}, not {model_id!r}")
    rt = runtime or Runtime(spec, threads=n_cores if engine == "local" and workers == 0 else 1,
                            cache_dir=cache_dir or DEFAULT_CACHE)
    rt.onnx_path()
    total = total or Sums(rt.cfg.n_layers, rt.cfg.n_heads)

    unit = "row" if fmt in ("csv", "tsv", "parquet") else "line"
    bar = tqdm(total=min(sample, count_records(path, fmt)) if sample else count_records(path, fmt),
               initial=total.texts, unit="text", desc=model_id, disable=not progress, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.1)

    def work() -> Iterator[Chunk]:
        """The chunks still to do; once the input is read, the bar's total becomes the exact count of texts."""
        texts = 0
        for c in chunks(records, unit, chunk_size, sample, seed, on_problem):
            texts += len(c.texts)
            if c.index not in done:
                yield c
        bar.total = texts
        bar.refresh()

    def checkpoint() -> None:
        _write_json(part, {"job": job_key, "done": _ranges(done), "sums": total.to_json(),
                           "refused": [vars(p) for p in refused]})

    started, ray_started, last_write, texts_now = time.perf_counter(), False, 0.0, 0
    try:
        if engine == "ray":
            ray_started = ray_start(n_cores)
        stream, workers, threads = _engine(engine, work(), model_id, workers, batch_size, js_rows, chunk_size, rt,
                                           say)
        for chunk, sums, worker_problems in stream:
            total.add(sums)
            done.add(chunk.index)
            for p in worker_problems:
                refused.append(p)
                report(p)
            texts_now += sums.texts
            bar.update(sums.texts + len(worker_problems))
            if time.perf_counter() - last_write >= 1.0:
                checkpoint()
                last_write = time.perf_counter()
            if on_chunk is not None:
                on_chunk(chunk, sums)
    except BaseException as e:
        bar.close()
        if done:
            checkpoint()
            say(f"stopped after {total.texts} texts ({type(e).__name__}); their sums are kept in {part}: "
                f"run the same command again to resume")
        from concurrent.futures.process import BrokenProcessPool
        if isinstance(e, BrokenProcessPool):
            raise CorpusError(f"a worker process died ({e}); out of memory? Try fewer --workers or a smaller "
                              f"--batch-size, then run the same command to resume") from None
        if type(e).__module__.startswith("ray"):     # RayTaskError and friends: the cause's last line
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            cause = lines[-1] if lines else type(e).__name__
            hint = ("; every Ray node needs the driver's Python environment: attnscope and the model packages"
                    if "ModuleNotFoundError" in cause or "ModelUnavailable" in str(e) else "")
            raise CorpusError(f"the Ray job failed: {cause}{hint}") from None
        raise
    finally:
        if ray_started:
            import ray
            ray.shutdown()
    bar.close()
    seconds = time.perf_counter() - started
    problems += refused
    if total.texts == 0:
        raise CorpusError(f"no texts to process in {path}" + (f": all {len(problems)} records were skipped"
                                                              if problems else ""))

    res = total.result()
    reasons: dict[str, int] = {}
    for p in problems:
        key = "over the character limit" if "--max-chars" in p.reason else p.reason.split(" (")[0]
        reasons[key] = reasons.get(key, 0) + 1
    job = {"model": model_id, "title": spec.title, "kind": spec.kind, "layers": total.layers, "heads": total.heads,
           "texts": res["texts"], "tokens": res["tokens"], "truncated": res["truncated"], "js_rows": res["js_rows"],
           "stats": res["stats"], "special_token_mass": res["special_token_mass"],
           "js_divergence": res["js_divergence"], "js_distance": res["js_distance"],
           "head_index": "js_* and js_map index heads layer-major: (layer, head) is layer * heads + head",
           "js_map": None if res["js_distance"] is None else head_map(res["js_distance"]),
           "input": {"path": str(path), "format": fmt, "column": column, "sample": sample, "seed": seed,
                     "max_chars": max_chars, "skipped": len(problems), "skipped_by_reason": reasons,
                     "problems": [p.to_json() for p in problems[:KEPT_PROBLEMS]]},
           "run": {"engine": engine, "workers": workers, "threads_per_worker": threads, "batch_size": batch_size,
                   "chunk_size": chunk_size, "js_rows": js_rows, "seconds": round(seconds, 3),
                   "texts_per_s": round(texts_now / seconds, 1) if seconds else None}}
    job = _lists(job)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() in (".parquet", ".pq"):
        _write_parquet(out, job)
    else:
        _write_json(out, job)
    part.unlink(missing_ok=True)
    say(f"{res['texts']} texts, {res['tokens']} tokens, {len(problems)} skipped, {seconds:.1f} s -> {out}")
    return job
