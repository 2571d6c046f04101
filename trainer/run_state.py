"""What the phases of a run share: the `Run` record and the ways a run ends early.

Its own module so that the phases (trainer/startup.py, loop.py, step.py, finish.py) and the
entry point (trainer/train.py) all import it and none of them imports another's caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.checkpoint import TrainerState
from trainer.config import TrainConfig
from trainer.data import TrainBatches
from trainer.metrics import MetricsWriter

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: the task is retryable, not finished


class NonFiniteLossError(RuntimeError):
    """Loss or gradient norm became NaN/inf; the last complete checkpoint is left untouched."""


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was saved."""


@dataclass
class Run:
    """What setup builds and the later phases use."""

    config: TrainConfig
    device: torch.device
    rank: int
    world_size: int
    output: str
    model_dir: str = ""
    tokenizer: Any = None
    manifest: Any = None
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    batches: TrainBatches | Any = None
    """Packed rows (TrainBatches), or prompt records for objective=grpo (PromptBatches)."""
    rewards: list[Any] = field(default_factory=list)
    """objective=grpo: the run's reward functions (trainer/grpo/rewards.py), loaded in setup."""
    rollouts: Any = None
    generator: Any = None
    """objective=grpo with grpo_use_vllm: this rank's vLLM engine (trainer/grpo/vllm_rollout.py)."""
    """objective=grpo: this rank's rollout while grpo_num_iterations steps still train on it
    (trainer/grpo/buffer.py's RolloutBuffer; saved with checkpoints)."""
    metrics: MetricsWriter | None = None
    total_steps: int = 0
    state: TrainerState = field(default_factory=TrainerState)
    resumed_from_step: int | None = None
    losses: list[float] = field(default_factory=list)
    eval_loss: float | None = None
    eval_scores: dict[str, float] = field(default_factory=dict)
    """Every eval metric (eval_loss, and with DPO eval_reward_margin, eval_win_rate)."""
    phase_seconds: dict[str, float] = field(default_factory=dict)
    """objective=grpo: seconds this start spent generating and training (summary.json)."""
    started: float = field(default_factory=time.time)
    attempt: int = 1
    """Which start of this run this is (OUTPUT/attempts/: 1 = the first)."""
    stop_requested: bool = False
    """Set by the SIGTERM handler on this rank."""
    stop_agreed: bool = False
    """Some rank had stop_requested at the last step's all-reduce: all ranks stop together."""
    save_agreed: bool = False
    """Some rank had save_due at the last step's all-reduce: all ranks save after this step."""
    last_saved_at: float = field(default_factory=time.monotonic)
    """When this rank last saved a checkpoint (or started), for `checkpoint_every_minutes`."""


def checkpoints_dir(r: Run) -> str:
    return r.config.checkpoints_dir()
