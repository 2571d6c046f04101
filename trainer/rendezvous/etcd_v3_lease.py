"""The lifetime of a run's etcd keys: alive while any agent runs, gone after the last one leaves.

Every key of a run (rendezvous state, store keys) is attached to one *run lease* whose id is
derived from the run's key prefix, so every agent of the run finds the same lease without a
coordination round: the first agent grants it, the others get "already exists" and share it. Each
agent refreshes it from a background thread; if every agent dies, etcd deletes the run's keys
`lease_ttl` seconds later.

Each agent also registers a node key under its own short *node lease*. On a clean shutdown an agent
revokes its node lease and, if no node key remains, deletes the run's keys and revokes the run
lease: the last agent out turns off the lights, while agents still inside (say, in torchrun's exit
barrier) keep everything they need. A crashed agent's node key expires after `node_ttl`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from trainer.rendezvous.etcd_v3_client import EtcdV3Client, EtcdV3Error, EtcdV3LeaseNotFound

logger = logging.getLogger(__name__)

T = TypeVar("T")


def run_lease_id(run_prefix: str) -> int:
    """A positive int64 lease id that every agent of a run computes alike."""
    digest = int.from_bytes(hashlib.sha256(run_prefix.encode()).digest()[:8], "big")
    return (digest & ((1 << 62) - 1)) or 1


class RunLease:
    """The run lease plus this agent's node registration (see the module docstring).

    Args:
        client: etcd client.
        run_prefix: the run's key prefix, ending in '/'.
        node_name: unique name of this agent (host, pid, random suffix).
        lease_ttl: seconds the run's keys outlive the last keep-alive.
        node_ttl: seconds this agent's registration outlives its last keep-alive.
    """

    def __init__(
        self,
        client: EtcdV3Client,
        run_prefix: str,
        *,
        node_name: str,
        lease_ttl: int,
        node_ttl: int,
    ) -> None:
        assert run_prefix.endswith("/"), run_prefix
        self._client = client
        self.run_prefix = run_prefix
        self.lease_id = run_lease_id(run_prefix)
        self.nodes_prefix = f"{run_prefix}nodes/"
        self.node_key = f"{self.nodes_prefix}{node_name}"
        self._lease_ttl = lease_ttl
        self._node_ttl = node_ttl
        self._node_lease = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Grant/join the run lease, register this node and start refreshing both."""
        self.ensure_run_lease()
        self._register_node()
        self._thread = threading.Thread(
            target=self._refresh_loop, name=f"etcd-v3-lease-{self.lease_id:x}", daemon=True
        )
        self._thread.start()

    def ensure_run_lease(self) -> None:
        """Make sure the shared run lease exists (grant it, or accept that another agent did)."""
        try:
            self._client.lease_grant(self._lease_ttl, self.lease_id)
        except EtcdV3Error as exc:
            if exc.code != 9:  # 9 = ALREADY_EXISTS: another agent granted it first
                raise

    def call(self, operation: Callable[[int], T]) -> T:
        """Run an etcd write that attaches the run lease, re-granting the lease once if it expired.

        A lease can vanish under us only if no agent refreshed it for `lease_ttl` (e.g. a long
        network partition); writing again under a fresh lease of the same id then lets the run
        continue instead of failing on a missing lease.
        """
        try:
            return operation(self.lease_id)
        except EtcdV3LeaseNotFound:
            logger.warning("etcd-v3: run lease %x expired; granting it again", self.lease_id)
            self.ensure_run_lease()
            return operation(self.lease_id)

    def _register_node(self) -> None:
        with self._lock:
            if self._stop.is_set():  # leave() ran meanwhile: stay unregistered
                return
            self._node_lease = self._client.lease_grant(self._node_ttl)
            self._client.put(self.node_key, b"", lease=self._node_lease)

    def _refresh_loop(self) -> None:
        interval = min(self._lease_ttl, self._node_ttl) / 3
        while not self._stop.wait(interval):
            try:
                self.call(self._client.lease_keepalive)
            except EtcdV3Error as exc:
                logger.warning("etcd-v3: cannot refresh run lease %x: %s", self.lease_id, exc)
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._client.lease_keepalive(self._node_lease)
            except EtcdV3LeaseNotFound:
                self._register_node()
            except EtcdV3Error as exc:
                logger.warning("etcd-v3: cannot refresh node lease: %s", exc)

    def leave(self) -> None:
        """Stop refreshing and drop this node's registration; the run's keys stay."""
        self._stop.set()
        with self._lock:
            lease, self._node_lease = self._node_lease, 0
        if lease:
            try:
                self._client.lease_revoke(lease)
            except EtcdV3Error as exc:
                logger.warning("etcd-v3: cannot revoke node lease (expires by itself): %s", exc)

    def release(self) -> bool:
        """Leave, then delete the run's keys if no other agent is registered.

        Returns:
            True when this agent removed the run's keys (it was the last one).
        """
        self.leave()
        try:
            if self._client.count_prefix(self.nodes_prefix) > 0:
                return False
            self._client.delete_prefix(self.run_prefix)
            self._client.lease_revoke(self.lease_id)
        except EtcdV3Error as exc:
            logger.warning(
                "etcd-v3: cannot delete the run's keys under %s (they expire in %d s): %s",
                self.run_prefix,
                self._lease_ttl,
                exc,
            )
            return False
        logger.info("etcd-v3: last agent out; deleted the keys under %s", self.run_prefix)
        return True
