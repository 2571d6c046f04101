"""Preference examples -> token pairs -> unique pairs packed into rows: the graph's steps after
Prepare for `--data-kind preference` (instruction and text data take beam_preprocess.token_steps).

TokenizePairs renders both sides of each pair with the chat template (beam_preprocess/pairs.py:
`pair_of`); a pair the template cannot render goes to rejected/, one longer than seq_len to
filtered/ ("too_long_tokens": a cut response would bias its log-probability).
DeduplicateAndPackPairs groups each split's pairs on one worker, keeps one copy per content hash
(the lowest source), orders them by source and packs them first-fit decreasing (`pack_pairs`,
`row_of`): the rows beam_preprocess/preference.py's `write_dataset` gives for the same records in
the same order. One worker per split holds that split's pairs: preference sets are small next to
instruction corpora (UltraFeedback: 64k prompts), and one order over the whole split is what
makes the rows reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from beam_preprocess.options import PreprocessConfig
from beam_preprocess.pairs import (
    Pair,
    PairError,
    pack_pairs,
    pair_of,
    row_of,
    split_stats,
    table_of,
)
from beam_preprocess.record_steps import drop_example, source_order
from beam_preprocess.records import DEAD, FILTERED, OUTCOME, STATS, TOO_LONG, outcome
from beam_preprocess.token_steps import ROWS_PER_TABLE, TABLES

TokenPair = tuple[str, str, list[int], list[int], list[int], list[int]]
"""(content hash, source, chosen ids, chosen mask, rejected ids, rejected mask): what travels
through the shuffle (plain lists and strings: Beam's fast coder, no pickling)."""


def _counter(name: str) -> Any:
    return Metrics.counter("llmft", name)


class TokenizePairsFn(beam.DoFn):
    """Pair example -> (split, TokenPair), or a dead/filtered letter; the tokenizer is loaded once
    per worker."""

    def __init__(self, config: PreprocessConfig) -> None:
        self.config = config

    def setup(self) -> None:
        # Beam's DoFn convention: a worker imports (and loads) the tokenizer at setup
        from beam_preprocess.tokenize import load_tokenizer

        self.tokenizer = load_tokenizer(self.config.tokenizer, self.config.chat_template)

    def process(self, example: dict[str, Any]) -> list[Any]:
        source = example["source"]
        try:
            pair = pair_of(
                self.tokenizer, example["messages"], example["chosen"], example["rejected"]
            )
        except PairError as exc:
            return drop_example(DEAD, "rejected", exc.reason, example, str(exc))
        if len(pair) > self.config.seq_len:
            error = f"{len(pair)} tokens, seq_len {self.config.seq_len}"
            return drop_example(FILTERED, "filtered", TOO_LONG, example, error)
        (chosen, chosen_mask), (rejected, rejected_mask) = pair.chosen, pair.rejected
        value = (example["hash"], source, chosen, chosen_mask, rejected, rejected_mask)
        return [(example["split"], value)]


class TokenizePairs(beam.PTransform):
    """Pair examples -> (split, TokenPair); tagged DEAD, FILTERED, OUTCOME."""

    def __init__(self, config: PreprocessConfig) -> None:
        super().__init__()
        self.config = config

    def expand(self, examples: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        return examples | "RenderPairs" >> beam.ParDo(TokenizePairsFn(self.config)).with_outputs(
            DEAD, FILTERED, OUTCOME, main="pairs"
        )


def unique_pairs(values: Iterable[TokenPair]) -> tuple[list[Pair], int]:
    """(one pair per content hash, the lowest source's copy, in source order; duplicates)."""
    first: dict[str, TokenPair] = {}
    seen = 0
    for value in values:
        seen += 1
        kept = first.get(value[0])
        if kept is None or source_order(value[1]) < source_order(kept[1]):
            first[value[0]] = value
    ordered = sorted(first.values(), key=lambda v: source_order(v[1]))
    pairs = [Pair((v[2], v[3]), (v[4], v[5])) for v in ordered]
    return pairs, seen - len(pairs)


class PackPairsFn(beam.DoFn):
    """(split, [TokenPair]) -> (split, pyarrow Table) per ROWS_PER_TABLE rows; tagged STATS and
    OUTCOME ("kept", "duplicate")."""

    def __init__(self, seq_len: int, pad_id: int) -> None:
        self.seq_len, self.pad_id = seq_len, pad_id

    def process(self, element: tuple[str, Iterable[TokenPair]]) -> Iterator[Any]:
        split, values = element
        pairs, duplicates = unique_pairs(values)
        packed = pack_pairs(pairs, self.seq_len)
        rows = [row_of(r, self.seq_len, self.pad_id) for r in packed]
        for lo in range(0, len(rows), ROWS_PER_TABLE):
            yield split, table_of(rows[lo : lo + ROWS_PER_TABLE])
        _counter("rows").inc(len(rows))
        yield pvalue.TaggedOutput(STATS, (split, split_stats(pairs, rows)))
        if pairs:
            _counter("kept").inc(len(pairs))
            yield pvalue.TaggedOutput(OUTCOME, outcome("kept", count=len(pairs)))
        if duplicates:
            _counter("duplicates").inc(duplicates)
            yield pvalue.TaggedOutput(OUTCOME, outcome("duplicate", count=duplicates))


class DeduplicateAndPackPairs(beam.PTransform):
    """(split, TokenPair) -> {TABLES: (split, pyarrow Table), STATS, OUTCOME}: the keys of
    token_steps.DeduplicateAndPack's outputs that preference data has."""

    def __init__(self, seq_len: int, pad_id: int) -> None:
        super().__init__()
        self.seq_len, self.pad_id = seq_len, pad_id

    def expand(self, pairs: pvalue.PCollection) -> dict[str, pvalue.PCollection]:
        packed = (
            pairs
            | "GroupBySplit" >> beam.GroupByKey()
            | "DropDuplicatesAndPack"
            >> beam.ParDo(PackPairsFn(self.seq_len, self.pad_id)).with_outputs(
                STATS, OUTCOME, main=TABLES
            )
        )
        return {TABLES: packed[TABLES], STATS: packed[STATS], OUTCOME: packed[OUTCOME]}
