"""Weighted data mixes, no Beam: the `train_data_mix` form, its checks, and the sampling rule.

The form (one string, console-friendly), either
- `SOURCE=WEIGHT[,SOURCE=WEIGHT...]`, e.g. `train=0.7,gs://b/general/*.jsonl=0.3`, or
- a JSON list, e.g. `[{"uri": "train", "weight": 0.7}, {"uri": "gs://b/g/*.jsonl", "weight": 0.3}]`
  (an entry may add `"replay": true`: the manifest then marks it as replay).

A SOURCE is anything `--input` / `train_data_uri` reads (a file, glob, gs://, hf://, bq://);
`train` names `train_data_uri` itself (so a schedule keeps its window placeholder in one place).
`train_data_uri` is always part of the mix: when the mix does not name it, it gets the weight the
others leave to 1 (`gs://b/general/*.jsonl=0.2` alone: the window 0.8, the general set 0.2).
When it is named, the weights are relative (shares are weight / sum of weights).

The sampling rule (by tokens, deterministic, `MixPlan`):
- Each source's available tokens T_i are its kept training documents' tokens, counted before
  exact-duplicate removal (a duplicate is then dropped whichever source it came from).
- The mix is sized by `train_data_uri` (`train`, the window of a schedule): each of its
  tokens is used once, N = T_train / share_train, and source i is to give share_i x N (replay
  is added to the new data, never in its place; a large extra source is cut to its share).
  Without a `train` source, or when it has no tokens, N = sum of T_i.
- Each document draws u in [0, 1) from a keyed hash of its content and the seed (`draw`): the
  same inputs always give the same rows, on any runner.
- A source with more than its part (rate share_i x N / T_i below 1) keeps the documents whose u
  is below a threshold chosen on a token histogram of u, so that the kept tokens match its part
  (sampling without replacement, to 1/HISTOGRAM_BINS of the source).
- A source with less than its part is used whole, repeated: floor(rate) passes of every document
  plus one more pass of those whose u falls under the remainder's threshold, at most MAX_PASSES
  passes (a share that needs more is reached only in part; the manifest records the share it
  got and the run logs a warning).
- The eval split is drawn per source (each record's split by its own hash, as without a mix) and
  sampled with the same threshold, never repeated: the eval set mirrors the mix.

How it scales: the histograms are fixed-size (sources x HISTOGRAM_BINS token counts), summed
with a lifted combine; the plan is one small side input; each document's decision is made in the
packing step's own parallel buckets. No step holds more than a bucket.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TRAIN = "train"
"""The mix's name for `train_data_uri` (the `--input` patterns)."""
HISTOGRAM_BINS = 1024
"""Bins of the per-source token histogram over the hash draw u (the threshold's resolution)."""
MAX_PASSES = 4
"""The most times one document is packed when its source's weight asks for more than it has."""
NOT_SAMPLED = "not_sampled"
"""The filtered reason of a kept document the mix did not draw (counted, not written out)."""


@dataclass(frozen=True)
class MixEntry:
    """One source of a mix: its URI patterns (comma-free), its weight and whether it is replay."""

    uri: str
    weight: float
    replay: bool = False


