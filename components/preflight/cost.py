"""What a run is expected to cost: the estimate per pipeline step before launch, the budget check
(`max_cost_usd`) and the job timeout the budget allows.

The estimate is a throughput model, not a measurement of this run:

    tokens trained   = max_steps x global batch rows x seq_len        (what the trainer counts)
                       (objective=grpo: rows are prompts, each G completions of at most
                       seq_len + max completion tokens; plus the rollouts' generating time,
                       `rollout_seconds`: decoding bound by memory bandwidth)
    tokens/s per GPU = MFU x peak FLOP/s / FLOPs per token
    FLOPs per token  = 6 x matmul parameters (4 with LoRA) + 12 x layers x hidden x seq_len
                       (trainer/gpu_peaks.py `flops_per_token`, the convention MFU is measured in)
    train wall time  = startup + tokens / (tokens/s per GPU x GPUs) + checkpoint saves
    GPU-hours        = train wall time x every GPU of the job (all are billed while it runs)

MFU is our own measured figure (`MFU_MEASURED`); the prices are a dated table
(components/preflight/prices.py) that a run overrides with `gpu_hour_price_usd` and a user with
a YAML/JSON file (`load_prices`). Nothing here calls a network. The preprocess and evaluate steps
are estimated too (`PREPROCESS_TOKENS_PER_VCPU_S`, `EVAL_HOURS`), so the budget covers the whole
pipeline. The model's size comes from components/preflight/model_size.py; the actual cost after
the job, from components/preflight/actual_cost.py.

Units: USD, hours, tokens. `None` means "cannot be estimated" (a CPU-only local run has no GPU
throughput model; a model whose size is unknown).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from components.platform.platform_facts import (
    GKE_SPOT_POD_GRACE_S,
    accelerator,
    unlisted_vertex_accelerator,
)
from components.preflight.model_size import ModelSize, checkpoint_gb, flops_per_token
from components.preflight.prices import (
    DATAFLOW_GB_HOUR_USD,
    DATAFLOW_GB_PER_VCPU,
    DATAFLOW_VCPU_HOUR_USD,
    GPU_HOUR_USD,
    PRICES_WRITTEN,
    RATIO_PRICED,
    gpu_hour_price,
)

# --- throughput and fixed times -----------------------------------------------------------------

MFU_MEASURED = {True: 0.528, False: 0.409}
"""Model FLOPs utilisation by `compile` (True: per-block torch.compile, the GPU default): our
measurement on one H200, a 1.1B Llama, seq_len 4096, FSDP2 bf16 (docs/performance.md, "gpu",
2026-12-04: 62,006 tokens/s = 52.8% compiled, 48,081 = 40.9% eager). Assumed for every GPU
model and size until measured there: multi-node communication and small models lower it."""
STARTUP_S = 300.0
"""Seconds a training job is billed before its first step: machines, image pull, model
download, compile. Assumed, not measured in the cloud (the H200 check built its model and
compiled in about a minute: docs/performance.md "gpu")."""
EVAL_HOURS = 0.25
"""Wall hours of the evaluate step on its GPU (generation for max_eval_examples prompts with
two or three models). Assumed, not measured."""
PREPROCESS_TOKENS_PER_VCPU_S = 480_000.0
"""Preprocessing throughput: 11.2M tokens in 11.66 s on 2 cores (docs/performance.md,
"preprocess", third round), per vCPU-second."""
DATAFLOW_STARTUP_S = 300.0
"""Dataflow's worker start and teardown, billed per job (assumed: "a few minutes")."""
DECODE_BANDWIDTH_EFFICIENCY = 0.5
"""Share of the GPU's peak memory bandwidth one decoding step of transformers' `generate` reaches
while it reads the weights (GRPO's rollouts). Assumed, not measured here."""
DECODE_STEP_OVERHEAD_S = 0.02
"""Seconds of Python and kernel launches per generated token of `generate` beside the weight
reads (eager, per step of the batch). Assumed, not measured on a GPU here."""
CHECKPOINT_S_PER_GB = 9.4
"""Seconds to save one GB of DCP checkpoint per node: 9.44 s/GB measured on this project's
2-core CI machine under load 6-10 (2 ranks, local disk, 1.61 GB, median of 3:
benchmarks/checkpoint_bench.py, docs/performance.md "checkpoint"). A GPU node's disks and CPUs
are faster, gs:// is slower: a conservative stand-in until measured there."""


