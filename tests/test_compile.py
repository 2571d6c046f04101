"""Golden compile tests: compiled/ equals what the source compiles to, and each target loads where
it is meant to run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.compile import compile_all

REPO = Path(__file__).resolve().parents[1]
COMPILED = REPO / "compiled"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled")
    compile_all("all", out)
    return out


def _without_sdk_version(text: str) -> list[str]:
    return [line for line in text.splitlines() if "sdkVersion" not in line]


def test_compiled_matches_source(fresh: Path):
    produced = sorted(p.relative_to(fresh) for p in fresh.rglob("*.yaml"))
    committed = sorted(p.relative_to(COMPILED) for p in COMPILED.rglob("*.yaml"))
    assert produced == committed, "run `llmft compile` and commit compiled/"
    for rel in produced:
        assert _without_sdk_version((fresh / rel).read_text()) == _without_sdk_version(
            (COMPILED / rel).read_text()
        ), f"compiled/{rel} is stale: run `llmft compile` and commit it"


def test_vertex_target_is_one_document_and_parses_as_pipeline_job(fresh: Path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    path = fresh / "fine_tune.vertex.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    assert len(docs) == 1 and "platforms" not in docs[0]
    job = aiplatform.PipelineJob(
        display_name="golden",
        template_path=str(path),
        pipeline_root="gs://bucket/root",
        parameter_values={
            "train_data_uri": "gs://bucket/data/*.jsonl",
            "base_model": "gs://bucket/m",
        },
        project="my-project",
        location="us-central1",
        credentials=AnonymousCredentials(),
    )
    request = job._gca_resource
    assert request.pipeline_spec["pipelineInfo"]["name"] == "llmft-fine-tune"
    assert request.runtime_config.parameter_values["train_data_uri"] == "gs://bucket/data/*.jsonl"


def test_kfp_target_carries_kubernetes_platform_config(fresh: Path):
    docs = list(yaml.safe_load_all((fresh / "fine_tune.kfp.yaml").read_text()))
    assert len(docs) == 2
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    train = executors["exec-train"]
    assert train["secretAsEnv"][0]["secretName"] == "llmft-hf-token"
    assert train["secretAsEnv"][0]["optional"] is True
    assert train["podMetadata"]["labels"]["app.kubernetes.io/managed-by"] == "llmft"
    # The Secret is referenced by name only; no token value can appear in the compiled YAML.
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", (fresh / "fine_tune.kfp.yaml").read_text())


def test_cleanup_is_an_uncached_exit_task_and_side_effects_are_uncached(fresh: Path):
    spec = yaml.safe_load((fresh / "fine_tune.vertex.yaml").read_text())
    cleanup = spec["root"]["dag"]["tasks"]["cleanup"]
    assert cleanup["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert not cleanup["cachingOptions"].get("enableCache")
    inner = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    for name in ("validate-inputs", "etcd-up", "train"):
        assert not inner[name]["cachingOptions"].get("enableCache"), name
    assert inner["train"]["retryPolicy"]["maxRetryCount"] == 1
    assert inner["etcd-up"]["dependentTasks"] == ["preprocess"]


def test_every_parameter_has_a_description_and_a_default(fresh: Path):
    spec = yaml.safe_load((fresh / "fine_tune.vertex.yaml").read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert len(params) > 20
    for name, p in params.items():
        assert p.get("description"), f"{name} has no description: add it to the docstring Args"
        assert "defaultValue" in p or p.get("isOptional"), f"{name} has no default"


def test_no_latest_image_tags(fresh: Path):
    for path in fresh.rglob("*.yaml"):
        assert ":latest" not in path.read_text(), path


def test_components_are_reusable_from_yaml(fresh: Path, tmp_path: Path):
    """Another team's pipeline built from compiled/components/*.yaml, run through kfp.local."""
    script = f"""
import sys
from kfp import components, dsl, local
validate = components.load_component_from_file({str(fresh / "components" / "validate_inputs.yaml")!r})
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root={str(tmp_path)!r}, raise_on_error=True)
from components.run_params import defaults
common = {{**defaults(), "seq_len": 128, "nodes": 1, "nproc_per_node": 1, "rdzv_backend": "c10d",
    "schedule_time": "2026-01-05T00:00:00Z"}}
del common["train_data_uri"], common["base_model"]
data = {str(tmp_path / "data.jsonl")!r}
open(data, "w").write("{{}}\\n")
task = validate(train_data_uri=data, base_model="some/model", **common)
assert task.outputs["base_model"] == "some/model", task.outputs
assert task.outputs["train_data_uri"] == data, task.outputs
try:
    validate(train_data_uri="", base_model="", **{{**common, "nodes": 0}})
except RuntimeError:
    print("REJECTED")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "REJECTED" in out.stdout
    assert "train_data_uri is empty" in out.stdout and "nodes=0" in out.stdout


def test_compile_cli_rejects_unknown_target(tmp_path: Path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "compile",
            "--target",
            "argo",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "choose vertex, kfp or all" in out.stderr
