"""GKE backend: the run as a Kubeflow Training Operator v1 PyTorchJob, submitted and followed.

The manifest comes from `components/launchers/pytorchjob.py` (a pure builder) and reaches the
cluster through `components/launchers/pytorchjob_api.py` (create idempotently, delete, watch);
`GkeLauncher` follows the run (status conditions, the rank-0 pod's log, pod failure reasons) and
judges it, deletes the job on SIGTERM and cleans up by label.

Design choices:
- A Worker-only elastic PyTorchJob is marked Succeeded as soon as one worker succeeds, so success
  is judged here from every replica (each worker pod succeeded).
- The job is followed with a watch that resumes from the last resourceVersion (a 410 Gone lists
  again); each quiet watch window re-checks the pods. A job the operator marks Succeeded while a
  worker still runs or restarts is failed after `succeeded_grace_s` (or at once when that worker
  is crash-looping) instead of being waited on forever.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.etcd.kubernetes import (
    adopt_etcd,
    create_etcd,
    delete_etcd,
    release_etcd,
    wait_etcd_ready,
)
from components.etcd.manifests import etcd_endpoint
from components.launchers.base import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    Launcher,
    LaunchResult,
    LogSink,
    TrainLaunch,
)
from components.launchers.k8s_diagnostics import (
    FAILING_REASONS,
    PodProblem,
    all_workers_succeeded,
    event_problems,
    job_condition,
    pod_problems,
    service_account_check,
    summarize,
)
from components.launchers.pod_logs import RankZeroLog
from components.launchers.pytorchjob import (
    GROUP,
    JOB_NAME_LABEL,
    KIND,
    VERSION,
    PyTorchJobOptions,
    build_pytorchjob,
)
from components.launchers.pytorchjob_api import JobGone, PyTorchJobApi
from components.runtime.k8s_client import make_api_client, run_owner
from components.runtime.run_identity import k8s_selector


def job_times(job: Mapping[str, Any]) -> dict[str, str]:
    """The PyTorchJob's own start and completion (status.startTime, completionTime), where set."""
    import datetime as dt

    status = job.get("status") or {}
    return {
        key: dt.datetime.fromisoformat(status[field].replace("Z", "+00:00")).isoformat()
        for key, field in (("started_at", "startTime"), ("ended_at", "completionTime"))
        if status.get(field)
    }


@dataclass(frozen=True)
class GkeOptions:
    """Where and how the GKE backend runs a PyTorchJob (`GkeLauncher`)."""

    job: PyTorchJobOptions = field(default_factory=PyTorchJobOptions)
    """The PyTorchJob's settings; its `namespace` is where the job and the run's etcd live."""
    cluster: str = ""
    """Remote GKE cluster `projects/P/locations/L/clusters/C` (from Vertex Pipelines); "" in a
    pod of the cluster or with a kubeconfig."""
    api_client: Any = None
    """A `kubernetes.client.ApiClient`; default `components.runtime.k8s_client.make_api_client`."""
    watch_s: float = 60.0
    """Length of one watch window: the job is watched from its last resourceVersion and, when
    quiet for this long, its pods are re-checked (unschedulable, crash loops)."""
    pending_timeout_s: float = 1800.0
    """Fail when a pod stays unschedulable this long (a GPU node pool that cannot scale up
    otherwise keeps the run pending until activeDeadlineSeconds)."""
    succeeded_grace_s: float = 600.0
    """How long workers may still run after the operator marked the job Succeeded (an elastic
    job is Succeeded when any worker is) before the run fails."""
    follow_logs: bool = True
    """Stream the rank-0 pod's log to the log sink."""


@dataclass
class _WaitClock:
    """What `GkeLauncher.wait` remembers between updates of the job."""

    timeout: float | None
    deadline: float | None
    last_phase: str = ""
    pending_since: float | None = None
    succeeded_since: float | None = None


