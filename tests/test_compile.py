"""Golden compile tests: compiled/ equals what the source compiles to, and each target loads where
it is meant to run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.params.run_checks import run_errors
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
    # The image runs as root (Dataflow's boot needs it); KFP task pods run as its llmft user.
    assert int(train["securityContext"]["runAsUser"]) == 1000  # int64: a string in JSON
    assert train["securityContext"]["runAsNonRoot"] is True
    # The Secret is referenced by name only; no token value can appear in the compiled YAML.
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", (fresh / "fine_tune.kfp.yaml").read_text())


def test_cleanup_is_an_uncached_exit_task_and_side_effects_are_uncached(fresh: Path):
    spec = yaml.safe_load((fresh / "fine_tune.vertex.yaml").read_text())
    cleanup = spec["root"]["dag"]["tasks"]["cleanup"]
    assert cleanup["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert not cleanup["cachingOptions"].get("enableCache")
    inner = run_tasks(spec)
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
from components.params.run_params import defaults
common = {{**defaults(), "seq_len": 128, "nodes": 1, "nproc_per_node": 1, "rdzv_backend": "c10d",
    "schedule_time": "2026-01-05T00:00:00Z", "target": "local", "run_id": "run-1"}}
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


CONSOLE_FILLED = {
    "train_data_uri": "gs://my-bucket/data/*.jsonl",
    "base_model": "gs://my-bucket/models/llama-3-8b",
    "project": "my-project",
    "work_uri": "gs://my-bucket/llmft-work",
    "dataflow_service_account": "llmft-dataflow@my-project.iam.gserviceaccount.com",
}
"""What a user must fill when launching from the console: data, base model, project, bucket,
and the Dataflow workers' account (issue 29 N17: the Compute Engine default has no roles under
secure-by-default IAM)."""


def _console_run(fresh: Path, target: str) -> tuple[dict, dict]:
    """The parameters a console launch sends (each default as compiled, plus CONSOLE_FILLED),
    and the compiled pipeline spec."""
    docs = list(yaml.safe_load_all((fresh / f"fine_tune.{target}.yaml").read_text()))
    spec = docs[0]
    params = {
        # The YAML stores every number as a float; KFP hands integer parameters over as ints.
        name: int(p["defaultValue"])
        if p["parameterType"] == "NUMBER_INTEGER"
        else p["defaultValue"]
        for name, p in spec["root"]["inputDefinitions"]["parameters"].items()
        if "defaultValue" in p
    }
    return {**params, **CONSOLE_FILLED}, spec


def run_tasks(spec: dict, component: str = "comp-exit-handler-1") -> dict:
    """Every task of the run's DAG, through its nested conditions, by task name."""
    tasks = {}
    for task, body in spec["components"][component]["dag"]["tasks"].items():
        name = body["componentRef"]["name"]
        if "dag" in spec["components"].get(name, {}):
            tasks.update(run_tasks(spec, name))
        tasks[task] = body
    return tasks


def test_an_unchanged_window_skips_everything_after_validation(fresh: Path):
    """validate_inputs' `proceed` guards preprocessing and all after it (issue 48)."""
    for target in ("vertex", "kfp"):
        text = (fresh / f"fine_tune.{target}.yaml").read_text()
        spec = next(yaml.safe_load_all(text))  # kfp: the kubernetes settings follow
        inner = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
        assert set(inner) == {"validate-inputs", "condition-2"}
        guard = inner["condition-2"]
        assert guard["taskInfo"]["name"] == "new-data"
        assert "validate-inputs-proceed" in guard["triggerPolicy"]["condition"]
        guarded = run_tasks(spec, guard["componentRef"]["name"])
        assert {"preprocess", "etcd-up", "train", "evaluate"} <= set(guarded)


def _constant(spec: dict, task: str, name: str) -> object:
    tasks = run_tasks(spec)
    return tasks[task]["inputs"]["parameters"][name]["runtimeValue"]["constant"]


