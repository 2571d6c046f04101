"""The whole fine-tune pipeline through kfp.local, as `llmft run --backend local` runs it:
Beam DirectRunner, a real local etcd, 2 torchrun agents x 2 processes over etcd-v3, evaluate, and
the exit-handler cleanup; plus the failure and interrupt paths."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

LLMFT = [sys.executable, "-m", "pipelines.cli"]


def _run_processes(workdir: Path) -> list[psutil.Process]:
    """Live processes started for this run (they inherit LLMFT_STATE_DIR under the workdir)."""
    marker = str(workdir)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            if marker in " ".join(proc.info["cmdline"] or []) or marker in proc.environ().get(
                "LLMFT_STATE_DIR", ""
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _assert_nothing_left(workdir: Path) -> None:
    deadline = time.monotonic() + 15
    while _run_processes(workdir) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [" ".join(p.cmdline()[:4]) for p in _run_processes(workdir)]
    assert not left, f"processes left behind: {left}"
    state = workdir / "state"
    remaining = [p for p in state.rglob("*") if p.is_file()] if state.exists() else []
    assert not remaining, f"run state left behind: {remaining}"


def _params(workdir: Path, assets: tuple[Path, Path], **extra: object) -> list[str]:
    from pipelines.local_run import QUICKSTART_PRESET

    data_dir, model_dir = assets
    params = {
        **QUICKSTART_PRESET,  # sized for the tiny model these runs use
        "workdir": str(workdir),
        "train_data_uri": str(data_dir / "train.jsonl"),
        "base_model": str(model_dir),
        "max_steps": 40,
        "max_eval_examples": 40,
        **extra,
    }
    args: list[str] = []
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    return args


@pytest.fixture(scope="module")
def assets(sample_data_dir: Path, tiny_model_dir: Path) -> tuple[Path, Path]:
    return sample_data_dir, tiny_model_dir


def test_local_pipeline_end_to_end(tmp_path: Path, assets: tuple[Path, Path]):
    workdir = tmp_path / "run"
    out = subprocess.run(
        [*LLMFT, "run", "--backend", "local", *_params(workdir, assets)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = "".join(p.read_text() for p in (workdir / "logs").glob("*.log"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + log[-5000:]
    assert "fine-tune succeeded" in out.stdout
    for step in ("validate-inputs", "preprocess", "etcd-up", "train", "evaluate", "cleanup"):
        assert f"Task '{step}' finished with status SUCCESS" in log.replace("\x1b[0m", "").replace(
            "\x1b[96m", ""
        ).replace("\x1b[92m", ""), step
    run_dir = max(
        (workdir / "pipeline_root").glob("llmft-fine-tune-*"), key=lambda p: p.stat().st_mtime
    )
    model_dirs = list((run_dir / "train").rglob("config.json"))
    assert model_dirs, "no exported model"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(model_dirs[0].parent)
    report = (run_dir / "evaluate" / "report").read_text()
    assert "<html" in report.lower() and "<img" in report.lower()
    # the before/after metrics are printed, and the tuned model beats its base
    assert "before / after" in out.stdout and "quality gate: passed" in out.stdout
    executor_output = json.loads((run_dir / "evaluate" / "executor_output.json").read_text())
    metrics = executor_output["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["tuned_eval_loss"] < metrics["base_eval_loss"] - 1.0, metrics
    summary = json.loads((run_dir / "metrics.json").read_text())
    assert summary["succeeded"] and summary["metrics"] == metrics
    _assert_nothing_left(workdir)


def test_failure_in_train_still_runs_cleanup(tmp_path: Path, assets: tuple[Path, Path]):
    workdir = tmp_path / "run"
    out = subprocess.run(
        [
            *LLMFT,
            "run",
            "--backend",
            "local",
            # Valid as a parameter, fails on the trainer's ranks (CPU-only machine).
            *_params(workdir, assets, trainer_overrides={"backend": "nccl"}),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode != 0
    assert "fine-tune failed" in out.stdout and "train" in out.stdout
    log = "".join(p.read_text() for p in (workdir / "logs").glob("*.log"))
    assert "backend=nccl needs GPUs" in log  # the trainer's own message reaches the log
    assert "Executing task \x1b[96m'cleanup'" in log or "Executing task 'cleanup'" in log
    _assert_nothing_left(workdir)


def test_sigint_stops_everything(tmp_path: Path, assets: tuple[Path, Path]):
    workdir = tmp_path / "run"
    proc = subprocess.Popen(
        [*LLMFT, "run", "--backend", "local", *_params(workdir, assets, max_steps=100000)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            logs = list((workdir / "logs").glob("*.log")) if (workdir / "logs").exists() else []
            if logs and "'train'" in logs[0].read_text():
                break
            time.sleep(1)
        else:
            pytest.fail("train never started")
        time.sleep(8)  # let the torchrun agents and workers come up
        assert any("torch" in " ".join(p.cmdline()) for p in _run_processes(workdir))
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "fine-tune failed" in output
    _assert_nothing_left(workdir)
