"""The etcd-v3 rendezvous pieces against a real etcd 3.4 with its v2 API off.

Covers the client (CAS, prefixes, leases, endpoint failover, TLS), the backend's compare-and-set
contract as torch's DynamicRendezvousHandler relies on it, the store, the run-lease lifecycle, the
options parsing and the torchrun entry point.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from rendezvous_helpers import etcd_load, local_etcd
from torch.distributed.elastic.rendezvous import RendezvousParameters

from components.etcd import local as etcd_local
from components.runtime.ports import ReservedPort
from trainer.rendezvous.etcd_v3 import handler_entry_point
from trainer.rendezvous.etcd_v3_client import (
    EtcdV3Client,
    EtcdV3ConnectionError,
    EtcdV3LeaseNotFound,
    normalize_endpoints,
    prefix_range_end,
)
from trainer.rendezvous.etcd_v3_config import EtcdV3RendezvousConfig
from trainer.rendezvous.etcd_v3_lease import RunLease, run_lease_id

needs_etcd = pytest.mark.skipif(not etcd_local.shutil.which("etcd"), reason="etcd not installed")


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not etcd_local.shutil.which("etcd"):
        pytest.skip("etcd not installed")
    with local_etcd("rdzv-unit", tmp_path_factory.mktemp("etcd-state")) as ep:
        yield ep


@pytest.fixture
def client(endpoint: str) -> Iterator[EtcdV3Client]:
    c = EtcdV3Client(endpoint, timeout=5)
    yield c
    c.delete_prefix("/")  # each test starts from an empty keyspace
    c.close()


def _params(
    run_id: str | None, endpoint: str = "127.0.0.1:2379", **conf: str
) -> RendezvousParameters:
    return RendezvousParameters("etcd-v3", endpoint, run_id or "", 2, 2, **conf)  # type: ignore[arg-type]


def _lease(client: EtcdV3Client, prefix: str, name: str = "n0", **ttl: int) -> RunLease:
    lease = RunLease(
        client,
        prefix,
        node_name=name,
        lease_ttl=ttl.get("lease_ttl", 60),
        node_ttl=ttl.get("node_ttl", 30),
    )
    lease.start()
    return lease


# -- client -----------------------------------------------------------------------------------


def test_prefix_range_end_follows_etcd() -> None:
    assert prefix_range_end(b"/a/") == b"/a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"


def test_normalize_endpoints() -> None:
    assert normalize_endpoints("h1,h2:2380, https://h3 ", tls=False) == [
        "http://h1:2379",
        "http://h2:2380",
        "https://h3:2379",
    ]
    assert normalize_endpoints(["10.0.0.1:2379"], tls=True) == ["https://10.0.0.1:2379"]
    with pytest.raises(ValueError, match="no etcd endpoint"):
        normalize_endpoints(" , ", tls=False)


def test_put_if_is_compare_and_set(client: EtcdV3Client) -> None:
    written, rev1, current = client.put_if("/k", b"a", mod_revision=0)
    assert (written, current) == (True, None)
    written, _, current = client.put_if("/k", b"b", mod_revision=0)  # exists: refused
    assert not written and current is not None and current.value == b"a"
    written, _, current = client.put_if("/k", b"b", mod_revision=rev1 - 1)  # stale revision
    assert not written and current is not None and current.mod_revision == rev1
    written, rev2, _ = client.put_if("/k", b"b", mod_revision=rev1)
    assert written and rev2 > rev1
    kv = client.get("/k")
    assert kv is not None and (kv.value, kv.mod_revision) == (b"b", rev2)


def test_prefix_ops_are_bounded(client: EtcdV3Client) -> None:
    for key in ("/run/a", "/run/b", "/run2/a", "/ru"):
        client.put(key, b"x")
    assert [kv.key for kv in client.get_prefix("/run/")] == [b"/run/a", b"/run/b"]
    assert client.count_prefix("/run/") == 2
    assert set(client.get_many(["/run/a", "/run2/a", "/missing"])) == {b"/run/a", b"/run2/a"}
    assert client.delete_prefix("/run/") == 2
    assert client.count_prefix("/") == 2


def test_lease_expiry_and_revoke_delete_keys(client: EtcdV3Client) -> None:
    lease = client.lease_grant(30)
    client.put("/leased", b"v", lease=lease)
    assert client.get("/leased").lease == lease  # type: ignore[union-attr]
    assert client.lease_keepalive(lease) == 30
    assert client.lease_revoke(lease) is True
    assert client.get("/leased") is None
    assert client.lease_revoke(lease) is False
    with pytest.raises(EtcdV3LeaseNotFound):
        client.lease_keepalive(lease)
    with pytest.raises(EtcdV3LeaseNotFound):
        client.put("/leased", b"v", lease=lease)


def test_fails_over_to_a_live_endpoint(endpoint: str) -> None:
    reserved = ReservedPort()  # nobody listens on it while the test holds it
    dead = reserved.endpoint
    client = EtcdV3Client([dead, endpoint], timeout=2)
    assert client.healthy()
    client.put("/failover", b"1")
    assert client.get("/failover").value == b"1"  # type: ignore[union-attr]
    client.delete("/failover")
    with pytest.raises(EtcdV3ConnectionError, match=dead):
        EtcdV3Client([dead], timeout=1).get("/x")
    reserved.release()


# -- backend ----------------------------------------------------------------------------------


def _backend(client: EtcdV3Client, lease: RunLease):
    from trainer.rendezvous.etcd_v3_handler import EtcdV3RendezvousBackend

    return EtcdV3RendezvousBackend(client, lease.run_prefix + "state", lease)


def test_backend_cas_contract(client: EtcdV3Client) -> None:
    lease = _lease(client, "/rdzv/cas/")
    backend = _backend(client, lease)
    assert backend.name == "etcd-v3"
    assert backend.get_state() is None
    # No token: create only if absent.
    state, token, ok = backend.set_state(b"s1")  # type: ignore[misc]
    assert (state, ok) == (b"s1", True)
    assert backend.get_state() == (b"s1", token)
    assert backend.set_state(b"other") == (b"s1", token, False)
    # A stale token loses and gets the current state back; the current token wins.
    assert backend.set_state(b"s2", token - 1) == (b"s1", token, False)
    state, token2, ok = backend.set_state(b"s2", token)  # type: ignore[misc]
    assert (state, ok) == (b"s2", True) and token2 > token
    assert backend.set_state(b"s3", token) == (b"s2", token2, False)
    # A token that is not ours cannot match.
    assert backend.set_state(b"s3", "bogus") == (b"s2", token2, False)
    # Every key of the run hangs on the run lease.
    assert client.get("/rdzv/cas/state").lease == lease.lease_id  # type: ignore[union-attr]
    # State gone (e.g. expired): a token-based write reports "no state".
    client.delete("/rdzv/cas/state")
    assert backend.set_state(b"s4", token2) is None
    lease.release()


def test_backend_concurrent_writers_never_both_win(client: EtcdV3Client) -> None:
    lease = _lease(client, "/rdzv/race/")
    backends = [_backend(EtcdV3Client(client.endpoints), lease) for _ in range(4)]
    _, token, _ = backends[0].set_state(b"base")  # type: ignore[misc]
    wins: list[bytes] = []

    def write(i: int) -> None:
        result = backends[i].set_state(f"w{i}".encode(), token)
        if result is not None and result[2]:
            wins.append(result[0])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert backends[0].get_state()[0] == wins[0]  # type: ignore[index]
    lease.release()


def test_racing_writers_back_off_so_writes_grow_linearly(client: EtcdV3Client) -> None:
    """32 agents add themselves to the state at the same instant, retrying as torch does.

    Each retry works on the state its lost race returned. Without backoff every round had one
    winner and all the others retried together: about N/2 writes per agent, N^2/2 in all. With
    it, writes per agent stay a small constant. Counted by etcd (raft proposals, failed
    compare-and-sets included), not timed.
    """
    from trainer.rendezvous.etcd_v3_handler import EtcdV3RendezvousBackend

    agents = 32
    lease = _lease(client, "/rdzv/storm/")
    backends = [
        EtcdV3RendezvousBackend(
            EtcdV3Client(client.endpoints), "/rdzv/storm/state", lease, contenders=agents
        )
        for _ in range(agents)
    ]
    start = threading.Barrier(agents)

    def join(i: int) -> None:
        start.wait()
        current = backends[i].get_state()
        while True:
            members = current[0].split(b",") if current else []
            token = current[1] if current else None
            result = backends[i].set_state(b",".join([*members, b"%d" % i]), token)
            assert result is not None
            if result[2]:
                return
            current = result[:2]

    before = etcd_load(client.endpoints[0].removeprefix("http://"))
    threads = [threading.Thread(target=join, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writes = (
        etcd_load(client.endpoints[0].removeprefix("http://"))["proposals"] - before["proposals"]
    )

    final = backends[0].get_state()
    assert final is not None
    assert sorted(final[0].split(b",")) == sorted(b"%d" % i for i in range(agents))
    # Measured at load ~20 on 2 cores: 113 writes with backoff, 416 without.
    assert writes <= 6 * agents, f"{writes} etcd writes for {agents} agents"
    lease.release()


# -- store ------------------------------------------------------------------------------------


def _store(client: EtcdV3Client, lease: RunLease, timeout_s: float = 5):
    from trainer.rendezvous.etcd_v3_store import EtcdV3Store

    return EtcdV3Store(client, lease.run_prefix + "store/", lease, timedelta(seconds=timeout_s))


def test_store_semantics(client: EtcdV3Client) -> None:
    lease = _lease(client, "/rdzv/store/")
    store = _store(client, lease)
    store.set("a", "1")
    store.set("b", b"\x00\xff")
    assert store.get("a") == b"1" and store.get("b") == b"\x00\xff"
    assert store.check(["a", "b"]) and not store.check(["a", "zz"])
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3
    # compare_set: TCPStore semantics.
    assert store.compare_set("c", "", "first") == b"first"
    assert store.compare_set("c", "wrong", "x") == b"first"
    assert store.compare_set("c", "first", "second") == b"second"
    assert store.compare_set("absent", "expected", "x") == b"expected"
    assert store.num_keys() == 4
    assert store.delete_key("a") and not store.delete_key("a")
    store.set_timeout(timedelta(milliseconds=300))
    with pytest.raises(dist.DistStoreError, match="timed out"):
        store.get("never")
    with pytest.raises(dist.DistStoreError):
        store.wait(["never"], timedelta(milliseconds=100))
    # torch wraps it in a PrefixStore per round; multi_get/multi_set go through it.
    prefixed = dist.PrefixStore("round.0", store)
    prefixed.multi_set(["x", "y"], ["1", "2"])
    assert prefixed.multi_get(["x", "y"]) == [b"1", b"2"]
    assert client.get("/rdzv/store/store/round.0/x").lease == lease.lease_id  # type: ignore[union-attr]
    lease.release()


def test_store_get_blocks_until_set_and_add_is_atomic(client: EtcdV3Client) -> None:
    lease = _lease(client, "/rdzv/block/")
    store = _store(client, lease)
    threading.Timer(0.3, store.set, args=("late", "here")).start()
    assert store.get("late") == b"here"

    def add_many() -> None:
        own = _store(EtcdV3Client(client.endpoints), lease)
        for _ in range(10):
            own.add("counter", 1)

    threads = [threading.Thread(target=add_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get("counter") == b"40"
    lease.release()


# -- run lease ---------------------------------------------------------------------------------


def test_last_agent_out_deletes_the_run(client: EtcdV3Client) -> None:
    prefix = "/rdzv/lifecycle/"
    first, second = _lease(client, prefix, "a"), _lease(client, prefix, "b")
    assert first.lease_id == second.lease_id == run_lease_id(prefix)
    client.put(prefix + "state", b"s", lease=first.lease_id)
    client.put("/rdzv/other-run/state", b"keep")
    assert client.count_prefix(prefix + "nodes/") == 2
    assert first.release() is False  # "b" is still in: keep everything
    assert client.get(prefix + "state") is not None
    assert client.count_prefix(prefix + "nodes/") == 1
    assert second.release() is True
    assert client.count_prefix(prefix) == 0
    assert client.get("/rdzv/other-run/state") is not None  # other runs untouched
    with pytest.raises(EtcdV3LeaseNotFound):
        client.lease_keepalive(run_lease_id(prefix))


def test_run_lease_is_regranted_after_expiry(client: EtcdV3Client) -> None:
    lease = _lease(client, "/rdzv/regrant/")
    client.lease_revoke(lease.lease_id)  # as if every agent had been gone for lease_ttl
    lease.call(lambda lid: client.put("/rdzv/regrant/state", b"s", lease=lid))
    assert client.get("/rdzv/regrant/state").lease == lease.lease_id  # type: ignore[union-attr]
    lease.release()


def test_crashed_agent_registration_expires(client: EtcdV3Client) -> None:
    prefix = "/rdzv/crash/"
    crashed = _lease(client, prefix, "crashed", node_ttl=3)
    crashed._stop.set()  # stops refreshing, like a SIGKILLed agent
    survivor = _lease(client, prefix, "survivor")
    import time

    deadline = time.monotonic() + 60  # etcd expires the 3 s lease; generous for a loaded machine
    while client.count_prefix(prefix + "nodes/") > 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert survivor.release() is True
    assert client.count_prefix(prefix) == 0


# -- options and entry point -------------------------------------------------------------------


def test_config_refuses_default_run_id_and_reports_all_errors() -> None:
    with pytest.raises(ValueError) as info:
        EtcdV3RendezvousConfig.from_params(
            _params("none", endpoint="", read_timeout="soon", protocol="gopher", key="k.pem")
        )
    message = str(info.value)
    for fragment in (
        "--rdzv-id is missing",
        "--rdzv-endpoint is missing",
        "read_timeout",
        "protocol",
        "needs cert=",
    ):
        assert fragment in message
    with pytest.raises(ValueError, match="must not contain '/'"):
        EtcdV3RendezvousConfig.from_params(_params("a/b"))


def test_config_accepts_etcd_v2_spellings_and_warns_on_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        config = EtcdV3RendezvousConfig.from_params(
            _params(
                "run-7",
                endpoint="e1:2379,e2:2379",
                ca_cert="/tls/ca.crt",
                ssl_cert="/tls/c.crt",
                ssl_cert_key="/tls/c.key",
                key_prefix="/jobs",
                lease_ttl="120",
                join_timeout="60",
                colour="blue",
            )
        )
    assert config.endpoints == ("e1:2379", "e2:2379")
    assert (config.cacert, config.cert, config.key) == ("/tls/ca.crt", "/tls/c.crt", "/tls/c.key")
    assert config.run_prefix == "/jobs/run-7/" and config.lease_ttl == 120
    assert "colour" in caplog.text and "join_timeout" not in caplog.text
    https = EtcdV3RendezvousConfig.from_params(_params("r", endpoint="e1", protocol="https"))
    assert https.endpoints == ("https://e1",)


def test_entry_point_is_lazy_and_registers_with_torch() -> None:
    """torch loads the entry point while its rendezvous package initialises: check in a clean
    interpreter that our module does not import that package, and that torch registers it."""
    code = (
        "import sys, trainer.rendezvous.etcd_v3 as m\n"
        "assert 'torch.distributed.elastic.rendezvous' not in sys.modules, 'eager torch import'\n"
        "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r\n"
        "assert r._registry['etcd-v3'] is m.create_rdzv_handler\n"
        "assert {'etcd-v2', 'c10d'} <= set(r._registry)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "out of tree" not in result.stderr  # torch's warning when a plugin fails to load


@needs_etcd
def test_handler_from_torch_registry_connects(
    endpoint: str, client: EtcdV3Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)

    run_id = f"reg-{uuid.uuid4().hex[:6]}"
    handler = get_rendezvous_handler(
        RendezvousParameters(
            "etcd-v3", endpoint, run_id, 1, 1, join_timeout="30", last_call_timeout="1"
        )
    )
    assert handler.get_backend() == "etcd-v3" and handler.get_run_id() == run_id
    # Restarts are unreliable with torch 2.13's shared agent store: the handler opts out.
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert handler.use_agent_store is False
    info = handler.next_rendezvous()  # a world of one node completes at once
    assert (info.rank, info.world_size) == (0, 1)
    info.store.set("k", "v")
    assert info.store.get("k") == b"v"
    assert client.count_prefix(f"/torch/elastic/rendezvous/{run_id}/") > 0
    assert handler.shutdown()
    assert client.count_prefix(f"/torch/elastic/rendezvous/{run_id}/") == 0


@needs_etcd
def test_sixteen_agents_each_get_a_rank(
    endpoint: str, client: EtcdV3Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 handlers join one round at once (as 16 torchrun agents would) and all get ranks."""
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    agents = 16
    run_id = f"many-{uuid.uuid4().hex[:6]}"
    params = RendezvousParameters("etcd-v3", endpoint, run_id, agents, agents, join_timeout="120")
    handlers = [get_rendezvous_handler(params) for _ in range(agents)]
    results: list[object] = []

    def join(handler: Any) -> None:
        try:
            info = handler.next_rendezvous()
            results.append((info.rank, info.world_size))
        except Exception as exc:  # reported by the assertion below
            results.append(exc)

    def run_all(target: Callable[[Any], object]) -> None:
        threads = [threading.Thread(target=target, args=(h,)) for h in handlers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run_all(join)
    run_all(lambda handler: handler.shutdown())
    assert sorted(results, key=str) == sorted(((r, agents) for r in range(agents)), key=str)
    assert client.count_prefix(f"/torch/elastic/rendezvous/{run_id}/") == 0


def test_heartbeat_interval_grows_with_the_number_of_agents() -> None:
    from trainer.rendezvous.etcd_v3_handler import keep_alive_interval

    assert keep_alive_interval(_params("r")) == 5  # torch's default for small worlds
    big = RendezvousParameters("etcd-v3", "h:1", "r", 256, 256)
    assert keep_alive_interval(big) == 26  # heartbeats stay at ~10 writes/s
    explicit = RendezvousParameters("etcd-v3", "h:1", "r", 256, 256, keep_alive_interval="9")
    assert keep_alive_interval(explicit) == 9


def test_handler_refuses_missing_run_id() -> None:
    with pytest.raises(ValueError, match="--rdzv-id is missing"):
        handler_entry_point()(_params("none"))


# -- TLS --------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """etcd serving https and requiring client certificates, with a throwaway CA."""
    import shutil

    if not (shutil.which("etcd") and shutil.which("openssl")):
        pytest.skip("etcd or openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=d,
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=d,
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.crt",
            cwd=d,
        )
    reserved, reserved_peer = ReservedPort(), ReservedPort()  # released once etcd listens
    port, peer = reserved.port, reserved_peer.port
    url = f"https://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            "etcd",
            f"--data-dir={d / 'data'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            f"--cert-file={d / 'server.crt'}",
            f"--key-file={d / 'server.key'}",
            f"--trusted-ca-file={d / 'ca.crt'}",
            "--client-cert-auth=true",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = EtcdV3Client(
            url, ca_cert=str(d / "ca.crt"), cert=str(d / "client.crt"), key=str(d / "client.key")
        )
        import time

        deadline = time.monotonic() + 60  # a failsafe: it returns as soon as etcd is healthy
        while not client.healthy():
            assert time.monotonic() < deadline and proc.poll() is None, "TLS etcd did not start"
            time.sleep(0.1)
        reserved.release()
        reserved_peer.release()
        yield f"127.0.0.1:{port}", d
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tls_with_client_certificate(tls_etcd: tuple[str, Path]) -> None:
    endpoint, d = tls_etcd
    config = EtcdV3RendezvousConfig.from_params(
        _params(
            "tls-run",
            endpoint=endpoint,
            cacert=str(d / "ca.crt"),
            cert=str(d / "client.crt"),
            key=str(d / "client.key"),
        )
    )
    client = EtcdV3Client(config.endpoints, ca_cert=config.cacert, cert=config.cert, key=config.key)
    assert client.endpoints == [f"https://{endpoint}"]  # TLS files imply https
    lease = _lease(client, config.run_prefix)
    backend = _backend(client, lease)
    assert backend.set_state(b"over-tls")[2]  # type: ignore[index]
    assert lease.release()
    # Without a client certificate etcd refuses the connection.
    with pytest.raises(EtcdV3ConnectionError):
        EtcdV3Client(endpoint, ca_cert=str(d / "ca.crt"), timeout=3).get("/x")