@pytest.mark.parametrize(("target", "backend"), [("vertex", "vertex"), ("kfp", "gke")])
def test_a_console_launch_with_defaults_passes_the_pipelines_validation(
    fresh: Path, target: str, backend: str
):
    """Loaded the way the console does (defaults + the four required fields), the run passes
    the same checks validate_inputs runs, with the target the compiled pipeline passes it."""
    from components.params.param_values import params_from_mapping

    values, spec = _console_run(fresh, target)
    assert values["backend"] == backend
    assert values["preprocess_runner"] == "DataflowRunner"
    compiled_target = _constant(spec, "validate-inputs", "target")
    assert compiled_target == target

    def errors(**changes: object) -> list[str]:
        params = params_from_mapping({**values, **changes})
        return run_errors(params, target=compiled_target, run_id="run-123")

    assert errors() == []
    assert any(
        "dataflow_service_account is empty" in e for e in errors(dataflow_service_account="")
    )
    # The compiled defaults cannot train locally: the pipeline refuses `local` before starting.
    assert any("cannot run from a" in e for e in errors(backend="local"))
    # Idle GPUs are refused: one process per accelerator.
    assert any("one process per GPU" in e for e in errors(nproc_per_node=1))  # of 2 L4


@pytest.mark.parametrize("target", ["vertex", "kfp"])
def test_a_default_cloud_run_gives_valid_dataflow_options(fresh: Path, target: str):
    """The DataflowRunner options of a console launch with defaults, checked offline by Beam's
    own PipelineOptionsValidator (dry_run: no GCS calls) and by ours."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    from beam_preprocess.dataflow import validate_dataflow_options
    from beam_preprocess.options import PreprocessConfig
    from components.params.step_params import request_of
    from components.runtime.image import DEFAULT_IMAGE
    from components.steps.preprocess import COMPONENT as PREPROCESS_STEP
    from components.steps.preprocess import beam_argv

    values, _ = _console_run(fresh, target)
    request = request_of(PREPROCESS_STEP, train_data_uri=values["train_data_uri"], base_model=values["base_model"],
        data_kind=values["data_kind"], seq_len=int(values["seq_len"]),
        eval_fraction=values["eval_fraction"], preprocess_runner=values["preprocess_runner"],
        project=values["project"], region=values["region"], work_uri=values["work_uri"],
        run_id="llmft-fine-tune-20261203", dataflow_options=values["dataflow_options"],
        dataflow_service_account="preprocess@my-project.iam.gserviceaccount.com",
        hf_token_secret="", dataset=None, summary=None, gcp_resources="",
    )  # fmt: skip
    argv = beam_argv(request, "gs://my-bucket/root/run/preprocess/dataset")
    options = PipelineOptions([*argv, "--dry_run=True"])
    assert PipelineOptionsValidator(options, DataflowRunner()).validate() == []
    assert validate_dataflow_options(options, PreprocessConfig.from_options(options)) == []
    flags = dict(a.lstrip("-").split("=", 1) for a in argv if "=" in a)
    assert flags["sdk_container_image"] == DEFAULT_IMAGE
    assert flags["service_account_email"] == "preprocess@my-project.iam.gserviceaccount.com"
    assert flags["temp_location"].startswith("gs://my-bucket/llmft-work/dataflow/")
    assert flags["staging_location"].startswith("gs://my-bucket/llmft-work/dataflow/")
    assert flags["region"] == values["region"] and flags["project"] == "my-project"


def _executors(spec: dict) -> dict:
    return spec["deploymentSpec"]["executors"]


@pytest.mark.parametrize("target", ["vertex", "kfp"])
def test_every_step_is_sized_and_evaluation_gets_a_gpu(fresh: Path, target: str):
    """No step relies on Vertex's default 4 vCPU / 16 GB machine: each sets CPU and memory, and
    evaluation (a 7B model in bf16 is ~15 GB of weights) runs on a GPU with enough host memory."""
    _, spec = _console_run(fresh, target)
    for name, executor in _executors(spec).items():
        resources = executor["container"].get("resources", {})
        assert resources.get("resourceCpuLimit") and resources.get("resourceMemoryLimit"), name
    evaluate = _executors(spec)["exec-evaluate"]["container"]["resources"]
    assert float(evaluate["resourceMemoryLimit"].rstrip("G")) >= 32
    accelerator = evaluate["accelerator"]
    assert "eval_accelerator_count" in accelerator["resourceCount"]
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["eval_accelerator_count"]["defaultValue"] >= 1
    if target == "vertex":
        assert "eval_accelerator_type" in accelerator["resourceType"]
        assert params["eval_accelerator_type"]["defaultValue"] == "NVIDIA_L4"
    else:
        assert accelerator["resourceType"] == "nvidia.com/gpu"


def test_component_commands_exec_python(fresh: Path):
    """SIGTERM must reach the step (tests/test_component_signals.py runs it for real)."""
    for path in fresh.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            for executor in (doc or {}).get("deploymentSpec", {}).get("executors", {}).values():
                script = executor["container"]["command"][2]
                assert "exec python3 -m kfp.dsl.executor_main" in script, path


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


def _stack_machine_type(pool: str) -> str:
    """The `cpu` or `gpu` node pool's machine type of the stack in infra/ (GkeSettings default)."""
    import dataclasses

    infra = str(REPO / "infra")
    if infra not in sys.path:
        sys.path.insert(0, infra)
    from llmft_infra.settings import GkeSettings

    name = f"{pool}_machine_type"
    return str(next(f.default for f in dataclasses.fields(GkeSettings) if f.name == name))


