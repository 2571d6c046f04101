"""GKE launcher: its API conversation, answered from canned API responses at the HTTP boundary of
a real kubernetes ApiClient (tests/fakes/k8s_api.py). The manifest itself: test_pytorchjob_manifest.py."""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from fakes.k8s_api import fake_kube
from fakes.recording import Recorded

from components.launchers import TrainLaunch
from components.launchers.gke import GkeLauncher, GkeOptions
from components.launchers.pytorchjob import PyTorchJobOptions, job_name
from components.runtime.run_identity import K8S_RUN_LABEL
from trainer.config import TrainConfig

RUN = "fine-tune-20261202-abc"
JOBS = "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs"
NAME = job_name(RUN)


# ---- the launcher against canned API responses ---------------------------------------------------


SERVICE_ACCOUNT = {
    "metadata": {
        "name": "default",
        "annotations": {"iam.gke.io/gcp-service-account": "llmft@p.iam.gserviceaccount.com"},
    }
}


def job_status(
    condition: str | None, reason: str = "", message: str = "", worker: dict | None = None
) -> dict[str, Any]:
    conditions = [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"}]
    if condition:
        conditions.append(
            {"type": condition, "status": "True", "reason": reason, "message": message}
        )
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": NAME, "namespace": "ml", "labels": {K8S_RUN_LABEL: RUN}},
        "status": {"conditions": conditions, "replicaStatuses": {"Worker": worker or {}}},
    }


def pod(
    index: int,
    phase: str,
    *,
    waiting: str | None = None,
    terminated: tuple[str, int] | None = None,
    last_terminated: tuple[str, int] | None = None,
    unschedulable: str | None = None,
    restarts: int = 0,
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-12-02T10:00:00Z"}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": f"{waiting} details"}}
    if terminated:
        state = {"terminated": {"reason": terminated[0], "exitCode": terminated[1]}}
    container = {
        "name": "pytorch",
        "image": "img",
        "imageID": "",
        "ready": phase == "Running",
        "restartCount": restarts,
        "state": state,
    }
    if last_terminated:
        container["lastState"] = {
            "terminated": {"reason": last_terminated[0], "exitCode": last_terminated[1]}
        }
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [container]}
    if unschedulable:
        status = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": unschedulable,
                }
            ],
        }
    return {
        "metadata": {
            "name": f"{NAME}-worker-{index}",
            "uid": f"uid-{index}",
            "labels": {
                "training.kubeflow.org/replica-index": str(index),
                "training.kubeflow.org/job-name": NAME,
            },
        },
        "status": status,
    }


def pods(*items: dict) -> tuple[int, dict]:
    return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(items)}


def events(*items: tuple[str, str, str]) -> tuple[int, dict]:
    return 200, {
        "kind": "EventList",
        "apiVersion": "v1",
        "metadata": {},
        "items": [
            {
                "metadata": {"name": f"e{i}"},
                "type": "Warning",
                "reason": reason,
                "message": msg,
                "involvedObject": {"kind": "Pod", "name": obj},
            }
            for i, (obj, reason, msg) in enumerate(items)
        ],
    }


def watched(r: Any, *replies: Any) -> None:
    """Serve the job to the launcher's list-then-watch: each request (the list, then every watch,
    resumed from the last resourceVersion) gets the next reply, as a list or as one MODIFIED
    event (the last reply repeats)."""
    queue = list(replies)
    served = {"n": 0}

    def answer(req: Recorded) -> tuple[int, Any]:
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        status, job = reply(req) if callable(reply) else reply
        served["n"] += 1
        job = {**job, "metadata": {**job["metadata"], "resourceVersion": str(served["n"])}}
        if req.query.get("watch") == "True":
            return status, (json.dumps({"type": "MODIFIED", "object": job}) + "\n").encode()
        version = {"resourceVersion": str(served["n"])}
        return status, {"kind": "PyTorchJobList", "metadata": version, "items": [job]}

    r.on("GET", JOBS, answer)


