"""Faults: a full disk on the write paths round 2 left out (issue 51, round 3).

Round 2 covered the packed shards, a checkpoint and the export (tests/faults/test_environment.py).
Here: the first writes of a training run (its attempt record, the launcher's node logs), the
evaluation's three files, and preprocessing's dead letters (rejected/ and filtered/). Each stops
with exit 1 and one `error:` line naming the disk and its free space, no traceback, and nothing
that looks complete. The disk is a real small tmpfs (root only; skipped with the reason elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults.conftest import error_lines, hidden_entries, llmft_process

pytestmark = pytest.mark.integration


def _stopped_naming_the_disk(result, disk: Path) -> str:
    assert result.returncode == 1, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    errors = error_lines(result.output)
    assert len(errors) == 1, result.output[-3000:]
    assert "no space left" in errors[0] and f"the disk mounted at {disk}" in errors[0], errors
    assert "MB free of" in errors[0], errors
    return errors[0]


def test_full_disk_at_a_training_runs_first_writes(
    small_disk, tiny_model_dir: Path, small_dataset: Path
):
    """Room for the run's directories but not its attempt record and logs: was a trainer
    traceback, a launcher log thread's traceback and the CLI's OSError traceback."""
    disk = small_disk("16k")
    out = disk.root / "run"
    result = llmft_process(
        "train", "--model", str(tiny_model_dir), "--data", str(small_dataset),
        "--output", str(out), "--max-steps", "1", "--nodes", "1", "--rdzv-backend", "c10d",
    )  # fmt: skip
    _stopped_naming_the_disk(result, disk.root)
    assert not (out / "model").exists() and not (out / "summary.json").exists()


def test_full_disk_while_evaluating_leaves_no_half_written_evaluation(
    small_disk, tiny_model_dir: Path, small_dataset: Path
):
    """Was an OSError traceback, with a complete metrics.json beside an empty report.html."""
    disk = small_disk("4k")
    out = disk.root / "eval"
    result = llmft_process(
        "evaluate", "--base", str(tiny_model_dir), "--tuned", str(tiny_model_dir),
        "--data", str(small_dataset), "--output", str(out),
    )  # fmt: skip
    _stopped_naming_the_disk(result, disk.root)
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("dead_letters", ["rejected", "filtered"])
def test_full_disk_while_writing_dead_letters(
    dead_letters: str, small_disk, tiny_model_dir: Path, tmp_path: Path
):
    """Hundreds of 2 KB dead letters on a 256 KiB disk, written by the rejected/ and the
    filtered/ writers (round 2's case filled the disk with packed rows)."""
    records = tmp_path / "records.jsonl"
    good = [json.dumps({"prompt": f"q{i}", "response": f"a{i}"}) for i in range(20)]
    if dead_letters == "rejected":
        bad = ['{"prompt": "' + "x" * 2000 + str(i) for i in range(400)]  # cut-off JSON
        extra = []
    else:
        bad = [json.dumps({"prompt": "y" * 3000 + str(i), "response": "r"}) for i in range(300)]
        extra = ["--max-chars=100"]
    records.write_text("\n".join(good + bad) + "\n")
    disk = small_disk("256k")
    out = disk.root / "dataset"
    result = llmft_process(
        "preprocess", f"--input={records}", f"--output={out}", f"--tokenizer={tiny_model_dir}",
        "--seq-len=128", *extra,
    )  # fmt: skip
    _stopped_naming_the_disk(result, disk.root)
    assert not (out / "manifest.json").exists()
    assert hidden_entries(disk.root) == []


def test_the_disk_named_is_the_failing_files(tmp_path: Path):
    """An ENOSPC that names its file is reported on that file's disk and path (a log or a
    temporary file may be on another disk than the output)."""
    import errno

    from trainer import storage

    log = tmp_path / "logs" / "node0.log"
    exc = OSError(errno.ENOSPC, "No space left on device", str(log))
    error = storage.disk_error(exc, "/some/other/output")
    assert error is not None and f"while writing {log}" in str(error), error