class GkeLauncher(Launcher):
    """Runs a PyTorchJob on a GKE (or any Kubernetes) cluster with the Training Operator; `options`
    say where and how (`GkeOptions`), `log` is the sink for progress and the rank-0 log."""

    backend = "gke"

    def __init__(self, options: GkeOptions | None = None, *, log: LogSink | None = None) -> None:
        super().__init__(log=log)
        options = options or GkeOptions()
        api_client = options.api_client
        if api_client is None:
            api_client = make_api_client(cluster=options.cluster)
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.jobs = PyTorchJobApi(
            client.CustomObjectsApi(api_client), options.job.namespace, log=self.log
        )
        self.job_options = options.job
        self.namespace = options.job.namespace
        self.watch_s = options.watch_s
        self.pending_timeout_s = options.pending_timeout_s
        self.succeeded_grace_s = options.succeeded_grace_s
        self.name = ""
        self.manifest: dict[str, Any] = {}
        self._logs = RankZeroLog(self.core, log=self.log) if options.follow_logs else None
        self._cancelled = False

    # ---- start --------------------------------------------------------------------------------

    def start(self, launch: TrainLaunch) -> None:
        self.launch = launch
        self.manifest = build_pytorchjob(launch=launch, options=self.job_options)
        self.name = self.manifest["metadata"]["name"]
        warning = service_account_check(self.core, self.namespace, self.job_options.service_account)
        if warning:
            self.log(f"[gke] warning: {warning}")

        owner = run_owner(self.api_client, self.namespace)
        if owner and not self.job_options.owner:
            self.manifest["metadata"]["ownerReferences"] = [owner]  # gone with the KFP run
        own_etcd = launch.rdzv_backend in ("etcd-v3", "etcd-v2") and self._uses_run_etcd(launch)
        if own_etcd:
            self._ensure_etcd(launch, owner)
        created = self.jobs.create(self.manifest)
        uid = (created.get("metadata") or {}).get("uid")
        if own_etcd and uid:
            job_ref = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": self.name,
                "uid": uid,
            }
            if adopt_etcd(
                self.api_client, run_id=launch.run_id, namespace=self.namespace, owner=job_ref
            ):
                self.log(f"[gke] the run's etcd now belongs to PyTorchJob {self.name} (its TTL)")

    def _uses_run_etcd(self, launch: TrainLaunch) -> bool:
        run_etcd = etcd_endpoint(run_id=launch.run_id, namespace=self.namespace)
        return launch.rdzv_endpoint in ("", run_etcd)

    def _ensure_etcd(self, launch: TrainLaunch, owner: dict[str, Any] | None) -> None:
        """The run's etcd, present and ready before the job rendezvouses on it.

        A PyTorchJob that adopted etcd (`adopt_etcd`) takes it along when deleted (a Failed or
        timed-out job, the replace in `PyTorchJobApi.create`, a SIGTERM), and only the etcd_up
        step creates it: a retried train task would rendezvous on nothing. So the job's
        ownership is dropped before anything can delete it, and etcd is (re)created, reusing
        what exists, as the etcd_up step does (components/steps/etcd.py)."""
        run_id, namespace = launch.run_id, self.namespace
        if release_etcd(self.api_client, run_id=run_id, namespace=namespace, owner_kind=KIND):
            self.log("[gke] the run's etcd no longer belongs to an earlier PyTorchJob")
        create_etcd(
            self.api_client,
            run_id=run_id,
            namespace=namespace,
            owner=owner,
            enable_v2=launch.rdzv_backend == "etcd-v2",
        )
        wait_etcd_ready(self.api_client, run_id=run_id, namespace=namespace)

    # ---- wait ---------------------------------------------------------------------------------

    def _pods(self) -> list[Any]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{JOB_NAME_LABEL}={self.name}"
            ).items
        )

    def _events(self, pods: list[Any]) -> list[Any]:
        events: list[Any] = []
        for pod in pods:
            events += self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
            ).items
        return events

    def diagnose(self, pods: list[Any] | None = None) -> list[PodProblem]:
        """Every problem of the job's pods, from their status and their Warning events."""
        pods = self._pods() if pods is None else pods
        problems = [p for pod in pods for p in pod_problems(pod)]
        return problems + event_problems(self._events(pods))

    def wait(self, *, timeout: float | None = None) -> LaunchResult:
        if self.launch is None or not self.name:
            raise RuntimeError("start() a run before wait()")
        launch = self.launch
        started = time.monotonic()
        clock = _WaitClock(timeout=timeout, deadline=None if timeout is None else started + timeout)
        status, message, details = FAILED, "", {}
        updates = self.jobs.updates(self.name, watch_s=self.watch_s)
        try:
            for job in updates:
                phase, reason, text = job_condition(job)
                if phase != clock.last_phase:
                    self.log(
                        f"[gke] {self.name}: {phase or 'Pending'}"
                        + (f" ({reason})" if reason else "")
                    )
                    clock.last_phase = phase
                pods = self._pods()
                if self._logs is not None:
                    self._logs.follow(self.namespace, pods)
                workers = job.get("status", {}).get("replicaStatuses", {}).get("Worker", {})
                details = {"job": self.name, "condition": phase, "replicas": workers}
                details |= job_times(job)
                verdict = self._verdict(phase, f"{reason}: {text}", workers, pods, clock)
                if verdict is not None:
                    status, message = verdict
                    break
        except JobGone:
            status = CANCELLED if self._cancelled else FAILED
            message = f"PyTorchJob {self.namespace}/{self.name} was deleted while running"
        finally:
            updates.close()
            if self._logs is not None:
                self._logs.stop()
        return self.result(launch, status, message, started=started, details=details)

    def _verdict(
        self,
        phase: str,
        reason: str,
        workers: Mapping[str, Any],
        pods: list[Any],
        clock: _WaitClock,
    ) -> tuple[str, str] | None:
        """(status, message) once the run has ended or must be stopped; None to keep waiting.
        Every way of stopping it here deletes the job first."""
        assert self.launch is not None
        nodes = self.launch.nodes
        if phase == "Failed":
            problems = self.diagnose(pods)
            message = f"PyTorchJob {self.name} failed: {reason}".rstrip(": ")
            # cleanPodPolicy None keeps the pods, and running or crash-looping ones hold their
            # GPUs: delete the job (its logs were diagnosed above) rather than wait for cleanup.
            self.jobs.delete(self.name)
            return FAILED, message + (f"; {summarize(problems)}" if problems else "")
        if all_workers_succeeded(workers, pods, nodes):
            return SUCCEEDED, f"all {nodes} workers succeeded"
        problems = [p for pod in pods for p in pod_problems(pod)]
        message = ""
        if phase == "Succeeded":
            message = self._succeeded_early(pods, problems, clock)
        fatal = [p for p in problems if p.fatal]
        if not message and fatal:
            message = f"PyTorchJob {self.name} cannot run: {summarize(fatal)}"
        unschedulable = [p for p in problems if p.reason == "Unschedulable"]
        if not unschedulable:
            clock.pending_since = None
        elif not message:
            clock.pending_since = clock.pending_since or time.monotonic()
            if time.monotonic() - clock.pending_since > self.pending_timeout_s:
                events = event_problems(self._events(pods))
                message = (
                    f"PyTorchJob {self.name} unschedulable for over "
                    f"{self.pending_timeout_s:.0f}s: {summarize(unschedulable + events)}"
                )
        if not message and clock.deadline is not None and time.monotonic() > clock.deadline:
            message = f"timed out after {clock.timeout:.0f}s; deleted PyTorchJob {self.name}"
        if message:
            self.jobs.delete(self.name)
            return FAILED, message
        return (CANCELLED, "cancelled") if self._cancelled else None

    def _succeeded_early(
        self, pods: list[Any], problems: list[PodProblem], clock: _WaitClock
    ) -> str:
        """Why a job the operator marked Succeeded has failed ("" while workers may still finish):
        a Worker-only elastic job is "Succeeded" once any worker succeeds."""
        failed_pods = [p.metadata.name for p in pods if p.status and p.status.phase == "Failed"]
        unfinished = [p.metadata.name for p in pods if p.status and p.status.phase != "Succeeded"]
        failing = [p for p in problems if p.reason in FAILING_REASONS]
        clock.succeeded_since = clock.succeeded_since or time.monotonic()
        waited = time.monotonic() - clock.succeeded_since
        if not (failed_pods or failing or waited > self.succeeded_grace_s):
            return ""
        if failed_pods:
            what = f"worker pod(s) {', '.join(failed_pods)} failed"
        else:
            why = " (failing)" if failing else f" within {self.succeeded_grace_s:.0f}s"
            what = f"worker pod(s) {', '.join(unfinished)} did not finish{why}"
        return (
            f"PyTorchJob {self.name} is marked Succeeded but {what}; "
            f"{summarize(self.diagnose(pods))}"
        )

    # ---- cancel and cleanup -------------------------------------------------------------------

    def cancel(self) -> None:
        self._cancelled = True
        if self.name and self.jobs.delete(self.name):
            self.log(f"[gke] deleted PyTorchJob {self.namespace}/{self.name}")

    def cleanup(self, run_id: str) -> list[str]:
        """Delete the run's PyTorchJobs (by label) and its etcd objects; 404s are ignored."""
        removed: list[str] = []
        for item in self.jobs.list(k8s_selector(run_id)):
            name = item["metadata"]["name"]
            if self.jobs.delete(name, item["metadata"].get("namespace")):
                removed.append(f"PyTorchJob {self.namespace}/{name}")
        removed += _cleanup_etcd(self.api_client, run_id, self.namespace)
        return removed


def _cleanup_etcd(api_client: Any, run_id: str, namespace: str) -> list[str]:
    """The run's etcd StatefulSet/Service/PVCs, deleted by label (components/etcd/kubernetes.py)."""
    return [f"etcd {obj}" for obj in delete_etcd(api_client, run_id=run_id, namespace=namespace)]
