"""GKE backend: the run as a Kubeflow Trainer v2 TrainJob or a Training Operator v1 PyTorchJob,
submitted and followed.

The manifest comes from a pure builder (`components/launchers/trainjob.py` or `pytorchjob.py`)
and reaches the cluster through `trainjob_api.py` / `pytorchjob_api.py` (create idempotently,
delete, watch); `components/launchers/gke_jobs.py` says how each API reports its state.
`GkeLauncher` follows the run (conditions, the rank-0 node's log, pod failure reasons, the time
it waits in a Kueue queue) and judges it, deletes the job on SIGTERM and cleans up by label.

Design choices:
- `job_api` (auto | trainjob | pytorchjob): `auto` asks discovery which CRDs the cluster serves
  and prefers TrainJob (Kubeflow's current API), PyTorchJob for a GPUDirect job.
- A Worker-only elastic PyTorchJob is Succeeded once one worker succeeds: success is judged here
  from every worker pod; a TrainJob's Complete already means every node's pod succeeded.
- The job is followed with a watch that resumes from the last resourceVersion (a 410 Gone lists
  again); each quiet watch window re-checks the pods. A job the operator marks Succeeded while a
  worker still runs or restarts is failed after `succeeded_grace_s` (or at once when that worker
  is crash-looping) instead of being waited on forever.
- A job suspended in a Kueue queue (or preempted by Kueue: suspended again) is waiting, not
  running: the step's log says so, the time is reported as `queued_s` (the cost record bills
  only the rest), the launcher's own timeout does not run meanwhile (as a TrainJob's
  activeDeadlineSeconds restarts on resume), and `queue_timeout_s` bounds the wait.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

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
from components.launchers.gke_jobs import (
    FLAVORS,
    JobFlavor,
    flavor,
    pytorchjob_times,
    restart_attempt,
)
from components.launchers.k8s_diagnostics import (
    FAILING_REASONS,
    PodProblem,
    event_problems,
    kueue_workload_reason,
    pod_problems,
    service_account_check,
    summarize,
)
from components.launchers.pod_logs import RankZeroLog
from components.launchers.pytorchjob import (
    PyTorchJobOptions,
)
from components.launchers.pytorchjob_api import JobGone
from components.launchers.trainjob_api import resolve_job_api
from components.launchers.vocab import DEFAULT_JOB_API
from components.runtime.k8s_client import make_api_client, run_owner
from components.runtime.run_identity import k8s_selector

job_times = pytorchjob_times
"""A PyTorchJob's own start and completion times (kept under its old name)."""


@dataclass(frozen=True)
class GkeOptions:
    """Where and how the GKE backend runs a training job (`GkeLauncher`)."""

    backend: ClassVar[str] = "gke"

    job: PyTorchJobOptions = field(default_factory=PyTorchJobOptions)
    """The job's settings (either API); its `namespace` is where the job and the run's etcd
    live."""
    job_api: str = DEFAULT_JOB_API
    """auto | trainjob | pytorchjob (components/launchers/vocab.py `JobApi`)."""
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
    queue_timeout_s: float | None = None
    """Fail when the job waits in its Kueue queue (suspended) longer than this in all; None:
    as long as it takes (the queue decides)."""
    succeeded_grace_s: float = 600.0
    """How long workers may still run after the operator marked the job Succeeded (an elastic
    job is Succeeded when any worker is) before the run fails."""
    follow_logs: bool = True
    """Stream the rank-0 pod's log to the log sink."""

    def launcher(self, *, log: LogSink | None = None) -> GkeLauncher:
        """The launcher of these options' backend (`GkeLauncher`)."""
        return GkeLauncher(self, log=log)


@dataclass
class _WaitClock:
    """What `GkeLauncher.wait` remembers between updates of the job."""

    timeout: float | None
    deadline: float | None
    last_phase: str = ""
    pending_since: float | None = None
    podless_since: float | None = None
    succeeded_since: float | None = None
    queued_since: float | None = None
    queued_s: float = 0.0
    queue_reason: str = ""
    restarts: int = 0

    def queued(self, now: float) -> float:
        """Seconds queued so far (the current wait included)."""
        return self.queued_s + (now - self.queued_since if self.queued_since else 0.0)