ETCD = f"/apis/apps/v1/namespaces/ml/statefulsets/llmft-etcd-{RUN}"


class RunEtcd:
    """The run's etcd StatefulSet as the API server keeps it: created, read, patched, and
    reported ready (its Service and NetworkPolicy are only created)."""

    def __init__(self, owner_kind: str | None = None) -> None:
        self.statefulset: dict[str, Any] | None = None
        if owner_kind:  # adopted by an earlier attempt's job (components/etcd/kubernetes.py)
            owner = {"apiVersion": "x/v1", "kind": owner_kind, "name": "old", "uid": "u-old"}
            self.statefulset = {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": f"llmft-etcd-{RUN}", "uid": "u-etcd",
                             "ownerReferences": [owner]},
            }  # fmt: skip

    def routes(self, r: Any) -> None:
        missing = (404, {"kind": "Status", "reason": "NotFound", "code": 404})
        r.on("GET", ETCD, lambda req: (200, self.statefulset) if self.statefulset else missing)
        r.on("PATCH", ETCD, self._patch)
        r.on("POST", "/apis/apps/v1/namespaces/ml/statefulsets", self._create)
        r.on("GET", f"{ETCD}/status", lambda req: (200, {**(self.statefulset or {}),
                                                         "status": {"replicas": 1, "readyReplicas": 1}}))  # fmt: skip
        r.on("POST", "/api/v1/namespaces/ml/services", lambda req: (201, req.body))
        r.on(
            "POST",
            "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies",
            lambda req: (201, req.body),
        )

    def _create(self, req: Recorded) -> tuple[int, dict]:
        if self.statefulset is not None:
            return 409, {"kind": "Status", "reason": "AlreadyExists", "code": 409}
        self.statefulset = {**req.body, "metadata": {**req.body["metadata"], "uid": "u-new"}}
        return 201, self.statefulset

    def _patch(self, req: Recorded) -> tuple[int, dict]:
        assert self.statefulset is not None
        metadata = {**self.statefulset["metadata"], **req.body["metadata"]}
        self.statefulset = {**self.statefulset, "metadata": metadata}
        return 200, self.statefulset


def launcher(
    router_setup: Any, etcd: RunEtcd | None = None, **kwargs: Any
) -> tuple[GkeLauncher, Any, list[str]]:
    api_client, router = fake_kube()
    router_setup(router)
    (etcd or RunEtcd()).routes(router)
    router.on("GET", "/api/v1/namespaces/ml/serviceaccounts/default", (200, SERVICE_ACCOUNT))
    lines: list[str] = []
    return (
        GkeLauncher(
            GkeOptions(
                job=PyTorchJobOptions(namespace="ml", accelerator="nvidia-l4"),
                job_api="pytorchjob",
                api_client=api_client,
                **kwargs,
            ),
            log=lines.append,
        ),
        router,
        lines,
    )


def small_launch() -> TrainLaunch:
    return TrainLaunch(
        run_id=RUN,
        trainer=TrainConfig(model="gs://b/m", data="gs://b/d", output="gs://b/o"),
        nodes=2,
        nproc_per_node=1,
        rdzv_backend="etcd-v3",
    )


