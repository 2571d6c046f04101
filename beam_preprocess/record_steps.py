"""Records -> clean, unique examples with their split: the steps before tokenization.

Named composite PTransforms (validate -> clean -> dedup -> split). Each step sends what it removes
to a tagged output with a reason and emits OUTCOME events ((event, count)) for the records it
decides on, so the run can prove nothing was lost (beam_preprocess.stats).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from beam_preprocess.options import PreprocessConfig
from beam_preprocess.records import DEAD, FILTERED, OUTCOME, dead_letter, outcome

ROLES = ("system", "user", "assistant", "tool")


def _counter(name: str) -> Any:
    return Metrics.counter("llmft", name)


# ---------------------------------------------------------------------------------------- validate


class ValidateFn(beam.DoFn):
    """Raw record -> example with the configured fields, or a dead letter saying what is wrong."""

    def __init__(self, config: PreprocessConfig) -> None:
        self.config = config

    def setup(self) -> None:
        self.rejected: dict[str, Any] = {}

    def process(self, element: dict[str, Any]) -> Iterator[Any]:
        source, record = element["source"], element["record"]
        try:
            example = self._example(record)
        except _Invalid as exc:
            reason, message = exc.args
            if reason not in self.rejected:
                self.rejected[reason] = _counter(f"rejected_{reason}")
            self.rejected[reason].inc()
            yield pvalue.TaggedOutput(DEAD, dead_letter(source, record, reason, message))
            yield pvalue.TaggedOutput(OUTCOME, outcome("rejected", reason))
            return
        example["source"] = source
        yield example

    def _example(self, record: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        if cfg.data_kind == "text":
            return {"text": _required_text(record, cfg.text_field)}
        messages = record.get(cfg.messages_field)
        if messages is not None:
            return {"messages": _valid_messages(messages, cfg.messages_field)}
        prompt = _required_text(record, cfg.prompt_field)
        response = _required_text(record, cfg.response_field)
        return {
            "messages": [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": response},
            ]
        }


class _Invalid(Exception):
    """(reason, message) of a record that fails validation."""


def _required_text(record: dict[str, Any], name: str) -> str:
    if name not in record or record[name] is None:
        raise _Invalid("missing_field", f"field {name!r} is missing")
    value = record[name]
    if not isinstance(value, str):
        raise _Invalid("invalid_field_type", f"field {name!r} is {type(value).__name__}, not text")
    if not value.strip():
        raise _Invalid("empty_field", f"field {name!r} is empty")
    return value


def _valid_messages(messages: Any, name: str) -> list[dict[str, str]]:
    if isinstance(messages, str):  # CSV cells and some exports hold the conversation as JSON text
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            raise _Invalid(
                "invalid_messages", f"field {name!r} is not a JSON list: {exc}"
            ) from None
    if not isinstance(messages, list) or not messages:
        raise _Invalid("invalid_messages", f"field {name!r} must be a non-empty list of messages")
    clean = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _Invalid("invalid_messages", f"{name}[{i}] is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _Invalid("invalid_messages", f"{name}[{i}].role {role!r} is not one of {ROLES}")
        if not isinstance(content, str) or not content.strip():
            raise _Invalid("empty_field", f"{name}[{i}].content is missing or empty")
        clean.append({"role": role, "content": content})
    if clean[-1]["role"] != "assistant":
        raise _Invalid("invalid_messages", f"the last message of {name!r} must be the assistant's")
    if not any(m["role"] == "user" for m in clean):
        raise _Invalid("invalid_messages", f"{name!r} has no user message")
    return clean


class Validate(beam.PTransform):
    """Records -> examples; tagged DEAD (rejected/) and OUTCOME."""

    def __init__(self, config: PreprocessConfig) -> None:
        super().__init__()
        self.config = config

    def expand(self, records: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        return records | "Check" >> beam.ParDo(ValidateFn(self.config)).with_outputs(
            DEAD, OUTCOME, main="examples"
        )


# ------------------------------------------------------------------------------------------ clean

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACES = re.compile(r"[ \t]+")


def clean_text(text: str, normalization: str = "NFC", collapse_whitespace: bool = False) -> str:
    """Unicode-normalise, unify newlines, drop control characters and trim (optionally collapse)."""
    if normalization != "none":
        text = unicodedata.normalize(normalization, text)  # type: ignore[arg-type]
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    if collapse_whitespace:
        text = _SPACES.sub(" ", text)
    return text.strip()


class CleanFn(beam.DoFn):
    def __init__(self, config: PreprocessConfig) -> None:
        self.config = config

    def process(self, example: dict[str, Any]) -> Iterator[Any]:
        cfg = self.config

        def clean(text: str) -> str:
            return clean_text(text, cfg.normalization, cfg.collapse_whitespace)

        if "text" in example:
            example = {**example, "text": clean(example["text"])}
            contents = [example["text"]]
        else:
            messages = [{**m, "content": clean(m["content"])} for m in example["messages"]]
            example = {**example, "messages": messages}
            contents = [m["content"] for m in messages]
        size = sum(len(c) for c in contents)
        reason = ""
        if not all(contents):
            reason = "empty_after_cleaning"
        elif size < cfg.min_chars:
            reason = "too_short_chars"
        elif cfg.max_chars and size > cfg.max_chars:
            reason = "too_long_chars"
        if reason:
            _counter(f"filtered_{reason}").inc()
            yield pvalue.TaggedOutput(
                FILTERED,
                dead_letter(example["source"], record_of(example), reason, f"{size} chars"),
            )
            yield pvalue.TaggedOutput(OUTCOME, outcome("filtered", reason))
            return
        yield example


def record_of(example: dict[str, Any]) -> dict[str, Any]:
    """The example's content without bookkeeping fields (for dead letters and eval records)."""
    if "text" in example:
        return {"text": example["text"]}
    messages = example["messages"]
    if len(messages) == 2 and messages[0]["role"] == "user":
        return {"prompt": messages[0]["content"], "response": messages[1]["content"]}
    last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return {"messages": messages, "prompt": last_user, "response": messages[-1]["content"]}


