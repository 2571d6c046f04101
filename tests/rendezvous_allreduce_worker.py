"""torchrun worker for the rendezvous tests: all-reduce over gloo and record what each rank saw.

Run by torchrun (never by pytest). Writes `<RDZV_TEST_OUT>/rank<R>.json` with the rank, world
size, the agent's restart count and the all-reduced sum. With RDZV_TEST_HOLD=1, workers started
before the test wrote `<RDZV_TEST_OUT>/killed` write `pid.rank<R>` after the collective and then
wait (up to 120 s) to be killed: the test kills one, and torchrun restarts the whole group, whose
new workers see `killed` and finish. (The restart count cannot tell the rounds apart: an agent
whose own workers did not fail restarts them with its count unchanged.)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    out = Path(os.environ["RDZV_TEST_OUT"])
    hold = os.environ.get("RDZV_TEST_HOLD") == "1" and not (out / "killed").exists()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    record = {
        "rank": rank,
        "world_size": world,
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "sum": value.item(),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    }
    if hold:
        # renamed into place: the test reads it as soon as it exists
        (out / f"pid.tmp{rank}").write_text(str(os.getpid()))
        (out / f"pid.tmp{rank}").replace(out / f"pid.rank{rank}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # killed by the test, or by its agent on restart
            time.sleep(0.1)
        raise SystemExit(3)
    dist.barrier()
    dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
