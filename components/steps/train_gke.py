"""The train step on GKE: the run parameters that concern a training job on a cluster
(`GkeOptions`: a TrainJob or a PyTorchJob, its pods' GPUs, disk, networks and capacity).

components/steps/train.py imports this module only when `backend=gke` (a GKE launch need not load
the Vertex SDK or the local process code).
"""

from __future__ import annotations

from typing import Any

from components.launchers.gke import GkeOptions
from components.launchers.node_setup import GPUDIRECT_SETUPS, ephemeral_storage_request
from components.launchers.pytorchjob import PyTorchJobOptions
from components.launchers.vocab import deadline_for
from components.params.by_step import TrainParams
from components.platform.capacity import (
    POD_TERMINATION_GRACE_S,
    SPOT_RESTARTS_PER_NODE,
    preemptible,
)
from components.platform.node_facts import interconnect
from components.platform.platform_facts import gke_accelerator
from components.preflight.model_size import weight_bytes
from components.serving.mlflow_tracking import gke_token_env


def gke_options(params: TrainParams, *, timeout_s: int) -> GkeOptions:
    """The GKE backend's options for the run parameters; `timeout_s` is when the step cancels
    the job (`training_timeout_s`)."""
    job = PyTorchJobOptions(
        namespace=params.namespace,
        accelerator=gke_accelerator(params.accelerator_type),
        gpus_per_node=params.accelerator_count or None,
        service_account=params.service_account or None,
        hf_token_secret=params.hf_token_secret or None,
        secret_env=gke_token_env(params.tracking_uri, params.tracking_token_secret),
        # Ends the job on the cluster even if this step is killed before it can cancel.
        active_deadline_seconds=deadline_for(timeout_s),
        kueue_queue=params.kueue_queue or None,
        # C6: each pod copies the base model to its node's disk; C8: the GPU NIC networks.
        ephemeral_storage=ephemeral_storage_request(weight_bytes(params.base_model)),
        gpudirect=gpudirect_setup(params.machine_type, params.nodes, gpudirect=params.gpudirect),
        **gke_capacity(params),
    )
    return GkeOptions(job=job, job_api=params.gke_job_api, cluster=params.gke_cluster)


def gpudirect_setup(machine_type: str, nodes: int, *, gpudirect: bool) -> str | None:
    """The GPUDirect pod setup of a multi-node GKE run with `gpudirect` on, on a machine family
    that needs one (node_facts.INTERCONNECTS); None otherwise."""
    entry = interconnect(machine_type)
    if not gpudirect or nodes < 2 or entry is None:
        return None
    return entry.gke_setup if entry.gke_setup in GPUDIRECT_SETUPS else None


def gke_capacity(params: TrainParams) -> dict[str, Any]:
    """PyTorchJobOptions for the capacity: on Spot the pods keep at least Kubernetes' default
    grace period (POD_TERMINATION_GRACE_S; a preemption itself gives only GKE_SPOT_POD_GRACE_S)
    and more restarts (the budget's deadline is `training_timeout_s`)."""
    options: dict[str, Any] = {"capacity": params.capacity}
    if preemptible(params.capacity):
        options |= {
            "termination_grace_s": POD_TERMINATION_GRACE_S,
            "restarts_per_node": SPOT_RESTARTS_PER_NODE,
        }
    return options
