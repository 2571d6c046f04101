"""The per-run etcd on Kubernetes: manifests against Kubernetes' schemas, API calls on the wire.

No cluster: the official `kubernetes` client talks to a tiny local HTTP server that records each
request and answers like the API server would (201, 409, 404, object lists, events). That checks
the exact requests the client library builds from our calls, not mocks of our own code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kubernetes_validate
import pytest
from fakes.k8s_api import KubeApiServer, Responder
from kubernetes import client

from components.etcd import kubernetes as k8s_etcd
from components.etcd import manifests as etcd_manifests
from components.runtime.run_identity import K8S_RUN_LABEL, safe_run_id

RUN_ID = "fine-tune-20261202-abc"
NS = "llmft"
K8S_VERSION = "1.30.0"


@pytest.fixture
def fake_api() -> Iterator[Callable[[Responder], KubeApiServer]]:
    servers: list[KubeApiServer] = []

    def make(respond: Responder) -> KubeApiServer:
        servers.append(KubeApiServer(respond))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def _status(code: int, reason: str) -> tuple[int, dict[str, Any]]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": reason,
    }


# -- manifests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"storage_class": "premium-rwo", "storage_size": "2Gi"}, {"tls_secret": "etcd-tls"}],
    ids=["emptydir", "ssd-pvc", "tls"],
)
def test_manifests_validate_against_kubernetes_schemas(
    options: dict[str, Any], golden: Any, request: pytest.FixtureRequest
) -> None:
    manifests = etcd_manifests.build_etcd_manifests(run_id=RUN_ID, namespace=NS, **options)
    assert [m["kind"] for m in manifests] == ["StatefulSet", "Service", "NetworkPolicy"]
    golden.check(f"etcd_manifests_{request.node.callspec.id}.json", manifests)
    for manifest in manifests:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        labels = manifest["metadata"]["labels"]
        assert labels[K8S_RUN_LABEL] == safe_run_id(RUN_ID)
        assert labels["app.kubernetes.io/component"] == "etcd"


def test_service_is_cluster_ip_only() -> None:
    service = etcd_manifests.build_etcd_service(run_id=RUN_ID, namespace=NS)
    assert service["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in service["spec"]["ports"]] == [2379]
    sts = etcd_manifests.build_etcd_statefulset(run_id=RUN_ID, namespace=NS)
    assert service["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]


def test_statefulset_pins_image_probes_health_and_sizes_resources() -> None:
    sts = etcd_manifests.build_etcd_statefulset(run_id=RUN_ID, namespace=NS, cpu="1", memory="1Gi")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "gcr.io/etcd-development/etcd:v3.5.17"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert pod["volumes"] == [{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}]
    assert "volumeClaimTemplates" not in sts["spec"]
    assert "--enable-v2=true" not in container["command"]
    assert (
        f"--advertise-client-urls=http://{etcd_manifests.etcd_endpoint(run_id=RUN_ID, namespace=NS)}"
        in container["command"]
    )
    with pytest.raises(ValueError, match="pinned"):
        etcd_manifests.build_etcd_statefulset(
            run_id=RUN_ID, namespace=NS, image="quay.io/coreos/etcd:latest"
        )


def test_ssd_storage_uses_pvc_deleted_with_the_statefulset() -> None:
    sts = etcd_manifests.build_etcd_statefulset(
        run_id=RUN_ID, namespace=NS, storage_class="premium-rwo"
    )
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "premium-rwo"
    assert claim["metadata"]["labels"][K8S_RUN_LABEL] == safe_run_id(RUN_ID)
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete",
        "whenScaled": "Delete",
    }
    assert sts["spec"]["template"]["spec"]["volumes"] == []


def test_tls_from_secret_requires_client_certificates() -> None:
    sts = etcd_manifests.build_etcd_statefulset(run_id=RUN_ID, namespace=NS, tls_secret="etcd-tls")
    pod = sts["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert "--client-cert-auth=true" in command
    assert "--listen-client-urls=https://0.0.0.0:2379" in command
    assert {"name": "tls", "secret": {"secretName": "etcd-tls", "defaultMode": 0o400}} in pod[
        "volumes"
    ]
    # Probes stay on the plain-HTTP metrics port, which needs no client certificate.
    assert "--listen-metrics-urls=http://0.0.0.0:2381" in command


# -- API --------------------------------------------------------------------------------------


WORKFLOW = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Workflow",
    "name": "run-x",
    "uid": "wf-1",
}


def _created(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    """The API server's answer to a create: the object with a uid."""
    return 201, {**body, "metadata": {**body["metadata"], "uid": f"uid-{body['kind']}"}}


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_create_posts_statefulset_then_owned_service_and_network_policy(
    fake_api: Callable[[Responder], KubeApiServer], golden: Any
) -> None:
    server = fake_api(_created)
    endpoint = k8s_etcd.create_etcd(
        server.api_client, run_id=RUN_ID, namespace=NS, owner=WORKFLOW, enable_v2=True
    )
    assert endpoint == f"llmft-etcd-{safe_run_id(RUN_ID)}.{NS}.svc.cluster.local:2379"
    assert [(r.method, r.path) for r in server.requests] == [
        ("POST", f"/apis/apps/v1/namespaces/{NS}/statefulsets"),
        ("POST", f"/api/v1/namespaces/{NS}/services"),
        ("POST", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"),
    ]
    bodies = [r.body for r in server.requests]
    golden.check("k8s_create_etcd_requests.json", bodies)
    # The StatefulSet belongs to the run's Workflow; the Service and the policy to the StatefulSet.
    sts, service, policy = bodies
    assert sts["metadata"]["ownerReferences"] == [WORKFLOW]
    by_sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "uid": "uid-StatefulSet"}
    for owned in (service, policy):
        assert owned["metadata"]["ownerReferences"] == [{**by_sts, "name": sts["metadata"]["name"]}]
    for manifest in (sts, service, policy):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_network_policy_admits_only_the_runs_pods() -> None:
    policy = etcd_manifests.build_etcd_network_policy(run_id=RUN_ID, namespace=NS)
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    sts = etcd_manifests.build_etcd_statefulset(run_id=RUN_ID, namespace=NS)
    assert policy["spec"]["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {K8S_RUN_LABEL: safe_run_id(RUN_ID)}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 2379}]
    # The PyTorchJob's pods carry the run label, so they are admitted.
    from components.launchers import TrainLaunch
    from components.launchers.pytorchjob import build_pytorchjob
    from trainer.config import TrainConfig

    trainer = TrainConfig(model="gs://b/m", data="gs://b/d", output="gs://b/o")
    job = build_pytorchjob(launch=TrainLaunch(run_id=RUN_ID, trainer=trainer))
    pod_labels = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_adopt_gives_an_ownerless_statefulset_to_the_training_job(
    fake_api: Callable[[Responder], KubeApiServer],
) -> None:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j", "uid": "job-1"}
    owners: list[Any] = []

    def respond(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET":
            meta = {"name": "x", **({"ownerReferences": owners} if owners else {})}
            return 200, {"kind": "StatefulSet", "apiVersion": "apps/v1", "metadata": meta}
        return 200, {"kind": "StatefulSet", "apiVersion": "apps/v1", "metadata": {"name": "x"}}

    server = fake_api(respond)
    assert k8s_etcd.adopt_etcd(server.api_client, run_id=RUN_ID, namespace=NS, owner=job)
    patch = server.requests[-1]
    assert patch.method == "PATCH" and patch.body == {"metadata": {"ownerReferences": [job]}}
    owners.append(WORKFLOW)  # owned by the run's Workflow already: left alone
    assert not k8s_etcd.adopt_etcd(server.api_client, run_id=RUN_ID, namespace=NS, owner=job)


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_create_reuses_existing_objects(fake_api: Callable[[Responder], KubeApiServer]) -> None:
    def respond(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET":  # the existing StatefulSet, read for its uid
            return 200, {"kind": "StatefulSet", "metadata": {"name": "x", "uid": "sts-1"}}
        return _status(409, "AlreadyExists")

    server = fake_api(respond)
    k8s_etcd.create_etcd(server.api_client, run_id=RUN_ID, namespace=NS)  # no exception
    assert [r.method for r in server.requests] == ["POST", "GET", "POST", "POST"]
    assert server.requests[2].body["metadata"]["ownerReferences"][0]["uid"] == "sts-1"


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_create_raises_other_errors(fake_api: Callable[[Responder], KubeApiServer]) -> None:
    server = fake_api(lambda method, path, body: _status(403, "Forbidden"))
    with pytest.raises(client.ApiException) as info:
        k8s_etcd.create_etcd(server.api_client, run_id=RUN_ID, namespace=NS)
    assert info.value.status == 403


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_wait_returns_when_ready(fake_api: Callable[[Responder], KubeApiServer]) -> None:
    polls = iter([0, 0, 1])

    def respond(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        return 200, {
            "kind": "StatefulSet",
            "apiVersion": "apps/v1",
            "metadata": {"name": "x"},
            "status": {"replicas": 1, "readyReplicas": next(polls)},
        }

    server = fake_api(respond)
    naps: list[float] = []
    k8s_etcd.wait_etcd_ready(server.api_client, run_id=RUN_ID, namespace=NS, sleep=naps.append)
    name = etcd_manifests.etcd_name(RUN_ID)
    assert [r.path for r in server.requests] == [
        f"/apis/apps/v1/namespaces/{NS}/statefulsets/{name}/status"
    ] * 3
    assert naps == [2.0, 2.0]


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_wait_timeout_reports_pod_state_and_events(
    fake_api: Callable[[Responder], KubeApiServer],
) -> None:
    pod_name = f"{etcd_manifests.etcd_name(RUN_ID)}-0"

    def respond(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if "/statefulsets/" in path:
            return 200, {"kind": "StatefulSet", "status": {"replicas": 1}}
        if path.startswith(f"/api/v1/namespaces/{NS}/pods"):
            return 200, {
                "kind": "PodList",
                "items": [
                    {
                        "metadata": {"name": pod_name},
                        "status": {
                            "phase": "Pending",
                            "containerStatuses": [
                                {
                                    "name": "etcd",
                                    "ready": False,
                                    "restartCount": 0,
                                    "image": "etcd",
                                    "imageID": "",
                                    "state": {
                                        "waiting": {
                                            "reason": "ImagePullBackOff",
                                            "message": "pull access denied",
                                        }
                                    },
                                }
                            ],
                        },
                    }
                ],
            }
        if path.startswith(f"/api/v1/namespaces/{NS}/events"):
            return 200, {
                "kind": "EventList",
                "items": [
                    {
                        "metadata": {"name": "e1"},
                        "involvedObject": {"name": pod_name},
                        "reason": "Failed",
                        "message": "Failed to pull image",
                    }
                ],
            }
        return _status(404, "NotFound")

    server = fake_api(respond)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(k8s_etcd.EtcdNotReadyError) as info:
        k8s_etcd.wait_etcd_ready(
            server.api_client,
            run_id=RUN_ID,
            namespace=NS,
            timeout_s=10,
            sleep=sleep,
            clock=lambda: now[0],
        )
    message = str(info.value)
    assert "ImagePullBackOff" in message and "Failed to pull image" in message
    assert "Pending" in message
    pod_query = next(r.query for r in server.requests if "/pods" in r.path)
    assert "app.kubernetes.io/component=etcd" in pod_query["labelSelector"]
    event_query = next(r.query for r in server.requests if "/events" in r.path)
    assert f"involvedObject.name={pod_name}" in event_query["fieldSelector"]


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_delete_by_label_ignores_not_found(fake_api: Callable[[Responder], KubeApiServer]) -> None:
    name = etcd_manifests.etcd_name(RUN_ID)

    def respond(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET" and "/statefulsets" in path:
            return 200, {"kind": "StatefulSetList", "items": [{"metadata": {"name": name}}]}
        if method == "GET" and "/services" in path:
            return 200, {"kind": "ServiceList", "items": [{"metadata": {"name": name}}]}
        if method == "GET":
            return 200, {"kind": "PersistentVolumeClaimList", "items": []}
        if "/services/" in path:
            return _status(404, "NotFound")  # deleted concurrently by someone else
        return 200, {"kind": "Status", "status": "Success"}

    server = fake_api(respond)
    deleted = k8s_etcd.delete_etcd(server.api_client, run_id=RUN_ID, namespace=NS)
    assert deleted == [f"StatefulSet/{name}"]
    lists = [r.query for r in server.requests if r.method == "GET"]
    assert len(lists) == 4
    assert all(f"{K8S_RUN_LABEL}={safe_run_id(RUN_ID)}" in q["labelSelector"] for q in lists)
    deletes = [(r.path, r.body) for r in server.requests if r.method == "DELETE"]
    assert [p for p, _ in deletes] == [
        f"/apis/apps/v1/namespaces/{NS}/statefulsets/{name}",
        f"/api/v1/namespaces/{NS}/services/{name}",
    ]
    assert all(b["propagationPolicy"] == "Background" for _, b in deletes)


@pytest.mark.integration  # the Kubernetes API fake serves on loopback
def test_run_owner_is_the_kfp_runs_workflow(
    fake_api: Callable[[Responder], KubeApiServer], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A KFP task pod (KFP_POD_NAME) in the objects' namespace: its Argo Workflow owns them."""
    from components.runtime import k8s_client

    def respond(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        assert path == f"/api/v1/namespaces/{NS}/pods/task-pod"
        refs = [{**WORKFLOW, "controller": True, "blockOwnerDeletion": True}]
        return 200, {"kind": "Pod", "metadata": {"name": "task-pod", "ownerReferences": refs}}

    server = fake_api(respond)
    monkeypatch.setenv("KFP_POD_NAME", "task-pod")
    monkeypatch.setenv("KFP_POD_NAMESPACE", NS)
    real_open = open

    def no_sa_file(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith("/var/run/secrets/"):
            raise OSError("not in a pod")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_sa_file)
    assert k8s_client.run_owner(server.api_client, NS) == WORKFLOW
    # Another namespace: an owner there would make the garbage collector delete at once.
    assert k8s_client.run_owner(server.api_client, "other") is None
    monkeypatch.delenv("KFP_POD_NAME")
    assert k8s_client.run_owner(server.api_client, NS) is None
