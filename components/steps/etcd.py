"""The pipeline's rendezvous step: bring up the run's etcd.

`run(EtcdRequest)` is what the `etcd_up` KFP component calls; per backend:
- local: a detached etcd process on loopback (it outlives the task that starts it), stopped by
  run id from the cleanup task;
- gke: a StatefulSet + ClusterIP Service in the run's namespace, deleted by label;
- vertex: nothing. A Vertex CustomJob cannot reach a service outside its worker pools, so the
  Vertex launcher rendezvouses with c10d at the primary replica; the endpoint is "".
The c10d rendezvous needs no etcd on any backend. The cleanup step removes the etcd with the rest
of the run (components/steps/cleanup.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from components.etcd import kubernetes as k8s_etcd
from components.etcd import local as etcd_local
from components.params.run_params import Backend, RdzvBackend, choices

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EtcdRequest:
    """The `etcd_up` component's parameters (components/kfp_components.py), by the same names,
    plus the gke backend's settings that are not run parameters."""

    backend: Backend
    run_id: str
    rdzv_backend: RdzvBackend
    """etcd-v3 | etcd-v2 (switches etcd's v2 API on) | c10d (no etcd at all)."""
    namespace: str
    gke_cluster: str
    project: str
    """Unused: the component takes it so that its signature matches its siblings'."""
    storage_class: str | None = None
    """PVC StorageClass for etcd's data, e.g. an SSD class (gke; default emptyDir)."""
    tls_secret: str | None = None
    """Secret with tls.crt/tls.key/ca.crt to serve etcd over TLS (gke)."""
    timeout_s: float = 300.0
    """How long to wait for etcd to become healthy."""
    api_client: Any = None
    """A `kubernetes.client.ApiClient` (gke; default: built from `gke_cluster`)."""

    def errors(self) -> list[str]:
        errors = []
        for name in ("backend", "rdzv_backend"):
            value, allowed = getattr(self, name), choices(name)
            if value not in allowed:
                errors.append(f"{name}={value!r}: choose one of {', '.join(allowed)}")
        if self.backend == "gke" and not self.namespace:
            errors.append("namespace is empty: the gke backend creates etcd in that namespace")
        return errors


def run(request: EtcdRequest) -> str:
    """Start the run's etcd and return its endpoint (`host:port`), or "" when none is needed.

    Idempotent, so a retried task reuses the etcd it started before.
    """
    errors = request.errors()
    if errors:
        raise ValueError("; ".join(errors))
    if request.rdzv_backend == "c10d":
        logger.info("rdzv_backend=c10d rendezvouses at the first node: no etcd started")
        return ""
    if request.backend == "vertex":
        logger.info(
            "backend=vertex: no etcd (a CustomJob cannot reach a per-run etcd service); the "
            "Vertex launcher rendezvouses with c10d at the primary replica"
        )
        return ""
    enable_v2 = request.rdzv_backend == "etcd-v2"
    if request.backend == "local":
        return etcd_local.start(
            request.run_id, enable_v2=enable_v2, detached=True, timeout_s=request.timeout_s
        )
    from components.runtime.k8s_client import make_api_client, run_owner

    client = request.api_client
    if client is None:
        client = make_api_client(cluster=request.gke_cluster)
    run_id, namespace = request.run_id, request.namespace
    endpoint = k8s_etcd.create_etcd(
        client,
        run_id=run_id,
        namespace=namespace,
        owner=run_owner(client, namespace),  # the run's Workflow on KFP; else adopted by the job
        storage_class=request.storage_class,
        tls_secret=request.tls_secret,
        enable_v2=enable_v2,
    )
    k8s_etcd.wait_etcd_ready(
        client, run_id=run_id, namespace=namespace, timeout_s=request.timeout_s
    )
    logger.info("etcd of run %s is ready at %s", run_id, endpoint)
    return endpoint
