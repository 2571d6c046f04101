"""Examples -> token documents -> unique documents packed into rows: the steps after Prepare.

Tokenize (chat template + loss masks, beam_preprocess.tokenize) runs in the same fused stage as
reading and Prepare, with the Rust tokenizer working on one batch in a background thread while
Python prepares the next: reading, validation and tokenization then share the cores. It emits
the tokenized examples of a batch per hash bucket and split as columns (beam_preprocess.columns:
no Python object per example in the shuffle, about 2.1 bytes per token). On local runs those
columns go to files and the shuffle carries their paths (beam_preprocess.spill).

DeduplicateAndPack groups them by bucket (the only shuffle of the records): in each bucket it
keeps one copy per content hash (the lowest source), then fills rows of exactly seq_len (windowed
exact fill per bucket and split, then all leftovers of a split together). Deduplicating after
tokenization costs the tokenizer's time on duplicates (usually a few percent of records) and
saves a shuffle of every record; a duplicate of a record that tokenization filters or rejects is
counted as filtered or rejected too, so the accounting still adds up per record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_preprocess.columns import (
    ColumnsBuilder,
    TokenizedColumns,
    hashes_and_sources,
    tokenized_examples,
)
from beam_preprocess.mix import NOT_SAMPLED, MixPlan, MixSources, draw
from beam_preprocess.mix_steps import MIX, MIX_TOKENS, TokenHistogram
from beam_preprocess.options import PreprocessConfig
from beam_preprocess.packing import (
    Document,
    PackedBatch,
    WindowPacker,
    pack_best,
    rows_from_bins,
)
from beam_preprocess.record_steps import record_of, source_order
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
from beam_preprocess.spill import BucketColumns, SpilledColumns, SpillWriter
from trainer.packed_data.format import COLUMNS, table_schema

if TYPE_CHECKING:
    from beam_preprocess.tokenize import PendingBatch, TokenizerSpec


def _counter(name: str) -> Any:
    return Metrics.counter("llmft", name)


# --------------------------------------------------------------------------------------- tokenize


def bucket_of(content_hash: str, buckets: int) -> int:
    """The dedup and packing bucket of an example (all copies of a content share one)."""
    return int(content_hash[:8], 16) % buckets


class TokenizeFn(beam.DoFn):
    """Examples -> (bucket, TokenizedColumns) per batch, bucket and split, or with a spill
    directory (bucket, SpilledColumns) per bundle and bucket; the tokenizer is loaded once per
    worker."""

    def __init__(
        self,
        config: PreprocessConfig,
        spec: TokenizerSpec | None,
        spill_dir: str | None,
        mix: MixSources | None = None,
    ) -> None:
        self.config = config
        self.spec = spec
        self.spill_dir = spill_dir
        self.mix = mix

    def setup(self) -> None:
        # Beam's DoFn convention: a worker imports (and loads) the tokenizer at setup
        from beam_preprocess.tokenize import (
            TOKENIZER_CALLS,
            DocumentEncoder,
            EncoderConfig,
            TokenizerSpec,
            load_tokenizer,
        )

        cfg = self.config
        spec = self.spec
        if spec is None:  # no launcher prepared one: derive it here from the full tokenizer
            spec = TokenizerSpec.of(
                load_tokenizer(cfg.tokenizer, cfg.chat_template),
                cfg.tokenizer,
                cfg.chat_fast_path,
                cfg.chat_template,
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
        # Batches left tokenizing while Python finishes an older one: as many as run at once.
        self.in_flight = TOKENIZER_CALLS
        self.truncated = _counter("truncated_or_split")
        self.tokens = _counter("document_tokens")

    def start_bundle(self) -> None:
        self.batch: list[dict[str, Any]] = []
        self.pending: deque[tuple[list[dict[str, Any]], PendingBatch]] = deque()
        self.spill = SpillWriter(self.spill_dir) if self.spill_dir else None
        self.histogram = TokenHistogram(self.mix) if self.mix is not None else None

    def process(self, example: dict[str, Any]) -> Iterable[Any]:
        # Not a generator: most calls only buffer, and a generator per record costs measurably.
        self.batch.append(example)
        if len(self.batch) >= self.config.tokenize_batch_size:
            return self._rotate(keep=self.in_flight)
        return ()

    def finish_bundle(self) -> Iterator[Any]:
        for output in self._rotate(keep=0):
            if isinstance(output, pvalue.TaggedOutput):
                yield pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
            else:
                yield GlobalWindows.windowed_value(output)
        if self.spill is not None:
            for spilled in self.spill.close():
                yield GlobalWindows.windowed_value(spilled)
        if self.histogram is not None:  # the mix's token counts (beam_preprocess.mix_steps)
            for value in self.histogram.take():
                yield pvalue.TaggedOutput(MIX_TOKENS, GlobalWindows.windowed_value(value))

    def _rotate(self, keep: int) -> Iterator[Any]:
        """Start tokenizing the buffered batch, then finish the oldest batches until `keep` are
        left in flight (the tokenizer works on those while Python finishes one and reads on)."""
        batch, self.batch = self.batch, []
        if batch:
            self.pending.append((batch, self.encoder.start(batch)))
        while len(self.pending) > keep:
            yield from self._emit(*self.pending.popleft())

    def _emit(self, batch: list[dict[str, Any]], pending: PendingBatch) -> Iterator[Any]:
        buckets = self.config.pack_groups
        columns: dict[tuple[int, str], ColumnsBuilder] = {}
        for example, result in zip(batch, self.encoder.finish(pending), strict=True):
            if result.outcome != "kept":
                tag = DEAD if result.outcome == "rejected" else FILTERED
                _counter(f"{result.outcome}_{result.reason}").inc()
                letter = dead_letter(
                    example["source"], record_of(example), result.reason, result.error
                )
                yield pvalue.TaggedOutput(tag, letter)
                yield pvalue.TaggedOutput(OUTCOME, outcome(result.outcome, result.reason))
                continue
            if result.truncated:
                self.truncated.inc()
            split = example["split"]
            if self.histogram is not None and split == "train":
                tokens = sum(len(ids) for ids, _ in result.docs)
                self.histogram.add(example["source"], example["hash"], tokens)
            key = (bucket_of(example["hash"], buckets), split)
            if key not in columns:
                columns[key] = ColumnsBuilder(split)
            record = record_of(example) if split == "eval" else None
            columns[key].add(example["hash"], example["source"], result, record)
        for (bucket, _), builder in columns.items():
            self.tokens.inc(builder.tokens)
            if self.spill is not None:
                self.spill.write(bucket, builder.columns())
            else:
                yield bucket, builder.columns()


class Tokenize(beam.PTransform):
    """Examples -> (bucket, TokenizedColumns), or (bucket, SpilledColumns) with `spill_dir`;
    tagged DEAD, FILTERED, OUTCOME.

    `spec` (from the launcher, which loads the full tokenizer anyway) spares each worker the
    transformers import; without it every worker derives it at setup. `spill_dir`, a local
    directory every worker can read, makes the shuffle carry file paths (local runs:
    beam_preprocess.spill).
    """

    def __init__(
        self,
        config: PreprocessConfig,
        spec: TokenizerSpec | None = None,
        spill_dir: str | None = None,
        mix: MixSources | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.spec = spec
        self.spill_dir = spill_dir
        self.mix = mix

    def expand(self, examples: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        encode = TokenizeFn(self.config, self.spec, self.spill_dir, self.mix)
        tags = (DEAD, FILTERED, OUTCOME) + ((MIX_TOKENS,) if self.mix is not None else ())
        return examples | "Encode" >> beam.ParDo(encode).with_outputs(*tags, main="documents")


# ------------------------------------------------------------------------------------------- pack

ROWS_PER_TABLE = 1024
"""Rows per pyarrow table handed to the Parquet writer (also its row-group granularity)."""


def _document(value: tuple[bytes, bytes]) -> Document:
    ids, mask = value
    return np.frombuffer(ids, dtype=np.int32), np.frombuffer(mask, dtype=np.uint8)


def rows_to_table(rows: PackedBatch) -> Any:
    """PackedBatch -> pyarrow Table with the contract's COLUMNS as list<int32> (no Python loop)."""
    import pyarrow as pa

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