def parse_mix(text: str) -> tuple[list[MixEntry], list[str]]:
    """`train_data_mix` -> (entries, problems); each problem is one line naming the entry."""
    text = text.strip()
    if not text:
        return [], []
    raw: list[tuple[Any, Any, bool]] = []
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            return [], [f"train_data_mix is not valid JSON: {exc.msg} (at {exc.pos})"]
        if not isinstance(items, list):
            return [], ["train_data_mix JSON must be a list of {uri, weight}"]
        for item in items:
            if not isinstance(item, dict) or set(item) - {"uri", "weight", "replay"}:
                return [], [f"train_data_mix entry {item!r}: expected {{uri, weight}}"]
            raw.append((item.get("uri", ""), item.get("weight"), bool(item.get("replay"))))
    else:
        for part in text.split(","):
            uri, sep, weight = part.strip().rpartition("=")
            if not sep:
                raw.append((part.strip(), None, False))
            else:
                raw.append((uri.strip(), weight.strip(), False))
    entries: list[MixEntry] = []
    problems: list[str] = []
    seen: set[str] = set()
    for uri, weight, replay in raw:
        if not isinstance(uri, str) or not uri.strip():
            problems.append(f"train_data_mix: an entry has an empty source (weight {weight})")
            continue
        uri = uri.strip()
        value = _number(weight)
        if value is None or not value > 0:
            problems.append(
                f"train_data_mix: {uri}: the weight {weight!r} is not a positive number "
                "(write SOURCE=WEIGHT, e.g. train=0.7)"
            )
            continue
        if uri in seen:
            problems.append(f"train_data_mix: {uri} is named twice: give each source one weight")
            continue
        seen.add(uri)
        entries.append(MixEntry(uri, value, replay))
    return entries, problems


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def resolve_mix(
    text: str,
    train_uri: str,
    replay_sources: Sequence[str] = (),
    replay_fraction: float = 0.0,
) -> tuple[list[MixEntry], list[str]]:
    """The whole mix: `train_data_mix` with `train_data_uri` (named `train`) and the replay
    sources sharing `replay_fraction` of the tokens equally; (entries with shares as weights,
    problems). An empty mix without replay gives [] (a plain run)."""
    entries, problems = parse_mix(text)
    if problems:
        return [], problems
    if not entries and not (replay_fraction > 0 and replay_sources):
        return [], []
    named = {e.uri for e in entries}
    if train_uri != TRAIN and train_uri in named and TRAIN in named:
        return [], [f"train_data_mix names train_data_uri twice (as {TRAIN} and {train_uri})"]
    entries = [MixEntry(train_uri, e.weight, e.replay) if e.uri == TRAIN else e for e in entries]
    if train_uri not in {e.uri for e in entries}:
        rest = 1.0 - sum(e.weight for e in entries)
        if rest <= 1e-9:
            return [], [
                f"train_data_mix: the weights sum to {sum(e.weight for e in entries):g} and "
                f"leave train_data_uri no share: name it ({TRAIN}=WEIGHT) or lower the others"
            ]
        entries.insert(0, MixEntry(train_uri, rest))
    total = sum(e.weight for e in entries)
    shares = [MixEntry(e.uri, e.weight / total, e.replay) for e in entries]
    if replay_fraction > 0 and replay_sources:
        if not 0 < replay_fraction < 1:
            return [], [f"replay_fraction must be in [0, 1) (got {replay_fraction})"]
        each = replay_fraction / len(replay_sources)
        replay = []
        for uri in replay_sources:
            if uri in {e.uri for e in shares}:
                problems.append(f"replay source {uri} is also in train_data_mix: name it once")
            replay.append(MixEntry(uri, each, replay=True))
        shares = [MixEntry(e.uri, e.weight * (1 - replay_fraction), e.replay) for e in shares]
        shares += replay
    return shares, problems


def format_mix(entries: Sequence[MixEntry]) -> str:
    """Entries -> the JSON form (what the preprocess step hands Beam: URIs may hold commas)."""
    items = [
        {"uri": e.uri, "weight": round(e.weight, 12), **({"replay": True} if e.replay else {})}
        for e in entries
    ]
    return json.dumps(items, separators=(",", ":"))


def draw(content_hash: str, seed: str) -> float:
    """A document's u in [0, 1): a keyed hash of its content (duplicates draw alike)."""
    digest = hashlib.blake2b(content_hash.encode(), digest_size=8, key=seed.encode()[:64])
    return int.from_bytes(digest.digest(), "big") / 2**64


def bin_of(u: float) -> int:
    return min(int(u * HISTOGRAM_BINS), HISTOGRAM_BINS - 1)


@dataclass(frozen=True)
class SourcePlan:
    """One source's part: whole passes, and the u threshold of one more (partial) pass."""

    label: str
    share: float
    tokens: int
    """Available training tokens (before duplicate removal)."""
    passes: int
    threshold: float
    capped: bool = False

    def train_passes(self, u: float) -> int:
        return self.passes + (1 if u < self.threshold else 0)

    def eval_kept(self, u: float) -> bool:
        return self.passes >= 1 or u < self.threshold


@dataclass(frozen=True)
class MixPlan:
    """Each source's sampling, from the token histograms (`plan_of`)."""

    sources: tuple[SourcePlan, ...]
    warnings: tuple[str, ...] = field(default=())


