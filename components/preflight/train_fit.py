"""Will training fit the GPUs? trainer/memory_model.py's estimate of one training process,
checked against the accelerator's memory (components/platform/platform_facts.py) before anything starts.

Per GPU (one training process each), with the run's trainer settings (`trainer_overrides`,
`quantize_base`) and world size (nodes x processes per node):

    refused  when the weights, the optimizer state and the larger of activations and gradients
             (the estimate's parts without the logits and the overhead allowance; both when
             gradients accumulate over micro-batches) exceed the GPU's memory: that cannot fit,
             whatever the data;
    warned   when the whole estimate (every position a target, plus the allowance for the CUDA
             context and fragmentation) exceeds it: it may not.

The refusal names what would fit, each estimated the same way and spelt as it is set:
activation checkpointing, micro-batches of 1 (the same global batch), QLoRA (`quantize_base=nf4`
with LoRA), more GPUs when the trainer shards (FSDP2; a replicated model, `replicates`, holds
everything on every GPU), or a GPU with more memory. Against the two GPU measurements
(docs/performance.md, one H200, peak allocated): the refused part is below both, 38.9 GB vs 43.5
for a full fine-tune of a 1.1B Llama at 4 x 4096 tokens, 13.8 GB vs 18.4 for QLoRA at 4 x 2048
(whose whole estimate, 19.7 GB, was 7% above); tests/test_train_fit.py holds them to that.

objective=grpo: a step trains on micro_batch_size x grpo_group_size completions of seq_len prompt
tokens plus grpo_max_completion_tokens, and its rollout before that holds the KV cache of those
sequences with the weights and optimizer state (trainer/memory_model.py `kv_cache_bytes`,
`grpo_peak`): the larger of the two is what must fit.

Checked where the model's config.json can be read: a local directory, gs:// inside the
pipeline, or a Hugging Face Hub id (its config.json alone is downloaded, with HF_TOKEN or a
saved login; the pipeline reads `hf_token_secret`). A .gguf file or an architecture without
Llama-style config fields is left to the run; so is a config that cannot be read (offline, a
gated model without access, a `model_type` this transformers does not know), with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any

from components.launchers.vocab import resolve_nproc_per_node
from components.params.trainer_params import planned_trainer_config
from components.platform.platform_facts import accelerator
from components.preflight.model_size import model_config, size_of
from trainer.config import TrainConfig
from trainer.gguf import is_gguf
from trainer.memory_model import (
    MemoryEstimate,
    ModelShape,
    estimate,
    grpo_peak,
    kv_cache_bytes,
    replicates,
)

log = logging.getLogger(__name__)

MAX_GPUS = 512
"""The largest world size a refusal suggests."""
GIB = 2**30
"""The unit of the platform facts' GPU memory, and of what this module reports."""


@dataclass(frozen=True)
class Plan:
    """What the estimate reads of a run."""

    config: TrainConfig
    """The trainer's config the run launches with (components.params.trainer_params.planned_trainer_config)."""
    world_size: int
    seq_len: int

    def changed(self, **fields: Any) -> Plan:
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **fields))


@dataclass(frozen=True)
class TrainingFit:
    """One process's estimate against one GPU."""

    estimate: MemoryEstimate
    gpu_bytes: float
    accumulates: bool
    """Gradients accumulate over micro-batches: they are held through the next forward."""
    rollout_floor: float = 0.0
    """objective=grpo: what a rollout cannot do without (weights, optimizer state and the KV
    cache of micro_batch_size x G sequences of seq_len + max completion tokens)."""
    rollout_peak: float = 0.0
    """objective=grpo: the rollout's whole estimate (sampling logits and the allowance too)."""

    @property
    def lower_bound(self) -> float:
        """What cannot be avoided: weights, optimizer state, and the larger of activations and
        gradients (freed after each step, they grow as backward frees the activations), or
        both when gradients accumulate."""
        e = self.estimate
        states = e.weights + e.trainable - e.gradients
        if self.accumulates:
            return max(states + e.gradients + e.activations, self.rollout_floor)
        return max(states + max(e.activations, e.gradients), self.rollout_floor)

    @property
    def fits(self) -> bool:
        return self.lower_bound <= self.gpu_bytes

    @property
    def comfortable(self) -> bool:
        return max(self.estimate.total, self.rollout_peak) <= self.gpu_bytes


def training_fit_error(params: Any, base_model: str, *, remote: bool) -> str | None:
    """The refusal for a run whose training cannot fit its GPUs (None when it fits, when its
    GPUs are not declared, or when the model's config cannot be read here); logs a warning when
    it fits only without the estimate's allowance."""
    if params.backend == "local" or not params.accelerator_type or params.accelerator_count < 1:
        return None
    if "://" in base_model and not remote:
        return None  # read inside the pipeline, with its credentials

    try:
        memory = accelerator(params.accelerator_type).memory_gib * GIB
    except ValueError:  # a GPU the facts lack is allowed with a warning (platform_facts)
        return None
    shape = model_shape(base_model)
    if shape is None:
        return None
    plan = plan_of(params)
    try:
        fit = fit_of(shape, plan, memory)
    except ValueError:  # LoRA targets the memory model does not know: left to the run
        return None
    gpu = f"{params.accelerator_type} ({memory / GIB:.0f} GiB)"
    if not fit.fits:
        return (
            f"training does not fit {gpu}: trainer/memory_model.py estimates at least "
            f"{_parts(fit)} per GPU, before logits and overhead; " + _what_fits(shape, plan, memory)
        )
    if not fit.comfortable:
        log.warning(
            "training may not fit %s: estimated %.1f GiB per GPU with logits (every position a "
            "target) and overhead; activation checkpointing or more GPUs would leave room",
            gpu,
            fit.estimate.total / GIB,
        )
    return None


