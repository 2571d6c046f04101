"""What a run costs: the estimate before launch, the budget check, the job timeout the budget
allows, and the actual cost from the training job's own start and end times.

The estimate is a throughput model, not a measurement of this run:

    tokens trained   = max_steps x global batch rows x seq_len        (what the trainer counts)
    tokens/s per GPU = MFU x peak FLOP/s / FLOPs per token
    FLOPs per token  = 6 x matmul parameters (4 with LoRA) + 12 x layers x hidden x seq_len
                       (trainer/metrics.py `flops_per_token`, the convention MFU is measured in)
    train wall time  = startup + tokens / (tokens/s per GPU x GPUs) + checkpoint saves
    GPU-hours        = train wall time x every GPU of the job (all are billed while it runs)

MFU is our own measured figure (`MFU_MEASURED`); the prices are a dated table (`GPU_HOUR_USD`)
that a run overrides with `gpu_hour_price_usd` and a user with a YAML/JSON file
(`load_prices`). Nothing here calls a network. The preprocess and evaluate steps are estimated
too (`PREPROCESS_TOKENS_PER_VCPU_S`, `EVAL_HOURS`), so the budget covers the whole pipeline.

Units: USD, hours, tokens. `None` means "cannot be estimated" (a CPU-only local run has no GPU
throughput model; a model whose size is unknown).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.platform.capacity import CAPACITIES
from components.platform.node_facts import interconnect_note
from components.platform.platform_facts import (
    GKE_SPOT_POD_GRACE_S,
    accelerator,
    unlisted_vertex_accelerator,
)

# --- prices -------------------------------------------------------------------------------------

PRICES_WRITTEN = "2026-12-04"
"""When `GPU_HOUR_USD` was written down (not fetched by this code, and not re-checked online)."""
PRICES_SOURCE = (
    "on-demand: Compute Engine on-demand machine prices, us-central1 (cloud.google.com/compute/"
    "gpus-pricing; e.g. a2-highgpu-1g ~3.67, a2-ultragpu-1g ~5.07, a3-highgpu ~10.98 per GPU-hour), "
    "rounded up, per GPU-hour with the host machine's share (machine price / GPUs per machine). "
    "Vertex AI custom training charges a premium over these: they are a lower bound of Vertex's "
    "price. spot: a flat ~0.35-0.40 x on-demand ratio, NOT a published price (Compute Engine's "
    "own Spot price of an H100 was ~6.57 in a 2026-09 billing-catalog reading, this table says "
    "3.90). flex-start: 0.5 x on-demand, a ratio, NOT a published price; only for the GPUs "
    "Vertex offers flex-start on (platform_facts.VERTEX_FLEX_START_GPUS). Written from memory of "
    "the pricing pages, not re-checked online: confirm for your region and contract, and "
    "override with `gpu_hour_price_usd` or `llmft run --prices FILE`. The budget's timeout uses "
    "the on-demand figure unless you give a price (`budget_gpu_hour_usd`)"
)
RATIO_PRICED = ("spot", "flex-start")
"""Capacities whose table prices are ratios of on-demand, not transcribed prices."""

GPU_HOUR_USD: dict[str, dict[str, float]] = {
    "NVIDIA_B200": {"on-demand": 14.40, "spot": 5.60, "flex-start": 7.20},
    "NVIDIA_H200_141GB": {"on-demand": 12.60, "spot": 4.90, "flex-start": 6.30},
    "NVIDIA_H100_MEGA_80GB": {"on-demand": 11.70, "spot": 4.20, "flex-start": 5.85},
    "NVIDIA_H100_80GB": {"on-demand": 11.30, "spot": 3.90, "flex-start": 5.65},
    "NVIDIA_A100_80GB": {"on-demand": 5.10, "spot": 2.00, "flex-start": 2.55},
    "NVIDIA_TESLA_A100": {"on-demand": 3.70, "spot": 1.50, "flex-start": 1.85},
    "NVIDIA_L4": {"on-demand": 1.00, "spot": 0.40, "flex-start": 0.50},
    # No flex-start rows: Vertex AI offers no flex-start on T4 or V100 (check_flex_start_accelerator).
    "NVIDIA_TESLA_T4": {"on-demand": 0.55, "spot": 0.22},
    "NVIDIA_TESLA_V100": {"on-demand": 2.90, "spot": 1.10},
}
"""USD per GPU-hour by Vertex accelerator name and capacity type (see PRICES_SOURCE: on-demand
rows are Compute Engine figures, spot and flex-start are ratios)."""

DATAFLOW_VCPU_HOUR_USD = 0.056
"""Dataflow batch worker vCPU-hour (cloud.google.com/dataflow/pricing, us-central1)."""
DATAFLOW_GB_HOUR_USD = 0.003557
"""Dataflow batch worker memory GB-hour (same page)."""
DATAFLOW_GB_PER_VCPU = 3.75
"""Memory per vCPU of Dataflow's default n1-standard workers."""

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
BYTES_PER_TOKEN = 2.86
"""Raw JSONL bytes per token before preprocessing: 32 MB -> 11.2M tokens in the preprocess
benchmark (8k BPE tokenizer, docs/performance.md); larger vocabularies give fewer tokens, so the
estimate errs high."""
CHECKPOINT_S_PER_GB = 9.4
"""Seconds to save one GB of DCP checkpoint per node: 9.44 s/GB measured on this project's
2-core CI machine under load 6-10 (2 ranks, local disk, 1.61 GB, median of 3:
benchmarks/checkpoint_bench.py, docs/performance.md "checkpoint"). A GPU node's disks and CPUs
are faster, gs:// is slower: a conservative stand-in until measured there."""
CHECKPOINT_BYTES_PER_PARAM = 4
"""fp32 master weights; + 8 bytes (AdamW's two moments) per trainable parameter."""
CHECKPOINT_BYTES_PER_TRAINABLE = 8


