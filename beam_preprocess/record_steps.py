"""Records -> clean examples with their content hash and split: the steps before tokenization.

One DoFn (`PrepareFn`, the `Prepare` step) validates, cleans, hashes and assigns the split of each
record: four steps of per-record Python fused into one call, so that Beam's per-element cost is
paid once. What it removes goes to a tagged output with a reason, with an OUTCOME event
((event, count)) for each record it decides on, so the run can prove nothing was lost
(beam_preprocess.stats). Exact duplicates are dropped later, by content hash, in the packing
step (beam_preprocess.token_steps): that step groups documents by hash bucket anyway, so
deduplication costs no shuffle of its own.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from beam_preprocess import pairs, prompt_records, shapes
from beam_preprocess.options import PreprocessConfig
from beam_preprocess.records import DEAD, FILTERED, OUTCOME, UNUSED_FIELDS, dead_letter, outcome


def _counter(name: str) -> Any:
    return Metrics.counter("llmft", name)


class PrepareFn(beam.DoFn):
    """Raw record -> example with "hash" and "split", or a dead/filtered letter with its reason."""

    def __init__(self, config: PreprocessConfig) -> None:
        self.config = config

    def setup(self) -> None:
        self.counters: dict[str, Any] = {}
        self.shape = self.config.shape

    def start_bundle(self) -> None:
        self.unused: dict[str, int] = {}

    def process(self, element: dict[str, Any]) -> list[Any]:
        # Returns lists, not a generator: per record, a generator object costs measurably.
        cfg = self.config
        source, record = element["source"], element["record"]
        try:
            example, unused = shapes.example_of(record, self.shape)
        except shapes.Invalid as exc:
            reason, message = exc.args
            tag = FILTERED if exc.kind == "filtered" else DEAD
            return self._drop(tag, exc.kind, reason, source, record, message)
        for name in unused:
            self.unused[name] = self.unused.get(name, 0) + 1
        reason, size = clean_example(example, cfg)
        if reason:
            letter = record_of(example)
            return self._drop(FILTERED, "filtered", reason, source, letter, f"{size} chars")
        example["source"] = source
        example["hash"] = content_hash(example)
        example["split"] = split_of(example, cfg.eval_fraction, cfg.split_seed)
        return [example]

    def finish_bundle(self) -> Any:
        """The bundle's unused-field counts, one event (stats.json's `unused_fields`)."""
        if self.unused:
            value = WindowedValue(sorted(self.unused.items()), 0, (GlobalWindow(),))
            yield pvalue.TaggedOutput(UNUSED_FIELDS, value)

    def _drop(
        self, tag: str, kind: str, reason: str, source: str, record: Any, error: str
    ) -> list[Any]:
        name = f"{kind}_{reason}"
        if name not in self.counters:
            self.counters[name] = _counter(name)
        self.counters[name].inc()
        return [
            pvalue.TaggedOutput(tag, dead_letter(source, record, reason, error)),
            pvalue.TaggedOutput(OUTCOME, outcome(kind, reason)),
        ]


def drop_example(
    tag: str, kind: str, reason: str, example: dict[str, Any], error: str
) -> list[Any]:
    """An example dropped after Prepare: its dead letter (under `tag`, DEAD or FILTERED) and its
    OUTCOME, counted as `<kind>_<reason>` (the pair and prompt steps)."""
    _counter(f"{kind}_{reason}").inc()
    letter = dead_letter(example["source"], record_of(example), reason, error)
    return [pvalue.TaggedOutput(tag, letter), pvalue.TaggedOutput(OUTCOME, outcome(kind, reason))]


class Prepare(beam.PTransform):
    """Records -> examples (validated, cleaned, hashed, split); tagged DEAD (rejected/), FILTERED
    (filtered/), OUTCOME and UNUSED_FIELDS."""

    def __init__(self, config: PreprocessConfig) -> None:
        super().__init__()
        self.config = config

    def expand(self, records: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        return records | "ValidateCleanSplit" >> beam.ParDo(PrepareFn(self.config)).with_outputs(
            DEAD, FILTERED, OUTCOME, UNUSED_FIELDS, main="examples"
        )


# ---------------------------------------------------------------------------------------- validate


def example_of(record: dict[str, Any], cfg: PreprocessConfig) -> dict[str, Any]:
    """The configured fields of a raw record as an example (beam_preprocess.shapes); raises
    shapes.Invalid(reason, message)."""
    return shapes.example_of(record, cfg.shape)[0]


# ------------------------------------------------------------------------------------------ clean

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACES = re.compile(r"[ \t]+")


def clean_text(text: str, normalization: str = "NFC", collapse_whitespace: bool = False) -> str:
    """Unicode-normalise, unify newlines, drop control characters and trim (optionally collapse)."""
    if normalization != "none" and not text.isascii():  # ASCII is in every normal form
        text = unicodedata.normalize(normalization, text)  # type: ignore[arg-type]
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    if collapse_whitespace:
        text = _SPACES.sub(" ", text)
    return text.strip()


def clean_example(example: dict[str, Any], cfg: PreprocessConfig) -> tuple[str, int]:
    """Clean the example's text in place; returns (the reason to filter it or "", its size in
    characters after cleaning)."""

    def clean(text: str) -> str:
        return clean_text(text, cfg.normalization, cfg.collapse_whitespace)

    if "text" in example:
        example["text"] = clean(example["text"])
        contents = [example["text"]]
    else:
        for message in example["messages"]:
            message["content"] = clean(message["content"])
        contents = [m["content"] for m in example["messages"]]
        for key in pairs.PAIR_KEYS if pairs.is_pair(example) else ():
            example[key] = clean(example[key])
            contents.append(example[key])
    size = sum(len(c) for c in contents)
    if not all(contents):
        return "empty_after_cleaning", size
    if size < cfg.min_chars:
        return "too_short_chars", size
    if cfg.max_chars and size > cfg.max_chars:
        return "too_long_chars", size
    return "", size


def record_of(example: dict[str, Any]) -> dict[str, Any]:
    """The example's content without bookkeeping fields (for dead letters and eval records)."""
    if "text" in example:
        return {"text": example["text"]}
    if pairs.is_pair(example):
        return pairs.record_of(example)
    if prompt_records.is_prompt(example):
        return prompt_records.record_of(example)
    messages = example["messages"]
    if len(messages) == 2 and messages[0]["role"] == "user":
        return {"prompt": messages[0]["content"], "response": messages[1]["content"]}
    last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return {"messages": messages, "prompt": last_user, "response": messages[-1]["content"]}


