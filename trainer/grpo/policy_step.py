"""One GRPO step on one process: rollout -> rewards -> advantages -> loss with gradient
accumulation over completions -> AdamW, with the time split between generating and training.

    result = grpo_step(model, tokenizer, optimizer, batch, rewards, GrpoSettings(...))

`batch` is a list of prompt records ({"prompt": text or messages, other columns...}); each prompt's
G completions are generated, scored and trained here, so a prompt's group never straddles
processes (the group-relative advantage needs the whole group). One rollout is trained on once
(TRL's num_iterations=1): the sampling policy is the policy before the update, so old log-probs are
computed once, without gradient, before the first micro-batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.grpo.loss import GrpoLoss, group_advantages, grpo_stats
from trainer.grpo.rewards import Reward, score, total
from trainer.grpo.rollout import Rollout, Sampling, adapters_off, completion_logps, sample


@dataclass(frozen=True)
class GrpoSettings:
    sampling: Sampling = field(default_factory=Sampling)
    loss: GrpoLoss = field(default_factory=GrpoLoss)
    scale_rewards: str = "group"
    micro_batch: int = 8
    """Completions per forward/backward (gradient accumulation over completions)."""
    max_grad_norm: float = 1.0


@dataclass
class StepReport:
    loss: float
    reward: float
    pass_rate: float
    kl: float
    clip_ratio: float
    completion_tokens: int
    generate_s: float
    train_s: float
    extra: dict[str, float] = field(default_factory=dict)


def columns_of(records: list[dict[str, Any]], repeat: int) -> dict[str, list[Any]]:
    """The extra columns of the records (all but "prompt"), each value repeated per completion."""
    names = [k for k in records[0] if k != "prompt"]
    return {k: [r[k] for r in records for _ in range(repeat)] for k in names}


def record_ids(records: list[dict[str, Any]], repeat: int) -> list[str]:
    return [f"{r.get('id', i)}/{j}" for i, r in enumerate(records) for j in range(repeat)]


def grpo_step(
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    records: list[dict[str, Any]],
    rewards: list[Reward],
    settings: GrpoSettings,
) -> StepReport:
    """One optimizer step on the groups of `records` (see the module docstring)."""
    g = settings.sampling.group_size
    rollout = sample(model, tokenizer, [r["prompt"] for r in records], settings.sampling)
    table = score(
        rewards,
        rollout.completions,
        rollout.prompts,
        columns_of(records, g),
        record_ids(records, g),
    )
    reward = torch.tensor(total(table, rewards), dtype=torch.float32)
    advantages = group_advantages(reward, g, settings.scale_rewards)
    started = time.perf_counter()
    old, ref = _fixed_logps(model, rollout, settings)
    sums = torch.zeros(3, dtype=torch.float64)
    units = 0
    model.train()
    for lo in range(0, len(reward), settings.micro_batch):
        rows = slice(lo, lo + settings.micro_batch)
        logps = completion_logps(model, rollout, settings.sampling.temperature, rows)
        stats, n = grpo_stats(
            logps,
            old[rows],
            advantages[rows].to(logps.dtype),
            rollout.completion_mask[rows],
            settings.loss,
            None if ref is None else ref[rows],
        )
        stats[0].backward()
        sums += stats.detach().double()
        units += n
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        p.grad.div_(max(units, 1))  # the gradient of the global mean (trainer/grpo/loss.py)
    torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tokens = rollout.completion_tokens
    first = torch.tensor([row[0] for row in table])
    return StepReport(
        loss=float(sums[0]) / max(units, 1),
        reward=float(reward.mean()),
        pass_rate=float((first > 0).float().mean()),
        kl=float(sums[1]) / max(tokens, 1),
        clip_ratio=float(sums[2]) / max(tokens, 1),
        completion_tokens=tokens,
        generate_s=rollout.seconds,
        train_s=time.perf_counter() - started,
    )


@torch.no_grad()
def _fixed_logps(
    model: Any, rollout: Rollout, settings: GrpoSettings
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Old (sampling-policy) and, with a KL term, reference log-probs: no gradient, in micro-batches."""
    t = settings.sampling.temperature
    n = len(rollout.completions)
    chunks = [slice(lo, lo + settings.micro_batch) for lo in range(0, n, settings.micro_batch)]
    old = torch.cat([completion_logps(model, rollout, t, rows) for rows in chunks])
    if settings.loss.beta == 0.0:
        return old, None
    with adapters_off(model):
        ref = torch.cat([completion_logps(model, rollout, t, rows) for rows in chunks])
    return old, ref


def evaluate(
    model: Any,
    tokenizer: Any,
    records: list[dict[str, Any]],
    rewards: list[Reward],
    max_completion_tokens: int,
    batch: int = 16,
) -> dict[str, float]:
    """Mean reward and pass rate (share of prompts whose first reward is > 0, e.g. exact match) of
    one greedy completion per held-out prompt."""
    sampling = Sampling(group_size=1, max_completion_tokens=max_completion_tokens)
    values: list[float] = []
    passed: list[float] = []
    for lo in range(0, len(records), batch):
        part = records[lo : lo + batch]
        rollout = sample(model, tokenizer, [r["prompt"] for r in part], sampling, greedy=True)
        table = score(
            rewards, rollout.completions, rollout.prompts, columns_of(part, 1), record_ids(part, 1)
        )
        values += total(table, rewards)
        passed += [float(row[0] > 0) for row in table]
    return {"mean_reward": sum(values) / len(values), "pass_rate": sum(passed) / len(passed)}
