"""Run parameters: one schema (components/params/run_params.py), everything else derived from it, and one
validation that reports every problem at once, each saying what to change."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
from pathlib import Path

import pytest

from components import kfp_components
from components.params.param_values import field_errors, params_from_mapping
from components.params.run_checks import run_errors
from components.params.run_params import (
    LATEST_REGISTERED,
    SCHEDULE_TIME_PLACEHOLDER,
    RunParams,
    choices,
    defaults,
    describe,
    fields,
)
from components.params.step_params import request_of
from components.preflight.validation import check_run_parameters
from components.steps.validate import COMPONENT as VALIDATE_STEP
from components.steps.validate import run as validate_step
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def data_file(tmp_path: Path) -> str:
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "p", "response": "r"}\n')
    return str(path)


def good(data_file: str, **changes: object) -> dict[str, object]:
    return {"train_data_uri": data_file, "base_model": "m", **changes}


def test_valid_parameters_have_no_errors(data_file: str) -> None:
    assert check_run_parameters(good(data_file)) == RunParams(
        train_data_uri=data_file, base_model="m"
    )


def test_all_errors_are_reported_together(data_file: str) -> None:
    bad = good(data_file, backend="k8s", nodes=0, seq_len=4, train_data_uri=" ")
    errors = run_errors(params_from_mapping(bad))
    assert len(errors) == 4, errors
    assert any("choose one of local, gke, vertex" in e for e in errors)
    with pytest.raises(ValueError, match="4 invalid run parameter"):
        validate_step(request_of(VALIDATE_STEP, schedule_time="", **defaults() | bad))


def test_types_and_unknown_names_are_reported_together() -> None:
    with pytest.raises(ValueError) as err:
        params_from_mapping({"seq_len": "abc", "nodez": 2, "register_model": "yes"})
    text = str(err.value)
    assert "unknown parameter(s) nodez" in text
    assert "seq_len='abc': must be an integer" in text
    assert "register_model='yes': must be true or false" in text


def test_one_rule_per_parameter_everywhere() -> None:
    """The bounds the issue found disagreeing now come from one place."""
    from beam_preprocess.data_shape import DATA_KINDS
    from trainer.packed_data.format import SEQ_LEN_MIN

    assert RunParams.learning_rate == TrainConfig.lr  # the trainer's default, not a second one
    assert choices("data_kind") == DATA_KINDS  # the Literal spells the preprocessing's choices
    assert run_errors(params_from_mapping({"seq_len": SEQ_LEN_MIN - 1}))[2:] == [
        f"seq_len={SEQ_LEN_MIN - 1}: use a value >= {SEQ_LEN_MIN} and <= 131072"
    ]
    assert TrainConfig(model="m", data="d", output="o", seq_len=SEQ_LEN_MIN - 1).errors()
    assert field_errors({"eval_fraction": 0.5}) == [
        "eval_fraction=0.5: use a value > 0.0 and < 0.5"
    ]


def test_cloud_runs_need_project_bucket_and_remote_data(data_file: str) -> None:
    joined = "\n".join(run_errors(params_from_mapping(good(data_file, backend="vertex"))))
    assert "project is empty" in joined and "work_uri" in joined
    assert "upload the data to gs://" in joined
    gke = run_errors(params_from_mapping(good(data_file, backend="gke", accelerator_type="H100")))
    assert any(e.startswith("accelerator_type: accelerator 'H100'") for e in gke), gke


def test_register_needs_a_pinned_serving_image_and_a_model_name(data_file: str) -> None:
    params = params_from_mapping(good(data_file, register_model=True, serving_image="img:latest"))
    errors = run_errors(params)
    assert any("registered_model is empty" in e for e in errors)
    assert any("uses :latest: pin a version" in e for e in errors)


def test_kubernetes_names_and_trainer_overrides_are_checked_up_front(data_file: str) -> None:
    overrides = {"micro_batch_size": -1, "dtype": "fp8", "lr": 1.0, "bogus": 1}
    errors = run_errors(
        params_from_mapping(
            good(data_file, namespace="ML", hf_token_secret="HF TOKEN", trainer_overrides=overrides)
        )
    )
    joined = "\n".join(errors)
    assert "namespace='ML' is not a Kubernetes name" in joined
    assert "hf_token_secret='HF TOKEN': give a secret's name" in joined
    assert "trainer_overrides.lr: set the run parameter learning_rate instead" in joined
    errors = run_errors(
        params_from_mapping(good(data_file, trainer_overrides={"micro_batch_size": -1, "bogus": 1}))
    )
    assert errors == ["trainer_overrides: invalid trainer config: unknown field 'bogus'"]
    errors = run_errors(
        params_from_mapping(good(data_file, trainer_overrides={"micro_batch_size": 0}))
    )
    assert errors == ["trainer_overrides: micro_batch_size must be >= 1 (got 0)"]


def test_input_that_matches_nothing_is_refused_before_the_run(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "*.jsonl")
    with pytest.raises(ValueError, match="matches no file"):
        check_run_parameters({"train_data_uri": missing, "base_model": "m"})


def test_schedule_time_fills_the_data_window(tmp_path: Path) -> None:
    window = tmp_path / "2026-12-01T00:00:00Z"
    window.mkdir()
    (window / "a.jsonl").write_text("{}\n")
    params = {
        **defaults(),
        "base_model": "m",
        "train_data_uri": f"{tmp_path}/{SCHEDULE_TIME_PLACEHOLDER}/*.jsonl",
    }
    base, uri, champion, timeout_s, estimate, mix, proceed, record = validate_step(
        request_of(VALIDATE_STEP, schedule_time="2026-12-01T00:00:00Z", **params)
    )
    assert (base, uri, champion) == ("m", f"{window}/*.jsonl", "")
    assert (mix, proceed, record) == ("", True, "")  # no mix, no work_uri: nothing recorded
    assert timeout_s == 0 and estimate["usd"] == 0.0  # local: not priced, no budget
    with pytest.raises(ValueError, match="not started by a schedule"):
        validate_step(request_of(VALIDATE_STEP, schedule_time="", **params))


def test_champion_latest_registered_needs_a_model_name(data_file: str) -> None:
    with pytest.raises(ValueError, match="registered_model is empty"):
        validate_step(
            request_of(
                VALIDATE_STEP,
                schedule_time="",
                **defaults() | good(data_file, champion_model=LATEST_REGISTERED),
            )
        )


def test_validate_inputs_takes_exactly_the_run_parameters() -> None:
    """The first step's signature is written out for KFP; it cannot drift from the schema."""
    component = kfp_components.validate_inputs.python_func
    names = list(inspect.signature(component).parameters)
    assert names == [*fields(), "target", "run_id", "schedule_time"]
    for name, f in fields().items():
        annotation = inspect.signature(component).parameters[name].annotation
        assert annotation in (f.type, "str", str, int, float, bool, dict), name


