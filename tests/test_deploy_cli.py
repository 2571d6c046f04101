"""`llmft upload|run|schedule` from the command line: the deploy guide's own commands, run in
order against the fakes, and the one-line errors for missing credentials, hosts and bad config."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from fakes.google_auth import service_account_key
from fakes.kfp_api import FakeKfp, FakeRegistry
from fakes.vertex import FakeVertex
from typer.testing import CliRunner

from components.runtime.ports import ReservedPort
from pipelines.cli import app

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs/deploy/README.md"


def guide_commands() -> list[str]:
    """Every `llmft ...` line of the guide's bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip().startswith("llmft ")]


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


@pytest.fixture
def no_ambient_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials or hosts from the developer's machine leak into a test."""
    for var in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "KF_PIPELINES_ENDPOINT",
        "KFP_TOKEN",
        "GOOGLE_CLOUD_PROJECT",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud login either
    # Not on Google Compute Engine: skip the metadata-server probe (a second of timeouts).
    monkeypatch.setattr("google.auth.compute_engine._metadata.is_on_gce", lambda *a, **k: False)
    monkeypatch.chdir(REPO)


@pytest.mark.slow
def test_the_guide_commands_run_in_order(
    no_ambient_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kfp_api: FakeKfp
) -> None:
    if (
        not Path("compiled/fine_tune.vertex.yaml").exists()
        or not Path("compiled/fine_tune.kfp.yaml").exists()
    ):
        pytest.skip("compiled/ not generated yet (llmft compile)")
    commands = guide_commands()
    assert len(commands) >= 15, commands
    vertex = FakeVertex(monkeypatch)
    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(service_account_key(tmp_path / "key.json"))
    )
    deploy_yaml = tmp_path / "deploy.yaml"
    deploy_yaml.write_text((REPO / "docs/deploy/example.yaml").read_text())
    with FakeRegistry() as registry:
        env = {
            "PROJECT": "my-project",
            "REGION": "us-central1",
            "BUCKET": "my-bucket",
            "REGISTRY": registry.url,
            "KFP_HOST": kfp_api.url,
        }
        outputs: list[dict[str, Any]] = []
        for command in commands:
            env["SCHEDULE_ID"] = next(iter(vertex.schedules), "none").rsplit("/", 1)[-1]
            env["RECURRING_RUN_ID"] = next(iter(kfp_api.recurring), "none")
            expanded = re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: env[m.group(1)], command)
            args = shlex.split(expanded)[1:]
            args = [str(deploy_yaml) if a == "deploy.yaml" else a for a in args]
            if args[0] == "compile":
                continue  # rewrites compiled/; tests/test_compile.py covers it
            result = _invoke(args)
            assert result.exit_code == 0, f"{command}\n{result.output}"
            if args[0] == "upload":
                outputs.append(json.loads(result.stdout))  # stdout is JSON only, for automation
        (upload,) = registry.requests

    # Vertex: upload, one run, schedule, list, update, pause/resume/delete.
    assert upload.body == {"tags": "v0.1.0,latest"}
    vertex_upload, kfp_upload = outputs
    digest = hashlib.sha256(Path("compiled/fine_tune.vertex.yaml").read_bytes()).hexdigest()
    assert vertex_upload["version"] == f"sha256:{digest}"
    assert kfp_upload["created_pipeline"] is True
    (job,) = vertex.jobs
    params = dict(job.pipeline_job.runtime_config.parameter_values)
    assert params["train_data_uri"] == "gs://my-bucket/raw/2026-01-05T03:00:00Z/*.jsonl"
    assert (params["backend"], params["project"], params["region"]) == (
        "vertex",
        "my-project",
        "us-central1",
    )
    assert params["work_uri"] == "gs://my-bucket/pipeline-root/llmft-work"
    assert job.pipeline_job.service_account == "llmft-pipelines@my-project.iam.gserviceaccount.com"
    (created,) = vertex.created_schedules
    assert created.schedule.cron == "CRON_TZ=Europe/Berlin 0 3 * * 1"
    assert created.schedule.display_name == "weekly-fine-tune"
    assert len(vertex.updates) == 1
    assert [c[0] for c in vertex.calls if c[0] != "list_schedules"] == [
        "pause_schedule",
        "resume_schedule",
        "delete_schedule",
    ]

    # KFP: upload, one run, a recurring run replaced by --update, then paused, resumed, deleted.
    assert len(kfp_api.calls("POST", "/apis/v2beta1/pipelines/upload")) == 1
    (run,) = kfp_api.calls("POST", "/apis/v2beta1/runs")
    assert run.body["runtime_config"]["parameters"]["backend"] == "gke"
    assert run.body["service_account"] == "llmft-pipeline"
    recurring = kfp_api.calls("POST", "/apis/v2beta1/recurringruns")
    assert [r.body["trigger"]["cron_schedule"]["cron"] for r in recurring] == ["0 0 2 * * 1"] * 2
    deleted = [r.path for r in kfp_api.requests if r.method == "DELETE"]
    assert len(deleted) == len(set(deleted)) == 2  # the replaced one (--update), then --delete
    assert kfp_api.recurring == {}


