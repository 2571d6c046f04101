"""The GKE launcher on Kubeflow Trainer v2: its API conversation with a TrainJob cluster, answered
from canned responses at the HTTP boundary of a real kubernetes ApiClient (tests/fakes/k8s_api.py),
and `gke_job_api=auto` on v1-only, v2-only, both and neither clusters.

The conversation of a whole successful run is held against tests/golden/gke_trainjob_requests.json,
written by hand from the sources it cites (tests/golden/README.md), not produced by this code.
The manifest itself: test_trainjob_manifest.py."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
from fakes.k8s_api import fake_kube
from fakes.recording import Recorded
from test_launcher_gke import ETCD, SERVICE_ACCOUNT, RunEtcd, events

from components.launchers import TrainLaunch
from components.launchers.gke import GkeLauncher, GkeOptions
from components.launchers.pytorchjob import PyTorchJobOptions
from components.launchers.trainjob import trainjob_name
from components.launchers.trainjob_api import resolve_job_api
from components.runtime.run_identity import K8S_RUN_LABEL
from trainer.config import TrainConfig

RUN = "fine-tune-20261202-abc"
NAME = trainjob_name(RUN)
JOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs"
V1_JOBS = "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs"
PODS = "/api/v1/namespaces/ml/pods"
V2_DISCOVERY = "/apis/trainer.kubeflow.org/v1alpha1"
V1_DISCOVERY = "/apis/kubeflow.org/v1"
CREATED = "2026-12-07T10:00:00Z"


def resources(group_version: str, plural: str, kind: str) -> tuple[int, dict]:
    """A discovery document (APIResourceList) serving one namespaced resource."""
    return 200, {
        "kind": "APIResourceList",
        "groupVersion": group_version,
        "resources": [
            {"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind,
             "verbs": ["create", "delete", "get", "list", "watch"]},
        ],
    }  # fmt: skip


def serves(r: Any, *apis: str) -> None:
    """Discovery answers for a cluster serving `apis` (trainjob, pytorchjob); 404 for the rest."""
    if "trainjob" in apis:
        r.on(
            "GET", V2_DISCOVERY, resources("trainer.kubeflow.org/v1alpha1", "trainjobs", "TrainJob")
        )
    if "pytorchjob" in apis:
        r.on("GET", V1_DISCOVERY, resources("kubeflow.org/v1", "pytorchjobs", "PyTorchJob"))


def condition(kind: str, status: str = "True", reason: str = "", message: str = "",
              at: str = "2026-12-07T11:00:00Z") -> dict[str, str]:  # fmt: skip
    return {"type": kind, "status": status, "reason": reason or kind, "message": message,
            "lastTransitionTime": at}  # fmt: skip


def trainjob(*conditions: dict, suspend: bool = False, jobs: list | None = None) -> dict[str, Any]:
    """A TrainJob as the v2 controller reports it (trainjob_controller.go, jobset.go Status)."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": NAME, "namespace": "ml", "uid": "tj-uid",
                     "creationTimestamp": CREATED, "labels": {K8S_RUN_LABEL: RUN}},
        "spec": {"suspend": suspend},
        "status": {"conditions": list(conditions), "jobsStatus": jobs or []},
    }  # fmt: skip