# --- the model ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSize:
    """What the throughput model needs to know about the model."""

    parameters: int
    """All parameters."""
    matmul_parameters: int
    """Parameters in matrix products (all but the input embedding)."""
    layers: int = 0
    """Decoder layers (0: unknown, the attention term is left out)."""
    hidden: int = 0
    """Hidden size."""

    @classmethod
    def of_count(cls, parameters: int) -> ModelSize:
        """Only the parameter count known (`model_parameters`): every parameter in matmuls."""
        return cls(parameters=parameters, matmul_parameters=parameters)


def model_size(model_dir: str) -> ModelSize:
    """The size of the Hugging Face model at `model_dir` (local or any fsspec URI) from its
    config.json (`size_of(model_config(model_dir))`).

    Raises:
        ValueError: no readable config.json there (a hub id offline, no credentials).
    """
    return size_of(model_config(model_dir))


def model_config(model_dir: str) -> Any:
    """The transformers config of the model at `model_dir`, read from its config.json alone: a
    local directory, any fsspec URI, or a Hugging Face Hub id (`hub_config_text`).

    Raises:
        ValueError: no readable config.json there, saying why (offline, a gated model without
            a token or without access, no such file or repository, the Hub unreachable).
    """
    from transformers import AutoConfig

    from components.evaluation.loading import is_hub_id
    from trainer import storage

    try:
        if is_hub_id(model_dir):
            text = hub_config_text(model_dir)
        else:
            text = storage.read_text(f"{model_dir.rstrip('/')}/config.json")
        config_dict = json.loads(text)
    except Exception as exc:  # OSError, bad JSON, and the hub client's own HTTP and offline errors
        raise ValueError(f"cannot read the config.json of {model_dir} ({_why(exc)})") from None
    return AutoConfig.for_model(**config_dict)


HUB_TIMEOUT_S = 10
"""One attempt at the Hub, this long at most, before a Hub model's config.json is downloaded:
huggingface_hub retries an unanswered request 6 times at 60 s each (~6.5 min per file), which
would hold `llmft run` or the validate step on a network without a route to the Hub."""


def hub_config_text(repo_id: str) -> str:
    """A Hub model's config.json: from huggingface_hub's cache when it is there, else one bounded
    request (`HUB_TIMEOUT_S`) and then the download. The answer, or the error, is kept for the
    process: the fit check and the estimate both ask. The token is the one huggingface_hub finds
    (HF_TOKEN or a saved login); `HF_ENDPOINT` and `HF_HUB_OFFLINE` apply."""
    found = _hub_config(repo_id)
    if isinstance(found, Exception):
        raise found
    return found


