"""The graph's steps of a weighted mix (beam_preprocess/mix.py has the rule, no Beam).

- Tokenize counts each bundle's kept training tokens per source on a histogram over the hash
  draw u (`TokenHistogram`, tagged MIX_TOKENS): fixed size, whatever the data.
- `PlanMix` sums the histograms (a lifted combine: partial sums where they are produced) and
  turns them into the `MixPlan`, one small element read by the packing step as a side input.
- The packing step (beam_preprocess/token_steps.py) applies the plan to each kept document and
  emits per-source counts (MIX events); the dead letters' sources give the per-source filtered
  and rejected counts (`letter_events`), the readers the per-source records read (READ_FILES);
  `RunStats` sums them into stats.json's `mix`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np

from beam_preprocess.mix import (
    HISTOGRAM_BINS,
    TRAIN,
    MixEntry,
    MixPlan,
    MixSources,
    bin_of,
    draw,
    plan_of,
    resolve_mix,
)
from beam_preprocess.sources import is_bigquery, is_hf

MIX_TOKENS = "mix_tokens"
"""Tag: (source index, int64 histogram bytes) of kept training tokens over u, per bundle."""
MIX = "mix"
"""Tag (stats event): (source index, {count name: n}) of what became of a source's records."""
MIX_PLAN = "mix_plan"
"""Tag (stats event): the plan, once ({label: {available_tokens, passes}})."""


class TokenHistogram:
    """One bundle's training tokens per source over u (Tokenize's side of the mix)."""

    def __init__(self, sources: MixSources) -> None:
        self.sources = sources
        self.bins: dict[int, np.ndarray] = {}

    def add(self, source: str, content_hash: str, tokens: int) -> None:
        index = self.sources.index_of(source)
        if index not in self.bins:
            self.bins[index] = np.zeros(HISTOGRAM_BINS, dtype=np.int64)
        self.bins[index][bin_of(draw(content_hash, self.sources.seed))] += tokens

    def take(self) -> Iterator[tuple[int, bytes]]:
        bins, self.bins = self.bins, {}
        for index, values in sorted(bins.items()):
            yield index, values.tobytes()


class SumHistograms(beam.CombineFn):
    """(index, histogram bytes) -> {index: [tokens per bin]}."""

    def create_accumulator(self) -> dict[int, np.ndarray]:
        return {}

    def add_input(self, acc: dict[int, np.ndarray], element: tuple[int, bytes]) -> Any:
        index, data = element
        values = np.frombuffer(data, dtype=np.int64)
        acc[index] = acc[index] + values if index in acc else values.copy()
        return acc

    def merge_accumulators(self, accumulators: Any) -> dict[int, np.ndarray]:
        merged: dict[int, np.ndarray] = {}
        for acc in accumulators:
            for index, values in acc.items():
                merged[index] = merged[index] + values if index in merged else values.copy()
        return merged

    def extract_output(self, acc: dict[int, np.ndarray]) -> dict[int, list[int]]:
        return {index: values.tolist() for index, values in acc.items()}


class PlanMix(beam.PTransform):
    """MIX_TOKENS histograms -> the MixPlan (one element: the packing step's side input)."""

    def __init__(self, sources: MixSources) -> None:
        super().__init__()
        self.sources = sources

    def expand(self, histograms: beam.PCollection) -> beam.PCollection:
        labels, shares = self.sources.labels, self.sources.shares
        return (
            histograms
            | "SumHistograms" >> beam.CombineGlobally(SumHistograms())
            | "Plan" >> beam.Map(lambda h: _logged(plan_of(labels, shares, h)))
        )


def _logged(plan: MixPlan) -> MixPlan:
    import logging

    for warning in plan.warnings:
        logging.getLogger(__name__).warning("%s", warning)
    return plan


def plan_event(plan: MixPlan) -> tuple[str, dict[str, Any]]:
    """The plan as one stats event: each source's available tokens and passes (rate)."""
    return MIX_PLAN, {
        "sources": [
            {
                "available_tokens": s.tokens,
                "passes": round(s.passes + s.threshold if s.tokens else 0.0, 4),
                "capped": s.capped,
            }
            for s in plan.sources
        ],
        "warnings": list(plan.warnings),
    }


def letter_events(sources: MixSources, kind: str) -> beam.PTransform:
    """Dead letters -> (MIX, (source index, {kind: 1})) stats events."""
    return beam.Map(lambda letter: (MIX, (sources.index_of(letter["source"]), {kind: 1})))


def mix_entries(text: str, inputs: Sequence[str]) -> tuple[list[MixEntry], list[str]]:
    """`--train-data-mix` with `train` standing for the `--input` patterns: (entries, the
    patterns to read: every source's, in order)."""
    entries, problems = resolve_mix(text, TRAIN)
    if problems:
        raise ValueError("invalid preprocessing options:\n  - " + "\n  - ".join(problems))
    patterns: list[str] = []
    for entry in entries:
        for pattern in patterns_of(entry.uri, inputs):
            if pattern not in patterns:
                patterns.append(pattern)
    return entries, patterns


def patterns_of(uri: str, inputs: Sequence[str]) -> list[str]:
    return list(inputs) if uri == TRAIN else [p.strip() for p in uri.split(",") if p.strip()]


def match_mix(
    entries: Sequence[MixEntry],
    inputs: Sequence[str],
    lineage: Sequence[dict[str, Any]],
    bigquery: Sequence[tuple[str, str]],
    seed: str,
) -> MixSources:
    """Which files (and bq:// row prefixes) each source of the mix reads, once, at launch (the
    hf:// sources by their staged files): every problem in one ValueError, before Beam starts
    (a source that matches nothing, a file in two sources)."""
    from apache_beam.io.filesystems import FileSystems

    staged = {entry["uri"]: entry["staged"] for entry in lineage if "staged" in entry}
    snapshots = dict(bigquery)
    files: dict[str, int] = {}
    prefixes: list[tuple[str, int]] = []
    problems: list[str] = []
    for index, entry in enumerate(entries):
        found = 0
        for pattern in patterns_of(entry.uri, inputs):
            if is_bigquery(pattern):
                prefixes.append((f"{pattern}@{snapshots[pattern]}#", index))
                found += 1
                continue
            pattern = staged.get(pattern, pattern) if is_hf(pattern) else pattern
            for metadata in FileSystems.match([pattern])[0].metadata_list:
                if metadata.path in files and files[metadata.path] != index:
                    other = entries[files[metadata.path]].uri
                    problems.append(
                        f"{metadata.path} is in two sources of the mix ({other} and {entry.uri}): "
                        "narrow their patterns"
                    )
                files[metadata.path] = index
                found += 1
        if not found:
            problems.append(f"mix source {entry.uri} matches no files (an empty source)")
    if problems:
        raise ValueError("invalid weighted mix:\n  - " + "\n  - ".join(problems))
    return MixSources(
        labels=tuple(e.uri for e in entries),
        shares=tuple(e.weight for e in entries),
        replay=tuple(e.replay for e in entries),
        files=files,
        prefixes=tuple(prefixes),
        seed=seed,
    )
