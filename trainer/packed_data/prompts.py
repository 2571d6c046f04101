"""Prompt datasets (`data_kind` "prompts", objective grpo): one Parquet row per prompt record.

    table = prompt_table([(record, prompt_tokens), ...])     # what Beam (and tests) write
    records = read_prompts(data_dir, manifest, "train")      # what the trainer and evaluation read

A record is a dict: "prompt" (text, or chat messages [{role, content}]) and every other column of
the input unchanged; the reward functions receive those columns (trainer/grpo/rewards.py). No
torch, no Beam: neutral ground like the rest of trainer/packed_data.
"""

from __future__ import annotations

import json
from typing import Any

from trainer import storage
from trainer.packed_data.format import (
    PARQUET_WRITE_OPTIONS,
    PROMPTS_KIND,
    Manifest,
    table_schema,
)

PROMPT_KEY = "prompt"
"""The key of a record's prompt; every other key is a column the rewards read."""


def prompt_table(rows: list[tuple[dict[str, Any], int]]) -> Any:
    """(record, prompt tokens) pairs as one pyarrow Table of the prompt schema."""
    import pyarrow as pa

    schema = table_schema(PROMPTS_KIND)
    return pa.table(
        {
            "record": [json.dumps(r, ensure_ascii=False, sort_keys=True) for r, _ in rows],
            "prompt_tokens": [n for _, n in rows],
        },
        schema=schema,
    )


def write_prompt_shard(path: str, rows: list[tuple[dict[str, Any], int]]) -> None:
    """One shard file (tests and small in-memory writers; Beam writes through its sinks)."""
    import pyarrow.parquet as pq

    with storage.open(path, "wb") as f:
        pq.write_table(prompt_table(rows), f, **PARQUET_WRITE_OPTIONS)


def read_prompts(data_dir: str, manifest: Manifest, split: str) -> list[dict[str, Any]]:
    """The records of `split`, in shard order (an empty list when the split has none)."""
    import pyarrow.parquet as pq

    if manifest.data_kind != PROMPTS_KIND:
        raise ValueError(
            f"{data_dir} holds {manifest.data_kind} data, not prompts: preprocess the prompt "
            "records with data_kind=prompts"
        )
    info = manifest.splits.get(split)
    records: list[dict[str, Any]] = []
    for shard in info.shards if info else []:
        with storage.open(f"{data_dir.rstrip('/')}/{shard}", "rb") as f:
            table = pq.read_table(f, columns=["record"])
        records += [json.loads(text) for text in table.column("record").to_pylist()]
    return records


def columns_of(record: dict[str, Any]) -> dict[str, Any]:
    """The record's columns besides its prompt."""
    return {k: v for k, v in record.items() if k != PROMPT_KEY}
