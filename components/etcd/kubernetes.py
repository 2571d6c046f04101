"""A per-run etcd on Kubernetes: manifest builders and a create / wait / delete API.

One single-member etcd per pipeline run, as a StatefulSet behind a ClusterIP Service (never a
LoadBalancer: only pods in the cluster reach it), every object labelled with the run id so the
exit handler finds and deletes it by label. Example:

    from kubernetes import client
    endpoint = create_etcd(api, run_id=run, namespace="llmft")   # idempotent
    wait_etcd_ready(api, run_id=run, namespace="llmft", timeout_s=300)
    ...                                                           # torchrun --rdzv-endpoint ...
    delete_etcd(api, run_id=run, namespace="llmft")              # ignores what is gone

Why these choices: the image is pinned (3.5.x: its v3 API serves our `etcd-v3` rendezvous, and its
deprecated v2 API can still be switched on for torch's `etcd-v2`); data is disposable, so an
emptyDir by default, or a PVC of a chosen (e.g. SSD) StorageClass that the StatefulSet deletes with
itself; probes use the plain-HTTP metrics listener so they keep working when clients need TLS
certificates; revision-based auto-compaction keeps the keyspace small although the rendezvous
heartbeats rewrite its state every few seconds.

Objects that outlive a terminated run: the exit handler may not run when a KFP run is
terminated, so the StatefulSet is owned by the run's Argo Workflow (when the task runs in the
run's namespace) or, failing that, adopted by the run's PyTorchJob (`adopt_etcd`, whose
ttlSecondsAfterFinished then removes it); the Service and NetworkPolicy are owned by the
StatefulSet and its PVCs are deleted with it. A NetworkPolicy admits only the run's own pods
(label `llmft.dev/run-id`) to etcd's client port.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from components.run_identity import (
    K8S_RUN_LABEL,
    k8s_labels,
    k8s_selector,
    resource_name,
    safe_run_id,
)

logger = logging.getLogger(__name__)

ETCD_IMAGE = "gcr.io/etcd-development/etcd:v3.5.17"
CLIENT_PORT = 2379
PEER_PORT = 2380
METRICS_PORT = 2381
COMPONENT = "etcd"
DATA_DIR = "/var/run/etcd"
TLS_DIR = "/etc/etcd/tls"


def etcd_name(run_id: str) -> str:
    """Name of the run's etcd StatefulSet and Service (a DNS-1123 label)."""
    return resource_name(COMPONENT, run_id)


def etcd_endpoint(*, run_id: str, namespace: str) -> str:
    """In-cluster `host:port` of the run's etcd Service, for torchrun's --rdzv-endpoint."""
    return f"{etcd_name(run_id)}.{namespace}.svc.cluster.local:{CLIENT_PORT}"


def etcd_selector(run_id: str) -> str:
    """Label selector of the run's etcd objects (and nothing else of the run)."""
    return f"{k8s_selector(run_id)},app.kubernetes.io/component={COMPONENT}"


def build_etcd_service(*, run_id: str, namespace: str) -> dict[str, Any]:
    """ClusterIP Service in front of the etcd pod (client port only)."""
    name = etcd_name(run_id)
    labels = k8s_labels(run_id, COMPONENT)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [
                {"name": "client", "port": CLIENT_PORT, "targetPort": "client", "protocol": "TCP"}
            ],
        },
    }


def build_etcd_network_policy(*, run_id: str, namespace: str) -> dict[str, Any]:
    """Only pods of the same run (the PyTorchJob's workers carry the run label) reach etcd's
    client port; everything else in the cluster is refused (where a NetworkPolicy-enforcing
    dataplane runs, e.g. GKE Dataplane V2)."""
    labels = k8s_labels(run_id, COMPONENT)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": etcd_name(run_id), "namespace": namespace, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": {K8S_RUN_LABEL: safe_run_id(run_id)}}}
                    ],
                    "ports": [{"protocol": "TCP", "port": CLIENT_PORT}],
                }
            ],
        },
    }


def owned_by(manifest: dict[str, Any], owner: dict[str, Any] | None) -> dict[str, Any]:
    """`manifest` with `owner` as its ownerReference (no blockOwnerDeletion: that needs rights
    on the owner's finalizers)."""
    if owner:
        manifest["metadata"]["ownerReferences"] = [dict(owner)]
    return manifest