def test_kfp_tasks_request_what_the_stacks_nodes_can_allocate(fresh: Path):
    """N2 and review P1: KFP copies only limits into the pod and Kubernetes then requests the
    limit, so a task without a request asking 8 CPU / 32G fit no e2-standard-8 node (about 7.4 CPU
    / 27 GiB allocatable), and the evaluate task's 12 CPU / 48G no g2-standard-12 node. Every task
    requests what a node of its pool in the stack's default settings can allocate (evaluate: the
    GPU pool; the rest: the CPU pool); its limits are kept (DirectRunner and evaluation may
    burst), and Vertex (which sizes machines from limits) gets no requests."""
    from components.platform.platform_facts import gke_allocatable, gke_fit_error

    pools = {"cpu": _stack_machine_type("cpu"), "gpu": _stack_machine_type("gpu")}
    for machine in pools.values():
        assert gke_allocatable(machine) is not None, f"{machine} is missing from platform_facts"
    _, spec = _console_run(fresh, "kfp")
    placed = {"cpu": 0, "gpu": 0}
    for name, executor in _executors(spec).items():
        resources = executor["container"]["resources"]
        pool = "gpu" if "accelerator" in resources else "cpu"
        placed[pool] += 1
        cpu, memory = resources.get("resourceCpuRequest"), resources.get("resourceMemoryRequest")
        assert cpu and memory, f"{name} has no request: Kubernetes would request its limit"
        assert gke_fit_error(name, cpu, memory, pools[pool]) is None
        assert resources["resourceCpuLimit"] and resources["resourceMemoryLimit"]
    assert placed == {"cpu": 7, "gpu": 1}  # evaluate alone runs on a GPU node
    preprocess = _executors(spec)["exec-preprocess"]["container"]["resources"]
    assert gke_fit_error("preprocess", preprocess["resourceCpuLimit"],
                         preprocess["resourceMemoryLimit"], pools["cpu"])  # the old failure  # fmt: skip
    evaluate = _executors(spec)["exec-evaluate"]["container"]["resources"]
    assert gke_fit_error("evaluate", evaluate["resourceCpuRequest"],
                         evaluate["resourceMemoryRequest"], "g2-standard-12") is None  # fmt: skip
    assert gke_fit_error("evaluate", evaluate["resourceCpuLimit"],
                         evaluate["resourceMemoryLimit"], "g2-standard-12")  # P1's failure  # fmt: skip
    _, vertex = _console_run(fresh, "vertex")
    for executor in _executors(vertex).values():
        assert "resourceCpuRequest" not in executor["container"]["resources"]


@pytest.mark.parametrize("target", ["vertex", "kfp"])
def test_train_and_register_take_uris_not_input_artifacts(fresh: Path, target: str):
    """N14: the KFP launcher downloads every input artifact into the task's pod before it runs:
    the whole dataset into the 1 CPU / 4G train launcher, the whole model (140 GB for a 70B) into
    register. Both take URIs as strings; the artifacts still record where the data is."""
    _, spec = _console_run(fresh, target)
    components = spec["components"]
    small = {"system.Metrics"}  # the gate's metrics: a small JSON file, fine to download
    for name in ("comp-train", "comp-register", "comp-deploy"):
        artifacts = components[name]["inputDefinitions"].get("artifacts", {})
        types = {a["artifactType"]["schemaTitle"] for a in artifacts.values()}
        assert types <= small | {"google.VertexModel"}, (name, types)
    assert "dataset_uri" in components["comp-train"]["inputDefinitions"]["parameters"]
    assert "model_uri" in components["comp-register"]["inputDefinitions"]["parameters"]
    # Lineage: preprocess still outputs the Dataset artifact, train the Model artifact.
    assert "dataset" in components["comp-preprocess"]["outputDefinitions"]["artifacts"]
    assert "model" in components["comp-train"]["outputDefinitions"]["artifacts"]
    assert "dataset_uri" in components["comp-preprocess"]["outputDefinitions"]["parameters"]
    assert "model_uri" in components["comp-train"]["outputDefinitions"]["parameters"]