class DeduplicateAndPackFn(beam.DoFn):
    """Stage 1: one bucket's tokenized examples -> one copy per content hash -> windowed
    exact-fill packing per split; the documents of rows left underfull at the end go to the
    leftover stage, where all buckets' leftovers of a split meet."""

    TAIL = "tail"

    def __init__(
        self, seq_len: int, pad_id: int, max_open_rows: int, mix: MixSources | None = None
    ) -> None:
        self.seq_len, self.pad_id, self.max_open_rows = seq_len, pad_id, max_open_rows
        self.mix = mix

    def process(
        self,
        element: tuple[int, Iterable[TokenizedColumns | SpilledColumns]],
        plan: MixPlan | None = None,
    ) -> Iterator[Any]:
        batches = BucketColumns(element[1])
        sampler = MixSampler(self.mix, plan) if self.mix is not None and plan else None
        # Two passes over the bucket (grouped values and spilled files can be read again): the
        # first finds the lowest source of each content, the second packs exactly that copy.
        first: dict[str, tuple[tuple[str, int], str]] = {}  # hash -> (order, source) kept
        for columns in batches:
            for content, source in hashes_and_sources(columns):
                order = source_order(source)
                if content not in first or order < first[content][0]:
                    first[content] = (order, source)
        packers: dict[str, tuple[WindowPacker, _RowEmitter]] = {}
        kept = duplicates = 0
        for columns in batches:
            split = columns[0]
            for content, source, docs, retokenized, record in tokenized_examples(columns):
                kept_copy = first.get(content)
                if kept_copy is None or kept_copy[1] != source:
                    duplicates += 1
                    if sampler is not None:
                        sampler.duplicate(source)
                    continue
                del first[content]  # the same source listed twice keeps one copy too
                passes = 1 if sampler is None else sampler.passes(content, source, split, docs)
                if not passes:
                    continue
                kept += 1
                if split not in packers:
                    window = self.max_open_rows * self.seq_len
                    packers[split] = (
                        WindowPacker(self.seq_len, window_tokens=window),
                        _RowEmitter(split, self.seq_len, self.pad_id),
                    )
                packer, out = packers[split]
                for _ in range(passes):  # a mix's source short of its share is repeated
                    for doc in docs:
                        yield from out.add(packer.add(doc))
                if record is not None:
                    yield pvalue.TaggedOutput(EVAL_RECORDS, record)
                if retokenized:
                    yield pvalue.TaggedOutput(RETOKENIZED, source)
        for split, (packer, out) in packers.items():
            full, underfull = packer.flush()
            yield from out.add(full)
            for row in underfull:
                for ids, mask in row:
                    yield pvalue.TaggedOutput(self.TAIL, (split, (ids.tobytes(), mask.tobytes())))
            yield from out.flush()
        if kept:
            _counter("kept").inc(kept)
            yield pvalue.TaggedOutput(OUTCOME, outcome("kept", count=kept))
        if duplicates:
            _counter("duplicates").inc(duplicates)
            yield pvalue.TaggedOutput(OUTCOME, outcome("duplicate", count=duplicates))
        if sampler is not None:
            yield from sampler.events()