def build_etcd_statefulset(
    *,
    run_id: str,
    namespace: str,
    image: str = ETCD_IMAGE,
    cpu: str = "500m",
    memory: str = "512Mi",
    storage_class: str | None = None,
    storage_size: str = "1Gi",
    tls_secret: str | None = None,
    enable_v2: bool = False,
) -> dict[str, Any]:
    """Single-member etcd StatefulSet.

    Args:
        run_id: pipeline run id (names and labels).
        namespace: where it runs.
        image: etcd image, pinned by tag.
        cpu: CPU request and limit.
        memory: memory request and limit.
        storage_class: a StorageClass (e.g. GKE's SSD `premium-rwo`) for a PVC that is deleted
            with the StatefulSet; None keeps the data in an emptyDir.
        storage_size: PVC size when `storage_class` is set.
        tls_secret: a `kubernetes.io/tls` Secret with `tls.crt`, `tls.key` and `ca.crt`: clients
            then connect over https and must present a certificate signed by `ca.crt`.
        enable_v2: also serve the deprecated v2 API (only torch's `etcd-v2` backend needs it).
    """
    if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]:
        raise ValueError(f"etcd image {image!r} must be pinned to a version tag (not :latest)")
    name = etcd_name(run_id)
    labels = k8s_labels(run_id, COMPONENT)
    scheme = "https" if tls_secret else "http"
    advertise = f"{scheme}://{etcd_endpoint(run_id=run_id, namespace=namespace)}"
    command = [
        "etcd",
        f"--name={name}",
        f"--data-dir={DATA_DIR}/data",
        f"--listen-client-urls={scheme}://0.0.0.0:{CLIENT_PORT}",
        f"--advertise-client-urls={advertise}",
        # One member: peers only ever talk on loopback.
        f"--listen-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-cluster={name}=http://127.0.0.1:{PEER_PORT}",
        "--initial-cluster-state=new",
        f"--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}",
        "--auto-compaction-mode=revision",
        "--auto-compaction-retention=1000",
        "--quota-backend-bytes=1073741824",
    ]
    volume_mounts: list[dict[str, Any]] = [{"name": "data", "mountPath": DATA_DIR}]
    volumes: list[dict[str, Any]] = []
    if tls_secret:
        command += [
            f"--cert-file={TLS_DIR}/tls.crt",
            f"--key-file={TLS_DIR}/tls.key",
            f"--trusted-ca-file={TLS_DIR}/ca.crt",
            "--client-cert-auth=true",
        ]
        volume_mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o400}})
    if enable_v2:
        command.append("--enable-v2=true")

    probe = {"httpGet": {"path": "/health", "port": "metrics"}, "timeoutSeconds": 5}
    container = {
        "name": "etcd",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "ports": [
            {"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {**probe, "periodSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {
            **probe,
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": {
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"cpu": cpu, "memory": memory},
        },
        "volumeMounts": volume_mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    spec: dict[str, Any] = {
        "serviceName": name,
        "replicas": 1,
        "selector": {"matchLabels": labels},
        "podManagementPolicy": "Parallel",
        "template": {
            "metadata": {
                "labels": labels,
                # Evicting etcd mid-run would stall every node of the training job.
                "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
            },
            "spec": {
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": 10,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "fsGroup": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [container],
                "volumes": volumes,
            },
        },
    }
    if storage_class:
        spec["volumeClaimTemplates"] = [
            {
                "metadata": {"name": "data", "labels": labels},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": storage_size}},
                },
            }
        ]
        spec["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Delete",
            "whenScaled": "Delete",
        }
    else:
        volumes.append({"name": "data", "emptyDir": {"sizeLimit": storage_size}})
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def build_etcd_manifests(*, run_id: str, namespace: str, **options: Any) -> list[dict[str, Any]]:
    """StatefulSet, Service and NetworkPolicy, in creation order (the StatefulSet first: the
    others are owned by it); `options` go to `build_etcd_statefulset`."""
    return [
        build_etcd_statefulset(run_id=run_id, namespace=namespace, **options),
        build_etcd_service(run_id=run_id, namespace=namespace),
        build_etcd_network_policy(run_id=run_id, namespace=namespace),
    ]


# -- API --------------------------------------------------------------------------------------


class EtcdNotReadyError(TimeoutError):
    """The run's etcd did not become ready in time; the message says what the pod reported."""


def _api_exception() -> type[Exception]:
    from kubernetes.client.exceptions import ApiException

    return ApiException


def create_etcd(
    api_client: Any,
    *,
    run_id: str,
    namespace: str,
    owner: dict[str, Any] | None = None,
    **options: Any,
) -> str:
    """Create the run's etcd StatefulSet, Service and NetworkPolicy; objects that already exist
    are reused.

    A retried pipeline task therefore finds its etcd instead of failing on "already exists".

    Args:
        api_client: a `kubernetes.client.ApiClient` for the target cluster.
        run_id: pipeline run id.
        namespace: target namespace.
        owner: ownerReference for the StatefulSet (the run's Workflow, see
            `components.k8s_client.run_owner`); the Service and NetworkPolicy are owned by it.
        **options: forwarded to `build_etcd_statefulset` (image, storage_class, tls_secret, ...).

    Returns:
        The in-cluster endpoint `host:2379`.
    """
    from kubernetes import client

    api_exception = _api_exception()
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    networking = client.NetworkingV1Api(api_client)
    creators: dict[str, Callable[..., Any]] = {
        "StatefulSet": apps.create_namespaced_stateful_set,
        "Service": core.create_namespaced_service,
        "NetworkPolicy": networking.create_namespaced_network_policy,
    }
    statefulset_owner = owner
    for manifest in build_etcd_manifests(run_id=run_id, namespace=namespace, **options):
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if kind == "StatefulSet":
            owned_by(manifest, owner)
        else:
            owned_by(manifest, statefulset_owner)
        try:
            created = creators[kind](namespace=namespace, body=manifest)
            logger.info("created %s %s/%s", kind, namespace, name)
        except api_exception as exc:
            if getattr(exc, "status", None) != 409:
                raise
            logger.info("%s %s/%s already exists; reusing it", kind, namespace, name)
            created = (
                apps.read_namespaced_stateful_set(name, namespace)
                if kind == "StatefulSet"
                else None
            )
        if kind == "StatefulSet" and created is not None:
            statefulset_owner = {
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                "uid": created.metadata.uid,
            }  # fmt: skip
    return etcd_endpoint(run_id=run_id, namespace=namespace)


def adopt_etcd(api_client: Any, *, run_id: str, namespace: str, owner: dict[str, Any]) -> bool:
    """Make `owner` (the run's PyTorchJob) own the run's etcd StatefulSet unless something (the
    run's Workflow) already does, so the job's TTL also removes etcd. Returns whether it did."""
    from kubernetes import client

    apps = client.AppsV1Api(api_client)
    try:
        current = apps.read_namespaced_stateful_set(etcd_name(run_id), namespace)
    except _api_exception() as exc:
        if getattr(exc, "status", None) == 404:
            return False
        raise
    if current.metadata.owner_references:
        return False
    apps.patch_namespaced_stateful_set(
        etcd_name(run_id), namespace, {"metadata": {"ownerReferences": [dict(owner)]}}
    )
    return True


def wait_etcd_ready(
    api_client: Any,
    *,
    run_id: str,
    namespace: str,
    timeout_s: float = 300.0,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait until the etcd pod is ready (its /health probe passes).

    Raises:
        EtcdNotReadyError: after `timeout_s`, with each pod's phase, waiting reasons and recent
            events (image pull errors, unschedulable, crash loops) so the cause is visible.
    """
    from kubernetes import client

    apps = client.AppsV1Api(api_client)
    name = etcd_name(run_id)
    deadline = clock() + timeout_s
    while True:
        status = apps.read_namespaced_stateful_set_status(name=name, namespace=namespace).status
        if status is not None and (status.ready_replicas or 0) >= 1:
            logger.info("etcd %s/%s is ready", namespace, name)
            return
        if clock() >= deadline:
            raise EtcdNotReadyError(
                f"etcd {namespace}/{name} not ready after {timeout_s:.0f} s: "
                + _diagnose(api_client, run_id=run_id, namespace=namespace)
            )
        sleep(poll_s)


def _diagnose(api_client: Any, *, run_id: str, namespace: str) -> str:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod(namespace=namespace, label_selector=etcd_selector(run_id))
    if not pods.items:
        return "no pod was created (check the StatefulSet's events and the namespace's quota)"
    reports = []
    for pod in pods.items:
        pod_name = pod.metadata.name
        parts = [f"pod {pod_name} is {pod.status.phase if pod.status else 'unknown'}"]
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None:
                parts.append(
                    f"container {cs.name} waiting: {waiting.reason} {waiting.message or ''}"
                )
        events = core.list_namespaced_event(
            namespace=namespace, field_selector=f"involvedObject.name={pod_name}"
        )
        for event in sorted(events.items or [], key=lambda e: str(e.last_timestamp))[-5:]:
            parts.append(f"event {event.reason}: {event.message}")
        reports.append("; ".join(p.strip() for p in parts))
    return " | ".join(reports)


def delete_etcd(api_client: Any, *, run_id: str, namespace: str) -> list[str]:
    """Delete the run's etcd StatefulSet, Service and PVCs by label; "not found" is fine.

    Returns:
        `Kind/name` of every object deleted.
    """
    from kubernetes import client

    api_exception = _api_exception()
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    selector = etcd_selector(run_id)
    kinds: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = [
        ("StatefulSet", apps.list_namespaced_stateful_set, apps.delete_namespaced_stateful_set),
        ("Service", core.list_namespaced_service, core.delete_namespaced_service),
        (
            "NetworkPolicy",
            client.NetworkingV1Api(api_client).list_namespaced_network_policy,
            client.NetworkingV1Api(api_client).delete_namespaced_network_policy,
        ),
        # The retention policy deletes PVCs with the StatefulSet; this also covers clusters
        # without that feature and PVCs left by a StatefulSet deleted out of band.
        (
            "PersistentVolumeClaim",
            core.list_namespaced_persistent_volume_claim,
            core.delete_namespaced_persistent_volume_claim,
        ),
    ]
    deleted = []
    for kind, list_fn, delete_fn in kinds:
        for item in list_fn(namespace=namespace, label_selector=selector).items:
            try:
                delete_fn(
                    name=item.metadata.name,
                    namespace=namespace,
                    body=client.V1DeleteOptions(propagation_policy="Background"),
                )
            except api_exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
                continue
            deleted.append(f"{kind}/{item.metadata.name}")
    logger.info("deleted etcd objects of run %s: %s", run_id, deleted or "none")
    return deleted
