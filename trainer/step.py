"""One optimizer step: forward and backward over the micro-batches, one stats all-reduce,
scaling and clipping of the gradients, AdamW.

Per optimizer step the gradient is exactly that of the mean loss over all target tokens (DPO:
all pairs) of the global batch, independent of how tokens fall on ranks and micro-batches: backward runs on summed
losses and the gradients are divided by the global target count afterwards.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainer.data import MicroBatch
from trainer.preference import STATS
from trainer.run_state import Run


@dataclass
class StepResult:
    """What one optimizer step reports (global values, every rank the same)."""

    loss: float
    """Mean loss per target token (sft) or per pair (dpo)."""
    grad_norm: float
    target_tokens: int
    extra: dict[str, float] = field(default_factory=dict)
    """DPO: mean reward margin and reward accuracy over the step's pairs; GRPO: reward, pass
    rate, KL, clipped share, seconds generating and training (trainer/grpo_step.py)."""
    tokens: int | None = None
    """Tokens processed (GRPO: prompt and completion tokens); None: the global batch's rows x
    seq_len (packed rows)."""


def optimizer_step(r: Run, micro: list[MicroBatch]) -> StepResult:
    """One optimizer step.

    One all-reduce per step besides the gradient reduction (FSDP2's or DDP's): backward runs on
    the summed loss, and the division by the global count of loss units (target tokens, or pairs
    for DPO), the gradient norm and the clipping are applied to the local gradient shards
    afterwards, from a single reduced vector [loss sum, units, stop flag, save flag, squared
    gradient norm, target tokens, DPO sums...]. Synchronisation points are what a step loses most time on when
    processes share busy CPUs or a slow network.
    """
    model, device = r.model, r.device
    dpo = r.config.objective == "dpo"
    local_units = sum(mb.pairs if dpo else mb.target_tokens for mb in micro)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    extra_sums = torch.zeros(len(STATS) - 1, dtype=torch.float64, device=device)
    for k, mb in enumerate(micro):
        # Reduce-scatter (FSDP2) or all-reduce (DDP, replicated) gradients once per step, on the
        # last micro-batch: accumulation micro-steps need no collective (DDP's no_sync).
        model.set_requires_gradient_sync(k == len(micro) - 1)
        inputs = [mb.input_ids, mb.position_ids, mb.loss_mask]
        if dpo:
            assert mb.pair_ids is not None, "objective=dpo needs a preference dataset"
            inputs.append(mb.pair_ids)
        out = model(*(t.to(device, non_blocking=True) for t in inputs))
        loss = out[0] if dpo else out
        # FSDP2 and DDP average gradients over ranks: x world_size turns that into the sum.
        (loss * r.world_size).backward()
        loss_sum += loss.detach().double()
        if dpo:
            extra_sums += out[1:].detach().double()
    loss_value, norm_value, target_count, extra, units = reduce_and_step(
        r, loss_sum, local_units, sum(mb.target_tokens for mb in micro), extra_sums
    )
    report = {name: value / units for name, value in zip(STATS[1:], extra, strict=True)}
    return StepResult(loss_value, norm_value, target_count, report if dpo else {})


def reduce_and_step(
    r: Run,
    loss_sum: torch.Tensor,
    local_units: float,
    target_tokens: int,
    extra_sums: torch.Tensor,
) -> tuple[float, float, int, list[float], int]:
    """After backward on this rank's summed loss: one all-reduce of [loss sum, units, stop flag,
    save flag, squared gradient norm, target tokens, extra sums...], then the gradients divided by
    the global units, clipped, and AdamW's step. Returns (mean loss, gradient norm, global target
    tokens, the global extra sums, the global units). Shared by SFT/DPO and GRPO's step
    (trainer/grpo_step.py)."""
    model, device = r.model, r.device
    # A time-based checkpoint is due by this rank's clock, this step's compute included.
    every_s = r.config.checkpoint_every_minutes * 60
    save_due = bool(every_s) and time.monotonic() - r.last_saved_at >= every_s
    grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
    squared = torch.stack(torch._foreach_norm(grads)).double().pow(2).sum() if grads else 0.0
    squared = torch.as_tensor(squared, dtype=torch.float64, device=device)

    def scalar(value: float) -> torch.Tensor:
        return torch.tensor(float(value), dtype=torch.float64, device=device)

    stats = torch.cat(
        [
            torch.stack(
                [
                    loss_sum,
                    scalar(local_units),
                    scalar(r.stop_requested),
                    scalar(save_due),
                    # Sharded: each rank holds a distinct shard of every gradient, squared norms
                    # add up. Replicated: every rank holds the whole reduced gradient, its norm
                    # is the global one.
                    torch.zeros_like(squared) if model.replicated else squared,
                    scalar(target_tokens),
                ]
            ),
            extra_sums.to(device),
        ]
    )
    dist.all_reduce(stats)
    loss_total, unit_count, stop, save, squared_total, target_count, *extra = stats.tolist()
    if model.replicated:
        squared_total = float(squared)
    r.stop_agreed = stop > 0
    r.save_agreed = save > 0
    units = max(int(unit_count), 1)
    norm_value = math.sqrt(squared_total) / units
    loss_value = loss_total / units
    if math.isfinite(loss_value) and math.isfinite(norm_value):
        coefficient = 1.0 / units
        if r.config.max_grad_norm > 0 and norm_value > r.config.max_grad_norm:
            coefficient *= r.config.max_grad_norm / (norm_value + 1e-6)
        _scaled_step(r.optimizer, grads, coefficient, device)
        r.scheduler.step()
    r.optimizer.zero_grad(set_to_none=True)
    return loss_value, norm_value, int(target_count), extra, units


def _scaled_step(
    optimizer: torch.optim.Optimizer,
    grads: list[torch.Tensor],
    coefficient: float,
    device: torch.device,
) -> None:
    """AdamW's step on the gradients times `coefficient`. The fused kernel divides each gradient
    by `grad_scale` (AMP's unscaling, fp32) in the pass it makes anyway: one read of the
    gradients less than scaling them first. Removed after the step, as GradScaler does: no later
    step may reuse it."""
    if optimizer.defaults.get("fused"):
        scale = torch.tensor(1.0 / coefficient, dtype=torch.float32, device=device)
        optimizer.grad_scale = scale  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
    else:
        torch._foreach_mul_(grads, coefficient)
        optimizer.step()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view: in-place ops change the DTensor); a plain tensor
    (DDP) as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor
