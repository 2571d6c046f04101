"""MLflow tracking against a real `mlflow server` (sqlite backend, local artifact root).

One tracked run for the module (`llmft train` then `llmft evaluate`, the train and evaluate
steps as the local run runs them, with --tracking-uri), read back through MLflow's REST client
by many tests: the pipeline run and its tags, the nested runs, the trainer's parameters and
metric histories with their steps, the steps' metrics and artifacts, the gate and the model
version. A second run stops the server mid-training: the run succeeds, says where the spool is,
and the replayed spool brings every step to the restarted server.

The server runs from its own venv (tests/mlflow_server.py says why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow_server import MlflowServer, running_server, start_server

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
LOG_EVERY = 2


def llmft(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def train_args(model: Path, data: Path, out: Path, run_id: str, uri: str) -> list[str]:
    return [
        "train", "--model", str(model), "--data", str(data), "--output", str(out),
        "--run-id", run_id, "--max-steps", str(STEPS), "--tracking-uri", uri, "--nodes", "1",
        "--rdzv-backend", "c10d", "--set", "micro_batch_size=4", "--set", "lr=0.003",
        "--set", "tensorboard=false", "--set", "checkpoint_at_end=false",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    from packed_fixtures import write_packed_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    records = [{"prompt": f"what is {i}+{i}?", "response": f"{2 * i}"} for i in range(48)]
    out = tmp_path_factory.mktemp("packed")
    write_packed_dataset(out, tokenizer, {"train": records[:40], "eval": records[40:]}, seq_len=64)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server(tmp_path_factory.mktemp("mlflow")) as running:
        yield running


@pytest.fixture(scope="module")
def tracked(
    server: MlflowServer,
    tiny_model_dir: Path,
    packed: Path,
    gcs_emulator: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """`llmft train` + `llmft evaluate` with --tracking-uri; what they printed and wrote. The
    evaluated model is the export copied to gs:// (the GCS emulator), where a cloud run's model
    is: an MLflow server registers only remote URIs as a version's source."""
    from trainer import storage

    out = tmp_path_factory.mktemp("tracked")
    run_id = "mlflow-test-run"
    args = train_args(tiny_model_dir, packed, out / "train", run_id, server.uri)
    trained = llmft(*args, "--set", f"log_every={LOG_EVERY}")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-5000:]
    model_uri = gcs_emulator.create_bucket("mlflow-models") + "/runs/mlflow-test-run/model"
    storage.upload_dir(out / "train" / "model", model_uri)
    evaluated = llmft(
        "evaluate", "--base", str(tiny_model_dir), "--tuned", model_uri,
        "--data", str(packed), "--output", str(out / "eval"), "--max-examples", "0",
        "--tracking-uri", server.uri, "--run-id", run_id, "--registered-model", "tiny-sft",
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-5000:]
    report = json.loads(evaluated.stdout)
    return {"run_id": run_id, "out": out, "model_uri": model_uri, "eval": report}


@pytest.fixture(scope="module")
def client(server: MlflowServer) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server.uri)  # the REST client, as any user reads a run


def runs_of(client: Any, run_id: str) -> dict[str, Any]:
    """The pipeline run and its nested runs, by their `llmft.step` tag."""
    experiment = client.get_experiment_by_name("llmft")
    runs = client.search_runs([experiment.experiment_id], f"tags.`llmft.run_id` = '{run_id}'")
    return {r.data.tags["llmft.step"]: r for r in runs}


def test_one_run_per_pipeline_run_with_nested_steps(tracked: dict, client: Any, packed: Path):
    runs = runs_of(client, tracked["run_id"])
    assert set(runs) == {"pipeline", "train", "evaluate"}
    parent = runs["pipeline"]
    assert parent.info.run_name == tracked["run_id"]
    assert parent.data.tags["llmft.base_model"].endswith("tiny_model0")
    assert parent.data.tags["llmft.data_uri"] == str(packed)
    assert parent.data.tags["llmft.backend"] == "local"
    assert parent.data.params["max_steps"] == str(STEPS)  # the step's run parameters
    assert parent.data.tags["llmft.gate"] == "passed"
    assert parent.info.status == "FINISHED"
    for step in ("train", "evaluate"):
        assert runs[step].data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert runs[step].info.status == "FINISHED"


