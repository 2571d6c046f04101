"""Why did a pod not run? Reasons read from pod status and events, in words a user can act on;
and how a PyTorchJob stands (its condition, whether every worker succeeded, its service account).

Pure functions over `kubernetes.client` models (V1Pod, CoreV1Event) and the job's dict, so the GKE
launcher's wait loop and its tests share them. Each finding says which pod, what happened and what to change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.launchers.pytorchjob import WORKLOAD_IDENTITY_ANNOTATION

# Waiting reasons that will not fix themselves: fail the run now rather than wait for a deadline.
FATAL_WAITING = {
    "ImagePullBackOff": "cannot pull the image: check the image name/tag and that the node's "
    "service account can read the registry",
    "ErrImagePull": "cannot pull the image: check the image name/tag and registry access",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container config is invalid, usually a missing Secret or "
    "ConfigMap (e.g. the HF token secret): create it in the job's namespace",
    "CreateContainerError": "the container could not be created",
}
TERMINATED_HINTS = {
    "OOMKilled": "out of memory: raise the memory limit, lower micro_batch_size or seq_len, or "
    "turn on activation_checkpointing",
    "Error": "the trainer exited with an error: see the log lines above",
    "ContainerCannotRun": "the container's command could not run",
    "DeadlineExceeded": "the job's activeDeadlineSeconds passed",
}
WARNING_EVENTS = {
    "FailedScheduling": "cannot be scheduled",
    "FailedMount": "a volume cannot be mounted",
    "FailedAttachVolume": "a volume cannot be attached",
    "Evicted": "evicted by the node",
    "Preempting": "preempted",
    "NotTriggerScaleUp": "the cluster autoscaler cannot add a node for it",
    "BackOff": "restarting after failures (back-off)",
}


@dataclass(frozen=True)
class PodProblem:
    """One reason a pod is not running (or stopped)."""

    pod: str
    reason: str
    message: str
    fatal: bool

    def __str__(self) -> str:
        return f"pod {self.pod}: {self.reason}: {self.message}"


def _statuses(pod: Any) -> list[Any]:
    status = pod.status
    if status is None:
        return []
    return [*(status.init_container_statuses or []), *(status.container_statuses or [])]


def pod_problems(pod: Any) -> list[PodProblem]:
    """Problems visible in one pod's status (no events)."""
    name = pod.metadata.name
    problems: list[PodProblem] = []
    status = pod.status
    if status is not None and status.reason == "Evicted":
        problems.append(PodProblem(name, "Evicted", status.message or "evicted", fatal=False))
    for condition in (status.conditions or []) if status is not None else []:
        if condition.type == "PodScheduled" and condition.status == "False":
            problems.append(
                PodProblem(
                    name,
                    condition.reason or "Unschedulable",
                    (condition.message or "no node fits")
                    + " (check GPU quota, the accelerator node pool and its taints)",
                    fatal=False,
                )
            )
    for container in _statuses(pod):
        state = container.state
        waiting = state.waiting if state is not None else None
        if waiting is not None and waiting.reason in FATAL_WAITING:
            detail = FATAL_WAITING[waiting.reason]
            if waiting.message:
                detail += f" ({waiting.message})"
            problems.append(PodProblem(name, waiting.reason, detail, fatal=True))
        for terminated in (
            state.terminated if state is not None else None,
            container.last_state.terminated if container.last_state is not None else None,
        ):
            if terminated is None or terminated.exit_code == 0:
                continue
            reason = terminated.reason or "Error"
            hint = TERMINATED_HINTS.get(reason, "the container stopped")
            problems.append(
                PodProblem(
                    name,
                    reason,
                    f"container {container.name} exited with code {terminated.exit_code}: {hint}",
                    fatal=False,
                )
            )
            break  # the current state is enough when it is terminated too
    return problems


