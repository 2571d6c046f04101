"""Peak training memory per GPU for full fine-tuning, LoRA and QLoRA: a closed-form estimate.

No torch (trainer/quantize.py imports it lazily): the pipeline's checks can call it before
anything starts. `estimate(shape, ...)` returns
the parts in bytes, `fits(...)` compares their sum with a GPU's memory; `replicates` is whether the
trainer replicates a model (DDP) or shards it (FSDP2), decided here for both. What each part counts,
and where its constant comes from, is written next to it; the parts follow how this trainer lays
the model out (trainer/model.py, trainer/quantize.py), not a generic trainer.

    weights      full / LoRA: fp32 master weights (this trainer keeps every parameter in fp32 and
                 computes in bf16 through FSDP2's MixedPrecisionPolicy), / world size when
                 sharded (FSDP2, ZeRO-3), plus the bf16 copies of the two blocks FSDP2 has
                 gathered at a time (the current one and the prefetched one).
                 QLoRA: the decoder blocks' linear weights in NF4, 0.516 bytes each
                 (`quantize.nf4_bytes`: 4 bits + one 8-bit scale per 64 values + an fp32 scale
                 per 256 scales: Dettmers et al. 2023, QLoRA, sec. 3), the rest (embeddings, LM
                 head, norms) frozen in bf16.
    trainable    full: fp32 gradient (4) + AdamW's two fp32 moments (8) per parameter, / world
                 when sharded. LoRA / QLoRA: the adapters (rank x (in + out) per target matrix)
                 with fp32 weight, gradient and moments: 16 bytes each.
    activations  bf16, per decoder block and token: 34 x hidden bytes (Korthikanti et al. 2022,
                 "Reducing Activation Recomputation in Large Transformer Models", eq. 1 without
                 the 5as/h attention-score term: SDPA / flash attention do not store the scores),
                 scaled by (2 hidden + 3 intermediate) / (2 hidden + 2 x 4 hidden) for a gated MLP
                 (the paper's count assumes a 4h GeLU MLP). With activation checkpointing, each
                 block keeps only its bf16 input (2 x hidden bytes per token) plus one block's full
                 activations during its recompute.
    logits       the LM head runs on target positions only (trainer/model.py); fp32 logits, their
                 log-softmax and gradient: 12 bytes x vocab per target token (target_fraction of
                 the batch's tokens; 1.0 is the worst case).
    overhead     CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation: a fixed 1 GB
                 plus 10% of the rest (an allowance, not a measurement; benchmarks/gpu_check.sh
                 reports the measured peak to compare with).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.quantize import nf4_bytes

GB = 1e9
OVERHEAD_FIXED = 1.0 * GB
"""CUDA context (~0.3-0.5 GB with torch's kernels loaded) + cuBLAS and NCCL workspaces."""
OVERHEAD_FRACTION = 0.10
"""Allocator fragmentation on top of the live tensors."""
ACTIVATION_BYTES_PER_HIDDEN = 34
"""bf16 bytes per token per hidden unit a transformer block saves for backward (Korthikanti et al.
2022, eq. 1, attention scores excluded)."""

METHODS = ("full", "lora", "qlora")


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a decoder-only transformer."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_hidden: int | None = None
    """Width of K and V (heads_kv x head_dim); None means hidden (no grouped-query attention)."""

    @property
    def block_linear_params(self) -> int:
        """Weights of the linear layers in all blocks (what NF4 quantizes)."""
        kv = self.kv_hidden or self.hidden
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    @classmethod
    def from_hf_config(cls, config: dict, params: int) -> ModelShape:
        """From a Hugging Face config.json (Llama-style field names)."""
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        return cls(
            params=params,
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            kv_hidden=int(config.get("num_key_value_heads", heads)) * head_dim,
        )


LLAMA2_7B = ModelShape(
    params=6_738_415_616, layers=32, hidden=4096, intermediate=11008, vocab=32000
)
"""meta-llama/Llama-2-7b-hf (config.json; parameters as `sum(p.numel())` reports)."""
LLAMA3_8B = ModelShape(
    params=8_030_261_248,
    layers=32,
    hidden=4096,
    intermediate=14336,
    vocab=128256,
    kv_hidden=1024,
)
"""meta-llama/Meta-Llama-3-8B (config.json)."""


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float
    trainable: float
    activations: float
    logits: float
    overhead: float
    gradients: float = 0.0
    """The gradients' share of `trainable` (4 bytes per trainable parameter): freed after every
    optimizer step (`zero_grad(set_to_none=True)`), so without gradient accumulation they grow
    in backward as the activations are freed, and the two never peak together."""

    @property
    def total(self) -> float:
        return self.weights + self.trainable + self.activations + self.logits + self.overhead

    def as_gb(self) -> dict[str, float]:
        parts = ("weights", "trainable", "activations", "logits", "overhead", "total")
        return {k: round(getattr(self, k) / GB, 2) for k in parts}


def lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters: rank x (in + out) for each targeted projection of each block."""
    h, kv, i = shape.hidden, shape.kv_hidden or shape.hidden, shape.intermediate
    dims = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    unknown = set(targets) - set(dims)
    if unknown:
        raise ValueError(f"unknown LoRA target(s) {sorted(unknown)}: use {sorted(dims)}")
    return shape.layers * sum(rank * sum(dims[t]) for t in targets)


def estimate(
    shape: ModelShape,
    *,
    method: str,
    seq_len: int,
    micro_batch_size: int,
    world_size: int = 1,
    lora_rank: int = 16,
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    activation_checkpointing: bool = False,
    target_fraction: float = 1.0,
) -> MemoryEstimate:
    """Peak memory of one training process (one GPU); see the module docstring for each part."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (got {method!r})")
    shard = world_size if world_size > 1 else 1
    block_params = shape.block_linear_params / shape.layers
    gathered = 2 * block_params * 2 if shard > 1 else 0.0  # two bf16 blocks in flight
    if method == "qlora":
        other = shape.params - shape.block_linear_params
        weights = (nf4_bytes(shape.block_linear_params) + 2 * other) / shard + gathered / 2
    else:
        weights = 4 * shape.params / shard + gathered
    if method == "full":
        trainable = 12 * shape.params / shard
        gradients = 4 * shape.params / shard
    else:
        trainable = 16 * lora_params(shape, lora_rank, lora_targets)
        gradients = trainable / 4
    tokens = seq_len * micro_batch_size
    mlp_scale = (2 * shape.hidden + 3 * shape.intermediate) / (2 * shape.hidden + 8 * shape.hidden)
    per_block = ACTIVATION_BYTES_PER_HIDDEN * shape.hidden * tokens * mlp_scale
    if activation_checkpointing:
        activations = 2 * shape.hidden * tokens * shape.layers + per_block
    else:
        activations = per_block * shape.layers
    logits = 12 * shape.vocab * tokens * target_fraction
    live = weights + trainable + activations + logits
    overhead = OVERHEAD_FIXED + OVERHEAD_FRACTION * live
    return MemoryEstimate(weights, trainable, activations, logits, overhead, gradients)


