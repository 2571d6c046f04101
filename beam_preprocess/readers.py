"""Reading raw records from JSONL, JSON arrays, CSV and Parquet through Beam's filesystems.

Every record leaves here as `{"source": "<path>:<line>", "record": {...}}`, or as a dead letter
when it cannot be parsed, so that each input record can be traced back to its file and line. Each
file also reports how many records it held (the "read" side of the accounting).

Uncompressed JSONL files larger than `SPLIT_BYTES` are read in ranges cut at line starts, so that
every worker parses (one sequential pass of `bytes.count` finds the cuts and each range's first line
number, so lines keep exact numbers). Other files are read whole by one worker: JSON arrays and
Parquet footers need the whole file, CSV quotes may span lines, and compressed streams cannot seek.

Compressed files (`.gz`, `.bz2`, `.zst`, `.deflate`, `.lzma`, `.xz`, by suffix) are decompressed as
they are read; so is a gzip, bzip2, zstd or xz file whose name lacks the suffix (a `train.jsonl`
that is really gzip), found by its first bytes, with a warning. A UTF-8 byte order mark at the start
of a file is skipped. A broken record never stops a file: an undecodable line, a JSON value nested
deeper than Python's parser allows (also one item of a JSON array), a JSON integer of more than
4,300 digits (Python refuses to convert it), an escaped lone UTF-16 surrogate (not text), a CSV row
with a bad byte or a field over `CSV_FIELD_LIMIT`, a Parquet string that is not UTF-8, or an
unreadable Parquet row group each become dead letters (one per record they held, so `records_read`
counts every record), and the records after them are read.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressedFile, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_preprocess.records import DEAD, OUTCOME, READ, dead_letter, has_lone_surrogate, outcome

log = logging.getLogger(__name__)

FORMATS = ("auto", "jsonl", "json", "csv", "parquet")
_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
_COMPRESSIONS = (".gz", ".bz2", ".zst", ".deflate", ".lzma", ".xz")
_MAGIC = (
    (re.compile(rb"\x1f\x8b"), CompressionTypes.GZIP),
    (re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"), CompressionTypes.BZIP2),
    (re.compile(rb"\x28\xb5\x2f\xfd"), CompressionTypes.ZSTD),
    (re.compile(rb"\xfd7zXZ\x00"), CompressionTypes.LZMA),
)
"""How a compressed stream starts, per format (none of these starts valid UTF-8 text or Parquet:
bzip2's "BZh" is followed by a block size digit and a block or end-of-stream magic)."""
_MAGIC_BYTES = 10
_BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark some editors and exports (Excel's "CSV UTF-8") put first."""
SPLIT_BYTES = 4 << 20
"""JSONL range size: small enough that a 30 MB file keeps two workers busy, large enough that the
per-range cost (one open and seek) is nothing."""
_MAX_RAW_CHARS = 10_000
"""Raw text kept in a dead letter: enough to see the problem, bounded for huge broken lines."""
CSV_FIELD_LIMIT = 16 << 20
"""Largest CSV field read (16 MiB; Python's csv default is 128 KiB, which a long document passes).
A larger field makes its row a dead letter (`invalid_csv`); `--max-chars` filters long records
later either way."""


def format_of(path: str, requested: str = "auto") -> str:
    """The input format of `path`: `requested` unless "auto", else from the file suffix."""
    if requested != "auto":
        return requested
    name = path.lower()
    for compression in _COMPRESSIONS:
        name = name.removesuffix(compression)
    for suffix, fmt in _SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise ValueError(
        f"cannot tell the format of {path!r} from its name: use one of "
        f"{', '.join(_SUFFIXES)} (optionally compressed) or pass --input-format"
    )


def format_suffix(path: str) -> str | None:
    """The suffix that tells `path`'s format, with its compression suffix (`.jsonl`, `.csv.gz`);
    None when its name tells none."""
    name = path.lower()
    compression = next((c for c in _COMPRESSIONS if name.endswith(c)), "")
    base = name.removesuffix(compression)
    return next((s + compression for s in _SUFFIXES if base.endswith(s)), None)


FileRange = tuple[str, int, int, int]
"""(path, start byte, end byte or -1 for the end of the file, number of the first line)."""
WHOLE_FILE = -1


def _splittable(path: str, input_format: str) -> bool:
    name = path.lower()
    return format_of(path, input_format) == "jsonl" and not name.endswith(_COMPRESSIONS)


def line_ranges(stream: Any, path: str, split_bytes: int) -> Iterator[FileRange]:
    """Cut an uncompressed line-oriented file into ranges of about `split_bytes`, each starting at
    a line start, with the number of its first line."""
    start, first_line = 0, 1
    offset = lines = 0  # bytes and newlines before the current block
    target = split_bytes
    while block := stream.read(max(split_bytes, 1 << 22)):
        pos = 0
        while target < offset + len(block):
            cut = block.find(b"\n", max(target - offset, pos))
            if cut < 0:
                break  # the line goes on in the next block
            cut += 1
            lines += block.count(b"\n", pos, cut)
            pos = cut
            yield path, start, offset + cut, first_line
            start, first_line = offset + cut, lines + 1
            target = start + split_bytes
        lines += block.count(b"\n", pos)
        offset += len(block)
    if start < offset or start == 0:
        yield path, start, WHOLE_FILE, first_line


def _compression_of(head: bytes) -> str | None:
    """The Beam compression type of a stream that starts with `head`, or None when it does not
    start like a compressed stream."""
    for magic, compression in _MAGIC:
        if magic.match(head):
            return compression
    return None


def _sniffed(path: str) -> str | None:
    """The compression of a file whose name does not say it is compressed, from its first bytes."""
    if path.lower().endswith(_COMPRESSIONS):
        return None
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        return _compression_of(stream.read(_MAGIC_BYTES))


def _warn_misnamed(path: str, compression: str) -> None:
    log.warning(
        "%s is %s-compressed though its name does not say so: reading it decompressed "
        "(name it with the compression suffix, e.g. .gz, to say so)",
        path,
        compression,
    )


@contextmanager
def _open_whole(path: str) -> Iterator[Any]:
    """A whole input file as a buffered binary stream, decompressed by its suffix or, when the
    name has none, by its first bytes. A pipe (`--input <(zcat f.gz)`) is read by its name only:
    its first bytes cannot be read twice."""
    with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as stream:
        if not isinstance(stream, CompressedFile) and stream.seekable():
            compression = _compression_of(stream.read(_MAGIC_BYTES))
            stream.seek(0)
            if compression is None:
                yield stream
                return
            _warn_misnamed(path, compression)
            with FileSystems.open(path, compression_type=compression) as compressed:
                yield _buffered(compressed)
            return
        yield _buffered(stream)


def _buffered(stream: Any) -> io.BufferedReader:
    # Beam's decompressing wrapper is neither iterable nor an io object: make it a buffered binary
    # stream, as every parser expects.
    return io.BufferedReader(_RawReader(stream), buffer_size=1 << 20)


class PlanRanges(beam.DoFn):
    """Matched file -> the ranges to read (one range for files that are not split)."""

    def __init__(self, input_format: str, split_bytes: int) -> None:
        self.input_format, self.split_bytes = input_format, split_bytes

    def process(self, metadata: Any) -> Iterator[FileRange]:
        path = metadata.path
        if metadata.size_in_bytes <= self.split_bytes or not _splittable(path, self.input_format):
            yield path, 0, WHOLE_FILE, 1
            return
        if _sniffed(path):  # compressed under a plain name: a stream that cannot be cut
            yield path, 0, WHOLE_FILE, 1
            return
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
            yield from line_ranges(stream, path, self.split_bytes)


class ReadFileRecords(beam.DoFn):
    """One file range -> its records (main output), dead letters, and its record count."""

    def __init__(self, input_format: str) -> None:
        self.input_format = input_format
        self.read_counter = Metrics.counter("llmft", "records_read")
        self.unparseable = Metrics.counter("llmft", "rejected_at_parse")

    def process(self, file_range: FileRange) -> Iterator[Any]:
        path, start, end, first_line = file_range
        count = 0
        for source, record, error in self._parse(path, start, end, first_line):
            count += 1
            if error is None:
                yield {"source": source, "record": record}
            else:
                reason, message = error
                self.unparseable.inc()
                yield pvalue.TaggedOutput(DEAD, dead_letter(source, record, reason, message))
                yield pvalue.TaggedOutput(OUTCOME, outcome("rejected", reason))
        self.read_counter.inc(count)
        yield pvalue.TaggedOutput(READ, count)

    def _parse(self, path: str, start: int, end: int, first_line: int) -> Iterator[Parsed]:
        if start == 0 and end == WHOLE_FILE:
            with _open_whole(path) as stream:
                yield from _PARSERS[format_of(path, self.input_format)](stream, path)
            return
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
            stream.seek(start)
            data = stream.read() if end == WHOLE_FILE else stream.read(end - start)
        yield from _parse_jsonl(io.BytesIO(data), path, first_line)


Parsed = tuple[str, Any, "tuple[str, str] | None"]


class _RawReader(io.RawIOBase):
    """A Beam `CompressedFile` (read side) as a raw io stream."""

    def __init__(self, stream: CompressedFile) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


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


def _parse_jsonl(stream: Any, path: str, first_line: int = 1) -> Iterator[Parsed]:
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
        yield from _parse_jsonl(io.BytesIO(data), path)


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
    import pyarrow as pa
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


_PARSERS = {
    "jsonl": _parse_jsonl,
    "json": _parse_json,
    "csv": _parse_csv,
    "parquet": _parse_parquet,
}


class ReadRecords(beam.PTransform):
    """File patterns (local, globs, gs://) -> records; tagged outputs DEAD, READ and OUTCOME."""

    def __init__(
        self, patterns: list[str], input_format: str = "auto", split_bytes: int = SPLIT_BYTES
    ) -> None:
        super().__init__()
        self.patterns = patterns
        self.input_format = input_format
        self.split_bytes = split_bytes

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Patterns" >> beam.Create(self.patterns)
            | "Match" >> fileio.MatchAll()
            | "PlanRanges" >> beam.ParDo(PlanRanges(self.input_format, self.split_bytes))
            # Spreads the ranges over the workers (only these small tuples are shuffled).
            | "SpreadRanges" >> beam.Reshuffle()
            | "Parse"
            >> beam.ParDo(ReadFileRecords(self.input_format)).with_outputs(
                DEAD, READ, OUTCOME, main="records"
            )
        )
