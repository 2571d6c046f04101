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
from components.params.by_step import EtcdUpParams
from components.params.run_params import choices
from components.runtime.k8s_client import make_api_client, run_owner
from components.steps.component_spec import StepComponent, component_input

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EtcdRequest:
    """The `etcd_up` component: its run parameters and the run id, plus the gke backend's
    settings that are not run parameters."""

    params: EtcdUpParams
    """The run parameters the etcd_up step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    run_id: str = component_input("str")
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
            value, allowed = getattr(self.params, name), choices(name)
            if value not in allowed:
                errors.append(f"{name}={value!r}: choose one of {', '.join(allowed)}")
        if self.params.backend == "gke" and not self.params.namespace:
            errors.append("namespace is empty: the gke backend creates etcd in that namespace")
        return errors


COMPONENT = StepComponent(
    name="etcd_up",
    request=EtcdRequest,
    returns="str",
    doc="""Start this run's etcd (a local process, or a StatefulSet + ClusterIP Service on GKE).

Returns:
    The rendezvous endpoint `host:port` ("" for c10d and on Vertex, which rendezvous at the
    primary replica).
""",
)


def run(request: EtcdRequest) -> str:
    """Start the run's etcd and return its endpoint (`host:port`), or "" when none is needed.

    Idempotent, so a retried task reuses the etcd it started before.
    """
    errors = request.errors()
    if errors:
        raise ValueError("; ".join(errors))
    if request.params.rdzv_backend == "c10d":
        logger.info("rdzv_backend=c10d rendezvouses at the first node: no etcd started")
        return ""
    if request.params.backend == "vertex":
        logger.info(
            "backend=vertex: no etcd (a CustomJob cannot reach a per-run etcd service); the "
            "Vertex launcher rendezvouses with c10d at the primary replica"
        )
        return ""
    enable_v2 = request.params.rdzv_backend == "etcd-v2"
    if request.params.backend == "local":
        return etcd_local.start(
            request.run_id, enable_v2=enable_v2, detached=True, timeout_s=request.timeout_s
        )

    client = request.api_client
    if client is None:
        client = make_api_client(cluster=request.params.gke_cluster)
    run_id, namespace = request.run_id, request.params.namespace
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