def node(index: int, phase: str, *, attempt: int = 0, terminated: tuple[str, int] | None = None,
         waiting: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A node pod as JobSet creates it (its labels: jobset-name, completion index, attempt)."""
    state: dict[str, Any] = {"running": {"startedAt": "2026-12-07T10:05:00Z"}}
    if terminated:
        state = {"terminated": {"reason": terminated[0], "exitCode": terminated[1]}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": f"{waiting} details"}}
    return {
        "metadata": {
            "name": f"{NAME}-node-0-{index}-a{attempt}",
            "uid": f"uid-{index}-{attempt}",
            "labels": {"jobset.sigs.k8s.io/jobset-name": NAME,
                       "batch.kubernetes.io/job-completion-index": str(index),
                       "jobset.sigs.k8s.io/restart-attempt": str(attempt)},
        },
        "status": {"phase": phase, "containerStatuses": [
            {"name": "node", "image": "img", "imageID": "", "ready": phase == "Running",
             "restartCount": 0, "state": state}]},
    }  # fmt: skip


def pods(*items: dict) -> tuple[int, dict]:
    return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(items)}


def watched(r: Any, *replies: Any) -> None:
    """The job to the launcher's list-then-watch: each request gets the next reply (the last
    repeats), as the list or as one MODIFIED event, with increasing resourceVersions."""
    queue = list(replies)
    served = {"n": 0}

    def answer(req: Recorded) -> tuple[int, Any]:
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        job = reply(req) if callable(reply) else reply
        served["n"] += 1
        job = {**job, "metadata": {**job["metadata"], "resourceVersion": str(served["n"])}}
        if req.query.get("watch") == "True":
            return 200, (json.dumps({"type": "MODIFIED", "object": job}) + "\n").encode()
        version = {"resourceVersion": str(served["n"])}
        return 200, {"kind": "TrainJobList", "metadata": version, "items": [job]}

    r.on("GET", JOBS, answer)


def launcher(setup: Any, *, apis: tuple[str, ...] = ("trainjob",), etcd: RunEtcd | None = None,
             job: PyTorchJobOptions | None = None, **kwargs: Any) -> tuple[GkeLauncher, Any, list[str]]:  # fmt: skip
    api_client, router = fake_kube()
    serves(router, *apis)
    setup(router)
    (etcd or RunEtcd()).routes(router)
    router.on("GET", "/api/v1/namespaces/ml/serviceaccounts/default", (200, SERVICE_ACCOUNT))
    lines: list[str] = []
    options = job or PyTorchJobOptions(namespace="ml", accelerator="nvidia-l4", kueue_queue="llmft")
    gke = GkeLauncher(
        GkeOptions(job=options, job_api="auto", api_client=api_client, **kwargs), log=lines.append
    )
    return gke, router, lines


def small_launch() -> TrainLaunch:
    return TrainLaunch(
        run_id=RUN,
        trainer=TrainConfig(model="gs://b/m", data="gs://b/d", output="gs://b/o"),
        nodes=2,
        nproc_per_node=1,
        rdzv_backend="etcd-v3",
    )


def conversation(router: Any) -> list[str]:
    """Each request as `METHOD path ?query` (the queries that decide what is asked), but the
    pod log's: it streams from its own thread, whenever node 0 runs."""
    keys = ("labelSelector", "fieldSelector", "watch", "resourceVersion")
    lines = []
    for req in router.requests:
        if req.path.endswith("/log"):
            continue
        query = "&".join(f"{k}={req.query[k]}" for k in keys if k in req.query)
        lines.append(f"{req.method} {req.path}" + (f" ?{query}" if query else ""))
    return lines


