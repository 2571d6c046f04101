"""docs/deploy/README.md end to end, offline: its `pulumi config set` lines give the stack settings,
the Pulumi program runs on them under Pulumi's mocks, its outputs go through the guide's
`llmft config from-stack` line into the guide's deploy.yaml, and every `llmft run` line of the
guide then passes a dry run (every check a submission makes). The rest of the guide's `llmft`
lines run against the recording fakes in tests/test_deploy_cli.py."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.pulumi_mocks import run_stack
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.cli.run import DRY_RUN_PARAMETERS

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs/deploy/README.md"
ENV = {
    "PROJECT": "my-project",
    "REGION": "us-central1",
    "BUCKET": "my-bucket",
    "KFP_HOST": "http://localhost:8080",
}
DEPLOYER = "user:alice@example.com"


def guide_lines() -> list[str]:
    """Every line of the guide's bash blocks, in order, continuations joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [
        line.split("  #")[0].strip() for line in lines if line.strip() and not line.startswith("#")
    ]


def _expand(line: str) -> str:
    line = line.replace("$(gcloud config get account)", DEPLOYER.removeprefix("user:"))
    return re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: ENV.get(m.group(1), m.group(0)), line)


def _set_path(settings: dict[str, Any], key: str, value: str) -> None:
    """`pulumi config set --path llmft:a.b[0] v` into a nested mapping (as Pulumi stores it)."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", key.removeprefix("llmft:"))
    node: Any = settings
    for part, following in zip(parts, [*parts[1:], None], strict=True):
        leaf = following is None
        if part.startswith("["):
            index = int(part[1:-1])
            while len(node) <= index:
                node.append(None)
            if leaf:
                node[index] = value
            else:
                node[index] = node[index] or ([] if following.startswith("[") else {})
                node = node[index]
        elif leaf:
            node[part] = value
        else:
            node = node.setdefault(part, [] if following.startswith("[") else {})


def stack_settings(lines: list[str]) -> dict[str, Any]:
    """What the guide's `pulumi config set` lines configure."""
    settings: dict[str, Any] = {}
    for line in lines:
        args = shlex.split(_expand(line))
        if args[:3] != ["pulumi", "config", "set"]:
            continue
        rest = [a for a in args[3:] if a != "--path"]
        key, value = rest
        if "--path" in args:
            _set_path(settings, key, value)
        else:
            settings[key.removeprefix("llmft:")] = value
    return settings


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "KF_PIPELINES_ENDPOINT", "KFP_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(REPO)


def test_the_guide_from_pulumi_up_to_a_run(offline: None, tmp_path: Path) -> None:
    from llmft_infra.settings import parse_settings

    lines = guide_lines()
    settings = stack_settings(lines)
    assert settings["gke"] == {
        "gpu_machine_type": "g2-standard-24", "accelerator_type": "nvidia-l4", "accelerator_count": "2",
    }  # fmt: skip
    assert settings["deployers"] == [DEPLOYER]
    _, outputs = run_stack(parse_settings(settings))  # `pulumi up`, under Pulumi's mocks
    assert outputs["gke_cluster"] == "projects/my-project/locations/us-central1/clusters/llmft"

    deploy_yaml = tmp_path / "deploy.yaml"
    ran: list[str] = []
    for line in lines:
        expanded = _expand(line)
        if expanded.startswith("cp docs/deploy/example.yaml deploy.yaml"):
            shutil.copy(REPO / "docs/deploy/example.yaml", deploy_yaml)
            ran.append("cp")
        elif "llmft config from-stack" in expanded:
            producer, consumer = expanded.split("|")
            assert producer.split() == ["pulumi", "-C", "infra", "stack", "output", "--json"]
            args = shlex.split(consumer)[1:]
            args = [str(deploy_yaml) if a == "deploy.yaml" else a for a in args]
            result = CliRunner().invoke(app, args, input=json.dumps(outputs))
            assert result.exit_code == 0, result.output
            ran.append("from-stack")
        elif expanded.startswith("llmft run "):
            args = [str(deploy_yaml) if a == "deploy.yaml" else a for a in shlex.split(expanded)]
            result = CliRunner().invoke(app, [*args[1:], "--dry-run"])
            assert result.exit_code == 0, f"{line}\n{result.output}"
            backend = args[args.index("--backend") + 1]
            params = json.loads(result.output.split(DRY_RUN_PARAMETERS + "\n", 1)[1])
            ran.append(f"run {backend}")
            _check_run(backend, params, outputs)
    assert ran == ["cp", "from-stack", "run vertex", "run kfp"]
    written = yaml.safe_load(deploy_yaml.read_text())
    assert written["vertex"]["project"] == written["parameters"]["project"] == "my-project"