def test_create_then_succeed_when_every_worker_succeeded(golden: Any) -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(
            r,
            (200, job_status(None)),
            (200, job_status("Running")),
            (200, job_status("Succeeded", worker={"succeeded": 1, "active": 1})),
            (200, job_status("Succeeded", worker={"succeeded": 2})),
        )
        r.on(
            "GET",
            "/api/v1/namespaces/ml/pods",
            pods(pod(0, "Pending"), pod(1, "Pending")),
            pods(pod(0, "Running"), pod(1, "Running")),
            pods(pod(0, "Running"), pod(1, "Succeeded")),
            pods(pod(0, "Succeeded"), pod(1, "Succeeded")),
        )
        r.on(
            "GET",
            f"/api/v1/namespaces/ml/pods/{NAME}-worker-0/log",
            (200, b"step 1 loss 2.0\nstep 2 loss 1.5\nexported model\n"),
        )

    gke, router, lines = launcher(setup)
    result = gke.run(small_launch(), timeout=30)
    assert result.ok, result.describe()
    assert result.message == "all 2 workers succeeded"
    [create] = router.sent("POST", JOBS)
    golden.check("gke_create_pytorchjob.json", create.body)
    [pod_list, *_] = router.sent("GET", "/api/v1/namespaces/ml/pods")
    assert pod_list.query["labelSelector"] == f"training.kubeflow.org/job-name={NAME}"
    # The job was "Succeeded" while worker 0 still ran: we waited for it, following the job with
    # one list and then watches, each resumed from the last resourceVersion.
    [listing, *watches] = router.sent("GET", JOBS)
    assert (
        listing.query["fieldSelector"] == f"metadata.name={NAME}" and "watch" not in listing.query
    )
    assert watches and [w.query["resourceVersion"] for w in watches] == [
        str(n) for n in range(1, len(watches) + 1)
    ]
    assert all(w.query["watch"] == "True" for w in watches)
    [log_request] = router.sent("GET", f"/api/v1/namespaces/ml/pods/{NAME}-worker-0/log")
    assert log_request.query == {"container": "pytorch", "follow": "True"}
    assert f"[{NAME}-worker-0] exported model" in lines
    assert not router.sent("DELETE", f"{JOBS}/{NAME}")


@pytest.mark.parametrize(
    ("pods_reply", "events_reply", "expected"),
    [
        (
            pods(pod(0, "Failed", terminated=("OOMKilled", 137)), pod(1, "Running")),
            events(),
            ["BackoffLimitExceeded", "OOMKilled", "exited with code 137", "out of memory"],
        ),
        (
            pods(pod(0, "Running", last_terminated=("Error", 1), restarts=3), pod(1, "Running")),
            events((f"{NAME}-worker-0", "BackOff", "Back-off restarting failed container")),
            ["exited with code 1", "Back-off restarting failed container"],
        ),
    ],
)
def test_failed_job_reports_pod_reasons(
    pods_reply: Any, events_reply: Any, expected: list[str]
) -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(
            r,
            (
                200,
                job_status(
                    "Failed",
                    "BackoffLimitExceeded",
                    "PyTorchJob has failed because it has reached the specified backoff limit",
                ),
            ),
        )
        r.on("GET", "/api/v1/namespaces/ml/pods", pods_reply)
        r.on("GET", "/api/v1/namespaces/ml/events", events_reply)
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {"kind": "Status", "status": "Success"}))

    gke, router, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    for text in expected:
        assert text in result.message
    # A Failed job keeps its pods (cleanPodPolicy None), running ones holding GPUs: deleted now.
    [delete] = router.sent("DELETE", f"{JOBS}/{NAME}")
    assert delete.body["propagationPolicy"] == "Background"
    assert (
        router.sent("GET", "/api/v1/namespaces/ml/events")[0].query["fieldSelector"]
        == f"involvedObject.name={NAME}-worker-0"
    )


def test_worker_only_job_marked_succeeded_with_a_failed_worker_is_a_failure() -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(
            r,
            (200, job_status("Succeeded", worker={"succeeded": 1, "failed": 1})),
        )
        r.on(
            "GET",
            "/api/v1/namespaces/ml/pods",
            pods(
                pod(0, "Succeeded", terminated=("Completed", 0)),
                pod(1, "Failed", terminated=("Error", 1)),
            ),
        )
        r.on("GET", "/api/v1/namespaces/ml/events", events())

    gke, _, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    assert f"worker pod(s) {NAME}-worker-1 failed" in result.message