def event_problems(events: Iterable[Any]) -> list[PodProblem]:
    """Warning events worth reporting (latest message per object and reason)."""
    seen: dict[tuple[str, str], PodProblem] = {}
    for event in events:
        if event.type != "Warning" or event.reason not in WARNING_EVENTS:
            continue
        obj = event.involved_object.name if event.involved_object is not None else "?"
        seen[(obj, event.reason)] = PodProblem(
            obj, event.reason, f"{WARNING_EVENTS[event.reason]}: {event.message}", fatal=False
        )
    return list(seen.values())


def summarize(problems: Iterable[PodProblem]) -> str:
    unique = list(dict.fromkeys(str(p) for p in problems))
    return "; ".join(unique)


# -- a PyTorchJob's state ---------------------------------------------------------------------


def job_condition(job: Mapping[str, Any]) -> tuple[str, str, str]:
    """The latest true condition: (type, reason, message); ("", "", "") before the first."""
    conditions = [
        c for c in job.get("status", {}).get("conditions") or [] if c.get("status") == "True"
    ]
    if not conditions:
        return "", "", ""
    last = conditions[-1]
    return last.get("type", ""), last.get("reason", ""), last.get("message", "")


FAILING_REASONS = {"CrashLoopBackOff", "Error", "OOMKilled", "ContainerCannotRun"}
"""Container states that mean a worker is failing (restarting after a non-zero exit)."""


def all_workers_succeeded(workers: Mapping[str, Any], pods: list[Any], nodes: int) -> bool:
    """Every replica succeeded: by the operator's count, or by the pods when it lags."""
    if int(workers.get("succeeded") or 0) >= nodes and not int(workers.get("failed") or 0):
        active = [p for p in pods if p.status and p.status.phase in ("Pending", "Running")]
        return not active
    done = [p for p in pods if p.status and p.status.phase == "Succeeded"]
    return len(done) >= nodes and len(done) == len(pods)


def service_account_check(core: Any, namespace: str, name: str | None) -> str | None:
    """The pods' Kubernetes service account must exist (else the operator's pods never get
    created: ValueError) and should carry a Workload Identity annotation (else gs:// access is
    403: the returned warning). None when it looks right or when we may not look."""
    from kubernetes.client.exceptions import ApiException

    account = name or "default"
    try:
        found = core.read_namespaced_service_account(account, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise ValueError(
                f"Kubernetes service account {namespace}/{account} does not exist: "
                "create it and bind it to a Google service account with Workload Identity "
                "(docs/deploy/rbac.yaml), or set service_account"
            ) from None
        if exc.status == 403:
            return None  # not allowed to look: the pods will tell
        raise
    annotations = (found.metadata.annotations or {}) if found.metadata else {}
    if WORKLOAD_IDENTITY_ANNOTATION in annotations:
        return None
    return (
        f"service account {namespace}/{account} has no {WORKLOAD_IDENTITY_ANNOTATION} "
        "annotation: reading gs:// will fail with 403 unless the node's service account may"
    )


# -- a job waiting in a Kueue queue ----------------------------------------------------------


def kueue_workload_reason(events: Iterable[Any], kind: str, name: str) -> str:
    """The latest thing Kueue said of the job's Workload ("" if nothing yet), e.g. `Pending:
    couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu ...`.

    Kueue names a job's Workload `<kind>-<job name>` (cut to its maximum length) + `-` + a 5
    character hash (kubernetes-sigs/kueue v0.19.2, pkg/controller/jobframework/
    workload_names.go), and its scheduler records why a Workload waits as events on it
    (pkg/scheduler/scheduler.go): read with the events permission the launcher has already,
    rather than a Role rule for Workloads."""
    owner = f"{kind.lower()}-{name}"
    latest = ""
    for event in events:
        obj = event.involved_object
        if obj is None or obj.kind != "Workload" or not obj.name:
            continue
        prefix = obj.name[: -len("-xxxxx")] if len(obj.name) > 6 else ""
        if prefix and owner.startswith(prefix):
            latest = f"{event.reason}: {event.message}" if event.message else str(event.reason)
    return latest
