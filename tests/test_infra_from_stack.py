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
from pipelines.cli.run import DRY_RUN_PARAMETERS

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
        "dataflow_service_account": "llmft-dataflow@my-project.iam.gserviceaccount.com",
    }
    # CustomJob replicas run as the trainer's Google account; a Vertex-only stack has no KSA.
    assert config.vertex.parameters == {
        "service_account": "llmft-trainer@my-project.iam.gserviceaccount.com"
    }
    assert config.kfp.parameters == {}
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
    assert written["parameters"]["dataflow_options"] == {"max_num_workers": 20}
    assert (
        written["parameters"]["dataflow_service_account"]
        == "llmft-dataflow@my-project.iam.gserviceaccount.com"
    )
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
        "parameters": {"service_account": "llmft-trainer"},
    }
    assert written["vertex"]["parameters"] == {
        "service_account": "llmft-trainer@my-project.iam.gserviceaccount.com"
    }
    # The GPU pool's machines, in the pipeline's (Vertex) accelerator naming.
    assert {k: written["parameters"][k] for k in ("machine_type", "accelerator_type", "accelerator_count")} == {
        "machine_type": "g2-standard-24", "accelerator_type": "NVIDIA_L4", "accelerator_count": 2,
    }  # fmt: skip


def test_an_older_shared_trainer_email_is_moved_to_the_vertex_section(tmp_path):
    """Configs written before the per-backend sections held the trainer's email in the shared
    parameters, where it would reach KFP runs (which need a Kubernetes name)."""
    outputs = stack(GKE_CONFIG)[1]
    out = tmp_path / "deploy.yaml"
    email = outputs["trainer_service_account"]
    out.write_text(yaml.safe_dump({"parameters": {"service_account": email, "nodes": 2}}))
    source = _outputs_file(tmp_path, GKE_CONFIG)
    args = ["config", "from-stack", "--stack-output", str(source), "--output", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    written = yaml.safe_load(out.read_text())
    assert "service_account" not in written["parameters"] and written["parameters"]["nodes"] == 2
    assert written["vertex"]["parameters"]["service_account"] == email


H100_CONFIG = {"project": "my-project", "region": "us-central1", "gke": {}}
"""A GKE stack with the defaults: a3-highgpu-8g nodes with 8 x nvidia-h100-80gb."""
STACKS = {"gke-l4": GKE_CONFIG, "gke-h100": H100_CONFIG, "vertex-only": VERTEX_CONFIG}


@pytest.mark.parametrize("backend", ["kfp", "vertex"])
@pytest.mark.parametrize("name", list(STACKS))
def test_from_stack_config_passes_a_dry_run(tmp_path, monkeypatch, name, backend):
    """N4: the written config is one a run on either backend accepts: on KFP (trainer on GKE)
    the training pods' Kubernetes service account and the GPU pool's accelerators; on Vertex the
    trainer's email. `--dry-run` makes every check a submission makes, offline."""
    from components.params.run_params import RunParams
    from components.platform.platform_facts import gke_accelerator

    monkeypatch.chdir(REPO)
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "KF_PIPELINES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    outputs = stack(STACKS[name])[1]
    out = tmp_path / "deploy.yaml"
    source = _outputs_file(tmp_path, STACKS[name])
    wrote = CliRunner().invoke(
        app, ["config", "from-stack", "--stack-output", str(source), "--output", str(out)]
    )
    assert wrote.exit_code == 0, wrote.output
    result = CliRunner().invoke(
        app,
        [
            "run", "--backend", backend, "--config", str(out), "--dry-run",
            "--param", "train_data_uri=gs://my-project-llmft/raw/*.jsonl",
            "--param", "base_model=Qwen/Qwen2.5-0.5B",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"dry run: a {backend} run of compiled/fine_tune.{backend}" in result.output
    params = json.loads(result.output.split(DRY_RUN_PARAMETERS + "\n", 1)[1])
    assert params["backend"] == ("gke" if backend == "kfp" else "vertex")
    if backend == "vertex":
        assert params["service_account"] == outputs["trainer_service_account"]
    else:  # the stack's KSA; without one, the template's default for the target
        target_default = RunParams.for_target("kfp").service_account
        assert params.get("service_account", target_default) == outputs.get(
            "trainer_ksa", target_default
        )
    if "gke_cluster" in outputs:
        assert gke_accelerator(params["accelerator_type"]) == outputs["accelerator_type"]
        assert params["accelerator_count"] == outputs["accelerator_count"]
        assert params["machine_type"] == outputs["gpu_machine_type"]
        assert params["gke_cluster"] == outputs["gke_cluster"]


def test_from_stack_config_drives_gke_from_vertex_with_the_trainer_ksa(tmp_path, monkeypatch):
    """Review P4: on the vertex target the config gives `service_account` the trainer's email (for
    CustomJob replicas); training on GKE from Vertex Pipelines needs the pods' Kubernetes service
    account instead: the refusal names it, and the documented override passes."""
    from components.params.run_params import TARGET_DEFAULTS

    monkeypatch.chdir(REPO)
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "KF_PIPELINES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "deploy.yaml"
    source = _outputs_file(tmp_path, GKE_CONFIG)
    wrote = CliRunner().invoke(
        app, ["config", "from-stack", "--stack-output", str(source), "--output", str(out)]
    )
    assert wrote.exit_code == 0, wrote.output
    trainer = TARGET_DEFAULTS["kfp"]["service_account"]
    run = [
        "run", "--backend", "vertex", "--config", str(out), "--dry-run",
        "--param", "train_data_uri=gs://my-project-llmft/raw/*.jsonl",
        "--param", "base_model=Qwen/Qwen2.5-0.5B", "--param", "backend=gke",
    ]  # fmt: skip
    refused = CliRunner().invoke(app, run)
    assert refused.exit_code == 2 and f"--param service_account={trainer}" in refused.output
    passed = CliRunner().invoke(app, [*run, "--param", f"service_account={trainer}"])
    assert passed.exit_code == 0, passed.output
    params = json.loads(passed.output.split(DRY_RUN_PARAMETERS + "\n", 1)[1])
    assert params["backend"] == "gke" and params["service_account"] == trainer


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