TARGETS = ("vertex", "kfp", "local")


def test_pipeline_signature_and_descriptions_come_from_the_schema() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.fine_tune import build_fine_tune

    # Built on a fresh thread's short stack: each KFP task setting calls inspect.stack(), which
    # reads every frame of the caller's stack and looks each up among the loaded modules; under
    # pytest, late in a worker, that was 12 s of the three builds, 2 s on a thread.
    with ThreadPoolExecutor(1) as thread:
        built = dict(zip(TARGETS, thread.map(build_fine_tune, TARGETS), strict=True))
    for target in TARGETS:
        spec = built[target].component_spec.inputs
        assert list(spec) == list(fields())
        for name, default in defaults(target).items():
            assert spec[name].default == default, (target, name)
            assert spec[name].description == describe(name), name
    assert defaults("kfp")["backend"] == "gke" and defaults("vertex")["backend"] == "vertex"


def test_every_field_has_a_description_and_the_parameters_are_frozen() -> None:
    for name, f in fields().items():
        assert len(describe(name)) > 20, name
        assert f.metadata["help"].endswith("."), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunParams().seq_len = 1  # type: ignore[misc]


@pytest.mark.integration  # runs git
def test_each_default_is_written_once_in_the_code() -> None:
    """`git grep` finds each run default in one place (docs, tests and benchmarks aside)."""
    owners = {
        '"kubeflow"': "components/launchers/vocab.py",
        '"llmft-hf-token"': "components/params/run_params.py",
        '"us-central1"': "components/launchers/vocab.py",
        '"llmft-trainer"': "components/params/target_defaults.py",
        "lr: float = 2e-5": "trainer/config.py",  # learning_rate's default is the trainer's
        "1e-3": None,  # the old pipeline default, gone
    }
    for needle, owner in owners.items():
        found = subprocess.run(
            ["git", "grep", "-l", "-F", needle, "--", "*.py", ":!tests", ":!benchmarks"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert found == ([owner] if owner else []), (needle, found)


def test_run_and_schedule_help_list_every_parameter_with_its_default_once() -> None:
    import json

    from typer.testing import CliRunner

    from pipelines.cli import app

    for command in ("run", "schedule"):
        result = CliRunner(env={"COLUMNS": "1000"}).invoke(app, [command, "--help"])
        assert result.exit_code == 0, result.output
        for name, default in defaults().items():
            entry = f"{name} [default: {json.dumps(default)}]: {describe(name)}"
            assert result.output.count(entry) == 1, (command, entry)


def test_preprocess_is_not_retried_in_the_compiled_pipeline() -> None:
    """Its failures (bad input, too many rejects, no training rows) are permanent."""
    import yaml
    from test_compile import run_tasks

    spec = yaml.safe_load((ROOT / "compiled" / "fine_tune.vertex.yaml").read_text())
    tasks = run_tasks(spec)
    assert "retryPolicy" not in tasks["preprocess"]
    assert "retryPolicy" in tasks["train"]  # it resumes from its checkpoint


def test_forgetting_threshold_is_a_fraction(data_file: str) -> None:
    assert run_errors(params_from_mapping(good(data_file, min_general_retained=0.9))) == []
    errors = run_errors(params_from_mapping(good(data_file, min_general_retained=1.5)))
    assert any(e.startswith("min_general_retained=1.5") for e in errors), errors


# -- named checks (issue 13) ---------------------------------------------------------------------

from components.launchers.vocab import resolve_nproc_per_node  # noqa: E402
from components.params.param_checks import (  # noqa: E402
    check_backend_for_target,
    check_dataflow_service_account,
    check_eval_accelerator,
    check_not_a_token,
    check_nproc_per_node,
    check_pipeline_root,
    check_service_account,
)
from components.runtime.run_identity import check_placeholder_resolved  # noqa: E402

TOKEN = "hf_" + "aBcD1234" * 5


def test_a_token_is_refused_in_any_parameter_and_never_echoed(data_file: str):
    params = good(data_file, hf_token_secret=TOKEN, trainer_overrides={"hub_token": TOKEN})
    errors = run_errors(params_from_mapping(params))
    assert sum("looks like a Hugging Face token" in e for e in errors) == 2
    assert not any(TOKEN in e for e in errors)
    assert check_not_a_token("hf_token_secret", "llmft-hf-token") is None


def test_local_backend_only_from_the_local_runner():
    assert check_backend_for_target("local", "local") is None
    for target in ("vertex", "kfp"):
        assert "cannot run from a" in (check_backend_for_target("local", target) or "")
        assert check_backend_for_target("gke", target) is None
    assert check_backend_for_target("local", "") is None  # target unknown (a direct call)


def test_one_process_per_gpu():
    assert check_nproc_per_node("vertex", 0, 8) is None
    assert check_nproc_per_node("gke", 8, 8) is None
    assert "set nproc_per_node to 8 or 0" in (check_nproc_per_node("vertex", 2, 8) or "")
    assert check_nproc_per_node("local", 2, 8) is None  # no GPUs locally
    assert resolve_nproc_per_node("vertex", 0, 8) == 8
    assert resolve_nproc_per_node("gke", 0, 0) == 1
    assert resolve_nproc_per_node("local", 0, 8) == 1
    assert resolve_nproc_per_node("local", 2, 8) == 2


def test_identities_are_checked_per_backend():
    assert check_service_account("vertex", "") is None  # the Custom Code Service Agent
    assert check_service_account("vertex", "trainer@my-proj.iam.gserviceaccount.com") is None
    assert "service-account email" in (check_service_account("vertex", "llmft-pipeline") or "")
    assert "service_account is empty" in (check_service_account("gke", "") or "")
    assert "not a Google service-account email" in (
        check_service_account("gke", "trainer@my-proj.iam.gserviceaccount.com") or ""
    )
    assert check_service_account("gke", "llmft-pipeline") is None
    # N17: empty would run the workers as the Compute Engine default account, which has no
    # roles under secure-by-default IAM; naming it explicitly is the user's informed choice.
    missing = check_dataflow_service_account("DataflowRunner", "") or ""
    assert "dataflow_service_account is empty" in missing and "secure-by-default" in missing
    assert check_dataflow_service_account("DirectRunner", "") is None
    assert (
        check_dataflow_service_account(
            "DataflowRunner", "123-compute@developer.gserviceaccount.com"
        )
        is None
    )
    assert "not a service-account email" in (
        check_dataflow_service_account("DataflowRunner", "x") or ""
    )


def test_unresolved_placeholders_and_pipeline_roots():
    message = check_placeholder_resolved("run id", "{{$.pipeline_job_uuid}}") or ""
    assert "unresolved KFP placeholder" in message
    # Review P3: substitution of the placeholder first appears in the 2.5.0 driver (#11599).
    assert "KFP >= 2.5.0 resolves the run id" in message
    from components.runtime.run_identity import safe_run_id

    with pytest.raises(ValueError, match="unresolved KFP placeholder"):
        safe_run_id("{{$.pipeline_job_uuid}}")
    assert "gs:// pipeline root" in (check_pipeline_root("gke", "minio://mlpipeline") or "")
    assert check_pipeline_root("gke", "gs://b/root") is None
    assert check_pipeline_root("local", None) is None


def test_the_schema_validation_applies_the_named_checks(data_file: str):
    """`RunParams.errors()` is the one validation: the target's rules come with `target`."""
    cloud = good(
        "gs://b/data.jsonl", backend="gke", project="my-project", work_uri="gs://b/w",
        service_account="llmft-pipeline", accelerator_type="NVIDIA_L4",
        machine_type="g2-standard-96",
    )  # fmt: skip
    params = params_from_mapping(cloud)
    assert run_errors(params, target="kfp", run_id="run-1") == []
    assert params.nproc_per_node == 0  # one per accelerator
    problems = {
        "backend": ("local", "cannot run from a kfp pipeline"),
        "nproc_per_node": (2, "one process per GPU"),
        "service_account": ("", "service_account is empty"),
        "eval_accelerator_count": (0, "at least 1 GPU"),
        "hf_token_secret": ("bad name", "give a secret's name"),
        # N15 on GKE: 8 L4s per pod need a node carrying 8 of them.
        "machine_type": ("a3-highgpu-8g", "cannot land on a a3-highgpu-8g node"),
        "accelerator_count": (9, "no GKE node carries more than 8"),
    }
    for name, (value, message) in problems.items():
        errors = run_errors(dataclasses.replace(params, **{name: value}), target="kfp")
        assert any(message in e for e in errors), (name, errors)
    assert any(
        "unresolved KFP placeholder" in e
        for e in run_errors(params, target="kfp", run_id="{{$.pipeline_job_uuid}}")
    )
    assert RunParams.for_target("kfp").service_account == "llmft-trainer"
    assert RunParams.for_target("vertex").backend == "vertex"
    assert RunParams().backend == "local" and RunParams().preprocess_runner == "DirectRunner"


def test_cloud_evaluation_runs_on_a_gpu():
    assert check_eval_accelerator("vertex", "NVIDIA_L4", 1) is None
    assert "not a Vertex accelerator" in (check_eval_accelerator("vertex", "L4", 1) or "")
    assert "at least 1 GPU" in (check_eval_accelerator("kfp", "", 0) or "")
    assert check_eval_accelerator("local", "", 0) is None


@pytest.mark.parametrize(
    ("backend", "machine", "accelerator", "count", "expected"),
    [
        ("vertex", "a3-highgpu-8g", "NVIDIA_L4", 8, "use g2-standard-96"),
        ("vertex", "a3-highgpu-8g", "NVIDIA_H100_80GB", 2, "use a3-highgpu-2g"),
        ("vertex", "a3-highgpu-8g", "", 0, "set accelerator_type=NVIDIA_H100_80GB"),
        ("vertex", "n1-standard-8", "NVIDIA_TESLA_T4", 3, "must be one of 1, 2, 4"),
        ("gke", "g2-standard-24", "NVIDIA_L4", 4, "it carries 2 x nvidia-l4"),
        ("gke", "g2-standard-24", "NVIDIA_H100_80GB", 1, "it carries 2 x nvidia-l4"),
        ("gke", "a3-highgpu-8g", "", 8, "accelerator_type is empty"),
    ],
)
def test_machine_and_accelerators_are_checked_against_the_platform_facts(
    backend: str, machine: str, accelerator: str, count: int, expected: str
) -> None:
    """N15: a combination the platform cannot schedule is refused by the first step (and by
    `llmft run --dry-run`), before Dataflow or any GPU is paid for."""
    from components.params.param_checks import check_machine_accelerator

    errors = check_machine_accelerator(backend, machine, accelerator, count)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    ("backend", "machine", "accelerator", "count"),
    [
        ("vertex", "a3-highgpu-8g", "NVIDIA_H100_80GB", 8),
        ("vertex", "g2-standard-24", "NVIDIA_L4", 2),
        ("vertex", "n2-standard-8", "", 0),
        ("vertex", "n1-standard-16", "NVIDIA_TESLA_T4", 4),
        ("vertex", "a9-newgpu-8g", "NVIDIA_B200", 8),  # a type the facts do not know: not judged
        ("gke", "g2-standard-24", "nvidia-l4", 2),
        ("gke", "a3-highgpu-8g", "NVIDIA_H100_80GB", 4),  # part of a node
        ("local", "a3-highgpu-8g", "NVIDIA_L4", 8),
    ],
)
def test_schedulable_machine_and_accelerators_pass(
    backend: str, machine: str, accelerator: str, count: int
) -> None:
    from components.params.param_checks import check_machine_accelerator

    assert check_machine_accelerator(backend, machine, accelerator, count) == []


# -- weighted mixes and replay (issue 48) ---------------------------------------------------------


def test_a_bad_mix_and_a_missing_replay_source_each_get_one_line(
    data_file: str, tmp_path: Path
) -> None:
    mix = f"a=0,=1,b=-2,{data_file}=0.2,{tmp_path}/none/*.jsonl=0.1"
    with pytest.raises(ValueError) as caught:
        check_run_parameters(
            good(
                data_file,
                train_data_mix=mix,
                replay_fraction=0.1,
                replay_source=f"general,{tmp_path}/nope.jsonl,previous:0",
            )
        )
    lines = str(caught.value).splitlines()[1:]
    assert lines == [
        "  - replay_source 'previous:0': write previous or previous:N (N >= 1)",
        "  - train_data_mix: a: the weight '0' is not a positive number (write SOURCE=WEIGHT, "
        "e.g. train=0.7)",
        "  - train_data_mix: an entry has an empty source (weight 1)",
        "  - train_data_mix: b: the weight '-2' is not a positive number (write SOURCE=WEIGHT, "
        "e.g. train=0.7)",
        f"  - mix/replay source '{tmp_path}/none/*.jsonl' matches no file: check the path or glob",
        f"  - mix/replay source '{tmp_path}/nope.jsonl' matches no file: check the path or glob",
    ]
    ok = good(data_file, train_data_mix=f"{data_file}=0.7,{data_file}x=0.3")
    with pytest.raises(ValueError, match="matches no file"):
        check_run_parameters(ok)
    other = tmp_path / "general.jsonl"
    other.write_text('{"prompt": "q", "response": "a"}\n')
    mixed = good(data_file, train_data_mix=f"train=0.7,{other}=0.3", replay_fraction=0.2)
    assert check_run_parameters(mixed).replay_fraction == 0.2