class Clean(beam.PTransform):
    """Normalise text and filter by length in characters; tagged FILTERED and OUTCOME."""

    def __init__(self, config: PreprocessConfig) -> None:
        super().__init__()
        self.config = config

    def expand(self, examples: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        return examples | "Normalize" >> beam.ParDo(CleanFn(self.config)).with_outputs(
            FILTERED, OUTCOME, main="examples"
        )


# ------------------------------------------------------------------------------------------ dedup


def content_hash(example: dict[str, Any]) -> str:
    """sha256 of the example's content (not its source), the exact-duplicate key."""
    content = example["text"] if "text" in example else example["messages"]
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()


def _keep_first(element: tuple[str, Iterable[dict[str, Any]]]) -> Iterator[Any]:
    digest, group = element
    # The lowest source (file, line) wins, so reruns keep the same copy whatever the runner's order.
    examples = sorted(group, key=lambda e: _source_order(e["source"]))
    kept = {**examples[0], "hash": digest}
    yield kept
    if len(examples) > 1:
        _counter("duplicates").inc(len(examples) - 1)
        yield pvalue.TaggedOutput(OUTCOME, outcome("duplicate", count=len(examples) - 1))


def _source_order(source: str) -> tuple[str, int]:
    path, _, line = source.rpartition(":")
    return (path, int(line)) if line.isdigit() else (source, 0)


class Deduplicate(beam.PTransform):
    """Exact deduplication by content hash; duplicates only leave an OUTCOME event."""

    def expand(self, examples: pvalue.PCollection) -> pvalue.DoOutputsTuple:
        return (
            examples
            | "KeyByContent" >> beam.Map(lambda e: (content_hash(e), e))
            | "GroupByContent" >> beam.GroupByKey()
            | "KeepFirst" >> beam.FlatMap(_keep_first).with_outputs(OUTCOME, main="examples")
        )


# ------------------------------------------------------------------------------------------ split


def split_of(example: dict[str, Any], eval_fraction: float, seed: str) -> str:
    """ "eval" for a deterministic `eval_fraction` of examples, by a salted hash of the prompt.

    Hashing the prompt (the conversation before the final answer) rather than the whole record
    keeps one prompt with two different answers on the same side of the split.
    """
    if eval_fraction <= 0:
        return "train"
    key = example["text"] if "text" in example else example["messages"][:-1]
    digest = hashlib.sha256((seed + "\x00" + json.dumps(key, ensure_ascii=False)).encode())
    return "eval" if int.from_bytes(digest.digest()[:8], "big") / 2**64 < eval_fraction else "train"


class Split(beam.PTransform):
    """Tags each example with its split ("train" or "eval")."""

    def __init__(self, eval_fraction: float, seed: str) -> None:
        super().__init__()
        self.eval_fraction, self.seed = eval_fraction, seed

    def expand(self, examples: pvalue.PCollection) -> pvalue.PCollection:
        fraction, seed = self.eval_fraction, self.seed
        return examples | "AssignSplit" >> beam.Map(
            lambda e: {**e, "split": split_of(e, fraction, seed)}
        )
