"""Will training fit the GPUs? trainer/memory_model.py's estimate of one training process,
checked against the accelerator's memory (components/platform_facts.py) before anything starts.

Per GPU (one training process each), with the run's trainer settings (`trainer_overrides`,
`quantize_base`) and world size (nodes x processes per node):

    refused  when the weights, gradients, optimizer state and activations alone (the estimate's
             parts without the logits and the overhead allowance) exceed the GPU's memory: that
             cannot fit, whatever the data;
    warned   when the whole estimate (every position a target, plus the allowance for the CUDA
             context and fragmentation) exceeds it: it may not.

The refusal names what would fit, each estimated the same way: activation checkpointing, QLoRA
(`quantize_base=nf4` with LoRA), more GPUs (FSDP2 shards weights, gradients and optimizer state),
or a GPU with more memory. On the one GPU measurement (QLoRA, 1.1B, H200: docs/performance.md)
the whole estimate was 7% above the measured peak and the refused part below it, so a run this
refuses would not have fitted.

Checked where the model's config.json can be read (a local directory, or gs:// inside the
pipeline); a hub id, a .gguf file or an architecture without Llama-style config fields is left to
the run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from trainer.memory_model import MemoryEstimate, ModelShape, estimate

log = logging.getLogger(__name__)

MAX_GPUS = 512
"""The largest world size a refusal suggests."""
GIB = 2**30
"""The unit of the platform facts' GPU memory, and of what this module reports."""


@dataclass(frozen=True)
class TrainingFit:
    """One process's estimate against one GPU."""

    estimate: MemoryEstimate
    gpu_bytes: float

    @property
    def lower_bound(self) -> float:
        """What cannot be avoided: weights, gradients, optimizer state and activations."""
        e = self.estimate
        return e.weights + e.trainable + e.activations

    @property
    def fits(self) -> bool:
        return self.lower_bound <= self.gpu_bytes

    @property
    def comfortable(self) -> bool:
        return self.estimate.total <= self.gpu_bytes


def training_fit_error(params: Any, base_model: str, *, remote: bool) -> str | None:
    """The refusal for a run whose training cannot fit its GPUs (None when it fits, when its
    GPUs are not declared, or when the model's config cannot be read here); logs a warning when
    it fits only without the estimate's allowance."""
    if params.backend == "local" or not params.accelerator_type or params.accelerator_count < 1:
        return None
    if "://" in base_model and not remote:
        return None  # read inside the pipeline, with its credentials
    from components.platform_facts import accelerator

    try:
        memory = accelerator(params.accelerator_type).memory_gib * GIB
    except ValueError:  # a GPU the facts lack is allowed with a warning (platform_facts)
        return None
    shape = model_shape(base_model)
    if shape is None:
        return None
    settings = run_settings(params)
    try:
        fit = fit_of(shape, settings, memory)
    except ValueError:  # LoRA targets the memory model does not know: left to the run
        return None
    gpu = f"{params.accelerator_type} ({memory / GIB:.0f} GiB)"
    if not fit.fits:
        return (
            f"training does not fit {gpu}: trainer/memory_model.py estimates "
            f"{_parts(fit.estimate)} per GPU, before logits and overhead; "
            + _what_fits(shape, settings, memory)
        )
    if not fit.comfortable:
        log.warning(
            "training may not fit %s: estimated %.1f GiB per GPU with logits and overhead "
            "(%s); activation checkpointing or more GPUs would leave room",
            gpu,
            fit.estimate.total / GIB,
            _parts(fit.estimate),
        )
    return None


def model_shape(base_model: str) -> ModelShape | None:
    """The memory model's view of the model at `base_model` (None when it cannot be read)."""
    from components.cost import model_config, size_of

    try:
        config = model_config(base_model)
        text = config.get_text_config().to_dict()
        return ModelShape.from_hf_config(text, size_of(config).parameters)
    except (ValueError, KeyError, TypeError, OSError):
        return None


@dataclass(frozen=True)
class Settings:
    """What the estimate reads of a run."""

    method: str
    seq_len: int
    micro_batch_size: int
    world_size: int
    lora_rank: int
    lora_targets: tuple[str, ...]
    activation_checkpointing: bool


def run_settings(params: Any) -> Settings:
    from components.capacity import planned_trainer_config
    from components.param_checks import resolve_nproc_per_node

    config = planned_trainer_config(params)
    nproc = resolve_nproc_per_node(params.backend, params.nproc_per_node, params.accelerator_count)
    method = "qlora" if config.quantize_base == "nf4" else "lora" if config.lora_rank else "full"
    return Settings(
        method=method,
        seq_len=params.seq_len,
        micro_batch_size=config.micro_batch_size,
        world_size=params.nodes * nproc,
        lora_rank=config.lora_rank,
        lora_targets=tuple(config.lora_target_modules),
        activation_checkpointing=config.activation_checkpointing,
    )


def fit_of(shape: ModelShape, s: Settings, gpu_bytes: float) -> TrainingFit:
    return TrainingFit(
        estimate(
            shape,
            method=s.method,
            seq_len=s.seq_len,
            micro_batch_size=s.micro_batch_size,
            world_size=s.world_size,
            lora_rank=s.lora_rank or 16,
            lora_targets=s.lora_targets,
            activation_checkpointing=s.activation_checkpointing,
        ),
        gpu_bytes,
    )


def _parts(e: MemoryEstimate) -> str:
    return (
        f"{(e.weights + e.trainable + e.activations) / GIB:.1f} GiB (weights {e.weights / GIB:.1f}, "
        f"gradients and optimizer state {e.trainable / GIB:.1f}, activations "
        f"{e.activations / GIB:.1f})"
    )


def _what_fits(shape: ModelShape, s: Settings, gpu_bytes: float) -> str:
    """The cheapest changes that would fit: activation checkpointing alone, else with it one of a
    micro-batch of 1, QLoRA, or the fewest GPUs (doubling) that shard enough."""
    checkpointed = replace(s, activation_checkpointing=True)
    if not s.activation_checkpointing:
        fit = fit_of(shape, checkpointed, gpu_bytes)
        if fit.fits:
            return (
                "it fits with trainer_overrides activation_checkpointing=true "
                f"({fit.lower_bound / GIB:.1f} GiB)"
            )
    options = []
    if s.micro_batch_size > 1:
        options.append(("micro_batch_size=1", replace(checkpointed, micro_batch_size=1)))
    if s.method != "qlora":
        rank = s.lora_rank or 16
        label = "quantize_base=nf4" if s.lora_rank else f"quantize_base=nf4, lora_rank={rank}"
        options.append((label, replace(checkpointed, method="qlora", lora_rank=rank)))
    world = s.world_size * 2
    while (
        world < MAX_GPUS
        and not fit_of(shape, replace(checkpointed, world_size=world), gpu_bytes).fits
    ):
        world *= 2
    options.append(
        (f"{world} GPUs (nodes x accelerator_count)", replace(checkpointed, world_size=world))
    )
    fitting = [
        f"{label} ({fit.lower_bound / GIB:.1f} GiB)"
        for label, settings in options
        if (fit := fit_of(shape, settings, gpu_bytes)).fits
    ]
    if not fitting:
        return "only a GPU with more memory would fit it"
    how = "activation checkpointing and " if not s.activation_checkpointing else ""
    return f"it fits with {how}" + "; or ".join(fitting)
