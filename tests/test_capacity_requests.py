"""Capacity types as the cloud APIs receive them: the CustomJob (Vertex AI) and the PyTorchJob
(GKE) the train step builds for on-demand, Spot, flex-start and a reservation, with a budget's
timeout, against reviewed golden files (their scheduling parts: strategy, wait, timeout,
restarts, node selectors, tolerations, grace period, deadline). The PyTorchJobs also validate
against the Training Operator's CRD, the CustomJobs parse back as the SDK's type."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from crd_validation import PYTORCHJOB_CRD, crd_schema

from components.launchers.customjob import build_custom_job
from components.launchers.pytorchjob import build_pytorchjob
from components.params.run_checks import run_errors
from components.params.run_params import RunParams
from components.params.step_params import request_of
from components.platform.platform_facts import GKE_SPOT_POD_GRACE_S
from components.steps.train import COMPONENT as TRAIN_STEP
from components.steps.train import TrainRequest, backend_options, trainer_launch

pytestmark = pytest.mark.unit

RESERVATION = "projects/p/zones/us-central1-a/reservations/h100-pool"
CASES = {
    "on-demand": {},
    "on-demand-budget": {"budget_timeout_s": 7200},
    "spot": {"capacity": "spot", "budget_timeout_s": 7200},
    "flex-start": {"capacity": "flex-start", "max_wait_minutes": 90},
    "reservation": {"reservation": RESERVATION},
}


def request(backend: str, **changes: Any) -> TrainRequest:
    defaults = RunParams()
    values: dict[str, Any] = {
        "backend": backend,
        "run_id": "fine-tune-20261204-abc",
        "base_model": "gs://b/models/llama-8b",
        "dataset_uri": "gs://b/root/dataset",
        "rdzv_endpoint": "",
        "rdzv_backend": "c10d",
        "nodes": 2,
        "nproc_per_node": 0,
        "max_steps": 1000,
        "learning_rate": 2e-5,
        "quantize_base": defaults.quantize_base,
        "objective": defaults.objective,
        "trainer_overrides": {},
        "project": "p",
        "region": "us-central1",
        "work_uri": "gs://b/work",
        "namespace": "ml",
        "gke_cluster": "",
        "machine_type": "a3-highgpu-8g",
        "accelerator_type": "NVIDIA_H100_80GB",
        "accelerator_count": 8,
        "service_account": "llmft-trainer" if backend == "gke" else "",
        "hf_token_secret": "",
        "train_timeout_s": defaults.train_timeout_s,
        "capacity": defaults.capacity,
        "max_wait_minutes": defaults.max_wait_minutes,
        "reservation": defaults.reservation,
        "gpu_hour_price_usd": defaults.gpu_hour_price_usd,
        "budget_timeout_s": 0,
        "model": SimpleNamespace(uri="gs://b/root/model"),
        "gcp_resources": "",
    }
    return request_of(TRAIN_STEP, **(values | changes))


def custom_job_parts(**changes: Any) -> dict[str, Any]:
    from google.cloud import aiplatform_v1

    req = request("vertex", **changes)
    launch = trainer_launch(req, req.model.uri)
    job = build_custom_job(launch=launch, options=backend_options(req).job)  # type: ignore[union-attr]
    # As the REST transport sends it: enum names, fields at their default left out.
    body = json.loads(
        aiplatform_v1.CustomJob.to_json(
            job, use_integers_for_enums=False, always_print_fields_with_no_presence=False
        )
    )
    aiplatform_v1.CustomJob.from_json(json.dumps(body))  # no field the API would not know
    spec = body["jobSpec"]
    return {
        "scheduling": spec.get("scheduling"),
        "machineSpecs": [pool["machineSpec"] for pool in spec["workerPoolSpecs"]],
        "checkpointEveryMinutes": launch.trainer.checkpoint_every_minutes,
    }


def pytorchjob_parts(schema: dict[str, Any], **changes: Any) -> dict[str, Any]:
    req = request("gke", **changes)
    launch = trainer_launch(req, req.model.uri)
    job = build_pytorchjob(launch=launch, options=backend_options(req).job)  # type: ignore[union-attr]
    jsonschema.validate(job, schema)
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    keys = ("nodeSelector", "tolerations", "terminationGracePeriodSeconds")
    return {
        "pod": {k: pod[k] for k in keys if k in pod},
        "runPolicy": job["spec"]["runPolicy"],
        "checkpointEveryMinutes": launch.trainer.checkpoint_every_minutes,
    }


def test_vertex_custom_job_per_capacity(golden: Any) -> None:
    parts = {name: custom_job_parts(**changes) for name, changes in CASES.items()}
    golden.check("vertex_custom_job_capacity.json", parts)
    assert parts["spot"]["scheduling"]["strategy"] == "SPOT"
    assert parts["spot"]["scheduling"]["restartJobOnWorkerRestart"] is True
    assert parts["flex-start"]["scheduling"]["maxWaitDuration"] == "5400s"
    # The default only carries train_timeout_s plus the grace (the job ends even if its launcher
    # was killed first, issue 29 N9); the budget's timeout replaces it when it is shorter.
    assert parts["on-demand"]["scheduling"] == {"timeout": "601800s"}
    assert parts["on-demand-budget"]["scheduling"]["timeout"] == "7200s"


def test_gke_pytorchjob_per_capacity(golden: Any) -> None:
    schema = crd_schema(PYTORCHJOB_CRD, "v1")
    parts = {
        name: pytorchjob_parts(schema, **changes)
        for name, changes in CASES.items()
        if name != "reservation"  # a Vertex setting: on GKE the node pool consumes it
    }
    golden.check("pytorchjob_capacity.json", parts)
    spot = parts["spot"]
    # Review P7: never below Kubernetes' 30 s default (a preemption's 15 s cap is GKE's own).
    assert spot["pod"]["terminationGracePeriodSeconds"] == 30 > GKE_SPOT_POD_GRACE_S
    assert spot["runPolicy"]["activeDeadlineSeconds"] == 7200
    assert spot["checkpointEveryMinutes"] == 10.0
    assert parts["on-demand"]["checkpointEveryMinutes"] == 0.0


def test_capacity_parameter_rules() -> None:
    def errors(**kw: Any) -> list[str]:
        base = {"train_data_uri": "gs://b/d.jsonl", "base_model": "gs://b/m", "project": "proj-1"}
        params = RunParams(**(base | {"work_uri": "gs://b/w"} | kw))
        return [
            e for e in run_errors(params) if "capacity" in e or "reservation" in e or "wait" in e
        ]

    assert errors(backend="vertex", capacity="spot") == []
    assert errors(backend="vertex", capacity="flex-start", max_wait_minutes=60) == []
    assert errors(backend="vertex", reservation=RESERVATION) == []
    assert "local backend" in errors(capacity="spot")[0]
    assert "node pool" in errors(backend="gke", reservation=RESERVATION, service_account="a")[0]
    assert "on-demand" in errors(backend="vertex", capacity="spot", reservation=RESERVATION)[0]
    assert "flex-start" in errors(backend="vertex", capacity="spot", max_wait_minutes=5)[0]


def test_flex_start_on_vertex_only_for_the_gpus_dws_offers() -> None:
    """Review P6: Vertex DWS needs L4, A100, H100, H200 or B200 (platform_facts)."""
    from components.params.param_checks import check_flex_start_accelerator

    for gpu in (
        "NVIDIA_L4",
        "NVIDIA_TESLA_A100",
        "NVIDIA_A100_80GB",
        "NVIDIA_H100_80GB",
        "NVIDIA_H100_MEGA_80GB",
        "NVIDIA_H200_141GB",
        "NVIDIA_B200",
        "nvidia-h100-80gb",
    ):
        assert check_flex_start_accelerator("vertex", "flex-start", gpu) is None, gpu
    for gpu in ("NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", ""):
        error = check_flex_start_accelerator("vertex", "flex-start", gpu)
        assert error and "NVIDIA_L4" in error and "capacity=on-demand" in error, gpu
    assert check_flex_start_accelerator("vertex", "spot", "NVIDIA_TESLA_T4") is None
    assert check_flex_start_accelerator("gke", "flex-start", "NVIDIA_TESLA_T4") is None
    base = {"train_data_uri": "gs://b/d.jsonl", "base_model": "gs://b/m", "project": "proj-1"}
    t4 = RunParams(
        **base, work_uri="gs://b/w", backend="vertex", capacity="flex-start",
        machine_type="n1-standard-8", accelerator_type="NVIDIA_TESLA_T4", accelerator_count=1,
    )  # fmt: skip
    assert any("offers flex-start only" in e for e in run_errors(t4))


def test_gke_job_api_and_kueue_queue_reach_the_launcher_options() -> None:
    """Issue 47: the run parameters gke_job_api and kueue_queue, as the train step passes them."""
    from components.launchers.gke import GkeOptions
    from components.launchers.trainjob import build_trainjob

    options = backend_options(request("gke", gke_job_api="trainjob", kueue_queue="llmft"))
    assert isinstance(options, GkeOptions)
    assert options.job_api == "trainjob" and options.job.kueue_queue == "llmft"
    spot = request("gke", capacity="spot", kueue_queue="llmft")
    job = build_trainjob(
        launch=trainer_launch(spot, "gs://b/model"), options=backend_options(spot).job
    )
    assert job["spec"]["runtimeRef"]["name"] == "llmft-torch-v1-r10"  # Spot's restart budget
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "llmft"
    default = backend_options(request("gke"))
    assert default.job_api == RunParams.gke_job_api == "auto" and default.job.kueue_queue is None