@functools.cache
def _hub_config(repo_id: str) -> str | Exception:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        try:
            return Path(hf_hub_download(repo_id, "config.json", local_files_only=True)).read_text()
        except LocalEntryNotFoundError:
            pass
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
        return Path(hf_hub_download(repo_id, "config.json")).read_text()
    except Exception as exc:  # the hub client's HTTP, offline and connection errors
        return exc


def _why(exc: Exception) -> str:
    """What to tell a user whose model's config.json could not be read."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import GatedRepoError

    if isinstance(exc, GatedRepoError):
        if get_token():
            return "a gated model this token has no access to: accept its licence on the Hub"
        return "a gated model and no token here: set HF_TOKEN (a pipeline: hf_token_secret)"
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def size_of(config: Any) -> ModelSize:
    """A model's size from its transformers config, counted exactly on the meta device (no
    weights are read or allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    text = config.get_text_config()
    return ModelSize(
        parameters=total,
        matmul_parameters=total - embedding,
        layers=int(getattr(text, "num_hidden_layers", 0) or 0),
        hidden=int(getattr(text, "hidden_size", 0) or 0),
    )


def flops_per_token(size: ModelSize, seq_len: int, *, lora: bool) -> float:
    """Training FLOPs per token: the trainer's own formula (trainer/metrics.py), the convention
    the MFU in `MFU_MEASURED` was measured in."""
    from trainer.metrics import flops_per_token as trainer_flops_per_token

    return trainer_flops_per_token(
        size.matmul_parameters, size.layers, size.hidden, seq_len, lora=lora
    )


def checkpoint_gb(size: ModelSize, *, lora: bool) -> float:
    """Size of one DCP checkpoint in GB (fp32 weights + AdamW moments of what trains)."""
    trainable = 0 if lora else size.parameters  # LoRA adapters are small next to the base
    return (
        size.parameters * CHECKPOINT_BYTES_PER_PARAM + trainable * CHECKPOINT_BYTES_PER_TRAINABLE
    ) / 1e9


# --- prices -------------------------------------------------------------------------------------


def load_prices(path: str) -> dict[str, dict[str, float]]:
    """`GPU_HOUR_USD` updated from a YAML/JSON file of the same shape
    (`{NVIDIA_H100_80GB: {spot: 3.5}}`; GKE names accepted)."""
    import yaml

    from trainer import storage

    data = yaml.safe_load(storage.read_text(path)) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping accelerator -> capacity -> USD per GPU-hour")
    prices = {name: dict(by_capacity) for name, by_capacity in GPU_HOUR_USD.items()}
    for name, by_capacity in data.items():
        gpu = accelerator(str(name)).vertex_name
        if not isinstance(by_capacity, Mapping) or not all(
            c in CAPACITIES and isinstance(v, int | float) and v >= 0
            for c, v in by_capacity.items()
        ):
            raise ValueError(
                f"{path}: {name}: give USD per GPU-hour for {', '.join(CAPACITIES)}, e.g. "
                "{spot: 3.5}"
            )
        prices.setdefault(gpu, {}).update({c: float(v) for c, v in by_capacity.items()})
    return prices