def test_trainer_logs_resolved_params_once_and_metric_histories(tracked: dict, client: Any):
    train = runs_of(client, tracked["run_id"])["train"]
    params = train.data.params
    assert params["max_steps"] == str(STEPS) and params["lr"] == "0.003"
    assert params["total_steps"] == str(STEPS) and params["world_size"] == "1"
    assert "tracking_uri" not in params and "tracking_run_id" not in params
    run = train.info.run_id
    expected_steps = list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    for key in ("loss", "lr", "tokens_per_s", "peak_memory_gb", "grad_norm"):
        history = client.get_metric_history(run, key)
        assert sorted(m.step for m in history) == expected_steps, key
    losses = client.get_metric_history(run, "loss")
    written = [
        json.loads(line)
        for line in (tracked["out"] / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert {m.step: m.value for m in losses} == {
        r["step"]: pytest.approx(r["loss"]) for r in written if "loss" in r
    }
    assert "eval_loss" in train.data.metrics  # the trainer's end-of-run eval record
    assert not (tracked["out"] / "train" / "mlflow-spool.jsonl").exists()


def test_train_step_logs_summary_and_artifacts(tracked: dict, client: Any):
    train = runs_of(client, tracked["run_id"])["train"]
    assert train.data.metrics["steps"] == STEPS
    assert train.data.tags["llmft.model_uri"] == str(tracked["out"] / "train" / "model")
    names = {a.path for a in client.list_artifacts(train.info.run_id)}
    assert "summary.json" in names


def test_evaluate_logs_before_after_gate_and_report(tracked: dict, client: Any, tmp_path: Path):
    evaluate = runs_of(client, tracked["run_id"])["evaluate"]
    metrics = evaluate.data.metrics
    printed = tracked["eval"]["metrics"]
    assert metrics["base_eval_loss"] == pytest.approx(printed["base_eval_loss"])
    assert metrics["tuned_eval_loss"] == pytest.approx(printed["tuned_eval_loss"])
    assert metrics["gate_passed"] == 1.0 and evaluate.data.tags["llmft.gate"] == "passed"
    names = {a.path for a in client.list_artifacts(evaluate.info.run_id)}
    assert {"report.html", "metrics.json"} <= names
    local = client.download_artifacts(evaluate.info.run_id, "metrics.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == json.loads(
        Path(tracked["eval"]["metrics_file"]).read_text()
    )


def test_passing_gate_registers_a_version_pointing_at_the_export(tracked: dict, client: Any):
    evaluate = runs_of(client, tracked["run_id"])["evaluate"]
    versions = client.search_model_versions("name = 'tiny-sft'")
    assert len(versions) == 1
    version = versions[0]
    assert version.source == tracked["model_uri"]  # where the model is: MLflow copies nothing
    assert version.run_id == evaluate.info.run_id
    assert version.tags["llmft.run_id"] == tracked["run_id"]


def test_server_stopped_mid_run_spools_and_replays(
    tiny_model_dir: Path, packed: Path, tmp_path: Path
):
    """The server is killed while the trainer is paused after step 2; the run still succeeds, its
    last line names the spool, and the replayed spool brings every step to the restarted server
    (same sqlite store, a new port)."""
    from mlflow.tracking import MlflowClient
    from trainer_pause.sitecustomize import pause_env

    store = tmp_path / "store"
    server = start_server(store)
    paused, fifo = tmp_path / "paused", tmp_path / "resume"
    paused.mkdir()
    os.mkfifo(fifo)
    env = pause_env(2, str(paused), resume_fifo=str(fifo))
    args = train_args(tiny_model_dir, packed, tmp_path / "train", "mlflow-outage", server.uri)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *args, "--set", "log_every=1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        before = _wait_for_file(paused / "paused.rank0", proc)
        server.kill()
        with open(fifo, "w"):  # resume the paused trainer
            pass
        output = before + proc.communicate(timeout=900)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        server.kill()
    said = "\n".join(line for line in output.splitlines() if "MLflow" in line)
    assert proc.returncode == 0, output[-5000:]
    spool = tmp_path / "train" / "mlflow-spool.jsonl"
    assert spool.exists(), said
    assert f"they are in {spool}: replay with" in output, said

    with running_server(store) as back:
        replayed = subprocess.run(
            [sys.executable, "-m", "trainer.tracking", "replay", str(spool),
             "--tracking-uri", back.uri],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert replayed.returncode == 0, replayed.stderr
        client = MlflowClient(tracking_uri=back.uri)
        train = runs_of(client, "mlflow-outage")["train"]
        steps = {m.step for m in client.get_metric_history(train.info.run_id, "loss")}
        assert steps == set(range(1, STEPS + 1))
        assert train.data.params["max_steps"] == str(STEPS)
    assert not spool.exists()


def _wait_for_file(path: Path, proc: subprocess.Popen[str]) -> str:
    """Until `path` exists or the process ends (then the test fails with its output); returns
    the output read meanwhile."""
    import select

    assert proc.stdout is not None
    lines: list[str] = []
    while not path.exists():
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)  # wakes on output, else each 1s
        if ready:
            line = proc.stdout.readline()
            if not line:
                pytest.fail("llmft train ended before pausing:\n" + "".join(lines[-80:]))
            lines.append(line)
    return "".join(lines)
