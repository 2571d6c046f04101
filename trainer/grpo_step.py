"""objective=grpo's optimizer step in `python -m trainer` (FSDP2 or DDP, any number of ranks):
per micro-batch of prompts, a rollout of G completions each, rewards, group advantages, then the
clipped loss's forward/backward; one all-reduce and AdamW as every step (trainer/step.py).

Every forward goes through the root module (`CausalLMLoss.forward(task=...)`), as DPO's passes do:
FSDP2 gathers the root's own weights around `forward` only, and each decoder block's around its
own call, so `generate` runs on gathered weights; with weights sharded over several ranks,
`synced_gpus` keeps every rank's forward count equal until all are done. A rollout is trained on
for grpo_num_iterations consecutive steps (TRL's num_iterations, trainer/grpo/buffer.py): its old
log-probabilities are taken once, right after generation (with one step per rollout they are the
current ones detached: ratio 1, as TRL computes them then, and no extra forward is made). The
reference (grpo_beta > 0) is the base with the LoRA adapters off, without gradient, once per
rollout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from trainer.grpo.buffer import RolloutBuffer, Scored
from trainer.grpo.loss import GrpoLoss, group_advantages, grpo_stats, sampling_correction
from trainer.grpo.policy_step import columns_of, record_ids
from trainer.grpo.rewards import Reward, score, total
from trainer.grpo.rollout import Rollout, Sampling, adapters_off, completion_logps, sample
from trainer.run_state import Run
from trainer.step import StepResult, reduce_and_step

EXTRA = (
    "kl",
    "clip_ratio",
    "reward",
    "pass_rate",
    "completions",
    "generate_s",
    "train_s",
    "tokens",
)
"""The sums a GRPO step all-reduces besides the loss (trainer/step.py's extra sums)."""


def sampling_of(config: Any) -> Sampling:
    return Sampling(
        group_size=config.grpo_group_size,
        temperature=config.grpo_temperature,
        top_p=config.grpo_top_p,
        max_completion_tokens=config.grpo_max_completion_tokens,
    )


def loss_of(config: Any) -> GrpoLoss:
    return GrpoLoss(
        loss_type=config.grpo_loss_type,
        epsilon_low=config.grpo_epsilon_low,
        epsilon_high=config.grpo_epsilon_high,
        beta=config.grpo_beta,
        max_completion_tokens=config.grpo_max_completion_tokens,
    )


def synced(r: Run) -> bool:
    """Whether generation must keep the ranks' forward counts equal (sharded weights)."""
    return r.world_size > 1 and not r.model.replicated


def rollout_of(
    r: Run, prompts: list[dict[str, Any]], sampling: Sampling, greedy: bool = False
) -> Rollout:
    """G completions per prompt (one greedy one with greedy=True), generated inside the root's
    forward."""

    texts = [p["prompt"] for p in prompts]
    if r.generator is not None and not greedy:  # vLLM (grpo_use_vllm); held-out answers: below
        return r.generator.sample(r.tokenizer, texts, sampling, r.device)

    def task(lm: Any) -> Rollout:
        return sample(
            lm, r.tokenizer, texts, sampling,
            greedy=greedy, synced_gpus=synced(r),
        )  # fmt: skip

    with torch.no_grad():
        return r.model(task=task)


def scored(
    rollout: Rollout, records: list[dict[str, Any]], rewards: list[Reward], repeat: int
) -> tuple[list[float], list[float]]:
    """(each completion's weighted reward, whether its first reward is > 0: the pass rate)."""
    table = score(
        rewards,
        rollout.completions,
        rollout.prompts,
        columns_of(records, repeat),
        record_ids(records, repeat),
    )
    return total(table, rewards), [float(row[0] > 0) for row in table]


def rollout_batches(r: Run, batches: Iterator[Any]) -> Iterator[Any]:
    """Endless, around PromptBatches.iterate: the next step's prompts, or none (`[]`, the data
    position unchanged) while the buffered rollout has steps left (grpo_num_iterations)."""
    while True:
        yield ([], r.state.position) if r.rollouts is not None else next(batches)


def new_rollouts(r: Run, micro: list[list[dict[str, Any]]]) -> RolloutBuffer:
    """Per micro-batch of prompts: G completions each, their rewards and advantages, and the
    fixed log-probabilities (old with grpo_num_iterations > 1, reference with grpo_beta > 0)."""
    config = r.config
    sampling = sampling_of(config)
    g, t = sampling.group_size, sampling.temperature
    if r.generator is not None:  # collective under FSDP2: the engine takes the current policy
        r.generator.load_policy(r.model.causal_lm())
    kept = []
    for prompts in micro:
        rollout = rollout_of(r, prompts, sampling)
        values, passed = scored(rollout, prompts, r.rewards, g)
        reward = torch.tensor(values, dtype=torch.float32)
        advantages = group_advantages(reward, g, config.grpo_scale_rewards).to(r.device)
        started = time.perf_counter()
        old = ref = importance = None
        with torch.no_grad():
            # vLLM's completions are always scored by the policy (its own numbers differ).
            if config.grpo_num_iterations > 1 or rollout.sampling_logps is not None:
                old = r.model(task=lambda lm, x=rollout: completion_logps(lm, x, t))
            if rollout.sampling_logps is not None and old is not None:
                mask = rollout.completion_mask.to(old.dtype)
                importance = sampling_correction(old, rollout.sampling_logps, mask)
            if config.grpo_beta != 0.0:
                ref = r.model(task=lambda lm, x=rollout: _reference_logps(lm, x, t))
        fixed_s = time.perf_counter() - started
        kept.append(
            Scored(rollout, values, passed, advantages, old, ref, fixed_s, importance=importance)
        )
    return RolloutBuffer(kept, left=config.grpo_num_iterations)


def _reference_logps(lm: Any, rollout: Rollout, temperature: float) -> torch.Tensor:
    with adapters_off(lm):
        return completion_logps(lm, rollout, temperature)


def grpo_optimizer_step(r: Run, micro: list[list[dict[str, Any]]]) -> StepResult:
    """One optimizer step on this rank's micro-batches of prompts, or, given none, on the
    buffered rollout (see the module docstring and trainer/grpo/buffer.py)."""
    config, device = r.config, r.device
    settings = loss_of(config)
    t = config.grpo_temperature
    r.model.train()
    fresh = bool(micro)
    if fresh:
        r.rollouts = new_rollouts(r, micro)
    buffer = r.rollouts
    assert buffer is not None, "a step without prompts trains on the buffered rollout"
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    sums = torch.zeros(len(EXTRA), dtype=torch.float64, device=device)
    units = completion_tokens = 0
    for k, item in enumerate(buffer.micro):
        started = time.perf_counter()

        def loss(lm: Any, item: Scored = item) -> tuple[torch.Tensor, int]:
            logps = completion_logps(lm, item.rollout, t)
            mask = item.rollout.completion_mask.to(logps.device)
            old = logps.detach() if item.old is None else item.old
            advantages = item.advantages.to(logps.dtype)
            return grpo_stats(logps, old, advantages, mask, settings, item.ref, item.importance)

        # Gradients are reduced once per step, on the last micro-batch (trainer/step.py).
        r.model.set_requires_gradient_sync(k == len(buffer.micro) - 1)
        stats, n = r.model(task=loss)
        # FSDP2 and DDP average gradients over ranks: x world_size turns that into the sum.
        (stats[0] * r.world_size).backward()
        loss_sum += stats[0].detach().double()
        units += n
        rollout = item.rollout
        completion_tokens += rollout.completion_tokens
        train_s = time.perf_counter() - started + (item.fixed_s if fresh else 0.0)
        sums += torch.tensor(
            [
                float(stats[1].detach()), float(stats[2]), sum(item.values), sum(item.passed),
                len(item.values), rollout.seconds if fresh else 0.0, train_s,
                rollout.completion_tokens + int(rollout.prompt_mask.sum()),
            ],
            dtype=torch.float64, device=device,
        )  # fmt: skip
    buffer.left -= 1
    if buffer.left == 0:
        r.rollouts = None
    loss_value, norm, tokens_total, extra, _ = reduce_and_step(
        r, loss_sum, units, completion_tokens, sums
    )
    return StepResult(loss_value, norm, tokens_total, _report(r, extra, tokens_total),
                      tokens=int(extra[EXTRA.index("tokens")]))  # fmt: skip


def _report(r: Run, extra: list[float], tokens_total: int) -> dict[str, float]:
    """The step's logged GRPO metrics from the global sums."""
    got = dict(zip(EXTRA, extra, strict=True))
    n = max(got["completions"], 1.0)
    return {
        "reward": got["reward"] / n,
        "pass_rate": got["pass_rate"] / n,
        "kl": got["kl"] / max(tokens_total, 1),
        "clip_ratio": got["clip_ratio"] / max(tokens_total, 1),
        "completion_tokens": tokens_total / n,
        "generate_s": got["generate_s"] / r.world_size,
        "train_s": got["train_s"] / r.world_size,
    }


@torch.no_grad()
def held_out_rewards(r: Run, records: list[dict[str, Any]], batch: int) -> dict[str, float] | None:
    """Collective: mean reward and pass rate of one greedy completion per held-out prompt (record
    i on rank i mod world), or None without held-out prompts. Every rank makes the same number of
    rollouts (a rank short of prompts repeats its first and does not count it)."""
    import torch.distributed as dist

    if not records:
        return None
    mine = records[r.rank :: r.world_size]
    batches = [mine[lo : lo + batch] for lo in range(0, len(mine), batch)]
    most = torch.tensor([len(batches)], dtype=torch.int64, device=r.device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    sampling = sampling_of(r.config)
    totals = torch.zeros(3, dtype=torch.float64, device=r.device)
    for i in range(int(most.item())):
        part = batches[i] if i < len(batches) else records[:1]
        rollout = rollout_of(r, part, sampling, greedy=True)
        if i < len(batches):
            values, passed = scored(rollout, part, r.rewards, 1)
            totals += torch.tensor(
                [sum(values), sum(passed), len(values)], dtype=torch.float64, device=r.device
            )
    dist.all_reduce(totals)
    r.model.train()
    n = max(float(totals[2]), 1.0)
    return {"eval_reward": float(totals[0]) / n, "eval_pass_rate": float(totals[1]) / n}
