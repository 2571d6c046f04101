"""The train step's mapping: the Model artifact is the exported model only; the run directory
(checkpoints, logs, TensorBoard) lives under work_uri; artifacts must be readable by workers."""

from __future__ import annotations

import json

import pytest

from components.launchers import TrainLaunch
from components.param_values import params_from_mapping
from components.run_identity import safe_run_id
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
    errors = params_from_mapping({"trainer_overrides": {"export_dir": "x"}}).errors()
    assert "trainer_overrides.export_dir: the pipeline sets it" in "\n".join(errors)


def test_cloud_workers_cannot_read_kfps_default_artifact_store() -> None:
    check_worker_readable("gs://bkt/root/run/preprocess/dataset")
    with pytest.raises(ValueError, match="gs:// pipeline root"):
        check_worker_readable("minio://mlpipeline/v2/artifacts/run/preprocess/dataset")
