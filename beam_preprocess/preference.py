"""Preference datasets on one machine: `write_dataset` (in memory, no Beam) and the command line.

`python -m beam_preprocess.preference --input pairs.jsonl --output DIR --tokenizer PATH --seq-len N
[--eval-fraction 0.05] [any other flag of python -m beam_preprocess]` runs the Beam pipeline with
`--data-kind preference` (validation, cleaning, dead letters, deduplication, the prompt-hash split,
packing: docs/preprocess.md). `write_dataset` tokenizes, packs and writes records that are already
clean and split, in this process, with the same functions (beam_preprocess/pairs.py): the same
rows as the Beam graph for the same records in the same order (tests/test_preference_beam.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from beam_preprocess.pairs import (
    PairError,
    pack_pairs,
    row_of,
    split_stats,
    table_of,
    tokenize_pair,
)
from beam_preprocess.records import TOO_LONG
from beam_preprocess.tokenize import pad_id_of
from trainer.packed_data.format import (
    PARQUET_WRITE_OPTIONS,
    PREFERENCE_KIND,
    Manifest,
    SplitInfo,
    TokenizerIdentity,
)


def write_dataset(
    out_dir: str | Path,
    tokenizer: Any,
    records: dict[str, list[dict[str, Any]]],
    seq_len: int,
    rows_per_shard: int = 1024,
) -> Manifest:
    """Tokenize, pack and write `records` ({split: [preference records]}, already clean and
    split) as a packed dataset, in memory: the rows the Beam graph writes for the same records
    in the same order (tests/test_preference_beam.py), without its cleaning, deduplication and
    split.

    Records that cannot become a pair, or whose pair exceeds seq_len, are counted by reason in
    the manifest's stats (filtered / rejected, as stats.json counts them) and written to
    rejected/part-00000.jsonl.
    """
    import pyarrow.parquet as pq

    out = Path(out_dir)
    pad_id = pad_id_of(tokenizer)
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
                filtered[TOO_LONG] = filtered.get(TOO_LONG, 0) + 1
                continue
            pairs.append(pair)
        rows = [row_of(r, seq_len, pad_id) for r in pack_pairs(pairs, seq_len)]
        info = SplitInfo(*split_stats(pairs, rows))
        (out / split).mkdir(parents=True, exist_ok=True)
        for n, lo in enumerate(range(0, max(len(rows), 1), rows_per_shard)):
            rel = f"{split}/part-{n:05d}.parquet"
            pq.write_table(
                table_of(rows[lo : lo + rows_per_shard]), out / rel, **PARQUET_WRITE_OPTIONS
            )
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
            "filtered": sum(filtered.values()),
            "filtered_by_reason": filtered,
            "duplicates": 0,
            "rejected": len(dead),
            "rejected_by_reason": rejected,
        },
        files=files,
    )
    (out / "manifest.json").write_text(manifest.to_json())
    return manifest


def main(argv: list[str] | None = None) -> int:
    """`python -m beam_preprocess.preference`: pairs -> a packed dataset, through the Beam
    pipeline (`python -m beam_preprocess --data-kind preference`); its other flags pass on."""
    # apache_beam: beam_preprocess.cli takes 3.9 s to import after this module (min of 3,
    # shared 2-core machine); write_dataset, the tests' in-process writer, stays Beam-free
    from beam_preprocess.cli import main as beam_main

    args = list(sys.argv[1:] if argv is None else argv)
    return beam_main([*args, "--data-kind=preference"])


if __name__ == "__main__":
    sys.exit(main())
