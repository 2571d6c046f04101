"""The train step's mapping: the Model artifact is the exported model only; the run directory
(checkpoints, logs, TensorBoard) lives under work_uri; artifacts must be readable by workers."""

from __future__ import annotations

import json

import pytest

from components.launchers import TrainLaunch
from components.params.param_values import params_from_mapping
from components.params.run_checks import run_errors
from components.runtime.run_identity import safe_run_id
from components.steps.train import check_worker_readable, run_directory
from trainer.config import TrainConfig


def test_the_model_artifact_is_the_export_and_the_run_dir_is_under_work_uri() -> None:
    run = run_directory(
        backend="vertex", work_uri="gs://bkt/work/", run_id="Run_1", model_dir="gs://bkt/root/m"
    )
    assert run == f"gs://bkt/work/runs/{safe_run_id('Run_1')}/train"
    assert run_directory(backend="gke", work_uri="gs://bkt/w", run_id="r1", model_dir="x") == (
        "gs://bkt/w/runs/r1/train"
    )
    local = run_directory(backend="local", work_uri="", run_id="r1", model_dir="/p/train/model")
    assert local == "/p/train/train-run"
    on_gcs = run_directory(backend="local", work_uri="gs://b/w", run_id="r1", model_dir="gs://b/m")
    assert on_gcs == "gs://b/w/runs/r1/train"  # local compute, outputs on GCS
    with pytest.raises(ValueError, match="gs:// work_uri"):
        run_directory(backend="vertex", work_uri="", run_id="r1", model_dir="gs://bkt/m")
    trainer = TrainConfig(model="m", data="d", output=run, export_dir="gs://bkt/root/model")
    args = TrainLaunch(run_id="r1", trainer=trainer).trainer_args()
    config = json.loads(args[args.index("--config-json") + 1])
    assert config["output"] == run and config["export_dir"] == "gs://bkt/root/model"
    errors = run_errors(params_from_mapping({"trainer_overrides": {"export_dir": "x"}}))
    assert "trainer_overrides.export_dir: the pipeline sets it" in "\n".join(errors)


def test_cloud_workers_cannot_read_kfps_default_artifact_store() -> None:
    check_worker_readable("gs://bkt/root/run/preprocess/dataset")
    with pytest.raises(ValueError, match="gs:// pipeline root"):
        check_worker_readable("minio://mlpipeline/v2/artifacts/run/preprocess/dataset")


def _request(backend: str, **changes: object):
    from components.params.step_params import request_of
    from components.steps.train import COMPONENT as TRAIN_STEP

    fields = dict(
        backend=backend, run_id="r1", base_model="gs://b/m", dataset_uri="gs://b/d",
        rdzv_endpoint="", rdzv_backend="c10d", nodes=2, nproc_per_node=0, max_steps=10,
        learning_rate=1e-4, trainer_overrides={}, project="my-project", region="us-central1",
        work_uri="gs://b/w", namespace="ml", gke_cluster="", machine_type="g2-standard-24",
        accelerator_type="NVIDIA_L4", accelerator_count=2, service_account="llmft-trainer",
        hf_token_secret="", train_timeout_s=3600, capacity="on-demand", max_wait_minutes=0,
        reservation="", gpu_hour_price_usd=0.0, budget_timeout_s=0, quantize_base="none",
        objective="sft", model=None, gcp_resources="",
    )  # fmt: skip
    return request_of(TRAIN_STEP, **{**fields, **changes})  # type: ignore[arg-type]


def test_the_jobs_carry_the_train_timeout_plus_a_grace() -> None:
    """N9: a KFP terminate can kill the step before its cancel reaches the cluster; the job then
    still ends by itself (the operator's activeDeadlineSeconds, Vertex's scheduling timeout)."""
    from components.launchers.pytorchjob import build_pytorchjob
    from components.launchers.vocab import DEADLINE_GRACE_S
    from components.steps.train import backend_options, trainer_launch

    gke = backend_options(_request("gke"))
    launch = trainer_launch(_request("gke"), "gs://b/root/model")
    job = build_pytorchjob(launch=launch, options=gke.job)  # type: ignore[union-attr]
    deadline = job["spec"]["runPolicy"]["activeDeadlineSeconds"]
    assert deadline == 3600 + DEADLINE_GRACE_S and 0 < DEADLINE_GRACE_S <= 900
    vertex = backend_options(_request("vertex"))
    assert vertex.job.timeout_s == 3600 + DEADLINE_GRACE_S  # type: ignore[union-attr]


def test_the_model_metadata_records_what_dpos_reference_was() -> None:
    """QLoRA: `quantize_base` and the trainer's resolved compute dtype (summary.json) go into
    the Model artifact's metadata, which the evaluate step rebuilds DPO's reference from."""
    from components.steps.train import model_metadata

    trainer = TrainConfig(
        model="m", data="d", output="o", objective="dpo", lora_rank=8, quantize_base="nf4"
    )
    launch = TrainLaunch(run_id="r1", trainer=trainer)
    summary = {"compute_dtype": "bf16", "model_dir": "o/model"}
    metadata = model_metadata(summary, output="o", launch=launch, backend="local")
    assert metadata["quantize_base"] == "nf4" and metadata["compute_dtype"] == "bf16"
    assert metadata["dpo_beta"] == trainer.dpo_beta
    plain = TrainLaunch(run_id="r1", trainer=TrainConfig(model="m", data="d", output="o"))
    metadata = model_metadata(summary, output="o", launch=plain, backend="local")
    assert "quantize_base" not in metadata and "compute_dtype" not in metadata


def test_the_mlflow_token_reaches_every_backend_by_secret_name() -> None:
    """The trainer logs to MLflow from every backend: GKE pods get the token from the Kubernetes
    Secret the pipeline mounts, Vertex replicas read the Secret Manager version at start; no
    token value is in either job."""
    from components.steps.train import backend_options
    from trainer.tracking import TOKEN_ENV

    tracked = {"tracking_uri": "https://mlflow.example.com", "tracking_token_secret": "mlflow"}
    vertex = backend_options(_request("vertex", **tracked))
    version = "projects/my-project/secrets/mlflow/versions/latest"
    assert vertex.job.secret_env == {TOKEN_ENV: version}  # type: ignore[union-attr]
    assert backend_options(_request("vertex")).job.secret_env == {}  # type: ignore[union-attr]
    gke = backend_options(_request("gke", **tracked))
    assert set(gke.job.secret_env) == {TOKEN_ENV}  # type: ignore[union-attr]
    from components.launchers.pytorchjob import container_env

    [token] = [e for e in container_env(gke.job, 0) if e["name"] == TOKEN_ENV]  # type: ignore[union-attr]
    # A missing Secret in the trainer pods' namespace: a tracking warning, not pods that cannot
    # start (review M6).
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
