"""How the run parameters become the trainer's config: `trainer_config`, and the checks of
`trainer_overrides` against the trainer's own `TrainConfig` before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.platform.capacity import trainer_overrides_for
from trainer.config import TrainConfig, config_from_mapping

RESERVED: dict[str, str | None] = {
    "model": None,
    "data": None,
    "output": None,
    "export_dir": None,
    "tokenizer": None,
    "max_steps": "max_steps",
    "lr": "learning_rate",
    "quantize_base": "quantize_base",
    "objective": "objective",
    "rewards": "rewards",
    "reward_module": "reward_module",
}
"""Trainer fields the pipeline sets: -> the run parameter to use instead (None: derived)."""


def trainer_config(
    overrides: Mapping[str, Any],
    *,
    max_steps: int,
    learning_rate: float,
    model: str,
    data: str,
    output: str,
    quantize_base: str = TrainConfig.quantize_base,
    objective: str = TrainConfig.objective,
    rewards: str = "",
    reward_module: str = "",
) -> TrainConfig:
    """The trainer's config for a run (not yet validated: `TrainConfig.errors()`).

    `max_steps`, `learning_rate`, `quantize_base`, `objective`, `rewards` and `reward_module` are
    run parameters; every other trainer field comes from
    `trainer_overrides`, coerced to the field's type (ValueError for unknown fields, bad values).
    """
    values = {
        **overrides,
        "max_steps": max_steps,
        "lr": learning_rate,
        "quantize_base": quantize_base,
        "objective": objective,
        "rewards": rewards,
        "reward_module": reward_module,
    }
    return config_from_mapping({**values, "model": model, "data": data, "output": output})


def trainer_override_errors(
    overrides: Mapping[str, Any],
    *,
    max_steps: int,
    learning_rate: float,
    quantize_base: str = TrainConfig.quantize_base,
    objective: str = TrainConfig.objective,
    rewards: str = "",
    reward_module: str = "",
) -> list[str]:
    """Trainer overrides checked against the trainer's own config, before anything starts."""
    errors = []
    for key in overrides:
        if key in RESERVED:
            instead = RESERVED[key]
            errors.append(
                f"trainer_overrides.{key}: set the run parameter {instead} instead"
                if instead
                else f"trainer_overrides.{key}: the pipeline sets it (base_model, the run's data "
                "and where the model goes)"
            )
    if errors:
        return errors
    try:
        config = trainer_config(
            overrides,
            max_steps=max_steps,
            learning_rate=learning_rate,
            quantize_base=quantize_base,
            objective=objective,
            rewards=rewards,
            reward_module=reward_module,
            model="m",
            data="d",
            output="o",
        )
    except ValueError as exc:
        return [f"trainer_overrides: {exc}"]
    # A missing reward is the run parameters' own check (param_checks.check_rewards).
    rest = [e for e in config.errors() if not e.startswith("objective=grpo needs a reward")]
    return [f"trainer_overrides: {e}" for e in rest]


def planned_trainer_config(params: Any) -> TrainConfig:
    """The trainer config a run's parameters (`RunParams`) launch with, for what is estimated and
    checked before it starts: the capacity's overrides applied (`trainer_overrides_for`); model,
    data and output are placeholders (the train step resolves them)."""
    return trainer_config(
        trainer_overrides_for(params.capacity, params.trainer_overrides or {}),
        max_steps=params.max_steps,
        learning_rate=params.learning_rate,
        quantize_base=params.quantize_base,
        objective=params.objective,
        rewards=params.rewards,
        reward_module=params.reward_module,
        model="m",
        data="d",
        output="o",
    )