@pytest.mark.parametrize(
    ("waiting", "hint"),
    [
        ("ImagePullBackOff", "cannot pull the image"),
        ("CreateContainerConfigError", "missing Secret"),
    ],
)
def test_fatal_pod_state_fails_fast_and_deletes_the_job(waiting: str, hint: str) -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, (200, job_status(None)))
        r.on(
            "GET",
            "/api/v1/namespaces/ml/pods",
            pods(pod(0, "Pending", waiting=waiting), pod(1, "Pending")),
        )
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {"kind": "Status", "status": "Success"}))

    gke, router, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    assert waiting in result.message and hint in result.message
    [delete] = router.sent("DELETE", f"{JOBS}/{NAME}")
    assert delete.body["propagationPolicy"] == "Background"


def test_unschedulable_for_too_long_fails_with_the_scheduler_message() -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, (200, job_status(None)))
        r.on(
            "GET",
            "/api/v1/namespaces/ml/pods",
            pods(
                pod(
                    0,
                    "Pending",
                    unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                ),
                pod(
                    1,
                    "Pending",
                    unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                ),
            ),
        )
        r.on(
            "GET",
            "/api/v1/namespaces/ml/events",
            events(
                (
                    f"{NAME}-worker-0",
                    "NotTriggerScaleUp",
                    "pod didn't trigger scale-up: 1 max node group size reached",
                )
            ),
        )
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False, pending_timeout_s=0.05)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    assert "unschedulable for over" in result.message
    assert (
        "Insufficient nvidia.com/gpu" in result.message and "max node group size" in result.message
    )
    assert router.sent("DELETE", f"{JOBS}/{NAME}")


def test_create_is_idempotent_and_replaces_a_failed_job() -> None:
    conflict = (409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})

    def running(r: Any) -> None:
        r.on("POST", JOBS, conflict)
        r.on("GET", f"{JOBS}/{NAME}", (200, job_status("Running")))

    gke, router, lines = launcher(running)
    gke.start(small_launch())
    assert len(router.sent("POST", JOBS)) == 1 and not router.sent("DELETE", f"{JOBS}/{NAME}")
    assert any("already exists (Running): following it" in line for line in lines)

    def failed(r: Any) -> None:
        r.on("POST", JOBS, conflict, conflict, lambda req: (201, req.body))
        r.on("GET", f"{JOBS}/{NAME}", (200, job_status("Failed", "BackoffLimitExceeded")))
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(failed)
    gke.start(small_launch())
    assert len(router.sent("DELETE", f"{JOBS}/{NAME}")) == 1
    assert len(router.sent("POST", JOBS)) == 3  # conflict, conflict while deleting, created


def test_a_retried_train_finds_its_etcd_after_the_job_took_it_along() -> None:
    """Review P2: the job adopted the run's etcd, and deleting the job (a Failed or timed-out job,
    the replace below, a SIGTERM) garbage-collects it, while only the etcd_up step creates it.
    The retried start drops the job's ownership before the replace deletes the job, recreates
    etcd when it is already gone, and waits for it before the job rendezvouses on it."""
    conflict = (409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})

    def failed(r: Any) -> None:
        r.on("POST", JOBS, conflict, conflict, lambda req: (201, req.body))
        r.on("GET", f"{JOBS}/{NAME}", (200, job_status("Failed", "BackoffLimitExceeded")))
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    etcd = RunEtcd(owner_kind="PyTorchJob")
    gke, router, _ = launcher(failed, etcd)
    gke.start(small_launch())
    [release] = router.sent("PATCH", ETCD)
    assert release.body == {"metadata": {"ownerReferences": None}}
    order = [(q.method, q.path) for q in router.requests]
    assert order.index(("PATCH", ETCD)) < order.index(("DELETE", f"{JOBS}/{NAME}"))
    assert etcd.statefulset is not None and not etcd.statefulset["metadata"].get("ownerReferences")
    assert router.sent("GET", f"{ETCD}/status")

    gone = RunEtcd()  # the garbage collector already removed it with the deleted job
    gke, router, _ = launcher(lambda r: r.on("POST", JOBS, lambda req: (201, req.body)), gone)
    gke.start(small_launch())
    [created] = router.sent("POST", "/apis/apps/v1/namespaces/ml/statefulsets")
    assert created.body["metadata"]["name"] == f"llmft-etcd-{RUN}"
    assert router.sent("POST", "/api/v1/namespaces/ml/services")
    order = [(q.method, q.path) for q in router.requests]
    assert order.index(("GET", f"{ETCD}/status")) < order.index(("POST", JOBS))

    workflow = RunEtcd(owner_kind="Workflow")  # KFP's run owns it: nothing to release
    gke, router, _ = launcher(lambda r: r.on("POST", JOBS, lambda req: (201, req.body)), workflow)
    gke.start(small_launch())
    assert not router.sent("PATCH", ETCD)


