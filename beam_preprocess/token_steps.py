"""Examples -> token documents -> packed rows as pyarrow Tables: the steps after the split.

Tokenize (chat template + loss masks, beam_preprocess.tokenize) emits documents per batch and pack
key; Pack fills rows of exactly seq_len in two stages (windowed exact fill per key, then all
leftovers of a split together). Outcomes and dead letters as in beam_preprocess.record_steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from beam_preprocess.options import PreprocessConfig
from beam_preprocess.packing import (
    Document,
    PackedBatch,
    WindowPacker,
    pack_best,
    rows_from_bins,
)
from beam_preprocess.record_steps import record_of
from beam_preprocess.records import (
    DEAD,
    EVAL_RECORDS,
    FILTERED,
    OUTCOME,
    RETOKENIZED,
    STATS,
    dead_letter,
    outcome,
)

if TYPE_CHECKING:
    from beam_preprocess.tokenize import TokenizerSpec


def _counter(name: str) -> Any:
    return Metrics.counter("llmft", name)


# --------------------------------------------------------------------------------------- tokenize


class TokenizeFn(beam.DoFn):
    """Batches of examples -> (pack key, [documents]); the tokenizer is loaded once per worker."""

    def __init__(self, config: PreprocessConfig, spec: TokenizerSpec | None) -> None:
        self.config = config
        self.spec = spec

    def setup(self) -> None:
        from beam_preprocess.tokenize import (
            DocumentEncoder,
            EncoderConfig,
            TokenizerSpec,
            load_tokenizer,
        )

        cfg = self.config
        spec = self.spec
        if spec is None:  # no launcher prepared one: derive it here from the full tokenizer
            spec = TokenizerSpec.of(
                load_tokenizer(cfg.tokenizer), cfg.tokenizer, cfg.chat_fast_path
            )
        self.encoder = DocumentEncoder(
            spec,
            EncoderConfig(
                data_kind=cfg.data_kind,
                seq_len=cfg.seq_len,
                overlong=cfg.overlong,
                train_on_prompt=cfg.train_on_prompt,
                min_tokens=cfg.min_tokens,
            ),
        )
        self.kept = _counter("kept")
        self.truncated = _counter("truncated_or_split")
        self.tokens = _counter("document_tokens")
        self.retokenized = _counter("answer_boundary_retokenized")

    def process(self, batch: list[dict[str, Any]]) -> Iterator[Any]:
        groups = self.config.pack_groups
        # One element per pack key and batch, not per document: the pack shuffle then moves a few
        # hundred elements instead of one per record (Beam's cost is mostly per element).
        documents: dict[str, list[tuple[bytes, bytes]]] = {}
        kept = 0
        for example, result in zip(batch, self.encoder.encode(batch), strict=True):
            if result.outcome != "kept":
                tag = DEAD if result.outcome == "rejected" else FILTERED
                _counter(f"{result.outcome}_{result.reason}").inc()
                letter = dead_letter(
                    example["source"], record_of(example), result.reason, result.error
                )
                yield pvalue.TaggedOutput(tag, letter)
                yield pvalue.TaggedOutput(OUTCOME, outcome(result.outcome, result.reason))
                continue
            kept += 1
            if result.truncated:
                self.truncated.inc()
            if result.retokenized:
                self.retokenized.inc()
                yield pvalue.TaggedOutput(RETOKENIZED, example["source"])
            split = example["split"]
            key = f"{split}/{int(example['hash'][:8], 16) % groups}"
            for ids, mask in result.docs:
                self.tokens.inc(len(ids))
                documents.setdefault(key, []).append((ids.tobytes(), mask.tobytes()))
            if split == "eval":
                yield pvalue.TaggedOutput(EVAL_RECORDS, record_of(example))
        if kept:
            self.kept.inc(kept)
            yield pvalue.TaggedOutput(OUTCOME, outcome("kept", count=kept))
        yield from documents.items()


class Tokenize(beam.PTransform):
    """Examples -> (pack key, [documents]); tagged DEAD, FILTERED, OUTCOME, EVAL_RECORDS,
    RETOKENIZED.

    `spec` (from the launcher, which loads the full tokenizer anyway) spares each worker the
    transformers import; without it every worker derives it at setup.
    """

    def __init__(self, config: PreprocessConfig, spec: TokenizerSpec | None = None) -> None:
        super().__init__()
        self.config = config
        self.spec = spec

    def expand(self, examples: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        cfg, spec = self.config, self.spec
        size = cfg.tokenize_batch_size
        return (
            examples
            | "Batch" >> beam.BatchElements(min_batch_size=min(size, 64), max_batch_size=size)
            | "Encode"
            >> beam.ParDo(TokenizeFn(cfg, spec)).with_outputs(
                DEAD, FILTERED, OUTCOME, EVAL_RECORDS, RETOKENIZED, main="documents"
            )
        )


# ------------------------------------------------------------------------------------------- pack

ROWS_PER_TABLE = 1024
"""Rows per pyarrow table handed to the Parquet writer (also its row-group granularity)."""


def _document(value: tuple[bytes, bytes]) -> Document:
    ids, mask = value
    return np.frombuffer(ids, dtype=np.int32), np.frombuffer(mask, dtype=np.uint8)


def rows_to_table(rows: PackedBatch) -> Any:
    """PackedBatch -> pyarrow Table with the contract's COLUMNS as list<int32> (no Python loop)."""
    import pyarrow as pa

    from trainer.packed_data.format import COLUMNS, table_schema

    offsets = pa.array(np.arange(0, rows.rows + 1, dtype=np.int32) * rows.input_ids.shape[1])
    arrays = []
    for name in COLUMNS:
        values = pa.array(getattr(rows, name).reshape(-1).astype(np.int32, copy=False))
        arrays.append(pa.ListArray.from_arrays(offsets, values))
    return pa.Table.from_arrays(arrays, schema=table_schema())


