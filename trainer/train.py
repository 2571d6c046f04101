"""The training run in named phases: setup -> train -> save -> cleanup.

Run under torchrun on every node (see trainer/__main__.py). `cleanup` always runs and always
destroys the process group, whatever happened before. The phases live in their own modules:

    trainer/startup.py   setup: process group, data, model (FSDP2 or DDP), optimizer, resume
    trainer/loop.py      train: the step loop, metrics, checkpoints, preemption
    trainer/step.py      one optimizer step (the gradient of the global mean loss)
    trainer/finish.py    save: eval loss, export, summary.json
    trainer/run_state.py the `Run` record they share
"""

from __future__ import annotations

import logging

import torch.distributed as dist

from trainer import storage
from trainer.config import TrainConfig
from trainer.data import DataPosition
from trainer.finish import save
from trainer.loop import train
from trainer.run_state import PREEMPTED_EXIT_CODE, NonFiniteLossError, Preempted, Run
from trainer.startup import setup


def run(config: TrainConfig) -> int:
    """Entry point: returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [%(name)s] %(message)s"
    )
    r: Run | None = None
    try:
        # Any write of the run (attempt record, metrics, TensorBoard, checkpoints, export) on a
        # full disk ends as one DiskFullError naming the disk, never a writer's traceback.
        with storage.disk_errors_named(config.output):
            r = setup(config)
            try:
                train(r)
            except Preempted:
                return PREEMPTED_EXIT_CODE
            save(r)
        return 0
    finally:
        cleanup(r)


def cleanup(r: Run | None) -> None:
    if r is not None and r.metrics is not None:
        r.metrics.close()
    if dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["DataPosition", "NonFiniteLossError", "Run", "run"]
