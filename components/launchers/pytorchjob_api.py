"""The training-job custom objects of one namespace through the Kubernetes API: create
(idempotent, a failed job replaced), get, delete, list by label, and the job's updates as a
resumable watch. `JobApi` is the same for every kind; `PyTorchJobApi` is the Training Operator
v1's PyTorchJob (components/launchers/trainjob_api.py: Trainer v2's TrainJob).

`components/launchers/gke.py` (`GkeLauncher`) uses it to submit and follow the manifest that
`components/launchers/pytorchjob.py` (or trainjob.py) builds; it judges nothing about the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any

from components.launchers.k8s_diagnostics import job_condition
from components.launchers.pytorchjob import GROUP, KIND, PLURAL, VERSION

REPLACE_TIMEOUT_S = 120.0
"""How long a failed job being replaced may take to go away before the create fails."""


class JobGone(RuntimeError):
    """The job disappeared while it was followed (deleted by a user or by cleanup)."""


class JobApi:
    """Jobs of one kind (the class's GROUP, VERSION, PLURAL, KIND) in `namespace` through `custom`
    (a `kubernetes.client.CustomObjectsApi`); `log` receives one line per create, reuse or
    replacement."""

    GROUP, VERSION, PLURAL, KIND = GROUP, VERSION, PLURAL, KIND

    def __init__(self, custom: Any, namespace: str, *, log: Callable[[str], None]) -> None:
        self.custom = custom
        self.namespace = namespace
        self.log = log

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the job; if it exists (a retried step), reuse it unless it already failed, in
        which case it is replaced so the retry can succeed."""
        from kubernetes.client.exceptions import ApiException

        name = manifest["metadata"]["name"]
        try:
            created = self._create(manifest)
            self.log(f"[gke] created {self.KIND} {self.namespace}/{name}")
            return created
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = self.get(name)
        kind, reason, _ = job_condition(existing)
        if kind != "Failed":
            self.log(
                f"[gke] {self.KIND} {self.namespace}/{name} already exists ({kind or 'new'}): "
                "following it"
            )
            return existing
        self.log(f"[gke] {self.KIND} {name} exists and failed ({reason}): replacing it")
        self.delete(name)
        deadline = time.monotonic() + REPLACE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                return self._create(manifest)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            time.sleep(1.0)
        raise RuntimeError(
            f"{self.KIND} {name} was deleted but is still there after {REPLACE_TIMEOUT_S:.0f} s"
        )

    def _create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return dict(
            self.custom.create_namespaced_custom_object(
                self.GROUP, self.VERSION, self.namespace, self.PLURAL, manifest
            )
        )

    def get(self, name: str) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object(
                self.GROUP, self.VERSION, self.namespace, self.PLURAL, name
            )
        )

    def delete(self, name: str, namespace: str | None = None) -> bool:
        """Delete a job (its pods in the background); False when it was already gone."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                self.GROUP,
                self.VERSION,
                namespace or self.namespace,
                self.PLURAL,
                name,
                body=client.V1DeleteOptions(propagation_policy="Background"),
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def list(self, label_selector: str) -> list[dict[str, Any]]:
        """The jobs of the namespace that carry the labels."""
        jobs = self.custom.list_namespaced_custom_object(
            self.GROUP, self.VERSION, self.namespace, self.PLURAL, label_selector=label_selector
        )
        return list(jobs.get("items", []))

    def updates(self, name: str, *, watch_s: float) -> Generator[dict[str, Any], None, None]:
        """The job now, then after every change: one list, then watches resumed from the last
        resourceVersion (a 410 Gone lists again). A watch window (`watch_s`) that ends quietly
        yields the last state again so the caller re-checks pods and deadlines. Raises `JobGone`
        when the job is deleted."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        selector = f"metadata.name={name}"
        job: dict[str, Any] = {}
        version = ""
        while True:
            if not version:
                listing = self.custom.list_namespaced_custom_object(
                    self.GROUP, self.VERSION, self.namespace, self.PLURAL, field_selector=selector
                )
                version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                items = listing.get("items") or []
                if not items:
                    raise JobGone(name)
                job = items[0]
                yield job
            try:
                for event in watch.Watch().stream(
                    self.custom.list_namespaced_custom_object,
                    self.GROUP,
                    self.VERSION,
                    self.namespace,
                    self.PLURAL,
                    field_selector=selector,
                    resource_version=version,
                    timeout_seconds=max(1, int(watch_s)),
                    allow_watch_bookmarks=True,
                ):
                    obj = event["object"]
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if event["type"] == "DELETED":
                        raise JobGone(name)
                    if event["type"] != "BOOKMARK":
                        job = obj
                        yield job
            except ApiException as exc:
                if exc.status != 410:
                    raise
                version = ""  # too old to resume from: list again
                continue
            yield job


class PyTorchJobApi(JobApi):
    """Training Operator v1 PyTorchJobs (`kubeflow.org/v1`)."""