# ------------------------------------------------------------------------------------------ dedup


def content_key(parts: str | list[dict[str, str]]) -> bytes:
    """Bytes that identify a text or a list of messages exactly (the input of the hashes below).

    Roles and contents joined by the ASCII unit and record separators, which clean_text removes
    from every content, so the joining is unambiguous; 15x cheaper than a JSON encoding.
    """
    if isinstance(parts, str):
        return parts.encode()
    return "\x1e".join(f"{m['role']}\x1f{m['content']}" for m in parts).encode()


HASH_CHARS = 64
"""Length of a content hash (a SHA-256 hex digest)."""


def content_hash(example: dict[str, Any]) -> str:
    """sha256 of the example's content (not its source), the exact-duplicate key; a pair's
    responses count as two last turns of roles `chosen` and `rejected`."""
    content = example["text"] if "text" in example else example["messages"]
    if prompt_records.is_prompt(example):
        content = prompt_records.hash_key(example)
    if pairs.is_pair(example):
        content = [*content, *({"role": k, "content": example[k]} for k in pairs.PAIR_KEYS)]
    return hashlib.sha256(content_key(content)).hexdigest()


def source_order(source: str) -> tuple[str, int]:
    """Sort key of a record's source ("path:line"): the lowest copy of a duplicate is kept, so
    reruns keep the same copy whatever the runner's order."""
    path, _, line = source.rpartition(":")
    return (path, int(line)) if line.isdigit() else (source, 0)


# ------------------------------------------------------------------------------------------ split


def split_of(example: dict[str, Any], eval_fraction: float, seed: str) -> str:
    """ "eval" for a deterministic `eval_fraction` of examples, by a salted hash of the prompt.

    Hashing the prompt (the conversation before the final answer) rather than the whole record
    keeps one prompt with two different answers on the same side of the split; a preference
    pair's prompt is all of its `messages`, so every pair of one prompt is on one side too.
    """
    if eval_fraction <= 0:
        return "train"
    if "text" in example:
        key = example["text"]
    else:
        whole = pairs.is_pair(example) or prompt_records.is_prompt(example)
        key = example["messages"] if whole else example["messages"][:-1]
    digest = hashlib.sha256(seed.encode() + b"\x00")
    digest.update(content_key(key))  # no copy of the key to prepend the seed
    return "eval" if int.from_bytes(digest.digest()[:8], "big") / 2**64 < eval_fraction else "train"
