"""`llmft config from-stack`: the infra stack's outputs (from the real program under mocks)
become a deploy config that `llmft run|schedule|upload --config` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fakes.pulumi_mocks import GKE_CONFIG, VERTEX_CONFIG, stack
from typer.testing import CliRunner

from pipelines.cli import app

REPO = Path(__file__).resolve().parents[1]


def _outputs_file(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(stack(config)[1]))
    return path


def test_vertex_stack_to_a_runnable_config(tmp_path, monkeypatch):
    from pipelines.deploy.checks import validate
    from pipelines.deploy.config import load_config

    out = tmp_path / "deploy.yaml"
    result = CliRunner().invoke(
        app,
        [
            "config",
            "from-stack",
            "--stack-output",
            str(_outputs_file(tmp_path, VERTEX_CONFIG)),
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    config = load_config(out)
    assert config.vertex.project == "my-project"
    assert config.vertex.region == "us-central1"
    assert config.vertex.pipeline_root == "gs://my-project-llmft/pipeline-root"
    assert config.vertex.service_account == "llmft-pipelines@my-project.iam.gserviceaccount.com"
    assert config.vertex.registry == "https://us-central1-kfp.pkg.dev/my-project/llmft-pipelines"
    assert config.kfp.pipeline_root == "gs://my-project-llmft/kfp-root"
    assert config.parameters == {
        "project": "my-project",
        "region": "us-central1",
        "work_uri": "gs://my-project-llmft/work",
        "service_account": "llmft-trainer@my-project.iam.gserviceaccount.com",
        "dataflow_options": {
            "service_account_email": "llmft-dataflow@my-project.iam.gserviceaccount.com"
        },
    }
    monkeypatch.chdir(REPO)  # the default template is compiled/fine_tune.vertex.yaml
    config.template = "compiled/fine_tune.vertex.yaml"
    validate(config, "vertex", "run")
    validate(config, "vertex", "upload")


def test_gke_stack_from_stdin_updates_an_existing_config(tmp_path):
    out = tmp_path / "deploy.yaml"
    out.write_text(
        yaml.safe_dump(
            {
                "parameters": {"nodes": 4, "dataflow_options": {"max_num_workers": 20}},
                "schedule": {"cron": "CRON_TZ=UTC 0 3 * * 1", "display_name": "weekly"},
                "vertex": {"labels": {"team": "ml"}, "project": "old-project"},
            }
        )
    )
    text = json.dumps(stack(GKE_CONFIG)[1])
    result = CliRunner().invoke(
        app, ["config", "from-stack", "--stack-output", "-", "--output", str(out)], input=text
    )
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(out.read_text())
    # The user's keys stay; the stack's keys are the stack's.
    assert written["schedule"] == {"cron": "CRON_TZ=UTC 0 3 * * 1", "display_name": "weekly"}
    assert written["parameters"]["nodes"] == 4
    assert written["parameters"]["dataflow_options"] == {
        "max_num_workers": 20,
        "service_account_email": "llmft-dataflow@my-project.iam.gserviceaccount.com",
    }
    assert written["vertex"]["labels"] == {"team": "ml"}
    assert written["vertex"]["project"] == "my-project"
    assert (
        written["parameters"]["gke_cluster"]
        == "projects/my-project/locations/us-central1/clusters/llmft"
    )
    assert written["parameters"]["namespace"] == "kubeflow"
    assert written["kfp"] == {
        "pipeline_root": "gs://my-project-llmft/kfp-root",
        "service_account": "llmft-pipeline",
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "is not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"project": "p"}), "lacks region, pipeline_root"),
    ],
)
def test_bad_stack_output_is_one_error_line_and_exit_2(tmp_path, content, message):
    source = tmp_path / "stack.json"
    source.write_text(content)
    out = tmp_path / "deploy.yaml"
    result = CliRunner().invoke(
        app, ["config", "from-stack", "--stack-output", str(source), "--output", str(out)]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not out.exists()


def test_an_existing_config_is_never_replaced_by_an_invalid_one(tmp_path):
    out = tmp_path / "deploy.yaml"
    original = "vertex:\n  colour: red\n"
    out.write_text(original)
    result = CliRunner().invoke(
        app,
        [
            "config",
            "from-stack",
            "--stack-output",
            str(_outputs_file(tmp_path, VERTEX_CONFIG)),
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 2 and "vertex.colour: unknown key" in result.output
    assert out.read_text() == original
    assert not list(tmp_path.glob("*.tmp"))
