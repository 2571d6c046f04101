"""Rendezvous time for 2 nodes x 2 processes on this machine: etcd up -> all ranks joined.

    .venv/bin/python benchmarks/rendezvous_bench.py [--backend etcd-v3|etcd-v2|c10d] [--repeats 3]

Each repeat starts a fresh local etcd (none for c10d), launches two `torchrun` agents as separate
processes (gloo, CPU) and has every worker record the wall time right after its first all-reduce,
i.e. once the whole world has rendezvoused and connected. Reported per repeat:
`etcd_start_s` (etcd process start -> healthy), `all_joined_s` (etcd start -> last rank joined,
the headline number; it includes starting the Python interpreters and importing torch, which
dominates on small machines) and `total_s` (until both agents exited, keys cleaned up).
For etcd backends, `handler_rendezvous_s` isolates the protocol itself: two rendezvous handlers
(threads of this process, as two agents would) join the same fresh run until both have a rank.
The last line is `RESULT {json}` with the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


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


def run_once(backend: str, nnodes: int, nproc: int) -> dict[str, float]:
    from components.etcd import local as etcd_local
    from components.ports import ReservedPort

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.time()
        if backend == "c10d":
            store_port = ReservedPort()  # held until the agents are done (components/ports.py)
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


def handler_rendezvous(backend: str, nnodes: int) -> float:
    """Seconds for `nnodes` handlers to complete one rendezvous round (no process startup)."""
    import threading

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from components.etcd import local as etcd_local

    run_id = f"bench-h-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = etcd_local.start(run_id, root=tmp, enable_v2=backend == "etcd-v2")
        try:
            params = RendezvousParameters(backend, endpoint, run_id, nnodes, nnodes)
            handlers = [get_rendezvous_handler(params) for _ in range(nnodes)]
            start = time.monotonic()
            threads = [threading.Thread(target=h.next_rendezvous) for h in handlers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - start
            for handler in handlers:
                handler.shutdown()
        finally:
            etcd_local.stop(run_id, root=tmp)
    return round(elapsed, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="etcd-v3", choices=["etcd-v3", "etcd-v2", "c10d"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nnodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    runs = []
    for i in range(args.repeats):
        runs.append(run_once(args.backend, args.nnodes, args.nproc_per_node))
        if args.backend != "c10d":
            runs[-1]["handler_rendezvous_s"] = handler_rendezvous(args.backend, args.nnodes)
        print(f"repeat {i}: {runs[-1]}", flush=True)
    result = {
        "backend": args.backend,
        "nodes": args.nnodes,
        "nproc_per_node": args.nproc_per_node,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        **{key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]},
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