def gpu_hour_price(
    accelerator_type: str,
    capacity: str,
    *,
    override: float = 0.0,
    prices: Mapping[str, Mapping[str, float]] | None = None,
) -> float:
    """USD per GPU-hour: `override` when set, else the table's (ValueError: not in it)."""
    if override:
        return override
    table = GPU_HOUR_USD if prices is None else prices
    gpu = accelerator(accelerator_type).vertex_name
    try:
        return float(table[gpu][capacity])
    except KeyError:
        raise ValueError(
            f"no {capacity} price for {gpu} in the price table: set gpu_hour_price_usd"
        ) from None


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
            f"written {PRICES_WRITTEN}, not checked online (components/preflight/cost.py)"
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
    cloud = shape.backend != "local"
    gpus = shape.nodes * shape.gpus_per_node if cloud else 0
    notes: list[str] = []
    # A Vertex accelerator platform_facts does not list (NVIDIA_GB200) is allowed: its price and
    # peak are unknown, so the estimate says so instead of refusing the run (review 29 P5).
    unlisted = bool(gpus) and unlisted_vertex_accelerator(shape.accelerator_type)
    if unlisted:
        price = gpu_hour_price_usd
        notes.append(
            f"{shape.accelerator_type} is not in components/platform/platform_facts.py: training time "
            "unknown" + ("" if price else ", and its price too (set gpu_hour_price_usd)")
        )
    else:
        price = (
            gpu_hour_price(
                shape.accelerator_type, shape.capacity, override=gpu_hour_price_usd, prices=prices
            )
            if gpus
            else 0.0
        )
    budget_price = (
        _budget_price(shape, price, override=gpu_hour_price_usd, prices=prices)
        if gpus and not unlisted
        else price
    )
    if gpus and budget_price != price:
        notes.append(
            f"the {shape.capacity} price ${price:.2f}/GPU-h is a ratio of on-demand, not a "
            f"published price: the budget's timeout uses on-demand, ${budget_price:.2f}/GPU-h "
            "(give gpu_hour_price_usd or --prices to use your own)"
        )
    per_gpu: float | None = None
    train_hours: float | None = None
    if unlisted:
        pass
    elif gpus and model is not None:
        peak = accelerator(shape.accelerator_type).peak_tflops * 1e12
        per_gpu = (
            MFU_MEASURED[shape.compile]
            * peak
            / flops_per_token(model, shape.seq_len, lora=shape.lora)
        )
        compute_s = tokens / (per_gpu * gpus)
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
    elif gpus:
        notes.append(
            f"training time unknown: the model's size is unknown ({model_unknown or 'no size'}"
            "): set model_parameters"
        )
    else:
        notes.append("local training: runs on this machine, not priced")
    train_gpu_hours = (train_hours or 0.0) * gpus
    train = StepCost(
        "train",
        train_hours,
        train_gpu_hours,
        train_gpu_hours * price,
        f"{shape.nodes} x {shape.gpus_per_node} {shape.accelerator_type or 'CPU'} at "
        f"${price:.2f}/GPU-h"
        + (
            f", {per_gpu:,.0f} tokens/s/GPU at MFU {MFU_MEASURED[shape.compile]:.1%}"
            if per_gpu
            else ""
        ),
    )
    return Estimate(
        steps=(_preprocess(shape, data_tokens), train, _evaluate(shape, prices)),
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


def tokens_from_bytes(size: int) -> int:
    """Tokens expected from `size` bytes of raw records (`BYTES_PER_TOKEN`)."""
    return math.ceil(size / BYTES_PER_TOKEN)


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


# --- the actual cost ----------------------------------------------------------------------------

COST_FILE = "cost.json"
"""The training job's actual cost (`actual_cost`), written by the train step into the trainer's
run directory; the evaluate step keeps it in metrics.json and the report."""


def actual_cost(
    *, started: str, ended: str, gpus: int, gpu_hour_usd: float, capacity: str
) -> dict[str, Any]:
    """The training job's cost from its own start and end times (ISO 8601 with a zone)."""
    import datetime as dt

    start, end = dt.datetime.fromisoformat(started), dt.datetime.fromisoformat(ended)
    hours = max(0.0, (end - start).total_seconds() / 3600)
    return {
        "started": started,
        "ended": ended,
        "hours": round(hours, 4),
        "gpus": gpus,
        "gpu_hours": round(hours * gpus, 4),
        "gpu_hour_usd": gpu_hour_usd,
        "capacity": capacity,
        "cost_usd": round(hours * gpus * gpu_hour_usd, 2),
    }


# --- from a run's parameters --------------------------------------------------------------------


def shape_of(params: Any) -> RunShape:
    """The `RunShape` of a `RunParams` (the trainer's own config gives batch and engine)."""
    from components.params.param_checks import resolve_nproc_per_node
    from components.params.trainer_params import planned_trainer_config

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
    )


def input_bytes(uri: str, *, remote: bool) -> int | None:
    """Total size of the raw input files (a path, glob or gs:// URI); None when it cannot be
    listed here (gs:// outside the pipeline, a placeholder, nothing matches)."""
    if not uri or "{{" in uri or ("://" in uri and not remote):
        return None
    import fsspec

    try:
        fs, _, paths = fsspec.get_fs_token_paths(uri, expand=True)
        return sum(int(fs.size(p) or 0) for p in paths if fs.isfile(p)) or None
    except (OSError, ValueError):
        return None


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