def fits(estimate_: MemoryEstimate, gpu_memory_bytes: float) -> bool:
    """Whether the estimate's total fits a GPU with this much memory."""
    return estimate_.total <= gpu_memory_bytes


def kv_cache_bytes(shape: ModelShape, sequences: int, tokens: int, dtype_bytes: int = 2) -> float:
    """The KV cache of `generate` for `sequences` rows of `tokens` (prompt + completion) each:
    K and V, per layer, kv_hidden wide (grouped-query attention shrinks it), in the compute dtype
    (bf16: 2 bytes). GRPO's rollout holds it for prompts x G rows at once."""
    kv = shape.kv_hidden or shape.hidden
    return 2.0 * shape.layers * kv * tokens * sequences * dtype_bytes


def grpo_peak(
    train: MemoryEstimate,
    shape: ModelShape,
    *,
    completions: int,
    prompt_tokens: int,
    completion_tokens: int,
) -> float:
    """Peak bytes of a GRPO process: the larger of its training peak and its rollout peak. The
    rollout runs without gradients before the step's first backward (trainer/grpo/policy_step.py),
    so its KV cache and sampling logits (fp32, vocab per row) never coexist with activations; the
    weights and optimizer state are live in both."""
    cache = kv_cache_bytes(shape, completions, prompt_tokens + completion_tokens)
    sampling_logits = 4.0 * shape.vocab * completions * 2  # logits and their softmax, one step
    live = train.weights + train.trainable + cache + sampling_logits
    rollout = OVERHEAD_FIXED + OVERHEAD_FRACTION * live + live
    return max(train.total, rollout)


def replicates(config: TrainConfig, parameters: int, world_size: int = 2) -> bool:
    """Whether `data_parallel` resolves to "replicate" for a model of this many parameters.

    An NF4 base on one process always replicates: FSDP2's one-process shortcut in torch 2.13
    (`FSDPParamGroup.wait_for_unshard`, world size 1) copies a single all-gather input and so
    breaks tensors with all-gather extensions such as NF4 ("not enough values to unpack");
    one process has nothing to shard anyway.
    """
    if config.quantize_base == "nf4" and world_size == 1:
        return True
    if config.data_parallel == "auto":
        return parameters <= config.replicate_max_params
    return config.data_parallel == "replicate"