def _check_run(backend: str, params: dict[str, Any], outputs: dict[str, Any]) -> None:
    """The run gets the stack's names and the GPU pool's machines."""
    from components.platform.platform_facts import gke_accelerator

    assert params["work_uri"] == outputs["work_uri"]
    # C9: nothing is registered before the guide's first run, so it must name its base model
    # (the validate step would stop at `latest-registered`; the dry run cannot see that).
    assert params["base_model"] != "latest-registered"
    assert params["dataflow_service_account"] == outputs["dataflow_service_account"]
    assert gke_accelerator(params["accelerator_type"]) == outputs["accelerator_type"]
    assert params["accelerator_count"] == outputs["accelerator_count"]
    assert params["machine_type"] == outputs["gpu_machine_type"]
    if backend == "kfp":
        assert (params["backend"], params["service_account"]) == ("gke", outputs["trainer_ksa"])
    else:
        assert params["backend"] == "vertex"
        assert params["service_account"] == outputs["trainer_service_account"]


def test_the_guide_never_creates_the_secret_the_stack_created() -> None:
    """C10: `gcloud secrets create` of the stack's secret fails with ALREADY_EXISTS; the guide
    adds versions to it instead."""
    from llmft_infra.settings import names

    secret = names().hf_token_secret
    creates = [line for line in guide_lines() if line.startswith("gcloud secrets create")]
    assert not [line for line in creates if secret in line]
    adds = [line for line in guide_lines() if line.startswith(("printf", "gcloud secrets"))]
    assert all(f"gcloud secrets versions add {secret}" in line for line in adds)


DOCUMENTED_CONFIGS = sorted((REPO / "docs/deploy").glob("*.yaml"))


def _dry_run(config: Path, backend: str, *extra: str) -> Any:
    args = ["run", "--backend", backend, "--config", str(config), "--dry-run"]
    if backend == "vertex":
        args += ["--project", "my-project", "--pipeline-root", "gs://my-bucket/pipeline-root"]
    else:
        args += ["--host", "http://localhost:8080", "--param", "project=my-project"]
    args += ["--schedule-time", "2026-01-05T03:00:00Z", "--param", "base_model=org/model", *extra]
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("backend", ["vertex", "kfp"])
def test_documented_configs_register_a_model_that_starts(offline: None, backend: str) -> None:
    """C2: every documented deploy config passes the dry run, and a config that registers a model
    pairs its serving image with the preset that can start it (the serving container builds)."""
    from components.params.param_values import params_from_mapping
    from components.params.run_params import RunParams
    from components.serving.presets import ServingSpec, preset_image_error, serving_container

    configs = [
        c
        for c in DOCUMENTED_CONFIGS
        if any("parameters" in (d or {}) for d in yaml.safe_load_all(c.read_text()))
    ]
    assert configs, "docs/deploy has no deploy config"
    for config in configs:
        result = _dry_run(config, backend)
        assert result.exit_code == 0, f"{config.name}: {result.output}"
        checked = json.loads(result.output.split(DRY_RUN_PARAMETERS + "\n", 1)[1])
        run = params_from_mapping(checked, base=RunParams.for_target(backend))
        if not run.register_model:
            continue
        assert preset_image_error(run.serving_preset, run.serving_image) is None
        container = serving_container(
            ServingSpec(run.serving_preset, run.serving_image, "m", run.seq_len)
        )
        assert container.image_uri == run.serving_image
        if run.serving_preset != "custom":
            assert "vllm" in " ".join(container.command or [])


def test_a_serving_image_the_preset_cannot_start_is_refused(offline: None) -> None:
    """C2's reproduction: the TGI image under the default vLLM preset is refused before anything
    starts, with the fix; with serving_preset=custom it passes."""
    tgi = "us-docker.pkg.dev/deeplearning-platform-release/gcr.io/huggingface-text-generation-inference-cu124.2-4.ubuntu2204.py311:20250115"
    config = REPO / "docs/deploy/example.yaml"
    refused = _dry_run(config, "vertex", "--param", f"serving_image={tgi}")
    assert refused.exit_code == 2, refused.output
    assert "serving_preset=vertex-vllm" in refused.output
    assert "serving_preset=custom" in refused.output
    custom = _dry_run(
        config, "vertex", "--param", f"serving_image={tgi}", "--param", "serving_preset=custom"
    )
    assert custom.exit_code == 0, custom.output
