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
counts every record), and the records after them are read (the parsers: parsers.py).
"""

from __future__ import annotations

import io
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

from beam_preprocess.parsers import PARSERS, Parsed, parse_jsonl
from beam_preprocess.records import DEAD, OUTCOME, READ, READ_FILES, dead_letter, outcome

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
SPLIT_BYTES = 4 << 20
"""JSONL range size: small enough that a 30 MB file keeps two workers busy, large enough that the
per-range cost (one open and seek) is nothing."""


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
        yield pvalue.TaggedOutput(READ_FILES, (path, count))

    def _parse(self, path: str, start: int, end: int, first_line: int) -> Iterator[Parsed]:
        if start == 0 and end == WHOLE_FILE:
            with _open_whole(path) as stream:
                yield from PARSERS[format_of(path, self.input_format)](stream, path)
            return
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
            stream.seek(start)
            data = stream.read() if end == WHOLE_FILE else stream.read(end - start)
        yield from parse_jsonl(io.BytesIO(data), path, first_line)


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


class ReadRecords(beam.PTransform):
    """File patterns (local, globs, gs://) -> records; tagged outputs DEAD, READ, READ_FILES
    and OUTCOME."""

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
                DEAD, READ, OUTCOME, READ_FILES, main="records"
            )
        )
