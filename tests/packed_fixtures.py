"""Write small packed datasets per trainer/packed_data/format.py, for trainer tests and benchmarks.

A stand-in for `llmft preprocess` that needs no Beam: tokenize prompt/response records with the
chat template, greedily pack documents into rows of exactly seq_len tokens, write Parquet shards
and a manifest. The trainer reads it exactly as it reads the real thing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.packed_data.format import (
    PARQUET_WRITE_OPTIONS,
    Manifest,
    SplitInfo,
    TokenizerIdentity,
)


def tokenize_record(tokenizer: Any, record: dict[str, str]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one conversation: only the assistant's response is a target."""
    user = [{"role": "user", "content": record["prompt"]}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True)
    full = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": record["response"]}], tokenize=True
    )
    prompt, full = _ids(prompt), _ids(full)
    assert full[: len(prompt)] == prompt, "chat template prompt is not a prefix of the conversation"
    return full, [0] * len(prompt) + [1] * (len(full) - len(prompt))


def _ids(encoded: Any) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    return list(encoded)


def pack(
    documents: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int
) -> list[dict[str, list[int]]]:
    """Greedy first-fit-in-order packing; documents longer than seq_len are truncated."""
    rows: list[dict[str, list[int]]] = []
    current: dict[str, list[int]] = {"input_ids": [], "loss_mask": [], "position_ids": []}

    def flush() -> None:
        free = seq_len - len(current["input_ids"])
        current["input_ids"] += [pad_id] * free
        current["loss_mask"] += [0] * free
        current["position_ids"] += list(range(free))
        rows.append(dict(current))
        current.update(input_ids=[], loss_mask=[], position_ids=[])

    for ids, mask in documents:
        ids, mask = ids[:seq_len], mask[:seq_len]
        if len(current["input_ids"]) + len(ids) > seq_len:
            flush()
        current["input_ids"] += ids
        current["loss_mask"] += [0, *mask[1:]]  # the first token has no predecessor
        current["position_ids"] += list(range(len(ids)))
    if current["input_ids"]:
        flush()
    return rows


def write_packed_dataset(
    out_dir: str | Path,
    tokenizer: Any,
    records: dict[str, list[dict[str, str]]],
    seq_len: int,
    rows_per_shard: int = 64,
) -> Manifest:
    """Tokenize, pack and write `records` ({split: [{"prompt", "response"}]}) as a dataset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    splits = {}
    for split, recs in records.items():
        docs = [tokenize_record(tokenizer, r) for r in recs]
        rows = pack(docs, seq_len, tokenizer.pad_token_id)
        info = SplitInfo(
            rows=len(rows),
            documents=len(docs),
            tokens=sum(len(ids[:seq_len]) for ids, _ in docs),
            target_tokens=sum(sum(r["loss_mask"]) for r in rows),
        )
        (out / split).mkdir(parents=True, exist_ok=True)
        for n, lo in enumerate(range(0, len(rows), rows_per_shard)):
            chunk = rows[lo : lo + rows_per_shard]
            table = pa.table({col: [r[col] for r in chunk] for col in chunk[0]})
            rel = f"{split}/part-{n:05d}.parquet"
            pq.write_table(table, out / rel, **PARQUET_WRITE_OPTIONS)
            info.shards.append(rel)
        splits[split] = info
    manifest = Manifest(
        seq_len=seq_len,
        tokenizer=TokenizerIdentity.of(tokenizer),
        data_kind="instruction",
        splits=splits,
        stats={"records_read": sum(len(r) for r in records.values()), "source": "packed_fixtures"},
    )
    (out / "manifest.json").write_text(manifest.to_json())
    return manifest


def read_jsonl(path: str | Path, limit: int | None = None) -> list[dict[str, str]]:
    lines = Path(path).read_text().splitlines()[:limit]
    return [json.loads(line) for line in lines]
