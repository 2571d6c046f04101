"""One optimizer step: forward and backward over the micro-batches, one stats all-reduce,
scaling and clipping of the gradients, AdamW.

Per optimizer step the gradient is exactly that of the mean loss over all target tokens of the
global batch, independent of how tokens fall on ranks and micro-batches: backward runs on summed
losses and the gradients are divided by the global target count afterwards.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from trainer.data import MicroBatch
from trainer.run_state import Run


def optimizer_step(r: Run, micro: list[MicroBatch]) -> tuple[float, float, int]:
    """One optimizer step. Returns (global mean loss, grad norm, global target tokens).

    One all-reduce per step besides the gradient reduction (FSDP2's or DDP's): backward runs on the summed loss, and
    the division by the global target count, the gradient norm and the clipping are applied to
    the local gradient shards afterwards, from a single reduced vector
    [loss sum, target count, stop flag, save flag, squared gradient norm]. Synchronisation points are what
    a step loses most time on when processes share busy CPUs or a slow network.
    """
    model, device = r.model, r.device
    local_targets = sum(mb.target_tokens for mb in micro)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for k, mb in enumerate(micro):
        # Reduce-scatter (FSDP2) or all-reduce (DDP, replicated) gradients once per step, on the
        # last micro-batch: accumulation micro-steps need no collective (DDP's no_sync).
        model.set_requires_gradient_sync(k == len(micro) - 1)
        loss = model(
            mb.input_ids.to(device, non_blocking=True),
            mb.position_ids.to(device, non_blocking=True),
            mb.loss_mask.to(device, non_blocking=True),
        )
        # FSDP2 and DDP average gradients over ranks: x world_size turns that into the sum.
        (loss * r.world_size).backward()
        loss_sum += loss.detach().double()
    # A time-based checkpoint is due by this rank's clock, this step's compute included.
    every_s = r.config.checkpoint_every_minutes * 60
    save_due = bool(every_s) and time.monotonic() - r.last_saved_at >= every_s
    grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
    squared = torch.stack(torch._foreach_norm(grads)).double().pow(2).sum() if grads else 0.0
    squared = torch.as_tensor(squared, dtype=torch.float64, device=device)
    stats = torch.stack(
        [
            loss_sum,
            torch.tensor(float(local_targets), dtype=torch.float64, device=device),
            torch.tensor(float(r.stop_requested), dtype=torch.float64, device=device),
            torch.tensor(float(save_due), dtype=torch.float64, device=device),
            # Sharded: each rank holds a distinct shard of every gradient, squared norms add up.
            # Replicated: every rank holds the whole reduced gradient, its norm is the global one.
            torch.zeros_like(squared) if model.replicated else squared,
        ]
    )
    dist.all_reduce(stats)
    loss_total, target_count, stop, save, squared_total = stats.tolist()
    if model.replicated:
        squared_total = float(squared)
    r.stop_agreed = stop > 0
    r.save_agreed = save > 0
    targets = int(target_count)
    norm_value = math.sqrt(squared_total) / max(targets, 1)
    loss_value = loss_total / max(targets, 1)
    if math.isfinite(loss_value) and math.isfinite(norm_value):
        coefficient = 1.0 / max(targets, 1)
        if r.config.max_grad_norm > 0 and norm_value > r.config.max_grad_norm:
            coefficient *= r.config.max_grad_norm / (norm_value + 1e-6)
        torch._foreach_mul_(grads, coefficient)
        r.optimizer.step()
        r.scheduler.step()
    r.optimizer.zero_grad(set_to_none=True)
    return loss_value, norm_value, targets


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view: in-place ops change the DTensor); a plain tensor
    (DDP) as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor
