"""Serving (issue 30): presets against vLLM's documented flags, the register step's requests
(Model.upload with the preset, model evaluation, champion alias, VertexModel artifact), the deploy
step's requests (endpoint create/reuse, deploy, smoke prompt, traffic split, rollback), the
CustomJob's TensorBoard and CMEK fields, and Vertex Experiments.

Cloud calls stop at the GAPIC clients (tests/fakes/vertex.py); the requests they receive are
compared with reviewed golden files (tests/golden/README.md).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

import pytest
from fakes.vertex import FakeEndpoints, FakeModelService
from google.auth.credentials import AnonymousCredentials
from google.protobuf import json_format

from components.params.run_checks import run_errors
from components.serving import presets as serving
from components.serving.endpoints import DeployOptions, deploy_errors, deploy_version
from components.serving.traffic import challenger_split

pytestmark = pytest.mark.unit

PROJECT, LOCATION = "my-project", "us-central1"
PARENT = f"projects/{PROJECT}/locations/{LOCATION}"
MG_IMAGE = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:20251205_0916_RC01"
VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"

# vLLM's flags as documented, for the servers the presets start (vLLM does not install on a
# CPU-only machine with this project's torch, so its own parser cannot be imported here).
# Sources: docs.vllm.ai/en/stable/configuration/engine_args.html (--model, --served-model-name,
# --max-model-len, --dtype, --tensor-parallel-size, --gpu-memory-utilization,
# --disable-log-stats, --load-format incl. runai_streamer, --enable-lora, --max-lora-rank),
# docs.vllm.ai/en/stable/serving/openai_compatible_server.html (--host, --port, --lora-modules
# name=path), docs.vllm.ai/en/stable/models/extensions/runai_model_streamer.html (gs:// models).
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
VLLM_LOAD_FORMATS = ("auto", "pt", "safetensors", "runai_streamer", "dummy", "bitsandbytes")
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_documented_parser() -> argparse.ArgumentParser:
    """An argparse parser of the documented flags the presets may use, with their types and
    choices, so a typo, a wrong value or an unknown flag fails like in vLLM's own parser."""
    parser = argparse.ArgumentParser(prog="vllm", exit_on_error=False, allow_abbrev=False)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--dtype", choices=VLLM_DTYPES)
    parser.add_argument("--tensor-parallel-size", type=int)
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--disable-log-stats", action="store_true")
    parser.add_argument("--load-format", choices=VLLM_LOAD_FORMATS)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--lora-modules", nargs="+")
    parser.add_argument("--max-lora-rank", type=int, choices=VLLM_MAX_LORA_RANKS)
    return parser


def spec(**overrides: Any) -> serving.ServingSpec:
    kwargs: dict[str, Any] = dict(
        preset="vertex-vllm", image=MG_IMAGE, served_model_name="tiny-llama-ft", max_model_len=512
    )
    kwargs.update(overrides)
    return serving.ServingSpec(**kwargs)


@pytest.mark.parametrize("preset", ["vertex-vllm", "vllm-openai"])
def test_vllm_presets_parse_with_the_documented_flags(preset: str) -> None:
    container = serving.serving_container(
        spec(preset=preset, image=MG_IMAGE if preset == "vertex-vllm" else VLLM_IMAGE)
    )
    args = vllm_documented_parser().parse_args(container.args)
    assert args.model == "$(AIP_STORAGE_URI)"  # Vertex's copy of the artifact
    assert (args.host, args.port) == ("0.0.0.0", 8080) and container.ports == [8080]
    assert args.max_model_len == 512 and args.served_model_name == ["tiny-llama-ft"]
    assert args.dtype == "auto" and args.tensor_parallel_size == 1
    assert not args.enable_lora
    if preset == "vertex-vllm":
        assert container.command == ["python", "-m", "vllm.entrypoints.api_server"]
        assert (container.predict_route, container.health_route) == ("/generate", "/ping")
        assert args.load_format is None  # the Model Garden image downloads gs:// itself
        assert container.environment_variables == {
            "MODEL_ID": "tiny-llama-ft",
            "DEPLOY_SOURCE": "llmft",
        }
    else:
        assert container.command == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        assert container.predict_route == "/v1/chat/completions"
        assert container.health_route == "/health"
        assert args.load_format == "runai_streamer"
    assert container.shared_memory_size_mb == 16 * 1024


