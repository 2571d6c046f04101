"""What a launch is made of, apart from any run schema: the rendezvous backends, the default
shape of a training job, and the names Kubernetes and Google Cloud accept.

The launchers build jobs from these alone (an import-linter contract keeps them off
`components.params`); the run parameters (components/params/run_params.py) take their choices and
defaults from here, so each is written once.
"""

from typing import Literal, get_args

Backend = Literal["local", "gke", "vertex"]
BACKENDS: tuple[str, ...] = get_args(Backend)
"""Where the trainer runs: local torchrun agents, a Kubernetes job on GKE, a Vertex AI CustomJob."""

RdzvBackend = Literal["etcd-v3", "etcd-v2", "c10d"]
RDZV_BACKENDS: tuple[str, ...] = get_args(RdzvBackend)
DEFAULT_RDZV_BACKEND: RdzvBackend = "etcd-v3"

DEFAULT_REGION = "us-central1"
DEFAULT_NAMESPACE = "kubeflow"
DEFAULT_MACHINE_TYPE = "a3-highgpu-8g"
DEFAULT_ACCELERATOR_TYPE = "NVIDIA_H100_80GB"
DEFAULT_ACCELERATOR_COUNT = 8

PROJECT_ID = (r"[a-z][a-z0-9-]{4,28}[a-z0-9]", "a Google Cloud project id (6-30 lowercase chars)")
REGION = (r"[a-z]+-[a-z]+[0-9]+", "a Google Cloud region such as us-central1")
K8S_LABEL_NAME = (
    r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
    "a Kubernetes name (lowercase letters, digits and '-', at most 63 chars)",
)
K8S_SUBDOMAIN_NAME = (
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
    "a Kubernetes object name (lowercase letters, digits, '-' and '.')",
)

JobApi = Literal["auto", "trainjob", "pytorchjob"]
"""Which Kubeflow API runs a GKE training job: Trainer v2's TrainJob, Training Operator v1's
PyTorchJob, or `auto` (what the cluster's discovery API serves, TrainJob first)."""
JOB_APIS: tuple[str, ...] = get_args(JobApi)
DEFAULT_JOB_API: JobApi = "auto"

DEADLINE_GRACE_S = 600
"""A cloud job's own deadline = the launcher's timeout + this (PyTorchJob/TrainJob
`activeDeadlineSeconds`, CustomJob `timeout`): the launcher deletes the job at its timeout; the
platform ends it by itself a little later should the launcher have been killed (a KFP terminate
can cut the launcher's cancel short, issue 29 N9)."""


def deadline_for(timeout_s: float | None) -> int | None:
    """A cloud job's own deadline for a launcher timeout (`DEADLINE_GRACE_S` later)."""
    return None if timeout_s is None else int(timeout_s) + DEADLINE_GRACE_S


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that hands a job to a Kueue LocalQueue (kueue.sigs.k8s.io/docs/tasks/run/trainjobs,
site/content/en/docs/tasks/run/trainjobs.md in kubernetes-sigs/kueue v0.19.2)."""


def resolve_nproc_per_node(backend: str, nproc_per_node: int, accelerator_count: int) -> int:
    """The processes per node to start: `nproc_per_node`, or for 0 one per accelerator (1 on
    CPU machines and locally)."""
    if nproc_per_node > 0:
        return nproc_per_node
    return accelerator_count if backend != "local" and accelerator_count > 0 else 1