# --- the estimate -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """One pipeline step's expected cost."""

    step: str
    hours: float | None
    """Wall hours (None: unknown)."""
    gpu_hours: float
    usd: float
    basis: str
    """How it was computed, in a few words."""


@dataclass(frozen=True)
class Estimate:
    """The expected cost of a run, per pipeline step."""

    steps: tuple[StepCost, ...]
    train_tokens: int
    optimizer_steps: int
    gpus: int
    """GPUs of the training job (all nodes)."""
    gpu_hour_usd: float
    """Training price per GPU-hour used."""
    tokens_per_s_per_gpu: float | None
    capacity: str
    data_tokens: int | None = None
    """Tokens in the data (manifest, or estimated from the input's size); None: unknown."""
    notes: tuple[str, ...] = field(default=())
    budget_gpu_hour_usd: float = 0.0
    """Price per GPU-hour the budget's timeout uses (on-demand unless the user gave a price;
    0: as `gpu_hour_usd`)."""

    @property
    def usd(self) -> float:
        return sum(s.usd for s in self.steps)

    @property
    def gpu_hours(self) -> float:
        return sum(s.gpu_hours for s in self.steps)

    @property
    def hours(self) -> float | None:
        known = [s.hours for s in self.steps]
        return None if any(h is None for h in known) else sum(h for h in known if h is not None)

    def step(self, name: str) -> StepCost:
        return next(s for s in self.steps if s.step == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "steps": [asdict(s) for s in self.steps],
            "usd": round(self.usd, 2),
            "gpu_hours": round(self.gpu_hours, 3),
            "hours": None if self.hours is None else round(self.hours, 3),
            "prices_written": PRICES_WRITTEN,
        }

    def table(self) -> str:
        """A few lines for the terminal and the validate step's log."""
        lines = [f"{'step':<12}{'wall h':>9}{'GPU-h':>10}{'USD':>10}  basis"]
        for s in self.steps:
            hours = "?" if s.hours is None else f"{s.hours:.2f}"
            lines.append(f"{s.step:<12}{hours:>9}{s.gpu_hours:>10.2f}{s.usd:>10.2f}  {s.basis}")
        total_h = "?" if self.hours is None else f"{self.hours:.2f}"
        lines.append(f"{'total':<12}{total_h:>9}{self.gpu_hours:>10.2f}{self.usd:>10.2f}")
        epochs = (
            f", {self.train_tokens / self.data_tokens:.2f} epochs of ~{self.data_tokens:,} tokens"
            if self.data_tokens
            else ""
        )
        lines.append(
            f"{self.optimizer_steps} steps x {self.train_tokens // max(self.optimizer_steps, 1):,}"
            f" tokens = {self.train_tokens:,} tokens{epochs}; {self.capacity} capacity; prices "
            f"written {PRICES_WRITTEN}, not checked online (components/preflight/prices.py)"
        )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


@dataclass(frozen=True)
class RunShape:
    """The facts of a run the estimate reads (from `RunParams` and the trainer's config)."""

    backend: str
    nodes: int
    gpus_per_node: int
    accelerator_type: str
    capacity: str
    max_steps: int
    global_batch_rows: int
    seq_len: int
    lora: bool = False
    compile: bool = True
    checkpoint_every: int = 0
    checkpoint_every_minutes: float = 0.0
    preprocess_runner: str = "DirectRunner"
    eval_accelerator_type: str = ""
    eval_gpus: int = 0
    processes_per_node: int = 1
    """The trainer's processes on each node (what a local run's line shows: it has no GPUs)."""
    grpo_group_size: int = 0
    """objective=grpo: completions per prompt (0: not GRPO; `global_batch_rows` are prompts)."""
    grpo_completion_tokens: int = 0
    """objective=grpo: the longest completion generated."""
    grpo_rollouts_per_rank: int = 0
    """objective=grpo: `generate` calls per rank and step (micro-batches: grad_accum_steps)."""
    grpo_rows_per_rollout: int = 0
    """objective=grpo: sequences one `generate` call decodes (micro_batch_size x G)."""
    grpo_iterations: int = 1
    """objective=grpo: optimizer steps per rollout (grpo_num_iterations): one rollout in that
    many steps."""


