"""One input file's bytes -> its records, per format: JSONL, a JSON array, CSV, Parquet. Each
record comes out as `Parsed`, (source `path:line`, record, error): a broken record becomes a
dead letter's reason and message, never an exception, and the records after it are read (the
rules are in readers.py's docstring). Pure Python over a binary stream: the Beam side (finding
files, ranges, decompression, the DoFns) is readers.py."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from typing import Any

from beam_preprocess.records import has_lone_surrogate

_BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark some editors and exports (Excel's "CSV UTF-8") put first."""
_MAX_RAW_CHARS = 10_000
"""Raw text kept in a dead letter: enough to see the problem, bounded for huge broken lines."""
CSV_FIELD_LIMIT = 16 << 20
"""Largest CSV field read (16 MiB; Python's csv default is 128 KiB, which a long document passes).
A larger field makes its row a dead letter (`invalid_csv`); `--max-chars` filters long records
later either way."""

Parsed = tuple[str, Any, "tuple[str, str] | None"]
"""(source `path:line`, the record or its raw text, None or (reason, message) of a dead letter)."""

_TOO_DEEP = "the value is nested too deeply to parse (deeper than Python's recursion limit)"


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: a pair decodes to one character, a lone one to a string
that is not text (no step after the reader could encode it as UTF-8)."""
_SURROGATE_ESCAPE_BYTES = re.compile(_SURROGATE_ESCAPE.pattern.encode())
_LONE_SURROGATE = (
    "the record holds an escaped lone UTF-16 surrogate (such as \\ud800), which is not text"
)


def _object_or_error(source: str, value: Any, raw: Any) -> Parsed:
    if isinstance(value, dict):
        return source, value, None
    return source, raw, ("not_an_object", f"expected a JSON object, got {type(value).__name__}")


def parse_jsonl(stream: Any, path: str, first_line: int = 1) -> Iterator[Parsed]:
    for number, line in enumerate(stream, start=first_line):
        source = f"{path}:{number}"
        if number == 1:
            line = line.removeprefix(_BOM)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield (
                source,
                line[:_MAX_RAW_CHARS].decode("utf-8", "replace"),
                ("invalid_utf8", str(exc)),
            )
            continue
        if not text.strip():
            continue  # blank lines separate nothing in JSONL; they are not records
        try:
            value = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, or an int of more than 4,300 digits
            yield source, text.rstrip("\n")[:_MAX_RAW_CHARS], ("invalid_json", str(exc))
            continue
        except RecursionError:
            yield source, text.rstrip("\n")[:_MAX_RAW_CHARS], ("invalid_json", _TOO_DEEP)
            continue
        raw = text.rstrip("\n")[:_MAX_RAW_CHARS]
        if "\\u" in text and _SURROGATE_ESCAPE.search(text) and has_lone_surrogate(value):
            yield source, raw, ("invalid_utf8", _LONE_SURROGATE)
            continue
        yield _object_or_error(source, value, raw)


def _parse_json(stream: Any, path: str) -> Iterator[Parsed]:
    """`.json` files are JSON arrays or JSON Lines (as Hugging Face's json loader accepts)."""
    data = stream.read().removeprefix(_BOM)
    if data.lstrip()[:1] == b"[":
        yield from _parse_json_array(data, path)
    else:
        yield from parse_jsonl(io.BytesIO(data), path)


def _parse_json_array(data: bytes, path: str) -> Iterator[Parsed]:
    try:
        try:
            value = json.loads(data)
        except RecursionError:  # one item nested too deeply: the others are still records
            value = _array_items(data.decode(json.detect_encoding(data)))
    except (ValueError, RecursionError) as exc:  # also UnicodeDecodeError, JSONDecodeError
        raw = data[:_MAX_RAW_CHARS].decode("utf-8", "replace")
        why = _TOO_DEEP if isinstance(exc, RecursionError) else exc
        yield path, raw, ("invalid_json", f"the file is not valid JSON: {why}")
        return
    if not isinstance(value, list):
        yield (
            path,
            None,
            ("not_an_object", f"expected a JSON array of objects, got {type(value).__name__}"),
        )
        return
    # json.loads also reads UTF-16 and UTF-32 (NUL bytes first): check those items one by one.
    surrogates = b"\x00" in data[:4] or _SURROGATE_ESCAPE_BYTES.search(data) is not None
    for index, item in enumerate(value):
        if isinstance(item, _TooDeep):
            yield f"{path}[{index}]", item.raw, ("invalid_json", _TOO_DEEP)
            continue
        if surrogates and has_lone_surrogate(item):
            raw = json.dumps(item)[:_MAX_RAW_CHARS]  # ASCII: the surrogate stays escaped
            yield f"{path}[{index}]", raw, ("invalid_utf8", _LONE_SURROGATE)
            continue
        yield _object_or_error(f"{path}[{index}]", item, item)


class _TooDeep:
    """An array item nested too deeply to parse, with its raw text (bounded)."""

    def __init__(self, raw: str) -> None:
        self.raw = raw


_SPACE = re.compile(r"[ \t\n\r]*")
_BRACKET_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _array_items(text: str) -> list[Any]:
    """The items of a JSON array one by one, a `_TooDeep` for each item nested deeper than the
    parser allows (its end found by counting brackets outside strings); ValueError when the text
    is not a JSON array."""
    decoder = json.JSONDecoder()
    items: list[Any] = []
    i = _SPACE.match(text).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "[":
        raise ValueError("expected a JSON array")
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    closed = text[i : i + 1] == "]"
    while not closed:
        try:
            item, end = decoder.raw_decode(text, i)
        except RecursionError:
            end = _value_end(text, i)
            item = _TooDeep(text[i:end][:_MAX_RAW_CHARS])
        items.append(item)
        i = _SPACE.match(text, end).end()  # type: ignore[union-attr]
        closed = text[i : i + 1] == "]"
        if not closed and text[i : i + 1] != ",":
            raise ValueError(f"expected ',' or ']' at character {i}")
        i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i:].strip():
        raise ValueError(f"extra data after the array at character {i}")
    return items


