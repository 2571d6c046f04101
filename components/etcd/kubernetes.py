"""A per-run etcd on Kubernetes: create / wait / delete (the manifests: components/etcd/manifests.py).

One single-member etcd per pipeline run, as a StatefulSet behind a ClusterIP Service (never a
LoadBalancer: only pods in the cluster reach it), every object labelled with the run id so the
exit handler finds and deletes it by label. Example:

    from kubernetes import client
    endpoint = create_etcd(api, run_id=run, namespace="llmft")   # idempotent
    wait_etcd_ready(api, run_id=run, namespace="llmft", timeout_s=300)
    ...                                                           # torchrun --rdzv-endpoint ...
    delete_etcd(api, run_id=run, namespace="llmft")              # ignores what is gone

Objects that outlive a terminated run: the exit handler may not run when a KFP run is
terminated, so the StatefulSet is owned by the run's Argo Workflow (when the task runs in the
run's namespace) or, failing that, adopted by the run's PyTorchJob (`adopt_etcd`, whose
ttlSecondsAfterFinished then removes it; the launcher releases it, `release_etcd`, before a
retried train task replaces that job, and recreates it if the job already took it along); the Service and NetworkPolicy are owned by the
StatefulSet and its PVCs are deleted with it. A NetworkPolicy admits only the run's own pods
(label `llmft.dev/run-id`) to etcd's client port.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from components.etcd.manifests import (
    build_etcd_manifests,
    etcd_endpoint,
    etcd_name,
    etcd_selector,
    owned_by,
)

logger = logging.getLogger(__name__)


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
            `components.runtime.k8s_client.run_owner`); the Service and NetworkPolicy are owned by it.
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
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": name,
                "uid": created.metadata.uid,
            }
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


def release_etcd(api_client: Any, *, run_id: str, namespace: str, owner_kind: str) -> bool:
    """Drop the run's etcd StatefulSet's ownerReferences when every one is an `owner_kind` (the
    run's PyTorchJob, see `adopt_etcd`), so deleting or replacing that job does not garbage-collect
    the etcd a retried train task still needs. A Workflow owner is kept. Returns whether it did."""
    from kubernetes import client

    apps = client.AppsV1Api(api_client)
    try:
        current = apps.read_namespaced_stateful_set(etcd_name(run_id), namespace)
    except _api_exception() as exc:
        if getattr(exc, "status", None) == 404:
            return False
        raise
    owners = current.metadata.owner_references or []
    if not owners or any(ref.kind != owner_kind for ref in owners):
        return False
    # null removes the whole list in a strategic merge patch ([] would merge into it)
    apps.patch_namespaced_stateful_set(
        etcd_name(run_id), namespace, {"metadata": {"ownerReferences": None}}
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