def plan_of(
    labels: Sequence[str], shares: Sequence[float], histograms: Mapping[int, Sequence[int]]
) -> MixPlan:
    """The rule of the module docstring, from per-source token histograms over u."""
    totals = [int(sum(histograms.get(i, ()))) for i in range(len(labels))]
    anchor = labels.index(TRAIN) if TRAIN in labels else -1
    if anchor >= 0 and totals[anchor] and shares[anchor] > 0:
        mix_tokens = totals[anchor] / shares[anchor]
    else:
        anchor, mix_tokens = -1, sum(totals)
    plans = []
    warnings = []
    for i, (label, share) in enumerate(zip(labels, shares, strict=True)):
        available = totals[i]
        if available == 0:
            plans.append(SourcePlan(label, share, 0, 0, 0.0))
            warnings.append(f"mix source {label} has no tokens to give its share {share:.3f}")
            continue
        rate = 1.0 if i == anchor else share * mix_tokens / available  # the anchor: exactly once
        capped = rate > MAX_PASSES
        if capped:
            warnings.append(
                f"mix source {label}: its share {share:.3f} needs {rate:.1f} passes of its "
                f"{available:,} tokens; used {MAX_PASSES} (the most): it gets less"
            )
            rate = float(MAX_PASSES)
        passes = int(rate)
        threshold = _threshold(histograms[i], (rate - passes) * available)
        plans.append(SourcePlan(label, share, available, passes, threshold, capped))
    return MixPlan(tuple(plans), tuple(warnings))


def _threshold(histogram: Sequence[int], wanted: float) -> float:
    """The u below which the histogram's tokens add up to `wanted` (linear within a bin)."""
    if wanted <= 0:
        return 0.0
    cumulative = 0.0
    for b, tokens in enumerate(histogram):
        if tokens and cumulative + tokens >= wanted:
            return (b + (wanted - cumulative) / tokens) / HISTOGRAM_BINS
        cumulative += tokens
    return 1.0


_RECORD_SUFFIX = re.compile(r"^(?P<path>.*?)(:\d+|\[\d+\]|#\d+)$")
"""What the readers append to a file's path to name one record (beam_preprocess/parsers.py)."""


@dataclass(frozen=True)
class MixSources:
    """Which source each record came from: the files each source matched (exact paths, as the
    readers name them) and the prefixes of its bq:// rows; with the sources' labels and shares."""

    labels: tuple[str, ...]
    shares: tuple[float, ...]
    replay: tuple[bool, ...]
    files: Mapping[str, int]
    prefixes: tuple[tuple[str, int], ...] = ()
    seed: str = "llmft"

    def index_of(self, source: str) -> int:
        """The mix source of a record's source: "path:line" (JSONL, CSV), "path[i]" (a JSON
        array), "path#row" (Parquet), a path, or a bq:// row's "uri@snapshot#hash"."""
        if source in self.files:
            return self.files[source]
        match = _RECORD_SUFFIX.match(source)
        if match and match["path"] in self.files:
            return self.files[match["path"]]
        for prefix, index in self.prefixes:
            if source.startswith(prefix):
                return index
        raise KeyError(f"record {source!r} belongs to no source of the mix")


def mix_stats(
    sources: MixSources,
    read: Mapping[int, int],
    outcomes: Mapping[int, Mapping[str, int]],
    packed: Mapping[int, Mapping[str, int]],
) -> dict[str, Any]:
    """Per source: records read, kept, duplicates, filtered, not sampled, rejected (read =
    accounted, their sum), the packed train/eval tokens and the share of the packed train tokens it got (stats.json's
    `mix`, also in the manifest's stats)."""
    total = sum(p.get("train_tokens", 0) for p in packed.values()) or 1
    out = {}
    for i, label in enumerate(sources.labels):
        counts = outcomes.get(i, {})
        p = packed.get(i, {})
        entry = {
            "replay": sources.replay[i],
            "target_share": round(sources.shares[i], 6),
            "records_read": read.get(i, 0),
            "kept": counts.get("kept", 0),
            "duplicates": counts.get("duplicates", 0),
            "filtered": counts.get("filtered", 0),
            "not_sampled": counts.get(NOT_SAMPLED, 0),
            "rejected": counts.get("rejected", 0),
            "available_tokens": p.get("available_tokens", 0),
            "passes": p.get("passes", 0.0),
            "train_tokens": p.get("train_tokens", 0),
            "eval_tokens": p.get("eval_tokens", 0),
            "share": round(p.get("train_tokens", 0) / total, 6),
        }
        entry["accounted"] = sum(
            entry[k] for k in ("kept", "duplicates", "filtered", "not_sampled", "rejected")
        )
        out[label] = entry
    return out