def _value_end(text: str, start: int) -> int:
    """The end of the array or object that starts at `start`."""
    depth = 0
    for match in _BRACKET_OR_STRING.finditer(text, start):
        token = match.group()
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
            if depth == 0:
                return match.end()
    raise ValueError("an array or object is not closed")


def _parse_csv(stream: Any, path: str) -> Iterator[Parsed]:
    """Rows of a CSV file with a header line; each broken row is its own dead letter.

    Bytes are decoded with `surrogateescape` so that a bad byte spoils only its row (found by its
    escaped bytes), and a csv error (a field over `CSV_FIELD_LIMIT`) costs only the line the
    reader was on: the reader resumes at the next line.
    """
    csv.field_size_limit(CSV_FIELD_LIMIT)
    # utf-8-sig: a byte order mark before the header is not part of the first column's name.
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline="")
    reader = csv.reader(text)
    header: list[str] | None = None
    while True:
        line = reader.line_num
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield f"{path}:{reader.line_num}", None, ("invalid_csv", f"{type(exc).__name__}: {exc}")
            if reader.line_num == line:
                return  # nothing consumed: the stream itself is broken
            continue
        source = f"{path}:{reader.line_num}"
        if header is None:
            if _undecodable(values):
                yield source, _readable(values), ("invalid_utf8", "the header is not valid UTF-8")
                return
            header = values
            continue
        if not values:
            continue  # a blank line is not a row
        if _undecodable(values):
            yield source, _readable(values), ("invalid_utf8", "the row is not valid UTF-8")
        elif len(values) != len(header):
            yield (
                source,
                _readable(values),
                (
                    "invalid_csv",
                    f"expected {len(header)} fields as in the header, got {len(values)}",
                ),
            )
        else:
            yield source, dict(zip(header, values, strict=True)), None


def _undecodable(values: list[str]) -> bool:
    """True when a field holds bytes that were not UTF-8 (escaped as lone surrogates)."""
    return any(not value.isascii() and _has_surrogates(value) for value in values)


def _has_surrogates(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _readable(values: list[str]) -> list[str]:
    """A broken row's fields as valid text (bad bytes replaced), bounded, for its dead letter."""
    return [
        value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")[:_MAX_RAW_CHARS]
        for value in values
    ]


def _parse_parquet(stream: Any, path: str) -> Iterator[Parsed]:
    """Rows of a Parquet file, one row group at a time; a row group that cannot be read (a corrupt
    page, a failed page checksum) makes one dead letter per row it held, naming the file, the row
    group and the error, and the next row group is read."""
    import pyarrow as pa  # only for Parquet input: Beam's JSONL path does not need it
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(io.BytesIO(stream.read()), page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        yield path, None, ("invalid_parquet", f"{path}: {type(exc).__name__}: {exc}")
        return
    row = 0
    for group in range(parquet.num_row_groups):
        end = row + parquet.metadata.row_group(group).num_rows
        try:
            for batch in parquet.iter_batches(batch_size=8192, row_groups=[group]):
                for record, error in _batch_records(batch):
                    yield f"{path}#{row}", record, error
                    row += 1
        except (pa.ArrowException, OSError) as exc:
            error = (
                "invalid_parquet",
                f"{path}: row group {group} (rows {row}-{end - 1}) cannot be read: "
                f"{type(exc).__name__}: {exc}",
            )
            for lost in range(row, end):
                yield f"{path}#{lost}", None, error
        row = end


def _batch_records(batch: Any) -> Iterator[tuple[Any, tuple[str, str] | None]]:
    """(record, None) per row of an Arrow batch, or (the row with its bad bytes replaced,
    ("invalid_utf8", ...)) for a row whose string column holds bytes that are not UTF-8 (Arrow
    does not check what other writers put in a string column; Python's conversion refuses it)."""
    try:
        records = batch.to_pylist()
    except UnicodeDecodeError:
        pass
    else:
        for record in records:
            yield record, None
        return
    for i in range(batch.num_rows):  # row by row, only for the batch that holds the bad bytes
        row = batch.slice(i, 1)
        try:
            yield row.to_pylist()[0], None
        except UnicodeDecodeError as exc:
            record = {name: _readable_cell(row.column(name)) for name in row.schema.names}
            yield record, ("invalid_utf8", f"a string column is not valid UTF-8: {exc}")


def _readable_cell(column: Any) -> Any:
    """A one-row Arrow column as Python, its bytes decoded with U+FFFD for what is not UTF-8."""
    import pyarrow as pa

    try:
        return column.to_pylist()[0]
    except UnicodeDecodeError:
        pass
    binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
    try:
        data = column.view(binary).to_pylist()[0]
    except (pa.ArrowException, TypeError):
        return None  # bad bytes nested in a list or struct: the error says what is wrong
    return data.decode("utf-8", "replace")[:_MAX_RAW_CHARS]


PARSERS = {
    "jsonl": parse_jsonl,
    "json": _parse_json,
    "csv": _parse_csv,
    "parquet": _parse_parquet,
}
