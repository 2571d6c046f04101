"""Local runs shuffle the tokenized columns through files on disk, not through memory.

Beam's local runner (FnApiRunner) holds a whole GroupByKey in memory: decoded as it arrives, then
encoded again and decoded once more by the worker. So the packing step's input, the whole
tokenized dataset, was in memory up to three times at the hand-off, and a run's peak grew with
its input (0.83 GB at 50k records, 2.0 GB at 500k: docs/performance.md). On local runs Tokenize
appends each (bucket, columns) element to one file per bucket and bundle (`SpillWriter`) and emits
only (bucket, path); DeduplicateAndPack reads a bucket's files as it goes (`BucketColumns`), so one
element at a time is in memory and the peak no longer grows with the input.

On Dataflow the columns travel in the shuffle itself: the shuffle service keeps them out of
worker memory, and a remote worker's files would not be on the next stage's disk.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from apache_beam.coders import FastPrimitivesCoder

from beam_preprocess.columns import TokenizedColumns

SpilledColumns = str
"""Path of a file of TokenizedColumns (one bucket's elements of one bundle)."""

_CODER = FastPrimitivesCoder()  # what Beam's shuffle would encode the element with
_LENGTH = struct.Struct("<Q")


@contextmanager
def local_spill_dir(output: str) -> Iterator[str]:
    """A private directory for one local run's spilled columns, removed when the run ends.

    Inside the output when it is local (the disk the dataset goes to: /tmp may be a tmpfs, which
    is memory), else in the system's temporary directory ($TMPDIR).
    """
    local_output = None if "://" in output else output
    directory = os.path.abspath(tempfile.mkdtemp(prefix=".shuffle-", dir=local_output))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class SpillWriter:
    """One bundle's files: `write` appends an element to its bucket's file, `close` returns
    (bucket, path) per file written."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[int, tuple[str, BinaryIO]] = {}

    def write(self, bucket: int, columns: TokenizedColumns) -> None:
        if bucket not in self.files:
            path = os.path.join(self.directory, f"bucket-{bucket:05d}-{uuid.uuid4().hex}")
            self.files[bucket] = (path, open(path, "wb"))  # noqa: SIM115 (closed in close())
        data = _CODER.encode(columns)
        stream = self.files[bucket][1]
        stream.write(_LENGTH.pack(len(data)))
        stream.write(data)

    def close(self) -> list[tuple[int, SpilledColumns]]:
        """(bucket, path) per file, in the order of each bucket's first element (the order the
        in-memory shuffle would see the buckets in, so both pack the same rows)."""
        written = []
        for bucket, (path, stream) in self.files.items():
            stream.close()
            written.append((bucket, path))
        self.files = {}
        return written


def read_spilled(path: SpilledColumns) -> Iterator[TokenizedColumns]:
    """The elements of one spilled file, in the order they were written."""
    with open(path, "rb") as stream:
        while header := stream.read(_LENGTH.size):
            (size,) = _LENGTH.unpack(header)
            data = stream.read(size)
            if len(data) != size:
                raise OSError(f"{path} ends inside an element: {len(data)} of {size} bytes")
            yield _CODER.decode(data)


class BucketColumns:
    """A bucket's grouped values -> its TokenizedColumns, reading spilled files as it goes.

    Iterable more than once (the packing step makes two passes); values that are columns already
    (runs whose shuffle carries them) pass through.
    """

    def __init__(self, values: Iterable[TokenizedColumns | SpilledColumns]) -> None:
        self.values = values

    def __iter__(self) -> Iterator[TokenizedColumns]:
        for value in self.values:
            if isinstance(value, str):
                yield from read_spilled(value)
            else:
                yield value
