"""torch-side pieces of the `etcd-v3` rendezvous: the state backend and the handler.

torch's DynamicRendezvousHandler does the rendezvous protocol (join, last call, heartbeats,
elastic membership); it only needs a backend that stores one opaque state blob with
compare-and-set. Here that is one etcd key written through a v3 transaction whose compare is the
key's `mod_revision` (the fencing token), so concurrent agents never overwrite each other.

Imported lazily by `trainer.rendezvous.etcd_v3`, the entry point (see there why); the options
come from `etcd_v3_config`, below both.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import random
import socket
import time
import uuid
from datetime import timedelta

from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousTimeout,
    Token,
)

from trainer.rendezvous.etcd_v3_client import EtcdV3Client, EtcdV3Error
from trainer.rendezvous.etcd_v3_config import BACKEND_NAME, EtcdV3RendezvousConfig
from trainer.rendezvous.etcd_v3_lease import RunLease
from trainer.rendezvous.etcd_v3_store import EtcdV3Store

logger = logging.getLogger(__name__)

# A lost compare-and-set race on the state key waits a random time in [0, window), window =
# contenders x _WRITE_S x 2^(losses in a row - 1), at most _BACKOFF_MAX_S. _WRITE_S is about one
# state write through the gateway on an idle machine; slower etcds cost a loss or two more.
_WRITE_S = 0.005
_BACKOFF_MAX_S = 30.0


class EtcdV3RendezvousBackend(RendezvousBackend):
    """Holds the rendezvous state in one etcd key; the fencing token is its mod revision.

    Every agent writes that one key (join, heartbeats, close), so N agents joining at once race on
    it. torch retries a lost race at once with the state it got back, after spreading the first
    attempts over a fixed 0.3 s: once N writes take longer than that, each round has one winner
    and N-1 losers that all retry together, O(N^2) transactions in all, each a raft proposal (a
    compare-and-set that fails is still a write request), and heartbeats join the storm once it
    lasts past their interval. So a lost race backs off like Ethernet, with a first window sized
    for N agents (`contenders` x 5 ms, doubling on each further loss), and then returns the state
    as it is after the wait, so the next attempt works on fresh state. The races an agent loses
    then depend on how slow a write is, not on N: from 8 to 64 agents the writes per agent grew
    x2.2 instead of x60 (`benchmarks/rendezvous_bench.py`, docs/performance.md).

    Args:
        client: etcd client.
        key: the state key.
        lease: the run lease the key is attached to.
        contenders: how many agents may write at once (torchrun's --nnodes maximum).
    """

    def __init__(
        self, client: EtcdV3Client, key: str, lease: RunLease, contenders: int = 1
    ) -> None:
        self._client = client
        self._key = key.encode()
        self._lease = lease
        self._contenders = max(1, contenders)
        self._losses = 0  # compare-and-set races lost in a row

    @property
    def name(self) -> str:
        return BACKEND_NAME

    def get_state(self) -> tuple[bytes, Token] | None:
        try:
            kv = self._client.get(self._key)
        except EtcdV3Error as exc:
            raise RendezvousConnectionError(f"etcd-v3 rendezvous: {exc}") from exc
        return None if kv is None else (kv.value, kv.mod_revision)

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        if token is not None and not isinstance(token, int):
            # Not one of our tokens (revisions are ints): it cannot match, so report what is there.
            existing = self.get_state()
            return None if existing is None else (*existing, False)
        # mod_revision 0 in the compare means "the key does not exist": create-if-absent.
        revision = token or 0
        try:
            written, new_revision, current = self._lease.call(
                lambda lease: self._client.put_if(
                    self._key, state, mod_revision=revision, lease=lease
                )
            )
        except EtcdV3Error as exc:
            raise RendezvousConnectionError(f"etcd-v3 rendezvous: {exc}") from exc
        if written:
            self._losses = 0
            return state, new_revision, True
        if current is None:
            return None
        self._losses += 1
        window = self._contenders * _WRITE_S * 2 ** (self._losses - 1)
        time.sleep(random.uniform(0, min(window, _BACKOFF_MAX_S)))
        latest = self.get_state()
        return None if latest is None else (*latest, False)


class EtcdV3RendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic rendezvous plus the run-lease lifecycle: keys go away with the last agent."""

    _run_lease: RunLease | None = None

    def attach_lease(self, lease: RunLease) -> None:
        self._run_lease = lease
        # An agent killed by a signal skips shutdown() on purpose (torch keeps the rendezvous
        # open for other agents): then only drop this node's registration at exit.
        atexit.register(lease.leave)

    def shutdown(self) -> bool:
        try:
            return super().shutdown()
        finally:
            if self._run_lease is not None:
                self._run_lease.release()


# torch 2.13 shares the rank-0 agent's TCPStore with the workers by default; after a worker crash
# the restarted round then hung or failed in every trial we ran (pytorch/pytorch#135712), while
# with sharing off every trial recovered. So this backend turns sharing off unless the user chose.
SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


# torch's agents write their heartbeat into the one state key every keep_alive_interval (torch's
# default 5 s): N/5 writes/s, each of a blob that grows with N. At a few hundred agents that alone
# saturates etcd and the agents' CPUs, and joins starve behind heartbeats. So unless the user
# sets keep_alive_interval, it grows with --nnodes to keep heartbeats under this rate; a dead
# agent is then noticed after keep_alive_max_attempt intervals (3 x 26 s at 256 agents).
_HEARTBEAT_WRITES_PER_S = 10
_TORCH_KEEP_ALIVE_S = 5


def keep_alive_interval(params: RendezvousParameters) -> int:
    """Seconds between an agent's heartbeats: the user's, else torch's 5 s up to 50 agents, else
    `max_nodes / _HEARTBEAT_WRITES_PER_S`."""
    explicit = params.get_as_int("keep_alive_interval")
    if explicit:
        return explicit
    return max(_TORCH_KEEP_ALIVE_S, math.ceil(params.max_nodes / _HEARTBEAT_WRITES_PER_S))


def _timeout(params: RendezvousParameters, name: str) -> timedelta | None:
    seconds = params.get_as_int(f"{name}_timeout")
    return None if seconds is None else timedelta(seconds=seconds)


def create_handler(
    config: EtcdV3RendezvousConfig, params: RendezvousParameters
) -> EtcdV3RendezvousHandler:
    """Connect to etcd, join the run lease and build the handler.

    Raises:
        RendezvousConnectionError: no etcd endpoint answered.
    """
    if os.environ.setdefault(SHARE_STORE_ENV, "1") == "1":
        logger.info("etcd-v3 rendezvous: %s=1 (workers get their own TCPStore)", SHARE_STORE_ENV)
    client = EtcdV3Client(
        config.endpoints,
        ca_cert=config.cacert,
        cert=config.cert,
        key=config.key,
        timeout=config.read_timeout,
    )
    node_name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    lease = RunLease(
        client,
        config.run_prefix,
        node_name=node_name,
        lease_ttl=config.lease_ttl,
        node_ttl=config.node_ttl,
    )
    try:
        lease.start()
    except EtcdV3Error as exc:
        raise RendezvousConnectionError(
            f"etcd-v3 rendezvous: {exc} (is etcd running at {','.join(client.endpoints)}?)"
        ) from exc
    logger.info(
        "etcd-v3 rendezvous: run %r at %s, keys under %s (lease %x, ttl %d s)",
        config.run_id,
        ",".join(client.endpoints),
        config.run_prefix,
        lease.lease_id,
        config.lease_ttl,
    )
    backend = EtcdV3RendezvousBackend(
        client, config.run_prefix + "state", lease, contenders=params.max_nodes
    )
    store = EtcdV3Store(
        client, config.run_prefix + "store/", lease, timedelta(seconds=config.read_timeout)
    )
    timeout = RendezvousTimeout(
        join=_timeout(params, "join"),
        last_call=_timeout(params, "last_call"),
        close=_timeout(params, "close"),
        heartbeat=_timeout(params, "heartbeat"),
    )
    handler = EtcdV3RendezvousHandler.from_backend(
        config.run_id,
        store,
        backend,
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        timeout,
        keep_alive_interval=keep_alive_interval(params),
        keep_alive_max_attempt=params.get_as_int("keep_alive_max_attempt", 3) or 3,
    )
    handler.attach_lease(lease)
    return handler
