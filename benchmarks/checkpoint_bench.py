"""Checkpoint save time per GB: the trainer's own DCP save (trainer/checkpoint.py) of a sharded
model and its AdamW state, on CPU with gloo.

Run from a clean checkout (after `make install`):

    .venv/bin/python benchmarks/checkpoint_bench.py [--params-m 134] [--ranks 2] [--repeats 3] [--dir DIR]

Builds a stack of 4096x4096 linear layers (`--params-m` million parameters, fp32), shards it with
FSDP2 (one unit per layer, as the trainer does) over `--ranks` processes, takes one AdamW step so
the optimizer holds both moments, then saves `--repeats` checkpoints with `trainer.checkpoint.save`
(every rank writes its shards and RNG state; rank 0 the trainer state and the COMPLETE marker;
barriers around). A save's time is rank 0's wall time from the barrier before to the return of
`save` (which ends in a barrier). Its size is the bytes of the checkpoint directory on disk. The
figure is seconds per GB (1e9 bytes), median over the repeats; the load average before and after
is printed, since on a shared machine the disk and CPUs are shared too. The last line is
`RESULT {json}`. `--dir` chooses the file system (default: a temporary directory on local disk;
gs:// works through fsspec when credentials are present).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def _rank_main(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from trainer import checkpoint, storage
    from trainer.checkpoint import TrainerState

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    layers = max(1, round(args.params_m * 1e6 / (4096 * 4096)))
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, 4096)).sum().backward()
    optimizer.step()
    times, sizes = [], []
    for repeat in range(args.repeats):
        dist.barrier()
        started = time.perf_counter()
        path = checkpoint.save(out, model, optimizer, TrainerState(step=repeat + 1), keep=1)
        elapsed = time.perf_counter() - started
        if rank == 0:
            local = storage.local_path(path) if not storage.is_remote(path) else None
            size = (
                sum(
                    os.path.getsize(os.path.join(d, f))
                    for d, _, files in os.walk(local)
                    for f in files
                )
                if local
                else 0
            )
            times.append(elapsed)
            sizes.append(size)
            print(f"save {repeat + 1}: {elapsed:.2f} s, {size / 1e9:.3f} GB", flush=True)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        per_gb = [t / (s / 1e9) for t, s in zip(times, sizes, strict=True) if s]
        result = {
            "parameters": params,
            "ranks": args.ranks,
            "checkpoint_gb": round(statistics.median(sizes) / 1e9, 3),
            "save_s_median": round(statistics.median(times), 3),
            "s_per_gb_median": round(statistics.median(per_gb), 3) if per_gb else None,
            "s_per_gb_each": [round(x, 3) for x in per_gb],
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params-m", type=float, default=134, help="model size, millions")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="", help="where to save (default: a temp dir)")
    args = parser.parse_args()

    import torch.multiprocessing as mp

    from components.runtime.ports import ReservedPort

    print(f"load average before: {os.getloadavg()}", flush=True)
    port = ReservedPort()
    endpoint_port = port.port
    port.release()  # rank 0's store binds it next (SO_REUSEADDR)
    with tempfile.TemporaryDirectory(prefix="llmft-ckpt-bench-") as tmp:
        out = args.dir or f"{tmp}/checkpoints"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_rank_main, args=(args, endpoint_port, out), nprocs=args.ranks, join=True)
    print(f"load average after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