class MixSampler:
    """The mix plan applied to one bucket's kept documents (beam_preprocess.mix): how many
    times each is packed, and the bucket's per-source counts as MIX events; a document the
    plan does not draw is filtered (reason not_sampled, counted, not written out)."""

    def __init__(self, sources: MixSources, plan: MixPlan) -> None:
        self.sources, self.plan = sources, plan
        self.counts: dict[int, dict[str, int]] = {}
        self.duplicate_sources: list[str] = []

    def passes(
        self, content: str, source: str, split: str, docs: Sequence[tuple[Sized, object]]
    ) -> int:
        """How many times the document (or a preference pair: its two sides) is packed."""
        index = self.sources.index_of(source)
        part = self.plan.sources[index]
        u = draw(content, self.sources.seed)
        passes = part.train_passes(u) if split == "train" else int(part.eval_kept(u))
        counts = self.counts.setdefault(index, {})
        if not passes:
            counts[NOT_SAMPLED] = counts.get(NOT_SAMPLED, 0) + 1
            return 0
        counts["kept"] = counts.get("kept", 0) + 1
        tokens = sum(len(ids) for ids, _ in docs) * passes
        key = f"{split}_tokens"
        counts[key] = counts.get(key, 0) + tokens
        return passes

    def duplicate(self, source: str) -> None:
        index = self.sources.index_of(source)
        counts = self.counts.setdefault(index, {})
        counts["duplicates"] = counts.get("duplicates", 0) + 1

    def events(self) -> Iterator[Any]:
        unsampled = sum(c.get(NOT_SAMPLED, 0) for c in self.counts.values())
        if unsampled:
            _counter(f"filtered_{NOT_SAMPLED}").inc(unsampled)
            yield pvalue.TaggedOutput(OUTCOME, outcome("filtered", NOT_SAMPLED, unsampled))
        for index, counts in sorted(self.counts.items()):
            yield pvalue.TaggedOutput(MIX, (index, counts))


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
"""DeduplicateAndPack output: (split, pyarrow Table) of the per-bucket packing stage."""
TAIL_TABLES = "tail_tables"
"""DeduplicateAndPack output: (split, pyarrow Table) of the leftovers stage (the underfull rows'
documents)."""


class DeduplicateAndPack(beam.PTransform):
    """(bucket, [TokenizedColumns or SpilledColumns]) -> (split, pyarrow Table) rows of exactly
    seq_len in two outputs, TABLES and TAIL_TABLES (kept apart so each is written inside its own
    fused stage); tagged STATS, OUTCOME ("kept", "duplicate"), EVAL_RECORDS and RETOKENIZED (of
    kept copies)."""

    def __init__(
        self,
        seq_len: int,
        pad_id: int,
        max_open_rows: int,
        mix: MixSources | None = None,
        plan: pvalue.PCollection | None = None,
    ) -> None:
        super().__init__()
        self.seq_len, self.pad_id, self.max_open_rows = seq_len, pad_id, max_open_rows
        self.mix, self.plan = mix, plan

    def expand(self, documents: pvalue.PCollection) -> dict[str, pvalue.PCollection]:
        tail = DeduplicateAndPackFn.TAIL
        fn = DeduplicateAndPackFn(self.seq_len, self.pad_id, self.max_open_rows, self.mix)
        side = {"plan": pvalue.AsSingleton(self.plan)} if self.plan is not None else {}
        tags = [STATS, tail, OUTCOME, EVAL_RECORDS, RETOKENIZED]
        if self.plan is not None:
            tags.append(MIX)
        first = (
            documents
            | "GroupByBucket" >> beam.GroupByKey()
            | "DropDuplicatesAndFill" >> beam.ParDo(fn, **side).with_outputs(*tags, main="tables")
        )
        second = (
            first[tail]
            | "GroupLeftovers" >> beam.GroupByKey()
            | "BestFitDecreasing"
            >> beam.ParDo(PackLeftoversFn(self.seq_len, self.pad_id)).with_outputs(
                STATS, main="tables"
            )
        )
        outputs = {
            TABLES: first.tables,
            TAIL_TABLES: second.tables,
            STATS: (first[STATS], second[STATS]) | "AllStats" >> beam.Flatten(),
            OUTCOME: first[OUTCOME],
            EVAL_RECORDS: first[EVAL_RECORDS],
            RETOKENIZED: first[RETOKENIZED],
        }
        if self.plan is not None:
            outputs[MIX] = first[MIX]
        return outputs