def estimate(
    shape: RunShape,
    *,
    model: ModelSize | None,
    data_tokens: int | None = None,
    gpu_hour_price_usd: float = 0.0,
    prices: Mapping[str, Mapping[str, float]] | None = None,
    model_unknown: str = "",
) -> Estimate:
    """The expected cost of `shape` per pipeline step (preprocess, train, evaluate).

    Args:
        shape: the run.
        model: the base model's size; None leaves the training time unknown (0 USD: a budget
            check then refuses, see `budget_error`).
        data_tokens: tokens in the training data (manifest) or estimated from the raw input's
            size (`tokens_from_bytes`); None: preprocessing is not estimated.
        gpu_hour_price_usd: overrides the table for the training GPUs.
        prices: the price table (default `GPU_HOUR_USD`).
        model_unknown: why `model` is None, for the note (e.g. its config.json's read error).
    """
    tokens = shape.max_steps * shape.global_batch_rows * shape.seq_len
    if shape.grpo_group_size:  # prompts x G completions, each prompt + completion long (at most)
        tokens *= shape.grpo_group_size * (shape.seq_len + shape.grpo_completion_tokens)
        tokens //= shape.seq_len
    gpus = shape.nodes * shape.gpus_per_node if shape.backend != "local" else 0
    notes: list[str] = []
    # A Vertex accelerator platform_facts does not list (NVIDIA_GB200) is allowed: its price and
    # peak are unknown, so the estimate says so instead of refusing the run (review 29 P5).
    unlisted = bool(gpus) and unlisted_vertex_accelerator(shape.accelerator_type)
    price, budget_price = _train_prices(
        shape, gpus, unlisted=unlisted, override=gpu_hour_price_usd, prices=prices, notes=notes
    )
    per_gpu: float | None = None
    train_hours: float | None = None
    if unlisted:
        pass
    elif gpus and model is not None:
        per_gpu, train_hours = _train_time(shape, model, gpus=gpus, tokens=tokens, notes=notes)
    elif gpus:
        notes.append(
            f"training time unknown: the model's size is unknown ({model_unknown or 'no size'}"
            "): set model_parameters"
        )
    return Estimate(
        steps=(
            _preprocess(shape, data_tokens),
            _train(shape, train_hours, gpus=gpus, price=price, per_gpu=per_gpu),
            _evaluate(shape, prices),
        ),
        train_tokens=tokens,
        optimizer_steps=shape.max_steps,
        gpus=gpus,
        gpu_hour_usd=price,
        budget_gpu_hour_usd=budget_price,
        tokens_per_s_per_gpu=per_gpu,
        capacity=shape.capacity,
        data_tokens=data_tokens,
        notes=tuple(notes),
    )


def _train_prices(
    shape: RunShape,
    gpus: int,
    *,
    unlisted: bool,
    override: float,
    prices: Mapping[str, Mapping[str, float]] | None,
    notes: list[str],
) -> tuple[float, float]:
    """The training GPUs' price per GPU-hour, and the one the budget's timeout uses
    (`_budget_price`); `notes` gets why either is unknown or why they differ."""
    if unlisted:
        price = override
        notes.append(
            f"{shape.accelerator_type} is not in components/platform/platform_facts.py: training time "
            "unknown" + ("" if price else ", and its price too (set gpu_hour_price_usd)")
        )
    else:
        price = (
            gpu_hour_price(shape.accelerator_type, shape.capacity, override=override, prices=prices)
            if gpus
            else 0.0
        )
    budget_price = (
        _budget_price(shape, price, override=override, prices=prices)
        if gpus and not unlisted
        else price
    )
    if gpus and budget_price != price:
        notes.append(
            f"the {shape.capacity} price ${price:.2f}/GPU-h is a ratio of on-demand, not a "
            f"published price: the budget's timeout uses on-demand, ${budget_price:.2f}/GPU-h "
            "(give gpu_hour_price_usd or --prices to use your own)"
        )
    return price, budget_price


