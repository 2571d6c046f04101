"""MLflow tracking in one process: the URI and secret checks, the sink's spool when the server is
unreachable, its replay into a local sqlite store, and `llmft train/evaluate --tracking-uri`'s
refusals (exit 2, one `error:` line, nothing started). The real server: test_mlflow_tracking.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

# mlflow's first import runs `uname -p`, a subprocess the unit guard refuses inside a test:
# imported here, at collection, for when this file runs alone.
import mlflow.tracking  # noqa: F401
import pytest
from typer.testing import CliRunner

from components.params.run_checks import run_errors
from components.serving.mlflow_tracking import (
    KFP_TRACKING_TOKEN_SECRET,
    model_name,
    tracking_errors,
)
from pipelines.cli import app
from trainer.config import TrainConfig
from trainer.tracking import TrackingSink, main, redact, replay, tracking_uri_problem

REFUSED = "http://127.0.0.1:1"  # nothing listens on port 1: connection refused at once


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("ftp://mlflow:5000", "the scheme must be one of"),
        ("mlflow.example.com", "the scheme must be one of"),
        ("http://", "no host"),
        ("http://no-such-host.invalid:5000", "does not resolve"),
        ("https://user:s3cr3t@mlflow.example.com", "give the server's token by secret name"),
        ("sqlite://", "no path"),
    ],
)
def test_bad_tracking_uris_say_what_to_change(uri: str, fragment: str):
    problem = tracking_uri_problem(uri)
    assert problem is not None and fragment in problem
    assert "s3cr3t" not in problem, "a credential is never echoed"


@pytest.mark.parametrize(
    "uri",
    ["", "http://127.0.0.1:5000", "https://localhost", "file:///tmp/mlruns", "sqlite:////tmp/m.db"],
)
def test_good_tracking_uris(uri: str):
    assert tracking_uri_problem(uri) is None


def test_redact_drops_credentials():
    assert redact("https://u:p@mlflow.example.com/x") == "https://mlflow.example.com/x"


def test_trainer_config_needs_the_run_to_log_to():
    errors = TrainConfig(model="m", data="d", output="o", tracking_uri="file:///x").errors()
    assert any("tracking_run_id" in e for e in errors)
    assert not [
        e
        for e in TrainConfig(
            model="m", data="d", output="o", tracking_uri="file:///x", tracking_run_id="r"
        ).errors()
        if "tracking" in e
    ]


def test_token_secret_checks(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    uri, mounted = "http://127.0.0.1:5000", KFP_TRACKING_TOKEN_SECRET
    kfp = tracking_errors(uri, mounted, target="kfp", project="p")
    assert len(kfp) == 1 and "no such Kubernetes Secret" in kfp[0]
    other = tracking_errors(uri, "my-token", target="kfp", project="p")
    assert len(other) == 1 and f"mounts the Kubernetes Secret {mounted}" in other[0]
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "x")  # the Secret mounted in the validate task
    assert tracking_errors(uri, mounted, target="kfp", project="p") == []
    alone = tracking_errors("", "mlflow-token", target="vertex", project="p")
    assert alone and "without tracking_uri" in alone[0]
    local = tracking_errors("http://127.0.0.1:5000", "t", target="local", project="")
    assert local and "set project" in local[0]


def test_a_local_store_is_refused_on_a_cloud_run():
    """Review M7: each pod would write its own sqlite file or mlruns/ and lose it."""
    for target in ("kfp", "vertex"):
        for uri in ("sqlite:////tmp/mlflow.db", "file:///tmp/mlruns"):
            [error] = tracking_errors(uri, "", target=target, project="p", resolve=False)
            assert error.startswith(f"tracking_uri={uri!r}: a local store on a {target} run")
    assert tracking_errors("sqlite:////tmp/m.db", "", target="local", project="") == []


def test_registered_model_name():
    assert model_name("", "/models/SmolLM2-135M/") == "llmft-SmolLM2-135M"
    assert model_name("projects/p/locations/l/models/support-bot", "x") == "support-bot"


def test_unreachable_server_spools_without_blocking_and_replays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Records go to the spool (one warning), close() says where; the replay delivers every
    step, params included, to a store that works (a local sqlite store, in process)."""
    from mlflow.tracking import MlflowClient

    spool = tmp_path / "run" / "mlflow-spool.jsonl"
    caplog.set_level(logging.INFO, logger="trainer.tracking")
    sink = TrackingSink(REFUSED, "RUN", spool, retry_s=3600)
    sink.log_params({"lr": 0.001, "model": "tiny", "unset": None})
    for step in range(1, 6):
        sink.log_metrics(step, {"loss": 1.0 / step, "mfu": None, "lr": float("nan"), "epoch": 0})
    assert sink.close(timeout_s=60) == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("training goes on" in w for w in warnings) == 1, warnings
    assert f"they are in {spool}: replay with" in warnings[-1]
    records = [json.loads(line) for line in spool.read_text().splitlines()]
    assert records[0]["params"] == {"lr": 0.001, "model": "tiny"}
    assert [r["metrics"][0][3] for r in records[1:]] == [1, 2, 3, 4, 5]
    assert {m[0] for r in records[1:] for m in r["metrics"]} == {"loss", "epoch"}  # finite only

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    run = client.create_run(client.create_experiment("units")).info.run_id
    text = spool.read_text().replace('"run_id": "RUN"', f'"run_id": "{run}"')
    spool.write_text(text)
    assert replay(str(spool), store) == 6
    assert not spool.exists()
    history = client.get_metric_history(run, "loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / s) for s in range(1, 6)]
    assert client.get_run(run).data.params == {"lr": "0.001", "model": "tiny"}


def test_a_full_queue_spools_instead_of_waiting(tmp_path: Path):
    spool = tmp_path / "spool.jsonl"
    sink = TrackingSink(REFUSED, "RUN", spool, queue_size=1, retry_s=3600)
    for step in range(1, 51):
        sink.log_metrics(step, {"loss": float(step)})  # never blocks: queue or overflow
    assert sink.close(timeout_s=60) == 50
    steps = sorted(json.loads(x)["metrics"][0][3] for x in spool.read_text().splitlines())
    assert steps == list(range(1, 51))


def test_replay_command_refuses_a_bad_uri(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    assert main(["replay", str(tmp_path / "s.jsonl"), "--tracking-uri", "ftp://x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def _llmft(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    "uri", ["ftp://mlflow:5000", "http://no-such-host.invalid"], ids=["scheme", "host"]
)
def test_llmft_train_refuses_a_bad_tracking_uri_before_starting(uri: str, tmp_path: Path):
    out = tmp_path / "out"
    result = _llmft(
        "train", "--model", "m", "--data", "d", "--output", str(out), "--tracking-uri", uri
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: tracking_uri=") and result.output.count("\n") == 1
    assert not out.exists()


def test_llmft_evaluate_refuses_tracking_without_a_run_id(tmp_path: Path):
    result = _llmft(
        "evaluate", "--base", "b", "--tuned", "t", "--data", "d", "--output", str(tmp_path / "o"),
        "--tracking-uri", "http://127.0.0.1:5000",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --tracking-uri needs --run-id")


@pytest.mark.parametrize(
    ("param", "fragment"),
    [
        ("tracking_uri=ftp://mlflow:5000", "the scheme must be one of"),
        ("tracking_uri=http://no-such-host.invalid:5000", "does not resolve"),
        ("tracking_token_secret=mlflow-token", "without tracking_uri"),
    ],
    ids=["scheme", "host", "secret-alone"],
)
def test_llmft_run_refuses_bad_tracking_before_anything_starts(
    param: str, fragment: str, tmp_path: Path
):
    workdir = tmp_path / "run"
    result = _llmft("run", "--param", f"workdir={workdir}", "--param", param)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and fragment in result.output, result.output
    assert "Traceback" not in result.output
    assert not workdir.exists()


def test_run_params_check_the_tracking_uri_scheme_everywhere():
    from components.params.run_params import RunParams

    assert any(
        "the scheme must be one of" in e for e in run_errors(RunParams(tracking_uri="ftp://x"))
    )
    assert not [
        e for e in run_errors(RunParams(tracking_uri="sqlite:////tmp/m.db")) if "tracking" in e
    ]


def test_a_sqlite_store_keeps_artifacts_beside_it():
    from components.serving.mlflow_tracking import local_artifact_location

    assert (
        local_artifact_location("sqlite:////runs/x/mlflow.db") == "file:///runs/x/mlflow-artifacts"
    )
    assert local_artifact_location("sqlite:///relative.db") is None
    assert local_artifact_location("http://127.0.0.1:5000") is None
