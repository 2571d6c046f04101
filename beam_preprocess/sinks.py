"""Writing the dataset's files: every output of a run committed together, by one step.

Beam's file sinks (WriteToText, WriteToParquetBatched) each add four stages of their own
(initialise, group, pre-finalise, finalise). With seven outputs (train/eval rows from two packing
stages, rejected/, filtered/, eval_records/) that was 28 of the pipeline's 47 stages: on the
DirectRunner every stage costs a round trip to each worker, about a third of a small run's time,
and on Dataflow each is a step of its own. Here an output is a DoFn fused into the stage that
produces its elements (`WriteShards`): it writes one temporary file per bundle and output under
`<output>/.temp-<uuid>/` and emits the file's name. One commit step (`CommitShards`), once every
bundle has finished, renames the files of the bundles that succeeded to Beam's shard names,
`<prefix>-SSSSS-of-NNNNN<suffix>`, and deletes the temporary directory. Files of failed or retried
bundles are never committed (Beam discards a failed bundle's outputs), as with Beam's own sinks;
an output with no elements gets one empty shard, as with Beam's own sinks.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from trainer.packed_data.format import PARQUET_WRITE_OPTIONS

PARQUET = "parquet"
JSONL = "jsonl"


@dataclass(frozen=True)
class Shards:
    """One output: files `<prefix>-SSSSS-of-NNNNN.<format>`, e.g. `<out>/train/part`."""

    prefix: str
    format: str
    """PARQUET (elements are pyarrow Tables of `schema`) or JSONL (elements are dicts)."""

    @property
    def suffix(self) -> str:
        return f".{self.format}"


def temp_dir_for(output: str) -> str:
    """A fresh directory for one run's uncommitted files, inside the output."""
    return f"{output.rstrip('/')}/.temp-{uuid.uuid4().hex[:12]}"


class _BundleFile:
    """One open temporary file of one output in one bundle.

    Parquet tables are written in a background thread, one at a time, while the stage packs the
    next table: pyarrow releases the GIL while it encodes and writes, and the packing stage
    otherwise leaves a core idle. A failed write raises at the next write or at close.
    """

    def __init__(self, path: str, shards: Shards, schema: Any) -> None:
        self.path = path
        self.stream = FileSystems.create(path)
        self.parquet = None
        self.writing: Future | None = None
        if shards.format == PARQUET:
            import pyarrow.parquet as pq

            # Uncompressed, as Beam's Parquet sink writes by default: the trainer reads each row
            # group once and the pages are token ids that compress poorly.
            self.parquet = pq.ParquetWriter(
                self.stream, schema, compression="none", **PARQUET_WRITE_OPTIONS
            )
            self.writer = ThreadPoolExecutor(1, thread_name_prefix="write-parquet")

    def write(self, element: Any) -> None:
        if self.parquet is not None:
            self._wait()
            self.writing = self.writer.submit(self.parquet.write_table, element)
        else:
            self.stream.write(json.dumps(element, ensure_ascii=False, default=str).encode())
            self.stream.write(b"\n")

    def _wait(self) -> None:
        if self.writing is not None:
            writing, self.writing = self.writing, None
            writing.result()

    def close(self) -> None:
        try:
            if self.parquet is not None:
                self.writer.shutdown()  # waits for the table in flight
                try:
                    self._wait()
                finally:
                    self.parquet.close()
        finally:
            self.stream.close()  # a failed file is never committed (its bundle fails)


class _WriteBundleFiles(beam.DoFn):
    """Elements -> one temporary file per bundle; emits (shards prefix, temporary path)."""

    def __init__(self, shards: Shards, temp_dir: str, schema: Any) -> None:
        self.shards, self.temp_dir, self.schema = shards, temp_dir, schema

    def start_bundle(self) -> None:
        self.file: _BundleFile | None = None

    def process(self, element: Any) -> None:
        if self.file is None:
            name = f"{uuid.uuid4().hex}{self.shards.suffix}"
            self.file = _BundleFile(f"{self.temp_dir}/{name}", self.shards, self.schema)
        self.file.write(element)

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self.file is not None:
            self.file.close()
            yield WindowedValue(
                (self.shards.prefix, self.file.path), MIN_TIMESTAMP, (GlobalWindow(),)
            )
            self.file = None


class WriteShards(beam.PTransform):
    """Write a PCollection's elements to temporary files of `shards`, inside the producing stage.

    Yields (prefix, temporary path) for `CommitShards`; several WriteShards may feed one
    output (e.g. rejected records from three stages), their files are numbered together.
    """

    def __init__(self, shards: Shards, temp_dir: str, schema: Any = None) -> None:
        super().__init__()
        self.shards, self.temp_dir, self.schema = shards, temp_dir, schema

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return pcoll | "WriteBundleFiles" >> beam.ParDo(
            _WriteBundleFiles(self.shards, self.temp_dir, self.schema)
        )


class CommitShards(beam.PTransform):
    """All (prefix, temporary path) of a run -> the final shard names, in one step."""

    def __init__(self, outputs: Iterable[Shards], temp_dir: str, schema: Any) -> None:
        super().__init__()
        self.outputs, self.temp_dir, self.schema = tuple(outputs), temp_dir, schema

    def expand(self, written: beam.PCollection) -> beam.PCollection:
        outputs, temp_dir, schema = self.outputs, self.temp_dir, self.schema
        return (
            written
            | "AllWritten" >> beam.combiners.ToList()
            | "Commit" >> beam.FlatMap(lambda files: commit(files, outputs, temp_dir, schema))
        )


def commit(
    files: list[tuple[str, str]], outputs: tuple[Shards, ...], temp_dir: str, schema: Any
) -> Iterator[str]:
    """Rename every temporary file to its shard name and delete the temporary directory.

    Idempotent, so a retried commit completes the first attempt's work: a file already moved is
    skipped. Shards are numbered in the order of their temporary names (random, so no output
    depends on which worker finished first more than Beam's own sinks do).
    """
    by_prefix: dict[str, list[str]] = {shards.prefix: [] for shards in outputs}
    for prefix, path in files:
        by_prefix[prefix].append(path)
    for shards in outputs:
        paths = sorted(by_prefix[shards.prefix])
        if not paths:  # as Beam's sinks: an empty output still gets one (empty) shard
            empty = f"{temp_dir}/empty-{uuid.uuid4().hex}{shards.suffix}"
            _BundleFile(empty, shards, schema).close()
            paths = [empty]
        total = len(paths)
        if FileSystems.get_scheme(shards.prefix) is None:  # local: rename needs the directory
            os.makedirs(os.path.dirname(shards.prefix) or ".", exist_ok=True)
        for index, path in enumerate(paths):
            final = f"{shards.prefix}-{index:05d}-of-{total:05d}{shards.suffix}"
            if FileSystems.exists(path):
                FileSystems.rename([path], [final])
            elif not FileSystems.exists(final):
                raise FileNotFoundError(f"{path} vanished before it was committed as {final}")
            yield final
    # What is left are files of failed bundle attempts (object stores have no directory to drop).
    leftovers = [m.path for m in FileSystems.match([f"{temp_dir}/**"])[0].metadata_list]
    if leftovers:
        FileSystems.delete(leftovers)
    if FileSystems.exists(temp_dir):
        FileSystems.delete([temp_dir])
