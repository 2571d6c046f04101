"""Trainer v2 TrainJobs through the Kubernetes API (`TrainJobApi`: the same idempotent create,
delete, list by label and resumable watch as the PyTorchJob's), how a TrainJob stands
(`trainjob_state`), and which job API a cluster serves (`resolve_job_api`, by discovery).

What the v2 controller reports (kubeflow/trainer v2.3.0, pkg/controller/trainjob_controller.go
and pkg/runtime/framework/plugins/jobset/jobset.go `Status`): the conditions `Suspended`
(True while `spec.suspend`, then False with reason `Resumed`), `Complete` (copied from the
JobSet's Completed) and `Failed` (the JobSet's Failed, or reason `DeadlineExceeded` once
`activeDeadlineSeconds` passed since creation or the last resume); `jobsStatus` counts child
Jobs (ready, succeeded, failed, active, suspended), not pods. No `Running` condition and no
start or completion time: the launcher reads running from the pods and times from conditions.

Is `Complete` enough to call the run a success? With our runtime, yes (components/launchers/
trainjob.py: one Indexed Job of numNodes completions, JobSet's default successPolicy `All`), so
every node's pod exited 0; the launcher still reads the pods for everything `Failed` does not
say: which pod failed and why (OOMKilled, image pull, a missing Secret), a pod that cannot be
scheduled, JobSet restarts, since the TrainJob reports none of these.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.launchers.pytorchjob import GROUP as V1_GROUP
from components.launchers.pytorchjob import KIND as V1_KIND
from components.launchers.pytorchjob import PLURAL as V1_PLURAL
from components.launchers.pytorchjob import VERSION as V1_VERSION
from components.launchers.pytorchjob_api import JobApi
from components.launchers.trainjob import GROUP, KIND, PLURAL, VERSION


class TrainJobApi(JobApi):
    """Kubeflow Trainer v2 TrainJobs (`trainer.kubeflow.org/v1alpha1`)."""

    GROUP, VERSION, PLURAL, KIND = GROUP, VERSION, PLURAL, KIND


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True)
class JobState:
    """A job's state in the launcher's words: `phase` is Queued (suspended: waiting for Kueue),
    Succeeded, Failed or "" (created or running: the pods say which)."""

    phase: str
    reason: str = ""
    message: str = ""


def trainjob_state(job: Mapping[str, Any]) -> JobState:
    """The TrainJob's phase from its conditions and `spec.suspend`."""
    for kind, phase in (("Failed", "Failed"), ("Complete", "Succeeded")):
        condition = _condition(job, kind)
        if condition and condition.get("status") == "True":
            return JobState(phase, condition.get("reason", ""), condition.get("message", ""))
    if (job.get("spec") or {}).get("suspend"):
        return JobState("Queued", "Suspended")
    return JobState("")


def _iso(stamp: str) -> str:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).isoformat()


def trainjob_times(job: Mapping[str, Any]) -> dict[str, str]:
    """When the TrainJob started (created) and ended (its Complete or Failed condition's last
    transition), where known: the TrainJob has no startTime/completionTime of its own. Time it
    spent suspended (in a queue) is counted by the launcher (`queued_s`), not here."""
    times = {}
    created = (job.get("metadata") or {}).get("creationTimestamp")
    if created:
        times["started_at"] = _iso(created)
    for kind in ("Complete", "Failed"):
        condition = _condition(job, kind)
        if condition and condition.get("status") == "True" and condition.get("lastTransitionTime"):
            times["ended_at"] = _iso(condition["lastTransitionTime"])
    return times


# ---- which API the cluster serves --------------------------------------------------------------

INSTALL_HINT = (
    "install Kubeflow Trainer v2 (docs/deploy/README.md, 'A new GKE cluster') or the Training "
    "Operator v1 with its PyTorchJob CRD, or set gke_job_api to the one the cluster has"
)


def served_job_apis(custom: Any) -> set[str]:
    """The job APIs the cluster's discovery lists: "trainjob" when `trainer.kubeflow.org/
    v1alpha1` serves `trainjobs`, "pytorchjob" when `kubeflow.org/v1` serves `pytorchjobs`.
    Discovery is open to every authenticated user (the `system:discovery` ClusterRole), so no
    Role rule is needed for it."""
    return {
        api
        for api, group, version, plural in (
            ("trainjob", GROUP, VERSION, PLURAL),
            ("pytorchjob", V1_GROUP, V1_VERSION, V1_PLURAL),
        )
        if serves_resource(custom, group, version, plural)
    }


def serves_resource(custom: Any, group: str, version: str, plural: str) -> bool:
    """Whether the cluster's discovery lists `plural` in `group/version` (a 404: not served)."""
    from kubernetes.client.exceptions import ApiException

    try:
        resources = custom.get_api_resources(group, version)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == plural for r in resources.resources or [])


def resolve_job_api(choice: str, custom: Any) -> str:
    """ "trainjob" or "pytorchjob" for `choice` (auto | trainjob | pytorchjob) on this cluster:
    `auto` prefers TrainJob (a GPUDirect job too: its runtime variant carries the NIC setup,
    components/launchers/trainjob.py). Raises ValueError (one line naming what to install or set)
    when the chosen API, or with `auto` either, is not served."""
    served = served_job_apis(custom)
    if choice == "auto":
        for api in ("trainjob", "pytorchjob"):
            if api in served:
                return api
        raise ValueError(
            f"gke_job_api=auto: the cluster serves neither TrainJob ({GROUP}/{VERSION}) nor "
            f"{V1_KIND} ({V1_GROUP}/{V1_VERSION}): {INSTALL_HINT}"
        )
    if choice not in ("trainjob", "pytorchjob"):
        raise ValueError(f"gke_job_api={choice!r}: choose auto, trainjob or pytorchjob")
    if choice not in served:
        what = (
            f"TrainJob ({GROUP}/{VERSION}): install Kubeflow Trainer v2"
            if choice == "trainjob"
            else f"{V1_KIND} ({V1_GROUP}/{V1_VERSION}): install the Training Operator v1"
        )
        other = ({"trainjob", "pytorchjob"} & served) - {choice}
        hint = f", or set gke_job_api={other.pop()} (served)" if other else ""
        raise ValueError(f"gke_job_api={choice}: the cluster does not serve {what}{hint}")
    return choice