def test_sigterm_deletes_the_job() -> None:
    calls = {"n": 0}

    def status(req: Recorded) -> tuple[int, dict]:
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # what KFP does when the run is cancelled
        return 200, job_status("Running")

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, status)
        r.on("GET", "/api/v1/namespaces/ml/pods", pods(pod(0, "Pending"), pod(1, "Pending")))
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "cancelled" and "SIGTERM" in result.message
    assert len(router.sent("DELETE", f"{JOBS}/{NAME}")) == 1


def test_cleanup_deletes_by_label_and_ignores_what_is_gone() -> None:
    def setup(r: Any) -> None:
        r.on(
            "GET",
            JOBS,
            (
                200,
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJobList",
                    "items": [
                        {"metadata": {"name": NAME, "namespace": "ml"}},
                        {"metadata": {"name": f"{NAME}-old", "namespace": "ml"}},
                    ],
                },
            ),
        )
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))
        r.on(
            "DELETE",
            f"{JOBS}/{NAME}-old",
            (404, {"kind": "Status", "reason": "NotFound", "code": 404}),
        )
        r.on(
            "GET",
            "/apis/apps/v1/namespaces/ml/statefulsets",
            (
                200,
                {
                    "kind": "StatefulSetList",
                    "apiVersion": "apps/v1",
                    "metadata": {},
                    "items": [
                        {
                            "metadata": {"name": f"llmft-etcd-{RUN}"},
                            "spec": {"selector": {}, "serviceName": "x", "template": {}},
                        }
                    ],
                },
            ),
        )
        r.on("DELETE", f"/apis/apps/v1/namespaces/ml/statefulsets/llmft-etcd-{RUN}", (200, {}))
        r.on(
            "GET",
            "/api/v1/namespaces/ml/services",
            (200, {"kind": "ServiceList", "apiVersion": "v1", "metadata": {}, "items": []}),
        )
        r.on(
            "GET",
            "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies",
            (200, {"kind": "NetworkPolicyList", "metadata": {}, "items": []}),
        )
        r.on(
            "GET",
            "/api/v1/namespaces/ml/persistentvolumeclaims",
            (
                200,
                {
                    "kind": "PersistentVolumeClaimList",
                    "apiVersion": "v1",
                    "metadata": {},
                    "items": [],
                },
            ),
        )

    gke, router, _ = launcher(setup)
    removed = gke.cleanup(RUN)
    assert removed == [f"PyTorchJob ml/{NAME}", f"etcd StatefulSet/llmft-etcd-{RUN}"]
    [listing] = router.sent("GET", JOBS)
    assert listing.query["labelSelector"] == f"{K8S_RUN_LABEL}={RUN}"
    [etcd_listing] = router.sent("GET", "/apis/apps/v1/namespaces/ml/statefulsets")
    assert etcd_listing.query["labelSelector"].startswith(f"{K8S_RUN_LABEL}={RUN}")


