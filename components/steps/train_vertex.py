"""The train step on Vertex AI: the run parameters that concern a CustomJob (`VertexOptions`:
its machines, capacity, TensorBoard, encryption and the pipeline's gcp_resources).

components/steps/train.py imports this module only when `backend=vertex`.
"""

from __future__ import annotations

from typing import Any

from components.launchers.customjob import CustomJobOptions
from components.launchers.vertex import VertexOptions
from components.launchers.vocab import deadline_for
from components.params.by_step import TrainParams
from components.platform.capacity import preemptible
from components.runtime.run_identity import safe_run_id
from components.serving.mlflow_tracking import vertex_token_env
from trainer import storage


def vertex_options(
    params: TrainParams, *, run_id: str, gcp_resources: str, timeout_s: int
) -> VertexOptions:
    """The Vertex backend's options for the run parameters; `timeout_s` is when the step cancels
    the job (`training_timeout_s`), `gcp_resources` the component's output path (the pipeline
    cancels the CustomJob with the run)."""
    custom_job = CustomJobOptions(
        machine_type=params.machine_type,
        accelerator_type=params.accelerator_type or None,
        accelerator_count=params.accelerator_count or None,
        service_account=params.service_account or None,
        hf_token_secret=params.hf_token_secret or None,
        # The MLflow token: each replica reads it from Secret Manager at start.
        secret_env=vertex_token_env(
            params.tracking_uri, params.tracking_token_secret, project=params.project
        ),
        timeout_s=deadline_for(timeout_s),
        **vertex_capacity(params),
        tensorboard=params.tensorboard or None,
        base_output_directory=vertex_output_directory(params.work_uri, run_id)
        if params.tensorboard
        else None,
        encryption_key=params.encryption_key or None,
    )
    return VertexOptions(
        project=params.project,
        location=params.region,
        job=custom_job,
        gcp_resources_path=gcp_resources or None,
    )


def vertex_output_directory(work_uri: str, run_id: str) -> str:
    """The CustomJob's base_output_directory: Vertex puts AIP_TENSORBOARD_LOG_DIR (and
    AIP_MODEL_DIR, AIP_CHECKPOINT_DIR) under it."""
    return storage.join(work_uri, "runs", safe_run_id(run_id), "vertex")


def vertex_capacity(params: TrainParams) -> dict[str, Any]:
    """CustomJobOptions for the capacity: on Spot a restarted replica restarts them all (the
    rendezvous needs every replica; they resume from the newest checkpoint). The budget's timeout
    is `training_timeout_s`."""
    return {
        "capacity": params.capacity,
        "max_wait_s": params.max_wait_minutes * 60 or None,
        "reservation": params.reservation or None,
        "restart_job_on_worker_restart": preemptible(params.capacity),
    }
