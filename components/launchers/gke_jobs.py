"""The two job APIs the GKE launcher can run a training job with, as one interface (`JobFlavor`):
Training Operator v1's PyTorchJob and Kubeflow Trainer v2's TrainJob.

Each says how to build its manifest, which API object holds it, which pods are its own and which
one is rank 0's node, how the job stands (queued in Kueue, running, succeeded, failed) and when
it ran. `components/launchers/gke.py` drives either the same way; `flavor(api)` picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from components.launchers.base import TrainLaunch
from components.launchers.k8s_diagnostics import all_workers_succeeded, job_condition
from components.launchers.pytorchjob import CONTAINER as V1_CONTAINER
from components.launchers.pytorchjob import JOB_NAME_LABEL as V1_JOB_NAME_LABEL
from components.launchers.pytorchjob import REPLICA_INDEX_LABEL as V1_INDEX_LABEL
from components.launchers.pytorchjob import PyTorchJobOptions, build_pytorchjob
from components.launchers.pytorchjob_api import JobApi, PyTorchJobApi
from components.launchers.trainjob import (
    COMPLETION_INDEX_LABEL,
    CONTAINER,
    JOBSET_NAME_LABEL,
    build_trainjob,
)
from components.launchers.trainjob_api import (
    JobState,
    TrainJobApi,
    trainjob_state,
    trainjob_times,
)

RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
"""JobSet's label on the pods of each whole-job restart (0, 1, ...)."""


def pytorchjob_state(job: Mapping[str, Any]) -> JobState:
    """The PyTorchJob's latest true condition, or Queued while Kueue keeps it suspended
    (`runPolicy.suspend`, which Kueue clears on admission)."""
    kind, reason, message = job_condition(job)
    if kind not in ("Succeeded", "Failed") and ((job.get("spec") or {}).get("runPolicy") or {}).get(
        "suspend"
    ):
        return JobState("Queued", "Suspended")
    return JobState(kind, reason, message)


def pytorchjob_times(job: Mapping[str, Any]) -> dict[str, str]:
    """The PyTorchJob's own start and completion (status.startTime, completionTime), where set.

    A job Kueue suspended starts from its creation instead: Training Operator v1.9 resets
    startTime on every resume (kubeflow/trainer v1.9.3, pkg/controller.v1/common/job.go
    `ReconcileJobs`), which would drop the time run before a preemption, and the launcher
    subtracts the time it saw the job queued (`queued_s`) from the whole span itself."""
    import datetime as dt

    status = job.get("status") or {}
    fields = {"started_at": status.get("startTime"), "ended_at": status.get("completionTime")}
    suspended = any(c.get("type") == "Suspended" for c in status.get("conditions") or [])
    created = (job.get("metadata") or {}).get("creationTimestamp")
    if suspended and created:
        fields["started_at"] = created
    return {
        key: dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).isoformat()
        for key, stamp in fields.items()
        if stamp
    }


def _v1_succeeded(job: Mapping[str, Any], pods: list[Any], nodes: int) -> bool:
    workers = ((job.get("status") or {}).get("replicaStatuses") or {}).get("Worker") or {}
    return all_workers_succeeded(workers, pods, nodes)


def _v2_succeeded(job: Mapping[str, Any], pods: list[Any], nodes: int) -> bool:
    """`Complete` is every node's pod exited 0 (trainjob_api.py says why that is enough)."""
    return trainjob_state(job).phase == "Succeeded"


@dataclass(frozen=True)
class JobFlavor:
    """What the GKE launcher needs to know of one job API."""

    api: str
    """"pytorchjob" or "trainjob" (the `gke_job_api` choices)."""
    api_class: type[JobApi]
    build: Callable[..., dict[str, Any]]
    """`build(launch=..., options=PyTorchJobOptions)` -> the manifest."""
    job_label: str
    """The label whose value is the job's name on each of its pods."""
    index_label: str
    """The label of a pod's node index ("0" is the node whose log is followed)."""
    container: str
    state: Callable[[Mapping[str, Any]], JobState]
    times: Callable[[Mapping[str, Any]], dict[str, str]]
    succeeded: Callable[[Mapping[str, Any], list[Any], int], bool]
    """Every node succeeded, judged from the job and its pods."""
    children: tuple[str, ...] = ()
    """Suffixes of the objects between the job and its pods whose events say why no pod was
    created (a TrainJob's JobSet has its name; its Job is `<name>-node-0`)."""

    @property
    def kind(self) -> str:
        return self.api_class.KIND

    @property
    def api_version(self) -> str:
        return f"{self.api_class.GROUP}/{self.api_class.VERSION}"

    def manifest(self, launch: TrainLaunch, options: PyTorchJobOptions) -> dict[str, Any]:
        return self.build(launch=launch, options=options)

    def owned_names(self, name: str) -> list[str]:
        """The job's name and its children's (whose events the launcher reads)."""
        return [name, *(f"{name}{suffix}" for suffix in self.children)]

    def pod_selector(self, name: str) -> str:
        return f"{self.job_label}={name}"

    def replicas(self, job: Mapping[str, Any]) -> Any:
        """What the job says of its replicas (v1: Worker replicaStatuses; v2: jobsStatus)."""
        status = job.get("status") or {}
        if self.api == "pytorchjob":
            return (status.get("replicaStatuses") or {}).get("Worker", {})
        return status.get("jobsStatus") or []


PYTORCHJOB = JobFlavor(
    api="pytorchjob",
    api_class=PyTorchJobApi,
    build=build_pytorchjob,
    job_label=V1_JOB_NAME_LABEL,
    index_label=V1_INDEX_LABEL,
    container=V1_CONTAINER,
    state=pytorchjob_state,
    times=pytorchjob_times,
    succeeded=_v1_succeeded,
)
TRAINJOB = JobFlavor(
    api="trainjob",
    api_class=TrainJobApi,
    build=build_trainjob,
    job_label=JOBSET_NAME_LABEL,
    index_label=COMPLETION_INDEX_LABEL,
    container=CONTAINER,
    state=trainjob_state,
    times=trainjob_times,
    succeeded=_v2_succeeded,
    children=(f"-{CONTAINER}-0",),
)
FLAVORS = {f.api: f for f in (TRAINJOB, PYTORCHJOB)}


def flavor(api: str) -> JobFlavor:
    return FLAVORS[api]


def restart_attempt(pods: list[Any]) -> int:
    """The newest JobSet restart attempt among the pods (0 before any restart or for v1)."""
    attempts = [
        int((p.metadata.labels or {}).get(RESTART_ATTEMPT_LABEL) or 0)
        for p in pods
        if p.metadata is not None
    ]
    return max(attempts, default=0)
