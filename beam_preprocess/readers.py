"""Reading raw records from JSONL, JSON arrays, CSV and Parquet through Beam's filesystems.

Every record leaves here as `{"source": "<path>:<line>", "record": {...}}`, or as a dead letter
when it cannot be parsed, so that each input record can be traced back to its file and line. Each
file also reports how many records it held (the "read" side of the accounting).

Files are read whole by one worker (no splitting inside a file): lines keep exact numbers, JSON
arrays and Parquet footers need the whole file anyway, and the dedup shuffle right after spreads the
records over all workers.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics import Metrics

from beam_preprocess.records import DEAD, OUTCOME, READ, dead_letter, outcome

FORMATS = ("auto", "jsonl", "json", "csv", "parquet")
_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
_COMPRESSIONS = (".gz", ".bz2", ".zst", ".deflate", ".lzma")
_MAX_RAW_CHARS = 10_000
"""Raw text kept in a dead letter: enough to see the problem, bounded for huge broken lines."""


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


class ReadFileRecords(beam.DoFn):
    """One matched file -> its records (main output), dead letters, and its record count."""

    def __init__(self, input_format: str) -> None:
        self.input_format = input_format
        self.read_counter = Metrics.counter("llmft", "records_read")
        self.unparseable = Metrics.counter("llmft", "rejected_at_parse")

    def process(self, readable: fileio.ReadableFile) -> Iterator[Any]:
        path = readable.metadata.path
        fmt = format_of(path, self.input_format)
        count = 0
        with readable.open(compression_type=CompressionTypes.AUTO) as stream:
            for source, record, error in _PARSERS[fmt](stream, path):
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


Parsed = tuple[str, Any, "tuple[str, str] | None"]


def _object_or_error(source: str, value: Any, raw: Any) -> Parsed:
    if isinstance(value, dict):
        return source, value, None
    return source, raw, ("not_an_object", f"expected a JSON object, got {type(value).__name__}")


def _parse_jsonl(stream: Any, path: str) -> Iterator[Parsed]:
    for number, line in enumerate(stream, start=1):
        source = f"{path}:{number}"
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
        except json.JSONDecodeError as exc:
            yield source, text.rstrip("\n")[:_MAX_RAW_CHARS], ("invalid_json", str(exc))
            continue
        yield _object_or_error(source, value, text.rstrip("\n")[:_MAX_RAW_CHARS])


def _parse_json(stream: Any, path: str) -> Iterator[Parsed]:
    """`.json` files are JSON arrays or JSON Lines (as Hugging Face's json loader accepts)."""
    data = stream.read()
    if data.lstrip()[:1] == b"[":
        yield from _parse_json_array(data, path)
    else:
        yield from _parse_jsonl(io.BytesIO(data), path)


def _parse_json_array(data: bytes, path: str) -> Iterator[Parsed]:
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raw = data[:_MAX_RAW_CHARS].decode("utf-8", "replace")
        yield path, raw, ("invalid_json", f"the file is not valid JSON: {exc}")
        return
    if not isinstance(value, list):
        yield (
            path,
            None,
            ("not_an_object", f"expected a JSON array of objects, got {type(value).__name__}"),
        )
        return
    for index, item in enumerate(value):
        yield _object_or_error(f"{path}[{index}]", item, item)


def _parse_csv(stream: Any, path: str) -> Iterator[Parsed]:
    text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
    reader = csv.DictReader(text)
    try:
        for row in reader:
            source = f"{path}:{reader.line_num}"
            if None in row or None in row.values():
                yield (
                    source,
                    row,
                    (
                        "invalid_csv",
                        f"expected {len(reader.fieldnames or [])} fields as in the header",
                    ),
                )
                continue
            yield source, row, None
    except (csv.Error, UnicodeDecodeError) as exc:
        yield f"{path}:{reader.line_num}", None, ("invalid_csv", f"{type(exc).__name__}: {exc}")


def _parse_parquet(stream: Any, path: str) -> Iterator[Parsed]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(io.BytesIO(stream.read()))
    except (pa.ArrowInvalid, OSError) as exc:
        yield path, None, ("invalid_parquet", f"{type(exc).__name__}: {exc}")
        return
    row = 0
    for batch in parquet.iter_batches(batch_size=8192):
        for record in batch.to_pylist():
            yield f"{path}#{row}", record, None
            row += 1


_PARSERS = {
    "jsonl": _parse_jsonl,
    "json": _parse_json,
    "csv": _parse_csv,
    "parquet": _parse_parquet,
}


class ReadRecords(beam.PTransform):
    """File patterns (local, globs, gs://) -> records; tagged outputs DEAD, READ and OUTCOME."""

    def __init__(self, patterns: list[str], input_format: str = "auto") -> None:
        super().__init__()
        self.patterns = patterns
        self.input_format = input_format

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Patterns" >> beam.Create(self.patterns)
            | "Match" >> fileio.MatchAll()
            | "Open" >> fileio.ReadMatches()
            | "Parse"
            >> beam.ParDo(ReadFileRecords(self.input_format)).with_outputs(
                DEAD, READ, OUTCOME, main="records"
            )
        )
