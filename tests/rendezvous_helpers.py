"""Helpers shared by the rendezvous tests: a real local etcd and torchrun agent processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests

from components.etcd import local as etcd_local

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("rendezvous_allreduce_worker.py")


@contextlib.contextmanager
def local_etcd(run_id: str, root: Path, *, enable_v2: bool = False) -> Iterator[str]:
    """A real etcd for the duration of the block; stopped and its data removed afterwards."""
    endpoint = etcd_local.start(run_id, root=root, enable_v2=enable_v2)
    try:
        yield endpoint
    finally:
        etcd_local.stop(run_id, root=root)


# gRPC methods a rendezvous uses (the JSON gateway forwards each request as one of them).
ETCD_METHODS = ("Range", "Txn", "Put", "DeleteRange", "LeaseGrant", "LeaseKeepAlive", "LeaseRevoke")
_HANDLED = re.compile(r'^grpc_server_handled_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\S+)$', re.M)
_GAUGES = {
    "proposals": "etcd_server_proposals_committed_total",
    "revision": "etcd_debugging_mvcc_current_revision",
    "keys": "etcd_debugging_mvcc_keys_total",
    "watchers": "etcd_debugging_mvcc_watcher_total",
    "cpu_ms": "process_cpu_seconds_total",
}


def etcd_load(endpoint: str) -> dict[str, int]:
    """etcd's own counters from its /metrics: requests handled per gRPC method (ETCD_METHODS),
    raft proposals committed (every write, including a compare-and-set that failed), the
    revision (successful writes), keys, watchers and etcd's CPU time in ms."""
    text = requests.get(f"http://{endpoint}/metrics", timeout=10).text
    load = dict.fromkeys(ETCD_METHODS, 0)
    for method, value in _HANDLED.findall(text):
        if method in load:
            load[method] += int(float(value))
    for name, metric in _GAUGES.items():
        found = re.search(rf"^{metric} (\S+)$", text, re.M)
        scale = 1000 if name == "cpu_ms" else 1
        load[name] = int(float(found.group(1)) * scale) if found else -1
    return load


def start_agents(
    *,
    backend: str,
    endpoint: str,
    rdzv_id: str,
    out: Path,
    nnodes: int = 2,
    nproc_per_node: int = 2,
    max_restarts: int = 0,
    rdzv_conf: str = "",
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start `nnodes` torchrun agents (separate processes, own sessions) running the worker."""
    out.mkdir(parents=True, exist_ok=True)
    agent_env = {**os.environ, "RDZV_TEST_OUT": str(out), "OMP_NUM_THREADS": "1", **(env or {})}
    procs = []
    for node in range(nnodes):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}",
            f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.5",
        ]
        if rdzv_conf:
            cmd.append(f"--rdzv-conf={rdzv_conf}")
        cmd.append(str(WORKER))
        log = open(out / f"agent{node}.log", "wb")  # noqa: SIM115 - closed when the agent ends
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=REPO,
                env=agent_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()
    return procs


def wait_agents(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    """Exit codes of all agents; kills every agent's process group if they overrun `timeout`."""
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    finally:
        kill_agents(procs)


def kill_agents(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def agent_logs(out: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(out.glob("agent*.log"))
    )