def test_the_guide_uses_only_real_flags() -> None:
    import typer.main

    group = typer.main.get_command(app)
    for command in guide_commands():
        args = shlex.split(command)[1:]
        sub = group.commands[args[0]]  # type: ignore[attr-defined]
        sub.make_context(args[0], args[1:])  # raises on an unknown or malformed option


def _one_line_error(result: Any) -> str:
    """Exit 2 and exactly one `error:` line on stderr (stdout may hold the cost estimate, which
    `llmft run` prints before it contacts anything)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_missing_google_credentials_is_one_clear_line(
    no_ambient_cloud: None, templates: dict[str, Path]
) -> None:
    line = _one_line_error(
        _invoke(
            [
                "run",
                "--backend",
                "vertex",
                "--project",
                "my-proj",
                "--pipeline-root",
                "gs://b/root",
                "--template",
                str(templates["vertex"]),
                "--param",
                "train_data_uri=gs://b/raw/*.jsonl",
            ]
        )
    )
    assert "no Google Cloud credentials" in line
    assert "gcloud auth application-default login" in line
    line = _one_line_error(
        _invoke(
            [
                "upload",
                "--target",
                "vertex",
                "--template",
                str(templates["vertex"]),
                "--registry",
                "https://us-central1-kfp.pkg.dev/my-proj/llmft-pipelines",
            ]
        )
    )
    assert "no Google Cloud credentials" in line
    line = _one_line_error(
        _invoke(["schedule", "--backend", "vertex", "--project", "my-proj", "--list"])
    )
    assert "no Google Cloud credentials" in line


def test_missing_or_unreachable_kfp_host_is_one_clear_line(
    no_ambient_cloud: None, templates: dict[str, Path]
) -> None:
    args = [
        "run",
        "--backend",
        "kfp",
        "--template",
        str(templates["kfp"]),
        "--pipeline-root",
        "gs://b/root",
        "--param",
        "train_data_uri=gs://b/x",
    ]
    line = _one_line_error(_invoke(args))
    assert "no KFP host: pass --host" in line and "kubectl port-forward" in line
    with ReservedPort() as port:  # a port nobody listens on
        line = _one_line_error(_invoke([*args, "--host", f"http://127.0.0.1:{port}"]))
    assert f"cannot reach KFP at http://127.0.0.1:{port}" in line


def test_kfp_that_refuses_the_token_is_one_clear_line(
    no_ambient_cloud: None,
    templates: dict[str, Path],
    kfp_api: FakeKfp,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kfp_api, "handle", lambda rec: (403, {"error_message": "denied"}))
    line = _one_line_error(
        _invoke(["schedule", "--backend", "kfp", "--host", kfp_api.url, "--list"])
    )
    assert "refused the request (403): set KFP_TOKEN" in line


def test_config_problems_are_listed_together(no_ambient_cloud: None, tmp_path: Path) -> None:
    bad = tmp_path / "deploy.yaml"
    bad.write_text("vertex: {project: X, pipeline_root: local/dir}\nschedule: {cron: '0 3 * *'}\n")
    result = _invoke(
        ["schedule", "--backend", "vertex", "--config", str(bad), "--template", "nope.yaml"]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.startswith("error: 4 config problem(s):")
    for fragment in (
        "template: nope.yaml does not exist",
        "vertex.project: 'X'",
        "vertex.pipeline_root",
        "schedule.cron",
    ):
        assert fragment in result.output
    line = _one_line_error(
        _invoke(["run", "--backend", "kfp", "--project", "p", "--host", "http://h"])
    )
    assert line == "error: with --backend kfp, drop: --project (vertex only)"
    line = _one_line_error(
        _invoke(["schedule", "--backend", "kfp", "--list", "--pause", "x", "--host", "http://h"])
    )
    assert line == "error: choose one of --list, --pause"


def test_local_backend_hands_over_to_run_local(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pipelines.local_run

    seen: list[tuple[dict[str, Any], Path | None]] = []

    class Result:
        succeeded = True

    def run_local(
        params: dict[str, Any], config_file: Path | None = None, verbose: bool = False
    ) -> Result:
        seen.append((params, config_file))
        return Result()

    monkeypatch.setattr(pipelines.local_run, "run_local", run_local)
    config = tmp_path / "local.yaml"
    config.write_text("parameters: {}\n")
    result = _invoke(
        ["run", "--config", str(config), "--param", "max_steps=3", "--param", "workdir=runs/x"]
    )
    assert result.exit_code == 0, result.output
    assert seen == [({"max_steps": 3, "workdir": "runs/x"}, config)]
    Result.succeeded = False
    assert _invoke(["run", "--backend", "local"]).exit_code == 1
