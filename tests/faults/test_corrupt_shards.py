"""Fault: a packed dataset whose Parquet shard was damaged after it was written (issue 36,
training).

A shard with bytes overwritten in place trained on wrong token ids without a word (the pages are
uncompressed), or died in every worker with a pyarrow traceback; a truncated or missing shard gave
a traceback from every worker. Now every shard writer sets page checksums, the reader verifies
them and names the shard, and `llmft train` checks every shard (all pages, locally) before any
agent starts: exit 2, one `error:` line naming the shard.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft
from test_trainer_single import run_trainer

from faults.conftest import instruction_rows, preprocess

pytestmark = pytest.mark.integration


def _overwrite_middle(path: Path) -> None:
    """Overwrite 16 bytes in the middle of the first column chunk: token ids of a data page
    (same size, footer intact: only page checksums can tell)."""
    import pyarrow.parquet as pq

    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    at = chunk.data_page_offset + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[at : at + 16] = bytes(16) if any(data[at : at + 16]) else b"\x07" * 16
    path.write_bytes(bytes(data))


def _damaged_copy(dataset: Path, tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A copy of `dataset` whose first train shard is damaged `how`; (copy, that shard)."""
    copy = tmp_path / f"data-{how}"
    shutil.copytree(dataset, copy)
    shard = copy / "train" / "part-00000.parquet"
    if how == "overwritten":
        _overwrite_middle(shard)
    elif how == "truncated":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    else:
        shard.unlink()
    return copy, shard


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("overwritten", "CRC checksum verification failed"),
        ("truncated", "magic bytes not found"),
        ("missing", "is missing"),
    ],
)
def test_llmft_train_names_a_damaged_shard_before_starting(
    tiny_model_dir: Path, small_dataset: Path, tmp_path: Path, how: str, reason: str
):
    data, shard = _damaged_copy(small_dataset, tmp_path, how)
    out = tmp_path / "run"
    result = llmft(
        "train", "--model", str(tiny_model_dir), "--data", str(data), "--output", str(out),
        "--max-steps", "2", "--rdzv-backend", "c10d",
    )  # fmt: skip
    assert_user_error(result, f"shard {shard}", reason, "re-run `llmft preprocess`")
    assert result.output.count("error:") == 1, result.output
    assert not out.exists()  # no agent started, nothing written (not even the lock's directory)


def test_the_trainer_itself_stops_on_a_damaged_shard_without_a_traceback(
    tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    """What a cloud job (no local preflight) runs: every rank stops with one `error:` line."""
    data, shard = _damaged_copy(small_dataset, tmp_path, "overwritten")
    proc = run_trainer(tiny_model_dir, data, tmp_path / "run", "--max-steps", "2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"shard {shard} is damaged" in errors[0], errors
    assert not (tmp_path / "run" / "model").exists()


@pytest.mark.slow
def test_preprocess_writes_shards_whose_damage_is_detected(tiny_model_dir: Path, tmp_path: Path):
    """The real writer (Beam's sink) sets page checksums: an overwritten page of its shard is
    found by the check `llmft train` runs, naming the shard."""
    import json

    from trainer.packed_data.format import read_manifest
    from trainer.packed_data.reader import shard_problems

    records = tmp_path / "train.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in instruction_rows(60, "crc")))
    out = tmp_path / "dataset"
    preprocess([records], out, tiny_model_dir)
    manifest = read_manifest(str(out))
    assert shard_problems(str(out), manifest, read_pages=True) == []
    import pyarrow.parquet as pq

    shards = [out / rel for rel in manifest.splits["train"].shards]
    shard = next(p for p in shards if pq.ParquetFile(p).metadata.num_rows)  # some are empty
    _overwrite_middle(shard)
    problems = shard_problems(str(out), manifest, read_pages=True)
    assert len(problems) == 1 and f"shard {shard} is damaged" in problems[0], problems
    assert "CRC checksum verification failed" in problems[0]
