"""GRPO's group-relative advantages and clipped policy-gradient loss, equal to TRL 1.16's
GRPOTrainer (tests/test_grpo.py checks loss, gradient and advantages against TRL's own code).

For a prompt, G completions o_1..o_G are sampled from the current policy and scored: rewards r_i.
The advantage of every token of o_i is the group-relative

    A_i = (r_i - mean(r)) / (std(r) + 1e-4)          scale_rewards="group" (std with Bessel's correction)
    A_i = (r_i - mean(r)) / (std(all r) + 1e-4)      scale_rewards="batch"
    A_i =  r_i - mean(r)                              scale_rewards="none" (Dr. GRPO, Liu et al. 2025)

and the per-token loss, with ratio rho_t = pi(o_t) / pi_old(o_t) and the reference pi_ref (the
base with its LoRA adapters off, as for DPO),

    l_t = -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A) + beta x KL_t
    KL_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1                (k3 estimator)

The loss variants differ only in how tokens are averaged (TRL's `loss_type`):

    grpo     mean over completions of each completion's token mean (DeepSeekMath, Shao et al. 2024)
    dr_grpo  sum over all tokens / (completions x max_completion_tokens): no length bias
    dapo     sum over all tokens / all completion tokens of the global batch (Yu et al. 2025)

Here each variant returns a *sum* and its unit count (completions, or tokens for dapo); the step
divides the global sum by the global count (trainer/step.py), so the gradient is that of the global
mean however completions fall on ranks and micro-batches: gradient accumulation over completions is
exact. With equal micro-batches this is TRL's per-micro-batch mean / gradient_accumulation_steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.grpo.settings import LOSS_TYPES, SCALE_REWARDS

STATS = ("loss", "kl", "clip_ratio")
"""What `grpo_stats` sums (the loss differentiable; KL and clipped share as sums over tokens)."""


@dataclass(frozen=True)
class GrpoLoss:
    """The loss settings (TrainConfig's grpo_* fields)."""

    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    max_completion_tokens: int = 256


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """[N] advantages of N = prompts x group_size rewards, grouped consecutively by prompt."""
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)} (got {scale!r})")
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)
    advantages = rewards - mean
    if scale == "none":
        return advantages
    if scale == "group":
        std = grouped.std(dim=1).repeat_interleave(group_size)
    else:
        std = rewards.std().expand_as(rewards)
    return advantages / (std + 1e-4)


IMPORTANCE_CLIP_MAX = 3.0
"""vLLM rollouts: a completion whose importance ratio exceeds this is left out of the loss (TRL
1.16's default vllm_importance_sampling_mode="sequence_mask", clip_max=3.0)."""


def sampling_correction(
    old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """[B, 1] importance weights of completions sampled by another engine (vLLM) than the one
    that scores them: exp(sum over tokens of old - sampling log-probs), 0 above
    IMPORTANCE_CLIP_MAX (TRL's default correction for the vLLM / trainer mismatch)."""
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True))
    return ratio.masked_fill(ratio > IMPORTANCE_CLIP_MAX, 0.0)


def per_token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    settings: GrpoLoss,
    ref_logps: torch.Tensor | None = None,
    importance: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([B, T] loss, [B, T] KL or None) from [B, T] log-probabilities of the completion tokens under
    the policy (differentiable), the sampling policy and the reference, [B] advantages and, for
    vLLM rollouts, the [B, 1] `sampling_correction` (it weighs the clipped term, not the KL)."""
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - settings.epsilon_low, 1 + settings.epsilon_high)
    a = advantages.unsqueeze(1)
    loss = -torch.min(ratio * a, clipped * a)
    if importance is not None:
        loss = loss * importance
    kl = None
    if settings.beta != 0.0:
        assert ref_logps is not None, "beta != 0 needs the reference log-probabilities"
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + settings.beta * kl
    return loss, kl


def loss_sum(
    loss: torch.Tensor, mask: torch.Tensor, settings: GrpoLoss
) -> tuple[torch.Tensor, int]:
    """(sum, units): the variant's numerator over this batch and what the global sum is divided by."""
    mask = mask.to(loss.dtype)
    if settings.loss_type == "grpo":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum(), loss.size(0)
    if settings.loss_type == "dr_grpo":
        return (loss * mask).sum() / settings.max_completion_tokens, loss.size(0)
    if settings.loss_type == "dapo":
        return (loss * mask).sum(), int(mask.sum())
    raise ValueError(
        f"loss_type must be one of {', '.join(LOSS_TYPES)} (got {settings.loss_type!r})"
    )


def grpo_stats(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: GrpoLoss,
    ref_logps: torch.Tensor | None = None,
    importance: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """([3] sums: loss (differentiable), KL over tokens, clipped tokens; units of the loss sum)."""
    loss, kl = per_token_loss(logps, old_logps, advantages, settings, ref_logps, importance)
    numerator, units = loss_sum(loss, mask, settings)
    m = mask.to(loss.dtype)
    ratio = torch.exp(logps.detach() - old_logps)
    a = advantages.unsqueeze(1)
    clipped = ((ratio < 1 - settings.epsilon_low) & (a < 0)) | (
        (ratio > 1 + settings.epsilon_high) & (a > 0)
    )
    kl_sum = (kl.detach() * m).sum() if kl is not None else torch.zeros((), dtype=loss.dtype)
    return torch.stack(
        [numerator, kl_sum.to(loss.dtype), (clipped.to(loss.dtype) * m).sum()]
    ), units