def test_remote_gke_client_from_cluster_endpoint_and_token() -> None:
    from google.cloud import container_v1

    from components.runtime.k8s_client import make_api_client

    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

    class Manager:
        def __init__(self) -> None:
            self.requests: list[Any] = []

        def get_cluster(self, request: container_v1.GetClusterRequest) -> container_v1.Cluster:
            self.requests.append(request)
            return container_v1.Cluster(
                name="c",
                endpoint="34.1.2.3",
                master_auth=container_v1.MasterAuth(
                    cluster_ca_certificate=base64.b64encode(ca).decode()
                ),
            )

    class Credentials:
        valid, token, refreshed = False, None, 0

        def refresh(self, request: Any) -> None:
            self.refreshed += 1
            self.token, self.valid = f"token-{self.refreshed}", True

    credentials, manager = Credentials(), Manager()
    cluster = "projects/p/locations/us-central1/clusters/c"
    api_client = make_api_client(cluster=cluster, credentials=credentials, cluster_manager=manager)
    config = api_client.configuration
    assert manager.requests == [container_v1.GetClusterRequest(name=cluster)]
    assert config.host == "https://34.1.2.3"
    assert Path(config.ssl_ca_cert).read_bytes() == ca
    assert config.get_api_key_with_prefix("authorization") == "Bearer token-1"
    credentials.valid = False  # expired: the next request refreshes it
    assert config.get_api_key_with_prefix("authorization") == "Bearer token-2"
    with pytest.raises(ValueError, match="projects/PROJECT/locations"):
        make_api_client(cluster="my-cluster", credentials=credentials, cluster_manager=manager)


def test_succeeded_job_with_a_crash_looping_worker_fails_instead_of_hanging() -> None:
    """Elastic Worker-only jobs are Succeeded when any worker is; a worker restarting after
    errors (OnFailure keeps its pod Running) must not keep the step waiting forever."""

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, (200, job_status("Succeeded", worker={"succeeded": 1, "active": 1})))
        r.on(
            "GET",
            "/api/v1/namespaces/ml/pods",
            pods(
                pod(0, "Succeeded", terminated=("Completed", 0)),
                pod(
                    1,
                    "Running",
                    waiting="CrashLoopBackOff",
                    last_terminated=("Error", 1),
                    restarts=4,
                ),
            ),
        )
        r.on("GET", "/api/v1/namespaces/ml/events", events())
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, router, _ = launcher(setup, follow_logs=False, succeeded_grace_s=3600)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed"
    assert f"worker pod(s) {NAME}-worker-1 did not finish (failing)" in result.message
    assert "exited with code 1" in result.message
    assert router.sent("DELETE", f"{JOBS}/{NAME}")


def test_succeeded_job_with_a_worker_that_never_finishes_fails_after_the_grace() -> None:
    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(r, (200, job_status("Succeeded", worker={"succeeded": 1, "active": 1})))
        r.on(
            "GET",
            "/api/v1/namespaces/ml/pods",
            pods(pod(0, "Succeeded", terminated=("Completed", 0)), pod(1, "Running")),
        )
        r.on("GET", "/api/v1/namespaces/ml/events", events())
        r.on("DELETE", f"{JOBS}/{NAME}", (200, {}))

    gke, _, _ = launcher(setup, follow_logs=False, succeeded_grace_s=0.0)
    result = gke.run(small_launch(), timeout=30)
    assert result.status == "failed" and "did not finish within 0s" in result.message


