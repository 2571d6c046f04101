"""Rendezvous benchmarks: many lightweight agents against one etcd, and 2x2 torchrun end to end.

    .venv/bin/python benchmarks/rendezvous_bench.py                     # --mode agents
    .venv/bin/python benchmarks/rendezvous_bench.py --agents 8 64 256 --repeats 3
    .venv/bin/python benchmarks/rendezvous_bench.py --mode torchrun [--backend etcd-v3|etcd-v2|c10d]

`--mode agents` (the scaling test): for each N in `--agents`, start a fresh per-run etcd (as
`components/etcd/local.py` starts it for a local run), spread N `etcd-v3` rendezvous handlers
over `--procs` processes (threads inside each, as N torchrun agents would run them), create them
all (each grants/joins the run lease and registers its node), then release them at once into
`next_rendezvous()` and wait until every one has its rank and the world size (including the
MASTER_ADDR/PORT exchange through the store that torchrun's agents do). Reported per N:
`all_joined_s` (release -> last agent has rank and world size), the CPU the agents and etcd spent
(`agents_cpu_s`, `etcd_cpu_s`) and etcd's load over that phase from its own /metrics: requests
by gRPC method (`requests_per_agent`, `txn_per_agent`, `range_per_agent`), `writes_per_agent`
(raft proposals: every write, failed compare-and-sets included), revisions, keys and watchers.
Counts depend on the machine's speed far less than wall time does, so their growth with N is the
scaling figure: `writes_per_agent_growth` and `requests_per_agent_growth` compare the largest N
with the smallest (1.0: the total load grows linearly).

`--mode torchrun` (end to end): each repeat starts a fresh local etcd (none for c10d), launches
`--nnodes` `torchrun` agents as processes (gloo, CPU) and has every worker record the time right
after its first all-reduce. `all_joined_s` there includes starting Python and importing torch.

Every figure is the median over `--repeats`; the last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


# -- agents mode ------------------------------------------------------------------------------


def host_agents(endpoint: str, run_id: str, count: int, world: int) -> None:
    """A process hosting `count` handlers of a `world`-agent rendezvous (driven over stdin/out).

    Prints `READY` once its handlers exist, waits for `GO`, runs every handler's
    next_rendezvous() in a thread, prints one JSON line (per handler: rank, world size, time
    joined; and this process's CPU seconds over the rendezvous), then waits for `STOP` and shuts
    them down.
    """
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    params = RendezvousParameters("etcd-v3", endpoint, run_id, world, world, join_timeout="300")
    handlers = [get_rendezvous_handler(params) for _ in range(count)]
    print("READY", flush=True)
    assert sys.stdin.readline().strip() == "GO"
    results: list[dict[str, Any]] = [{} for _ in handlers]
    cpu_start = time.process_time()

    def join(index: int) -> None:
        try:
            info = handlers[index].next_rendezvous()
            results[index] = {"rank": info.rank, "world": info.world_size, "t": time.time()}
        except Exception as exc:  # reported to the parent, which fails the run
            results[index] = {"error": f"{type(exc).__name__}: {exc}"}

    threads = [threading.Thread(target=join, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"agents": results, "cpu_s": time.process_time() - cpu_start}), flush=True)
    assert sys.stdin.readline().strip() == "STOP"
    for handler in handlers:
        handler.shutdown()


def _tell(hosts: list[subprocess.Popen[str]], word: str) -> None:
    """Send `word` to every agent host; a host that died is reported by its exit code instead."""
    for host in hosts:
        assert host.stdin
        with contextlib.suppress(BrokenPipeError):
            host.stdin.write(word + "\n")
            host.stdin.flush()


def run_agents(agents: int, procs: int) -> dict[str, Any]:
    """One rendezvous of `agents` handlers over `procs` processes against a fresh etcd."""
    from rendezvous_helpers import ETCD_METHODS, etcd_load

    from components.etcd import local as etcd_local

    run_id = f"bench-a{agents}-{uuid.uuid4().hex[:8]}"
    procs = max(1, min(procs, agents))
    shares = [agents // procs + (i < agents % procs) for i in range(procs)]
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = etcd_local.start(run_id, root=tmp)
        hosts: list[subprocess.Popen[str]] = []
        try:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
            for share in shares:
                cmd = [sys.executable, __file__, "--host", str(share), "--endpoint", endpoint,
                       "--run-id", run_id, "--world", str(agents)]  # fmt: skip
                hosts.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              text=True, cwd=REPO, env=env))  # fmt: skip
            for host in hosts:
                line = host.stdout.readline() if host.stdout else ""
                if line.strip() != "READY":
                    raise SystemExit(f"agent host failed to start (exit {host.wait()})")
            before = etcd_load(endpoint)
            start = time.time()
            _tell(hosts, "GO")
            results, agents_cpu = [], 0.0
            for host in hosts:
                assert host.stdout
                reply = json.loads(host.stdout.readline() or '{"agents": [], "cpu_s": 0}')
                results.extend(reply["agents"])
                agents_cpu += reply["cpu_s"]
            after = etcd_load(endpoint)
            _tell(hosts, "STOP")
            codes = [host.wait(timeout=120) for host in hosts]
        finally:
            for host in hosts:
                if host.poll() is None:
                    host.kill()
                    host.wait()
            etcd_local.stop(run_id, root=tmp)
    errors = [r["error"] for r in results if "error" in r]
    if errors or len(results) != agents or codes != [0] * procs:
        raise SystemExit(f"rendezvous of {agents} agents failed: {errors[:3]} exit codes {codes}")
    ranks = sorted(r["rank"] for r in results)
    if ranks != list(range(agents)) or {r["world"] for r in results} != {agents}:
        raise SystemExit(f"rendezvous of {agents} agents gave ranks {ranks[:8]}... worlds "
                         f"{sorted({r['world'] for r in results})}")  # fmt: skip
    counters = (*ETCD_METHODS, "revision", "proposals", "cpu_ms")
    load = {key: after[key] - before[key] for key in counters}
    requests_total = sum(load[m] for m in ETCD_METHODS)
    elapsed = max(r["t"] for r in results) - start
    return {
        "all_joined_s": round(elapsed, 3),
        "agents_cpu_s": round(agents_cpu, 2),
        "etcd_cpu_s": round(load["cpu_ms"] / 1000, 2),
        "requests_per_agent": round(requests_total / agents, 2),
        "txn_per_agent": round(load["Txn"] / agents, 2),
        "writes_per_agent": round(load["proposals"] / agents, 2),
        "range_per_agent": round(load["Range"] / agents, 2),
        "requests_per_s": round(requests_total / elapsed, 1),
        "revisions": load["revision"],
        "proposals": load["proposals"],
        "keys": after["keys"],
        "watchers": after["watchers"],
        "requests": {m: load[m] for m in ETCD_METHODS if load[m]},
    }


# -- torchrun mode ----------------------------------------------------------------------------


def worker() -> None:
    """Runs under torchrun: join the process group, all-reduce once, record the time."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    joined = time.time()
    assert value.item() == dist.get_world_size()
    out = Path(os.environ["RDZV_BENCH_OUT"])
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"joined": joined}))
    dist.destroy_process_group()


