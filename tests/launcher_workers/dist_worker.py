"""A stand-in for `python -m trainer` in the local launcher tests: a real gloo process group.

It accepts the trainer's flags (--model/--data/--output/--max-steps/...), all-reduces across every
rank, and rank 0 writes OUTPUT/summary.json like the trainer. Behaviour for the failure tests comes
from `--mode`: `ok`, `fail` (the last rank exits 3 after the barrier) or `hang` (sleep after the
all-reduce until killed).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--model", "--data", "--output", "--max-steps", "--mode"):
        parser.add_argument(name)
    args, _ = parser.parse_known_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(
        f"rank {rank}/{world} group {os.environ['GROUP_RANK']} sum {total.item():.0f}", flush=True
    )
    if args.mode == "fail" and rank == world - 1:
        print("boom: simulated worker failure", file=sys.stderr, flush=True)
        sys.exit(3)
    if args.mode == "hang":
        print(f"ready {rank}", flush=True)
        time.sleep(3600)
    if args.mode == "fail":
        time.sleep(
            3600
        )  # the survivors would block in the next collective; just wait to be stopped
    dist.barrier()
    if rank == 0:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        summary = {
            "base_model": args.model,
            "steps": int(args.max_steps or 0),
            "world_size": world,
            "sum": total.item(),
            "model_dir": str(out / "model"),
        }
        (out / "summary.json").write_text(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
