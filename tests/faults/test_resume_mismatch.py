"""Fault: a resume that ignored the model, and a run that wrote into its own base model (issue 37,
third bullet).

`llmft train --model B --output <a run dir made from model A>` silently resumed A's checkpoint and
exported A's weights under B's name; `--model run/model --output run` overwrote the base model's own
weights. Now both are refused before anything starts (exit 2, one `error:` line with the way out),
and the trainer itself refuses another run's checkpoint (for the cloud paths, which have no CLI).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft
from test_trainer_single import run_trainer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _digest(directory: Path) -> str:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()


def test_resume_refuses_another_model_and_never_writes_into_the_model(
    tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    run = tmp_path / "run"
    first = run_trainer(tiny_model_dir, small_dataset, run, "--max-steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (run / "checkpoints" / "step-00000002" / "COMPLETE").is_file()
    assert (run / "model" / "config.json").is_file()

    # Another model into the same run directory: refused before any process starts.
    model_b = tmp_path / "model_b"
    shutil.copytree(tiny_model_dir, model_b)
    result = llmft(
        "train", "--model", str(model_b), "--data", str(small_dataset),
        "--output", str(run), "--max-steps", "4", "--rdzv-backend", "c10d",
    )  # fmt: skip
    assert_user_error(result, "holds a checkpoint (step 2) of another run", "model", "--overwrite")
    assert not (run / "logs").exists()  # no torchrun agent was started

    # The trainer itself refuses too (what a cloud job, which has no preflight here, runs).
    second = run_trainer(model_b, small_dataset, run, "--max-steps", "4")
    assert second.returncode != 0
    assert "holds a checkpoint (step 2) of another run" in second.stderr

    # The exported model as the base of a run into its own parent: refused, the weights intact.
    before = _digest(run / "model")
    result = llmft(
        "train", "--model", str(run / "model"), "--data", str(small_dataset),
        "--output", str(run), "--max-steps", "2", "--rdzv-backend", "c10d",
    )  # fmt: skip
    assert_user_error(result, "would write into the base model")
    assert _digest(run / "model") == before


def test_overwrite_is_the_way_out(tiny_model_dir: Path, tmp_path: Path, small_dataset: Path):
    """`--overwrite` passes the preflight and deletes only the checkpoints (checked without
    training again: the preflight and the deletion are what `llmft train --overwrite` adds)."""
    from components.preflight.launch_checks import preflight
    from trainer.config import TrainConfig

    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000002").mkdir(parents=True)
    (run / "checkpoints" / "step-00000002" / "COMPLETE").write_text("step 2\n")
    (run / "checkpoints" / "step-00000002" / "trainer_state.json").write_text(
        '{"step": 2, "position": {}, "config": {"model": "/elsewhere/model-a"}}'
    )
    config = TrainConfig(model=str(tiny_model_dir), data=str(small_dataset), output=str(run))
    with pytest.raises(ValueError, match="model '/elsewhere/model-a' there"):
        preflight(config, local=True)
    preflight(config, local=True, overwrite=True)