def test_auto_on_a_v2_cluster_runs_a_queued_trainjob_to_success(golden: Any) -> None:
    """Queued in Kueue, admitted, both nodes run, Complete: every node succeeded."""

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, {**req.body, "metadata": {**req.body["metadata"],
                                                                      "uid": "tj-uid"}}))  # fmt: skip
        watched(
            r,
            trainjob(condition("Suspended"), suspend=True),
            trainjob(condition("Suspended", "False", "Resumed")),
            trainjob(condition("Suspended", "False", "Resumed")),
            trainjob(condition("Suspended", "False", "Resumed"), condition("Complete")),
        )
        r.on("GET", PODS, pods(node(0, "Pending"), node(1, "Pending")),
             pods(node(0, "Running"), node(1, "Running")),
             pods(node(0, "Succeeded", terminated=("Completed", 0)),
                  node(1, "Succeeded", terminated=("Completed", 0))))  # fmt: skip
        r.on("GET", f"{PODS}/{NAME}-node-0-0-a0/log", (200, b"step 1 loss 2.0\nexported model\n"))
        r.on("GET", "/api/v1/namespaces/ml/events", workload_events(
            (f"trainjob-{NAME}-a1b2c", "Pending", QUOTA)))  # fmt: skip

    gke, router, lines = launcher(setup)
    result = gke.run(small_launch(), timeout=30)
    assert result.ok, result.describe()
    assert result.message == "all 2 workers succeeded"
    assert result.details["api"] == "trainjob" and result.details["queued_s"] >= 0
    assert result.details["started_at"] == "2026-12-07T10:00:00+00:00"
    assert result.details["ended_at"] == "2026-12-07T11:00:00+00:00"
    golden.check("gke_trainjob_requests.json", conversation(router))
    [create] = router.sent("POST", JOBS)
    assert create.body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "llmft"
    assert create.body["spec"]["suspend"] is True
    [adopt] = router.sent("PATCH", ETCD)  # the run's etcd goes with the TrainJob
    assert adopt.body["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    assert any("the cluster serves TrainJob" in line for line in lines)
    assert any("waiting in Kueue queue llmft" in line for line in lines)
    assert f"[gke] {NAME}: Kueue: Pending: {QUOTA}" in lines
    assert any("admitted after" in line for line in lines)
    assert f"[{NAME}-node-0-0-a0] exported model" in lines
    [log] = router.sent("GET", f"{PODS}/{NAME}-node-0-0-a0/log")
    assert log.query == {"container": "node", "follow": "True"}
    assert not router.sent("DELETE", f"{JOBS}/{NAME}")


def test_one_node_failing_restarts_the_gang_then_fails_with_its_reason() -> None:
    """JobSet restarts every node when one fails (failurePolicy.maxRestarts); once the restarts
    are spent the TrainJob is Failed, and the step says which pod failed and why."""

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(
            r,
            trainjob(),
            trainjob(),
            trainjob(condition("Failed", reason="FailedJobs",
                               message="jobset failed: reached max restarts")),
        )  # fmt: skip
        r.on("GET", PODS, pods(node(0, "Running"), node(1, "Failed", terminated=("OOMKilled", 137))),
             pods(node(0, "Running", attempt=1),
                  node(1, "Failed", attempt=1, terminated=("OOMKilled", 137))))  # fmt: skip
        r.on("GET", "/api/v1/namespaces/ml/events", events())
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {"kind": "Status", "status": "Success"}))

    gke, router, lines = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    for text in ("TrainJob", "FailedJobs", "reached max restarts", "OOMKilled", "out of memory"):
        assert text in result.message, result.message
    assert any("every node restarted (attempt 1)" in line and "OOMKilled" in line
               for line in lines)  # fmt: skip
    [delete] = router.sent("DELETE", f"{JOBS}/{NAME}")
    assert delete.body["propagationPolicy"] == "Background"


def test_preempted_by_kueue_waits_again_and_resumes() -> None:
    """Kueue preempts by suspending the TrainJob (its pods go); re-admitted, it runs on (the
    trainer resumes from its checkpoint) and both waits count as queued, none as running."""

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(
            r,
            trainjob(condition("Suspended"), suspend=True),
            trainjob(condition("Suspended", "False", "Resumed")),
            trainjob(condition("Suspended"), suspend=True),  # preempted
            trainjob(condition("Suspended", "False", "Resumed")),
            trainjob(condition("Suspended", "False", "Resumed"), condition("Complete")),
        )
        r.on("GET", PODS, pods(node(0, "Running"), node(1, "Running")),
             pods(node(0, "Running"), node(1, "Running")),
             pods(node(0, "Succeeded"), node(1, "Succeeded")))  # fmt: skip

    gke, router, lines = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.ok, result.describe()
    waits = [line for line in lines if "waiting" in line and "Kueue queue" in line]
    assert len(waits) == 2 and "again (preempted)" in waits[1]
    assert sum("admitted after" in line for line in lines) == 2
    # No pod is listed while the job is suspended (it has none). The launcher saw 8 updates (the
    # list, then each watch window's event and, when the window ends quietly, the same state
    # again), 3 of them suspended: 5 pod listings.
    assert len(router.sent("GET", JOBS)) == 5 and len(router.sent("GET", PODS)) == 5
    assert not router.sent("DELETE", f"{JOBS}/{NAME}")