def _train_time(
    shape: RunShape, model: ModelSize, *, gpus: int, tokens: int, notes: list[str]
) -> tuple[float, float]:
    """Tokens/s per GPU and the training job's wall hours (startup, compute, checkpoint saves);
    `notes` gets a warning when a SIGTERM save outlasts a Spot pod's grace."""
    peak = accelerator(shape.accelerator_type).peak_tflops * 1e12
    per_gpu = (
        MFU_MEASURED[shape.compile] * peak / flops_per_token(model, shape.seq_len, lora=shape.lora)
    )
    compute_s = tokens / (per_gpu * gpus)
    if shape.grpo_group_size:
        rollouts = -(-shape.max_steps // max(shape.grpo_iterations, 1))
        rollout_s = rollouts * rollout_seconds(shape, model)
        notes.append(
            f"objective=grpo: of the training job, ~{rollout_s / 3600:.2f} h generating "
            f"(rollouts of {shape.grpo_rows_per_rollout} sequences x "
            f"{shape.grpo_completion_tokens} tokens, bound by memory bandwidth) and "
            f"~{compute_s / 3600:.2f} h training; assumed efficiencies, not measured on a GPU"
        )
        compute_s += rollout_s
    saves = _checkpoint_count(shape, compute_s)
    save_s = saves * checkpoint_gb(model, lora=shape.lora) * CHECKPOINT_S_PER_GB / shape.nodes
    train_hours = (STARTUP_S + compute_s + save_s) / 3600
    sigterm_save_s = checkpoint_gb(model, lora=shape.lora) * CHECKPOINT_S_PER_GB / shape.nodes
    if shape.capacity == "spot" and sigterm_save_s > GKE_SPOT_POD_GRACE_S:
        notes.append(
            f"a SIGTERM checkpoint takes ~{sigterm_save_s:.0f} s, more than the "
            f"{GKE_SPOT_POD_GRACE_S} s a preempted GKE Spot pod gets (a Spot VM has 30 s): "
            "a preemption may lose the work since the last time-based checkpoint (every "
            f"{shape.checkpoint_every_minutes:g} min)"
        )
    return per_gpu, train_hours


def rollout_seconds(shape: RunShape, model: ModelSize) -> float:
    """One optimizer step's generating time on a rank (GRPO): per `generate` call, the prompt's
    prefill at the measured MFU, then per completion token the larger of reading the bf16
    weights at `DECODE_BANDWIDTH_EFFICIENCY` of the bandwidth and its FLOPs, plus
    `DECODE_STEP_OVERHEAD_S`. Sharded weights are gathered whole for every step (FSDP2): each
    rank reads them all."""
    gpu = accelerator(shape.accelerator_type)
    peak = gpu.peak_tflops * 1e12 * MFU_MEASURED[False]
    rows = shape.grpo_rows_per_rollout
    flops = 2.0 * model.parameters * rows  # per generated token, all rows
    read_s = 2.0 * model.parameters / (gpu.memory_tbps * 1e12 * DECODE_BANDWIDTH_EFFICIENCY)
    per_token = max(read_s, flops / peak) + DECODE_STEP_OVERHEAD_S
    prefill = flops * shape.seq_len / peak
    return shape.grpo_rollouts_per_rank * (prefill + shape.grpo_completion_tokens * per_token)


def _train(
    shape: RunShape, hours: float | None, *, gpus: int, price: float, per_gpu: float | None
) -> StepCost:
    """The train step's cost: every GPU of the job billed for its wall hours (a local run: its
    processes on this machine, not priced)."""
    if shape.backend == "local":
        where = f"{shape.nodes} x {shape.processes_per_node} processes on this machine"
        return StepCost("train", None, 0.0, 0.0, f"{where}, not priced")
    gpu_hours = (hours or 0.0) * gpus
    return StepCost(
        "train",
        hours,
        gpu_hours,
        gpu_hours * price,
        f"{shape.nodes} x {shape.gpus_per_node} {shape.accelerator_type or 'CPU'} at "
        f"${price:.2f}/GPU-h"
        + (
            f", {per_gpu:,.0f} tokens/s/GPU at MFU {MFU_MEASURED[shape.compile]:.1%}"
            if per_gpu
            else ""
        ),
    )


def _budget_price(
    shape: RunShape,
    price: float,
    *,
    override: float,
    prices: Mapping[str, Mapping[str, float]] | None,
) -> float:
    """The price the budget's timeout is computed at: the user's own price (`override`, or a
    `--prices` entry differing from the table), else the table's on-demand price when the
    capacity's table price is only a ratio (RATIO_PRICED): on-demand is the upper bound, so the
    spend stays within the budget whatever the real Spot or flex-start price is."""
    if override:
        return override
    gpu = accelerator(shape.accelerator_type).vertex_name
    ours = GPU_HOUR_USD.get(gpu, {}).get(shape.capacity)
    if prices is not None and prices.get(gpu, {}).get(shape.capacity) != ours:
        return price  # the user's figure
    if shape.capacity not in RATIO_PRICED:
        return price
    on_demand = gpu_hour_price(shape.accelerator_type, "on-demand", prices=prices)
    return max(price, on_demand)


def _checkpoint_count(shape: RunShape, compute_s: float) -> int:
    """Saves during training: every N steps, every N minutes, and the one at the end."""
    by_steps = shape.max_steps // shape.checkpoint_every if shape.checkpoint_every else 0
    by_time = (
        int(compute_s // (shape.checkpoint_every_minutes * 60))
        if shape.checkpoint_every_minutes
        else 0
    )
    return by_steps + by_time + 1


def _preprocess(shape: RunShape, data_tokens: int | None) -> StepCost:
    if shape.preprocess_runner != "DataflowRunner":
        return StepCost("preprocess", None, 0.0, 0.0, "in the pipeline task, not priced")
    if data_tokens is None:
        return StepCost("preprocess", None, 0.0, 0.0, "Dataflow; input size unknown")
    vcpu_s = data_tokens / PREPROCESS_TOKENS_PER_VCPU_S
    vcpu_hours = vcpu_s / 3600 + DATAFLOW_STARTUP_S / 3600
    usd = vcpu_hours * (DATAFLOW_VCPU_HOUR_USD + DATAFLOW_GB_PER_VCPU * DATAFLOW_GB_HOUR_USD)
    return StepCost(
        "preprocess",
        None,  # wall time depends on how many workers Dataflow scales to
        0.0,
        usd,
        f"Dataflow, {vcpu_hours:.2f} vCPU-h for {data_tokens:,} tokens",
    )


def _evaluate(shape: RunShape, prices: Mapping[str, Mapping[str, float]] | None) -> StepCost:
    if shape.backend == "local" or not shape.eval_accelerator_type or not shape.eval_gpus:
        return StepCost("evaluate", None, 0.0, 0.0, "in the pipeline task, not priced")
    price = gpu_hour_price(shape.eval_accelerator_type, "on-demand", prices=prices)
    gpu_hours = EVAL_HOURS * shape.eval_gpus
    return StepCost(
        "evaluate",
        EVAL_HOURS,
        gpu_hours,
        gpu_hours * price,
        f"{shape.eval_gpus} x {shape.eval_accelerator_type} on-demand, {EVAL_HOURS} h assumed",
    )


# --- the budget ---------------------------------------------------------------------------------


def budget_error(est: Estimate, max_cost_usd: float) -> str | None:
    """Why a run with estimate `est` may not start under `max_cost_usd` (None: it may)."""
    if not max_cost_usd:
        return None
    if est.gpus and est.step("train").hours is None:
        why = "; ".join(n for n in est.notes if "training time unknown" in n)
        return f"max_cost_usd={max_cost_usd:g} needs a cost estimate, but {why}"
    if est.usd > max_cost_usd:
        train = est.step("train")
        return (
            f"estimated cost ${est.usd:,.2f} (train ${train.usd:,.2f}: {train.gpu_hours:,.1f} "
            f"GPU-h on {est.gpus} GPUs, {est.capacity}) exceeds max_cost_usd={max_cost_usd:g}: "
            "lower max_steps, nodes or the batch, use capacity=spot or flex-start, or raise "
            "max_cost_usd (`llmft run --dry-run` shows the estimate)"
        )
    return None


def budget_timeout_s(est: Estimate, max_cost_usd: float) -> int:
    """The training job's timeout that keeps its spend within the budget: what the budget leaves
    after the other steps, at the job's price per hour (0: no budget or nothing priced). The
    price is `budget_gpu_hour_usd`: on-demand, the upper bound, unless the user gave one (the
    table's Spot and flex-start figures are ratios, PRICES_SOURCE)."""
    per_hour = est.gpus * (est.budget_gpu_hour_usd or est.gpu_hour_usd)
    if not max_cost_usd or not per_hour:
        return 0
    left = max_cost_usd - sum(s.usd for s in est.steps if s.step != "train")
    return max(1, int(left / per_hour * 3600))
