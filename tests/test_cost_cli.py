"""`llmft run --dry-run` prints the cost estimate and starts nothing; a run over `max_cost_usd` is
refused before anything starts (exit 2, one `error:` line), in a fresh process without
credentials, as a user would meet it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIG_SHAPE = {
    "machine_type": "a3-highgpu-8g",
    "accelerator_type": "NVIDIA_H100_80GB",
    "accelerator_count": 8,
}
"""The shape these runs price (the cloud targets' first-run default is 2 x L4: docs/deploy)."""
VERTEX = [
    "run", "--backend", "vertex", "--project", "my-project", "--pipeline-root", "gs://b/root",
    "--param", "train_data_uri=gs://b/d/*.jsonl", "--param", "base_model=gs://b/m",
    "--param", "work_uri=gs://b/w", "--param", "project=my-project",
    "--param", "model_parameters=8000000000", "--param", "nodes=2",
    "--param", "dataflow_service_account=llmft-dataflow@my-project.iam.gserviceaccount.com",
    *(arg for name, value in BIG_SHAPE.items() for arg in ("--param", f"{name}={value}")),
]  # fmt: skip


def fresh_llmft(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A new process with no Google credentials in its environment (the dry run needs none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "KF_", "CLOUDSDK"))}
    env |= {"HOME": str(cwd), "NO_GCE_CHECK": "True", "GCE_METADATA_HOST": "127.0.0.1:1"}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def expected_total(**params: object) -> str:
    """The estimate's total as `components/preflight/cost.py` computes it for the same parameters."""
    from components.params.param_values import params_from_mapping
    from components.params.run_params import RunParams
    from components.preflight import run_cost

    base = {"train_data_uri": "gs://b/d/*.jsonl", "base_model": "gs://b/m", "work_uri": "gs://b/w"}
    values = base | {"project": "my-project", "model_parameters": 8_000_000_000, "nodes": 2}
    values |= BIG_SHAPE
    run = params_from_mapping(values | params, base=RunParams.for_target("vertex"))
    return f"{run_cost.estimate_for(run, remote=False).usd:.2f}"


def test_dry_run_prints_the_estimate_and_starts_nothing(tmp_path: Path) -> None:
    result = fresh_llmft(*VERTEX, "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("cost estimate"), out
    assert "train" in out and "evaluate" in out and "NVIDIA_H100_80GB" in out, out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split()[-1] == expected_total(), out
    assert "submitted" not in out and "credentials" not in result.stderr


def test_over_budget_is_refused_with_one_line_before_anything_starts(tmp_path: Path) -> None:
    result = fresh_llmft(*VERTEX, "--param", "max_cost_usd=5", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: estimated cost $"), result.stderr
    assert "exceeds max_cost_usd=5" in lines[0] and "Traceback" not in result.stderr
    assert "submitted" not in result.stdout  # and no credentials were looked for
    assert "credentials" not in result.stderr


def test_within_budget_dry_run_passes_and_prices_file_overrides(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("NVIDIA_H100_80GB: {on-demand: 0.01}\n")
    result = fresh_llmft(
        *VERTEX, "--param", "max_cost_usd=5", "--prices", str(prices), "--dry-run", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "$0.01/GPU-h" in result.stdout, result.stdout


def test_local_dry_run_needs_no_assets(tmp_path: Path) -> None:
    result = fresh_llmft("run", "--dry-run", "--param", f"workdir={tmp_path / 'w'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "processes on this machine, not priced" in result.stdout  # what it runs on, unpriced
    assert not (tmp_path / "w").exists()
