"""Evaluation inputs: packed eval rows (for loss) and prompt/response records (for generation).

The packed rows come from `trainer.packed_data.reader`, the trainer's reader too. The records are
the eval split's cleaned raw records that preprocessing writes to
`<dataset>/eval_records/part-*.jsonl`, or any JSONL file of the same shape (e.g. the sample
data's heldout.jsonl). A record is either `{"prompt": ..., "response": ...}` or
`{"messages": [{"role", "content"}, ...]}` whose last message is the assistant's reference answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainer import storage
from trainer.packed_data.format import EVAL_RECORDS_DIR, EVAL_SPLIT, Manifest, read_manifest
from trainer.packed_data.reader import PackedRows, read_split


@dataclass
class Example:
    """One held-out prompt with its reference answer."""

    messages: list[dict[str, str]]
    """The conversation up to (not including) the reference assistant turn."""
    reference: str
    prompt_text: str
    """The last user message, for display in the report."""


def load_manifest(dataset_dir: str) -> Manifest:
    """The dataset's manifest; ValueError when missing or when the eval split is empty."""
    manifest = read_manifest(dataset_dir)
    info = manifest.splits.get(EVAL_SPLIT)
    if info is None or info.rows == 0 or not info.shards:
        raise ValueError(
            f"the eval split of {dataset_dir!r} is empty: re-run `llmft preprocess` with a "
            "non-zero eval fraction (or more input records) so evaluation has data to score"
        )
    return manifest


def read_eval_rows(dataset_dir: str, manifest: Manifest, max_rows: int | None = None) -> PackedRows:
    """Up to `max_rows` packed eval rows, in shard order (deterministic)."""
    rows = read_split(dataset_dir, manifest, EVAL_SPLIT, max_rows)
    if not len(rows):
        raise ValueError(
            f"the eval shards of {dataset_dir!r} hold no rows although the manifest lists them: "
            "re-run `llmft preprocess`"
        )
    return rows


def _example(record: dict[str, Any], where: str) -> Example:
    if "messages" in record:
        messages = record["messages"]
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError(f"{where}: the last message must be the assistant's reference answer")
        context = [{"role": m["role"], "content": m["content"]} for m in messages[:-1]]
        users = [m["content"] for m in context if m["role"] == "user"]
        return Example(context, messages[-1]["content"], users[-1] if users else "")
    if "prompt" in record and "response" in record:
        prompt = str(record["prompt"])
        return Example([{"role": "user", "content": prompt}], str(record["response"]), prompt)
    raise ValueError(f"{where}: a record needs 'prompt' and 'response', or 'messages'")


def eval_record_files(dataset_dir: str, manifest: Manifest | None = None) -> list[str]:
    """The eval_records JSONL parts preprocessing wrote (may be none, e.g. for text data).

    The manifest's list wins; datasets from before it had one are globbed.
    """
    if manifest is not None and manifest.eval_records:
        return [storage.join(dataset_dir, rel) for rel in manifest.eval_records]
    return storage.glob(storage.join(dataset_dir, f"{EVAL_RECORDS_DIR}/part-*.jsonl"))


def read_examples(paths: list[str], max_examples: int) -> list[Example]:
    """The first `max_examples` records of the JSONL files, in order (deterministic)."""
    examples: list[Example] = []
    for path in paths:
        with storage.open(path, "r") as f:
            for number, line in enumerate(f, start=1):
                if len(examples) >= max_examples:
                    return examples
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
                examples.append(_example(record, where))
    return examples