def test_the_deadline_fails_the_run_and_says_so() -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, trainjob(condition("Failed", reason="DeadlineExceeded",
                                      message="TrainJob exceeded its activeDeadlineSeconds")))  # fmt: skip
        r.on("GET", PODS, pods())
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed" and "DeadlineExceeded" in result.message
    assert router.sent("DELETE", f"{JOBS}/{NAME}")


def test_the_launchers_own_timeout_deletes_a_running_job() -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, trainjob())
        r.on("GET", PODS, pods(node(0, "Running"), node(1, "Running")))
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=0)
    assert result.status == "failed" and f"timed out after 0s; deleted TrainJob {NAME}" in (
        result.message
    )
    assert len(router.sent("DELETE", f"{JOBS}/{NAME}")) == 1


def workload_events(*items: tuple[str, str, str]) -> tuple[int, dict]:
    """Events Kueue's scheduler records on Workloads (name, reason, message)."""
    return 200, {
        "kind": "EventList", "apiVersion": "v1", "metadata": {},
        "items": [{"metadata": {"name": f"w{i}"}, "type": "Normal", "reason": reason,
                   "message": message, "involvedObject": {"kind": "Workload", "name": obj}}
                  for i, (obj, reason, message) in enumerate(items)],
    }  # fmt: skip


QUOTA = "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu"


def test_a_job_never_admitted_fails_after_the_queue_timeout_saying_why() -> None:
    """Kueue's reason (its event on the job's Workload, `trainjob-<name>-<hash>`) is in the
    step's log and the failure; another job's Workload is not mistaken for this one's."""

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, trainjob(condition("Suspended"), suspend=True))
        r.on("GET", "/api/v1/namespaces/ml/events", workload_events(
            (f"trainjob-{NAME}-a1b2c", "Pending", QUOTA),
            ("trainjob-someone-else-d3e4f", "Pending", "another job's reason"),
        ))  # fmt: skip
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, lines = launcher(setup, follow_logs=False, queue_timeout_s=0)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    assert "was not admitted by Kueue queue llmft within 0s" in result.message
    assert f"Pending: {QUOTA}" in result.message and "another job" not in result.message
    assert f"[gke] {NAME}: Kueue: Pending: {QUOTA}" in lines
    [events] = router.sent("GET", "/api/v1/namespaces/ml/events")
    assert events.query["fieldSelector"] == "involvedObject.kind=Workload"
    assert router.sent("DELETE", f"{JOBS}/{NAME}") and not router.sent("GET", PODS)


def test_sigterm_deletes_the_trainjob() -> None:
    calls = {"n": 0}

    def status(req: Recorded) -> dict:
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # what KFP does when the run is cancelled
        return trainjob()

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, status)
        r.on("GET", PODS, pods(node(0, "Pending"), node(1, "Pending")))
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "cancelled" and "SIGTERM" in result.message
    assert len(router.sent("DELETE", f"{JOBS}/{NAME}")) == 1


def test_a_retried_step_follows_the_job_its_first_attempt_created() -> None:
    """The create conflicts (409): the existing, still running TrainJob is followed to its end;
    no second job, nothing deleted."""
    conflict = (409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})

    def setup(r: Any) -> None:
        r.on("POST", JOBS, conflict)
        r.on("GET", f"{JOBS}/{NAME}", (200, trainjob(condition("Suspended", "False", "Resumed"))))
        watched(r, trainjob(), trainjob(condition("Complete")))
        r.on("GET", PODS, pods(node(0, "Running"), node(1, "Running")),
             pods(node(0, "Succeeded"), node(1, "Succeeded")))  # fmt: skip

    gke, router, lines = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.ok, result.describe()
    assert len(router.sent("POST", JOBS)) == 1 and not router.sent("DELETE", f"{JOBS}/{NAME}")
    assert any(f"TrainJob ml/{NAME} already exists" in line for line in lines)


