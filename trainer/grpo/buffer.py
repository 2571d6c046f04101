"""The rollouts a GRPO step trains on, kept for `grpo_num_iterations` optimizer steps (TRL's
num_iterations, mu) and saved with every checkpoint taken while some of those steps are left.

A rollout is generated once per mu steps; its old (sampling-policy) log-probabilities are taken
right after generation, before the first update, so from the second step on the ratio
pi / pi_old moves away from 1 and the clip acts. With mu = 1 no old log-probabilities are kept: the
current ones detached are the same numbers (TRL skips that forward too). The reference
log-probabilities (grpo_beta > 0) do not change with the policy: taken once per rollout.

A checkpoint saved between two steps of one rollout holds each rank's buffer
(`rollouts/rank-NNNNN.pt`, trainer/checkpoint.py), so a resumed run trains on the very same
completions: the rollout cannot be regenerated, the policy that sampled it is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from trainer.grpo.rollout import Rollout


@dataclass
class Scored:
    """One micro-batch of prompts' rollout and what the loss needs of it."""

    rollout: Rollout
    values: list[float]
    """Each completion's weighted reward."""
    passed: list[float]
    """1.0 where the completion's first reward is > 0 (the pass rate)."""
    advantages: torch.Tensor
    old: torch.Tensor | None
    """[N, T] log-probs under the sampling policy (None with mu = 1: the current ones detached)."""
    ref: torch.Tensor | None
    """[N, T] log-probs under the reference (None without a KL term)."""
    fixed_s: float = 0.0
    """Seconds spent on the old and reference forwards (training time of the generating step)."""
    importance: torch.Tensor | None = None
    """[N, 1] vLLM rollouts: the sampling correction (trainer/grpo/loss.py)."""


@dataclass
class RolloutBuffer:
    """This rank's micro-batches of one rollout and how many optimizer steps still train on it."""

    micro: list[Scored]
    left: int

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, lists and numbers (a checkpoint loads it with weights_only=True)."""
        return {
            "left": self.left,
            "micro": [
                {
                    **{
                        f.name: _cpu(getattr(s, f.name))
                        for f in fields(Scored)
                        if f.name != "rollout"
                    },
                    "rollout": {f.name: _cpu(getattr(s.rollout, f.name)) for f in fields(Rollout)},
                }
                for s in self.micro
            ],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> RolloutBuffer:
        micro = []
        for item in state["micro"]:
            rollout = Rollout(**{k: _to(v, device) for k, v in item["rollout"].items()})
            rest = {k: _to(v, device) for k, v in item.items() if k != "rollout"}
            micro.append(Scored(rollout=rollout, **rest))
        return cls(micro=micro, left=int(state["left"]))


def _cpu(value: Any) -> Any:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value
