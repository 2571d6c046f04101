"""Stream the log of a training job's node 0 (a PyTorchJob's worker 0, a TrainJob's completion
index 0) to the launcher's log sink, again after each restart.

Logs are best effort: the job's status decides the result, so a stream that breaks only says so.
"""

from __future__ import annotations

import threading
from typing import Any

from components.launchers.base import LogSink
from components.launchers.pytorchjob import CONTAINER, REPLICA_INDEX_LABEL


class RankZeroLog:
    """Follows worker 0's current container (a new stream per restart) on a daemon thread."""

    def __init__(
        self,
        core: Any,
        *,
        log: LogSink,
        index_label: str = REPLICA_INDEX_LABEL,
        container: str = CONTAINER,
    ) -> None:
        self.core = core
        """A `kubernetes.client.CoreV1Api`."""
        self.log = log
        self.index_label = index_label
        """The pod label holding the node index (node 0's log is followed)."""
        self.container = container
        self._key: tuple[str, int] = ("", -1)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def follow(self, namespace: str, pods: list[Any]) -> None:
        """Start following worker 0 if it runs (or ran) and is not followed yet."""
        first = [p for p in pods if (p.metadata.labels or {}).get(self.index_label) == "0"]
        if (
            not first
            or first[0].status is None
            or first[0].status.phase not in ("Running", "Succeeded", "Failed")
        ):
            return
        pod = first[0]
        restarts = sum(c.restart_count or 0 for c in pod.status.container_statuses or [])
        key = (pod.metadata.uid or pod.metadata.name, restarts)
        if key == self._key or (self._thread and self._thread.is_alive()):
            return
        self._key, self._stop = key, threading.Event()
        self._thread = threading.Thread(
            target=self._stream, args=(namespace, pod.metadata.name, self._stop), daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _stream(self, namespace: str, pod: str, stop: threading.Event) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod_log(
                pod, namespace, container=self.container, follow=True, _preload_content=False
            )
            buffer = b""
            for chunk in response.stream(4096):
                if stop.is_set():
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self.log(f"[{pod}] {line.decode(errors='replace')}")
            if buffer and not stop.is_set():
                self.log(f"[{pod}] {buffer.decode(errors='replace')}")
            response.release_conn()
        except (ApiException, OSError) as exc:  # logs are best effort; status decides the result
            self.log(f"[gke] log stream of {pod} ended: {exc}")