def test_a_fatal_pod_state_fails_fast() -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, trainjob())
        r.on("GET", PODS, pods(node(0, "Pending", waiting="ImagePullBackOff"), node(1, "Pending")))
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed" and "cannot pull the image" in result.message
    assert router.sent("DELETE", f"{JOBS}/{NAME}")


# ---- gke_job_api=auto: which API a cluster serves ----------------------------------------------


@pytest.mark.parametrize(
    ("apis", "chosen"),
    [(("trainjob",), "trainjob"), (("pytorchjob",), "pytorchjob"),
     (("trainjob", "pytorchjob"), "trainjob")],
)  # fmt: skip
def test_auto_prefers_trainjob_and_falls_back_to_pytorchjob(apis: tuple, chosen: str) -> None:
    from kubernetes import client

    api_client, router = fake_kube()
    serves(router, *apis)
    assert resolve_job_api("auto", client.CustomObjectsApi(api_client)) == chosen
    assert [r.path for r in router.requests][:1] == [V2_DISCOVERY]


def test_auto_on_a_v1_only_cluster_creates_a_pytorchjob() -> None:
    def setup(r: Any) -> None:
        r.on("POST", V1_JOBS, lambda req: (201, req.body))

    gke, router, _ = launcher(setup, apis=("pytorchjob",))
    gke.start(small_launch())
    [create] = router.sent("POST", V1_JOBS)
    assert create.body["kind"] == "PyTorchJob"
    assert create.body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "llmft"
    assert not router.sent("POST", JOBS)


def test_auto_on_a_cluster_with_neither_names_what_to_install_before_anything_starts() -> None:
    gke, router, _ = launcher(lambda r: None, apis=())
    with pytest.raises(ValueError) as err:
        gke.start(small_launch())
    message = str(err.value)
    assert "gke_job_api=auto" in message and "install Kubeflow Trainer v2" in message
    assert "\n" not in message
    assert [r.method for r in router.requests] == ["GET", "GET"]  # discovery only


def test_a_named_api_the_cluster_lacks_points_at_the_one_it_has() -> None:
    from kubernetes import client

    api_client, router = fake_kube()
    serves(router, "pytorchjob")
    with pytest.raises(
        ValueError, match="install Kubeflow Trainer v2, or set gke_job_api=pytorchjob"
    ):
        resolve_job_api("trainjob", client.CustomObjectsApi(api_client))


def test_cleanup_deletes_the_runs_jobs_of_either_api_by_label() -> None:
    empty = (200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})

    def setup(r: Any) -> None:
        r.on("GET", JOBS, (200, {"kind": "TrainJobList", "items": [
            {"metadata": {"name": NAME, "namespace": "ml"}}]}))  # fmt: skip
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))
        # V1_JOBS is not served: its list answers 404, which means no such jobs.
        for path in (
            "/apis/apps/v1/namespaces/ml/statefulsets",
            "/api/v1/namespaces/ml/services",
            "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies",
            "/api/v1/namespaces/ml/persistentvolumeclaims",
        ):
            r.on("GET", path, empty)  # fmt: skip

    api_client, router = fake_kube()
    setup(router)
    gke = GkeLauncher(GkeOptions(job=PyTorchJobOptions(namespace="ml"), api_client=api_client))
    assert gke.cleanup(RUN) == [f"TrainJob ml/{NAME}"]
    for path in (JOBS, V1_JOBS):
        [listing] = router.sent("GET", path)
        assert listing.query["labelSelector"] == f"{K8S_RUN_LABEL}={RUN}"


def test_the_validate_steps_check_is_one_line_naming_what_to_install() -> None:
    from components.preflight.launch_checks import gke_job_api_errors

    api_client, router = fake_kube()
    [error] = gke_job_api_errors("auto", api_client=api_client)
    assert "install Kubeflow Trainer v2" in error and "Training Operator v1" in error
    serves(router, "trainjob")
    assert gke_job_api_errors("auto", api_client=api_client) == []
    assert "does not serve PyTorchJob" in gke_job_api_errors("pytorchjob", api_client=api_client)[0]


