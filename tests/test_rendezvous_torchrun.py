"""End-to-end: two torchrun agents (2 workers each, gloo, CPU) rendezvous and all-reduce.

Real etcd 3.4 (`/usr/bin/etcd`, v2 API off unless the etcd-v2 backend needs it), real torchrun
processes, real collectives. Each case checks every rank's result and, for etcd, that the run left
no key behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from rendezvous_helpers import agent_logs, local_etcd, start_agents, wait_agents

from components.etcd import local as etcd_local
from components.runtime.ports import ReservedPort
from trainer.rendezvous.etcd_v3_client import EtcdV3Client
from trainer.rendezvous.etcd_v3_config import DEFAULT_KEY_PREFIX
from trainer.rendezvous.etcd_v3_lease import run_lease_id

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not etcd_local.shutil.which("etcd"), reason="etcd binary not installed"),
]

WORLD = 4
EXPECTED_SUM = float(sum(range(1, WORLD + 1)))


def _results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _assert_all_ranks(out: Path) -> list[dict]:
    results = _results(out)
    assert sorted(r["rank"] for r in results) == list(range(WORLD)), agent_logs(out)
    assert {r["sum"] for r in results} == {EXPECTED_SUM}
    assert {r["world_size"] for r in results} == {WORLD}
    assert sorted({r["group_rank"] for r in results}) == [0, 1]
    assert len({r["master"] for r in results}) == 1  # one process group, one master
    return results


def _no_keys_left(endpoint: str, rdzv_id: str) -> None:
    client = EtcdV3Client(endpoint)
    run_prefix = f"{DEFAULT_KEY_PREFIX}/{rdzv_id}/"
    assert client.get_prefix(run_prefix) == []
    assert client.count_prefix("/") == 0  # nothing else either: the etcd is this test's alone
    # The shared run lease is revoked too, not merely left to expire.
    listed = client._post("/v3/lease/leases", {}).get("leases") or []
    assert str(run_lease_id(run_prefix)) not in {item["ID"] for item in listed}


@pytest.mark.parametrize("backend", ["etcd-v3", "etcd-v2", "c10d"])
def test_two_agents_rendezvous_and_all_reduce(backend: str, tmp_path: Path) -> None:
    rdzv_id = f"test-{backend}-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    if backend == "c10d":
        # The agent whose address matches the endpoint hosts the store: on loopback one binds,
        # the other connects.
        with ReservedPort() as port:  # the hosting agent's store takes it over
            rcs = wait_agents(
                start_agents(
                    backend=backend, endpoint=f"127.0.0.1:{port}", rdzv_id=rdzv_id, out=out
                ),
                180,
            )
        assert rcs == [0, 0], agent_logs(out)
        _assert_all_ranks(out)
        return
    with local_etcd(rdzv_id, tmp_path / "state", enable_v2=backend == "etcd-v2") as endpoint:
        if backend == "etcd-v3":
            # Prove the v2 API really is off: etcd-v3 must not depend on it.
            assert (
                EtcdV3Client(endpoint)._session.get(f"http://{endpoint}/v2/keys").status_code == 404
            )
        procs = start_agents(backend=backend, endpoint=endpoint, rdzv_id=rdzv_id, out=out)
        rcs = wait_agents(procs, 180)
        assert rcs == [0, 0], agent_logs(out)
        _assert_all_ranks(out)
        if backend == "etcd-v3":
            _no_keys_left(endpoint, rdzv_id)


def test_worker_killed_mid_run_group_restarts_and_finishes(tmp_path: Path) -> None:
    """SIGKILL one worker after the first collective; --max-restarts 1 brings the group back.

    The etcd-v3 handler defaults TORCH_DISABLE_SHARE_RDZV_TCP_STORE to 1 (with torch 2.13's shared
    agent TCPStore the restarted round hung or failed in our trials, pytorch/pytorch#135712; see
    docs/rendezvous.md), so the test sets nothing and checks that default.
    """
    rdzv_id = f"test-restart-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    with local_etcd(rdzv_id, tmp_path / "state") as endpoint:
        procs = start_agents(
            backend="etcd-v3",
            endpoint=endpoint,
            rdzv_id=rdzv_id,
            out=out,
            max_restarts=1,
            env={"RDZV_TEST_HOLD": "1"},
        )
        try:
            deadline = time.monotonic() + 120
            while len(list(out.glob("pid.rank*"))) < WORLD:
                assert time.monotonic() < deadline, agent_logs(out)
                assert all(p.poll() is None for p in procs), agent_logs(out)
                time.sleep(0.2)
            (out / "killed").touch()  # workers started from now on run to the end
            os.kill(int((out / "pid.rank3").read_text()), signal.SIGKILL)
        finally:
            rcs = wait_agents(procs, 180)
        assert rcs == [0, 0], agent_logs(out)
        results = _assert_all_ranks(out)
        # The agent whose worker died spent its one restart; the other restarted its workers
        # for the new round without counting a failure.
        assert sorted(r["restart_count"] for r in results) == [0, 0, 1, 1]
        _no_keys_left(endpoint, rdzv_id)
