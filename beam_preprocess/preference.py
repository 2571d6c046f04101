"""Preference pairs -> packed rows for DPO (no Beam, no torch).

Accepted records (JSON objects; the shapes TRL's preference datasets use):

    {"prompt": "...", "chosen": "...", "rejected": "..."}                  a single-turn pair
    {"prompt": [messages], "chosen": [messages], "rejected": [messages]}    conversational, the
                                                                             responses one
                                                                             assistant message
    {"chosen": [messages], "rejected": [messages]}                          chat pairs: the same
                                                                             history, a different
                                                                             last assistant turn

Each side is rendered with the tokenizer's chat template exactly as for instruction data: the
prompt is `apply_chat_template(history, add_generation_prompt=True)` and the response's tokens
(what the conversation adds after it, end-of-turn included) are the only targets. A pair is
packed whole into one row, chosen then rejected, each a document of its own (positions restart,
the first token is no target) and tagged in the `pair_ids` column (2k+1 chosen, 2k+2 rejected for
the row's k-th pair; trainer/packed_data/format.py). Pairs longer than seq_len together are
filtered (reason "too_long_tokens"): truncating one side would bias its log-probability.

Packing is first-fit decreasing over pair lengths (deterministic). `write_dataset` writes a packed
dataset (Parquet shards + manifest, `data_kind` "preference"); `python -m beam_preprocess.preference
--input F.jsonl --output DIR --tokenizer PATH --seq-len N [--eval-fraction 0.05]` runs it on a
JSONL file with a deterministic hash split. It is not part of the Beam graph (yet): preference
datasets are made on one machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.packed_data.format import (
    EVAL_FRACTION_DEFAULT,
    PAIR_COLUMN,
    PARQUET_WRITE_OPTIONS,
    PREFERENCE_KIND,
    Manifest,
    SplitInfo,
    TokenizerIdentity,
    row_columns,
    table_schema,
)

Document = tuple[list[int], list[int]]
"""(token ids, loss mask) of one rendered conversation."""


class PairError(ValueError):
    """A record that cannot become a pair; `reason` is the dead-letter reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Pair:
    chosen: Document
    rejected: Document

    def __len__(self) -> int:
        return len(self.chosen[0]) + len(self.rejected[0])


def normalize(record: dict[str, Any]) -> tuple[list[dict[str, str]], str, str]:
    """(history, chosen text, rejected text) of any accepted record shape (PairError if none)."""
    chosen, rejected = record.get("chosen"), record.get("rejected")
    prompt = record.get("prompt")
    if isinstance(chosen, str) and isinstance(rejected, str):
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}], chosen, rejected
        if isinstance(prompt, list):
            return list(prompt), chosen, rejected
    if isinstance(chosen, list) and isinstance(rejected, list) and chosen and rejected:
        history = list(prompt) if isinstance(prompt, list) else chosen[:-1]
        if not isinstance(prompt, list) and chosen[:-1] != rejected[:-1]:
            raise PairError("pair_history", "chosen and rejected differ before their last turn")
        last_chosen = chosen[-1] if not isinstance(prompt, list) else chosen[0]
        last_rejected = rejected[-1] if not isinstance(prompt, list) else rejected[0]
        for message in (last_chosen, last_rejected):
            if not isinstance(message, dict) or message.get("role") != "assistant":
                raise PairError("pair_shape", "the responses must be assistant messages")
        return history, str(last_chosen["content"]), str(last_rejected["content"])
    raise PairError(
        "pair_shape",
        'a preference record has "chosen" and "rejected" (strings with a "prompt", or message '
        "lists)",
    )


def _ids(encoded: Any) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    return [int(i) for i in encoded]


def render(tokenizer: Any, history: list[dict[str, str]], response: str) -> Document:
    """(ids, mask) of `history` + the assistant's `response`: only the response is a target."""
    if not response.strip():
        raise PairError("empty_response", "a response is empty")
    prompt = _ids(tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True))
    full = _ids(
        tokenizer.apply_chat_template(
            [*history, {"role": "assistant", "content": response}], tokenize=True
        )
    )
    if full[: len(prompt)] != prompt:
        raise PairError(
            "answer_boundary",
            "the chat template's generation prompt is not a token prefix of the conversation",
        )
    return full, [0] * len(prompt) + [1] * (len(full) - len(prompt))


def tokenize_pair(tokenizer: Any, record: dict[str, Any]) -> Pair:
    history, chosen, rejected = normalize(record)
    return Pair(render(tokenizer, history, chosen), render(tokenizer, history, rejected))


def pack_pairs(pairs: list[Pair], seq_len: int) -> list[list[Pair]]:
    """Rows of whole pairs: first-fit decreasing by length (ties in input order)."""
    order = sorted(range(len(pairs)), key=lambda i: (-len(pairs[i]), i))
    rows: list[list[Pair]] = []
    free: list[int] = []
    for i in order:
        need = len(pairs[i])
        if need > seq_len:
            raise ValueError(f"pair {i} has {need} tokens, more than seq_len={seq_len}")
        slot = next((j for j, room in enumerate(free) if room >= need), None)
        if slot is None:
            rows.append([])
            free.append(seq_len)
            slot = len(rows) - 1
        rows[slot].append(pairs[i])
        free[slot] -= need
    return rows