def model_shape(base_model: str) -> ModelShape | None:
    """The memory model's view of the model at `base_model` (None when it cannot be read: the
    check is advisory, so any failure leaves the model to the run)."""
    if is_gguf(base_model):
        return None  # converted on each node; its config exists only then
    try:
        config = model_config(base_model)
    except ValueError as exc:  # offline, gated, no config.json, an unknown model_type: say so
        log.warning("training fit not checked: %s", exc)
        return None
    try:
        text = config.get_text_config().to_dict()
        return ModelShape.from_hf_config(text, size_of(config).parameters)
    except Exception as exc:  # unusual architectures fail in many ways
        log.debug("training fit not checked: %s", exc)
        return None


def plan_of(params: Any) -> Plan:
    nproc = resolve_nproc_per_node(params.backend, params.nproc_per_node, params.accelerator_count)
    return Plan(planned_trainer_config(params), params.nodes * nproc, params.seq_len)


def fit_of(shape: ModelShape, plan: Plan, gpu_bytes: float) -> TrainingFit:
    c = plan.config
    method = "qlora" if c.quantize_base == "nf4" else "lora" if c.lora_rank else "full"
    shards = 1 if replicates(c, shape.params, plan.world_size) else plan.world_size
    # GRPO trains on micro_batch_size x G completions of (at most) seq_len prompt tokens plus
    # the longest completion; its rollout before holds their KV cache (trainer/memory_model.py).
    grpo = c.objective == "grpo"
    rows = c.micro_batch_size * (c.grpo_group_size if grpo else 1)
    tokens = plan.seq_len + (c.grpo_max_completion_tokens if grpo else 0)
    train = estimate(
        shape,
        method=method,
        seq_len=tokens,
        micro_batch_size=rows,
        world_size=shards,
        lora_rank=c.lora_rank or 16,
        lora_targets=tuple(c.lora_target_modules),
        activation_checkpointing=c.activation_checkpointing,
    )
    floor = peak = 0.0
    if grpo:
        states = train.weights + train.trainable - train.gradients
        floor = states + kv_cache_bytes(shape, rows, tokens)
        peak = grpo_peak(
            train,
            shape,
            completions=rows,
            prompt_tokens=plan.seq_len,
            completion_tokens=c.grpo_max_completion_tokens,
        )
    return TrainingFit(train, gpu_bytes, c.grad_accum_steps > 1, floor, peak)


def _parts(fit: TrainingFit) -> str:
    e = fit.estimate
    larger = (
        f"activations {e.activations / GIB:.1f} and gradients {e.gradients / GIB:.1f}"
        if fit.accumulates
        else f"the larger of activations {e.activations / GIB:.1f} and gradients "
        f"{e.gradients / GIB:.1f}"
    )
    rollout = (
        f"; a GRPO rollout {fit.rollout_floor / GIB:.1f} with its KV cache"
        if fit.rollout_floor
        else ""
    )
    return (
        f"{fit.lower_bound / GIB:.1f} GiB (weights {e.weights / GIB:.1f}, optimizer state "
        f"{(e.trainable - e.gradients) / GIB:.1f}, {larger}{rollout})"
    )


def _what_fits(shape: ModelShape, plan: Plan, gpu_bytes: float) -> str:
    """The cheapest changes that would fit, as they are set: activation checkpointing alone, else
    with it micro-batches of 1, QLoRA, or the fewest GPUs (doubling) when the trainer shards."""
    c = plan.config
    checkpointing = {} if c.activation_checkpointing else {"activation_checkpointing": True}
    if checkpointing:
        fit = fit_of(shape, plan.changed(**checkpointing), gpu_bytes)
        if fit.fits:
            return f"it fits with {_overrides(checkpointing)} ({fit.lower_bound / GIB:.1f} GiB)"
    options: list[tuple[str, Plan]] = []
    if c.micro_batch_size > 1:
        smaller = {
            **checkpointing,
            "micro_batch_size": 1,
            "grad_accum_steps": c.grad_accum_steps * c.micro_batch_size,
        }
        options.append((f"{_overrides(smaller)} (the same global batch)", plan.changed(**smaller)))
    if c.quantize_base != "nf4":
        lora = {} if c.lora_rank else {"lora_rank": 16}
        qlora = {**lora, **checkpointing}
        label = "quantize_base=nf4" + (f" with {_overrides(qlora)}" if qlora else "")
        options.append((label, plan.changed(quantize_base="nf4", **qlora)))
    sharded = {
        **checkpointing,
        **({"data_parallel": "shard"} if c.data_parallel == "replicate" else {}),
    }
    world = plan.world_size * 2
    more = dataclasses.replace(plan.changed(**sharded), world_size=world)
    while world < MAX_GPUS and not fit_of(shape, more, gpu_bytes).fits:
        world *= 2
        more = dataclasses.replace(more, world_size=world)
    with_ = f" with {_overrides(sharded)}" if sharded else ""
    options.append((f"{world} GPUs in all (nodes x accelerator_count){with_}", more))
    fitting = [
        f"{label} ({fit.lower_bound / GIB:.1f} GiB)"
        for label, option in options
        if (fit := fit_of(shape, option, gpu_bytes)).fits
    ]
    if not fitting:
        return "only a GPU with more memory would fit it"
    return "it fits with " + "; or ".join(fitting)


def _overrides(changes: dict[str, Any]) -> str:
    return f"trainer_overrides {json.dumps(changes)}"
