"""The cost estimate of a run's parameters: `estimate_for(RunParams)` sizes the model and the
data, shapes the run (`shape_of`: nodes, GPUs, batch, GRPO's rollouts) and prices it with
components/preflight/cost.py's `estimate`, adding the interconnect note of a multi-node run.

    est = estimate_for(params, remote=False)   # `llmft run --dry-run` prints it
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from components.launchers.vocab import resolve_nproc_per_node
from components.params.trainer_params import planned_trainer_config
from components.platform.node_facts import interconnect_note
from components.preflight.cost import Estimate, RunShape, estimate
from components.preflight.data_size import input_bytes, tokens_from_bytes
from components.preflight.model_size import ModelSize, model_size


def shape_of(params: Any) -> RunShape:
    """The `RunShape` of a `RunParams` (the trainer's own config gives batch and engine)."""
    config = planned_trainer_config(params)
    nproc = resolve_nproc_per_node(params.backend, params.nproc_per_node, params.accelerator_count)
    return RunShape(
        backend=params.backend,
        nodes=params.nodes,
        gpus_per_node=params.accelerator_count if params.accelerator_type else 0,
        accelerator_type=params.accelerator_type,
        capacity=params.capacity,
        max_steps=params.max_steps,
        global_batch_rows=config.global_batch_rows(params.nodes * nproc),
        seq_len=params.seq_len,
        lora=bool(config.lora_rank),
        compile=config.compile is not False,
        checkpoint_every=config.checkpoint_every,
        checkpoint_every_minutes=config.checkpoint_every_minutes,
        preprocess_runner=params.preprocess_runner,
        eval_accelerator_type=params.eval_accelerator_type if params.backend != "local" else "",
        eval_gpus=params.eval_accelerator_count,
        processes_per_node=nproc,
        **_grpo_shape(config),
    )


def _grpo_shape(config: Any) -> dict[str, int]:
    """RunShape's GRPO fields of a trainer config ({} for other objectives)."""
    if config.objective != "grpo":
        return {}
    return {
        "grpo_group_size": config.grpo_group_size,
        "grpo_completion_tokens": config.grpo_max_completion_tokens,
        "grpo_rollouts_per_rank": config.grad_accum_steps,
        "grpo_rows_per_rollout": config.micro_batch_size * config.grpo_group_size,
        "grpo_iterations": config.grpo_num_iterations,
    }


def estimate_for(
    params: Any,
    *,
    remote: bool,
    base_model: str = "",
    prices: Mapping[str, Mapping[str, float]] | None = None,
) -> Estimate:
    """The estimate of a `RunParams`: the model's size from `model_parameters` or its
    config.json (`base_model` when resolved, else the parameter), the data's tokens from the
    raw input's size (listable locally, and remotely when `remote`)."""
    model: ModelSize | None = None
    model_unknown = ""
    if params.model_parameters:
        model = ModelSize.of_count(params.model_parameters)
    elif params.backend != "local":  # local training is not priced: no need to size the model
        try:
            model = model_size(base_model or params.base_model)
        except (ValueError, OSError) as exc:
            model, model_unknown = None, str(exc)
    size = input_bytes(params.train_data_uri, remote=remote)
    result = estimate(
        shape_of(params),
        model=model,
        data_tokens=tokens_from_bytes(size) if size else None,
        gpu_hour_price_usd=params.gpu_hour_price_usd,
        prices=prices,
        model_unknown=model_unknown,
    )
    # C8: the bandwidth a multi-node run is assumed to get, stated with the estimate.
    note = interconnect_note(
        params.machine_type, params.nodes, gpudirect=params.gpudirect, backend=params.backend
    )
    if note and params.backend in ("gke", "vertex"):
        result = dataclasses.replace(result, notes=(*result.notes, note))
    return result