def row_of(pairs: list[Pair], seq_len: int, pad_id: int) -> dict[str, list[int]]:
    """One packed row (the preference columns) holding `pairs`, padded to seq_len."""
    row: dict[str, list[int]] = {name: [] for name in row_columns(PREFERENCE_KIND)}
    for k, pair in enumerate(pairs):
        for side, (ids, mask) in enumerate((pair.chosen, pair.rejected)):
            row["input_ids"] += ids
            row["loss_mask"] += [0, *mask[1:]]  # the first token has no predecessor
            row["position_ids"] += list(range(len(ids)))
            row[PAIR_COLUMN] += [2 * k + 1 + side] * len(ids)
    free = seq_len - len(row["input_ids"])
    row["input_ids"] += [pad_id] * free
    row["loss_mask"] += [0] * free
    row["position_ids"] += list(range(free))
    row[PAIR_COLUMN] += [0] * free
    return row


def split_of(record: dict[str, Any], eval_fraction: float) -> str:
    """Deterministic train/eval split by a hash of the record's content."""
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction else "train"


def write_dataset(
    out_dir: str | Path,
    tokenizer: Any,
    records: dict[str, list[dict[str, Any]]],
    seq_len: int,
    rows_per_shard: int = 1024,
) -> Manifest:
    """Tokenize, pack and write `records` ({split: [preference records]}) as a packed dataset.

    Records that cannot become a pair, or whose pair exceeds seq_len, are counted by reason in
    the manifest's stats (filtered / rejected) and written to rejected/part-00000.jsonl.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    splits: dict[str, SplitInfo] = {}
    filtered: dict[str, int] = {}
    dead: list[dict[str, Any]] = []
    files: list[str] = []
    for split, recs in records.items():
        pairs = []
        for record in recs:
            try:
                pair = tokenize_pair(tokenizer, record)
            except PairError as exc:
                dead.append({"record": record, "reason": exc.reason, "error": str(exc)})
                continue
            if len(pair) > seq_len:
                filtered["too_long_tokens"] = filtered.get("too_long_tokens", 0) + 1
                continue
            pairs.append(pair)
        rows = [row_of(r, seq_len, pad_id) for r in pack_pairs(pairs, seq_len)]
        info = SplitInfo(
            rows=len(rows),
            documents=2 * len(pairs),
            tokens=sum(len(p) for p in pairs),
            target_tokens=sum(sum(r["loss_mask"]) for r in rows),
        )
        (out / split).mkdir(parents=True, exist_ok=True)
        schema = table_schema(PREFERENCE_KIND)
        for n, lo in enumerate(range(0, max(len(rows), 1), rows_per_shard)):
            chunk = rows[lo : lo + rows_per_shard]
            table = pa.table({c: [r[c] for r in chunk] for c in schema.names}, schema=schema)
            rel = f"{split}/part-{n:05d}.parquet"
            pq.write_table(table, out / rel, **PARQUET_WRITE_OPTIONS)
            info.shards.append(rel)
        files += info.shards
        splits[split] = info
    if dead:
        (out / "rejected").mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"source": "preference", **d}) for d in dead]
        (out / "rejected/part-00000.jsonl").write_text("\n".join(lines) + "\n")
        files.append("rejected/part-00000.jsonl")
    read = sum(len(r) for r in records.values())
    rejected: dict[str, int] = {}
    for d in dead:
        rejected[d["reason"]] = rejected.get(d["reason"], 0) + 1
    manifest = Manifest(
        seq_len=seq_len,
        tokenizer=TokenizerIdentity.of(tokenizer),
        data_kind=PREFERENCE_KIND,
        splits=splits,
        stats={
            "records_read": read,
            "kept": read - len(dead) - sum(filtered.values()),
            "filtered": filtered,
            "duplicates": 0,
            "rejected": len(dead),
            "rejected_by_reason": rejected,
        },
        files=files,
    )
    (out / "manifest.json").write_text(manifest.to_json())
    return manifest


def main(argv: list[str] | None = None) -> int:
    """`python -m beam_preprocess.preference`: a JSONL file of pairs -> a packed dataset."""
    parser = argparse.ArgumentParser(prog="python -m beam_preprocess.preference")
    parser.add_argument("--input", required=True, help="JSONL file of preference records")
    parser.add_argument("--output", required=True, help="dataset directory to write")
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory or hub name")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--eval-fraction", type=float, default=EVAL_FRACTION_DEFAULT)
    args = parser.parse_args(argv)
    from beam_preprocess.tokenize import load_tokenizer

    try:
        tokenizer = load_tokenizer(args.tokenizer)
        lines = Path(args.input).read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    by_split: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for record in records:
        by_split[split_of(record, args.eval_fraction)].append(record)
    manifest = write_dataset(args.output, tokenizer, by_split, args.seq_len)
    print(json.dumps({k: v.rows for k, v in manifest.splits.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
