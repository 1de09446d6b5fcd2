"""Reading a corpus: one text per line (.txt and anything else), JSON Lines with a text field (.jsonl, .ndjson),
CSV/TSV or Parquet with a text column (via pyarrow).

Bad records (empty, not UTF-8, invalid JSON, no such field, null, over `max_chars` characters) are skipped and
reported as Problems with their line (text, JSONL) or row (CSV, Parquet) number; a missing column or an unreadable
file is refused with a CorpusError. A line is never read into memory beyond the limit, so a 10 GB line costs nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import CorpusError

FORMATS = ("text", "jsonl", "csv", "tsv", "parquet")
MAX_CHARS = 20_000        # longer texts are skipped (--max-chars); as the API's limit for the zoo's short models
HEADER_BYTES = 1 << 20    # a CSV header read before pyarrow is (_csv_header)


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
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:   # a JSON escape of half a pair (\ud800): no UTF-8 text holds it
        return Problem(unit, n, f"not valid UTF-8 (an unpaired surrogate \\u{ord(text[e.start]):04x} at character "
                                f"{e.start})")
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
        except RecursionError:
            yield Problem("line", n, "not valid JSON (nested too deeply)")
            continue
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


def _csv_header(path: Path, delimiter: str) -> list[str] | None:
    """The header's column names, read by the standard library's csv from the first line (1 MB at most); None where
    that line is not the whole header (longer, or a quoted newline) or cannot be read: pyarrow's reader decides then."""
    import csv as text_csv
    try:
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
            line = fh.readline(HEADER_BYTES)
        names = next(text_csv.reader([line], delimiter=delimiter, strict=True), [])
    except (OSError, text_csv.Error):
        return None
    return names if len(line) < HEADER_BYTES or line.endswith(("\n", "\r")) else None


def _read_csv(path: Path, column: str, given: bool, max_chars: int,
              delimiter: str) -> Iterator[tuple[int, str] | Problem]:
    """CSV/TSV rows. A row with the wrong number of fields is refused (CorpusError naming its line): skipping it
    would shift the row numbers that every later problem is reported with. A missing column is refused before pyarrow
    is imported: its thread pools, torn down as the process exits, now and then abort it (apache/arrow#34314; the CLI's
    refusal exited -6 instead of 2 under load)."""
    names = _csv_header(path, delimiter)
    if names is not None and column not in names:
        raise _missing(column, path, names, given)
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
            raise _missing(column, path, names or [], given) from None
        raise CorpusError(f"cannot read {path} as CSV: {str(e).splitlines()[0]}") from None

    def rows():
        n, held, last = 1, [], None      # held: the last batch's rows, given once the file's end is checked
        try:
            for batch in reader:
                if malformed:
                    break
                yield from held
                held = list(_binary_rows(batch.column(0), n, max_chars))
                if batch.num_rows:
                    last = batch.column(0)[batch.num_rows - 1].as_py()
                n += batch.num_rows
        except Exception as e:  # noqa: BLE001 - a malformed block past the first
            raise CorpusError(f"cannot read {path} as CSV after row {n - 1}: {str(e).splitlines()[0]}") from None
        if malformed:
            raise CorpusError(f"{path} is not well-formed CSV at {malformed[0]}"
                              + (f" (and {len(malformed) - 1} more rows)" if len(malformed) > 1 else "")
                              + "; quote fields that hold the delimiter or a newline")
        line = _unclosed_quote(path, last, delimiter)
        if line is not None:
            raise CorpusError(f"{path} is not well-formed CSV: the quoted field that opens on line {line} (row "
                              f"{n - 1}) is never closed, so the rest of the file would be one text; close its "
                              f"quote (\"), and write a quote inside a quoted field as two (\"\")")
        yield from held
    return rows()


def _unclosed_quote(path: Path, last: bytes | None, delimiter: str) -> int | None:
    """The line on which the file's last field opens a quote it never closes (pyarrow then reads the rest of the
    file as that field: `last`, the last row's value, is all the file holds after a quote that opens a field);
    None when it closes."""
    if last is None:
        return None
    size = path.stat().st_size
    if len(last) + 1 > size:
        return None
    with open(path, "rb") as f:
        start = size - len(last) - 1
        f.seek(max(start - 1, 0))
        before = f.read(1) if start else b"\n"
        if f.read() != b'"' + last or before not in (b"\n", b"\r", delimiter.encode()):
            return None
        f.seek(0)
        lines, left = 1, size - len(last) - 1
        while left > 0:
            block = f.read(min(left, 1 << 24))
            lines, left = lines + block.count(b"\n"), left - len(block)
    return lines


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
