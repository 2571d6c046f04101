"""The pipeline's rendezvous steps: bring up the run's etcd (`etcd_up`) and remove it (`etcd_down`).

Called by the `etcd_up` KFP component and by cleanup; per backend:
- local: a detached etcd process on loopback (it outlives the task that starts it), stopped by
  run id from the cleanup task;
- gke: a StatefulSet + ClusterIP Service in the run's namespace, deleted by label;
- vertex: nothing. A Vertex CustomJob cannot reach a service outside its worker pools, so the
  Vertex launcher rendezvouses with c10d at the primary replica; the endpoint is "".
The c10d rendezvous needs no etcd on any backend.
"""

from __future__ import annotations

import logging
from typing import Any

from components.etcd import kubernetes as k8s_etcd
from components.etcd import local as etcd_local
from components.run_params import RunParams

logger = logging.getLogger(__name__)

BACKENDS = ("local", "gke", "vertex")
RDZV_BACKENDS = ("etcd-v3", "etcd-v2", "c10d")


def _check(backend: str, rdzv_backend: str, namespace: str) -> None:
    errors = []
    if backend not in BACKENDS:
        errors.append(f"backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    if rdzv_backend not in RDZV_BACKENDS:
        errors.append(f"rdzv_backend={rdzv_backend!r}: choose one of {', '.join(RDZV_BACKENDS)}")
    if backend == "gke" and not namespace:
        errors.append("namespace is empty: the gke backend creates etcd in that namespace")
    if errors:
        raise ValueError("; ".join(errors))


def _api_client(api_client: Any, gke_cluster: str) -> Any:
    if api_client is not None:
        return api_client
    from components.k8s_client import make_api_client

    return make_api_client(cluster=gke_cluster)


def etcd_up(
    *,
    backend: str,
    run_id: str,
    rdzv_backend: str = RunParams.rdzv_backend,
    namespace: str = "",
    gke_cluster: str = "",
    project: str = "",
    storage_class: str | None = None,
    tls_secret: str | None = None,
    timeout_s: float = 300.0,
    api_client: Any = None,
) -> str:
    """Start the run's etcd and return its endpoint (`host:port`), or "" when none is needed.

    Idempotent, so a retried task reuses the etcd it started before.

    Args:
        backend: local | gke | vertex.
        run_id: the pipeline run id (names, labels, local state).
        rdzv_backend: etcd-v3 | etcd-v2 (switches etcd's v2 API on) | c10d (no etcd at all).
        namespace: Kubernetes namespace (gke).
        gke_cluster: `projects/P/locations/L/clusters/C` when driving GKE from outside it; ""
            in a pod of the cluster or with a kubeconfig (gke).
        project: Google Cloud project; unused here, accepted so that every step has one signature.
        storage_class: PVC StorageClass for etcd's data, e.g. an SSD class (gke; default emptyDir).
        tls_secret: Secret with tls.crt/tls.key/ca.crt to serve etcd over TLS (gke).
        timeout_s: how long to wait for etcd to become healthy.
        api_client: a `kubernetes.client.ApiClient` (gke; default: built from `gke_cluster`).
    """
    del project
    _check(backend, rdzv_backend, namespace)
    if rdzv_backend == "c10d":
        logger.info("rdzv_backend=c10d rendezvouses at the first node: no etcd started")
        return ""
    if backend == "vertex":
        logger.info(
            "backend=vertex: no etcd (a CustomJob cannot reach a per-run etcd service); the "
            "Vertex launcher rendezvouses with c10d at the primary replica"
        )
        return ""
    enable_v2 = rdzv_backend == "etcd-v2"
    if backend == "local":
        return etcd_local.start(run_id, enable_v2=enable_v2, detached=True, timeout_s=timeout_s)
    client = _api_client(api_client, gke_cluster)
    from components.k8s_client import run_owner

    endpoint = k8s_etcd.create_etcd(
        client,
        run_id=run_id,
        namespace=namespace,
        owner=run_owner(client, namespace),  # the run's Workflow on KFP; else adopted by the job
        storage_class=storage_class,
        tls_secret=tls_secret,
        enable_v2=enable_v2,
    )
    k8s_etcd.wait_etcd_ready(client, run_id=run_id, namespace=namespace, timeout_s=timeout_s)
    logger.info("etcd of run %s is ready at %s", run_id, endpoint)
    return endpoint


def etcd_down(
    *,
    backend: str,
    run_id: str,
    namespace: str = "",
    gke_cluster: str = "",
    project: str = "",
    api_client: Any = None,
) -> list[str]:
    """Remove the run's etcd wherever `etcd_up` put it; nothing there is not an error.

    Returns:
        What was removed, one line each (for the cleanup task's log).
    """
    del project
    _check(backend, "etcd-v3", namespace)
    if backend == "local":
        return [f"stopped the local etcd of run {run_id}"] if etcd_local.stop(run_id) else []
    if backend == "gke":
        client = _api_client(api_client, gke_cluster)
        return k8s_etcd.delete_etcd(client, run_id=run_id, namespace=namespace)
    return []
