"""Faults: a run that diverges without NaN, and settings that are inf or NaN (issue 51, round 3).

`llmft train --set lr=30` on the tiny model took the loss from 8.2 to 54,055 in one step and on
to 104,205, all finite: exit 0, a model exported, not a word. The divergence guard
(trainer/divergence.py) stops it at step 2. `lr=inf` passed validation (`lr must be > 0`),
started torchrun, and the NaN stop then called a checkpoint "intact" that did not exist; every
float setting of the trainer and of the pipeline now refuses inf and NaN before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_errors import assert_user_error, llmft

from faults.conftest import error_lines, llmft_process

REPO = Path(__file__).resolve().parents[2]


def _train(model: Path, data: Path, out: Path, *settings: str):
    sets = [arg for setting in settings for arg in ("--set", setting)]
    return llmft_process(
        "train", "--model", str(model), "--data", str(data), "--output", str(out),
        "--max-steps", "4", "--nodes", "1", "--rdzv-backend", "c10d",
        "--set", "checkpoint_every=1", "--set", "tensorboard=false", *sets,
    )  # fmt: skip


@pytest.mark.integration
@pytest.mark.slow
def test_a_diverging_loss_stops_the_run_naming_step_loss_and_lr(
    tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    out = tmp_path / "run"
    result = _train(tiny_model_dir, small_dataset, out, "lr=30")
    assert result.returncode == 1, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    errors = error_lines(result.output)
    assert len(errors) == 1, errors
    for fragment in ("step 2: loss=", "diverged", "lower lr (now 30", "divergence_factor=0"):
        assert fragment in errors[0], (fragment, errors[0])
    # Step 1 was saved before the guard saw step 2's loss: it is kept (and named as holding the
    # rise: it is what produced it); nothing after it, and nothing was exported.
    assert "no checkpoint was saved before the loss rose (step-00000001" in errors[0], errors[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000001"]
    assert not (out / "model").exists() and not (out / "summary.json").exists()

    # The guard's own setting turns it off: the same run then ends as it used to.
    result = _train(tiny_model_dir, small_dataset, tmp_path / "off", "lr=30", "divergence_factor=0")
    assert result.returncode == 0, result.output[-3000:]
    assert json.loads((tmp_path / "off" / "summary.json").read_text())["steps"] == 4


@pytest.mark.unit
def test_the_guard_passes_noisy_healthy_runs_and_stops_a_rise():
    from trainer.divergence import DivergenceGuard

    def first_stop(losses: list[float], factor: float = 4.0) -> int | None:
        guard = DivergenceGuard(factor)
        for step, loss in enumerate(losses, start=1):
            if guard.check(step, loss):
                return step
        return None

    assert first_stop([8.23, 54055.7, 49228.1, 82810.9]) == 2  # the lr=30 run
    assert first_stop([8.23, 54055.7, 49228.1], factor=0) is None  # off
    # A healthy fine-tune with noisy batches (x2.5 swings) and a spike that recovers.
    healthy = [2.6, 2.1, 1.2, 3.0, 1.1, 0.9, 2.4, 0.8, 6.0, 0.7, 0.9, 0.6]
    assert first_stop(healthy) is None
    # A dataset learnt by heart: 0.01 -> 0.2 is 20x but far from a nat: not a divergence.
    assert first_stop([0.5, 0.05, 0.01, 0.01, 0.01, 0.2, 0.2, 0.2, 0.2, 0.2]) is None
    # A slow climb is caught once the 5-step mean is 4x and a nat above the best one.
    assert first_stop([2.0, 1.5, 1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == 12


@pytest.mark.unit
@pytest.mark.parametrize("setting", ["lr=inf", "lr=nan", "adam_eps=1e999", "peak_flops=-inf"])
def test_inf_and_nan_trainer_settings_are_refused_up_front(
    setting: str, tiny_model_dir: Path, small_dataset: Path, tmp_path: Path
):
    name = setting.split("=")[0]
    out = tmp_path / "run"
    result = llmft(
        "train", "--model", str(tiny_model_dir), "--data", str(small_dataset),
        "--output", str(out), "--set", setting,
    )  # fmt: skip
    assert_user_error(result, f"{name} must be a finite number")
    assert "must be > 0" not in result.output  # reported once, as what it is
    assert not out.exists()


@pytest.mark.unit
@pytest.mark.parametrize(
    "param",
    [
        "max_cost_usd=1e999",
        "learning_rate=1e999",
        'trainer_overrides={"adam_eps": 1e999}',
        'trainer_overrides={"divergence_factor": NaN}',
    ],
)
def test_inf_and_nan_run_parameters_are_refused_up_front(param: str, tmp_path: Path):
    result = llmft(
        "run", "--backend", "local", "--dry-run", "--param", param,
        "--param", f"workdir={tmp_path / 'w'}",
    )  # fmt: skip
    assert_user_error(result, "finite number")
    assert not (tmp_path / "w").exists()


@pytest.mark.unit
def test_yaml_inf_and_nan_in_a_params_file_are_refused(tmp_path: Path):
    config = tmp_path / "params.yaml"
    config.write_text("learning_rate: .inf\neval_fraction: .nan\n")
    result = llmft("run", "--backend", "local", "--dry-run", "--config", str(config))
    assert_user_error(result, "learning_rate=inf: use a finite number", "eval_fraction=nan")
