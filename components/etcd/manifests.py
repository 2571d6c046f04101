"""The per-run etcd's Kubernetes manifests: pure builders (components/etcd/kubernetes.py applies
them). One single-member etcd per pipeline run, as a StatefulSet behind a ClusterIP Service (never
a LoadBalancer: only pods in the cluster reach it) and a NetworkPolicy that admits only the run's
own pods, every object labelled with the run id.

Why these choices: the image is pinned (3.5.x: its v3 API serves our `etcd-v3` rendezvous, and its
deprecated v2 API can still be switched on for torch's `etcd-v2`); data is disposable, so an
emptyDir by default, or a PVC of a chosen (e.g. SSD) StorageClass that the StatefulSet deletes with
itself; probes use the plain-HTTP metrics listener so they keep working when clients need TLS
certificates; revision-based auto-compaction keeps the keyspace small although the rendezvous
heartbeats rewrite its state every few seconds.
"""

from __future__ import annotations

from typing import Any

from components.platform.node_facts import GPU_NODE_LABEL
from components.runtime.run_identity import (
    K8S_RUN_LABEL,
    k8s_labels,
    k8s_selector,
    resource_name,
    safe_run_id,
)

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


def etcd_command(*, run_id: str, namespace: str, tls: bool, enable_v2: bool) -> list[str]:
    """etcd's flags: one member on loopback peers, clients on the Service (https with `tls`:
    client certificates signed by the Secret's ca.crt), metrics on plain HTTP for the probes."""
    name = etcd_name(run_id)
    scheme = "https" if tls else "http"
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
    if tls:
        command += [
            f"--cert-file={TLS_DIR}/tls.crt",
            f"--key-file={TLS_DIR}/tls.key",
            f"--trusted-ca-file={TLS_DIR}/ca.crt",
            "--client-cert-auth=true",
        ]
    if enable_v2:
        command.append("--enable-v2=true")
    return command


def _etcd_container(
    image: str, command: list[str], *, cpu: str, memory: str, mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The etcd container: probes on the plain-HTTP metrics port, requests = limits, read-only
    root, no capabilities."""
    probe = {"httpGet": {"path": "/health", "port": "metrics"}, "timeoutSeconds": 5}
    return {
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
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


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
    volumes, volume_mounts = _volumes(tls_secret, storage_class, storage_size)
    command = etcd_command(
        run_id=run_id, namespace=namespace, tls=bool(tls_secret), enable_v2=enable_v2
    )
    container = _etcd_container(image, command, cpu=cpu, memory=memory, mounts=volume_mounts)
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
                "affinity": _off_gpu_nodes(),
            },
        },
    }
    if storage_class:
        spec.update(_data_claim(labels, storage_class, storage_size))
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def _off_gpu_nodes() -> dict[str, Any]:
    """Never on a GPU node: an etcd that must not be evicted would keep an idle GPU node from
    scaling down (cloud audit 2026-12-07 C5); GKE labels every GPU node."""
    no_gpu = {"key": GPU_NODE_LABEL, "operator": "DoesNotExist"}
    required = {"nodeSelectorTerms": [{"matchExpressions": [no_gpu]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def _volumes(
    tls_secret: str | None, storage_class: str | None, storage_size: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts: the data directory (an emptyDir unless a
    PVC from `storage_class` holds it) and, with TLS, the certificates."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = [{"name": "data", "mountPath": DATA_DIR}]
    if tls_secret:
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o400}})
    if not storage_class:
        volumes.append({"name": "data", "emptyDir": {"sizeLimit": storage_size}})
    return volumes, mounts


def _data_claim(labels: dict[str, str], storage_class: str, storage_size: str) -> dict[str, Any]:
    """The StatefulSet fields of a data PVC that is deleted with the StatefulSet."""
    return {
        "volumeClaimTemplates": [
            {
                "metadata": {"name": "data", "labels": labels},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": storage_size}},
                },
            }
        ],
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
    }


def build_etcd_manifests(*, run_id: str, namespace: str, **options: Any) -> list[dict[str, Any]]:
    """StatefulSet, Service and NetworkPolicy, in creation order (the StatefulSet first: the
    others are owned by it); `options` go to `build_etcd_statefulset`."""
    return [
        build_etcd_statefulset(run_id=run_id, namespace=namespace, **options),
        build_etcd_service(run_id=run_id, namespace=namespace),
        build_etcd_network_policy(run_id=run_id, namespace=namespace),
    ]
