"""GRPO's setting names and rules, without torch (trainer/config.py checks them before anything
loads)."""

from __future__ import annotations

from typing import Any

from trainer.grpo.rewards import parse_rewards

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")


def grpo_errors(config: Any) -> list[str]:
    """The problems of a TrainConfig's GRPO settings (the reward module is read, never run)."""
    errors = _value_errors(config)
    try:
        parse_rewards(config.rewards)
    except ValueError as exc:
        errors.append(str(exc))
    if config.objective != "grpo":
        if config.grpo_use_vllm:
            errors.append("grpo_use_vllm generates GRPO rollouts: it needs objective=grpo")
        return errors
    if not config.rewards.strip() and not config.reward_module:
        errors.append(
            "objective=grpo needs a reward: set rewards (built-ins, JSON) or reward_module"
        )
    if config.grpo_beta > 0 and not config.lora_rank:
        errors.append(
            "grpo_beta > 0 uses the base with adapters disabled as its reference: set "
            "lora_rank, or grpo_beta=0"
        )
    if config.grpo_use_vllm and config.quantize_base == "nf4":
        errors.append(
            "grpo_use_vllm loads the policy's weights into vLLM, which cannot take the NF4 base: "
            "set grpo_use_vllm=false or quantize_base=none"
        )
    return errors


def _value_errors(config: Any) -> list[str]:
    """Each GRPO setting's own range."""
    errors = []
    if config.grpo_group_size < 2:
        errors.append(
            f"grpo_group_size must be >= 2 (got {config.grpo_group_size}): advantages compare "
            "each completion with the others of its prompt"
        )
    if not 0 < config.grpo_temperature <= 10:
        errors.append(f"grpo_temperature must be in (0, 10] (got {config.grpo_temperature})")
    if not 0 < config.grpo_top_p <= 1:
        errors.append(f"grpo_top_p must be in (0, 1] (got {config.grpo_top_p})")
    if config.grpo_max_completion_tokens < 1:
        errors.append(
            f"grpo_max_completion_tokens must be >= 1 (got {config.grpo_max_completion_tokens})"
        )
    if config.grpo_loss_type not in LOSS_TYPES:
        errors.append(
            f"grpo_loss_type must be one of {', '.join(LOSS_TYPES)} (got {config.grpo_loss_type!r})"
        )
    if config.grpo_scale_rewards not in SCALE_REWARDS:
        errors.append(
            f"grpo_scale_rewards must be one of {', '.join(SCALE_REWARDS)} "
            f"(got {config.grpo_scale_rewards!r})"
        )
    if config.grpo_beta < 0 or config.grpo_epsilon_low < 0 or config.grpo_epsilon_high < 0:
        errors.append("grpo_beta, grpo_epsilon_low and grpo_epsilon_high must be >= 0")
    if config.grpo_num_iterations < 1:
        errors.append(
            f"grpo_num_iterations must be >= 1 (got {config.grpo_num_iterations}): optimizer "
            "steps per rollout"
        )
    if not 0 < config.grpo_vllm_gpu_memory_utilization < 1:
        errors.append(
            "grpo_vllm_gpu_memory_utilization must be in (0, 1) "
            f"(got {config.grpo_vllm_gpu_memory_utilization})"
        )
    return errors
