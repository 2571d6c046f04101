"""The pipeline's steps as named composite PTransforms (parse -> validate -> clean -> dedup ->
split -> tokenize -> pack). Each step sends what it removes to a tagged output with a reason and
emits one OUTCOME event per record it decides on, so the run can prove nothing was lost.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from beam_preprocess.options import PreprocessConfig
from beam_preprocess.packing import (
    Document,
    PackedRows,
    WindowPacker,
    pack_best,
    rows_from_bins,
)
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
                dead_letter(example["source"], _record_of(example), reason, f"{size} chars"),
            )
            yield pvalue.TaggedOutput(OUTCOME, outcome("filtered", reason))
            return
        yield example


def _record_of(example: dict[str, Any]) -> dict[str, Any]:
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
                    example["source"], _record_of(example), result.reason, result.error
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
                yield pvalue.TaggedOutput(EVAL_RECORDS, _record_of(example))
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


def rows_to_table(rows: PackedRows) -> Any:
    """PackedRows -> pyarrow Table with the contract's COLUMNS as list<int32> (no Python loop)."""
    import pyarrow as pa

    from trainer.packed_data.format import COLUMNS

    offsets = pa.array(np.arange(0, rows.rows + 1, dtype=np.int32) * rows.input_ids.shape[1])
    arrays = []
    for name in COLUMNS:
        values = pa.array(getattr(rows, name).reshape(-1).astype(np.int32, copy=False))
        arrays.append(pa.ListArray.from_arrays(offsets, values))
    return pa.Table.from_arrays(arrays, schema=table_schema())


def table_schema() -> Any:
    import pyarrow as pa

    from trainer.packed_data.format import COLUMNS

    return pa.schema([(name, pa.list_(pa.int32())) for name in COLUMNS])


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
