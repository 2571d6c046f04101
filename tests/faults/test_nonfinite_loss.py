"""Fault: a loss that becomes NaN mid-run (issue 36, training).

An honest trigger, no test hook: `lr=1e30` with no warmup leaves step 1's loss finite (computed
before the update) and makes every weight enormous, so step 2's loss is NaN. The trainer stops
there without saving or exporting; `llmft train` then says why in its one `error:` line (the
worker's own reason, which it used to leave in the log tail below "exited with status 1").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_nan_loss_stops_the_run_naming_the_step_and_exports_nothing(
    tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "train", "--model", str(tiny_model_dir),
         "--data", str(small_dataset), "--output", str(out), "--max-steps", "4", "--nodes", "1",
         "--rdzv-backend", "c10d", "--set", "lr=1e30", "--set", "warmup_steps=0",
         "--set", "checkpoint_every=1", "--set", "tensorboard=false"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert "step 2: loss=nan" in errors[0] and "not finite" in errors[0], errors
    # Step 1 was saved (finite); nothing after it, and no model was exported.
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-00000001"], checkpoints
    assert not (out / "model").exists()
    assert not (out / "summary.json").exists()
