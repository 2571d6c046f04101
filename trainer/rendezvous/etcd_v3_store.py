"""A `torch.distributed.Store` kept in etcd (v3 API), the store the `etcd-v3` handler returns.

torchrun's agents use this store for their own coordination (rank assignment, MASTER_ADDR/PORT,
the exit barrier); workers talk to a TCPStore, so traffic here is a few dozen small keys per round.
Keeping it in etcd rather than in a TCPStore hosted by one agent means no agent is special: any
of them can die and the others still find the store.

Blocking reads poll with a short backoff (10 ms doubling to 100 ms) instead of using etcd's watch
stream: waits are rare and short here, and stateless requests keep endpoint failover trivial.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from trainer.rendezvous.etcd_v3_client import EtcdV3Client, KeyValue
from trainer.rendezvous.etcd_v3_lease import RunLease

_POLL_START_S = 0.01
_POLL_MAX_S = 0.1


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class EtcdV3Store(dist.Store):
    """Store keys live under `prefix` in etcd, attached to the run lease.

    Args:
        client: etcd client.
        prefix: key prefix, ending in '/'.
        lease: the run lease every key is attached to.
        timeout: default wait of `get` and `wait`.
    """

    def __init__(
        self, client: EtcdV3Client, prefix: str, lease: RunLease, timeout: timedelta
    ) -> None:
        super().__init__()  # initialises the pybind trampoline
        assert prefix.endswith("/"), prefix
        self._client = client
        self._prefix = prefix
        self._lease = lease
        self.set_timeout(timeout)

    def _key(self, key: str) -> bytes:
        return (self._prefix + key).encode()

    def set(self, key: str, value: str | bytes) -> None:
        data = _as_bytes(value)
        self._lease.call(lambda lease: self._client.put(self._key(key), data, lease=lease))

    def get(self, key: str) -> bytes:
        return self._wait_get([key], self._default_timeout())[self._key(key)].value

    def add(self, key: str, amount: int) -> int:
        """Atomically add `amount` to a base-10 integer value (0 when absent); returns the sum."""
        etcd_key = self._key(key)
        current = self._client.get(etcd_key)
        while True:
            new = (int(current.value) if current else 0) + amount
            written, _, current = self._put_if(etcd_key, str(new).encode(), current)
            if written:
                return new

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """TCPStore's semantics: set `desired` if the value is `expected` (or if the key is absent
        and `expected` is empty); return the value now stored, or `expected` if the key is absent.
        """
        etcd_key, want, new = self._key(key), _as_bytes(expected), _as_bytes(desired)
        current = self._client.get(etcd_key)
        while True:
            if current is None and want:
                return want
            if current is not None and current.value != want:
                return current.value
            written, _, current = self._put_if(etcd_key, new, current)
            if written:
                return new

    def _put_if(
        self, key: bytes, value: bytes, current: KeyValue | None
    ) -> tuple[bool, int, KeyValue | None]:
        revision = current.mod_revision if current else 0
        return self._lease.call(
            lambda lease: self._client.put_if(key, value, mod_revision=revision, lease=lease)
        )

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self._wait_get(keys, self._default_timeout() if timeout is None else timeout)

    def check(self, keys: Sequence[str]) -> bool:
        found = self._client.get_many([self._key(k) for k in keys])
        return len(found) == len(set(keys))

    def delete_key(self, key: str) -> bool:
        return self._client.delete(self._key(key)) > 0

    def num_keys(self) -> int:
        return self._client.count_prefix(self._prefix)

    def _default_timeout(self) -> timedelta:
        """The store's timeout (set_timeout; torch's barrier changes it temporarily)."""
        return self.timeout  # type: ignore[attr-defined]  # defined by the C++ base class

    def _wait_get(self, keys: Sequence[str], timeout: timedelta) -> dict[bytes, KeyValue]:
        wanted = [self._key(k) for k in keys]
        deadline = time.monotonic() + timeout.total_seconds()
        delay = _POLL_START_S
        while True:
            found = self._client.get_many(wanted)
            if all(k in found for k in wanted):
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [k for k, w in zip(keys, wanted, strict=True) if w not in found]
                raise dist.DistStoreError(
                    f"etcd-v3 store: timed out after {timeout.total_seconds():.0f} s waiting for "
                    f"keys {missing} under {self._prefix}"
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX_S)