def run_torchrun(backend: str, nnodes: int, nproc: int) -> dict[str, float]:
    """etcd start -> every rank of `nnodes` x `nproc` torchrun workers has all-reduced once."""
    from components.etcd import local as etcd_local
    from components.runtime.ports import ReservedPort

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.time()
        if backend == "c10d":
            store_port = (
                ReservedPort()
            )  # held until the agents are done (components/runtime/ports.py)
            endpoint = store_port.endpoint
        else:
            endpoint = etcd_local.start(run_id, root=out / "state", enable_v2=backend == "etcd-v2")
        healthy = time.time()
        env = {**os.environ, "RDZV_BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"}
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            f"--rdzv-backend={backend}", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            __file__, "--worker",
        ]  # fmt: skip
        try:
            agents = [
                subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
                for _ in range(nnodes)
            ]  # fmt: skip
            codes = [agent.wait(timeout=300) for agent in agents]
            done = time.time()
        finally:
            if backend == "c10d":
                store_port.release()
            else:
                etcd_local.stop(run_id, root=out / "state")
        if codes != [0] * nnodes:
            raise SystemExit(f"agents failed with exit codes {codes}")
        joined = [json.loads(p.read_text())["joined"] for p in out.glob("rank*.json")]
        assert len(joined) == nnodes * nproc, joined
        return {
            "etcd_start_s": round(healthy - start, 3),
            "all_joined_s": round(max(joined) - start, 3),
            "total_s": round(done - start, 3),
        }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        key: round(statistics.median(r[key] for r in runs), 3)
        for key in runs[0]
        if isinstance(runs[0][key], int | float)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="agents", choices=["agents", "torchrun"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agents", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--procs", type=int, default=4, help="processes hosting the agents")
    parser.add_argument("--backend", default="etcd-v3", choices=["etcd-v3", "etcd-v2", "c10d"])
    parser.add_argument("--nnodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--host", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    if args.host:
        host_agents(args.endpoint, args.run_id, args.host, args.world)
        return
    if args.repeats < 1 or any(n < 1 for n in args.agents) or args.procs < 1:
        parser.error("--repeats, --agents and --procs must be positive")
    result: dict[str, Any] = {
        "mode": args.mode,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
    }
    if args.mode == "torchrun":
        runs = []
        for i in range(args.repeats):
            runs.append(run_torchrun(args.backend, args.nnodes, args.nproc_per_node))
            print(f"repeat {i}: {runs[-1]}", flush=True)
        result |= {"backend": args.backend, "nodes": args.nnodes,
                   "nproc_per_node": args.nproc_per_node, **_medians(runs)}  # fmt: skip
    else:
        result |= {"backend": "etcd-v3", "procs": args.procs}
        for agents in args.agents:
            runs = []
            for i in range(args.repeats):
                runs.append(run_agents(agents, args.procs))
                print(f"agents {agents} repeat {i}: {json.dumps(runs[-1])}", flush=True)
            result[f"agents_{agents}"] = _medians(runs)
        if len(args.agents) > 1:
            small, large = (result[f"agents_{n}"] for n in (min(args.agents), max(args.agents)))
            for key in ("writes_per_agent", "requests_per_agent"):
                growth = large[key] / max(small[key], 1e-9)
                result[key.replace("_per_agent", "_per_agent_growth")] = round(growth, 2)
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