class _RowEmitter:
    """Buffers closed bins and emits them as (split, Table) plus per-split stats."""

    def __init__(self, split: str, seq_len: int, pad_id: int) -> None:
        self.split, self.seq_len, self.pad_id = split, seq_len, pad_id
        self.bins: list[list[Document]] = []

    def add(self, bins: list[list[Document]]) -> Iterator[Any]:
        self.bins.extend(bins)
        if len(self.bins) >= ROWS_PER_TABLE:
            yield from self.flush()

    def flush(self) -> Iterator[Any]:
        if not self.bins:
            return
        rows = rows_from_bins(self.bins, self.seq_len, self.pad_id)
        self.bins = []
        _counter("rows").inc(rows.rows)
        yield self.split, rows_to_table(rows)
        stats = (rows.rows, rows.documents, rows.tokens, rows.target_tokens)
        yield pvalue.TaggedOutput(STATS, (self.split, stats))


class PackGroupFn(beam.DoFn):
    """Stage 1: windowed exact-fill packing per (split, group); the documents of rows left
    underfull at the end go to the leftover stage, where all groups' leftovers meet."""

    TAIL = "tail"

    def __init__(self, seq_len: int, pad_id: int, max_open_rows: int) -> None:
        self.seq_len, self.pad_id, self.max_open_rows = seq_len, pad_id, max_open_rows

    def process(self, element: tuple[str, Iterable[list[tuple[bytes, bytes]]]]) -> Iterator[Any]:
        key, batches = element
        split = key.split("/", 1)[0]
        out = _RowEmitter(split, self.seq_len, self.pad_id)
        packer = WindowPacker(self.seq_len, window_tokens=self.max_open_rows * self.seq_len)
        for batch in batches:
            for value in batch:
                yield from out.add(packer.add(_document(value)))
        full, underfull = packer.flush()
        yield from out.add(full)
        for row in underfull:
            for ids, mask in row:
                yield pvalue.TaggedOutput(self.TAIL, (split, (ids.tobytes(), mask.tobytes())))
        yield from out.flush()


class PackLeftoversFn(beam.DoFn):
    """Stage 2: all leftovers of a split packed together (small: bounded by groups x window)."""

    def __init__(self, seq_len: int, pad_id: int) -> None:
        self.seq_len, self.pad_id = seq_len, pad_id

    def process(self, element: tuple[str, Iterable[tuple[bytes, bytes]]]) -> Iterator[Any]:
        split, values = element
        out = _RowEmitter(split, self.seq_len, self.pad_id)
        yield from out.add(pack_best([_document(v) for v in values], self.seq_len))
        yield from out.flush()


TABLES = "tables"
"""Pack output: (split, pyarrow Table) of the per-group packing stage."""
TAIL_TABLES = "tail_tables"
"""Pack output: (split, pyarrow Table) of the leftovers stage (the underfull rows' documents)."""


class Pack(beam.PTransform):
    """(pack key, [documents]) -> (split, pyarrow Table) rows of exactly seq_len in two outputs, TABLES
    and TAIL_TABLES (kept apart so each is written inside its own fused stage); tagged STATS."""

    def __init__(self, seq_len: int, pad_id: int, max_open_rows: int) -> None:
        super().__init__()
        self.seq_len, self.pad_id, self.max_open_rows = seq_len, pad_id, max_open_rows

    def expand(self, documents: pvalue.PCollection) -> dict[str, pvalue.PCollection]:
        first = (
            documents
            | "GroupForPacking" >> beam.GroupByKey()
            | "BestFit"
            >> beam.ParDo(PackGroupFn(self.seq_len, self.pad_id, self.max_open_rows)).with_outputs(
                STATS, PackGroupFn.TAIL, main="tables"
            )
        )
        second = (
            first[PackGroupFn.TAIL]
            | "GroupLeftovers" >> beam.GroupByKey()
            | "BestFitDecreasing"
            >> beam.ParDo(PackLeftoversFn(self.seq_len, self.pad_id)).with_outputs(
                STATS, main="tables"
            )
        )
        return {
            TABLES: first.tables,
            TAIL_TABLES: second.tables,
            STATS: (first[STATS], second[STATS]) | "AllStats" >> beam.Flatten(),
        }