def test_a_gpudirect_job_is_a_trainjob_like_any_other() -> None:
    """The GPUDirect setup rides in a runtime variant (components/launchers/trainjob.py), so
    `auto` prefers TrainJob for a gpudirect job too and the validate step asks nothing more of
    the cluster."""
    from kubernetes import client

    from components.preflight.launch_checks import gke_job_api_errors

    api_client, router = fake_kube()
    serves(router, "trainjob", "pytorchjob")
    assert resolve_job_api("auto", client.CustomObjectsApi(api_client)) == "trainjob"
    only_v2, router = fake_kube()
    serves(router, "trainjob")
    assert gke_job_api_errors("trainjob", api_client=only_v2) == []


KUEUE_V1BETA2 = "/apis/kueue.x-k8s.io/v1beta2"
LOCAL_QUEUES = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/localqueues"


def test_the_validate_step_refuses_a_kueue_queue_the_namespace_does_not_have() -> None:
    """A job labelled for a missing LocalQueue (or on a cluster without Kueue) is created
    suspended and never admitted; Kueue says so only in its Workload's condition (kueue v0.19.2
    workload_controller.go "LocalQueue %s doesn't exist"), so the validate step asks first."""
    from components.preflight.launch_checks import gke_job_api_errors

    def check(queue: str) -> list[str]:
        return gke_job_api_errors("trainjob", api_client=api_client, kueue_queue=queue,
                                  namespace="ml")  # fmt: skip

    api_client, router = fake_kube()
    serves(router, "trainjob")
    assert check("") == []
    [no_kueue] = check("llmft")
    assert "does not serve Kueue" in no_kueue and "leave kueue_queue empty" in no_kueue
    router.on(
        "GET", KUEUE_V1BETA2, resources("kueue.x-k8s.io/v1beta2", "localqueues", "LocalQueue")
    )
    [missing] = check("lmft")
    assert "namespace ml has no LocalQueue lmft" in missing
    router.on("GET", f"{LOCAL_QUEUES}/llmft", (200, {"kind": "LocalQueue",
              "metadata": {"name": "llmft", "namespace": "ml"}, "spec": {"clusterQueue": "q"}}))  # fmt: skip
    assert check("llmft") == []
    assert [r.path for r in router.sent("GET", f"{LOCAL_QUEUES}/llmft")] == [
        f"{LOCAL_QUEUES}/llmft"
    ]


def test_a_trainjob_whose_pods_are_never_created_fails_with_its_childrens_events() -> None:
    """Admitted, but no pod ever appears (the Job controller is refused: here a ResourceQuota):
    the v2 controller reports no condition for it, so after `pending_timeout_s` the run fails
    with the Warning events of the TrainJob/JobSet (`<name>`) and its Job (`<name>-node-0`)."""
    said = {NAME: ("TrainJob", "TrainJobResourcesCreationFailed", "the JobSet was refused"),
            f"{NAME}-node-0": ("Job", "FailedCreate", "exceeded quota: pods")}  # fmt: skip

    def job_events(req: Recorded) -> tuple[int, dict]:
        name = req.query["fieldSelector"].removeprefix("involvedObject.name=")
        kind, reason, message = said[name]
        return 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": [
            {"metadata": {"name": "e"}, "type": "Warning", "reason": reason, "message": message,
             "involvedObject": {"kind": kind, "name": name}}]}  # fmt: skip

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, trainjob(condition("Suspended", "False", "Resumed")))
        r.on("GET", PODS, pods())
        r.on("GET", "/api/v1/namespaces/ml/events", job_events)
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False, pending_timeout_s=0)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    assert f"TrainJob {NAME} has had no pods for over 0s" in result.message
    assert f"Job {NAME}-node-0: FailedCreate: exceeded quota: pods" in result.message
    assert "TrainJobResourcesCreationFailed: the JobSet was refused" in result.message
    assert len(router.sent("DELETE", f"{JOBS}/{NAME}")) == 1
