"""Fault: a damaged file in the latest checkpoint (issue 36, training).

A truncated shard or a deleted file in the newest complete checkpoint made every rank die with a
DCP (or JSON) traceback on resume, and `llmft train` had no better word for it. Now COMPLETE lists
the checkpoint's files and sizes: a checkpoint whose files differ, or that fails to load, is
passed over for the one before, said in the log, and demoted (so retention never keeps it in place
of a good one); when none is left the run stops with an error instead of restarting at step 0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft
from test_trainer_single import run_trainer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, small_dataset):
    """A run directory with complete checkpoints at steps 2 and 4 (copy it before damaging)."""
    run = tmp_path_factory.mktemp("ckpt") / "run"
    proc = run_trainer(
        tiny_model_dir, small_dataset, run, "--max-steps", "4", "--checkpoint-every", "2",
        "--keep-checkpoints", "3", "--export", "false", "--eval-at-end", "false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def _copy(run: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy, copy / "checkpoints" / "step-00000002", copy / "checkpoints" / "step-00000004"


def _largest_shard(checkpoint: Path) -> Path:
    return max(checkpoint.glob("*.distcp"), key=lambda p: p.stat().st_size)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _resumed_from(run: Path) -> int:
    attempts = sorted((run / "attempts").glob("attempt-*.json"))
    return json.loads(attempts[-1].read_text())["start_step"]


def test_complete_lists_the_files_of_the_checkpoint(two_checkpoints: Path):
    step4 = two_checkpoints / "checkpoints" / "step-00000004"
    listed = json.loads((step4 / "COMPLETE").read_text())
    assert listed["step"] == 4
    assert ".metadata" in listed["files"] and "trainer_state.json" in listed["files"]
    assert listed["files"]["rng/rank-00000.pt"] == (step4 / "rng" / "rank-00000.pt").stat().st_size


def test_truncated_file_in_the_latest_checkpoint_falls_back_to_the_one_before(
    tiny_model_dir: Path, small_dataset: Path, two_checkpoints: Path, tmp_path: Path
):
    run, _, step4 = _copy(two_checkpoints, tmp_path)
    shard = _largest_shard(step4)
    _truncate(shard)
    proc = run_trainer(
        tiny_model_dir, small_dataset, run, "--max-steps", "5", "--checkpoint-every", "2",
        "--keep-checkpoints", "1", "--export", "false", "--eval-at-end", "false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"checkpoint step 4 is damaged ({shard.name} has" in proc.stderr, proc.stderr[-3000:]
    assert "resuming from step 2" in proc.stderr, proc.stderr[-3000:]
    assert _resumed_from(run) == 2  # not 0, not the damaged 4
    # Step 4 was trained again and saved whole; with keep 1 only step 5 remains.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000005"]


def test_a_checkpoint_that_fails_to_load_is_passed_over(
    tiny_model_dir: Path, small_dataset: Path, two_checkpoints: Path, tmp_path: Path
):
    """A checkpoint written before COMPLETE listed files ("step 4"): the damage shows only when
    DCP loads it; every rank then falls back together and the checkpoint is demoted."""
    run, _, step4 = _copy(two_checkpoints, tmp_path)
    (step4 / "COMPLETE").write_text("step 4\n")
    _truncate(_largest_shard(step4))
    proc = run_trainer(
        tiny_model_dir, small_dataset, run, "--max-steps", "3", "--export", "false",
        "--eval-at-end", "false", "--checkpoint-at-end", "false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step-00000004 does not load" in proc.stderr, proc.stderr[-3000:]
    assert "resuming from step 2" in proc.stderr, proc.stderr[-3000:]
    assert _resumed_from(run) == 2
    assert not (step4 / "COMPLETE").exists()  # demoted: never resumed from, nor kept
    assert "PytorchStreamReader failed" in (step4 / "DAMAGED").read_text()  # DCP's own reason


def test_no_intact_checkpoint_stops_before_starting_instead_of_restarting_at_step_0(
    tiny_model_dir: Path, small_dataset: Path, two_checkpoints: Path, tmp_path: Path
):
    run, step2, step4 = _copy(two_checkpoints, tmp_path)
    (step4 / ".metadata").unlink()  # a missing file in the latest
    _truncate(step2 / "trainer_state.json")  # and a truncated one in the one before
    result = llmft(
        "train", "--model", str(tiny_model_dir), "--data", str(small_dataset),
        "--output", str(run), "--max-steps", "6", "--rdzv-backend", "c10d",
    )  # fmt: skip
    assert_user_error(
        result, "can be resumed", "step 4 (.metadata missing)", "step 2 (trainer_state.json has",
        "--overwrite",
    )  # fmt: skip
    assert result.output.count("error:") == 1, result.output
    assert not (run / "logs").exists()  # no agent was started

    # The trainer itself (a cloud job) refuses too, on every rank, without a traceback.
    proc = run_trainer(tiny_model_dir, small_dataset, run, "--max-steps", "6")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "error: no checkpoint under" in proc.stderr
    assert (step4 / "COMPLETE").exists()  # nothing demoted, deleted or overwritten
