"""Prompt examples -> counted prompts -> unique prompt records per split: the graph's steps after
Prepare for `--data-kind prompts` (objective grpo; instruction data takes token_steps, pairs
preference_steps).

CountPromptTokens renders each prompt as the trainer will (chat messages through the chat template
with the assistant turn opened, a text prompt as it is) and counts its tokens: a prompt the
template cannot render goes to rejected/ ("template_error"), one longer than seq_len to filtered/
("too_long_tokens": the rollout would have no room). DeduplicateAndWritePrompts groups each split
on one worker, keeps one copy per content hash (the lowest source: prompt and every column equal),
orders them by source and writes them as the prompt rows of trainer/packed_data/prompts.py; the
eval split's records also go to eval_records/ (the evaluation's held-out prompts). Prompt sets
are small (GSM8K: 7.5k), and one order per split makes the rows reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from beam_preprocess.options import PreprocessConfig
from beam_preprocess.prompt_records import prompt_tokens
from beam_preprocess.prompt_records import record_of as prompt_record_of
from beam_preprocess.record_steps import drop_example, source_order
from beam_preprocess.records import (
    DEAD,
    EVAL_RECORDS,
    FILTERED,
    OUTCOME,
    STATS,
    TOO_LONG,
    outcome,
)
from beam_preprocess.token_steps import ROWS_PER_TABLE, TABLES
from trainer.packed_data.format import EVAL_SPLIT
from trainer.packed_data.prompts import prompt_table

CountedPrompt = tuple[str, str, dict[str, Any], int]
"""(content hash, source, the record as JSON-able dict, prompt tokens) per split."""


def _counter(name: str) -> Any:
    return Metrics.counter("llmft", name)


class CountPromptTokensFn(beam.DoFn):
    """Prompt example -> (split, CountedPrompt), or a dead/filtered letter."""

    def __init__(self, config: PreprocessConfig) -> None:
        self.config = config

    def setup(self) -> None:
        # Beam's DoFn convention: a worker imports (and loads) the tokenizer at setup
        from beam_preprocess.tokenize import load_tokenizer

        self.tokenizer = load_tokenizer(self.config.tokenizer, self.config.chat_template)

    def process(self, example: dict[str, Any]) -> list[Any]:
        record = prompt_record_of(example)
        try:
            tokens = prompt_tokens(self.tokenizer, record)
        except Exception as exc:  # a template's own raise_exception, or any rendering failure
            return drop_example(DEAD, "rejected", "template_error", example, str(exc)[:300])
        if tokens > self.config.seq_len:
            error = f"{tokens} prompt tokens, seq_len {self.config.seq_len}"
            return drop_example(FILTERED, "filtered", TOO_LONG, example, error)
        return [(example["split"], (example["hash"], example["source"], record, tokens))]


class CountPromptTokens(beam.PTransform):
    """Prompt examples -> (split, CountedPrompt); tagged DEAD, FILTERED, OUTCOME."""

    def __init__(self, config: PreprocessConfig) -> None:
        super().__init__()
        self.config = config

    def expand(self, examples: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        fn = CountPromptTokensFn(self.config)
        return examples | "CountPromptTokens" >> beam.ParDo(fn).with_outputs(
            DEAD, FILTERED, OUTCOME, main="prompts"
        )


def unique_prompts(values: Iterable[CountedPrompt]) -> tuple[list[CountedPrompt], int]:
    """(one prompt per content hash, the lowest source's copy, in source order; duplicates)."""
    first: dict[str, CountedPrompt] = {}
    seen = 0
    for value in values:
        seen += 1
        kept = first.get(value[0])
        if kept is None or source_order(value[1]) < source_order(kept[1]):
            first[value[0]] = value
    ordered = sorted(first.values(), key=lambda v: source_order(v[1]))
    return ordered, seen - len(ordered)


class WritePromptsFn(beam.DoFn):
    """(split, [CountedPrompt]) -> (split, pyarrow Table) per ROWS_PER_TABLE records; tagged
    STATS, OUTCOME ("kept", "duplicate") and EVAL_RECORDS (the eval split's records)."""

    def process(self, element: tuple[str, Iterable[CountedPrompt]]) -> Iterator[Any]:
        split, values = element
        prompts, duplicates = unique_prompts(values)
        rows = [(record, tokens) for _, _, record, tokens in prompts]
        for lo in range(0, len(rows), ROWS_PER_TABLE):
            yield split, prompt_table(rows[lo : lo + ROWS_PER_TABLE])
        if split == EVAL_SPLIT:
            for record, _ in rows:
                yield pvalue.TaggedOutput(EVAL_RECORDS, record)
        tokens = sum(n for _, n in rows)
        # SplitInfo's (rows, documents, tokens, target tokens): a prompt has no targets.
        yield pvalue.TaggedOutput(STATS, (split, (len(rows), len(rows), tokens, 0)))
        if prompts:
            _counter("kept").inc(len(prompts))
            yield pvalue.TaggedOutput(OUTCOME, outcome("kept", count=len(prompts)))
        if duplicates:
            _counter("duplicates").inc(duplicates)
            yield pvalue.TaggedOutput(OUTCOME, outcome("duplicate", count=duplicates))


class DeduplicateAndWritePrompts(beam.PTransform):
    """(split, CountedPrompt) -> {TABLES, STATS, OUTCOME, EVAL_RECORDS}: the keys of
    token_steps.DeduplicateAndPack's outputs that prompt data has."""

    def expand(self, prompts: pvalue.PCollection) -> dict[str, pvalue.PCollection]:
        out = (
            prompts
            | "GroupBySplit" >> beam.GroupByKey()
            | "DropDuplicatesAndWrite"
            >> beam.ParDo(WritePromptsFn()).with_outputs(STATS, OUTCOME, EVAL_RECORDS, main=TABLES)
        )
        return {name: out[name] for name in (TABLES, STATS, OUTCOME, EVAL_RECORDS)}
