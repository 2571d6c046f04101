"""The run's accounting: every event the steps emit, combined once into stats.json.

Each step emits OUTCOME events ((event, count): "kept", "duplicate", "rejected/<reason>",
"filtered/<reason>"), the reader emits the number of records per file (READ), packing emits
per-split row statistics (STATS), and tokenization the sources of re-encoded documents
(RETOKENIZED), and the Prepare step the fields records held but did not use (UNUSED_FIELDS:
stats.json's `unused_fields`, {field: records}). They are tagged, flattened and combined by one CombineFn (`RunStats`) in one
step, instead of a combiner and a side input each: on the DirectRunner every extra stage is a
round trip to each worker. The combine is lifted (partial sums in each producing stage), so only a
few small accumulators cross stages. `accounting` proves that nothing was lost:
records_read = kept + filtered + duplicates + rejected.
"""

from __future__ import annotations

import heapq
import json
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_preprocess.mix import MixSources, mix_stats
from beam_preprocess.mix_steps import MIX, MIX_PLAN
from beam_preprocess.records import OUTCOME, READ, READ_FILES, RETOKENIZED, STATS, UNUSED_FIELDS

RETOKENIZED_SOURCES = 20
"""Sources (path:line) of re-encoded documents listed in the stats, the first in sort order."""
SPLIT_FIELDS = ("rows", "documents", "tokens", "target_tokens")


class RunStats(beam.CombineFn):
    """(tag, value) events -> the accumulated counts (a small dict) of the whole run; with a
    weighted mix (`mix`) also per source (beam_preprocess.mix_steps: MIX, MIX_PLAN, READ_FILES)."""

    def __init__(self, mix: MixSources | None = None) -> None:
        self.mix = mix

    def create_accumulator(self) -> dict[str, Any]:
        return {
            "read": 0,
            "outcomes": {},
            "splits": {},
            "retokenized": 0,
            "sources": [],
            "unused": {},
            "mix": {},
            "mix_plan": None,
        }

    def add_input(self, acc: dict[str, Any], event: tuple[str, Any]) -> dict[str, Any]:
        tag, value = event
        if tag == OUTCOME:
            _add_outcomes(acc, dict([value]))
        elif tag == READ:
            acc["read"] += value
        elif tag == STATS:
            split, values = value
            _add_splits(acc, {split: values})
        elif tag == RETOKENIZED:
            _add_retokenized(acc, 1, [value])
        elif tag == UNUSED_FIELDS:
            _add_counts(acc["unused"], dict(value))
        elif tag == READ_FILES:
            if self.mix is not None:
                path, count = value
                _add_mix(acc, {self.mix.index_of(path): {"records_read": count}})
        elif tag == MIX:
            index, counts = value
            _add_mix(acc, {index: counts})
        elif tag == MIX_PLAN:
            acc["mix_plan"] = value
        else:
            raise AssertionError(f"unknown stats event {tag!r}")
        return acc

    def merge_accumulators(self, accumulators: Any) -> dict[str, Any]:
        merged = self.create_accumulator()
        for acc in accumulators:
            merged["read"] += acc["read"]
            _add_outcomes(merged, acc["outcomes"])
            _add_splits(merged, acc["splits"])
            _add_retokenized(merged, acc["retokenized"], acc["sources"])
            _add_counts(merged["unused"], acc["unused"])
            _add_mix(merged, acc["mix"])
            merged["mix_plan"] = merged["mix_plan"] or acc["mix_plan"]
        return merged

    def extract_output(self, acc: dict[str, Any]) -> dict[str, Any]:
        stats = accounting(acc["read"], acc["outcomes"])
        stats["answer_boundary_retokenized"] = acc["retokenized"]
        stats["answer_boundary_sources"] = sorted(acc["sources"])
        stats["unused_fields"] = dict(sorted(acc["unused"].items()))
        stats["splits"] = {
            name: dict(zip(SPLIT_FIELDS, values, strict=True))
            for name, values in sorted(acc["splits"].items())
        }
        if self.mix is not None:
            stats["mix"] = _mix_output(self.mix, acc)
        return stats


def _add_mix(acc: dict[str, Any], counts: dict[int, dict[str, int]]) -> None:
    for index, values in counts.items():
        _add_counts(acc["mix"].setdefault(index, {}), values)


def _mix_output(mix: MixSources, acc: dict[str, Any]) -> dict[str, Any]:
    """stats.json's `mix`: per source label, its counts (beam_preprocess.mix.mix_stats)."""
    counts = acc["mix"]
    plan = acc["mix_plan"] or {"sources": [{} for _ in mix.labels], "warnings": []}
    read = {i: c.get("records_read", 0) for i, c in counts.items()}
    packed = {i: {**counts.get(i, {}), **plan["sources"][i]} for i in range(len(mix.labels))}
    sources = mix_stats(mix, read, counts, packed)
    return {"sources": sources, "warnings": plan["warnings"], "seed": mix.seed}


def _add_outcomes(acc: dict[str, Any], outcomes: dict[str, int]) -> None:
    _add_counts(acc["outcomes"], outcomes)


def _add_counts(total: dict[str, int], counts: dict[str, int]) -> None:
    for name, count in counts.items():
        total[name] = total.get(name, 0) + count


def _add_splits(acc: dict[str, Any], splits: dict[str, list[int]]) -> None:
    for split, values in splits.items():
        total = acc["splits"].get(split, [0] * len(SPLIT_FIELDS))
        acc["splits"][split] = [a + b for a, b in zip(total, values, strict=True)]


def _add_retokenized(acc: dict[str, Any], count: int, sources: list[str]) -> None:
    acc["retokenized"] += count
    acc["sources"] = heapq.nsmallest(RETOKENIZED_SOURCES, [*acc["sources"], *sources])


def tagged(tag: str) -> beam.PTransform:
    """A Map that tags a step's events for `RunStats`."""
    return beam.Map(lambda value: (tag, value))


class WriteStats(beam.PTransform):
    """Tagged events -> `path` (stats.json), once every event is in."""

    def __init__(self, path: str, mix: MixSources | None = None) -> None:
        super().__init__()
        self.path = path
        self.mix = mix

    def expand(self, events: beam.PCollection) -> beam.PCollection:
        path = self.path
        return (
            events
            | "Combine" >> beam.CombineGlobally(RunStats(self.mix))
            | "Write" >> beam.Map(lambda stats: write_json(path, stats))
        )


def write_json(path: str, value: dict[str, Any]) -> str:
    with FileSystems.create(path) as f:
        f.write(json.dumps(value, indent=2, sort_keys=True).encode())
    return path


def accounting(read_total: int, outcomes: dict[str, int]) -> dict[str, Any]:
    """Outcome events -> stats where records_read = kept + filtered + duplicates + rejected."""
    stats: dict[str, Any] = {
        "records_read": read_total,
        "kept": 0,
        "duplicates": 0,
        "rejected": 0,
        "filtered": 0,
        "rejected_by_reason": {},
        "filtered_by_reason": {},
    }
    for event, count in outcomes.items():
        kind, _, reason = event.partition("/")
        if kind == "kept":
            stats["kept"] += count
        elif kind == "duplicate":
            stats["duplicates"] += count
        else:
            stats[kind] += count
            by_reason = stats[f"{kind}_by_reason"]
            by_reason[reason] = by_reason.get(reason, 0) + count
    accounted = stats["kept"] + stats["filtered"] + stats["duplicates"] + stats["rejected"]
    stats["accounted"] = accounted
    stats["malformed"] = stats["rejected"]
    return stats