class GkeLauncher(Launcher):
    """Runs a TrainJob (Kubeflow Trainer v2) or a PyTorchJob (Training Operator v1) on a GKE (or
    any Kubernetes) cluster; `options` say where and how (`GkeOptions`), `log` is the sink for
    progress and the rank-0 log."""

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
        self.custom = client.CustomObjectsApi(api_client)
        self.job_api = options.job_api
        self.flavor: JobFlavor | None = FLAVORS.get(options.job_api)
        self.job_options = options.job
        self.namespace = options.job.namespace
        self.watch_s = options.watch_s
        self.pending_timeout_s = options.pending_timeout_s
        self.queue_timeout_s = options.queue_timeout_s
        self.succeeded_grace_s = options.succeeded_grace_s
        self.follow_logs = options.follow_logs
        self.name = ""
        self.manifest: dict[str, Any] = {}
        self._logs: RankZeroLog | None = None
        self._cancelled = False

    @property
    def jobs(self) -> Any:
        """The chosen API's jobs (`JobApi`); the API is resolved on first use."""
        return self._flavor().api_class(self.custom, self.namespace, log=self.log)

    def _flavor(self) -> JobFlavor:
        if self.flavor is None:  # auto: what the cluster serves (resolve_job_api)
            self.flavor = flavor(resolve_job_api(self.job_api, self.custom))
            self.log(f"[gke] gke_job_api={self.job_api}: the cluster serves {self.flavor.kind}")
        return self.flavor

    # ---- start --------------------------------------------------------------------------------

    def start(self, launch: TrainLaunch) -> None:
        self.launch = launch
        kind = self._flavor()
        self.manifest = kind.manifest(launch, self.job_options)
        self.name = self.manifest["metadata"]["name"]
        if self.follow_logs:
            self._logs = RankZeroLog(
                self.core, log=self.log, index_label=kind.index_label, container=kind.container
            )
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
                "apiVersion": kind.api_version,
                "kind": kind.kind,
                "name": self.name,
                "uid": uid,
            }
            if adopt_etcd(
                self.api_client, run_id=launch.run_id, namespace=self.namespace, owner=job_ref
            ):
                self.log(f"[gke] the run's etcd now belongs to {kind.kind} {self.name}")

    def _uses_run_etcd(self, launch: TrainLaunch) -> bool:
        run_etcd = etcd_endpoint(run_id=launch.run_id, namespace=self.namespace)
        return launch.rdzv_endpoint in ("", run_etcd)

    def _ensure_etcd(self, launch: TrainLaunch, owner: dict[str, Any] | None) -> None:
        """The run's etcd, present and ready before the job rendezvouses on it.

        A job that adopted etcd (`adopt_etcd`) takes it along when deleted (a Failed or
        timed-out job, the replace in `JobApi.create`, a SIGTERM), and only the etcd_up
        step creates it: a retried train task would rendezvous on nothing. So the job's
        ownership is dropped before anything can delete it, and etcd is (re)created, reusing
        what exists, as the etcd_up step does (components/steps/etcd.py)."""
        run_id, namespace = launch.run_id, self.namespace
        kind = self._flavor().kind
        if release_etcd(self.api_client, run_id=run_id, namespace=namespace, owner_kind=kind):
            self.log(f"[gke] the run's etcd no longer belongs to an earlier {kind}")
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
        selector = self._flavor().pod_selector(self.name)
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

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
        launch, kind = self.launch, self._flavor()
        started = time.monotonic()
        clock = _WaitClock(timeout=timeout, deadline=None if timeout is None else started + timeout)
        status, message = FAILED, ""
        details: dict[str, Any] = {}
        updates = self.jobs.updates(self.name, watch_s=self.watch_s)
        try:
            for job in updates:
                state = kind.state(job)
                queued = self._queue(state.phase == "Queued", clock)
                pods = [] if queued else self._pods()
                self._log_phase(state.phase or _pods_phase(pods), state.reason, clock)
                if self._logs is not None and not queued:
                    self._logs.follow(self.namespace, pods)
                self._log_restarts(pods, clock)
                details = {"job": self.name, "api": kind.api, "condition": state.phase}
                details |= {"replicas": kind.replicas(job), **kind.times(job)}
                details["queued_s"] = round(clock.queued(time.monotonic()), 3)
                verdict = self._verdict(job, state.phase, state.reason, state.message, pods, clock)
                if verdict is not None:
                    status, message = verdict
                    break
        except JobGone:
            status = CANCELLED if self._cancelled else FAILED
            message = f"{kind.kind} {self.namespace}/{self.name} was deleted while running"
        finally:
            updates.close()
            if self._logs is not None:
                self._logs.stop()
        details["queued_s"] = round(clock.queued(time.monotonic()), 3)
        return self.result(launch, status, message, started=started, details=details)

    def _log_phase(self, phase: str, reason: str, clock: _WaitClock) -> None:
        if phase != clock.last_phase:
            self.log(
                f"[gke] {self.name}: {phase or 'Pending'}" + (f" ({reason})" if reason else "")
            )
            clock.last_phase = phase

    def _queue(self, queued: bool, clock: _WaitClock) -> bool:
        """Count the time the job is suspended in its Kueue queue (none of it is running time:
        the launcher's deadline moves by as much); say when it starts and ends."""
        now = time.monotonic()
        queue = self.job_options.kueue_queue or "(none named)"
        if queued and clock.queued_since is None:
            clock.queued_since = now
            again = " again (preempted)" if clock.last_phase not in ("", "Queued") else ""
            self.log(
                f"[gke] {self.name}: waiting{again} in Kueue queue {queue} for the whole job to "
                "be admitted (suspended; not billed, not counted against the timeout)"
            )
        elif not queued and clock.queued_since is not None:
            waited = now - clock.queued_since
            clock.queued_s += waited
            clock.queued_since = None
            if clock.deadline is not None:
                clock.deadline += waited
            self.log(
                f"[gke] {self.name}: admitted after {waited:.0f}s in the queue "
                f"({clock.queued_s:.0f}s queued in all)"
            )
        return queued

    def _log_restarts(self, pods: list[Any], clock: _WaitClock) -> None:
        attempt = restart_attempt(pods)
        if attempt > clock.restarts:
            clock.restarts = attempt
            problems = summarize(self.diagnose(pods)) or "no pod reason reported"
            self.log(f"[gke] {self.name}: every node restarted (attempt {attempt}): {problems}")

    def _verdict(
        self,
        job: Mapping[str, Any],
        phase: str,
        reason: str,
        text: str,
        pods: list[Any],
        clock: _WaitClock,
    ) -> tuple[str, str] | None:
        """(status, message) once the run has ended or must be stopped; None to keep waiting.
        Every way of stopping it here deletes the job first."""
        assert self.launch is not None
        kind, nodes = self._flavor(), self.launch.nodes
        if phase == "Failed":
            problems = self.diagnose(pods)
            message = f"{kind.kind} {self.name} failed: {reason}: {text}".rstrip(": ")
            # Failed jobs may keep pods (cleanPodPolicy None; a JobSet until its TTL), running or
            # crash-looping ones holding GPUs: delete the job (its pods were diagnosed above).
            self.jobs.delete(self.name)
            return FAILED, message + (f"; {summarize(problems)}" if problems else "")
        if phase == "Queued":
            return self._queue_verdict(clock)
        if kind.succeeded(job, pods, nodes):
            return SUCCEEDED, f"all {nodes} workers succeeded"
        message = self._problem(phase, pods, clock)
        if not message and clock.deadline is not None and time.monotonic() > clock.deadline:
            message = f"timed out after {clock.timeout:.0f}s; deleted {kind.kind} {self.name}"
        if message:
            self.jobs.delete(self.name)
            return FAILED, message
        return (CANCELLED, "cancelled") if self._cancelled else None

    def _queue_verdict(self, clock: _WaitClock) -> tuple[str, str] | None:
        clock.podless_since = None  # no pods are expected while queued
        if self._cancelled:
            return CANCELLED, "cancelled"
        reason = self._queue_reason()
        if reason and reason != clock.queue_reason:
            clock.queue_reason = reason
            self.log(f"[gke] {self.name}: Kueue: {reason}")
        limit = self.queue_timeout_s
        if limit is not None and clock.queued(time.monotonic()) >= limit:
            self.jobs.delete(self.name)
            queue = self.job_options.kueue_queue or "(none named)"
            why = clock.queue_reason or "its ClusterQueue's quota, or a job ahead of it"
            return FAILED, (
                f"{self._flavor().kind} {self.name} was not admitted by Kueue queue {queue} "
                f"within {limit:.0f}s ({why}); deleted"
            )
        return None

    def _queue_reason(self) -> str:
        """What Kueue last said of the job's Workload (quota, a job ahead), from its events;
        best effort: "" when they cannot be read."""
        from kubernetes.client.exceptions import ApiException

        try:
            events = self.core.list_namespaced_event(
                self.namespace, field_selector="involvedObject.kind=Workload"
            ).items
        except ApiException:
            return ""
        return kueue_workload_reason(events, self._flavor().kind, self.name)

    def _problem(self, phase: str, pods: list[Any], clock: _WaitClock) -> str:
        """Why the job must be stopped now ("" to keep waiting): a pod that cannot run, one
        unschedulable too long, no pods at all too long, or workers that never finish after an
        early Succeeded."""
        problems = [p for pod in pods for p in pod_problems(pod)]
        message = self._podless(pods, clock)
        if phase == "Succeeded":
            message = self._succeeded_early(pods, problems, clock)
        fatal = [p for p in problems if p.fatal]
        if not message and fatal:
            message = f"{self._flavor().kind} {self.name} cannot run: {summarize(fatal)}"
        unschedulable = [p for p in problems if p.reason == "Unschedulable"]
        if not unschedulable:
            clock.pending_since = None
        elif not message:
            clock.pending_since = clock.pending_since or time.monotonic()
            if time.monotonic() - clock.pending_since > self.pending_timeout_s:
                events = event_problems(self._events(pods))
                message = (
                    f"{self._flavor().kind} {self.name} unschedulable for over "
                    f"{self.pending_timeout_s:.0f}s: {summarize(unschedulable + events)}"
                )
        return message

    def _podless(self, pods: list[Any], clock: _WaitClock) -> str:
        """A job that has had no pods for `pending_timeout_s` while not queued: its controller
        cannot create them (a JobSet or Job refused: PodSecurity, a ResourceQuota, a webhook).
        The TrainJob says so only in events (trainer v2.3.0 trainjob_controller.go,
        TrainJobResourcesCreationFailed), the Job in its FailedCreate events, never a condition."""
        if pods:
            clock.podless_since = None
            return ""
        clock.podless_since = clock.podless_since or time.monotonic()
        if time.monotonic() - clock.podless_since <= self.pending_timeout_s:
            return ""
        why = []
        for name in self._flavor().owned_names(self.name):
            why += [
                f"{e.involved_object.kind} {name}: {e.reason}: {e.message}"
                for e in self.core.list_namespaced_event(
                    self.namespace, field_selector=f"involvedObject.name={name}"
                ).items
                if e.type == "Warning"
            ]
        return (
            f"{self._flavor().kind} {self.name} has had no pods for over "
            f"{self.pending_timeout_s:.0f}s: {'; '.join(dict.fromkeys(why)) or 'no event says why'}"
        )

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
            f"{self._flavor().kind} {self.name} is marked Succeeded but {what}; "
            f"{summarize(self.diagnose(pods))}"
        )

    # ---- cancel and cleanup -------------------------------------------------------------------

    def cancel(self) -> None:
        self._cancelled = True
        if self.name and self.jobs.delete(self.name):
            self.log(f"[gke] deleted {self._flavor().kind} {self.namespace}/{self.name}")

    def cleanup(self, run_id: str) -> list[str]:
        """Delete the run's jobs of either API (by label; an API the cluster does not serve has
        none) and its etcd objects; 404s are ignored."""
        from kubernetes.client.exceptions import ApiException

        removed: list[str] = []
        apis = [self._flavor()] if self.job_api in FLAVORS else list(FLAVORS.values())
        for kind in apis:
            jobs = kind.api_class(self.custom, self.namespace, log=self.log)
            try:
                items = jobs.list(k8s_selector(run_id))
            except ApiException as exc:
                if exc.status != 404:  # 404: this API is not served here
                    raise
                items = []
            for item in items:
                name = item["metadata"]["name"]
                if jobs.delete(name, item["metadata"].get("namespace")):
                    removed.append(f"{kind.kind} {self.namespace}/{name}")
        etcd = delete_etcd(self.api_client, run_id=run_id, namespace=self.namespace)  # by label
        removed += [f"etcd {obj}" for obj in etcd]
        return removed


def _pods_phase(pods: list[Any]) -> str:
    """Running once any pod runs (a TrainJob has no Running condition), else Pending."""
    return "Running" if any(p.status and p.status.phase == "Running" for p in pods) else ""
