"""The trainer's typed configuration: one dataclass and its rules (trainer/config_args.py reads it
from a YAML file and `--field value` flags).

Precedence: dataclass defaults < `--config FILE.yaml` < command-line flags. Every field has a
docstring (the attribute docstring under it); `validate()` collects every problem and raises one
ValueError listing all of them, so a user fixes a config in one round trip instead of N.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from trainer import storage
from trainer.config_file import coerce_field
from trainer.grpo.rewards import parse_rewards
from trainer.grpo.settings import LOSS_TYPES, SCALE_REWARDS
from trainer.packed_data.format import SEQ_LEN_MAX, SEQ_LEN_MIN
from trainer.tracking import tracking_uri_problem

SDPA_KERNELS = ("flash", "cudnn", "efficient", "math")
"""Names of torch's SDPA kernels (`torch.nn.attention.SDPBackend`) that `sdpa_kernels` takes."""
DTYPES = ("auto", "bf16", "fp32")
"""`dtype`'s values (`trainer.model.compute_dtype` resolves "auto")."""
QUANTIZE_BASES = ("none", "nf4")
"""`quantize_base`'s values."""
OBJECTIVES = ("sft", "dpo", "grpo")
"""`objective`'s values."""


@dataclass
class TrainConfig:
    """Everything `python -m trainer` can be told. Field docstrings are the reference."""

    # --- inputs and outputs -------------------------------------------------------------------
    model: str = ""
    """Model to fine-tune: a local Hugging Face directory, a gs:// URI (downloaded once per node),
    a hub id, or a .gguf file (local or gs://, converted once per machine: trainer/gguf.py).
    Loaded with `from_pretrained`."""
    data: str = ""
    """Packed dataset directory written by `llmft preprocess` (local path or gs://)."""
    output: str = ""
    """Run directory (local path or gs://): checkpoints/, model/, metrics.jsonl, summary.json."""
    tokenizer: str | None = None
    """Tokenizer to check the dataset against and to export; defaults to `model`."""

    # --- schedule ----------------------------------------------------------------------------
    seq_len: int | None = None
    """Expected packed row length; None takes it from the manifest (a mismatch is refused)."""
    micro_batch_size: int = 4
    """Packed rows per process per forward/backward pass."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated per optimizer step. Global batch (rows) = micro_batch_size x
    grad_accum_steps x world size."""
    max_steps: int | None = None
    """Optimizer steps to run; None runs `epochs` full passes over the training split."""
    epochs: int = 1
    """Passes over the training split when max_steps is None."""
    shuffle: bool = True
    """Shuffle rows each epoch (seeded by `seed` and the epoch number, so resume is exact)."""
    seed: int = 0
    """Seed for data order, LoRA init and dropout; the same seed gives the same run."""

    # --- optimizer ---------------------------------------------------------------------------
    lr: float = 2e-5
    """Peak learning rate of AdamW, used by the first step after warmup (once)."""
    min_lr_ratio: float = 0.1
    """The cosine schedule decays to lr x min_lr_ratio, reached at the last step."""
    warmup_steps: int = 0
    """Steps of linear warmup before the peak: the k-th uses lr x k / (warmup_steps + 1)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (applied to matrices only, not norms or biases)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still logged)."""
    divergence_factor: float = 4.0
    """The divergence guard (trainer/divergence.py): stop the run, saving and exporting nothing,
    when the mean loss of the last 5 steps is over divergence_factor x the lowest such mean
    earlier in the run and over 1 nat above it (a learning rate far too large: a loss that grows
    but stays finite). 0 turns the guard off; otherwise it must be > 1."""

    # --- engine ------------------------------------------------------------------------------
    dtype: str = "auto"
    """Compute dtype: "auto" (bf16 on GPU, fp32 on CPU), "bf16" or "fp32". Master weights and
    gradient reduction stay fp32 either way."""
    activation_checkpointing: bool = False
    """Recompute each decoder block's activations in backward: less memory, ~30% more compute.
    Turn on for large models or long sequences."""
    compile: bool | None = None
    """torch.compile each decoder block (per-block keeps compile time flat in depth). None (the
    default) compiles on GPU, where it measured 1.29x eager on an H200 (benchmarks/gpu_check.sh,
    52.8% vs 40.9% MFU), and runs eager on CPU: there compiled steps are ~7% faster
    (benchmarks/train_bench.py, `ratio_compile_vs_eager`; docs/performance.md) but every run
    first builds C++ kernels (seconds, and a C++ compiler and Python's headers, which a fresh
    Debian lacks), which CPU runs, short as tests and demos are, do not earn back. true on CPU
    is refused where that toolchain is missing."""
    data_parallel: str = "auto"
    """How parameters spread over ranks. "shard": FSDP2 (ZeRO-3), each rank holds 1/world of the
    weights, gradients and AdamW state. "replicate": DDP (plain tensors): every rank holds the
    whole model, the forward needs no all-gather and gradients are all-reduced in buckets while
    backward runs (about 16 bytes per parameter per process in fp32). "auto": replicate models up
    to `replicate_max_params` parameters, shard larger ones."""
    replicate_max_params: int = 100_000_000
    """Largest model "auto" replicates (100M params: ~1.6 GB of fp32 weights, grads and AdamW
    state per process); above it the memory saving of sharding matters more than its traffic."""
    shard_blocks: bool = True
    """FSDP2 ("shard" only): one unit per decoder block, so each block's gradient reduction starts
    while backward goes on and no whole-model flat buffers are made. False makes the whole model
    one unit (2 collectives per step instead of 2 per block, but all parameters gathered at once
    and the reduction only after backward): measured slower and larger even for a 7M model
    (docs/performance.md). Small models are better served by "replicate" (DDP), which ignores
    this setting."""
    reshard_after_forward: bool = True
    """FSDP2 ("shard" only): free gathered block weights after forward (ZeRO-3). False keeps them
    until backward (ZeRO-2-like): one all-gather fewer per block, more memory."""
    attention: str = "document"
    """"document": per-document causal attention that skips the scores a packed row masks out,
    exact for sliding windows, soft-capping and attention sinks (trainer/attention.py); "sdpa":
    transformers' SDPA with a block-diagonal L x L mask (refused for models SDPA cannot compute
    exactly: Gemma2, gpt-oss); "eager": the model's own eager attention with that mask (slowest;
    refused for gpt-oss, whose masks ignore document boundaries). docs/trainer.md has the table."""
    sdpa_kernels: str = "auto"
    """Fused attention kernels SDPA may use on GPU, in order of preference: "auto" (PyTorch's own
    order, flash first) or a comma list of flash, cudnn, efficient, math, e.g. "cudnn,flash,math"
    (torchtitan's order). docs/performance.md has what each measured on an H200."""
    backend: str = "auto"
    """Process-group backend: "auto" (nccl on GPU, gloo on CPU), "nccl" or "gloo"."""

    # --- LoRA --------------------------------------------------------------------------------
    lora_rank: int = 0
    """LoRA rank; 0 means full fine-tuning. With LoRA, only adapter weights train."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (scale = alpha / rank)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch input."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """Module names to wrap with LoRA adapters."""

    # --- QLoRA and preference tuning ------------------------------------------------------------
    quantize_base: str = "none"
    """"nf4" stores the frozen base weights of every linear layer in the decoder blocks as 4-bit
    NormalFloat (torchao's NF4 tensor: 64-value blocks, double-quantized scales, ~0.52 bytes per
    weight) and trains LoRA adapters on top (QLoRA; needs lora_rank > 0). "none" keeps them in
    full precision. The export merges the adapters into the de-quantized base (what was trained)
    and also writes the adapter alone."""
    objective: str = "sft"
    """"sft": next-token cross-entropy on target tokens. "dpo": Direct Preference Optimization
    (sigmoid loss) on a preference dataset (`llmft preprocess` of {prompt, chosen, rejected});
    the reference model is the frozen base with the LoRA adapters disabled, so it needs
    lora_rank > 0 and no second model is held. "grpo": Group Relative Policy Optimization on a
    prompts dataset (`llmft preprocess --data-kind prompts`) with `rewards` / `reward_module`
    (trainer/grpo/, docs/grpo.md)."""
    dpo_beta: float = 0.1
    """DPO's beta: the strength of the implicit KL penalty towards the reference (larger stays
    closer). Rewards are beta x (policy - reference) log-probability of a response."""

    # --- GRPO (objective=grpo: trainer/grpo/, docs/grpo.md) -----------------------------------
    rewards: str = ""
    """objective=grpo: the built-in rewards as a JSON list (exact_match, regex, json_schema,
    length_penalty, each with its arguments and an optional weight; docs/grpo.md)."""
    reward_module: str = ""
    """objective=grpo: a user's reward function, `PATH` or `PATH:FUNCTION` (local or gs:// .py
    file; `reward(completions, prompts, **columns) -> list[float]`), added to `rewards` with
    weight 1. Executed in the training job only."""
    grpo_group_size: int = 4
    """Completions sampled per prompt (G >= 2): the group whose mean and spread give each
    completion's advantage. micro_batch_size counts prompts, so a forward pass holds
    micro_batch_size x G completions."""
    grpo_temperature: float = 1.0
    """Sampling temperature of the rollouts (log-probabilities use the same, as TRL)."""
    grpo_top_p: float = 1.0
    """Nucleus sampling of the rollouts (1: off)."""
    grpo_max_completion_tokens: int = 256
    """Longest completion generated (the KV cache and the dr_grpo divisor follow it)."""
    grpo_loss_type: str = "dapo"
    """"grpo" (each completion's token mean, then the mean), "dr_grpo" (token sum / completions
    x max completion tokens) or "dapo" (token sum / all completion tokens; TRL 1.16's default)."""
    grpo_scale_rewards: str = "group"
    """Advantage scaling: "group" (divide by the group's std), "batch" (the batch's std) or "none"
    (Dr. GRPO)."""
    grpo_beta: float = 0.0
    """Weight of the KL term to the reference (the base with LoRA adapters off, as DPO's; needs
    lora_rank); 0, TRL's default, computes no reference."""
    grpo_epsilon_low: float = 0.2
    """Lower clip of the ratio: 1 - epsilon_low."""
    grpo_epsilon_high: float = 0.2
    """Upper clip of the ratio: 1 + epsilon_high (DAPO's clip-higher uses 0.28)."""

    # --- checkpoints, logging, export ---------------------------------------------------------
    checkpoint_every: int = 0
    """Save a DCP checkpoint every N optimizer steps (0: only on SIGTERM and at the end)."""
    checkpoint_every_minutes: float = 0.0
    """Also save a checkpoint when this many minutes have passed since the last one (0: off).
    For preemptible capacity, where a SIGTERM checkpoint may not fit the grace period: it bounds
    the work a preemption loses to these minutes. The ranks agree on it in the step's all-reduce,
    so they all save after the same step."""
    keep_checkpoints: int = 2
    """Complete checkpoints to keep; older ones are deleted after a new one is complete."""
    checkpoint_at_end: bool = True
    """Also save a checkpoint after the last step (lets a retried task skip straight to export)."""
    resume: bool = True
    """Resume from the latest complete checkpoint under OUTPUT/checkpoints if there is one."""
    log_every: int = 10
    """Write metrics every N steps (rank 0): JSONL, TensorBoard and the log."""
    eval_at_end: bool = True
    """Compute the loss on the eval split after training (if the dataset has one)."""
    eval_max_rows: int | None = None
    """Cap on eval rows (None: the whole eval split)."""
    export: bool = True
    """Write the final model as a Hugging Face directory (to `export_dir`)."""
    export_dir: str = ""
    """Where the exported model goes (local path or gs://); empty means OUTPUT/model. The
    pipeline points it at the Model artifact, so downstream steps download the model only, not
    the checkpoints and logs that stay in OUTPUT."""
    export_shard_size: str = "5GB"
    """Maximum size of one exported safetensors shard."""
    tensorboard: bool = True
    """Write TensorBoard events (to $AIP_TENSORBOARD_LOG_DIR on Vertex, else OUTPUT/tensorboard)."""
    peak_flops: float | None = None
    """Peak FLOP/s of one device for MFU; None looks the device up (CPU: MFU not reported)."""
    tracking_uri: str = ""
    """MLflow tracking URI rank 0 also logs the metrics to (every `log_every` steps) and the
    resolved settings ("" for none; trainer/tracking.py). Never fails or waits the run: a
    server that fails is a warning and OUTPUT/mlflow-spool.jsonl."""
    tracking_run_id: str = ""
    """The MLflow run those go to (the train step creates it: components/serving/mlflow_tracking.py)."""

    def resolved_tokenizer(self) -> str:
        return self.tokenizer or self.model

    def checkpoints_dir(self) -> str:
        """OUTPUT/checkpoints: the run's DCP checkpoints (trainer/checkpoint.py)."""
        return storage.join(self.output, "checkpoints")

    def global_batch_rows(self, world_size: int) -> int:
        return self.micro_batch_size * self.grad_accum_steps * world_size

    def validate(self) -> None:
        """Raise one ValueError listing every problem, each with what to change."""
        errors = self.errors()
        if errors:
            raise ValueError("invalid trainer config: " + "; ".join(errors))

    def errors(self) -> list[str]:
        """Every problem with this config (empty when valid). inf and NaN are refused in every
        float field first (inf passes `lr > 0`; NaN fails every range with a confusing message);
        the other rules then judge those fields at their defaults, so each is reported once."""
        types_by_name = field_types()
        bad = {
            name: value
            for name, value in self.to_dict().items()
            if types_by_name[name] in (float, float | None)
            and isinstance(value, float)
            and not math.isfinite(value)
        }
        errors = [f"{name} must be a finite number (got {value})" for name, value in bad.items()]
        default = TrainConfig()
        rest = dataclasses.replace(self, **{name: getattr(default, name) for name in bad})
        return errors + rest._rule_errors()

    def _rule_errors(self) -> list[str]:
        errors = []
        for name in ("model", "data", "output"):
            if not getattr(self, name):
                errors.append(f"--{name.replace('_', '-')} is required")
        positive = ("micro_batch_size", "grad_accum_steps", "epochs", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                errors.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_steps is not None and self.max_steps < 1:
            errors.append(f"max_steps must be >= 1 or unset (got {self.max_steps})")
        if self.seq_len is not None and not SEQ_LEN_MIN <= self.seq_len <= SEQ_LEN_MAX:
            errors.append(
                f"seq_len must be in [{SEQ_LEN_MIN}, {SEQ_LEN_MAX}] or unset (got {self.seq_len})"
            )
        if not self.lr > 0:
            errors.append(f"lr must be > 0 (got {self.lr})")
        if not 0 <= self.min_lr_ratio <= 1:
            errors.append(f"min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio})")
        for name in ("warmup_steps", "checkpoint_every", "checkpoint_every_minutes", "lora_rank"):
            if getattr(self, name) < 0:
                errors.append(f"{name} must be >= 0 (got {getattr(self, name)})")
        if self.max_steps is not None and 1 <= self.max_steps <= self.warmup_steps:
            errors.append(
                f"warmup_steps ({self.warmup_steps}) must be below max_steps ({self.max_steps})"
            )
        if self.divergence_factor and not self.divergence_factor > 1:
            errors.append(
                f"divergence_factor must be 0 (off) or > 1 (got {self.divergence_factor})"
            )
        if self.log_every < 1:
            errors.append(f"log_every must be >= 1 (got {self.log_every})")
        if problem := tracking_uri_problem(self.tracking_uri, resolve=False):
            errors.append(problem)
        if self.tracking_uri and not self.tracking_run_id:
            errors.append("tracking_uri needs tracking_run_id (the MLflow run to log to)")
        return errors + self._model_errors() + self._grpo_errors() + self._writes_into_inputs()

    def _model_errors(self) -> list[str]:
        """The optimizer's, the model's and the objective's settings."""
        errors = []
        if self.weight_decay < 0 or self.max_grad_norm < 0 or self.adam_eps <= 0:
            errors.append("weight_decay and max_grad_norm must be >= 0 and adam_eps > 0")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                errors.append(f"{name} must be in [0, 1) (got {getattr(self, name)})")
        if self.dtype not in DTYPES:
            errors.append(f"dtype must be auto, bf16 or fp32 (got {self.dtype!r})")
        if self.attention not in ("document", "sdpa", "eager"):
            errors.append(f"attention must be document, sdpa or eager (got {self.attention!r})")
        kernels = self.sdpa_kernels.split(",")
        if self.sdpa_kernels != "auto" and not set(kernels) <= set(SDPA_KERNELS):
            errors.append(
                f"sdpa_kernels must be auto or a comma list of {', '.join(SDPA_KERNELS)} "
                f"(got {self.sdpa_kernels!r})"
            )
        if self.data_parallel not in ("auto", "shard", "replicate"):
            errors.append(
                f"data_parallel must be auto, shard or replicate (got {self.data_parallel!r})"
            )
        if self.replicate_max_params < 0:
            errors.append(f"replicate_max_params must be >= 0 (got {self.replicate_max_params})")
        if self.backend not in ("auto", "nccl", "gloo"):
            errors.append(f"backend must be auto, nccl or gloo (got {self.backend!r})")
        if self.lora_rank and not self.lora_target_modules:
            errors.append("lora_target_modules must name at least one module when lora_rank > 0")
        if not 0 <= self.lora_dropout < 1:
            errors.append(f"lora_dropout must be in [0, 1) (got {self.lora_dropout})")
        if self.quantize_base not in QUANTIZE_BASES:
            errors.append(f"quantize_base must be none or nf4 (got {self.quantize_base!r})")
        elif self.quantize_base == "nf4" and not self.lora_rank:
            errors.append("quantize_base=nf4 trains LoRA adapters on a frozen base: set lora_rank")
        if self.objective not in OBJECTIVES:
            errors.append(f"objective must be sft, dpo or grpo (got {self.objective!r})")
        elif self.objective == "dpo" and not self.lora_rank:
            errors.append(
                "objective=dpo uses the base with adapters disabled as its reference model: "
                "set lora_rank (full fine-tuning DPO is not supported)"
            )
        if not self.dpo_beta > 0:
            errors.append(f"dpo_beta must be > 0 (got {self.dpo_beta})")
        if self.eval_max_rows is not None and self.eval_max_rows < 1:
            errors.append(f"eval_max_rows must be >= 1 or unset (got {self.eval_max_rows})")
        if self.peak_flops is not None and self.peak_flops <= 0:
            errors.append(f"peak_flops must be > 0 or unset (got {self.peak_flops})")
        try:
            parse_size(self.export_shard_size)
        except ValueError as exc:
            errors.append(str(exc))
        return errors

    def _grpo_errors(self) -> list[str]:
        """objective=grpo's settings (the reward module is read, never run: trainer/grpo/)."""
        errors = []
        if self.grpo_group_size < 2:
            errors.append(
                f"grpo_group_size must be >= 2 (got {self.grpo_group_size}): advantages compare "
                "each completion with the others of its prompt"
            )
        if not 0 < self.grpo_temperature <= 10:
            errors.append(f"grpo_temperature must be in (0, 10] (got {self.grpo_temperature})")
        if not 0 < self.grpo_top_p <= 1:
            errors.append(f"grpo_top_p must be in (0, 1] (got {self.grpo_top_p})")
        if self.grpo_max_completion_tokens < 1:
            errors.append(
                f"grpo_max_completion_tokens must be >= 1 (got {self.grpo_max_completion_tokens})"
            )
        if self.grpo_loss_type not in LOSS_TYPES:
            errors.append(
                f"grpo_loss_type must be one of {', '.join(LOSS_TYPES)} (got {self.grpo_loss_type!r})"
            )
        if self.grpo_scale_rewards not in SCALE_REWARDS:
            errors.append(
                f"grpo_scale_rewards must be one of {', '.join(SCALE_REWARDS)} "
                f"(got {self.grpo_scale_rewards!r})"
            )
        if self.grpo_beta < 0 or self.grpo_epsilon_low < 0 or self.grpo_epsilon_high < 0:
            errors.append("grpo_beta, grpo_epsilon_low and grpo_epsilon_high must be >= 0")
        try:
            parse_rewards(self.rewards)
        except ValueError as exc:
            errors.append(str(exc))
        if self.objective != "grpo":
            return errors
        if not self.rewards.strip() and not self.reward_module:
            errors.append(
                "objective=grpo needs a reward: set rewards (built-ins, JSON) or reward_module"
            )
        if self.grpo_beta > 0 and not self.lora_rank:
            errors.append(
                "grpo_beta > 0 uses the base with adapters disabled as its reference: set "
                "lora_rank, or grpo_beta=0"
            )
        if self.quantize_base == "nf4":
            errors.append("objective=grpo does not support quantize_base=nf4 yet")
        return errors

    def _writes_into_inputs(self) -> list[str]:
        """The run writes OUTPUT and the exported model, never into its base model or tokenizer
        (`--model run/model --output run` would overwrite the base model's own weights)."""
        if not self.output:
            return []
        export = self.export_dir or storage.join(self.output, "model")
        errors = []
        for what, source in (("model", self.model), ("tokenizer", self.tokenizer)):
            if not source or not (storage.is_remote(source) or os.path.exists(source)):
                continue  # a hub id, or a path that does not exist (reported elsewhere)
            for flag, target in (("--output", self.output), ("export_dir", export)):
                into = storage.holds(source, target)
                if into or (flag == "export_dir" and storage.holds(target, source)):
                    errors.append(
                        f"{flag} {target!r} would write into the base {what} {source!r}: "
                        "choose an --output outside it (the trained model goes to OUTPUT/model)"
                    )
                    break
        return errors

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The config as one JSON object: how launchers hand it to every rank
        (`python -m trainer --config-json '<json>'`), instead of re-encoding it flag by flag.
        Fields at their default are left out (the same image reads it), so a manifest shows
        what this run sets."""
        default = TrainConfig()
        changed = {k: v for k, v in self.to_dict().items() if v != getattr(default, k)}
        return json.dumps(changed, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """Inverse of `to_json` (validated): `TrainConfig.from_json(c.to_json()) == c`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid trainer config: --config-json is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError("invalid trainer config: --config-json must be a JSON object")
        config = config_from_mapping(data)
        config.validate()
        return config


def parse_size(text: str) -> int:
    """'5GB' / '500MB' / '1024' -> bytes."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "B": 1}
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit) and upper[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return int(float(upper[: -len(unit)]) * factor)
    if upper.isdigit():
        return int(upper)
    raise ValueError(f"export_shard_size {text!r} is not a size like '5GB' or '500MB'")


def field_types() -> dict[str, Any]:
    """Field name -> its type (resolved annotations)."""
    return typing.get_type_hints(TrainConfig)


def config_from_mapping(values: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from field values of any source (YAML, JSON, a pipeline's overrides), each
    coerced to its field's type. Unknown fields and bad values are reported together; the
    config's own rules are `TrainConfig.errors()`'s job."""
    types_by_name = field_types()
    errors = [f"unknown field {name!r}" for name in sorted(set(values) - set(types_by_name))]
    kwargs = {}
    for name in types_by_name.keys() & values.keys():
        try:
            kwargs[name] = coerce_field(name, values[name], types_by_name[name])
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        raise ValueError("invalid trainer config: " + "; ".join(errors))
    return TrainConfig(**kwargs)
