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

A weighted mix (`--train-data-mix`) samples pairs by tokens with the rule of instruction data
(beam_preprocess/mix.py): TokenizePairs counts each source's training pair tokens (chosen plus
rejected) on the per-bundle histograms, `PlanMix` makes the plan, and the packing step draws
each unique pair's passes from it (`MixSampler`: repeated pairs are packed again, eval pairs
never repeated) and emits the per-source counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_preprocess.mix import MixPlan, MixSources
from beam_preprocess.mix_steps import MIX, MIX_TOKENS, TokenHistogram
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
from beam_preprocess.token_steps import ROWS_PER_TABLE, TABLES, MixSampler

TokenPair = tuple[str, str, list[int], list[int], list[int], list[int]]
"""(content hash, source, chosen ids, chosen mask, rejected ids, rejected mask): what travels
through the shuffle (plain lists and strings: Beam's fast coder, no pickling)."""


def _counter(name: str) -> Any:
    return Metrics.counter("llmft", name)


class TokenizePairsFn(beam.DoFn):
    """Pair example -> (split, TokenPair), or a dead/filtered letter; the tokenizer is loaded once
    per worker."""

    def __init__(self, config: PreprocessConfig, mix: MixSources | None = None) -> None:
        self.config, self.mix = config, mix

    def setup(self) -> None:
        # Beam's DoFn convention: a worker imports (and loads) the tokenizer at setup
        from beam_preprocess.tokenize import load_tokenizer

        self.tokenizer = load_tokenizer(self.config.tokenizer, self.config.chat_template)

    def start_bundle(self) -> None:
        self.histogram = TokenHistogram(self.mix) if self.mix is not None else None

    def finish_bundle(self) -> Iterator[Any]:
        if self.histogram is not None:  # the mix's token counts (beam_preprocess.mix_steps)
            for value in self.histogram.take():
                yield pvalue.TaggedOutput(MIX_TOKENS, GlobalWindows.windowed_value(value))

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
        if self.histogram is not None and example["split"] == "train":
            self.histogram.add(source, example["hash"], len(chosen) + len(rejected))
        value = (example["hash"], source, chosen, chosen_mask, rejected, rejected_mask)
        return [(example["split"], value)]


class TokenizePairs(beam.PTransform):
    """Pair examples -> (split, TokenPair); tagged DEAD, FILTERED, OUTCOME."""

    def __init__(self, config: PreprocessConfig, mix: MixSources | None = None) -> None:
        super().__init__()
        self.config, self.mix = config, mix

    def expand(self, examples: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        tags = (DEAD, FILTERED, OUTCOME) + ((MIX_TOKENS,) if self.mix is not None else ())
        render = TokenizePairsFn(self.config, self.mix)
        return examples | "RenderPairs" >> beam.ParDo(render).with_outputs(*tags, main="pairs")


def unique_pairs(
    values: Iterable[TokenPair], split: str = "train", sampler: MixSampler | None = None
) -> tuple[list[Pair], int, int]:
    """(one pair per content hash, the lowest source's copy, in source order; duplicates; the
    unique pairs kept). With a mix's `sampler`, each unique pair appears as many times as the
    plan draws (0: not sampled, and not kept)."""
    first: dict[str, TokenPair] = {}
    dropped: list[TokenPair] = []
    for value in values:
        kept = first.get(value[0])
        if kept is None or source_order(value[1]) < source_order(kept[1]):
            first[value[0]] = value
            if kept is not None:
                dropped.append(kept)
        else:
            dropped.append(value)
    pairs: list[Pair] = []
    unique = 0
    for v in sorted(first.values(), key=lambda v: source_order(v[1])):
        sides = ((v[2], v[3]), (v[4], v[5]))
        passes = 1 if sampler is None else sampler.passes(v[0], v[1], split, sides)
        pairs += [Pair(*sides)] * passes
        unique += 1 if passes else 0
    if sampler is not None:
        for value in dropped:
            sampler.duplicate(value[1])
    return pairs, len(dropped), unique


class PackPairsFn(beam.DoFn):
    """(split, [TokenPair]) -> (split, pyarrow Table) per ROWS_PER_TABLE rows; tagged STATS and
    OUTCOME ("kept", "duplicate")."""

    def __init__(self, seq_len: int, pad_id: int, mix: MixSources | None = None) -> None:
        self.seq_len, self.pad_id, self.mix = seq_len, pad_id, mix

    def process(
        self, element: tuple[str, Iterable[TokenPair]], plan: MixPlan | None = None
    ) -> Iterator[Any]:
        split, values = element
        sampler = MixSampler(self.mix, plan) if self.mix is not None and plan else None
        pairs, duplicates, kept = unique_pairs(values, split, sampler)
        packed = pack_pairs(pairs, self.seq_len)
        rows = [row_of(r, self.seq_len, self.pad_id) for r in packed]
        for lo in range(0, len(rows), ROWS_PER_TABLE):
            yield split, table_of(rows[lo : lo + ROWS_PER_TABLE])
        _counter("rows").inc(len(rows))
        yield pvalue.TaggedOutput(STATS, (split, split_stats(pairs, rows)))
        if kept:
            _counter("kept").inc(kept)
            yield pvalue.TaggedOutput(OUTCOME, outcome("kept", count=kept))
        if duplicates:
            _counter("duplicates").inc(duplicates)
            yield pvalue.TaggedOutput(OUTCOME, outcome("duplicate", count=duplicates))
        if sampler is not None:
            yield from sampler.events()


class DeduplicateAndPackPairs(beam.PTransform):
    """(split, TokenPair) -> {TABLES: (split, pyarrow Table), STATS, OUTCOME}: the keys of
    token_steps.DeduplicateAndPack's outputs that preference data has."""

    def __init__(
        self,
        seq_len: int,
        pad_id: int,
        mix: MixSources | None = None,
        plan: pvalue.PCollection | None = None,
    ) -> None:
        super().__init__()
        self.seq_len, self.pad_id, self.mix, self.plan = seq_len, pad_id, mix, plan

    def expand(self, pairs: pvalue.PCollection) -> dict[str, pvalue.PCollection]:
        side = {"plan": pvalue.AsSingleton(self.plan)} if self.plan is not None else {}
        tags = (STATS, OUTCOME) + ((MIX,) if self.plan is not None else ())
        pack = PackPairsFn(self.seq_len, self.pad_id, self.mix)
        packed = (
            pairs
            | "GroupBySplit" >> beam.GroupByKey()
            | "DropDuplicatesAndPack" >> beam.ParDo(pack, **side).with_outputs(*tags, main=TABLES)
        )
        outputs = {TABLES: packed[TABLES], STATS: packed[STATS], OUTCOME: packed[OUTCOME]}
        if self.plan is not None:
            outputs[MIX] = packed[MIX]
        return outputs