def test_an_expired_watch_lists_again() -> None:
    """410 Gone: the resourceVersion is too old to resume from; list, then watch from the new one."""
    gone = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
    }
    calls = {"n": 0}

    def answer(req: Recorded) -> tuple[int, Any]:
        calls["n"] += 1
        done = job_status("Succeeded", worker={"succeeded": 2})
        running = job_status("Running")
        if req.query.get("watch") == "True":
            if calls["n"] == 2:
                return 200, (json.dumps(gone) + "\n").encode()
            job = {**done, "metadata": {**done["metadata"], "resourceVersion": "20"}}
            return 200, (json.dumps({"type": "MODIFIED", "object": job}) + "\n").encode()
        version = "5" if calls["n"] == 1 else "10"
        return 200, {"metadata": {"resourceVersion": version}, "items": [running]}

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        r.on("GET", JOBS, answer)
        r.on(
            "GET",
            "/api/v1/namespaces/ml/pods",
            pods(pod(0, "Running"), pod(1, "Running")),
            pods(pod(0, "Running"), pod(1, "Running")),
            pods(pod(0, "Succeeded"), pod(1, "Succeeded")),
        )

    gke, router, _ = launcher(setup, follow_logs=False)
    assert gke.run(small_launch(), timeout=30).ok
    requests = router.sent("GET", JOBS)
    shape = [(r.query.get("watch"), r.query.get("resourceVersion")) for r in requests]
    assert shape[:4] == [(None, None), ("True", "5"), (None, None), ("True", "10")]


def test_a_missing_service_account_is_a_clear_error_before_anything_starts() -> None:
    api_client, router = fake_kube()
    router.on("POST", JOBS, lambda req: (201, req.body))
    job = PyTorchJobOptions(
        namespace="ml", accelerator="nvidia-l4", service_account="llmft-pipeline"
    )
    gke = GkeLauncher(
        GkeOptions(job=job, job_api="pytorchjob", api_client=api_client), log=lambda line: None
    )
    with pytest.raises(ValueError, match="service account ml/llmft-pipeline does not exist"):
        gke.start(small_launch())
    assert router.sent("POST", JOBS) == []


def test_a_pytorchjob_in_a_kueue_queue_waits_suspended_then_runs() -> None:
    """Issue 47: with kueue_queue the PyTorchJob is created suspended and labelled for the queue;
    while Kueue keeps `runPolicy.suspend` no pod is looked for and the wait is `queued_s`."""

    def suspended(condition: str | None, suspend: bool, **kwargs: Any) -> dict[str, Any]:
        job = job_status(condition, **kwargs)
        return {**job, "spec": {"runPolicy": {"suspend": suspend}}}

    def setup(r: Any) -> None:
        r.on("POST", JOBS, lambda req: (201, req.body))
        watched(
            r,
            (200, suspended("Suspended", True)),
            (200, suspended("Running", False)),
            (200, suspended("Succeeded", False, worker={"succeeded": 2})),
        )
        r.on("GET", "/api/v1/namespaces/ml/pods", pods(pod(0, "Succeeded"), pod(1, "Succeeded")))

    api_client, router = fake_kube()
    setup(router)
    RunEtcd().routes(router)
    router.on("GET", "/api/v1/namespaces/ml/serviceaccounts/default", (200, SERVICE_ACCOUNT))
    lines: list[str] = []
    job = PyTorchJobOptions(namespace="ml", accelerator="nvidia-l4", kueue_queue="llmft")
    gke = GkeLauncher(
        GkeOptions(job=job, job_api="pytorchjob", api_client=api_client, follow_logs=False),
        log=lines.append,
    )
    result = gke.run(small_launch(), timeout=30)
    assert result.ok, result.describe()
    [create] = router.sent("POST", JOBS)
    assert create.body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "llmft"
    assert create.body["spec"]["runPolicy"]["suspend"] is True
    assert any("waiting in Kueue queue llmft" in line for line in lines)
    assert any("admitted after" in line for line in lines)
    assert result.details["queued_s"] >= 0
    # The list (suspended) asked for no pods: the first pod listing follows the first watch.
    order = [(q.method, q.path, q.query.get("watch")) for q in router.requests]
    first_pods = order.index(("GET", "/api/v1/namespaces/ml/pods", None))
    assert order.index(("GET", JOBS, "True")) < first_pods