def test_adapter_serving_is_refused_until_verified() -> None:
    """Review P1: upstream's api_server has no --lora-modules and the smoke prompt would not reach
    the adapter, so lora_serving=adapter is refused (RunParams and the serving container) with a
    message naming lora_serving=merged; the engine args never carry --lora-modules."""
    from components.params.run_params import RunParams

    adapter = spec(lora=True, lora_serving="adapter", base_model_uri="gs://b/base", lora_rank=12)
    with pytest.raises(ValueError, match="lora_serving=merged"):
        serving.serving_container(adapter)
    assert not any("--lora-modules" in a for a in serving._vllm_common(adapter, "m"))
    assert "--enable-lora" in serving._vllm_common(adapter, "m")
    errors = run_errors(RunParams(lora_serving="adapter"))
    assert any("lora_serving=adapter is not supported" in e and "merged" in e for e in errors)
    assert not any("lora_serving" in e for e in run_errors(RunParams()))
    merged = serving.serving_container(spec(lora=True, lora_serving="merged", lora_rank=12))
    assert "--enable-lora" not in (merged.args or [])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"preset": "vllm-openai", "lora": True, "lora_serving": "adapter", "base_model_uri": "b"},
         "only the Model Garden image"),
        ({"lora": True, "lora_serving": "adapter"}, "needs the base model's location"),
        ({"max_model_len": 0}, "max_model_len=0"),
    ],
)  # fmt: skip
def test_serving_spec_errors(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        serving.serving_container(spec(**overrides))


def test_custom_preset_is_the_image_alone() -> None:
    container = serving.serving_container(spec(preset="custom", image="tgi:3.0"))
    assert container == serving.ServingContainer(image_uri="tgi:3.0")


def test_chat_bodies_and_answers() -> None:
    import json

    mg = json.loads(serving.chat_body("vertex-vllm", "m"))
    assert mg["instances"][0]["@requestFormat"] == "chatCompletions"
    openai = json.loads(serving.chat_body("vllm-openai", "m"))
    assert openai["model"] == "m" and openai["messages"][0]["role"] == "user"
    answer = {"choices": [{"message": {"content": " 4 "}}]}
    assert serving.chat_answer(json.dumps(answer)) == "4"
    assert serving.chat_answer({"predictions": [answer]}) == "4"
    assert serving.chat_answer({"predictions": answer}) == "4"
    assert serving.chat_answer(b"not json") is None
    assert serving.chat_answer({"choices": []}) is None
    assert serving.chat_answer({"error": "model not loaded"}) is None
    # An empty message is an answer (a barely trained model may stop at once).
    assert serving.chat_answer({"choices": [{"message": {"content": ""}}]}) == ""


def test_local_server_command_parses_with_transformers_serve() -> None:
    """The local server's command line against `transformers serve`'s own parser."""
    import click
    from transformers.cli.transformers import app  # the `transformers` CLI's click group

    command = serving.local_server_command("/models/tiny", port=18080)
    assert command[1:4] == ["-m", "transformers.cli.transformers", "serve"]
    serve = app.get_command(click.Context(app), "serve")
    assert serve is not None
    sub_ctx = serve.make_context("serve", list(command[4:]))
    assert sub_ctx.params["force_model"] == "/models/tiny"
    assert sub_ctx.params["port"] == 18080 and sub_ctx.params["device"] == "cpu"
    assert sub_ctx.params["trust_remote_code"] is False


# -- register: upload with the preset, evaluation, champion alias, VertexModel ------------------


def _proto_json(request: Any) -> dict[str, Any]:
    return {
        type(request).__name__: json_format.MessageToDict(
            type(request).pb(request), preserving_proto_field_name=True
        )
    }


def _register(run: str, metrics: dict[str, float]) -> tuple[str, Any]:
    from kfp.dsl import Metrics

    from components.params.step_params import request_of
    from components.serving.lineage import VertexModel
    from components.steps.register import COMPONENT as REGISTER_STEP
    from components.steps.register import run as register

    vertex_model = VertexModel(name="vertex_model", uri="", metadata={})
    name = register(
        request_of(
            REGISTER_STEP,
            model_uri=f"gs://bucket/runs/{run}/model",
            base_model="gs://bucket/base",
            metrics=Metrics(name="metrics", uri="", metadata=metrics),
            vertex_model=vertex_model,
            run_id=run,
            project=PROJECT,
            region=LOCATION,
            registered_model="Tiny Llama FT",
            serving_image=MG_IMAGE,
            serving_preset="vertex-vllm",
            lora_serving="merged",
            seq_len=1024,
            deploy_accelerator_count=1,
            credentials=AnonymousCredentials(),
        )
    )
    return name, vertex_model


def test_register_requests_golden(
    fake_registry: FakeModelService, golden: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="components.serving.lineage"):
        first, artifact = _register(
            "run-1", {"tuned_eval_loss": 1.5, "exact_match": 0.25, "passed": 1.0}
        )
    # C11: no metrics schema fits the gate's metrics: not imported, and the log says so.
    assert "(exact_match, passed, tuned_eval_loss) are not imported as a model evaluation" in (
        caplog.text
    )
    second, _ = _register("run-2", {"tuned_eval_loss": 1.2, "exact_match": 0.5, "passed": 1.0})
    assert (first, second) == (f"{PARENT}/models/1000@1", f"{PARENT}/models/1000@2")
    # The google.VertexModel artifact GCPC's ModelDeployOp reads (metadata.resourceName).
    assert artifact.schema_title == "google.VertexModel"
    assert artifact.metadata["resourceName"] == first
    assert artifact.uri == f"https://{LOCATION}-aiplatform.googleapis.com/v1/{first}"
    versions = fake_registry.models[f"{PARENT}/models/1000"]
    assert [list(v.version_aliases) for v in versions] == [[], ["default", "champion"]]
    wanted = (
        "UploadModelRequest",
        "ImportModelEvaluationRequest",  # C11: never sent (no schema fits the gate's metrics)
        "MergeVersionAliasesRequest",
        "GetModelRequest",
    )
    requests = [_proto_json(r) for r in fake_registry.requests if type(r).__name__ in wanted]
    assert "ImportModelEvaluationRequest" not in {type(r).__name__ for r in fake_registry.requests}
    golden.check("vertex_register_requests.json", requests)


# -- deploy: endpoint, deployment, smoke prompt, traffic, rollback --------------------------------


def _options(**overrides: Any) -> DeployOptions:
    kwargs: dict[str, Any] = dict(
        endpoint="tiny-llama-ft",
        machine_type="g2-standard-12",
        accelerator_type="NVIDIA_L4",
        accelerator_count=1,
        spot=True,
    )
    kwargs.update(overrides)
    return DeployOptions(**kwargs)


def _deploy(fake: FakeEndpoints, preset: str = "vertex-vllm", **overrides: Any) -> Any:
    return deploy_version(
        version=f"{PARENT}/models/1000@2",
        options=_options(**overrides),
        preset=preset,  # type: ignore[arg-type]
        served_model_name="tiny-llama-ft",
        project=PROJECT,
        location=LOCATION,
        run_id="run-2",
        clients=fake.clients(),
    )


def test_deploy_creates_endpoint_and_smoke_tests(golden: Any) -> None:
    fake = FakeEndpoints(PARENT)
    deployment = _deploy(fake, encryption_key="projects/k/locations/us/keyRings/r/cryptoKeys/key")
    assert deployment.created_endpoint and deployment.answer == "4"
    assert deployment.traffic_split == {deployment.deployed_model_id: 100}
    golden.check("vertex_deploy_new_endpoint.json", [_proto_json(r) for r in fake.requests])


def test_deploy_challenger_split_with_the_champion(golden: Any) -> None:
    """Review P2: the challenger is smoke-tested alone, on a temporary endpoint of its own (a
    shared endpoint would route the prompt by the split, mostly to the champion), and only then
    deployed to the shared endpoint with its share. Golden: create llmft-smoke-run-2, deploy at
    100 %, predict there, undeploy, delete it; then deploy to the endpoint at 80/20."""
    fake = FakeEndpoints(PARENT)
    name = fake.add_endpoint("tiny-llama-ft", {"111": 100})
    fake.answers["111"] = "four"  # would fail the smoke test if the champion were asked
    deployment = _deploy(fake, traffic_percent=20, spot=False)
    assert not deployment.created_endpoint and deployment.answer == "4"
    assert deployment.traffic_split == {"111": 80, deployment.deployed_model_id: 20}
    assert deployment.replaced == []
    predicts = [r for r in fake.requests if type(r).__name__ == "PredictRequest"]
    assert predicts and all(p.endpoint != name for p in predicts)
    assert list(fake.endpoints) == [name]  # the temporary endpoint is gone
    kinds = [type(r).__name__ for r in fake.requests]
    assert kinds.index("PredictRequest") < max(
        i for i, r in enumerate(fake.requests)
        if type(r).__name__ == "DeployModelRequest" and r.endpoint == name
    )  # fmt: skip
    golden.check("vertex_deploy_challenger.json", [_proto_json(r) for r in fake.requests])


def test_replacing_never_rolls_back_the_tested_version() -> None:
    """Review P8: with 100 % an old model that cannot be undeployed is left (no traffic), the new
    version keeps serving; a rollback's split names only models still deployed."""
    from google.api_core import exceptions

    from components.serving.endpoints import rollback

    fake = FakeEndpoints(PARENT)
    name = fake.add_endpoint("tiny-llama-ft", {"111": 60, "222": 40})
    undeploy = fake.undeploy_model

    def refuse_222(request: Any = None, **kw: Any) -> Any:
        if request.deployed_model_id == "222":
            raise exceptions.ServiceUnavailable("try again")
        return undeploy(request, **kw)

    fake.undeploy_model = refuse_222  # type: ignore[method-assign]
    deployment = _deploy(fake, endpoint=name)
    assert deployment.replaced == ["111"] and deployment.left == ["222"]
    serving = {d.id for d in fake.endpoints[name].deployed_models}
    assert deployment.deployed_model_id in serving and "111" not in serving
    assert dict(fake.endpoints[name].traffic_split) == {deployment.deployed_model_id: 100}

    # A rollback whose earlier split names a model already undeployed ("111") restores only
    # the ones still there, rescaled to 100.
    fake.undeploy_model = undeploy  # type: ignore[method-assign]
    rollback(fake.clients(), deployment, restore_split={"111": 60, "222": 40})
    assert dict(fake.endpoints[name].traffic_split) == {"222": 100}


def test_deploy_replaces_earlier_versions_after_the_smoke_prompt() -> None:
    fake = FakeEndpoints(PARENT)
    name = fake.add_endpoint("tiny-llama-ft", {"111": 60, "222": 40})
    deployment = _deploy(fake, "vllm-openai", endpoint=name)
    assert deployment.replaced == ["111", "222"]
    assert [d.id for d in fake.endpoints[name].deployed_models] == [deployment.deployed_model_id]
    raw = [r for r in fake.requests if type(r).__name__ == "RawPredictRequest"]
    assert len(raw) == 1 and b'"model": "tiny-llama-ft"' in raw[0].http_body.data


def test_failed_smoke_prompt_rolls_back(golden: Any) -> None:
    fake = FakeEndpoints(PARENT)
    fake.answers["9002"] = None  # the id the fake gives the new deployment: no completion
    with pytest.raises(RuntimeError, match="smoke prompt got no answer"):
        _deploy(fake, "vllm-openai")
    assert fake.endpoints == {}  # undeployed, and the endpoint it created deleted
    golden.check("vertex_deploy_rollback.json", [_proto_json(r) for r in fake.requests])


def test_failed_smoke_on_a_shared_endpoint_restores_the_champion() -> None:
    fake = FakeEndpoints(PARENT)
    name = fake.add_endpoint("tiny-llama-ft", {"111": 100})
    fake.answers["9003"] = None  # the id the fake gives the trial deployment: no completion
    with pytest.raises(RuntimeError):
        _deploy(fake, traffic_percent=50)
    assert list(fake.endpoints) == [name]  # the temporary endpoint deleted
    assert dict(fake.endpoints[name].traffic_split) == {"111": 100}
    assert [d.id for d in fake.endpoints[name].deployed_models] == ["111"]
    # The shared endpoint was never touched: the failed version never served there.
    assert not [r for r in fake.requests if getattr(r, "endpoint", "") == name]


@pytest.mark.parametrize(
    ("current", "share", "split"),
    [
        ({}, 30, {"0": 100}),
        ({"a": 100}, 10, {"a": 90, "0": 10}),
        ({"a": 50, "b": 50}, 25, {"a": 38, "b": 37, "0": 25}),
        ({"a": 70, "b": 30, "c": 0}, 100, {"0": 100}),
    ],
)
def test_challenger_split(current: dict[str, int], share: int, split: dict[str, int]) -> None:
    assert challenger_split(current, share) == split
    assert sum(split.values()) == 100


def test_deploy_options_are_checked_against_platform_facts() -> None:
    errors = deploy_errors(_options(machine_type="g2-standard-12", accelerator_count=2))
    assert any("cannot run on g2-standard-12" in e for e in errors), errors
    assert any("traffic" in e for e in deploy_errors(_options(traffic_percent=0)))
    assert deploy_errors(_options()) == []
    fake = FakeEndpoints(PARENT)
    with pytest.raises(ValueError, match="cannot deploy"):
        _deploy(fake, accelerator_type="NVIDIA_H100_80GB")
    assert fake.requests == []


# -- run parameters -----------------------------------------------------------------------------


def test_deploy_parameters_are_checked_up_front() -> None:
    from components.params import param_checks

    def check(**overrides: Any) -> list[str]:
        kwargs: dict[str, Any] = dict(
            backend="vertex", deploy_endpoint="ep", register_model=True,
            machine_type="g2-standard-12", accelerator_type="NVIDIA_L4", accelerator_count=1,
            serving_preset="vertex-vllm", lora_serving="merged",
        )  # fmt: skip
        kwargs.update(overrides)
        return param_checks.check_deploy(**kwargs)

    assert check() == []
    assert check(backend="local", register_model=False) == []
    assert any("register_model is false" in e for e in check(register_model=False))
    assert any("a2-highgpu-1g" in e for e in check(accelerator_type="NVIDIA_TESLA_A100"))
    assert any("only the vertex-vllm" in e for e in check(
        serving_preset="vllm-openai", lora_serving="adapter"
    ))  # fmt: skip


# -- CustomJob: TensorBoard and CMEK --------------------------------------------------------------


def test_custom_job_gets_tensorboard_and_cmek(golden: Any) -> None:
    from components.launchers.base import TrainLaunch
    from components.launchers.customjob import CustomJobOptions, build_custom_job
    from trainer.config import TrainConfig

    launch = TrainLaunch(
        run_id="run-7",
        trainer=TrainConfig(model="gs://b/base", data="gs://b/data", output="gs://b/runs/run-7"),
        nodes=1,
        nproc_per_node=1,
        rdzv_backend="c10d",
        rdzv_endpoint="",
    )
    tensorboard = f"{PARENT}/tensorboards/123"
    key = "projects/my-project/locations/us-central1/keyRings/llmft/cryptoKeys/train"
    job = build_custom_job(
        launch=launch,
        options=CustomJobOptions(
            machine_type="g2-standard-12",
            accelerator_type="NVIDIA_L4",
            accelerator_count=1,
            service_account="trainer@my-project.iam.gserviceaccount.com",
            base_output_directory="gs://b/runs/run-7/vertex",
            tensorboard=tensorboard,
            encryption_key=key,
        ),
    )
    assert job.job_spec.tensorboard == tensorboard
    assert job.encryption_spec.kms_key_name == key
    golden.check(
        "vertex_custom_job_tensorboard_cmek.json",
        {
            "tensorboard": job.job_spec.tensorboard,
            "base_output_directory": job.job_spec.base_output_directory.output_uri_prefix,
            "service_account": job.job_spec.service_account,
            "encryption_spec": {"kms_key_name": job.encryption_spec.kms_key_name},
        },
    )
    with pytest.raises(ValueError, match="tensorboard needs service_account"):
        build_custom_job(launch=launch, options=CustomJobOptions(tensorboard=tensorboard))


def test_train_request_sets_tensorboard_output_and_key() -> None:
    from components.params.step_params import request_of
    from components.steps.train import COMPONENT as TRAIN_STEP
    from components.steps.train import backend_options

    request = request_of(TRAIN_STEP, backend="vertex", run_id="run-7", base_model="gs://b/base", dataset_uri="gs://b/d",
        rdzv_endpoint="", rdzv_backend="c10d", nodes=1, nproc_per_node=0, max_steps=10,
        learning_rate=1e-4, trainer_overrides={}, project=PROJECT, region=LOCATION,
        work_uri="gs://b/work", namespace="kubeflow", gke_cluster="", machine_type="a3-highgpu-8g",
        accelerator_type="NVIDIA_H100_80GB", accelerator_count=8,
        service_account="trainer@my-project.iam.gserviceaccount.com", hf_token_secret="",
        train_timeout_s=3600, capacity="on-demand", max_wait_minutes=0, reservation="",
        gpu_hour_price_usd=0.0, budget_timeout_s=0, quantize_base="none", objective="sft",
        model=None, gcp_resources="", tensorboard=f"{PARENT}/tensorboards/1",
        encryption_key="projects/p/locations/l/keyRings/r/cryptoKeys/k",
    )  # fmt: skip
    options = backend_options(request).job  # type: ignore[union-attr]
    assert options.tensorboard == f"{PARENT}/tensorboards/1"
    assert options.base_output_directory == "gs://b/work/runs/run-7/vertex"
    assert options.encryption_key == "projects/p/locations/l/keyRings/r/cryptoKeys/k"


def test_command_line_shell_quoting_is_stable() -> None:
    """The args reach the container unquoted (Vertex passes them as argv, no shell)."""
    container = serving.serving_container(spec())
    assert all(shlex.split(a) == [a] for a in container.args or [] if "$(" not in a)


# -- Vertex AI Experiments ------------------------------------------------------------------------


def test_experiment_run_logs_params_and_final_metrics(
    monkeypatch: pytest.MonkeyPatch, golden: Any
) -> None:
    from fakes.vertex import FakeMetadata
    from google.cloud.aiplatform import initializer

    from components.serving.experiments import log_experiment_run

    monkeypatch.setattr(initializer, "global_config", initializer._Config())
    fake = FakeMetadata().install(monkeypatch)
    kwargs: dict[str, Any] = dict(
        experiment="llmft-tiny",
        project=PROJECT,
        location=LOCATION,
        params={"max_steps": 200, "learning_rate": 2e-5, "base_model": "gs://b/base", "x": None},
        metrics={"final_loss": 1.25, "tokens": 4096, "model_uri": "gs://b/m", "nan": float("nan")},
        credentials=AnonymousCredentials(),
    )
    assert log_experiment_run(run_id="fine-tune-20261204-1", **kwargs) == "fine-tune-20261204-1"
    # A retried task resumes its experiment run instead of failing.
    assert log_experiment_run(run_id="fine-tune-20261204-1", **kwargs) == "fine-tune-20261204-1"
    assert fake.unexpected == []
    run = fake.contexts[f"{PARENT}/metadataStores/default/contexts/llmft-tiny-fine-tune-20261204-1"]
    metadata = dict(run.metadata)
    assert dict(metadata["_params"]) == {
        "max_steps": 200.0, "learning_rate": 2e-5, "base_model": "gs://b/base",
    }  # fmt: skip
    assert dict(metadata["_metrics"]) == {"final_loss": 1.25, "tokens": 4096.0}
    golden.check("vertex_experiment_run.json", [_proto_json(r) for r in fake.requests])


def test_the_pipelines_cmek_key_is_passed_to_the_run(tmp_path: Any) -> None:
    """`vertex.encryption_key` (the PipelineJob's CMEK key) also fills the `encryption_key` run
    parameter of our template, which the CustomJob and a created endpoint take."""
    from pathlib import Path

    from pipelines.deploy.config import load_for
    from pipelines.deploy.submit import prepare_parameters

    key = "projects/my-proj/locations/europe-west4/keyRings/llmft/cryptoKeys/pipelines"
    template = Path(__file__).parent.parent / "compiled" / "fine_tune.vertex.yaml"
    config = load_for(
        "vertex", None, template=str(template), project="my-proj", region="europe-west4",
        pipeline_root="gs://my-bucket/root", encryption_key=key,
        service_account="llmft-pipelines@my-proj.iam.gserviceaccount.com",
        parameters={
            "train_data_uri": "gs://my-bucket/raw/*.jsonl", "base_model": "gs://b/m",
            "dataflow_service_account": "llmft-dataflow@my-proj.iam.gserviceaccount.com",
        },
    )  # fmt: skip
    params = prepare_parameters(config, "vertex", schedule_time=None, recurring=False)
    assert params["encryption_key"] == key


def test_cleanup_of_a_failed_run_undeploys_what_it_deployed(golden: Any) -> None:
    """A deploy step killed before its rollback: the exit handler undoes its deployments."""
    from types import SimpleNamespace

    from components.params.step_params import request_of
    from components.steps.cleanup import COMPONENT as CLEANUP_STEP
    from components.steps.cleanup import undeploy_failed_run

    fake = FakeEndpoints(PARENT)
    shared = fake.add_endpoint("shared", {"111": 100})
    fake.answers["111"] = "five"
    _deploy(fake, endpoint=shared, traffic_percent=30)  # challenger on an endpoint it reuses
    created = _deploy(fake, endpoint="fresh").endpoint  # an endpoint it created
    fake.requests.clear()

    def cleanup(state: str) -> list[str]:
        request = request_of(CLEANUP_STEP, backend="vertex", run_id="run-2", project=PROJECT, region=LOCATION,
            status=SimpleNamespace(state=state), endpoint_clients=fake.clients(),
        )  # fmt: skip
        return undeploy_failed_run(request)

    assert cleanup("SUCCEEDED") == [] and fake.requests == []  # a good run keeps serving
    removed = cleanup("FAILED")
    assert removed == [
        # ids 502/9003 went to the challenger's trial endpoint and deployment (smoke_alone)
        f"deployed model 9004 on {shared}",
        f"deployed model 9006 on {created}",
        f"endpoint {created}",
    ]
    assert list(fake.endpoints) == [shared]
    assert dict(fake.endpoints[shared].traffic_split) == {"111": 100}
    golden.check("vertex_cleanup_undeploy.json", [_proto_json(r) for r in fake.requests])
    assert cleanup("CANCELLED") == []  # nothing left: idempotent
