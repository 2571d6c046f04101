"""A stand-in for `python -m trainer` in the local launcher tests: a real gloo process group.

It takes the trainer's `--config-json` (what every launcher passes), all-reduces across every rank,
and rank 0 writes OUTPUT/summary.json like the trainer. Behaviour for the failure tests comes from
the config's model name `stand-in:<mode>`: `ok` (or any other name), `fail` (the last rank exits 3
after the barrier) or `hang` (sleep after the all-reduce until killed).
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
    parser.add_argument("--config-json", required=True)
    config = json.loads(parser.parse_args().config_json)
    mode = config["model"].removeprefix("stand-in:")  # to_json() leaves defaults out
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(
        f"rank {rank}/{world} group {os.environ['GROUP_RANK']} sum {total.item():.0f}", flush=True
    )
    if mode == "fail" and rank == world - 1:
        print("boom: simulated worker failure", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "hang":
        print(f"ready {rank}", flush=True)
        time.sleep(3600)
    if mode == "fail":
        time.sleep(
            3600
        )  # the survivors would block in the next collective; just wait to be stopped
    dist.barrier()
    if rank == 0:
        out = Path(config["output"])
        out.mkdir(parents=True, exist_ok=True)
        summary = {
            "base_model": config["model"],
            "steps": int(config.get("max_steps") or 0),  # only changed fields are passed
            "world_size": world,
            "sum": total.item(),
            "model_dir": str(out / "model"),
        }
        (out / "summary.json").write_text(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
