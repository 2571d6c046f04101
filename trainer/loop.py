"""The train phase: optimizer steps until the last one, with metrics, checkpoints and preemption.

What one step computes is trainer/step.py; this module is what happens around it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainer import checkpoint, checkpoint_files
from trainer.attention import sdpa_kernels
from trainer.data import DataPosition
from trainer.divergence import DivergedError, DivergenceGuard
from trainer.gpu_peaks import flops_per_token
from trainer.grpo_step import grpo_optimizer_step
from trainer.metrics import peak_flops, peak_memory_bytes
from trainer.model import parameter_counts
from trainer.run_state import NonFiniteLossError, Preempted, Run, checkpoints_dir
from trainer.step import optimizer_step

log = logging.getLogger("trainer")


@dataclass
class Window:
    """Tokens and time since the last metrics record (checkpoint saves are not counted)."""

    started: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    targets: int = 0


def train(r: Run) -> None:
    assert r.batches is not None
    config = r.config
    r.model.train()
    per_token, peak = _flops(r)
    window = Window()
    batches = r.batches.iterate(r.state.position)
    if config.objective == "grpo":
        from trainer.grpo_step import rollout_batches  # torch-heavy GRPO code, only when chosen

        batches = rollout_batches(r, batches)
    with sdpa_kernels(config.sdpa_kernels):
        last_saved = _steps(r, window, batches, per_token, peak)
    if config.checkpoint_at_end and r.state.step != last_saved:
        save_checkpoint(r)


def _steps(r: Run, window: Window, batches: Any, per_token: float, peak: float | None) -> int:
    """Optimizer steps until the last one (or a preemption); returns the step last saved."""
    assert r.batches is not None
    config = r.config
    last_saved = r.state.step
    r.last_saved_at = time.monotonic()
    guard = DivergenceGuard(config.divergence_factor)
    step: Any = optimizer_step  # one micro-batch type per objective: packed rows or prompts
    if config.objective == "grpo":
        step = grpo_optimizer_step
    while r.state.step < r.total_steps:
        micro, position = next(batches)
        lr = r.optimizer.param_groups[0]["lr"]  # what this step uses; the step advances it
        result = step(r, micro)
        loss, grad_norm, targets = result.loss, result.grad_norm, result.target_tokens
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise NonFiniteLossError(
                f"step {r.state.step + 1}: loss={loss} grad_norm={grad_norm} is not finite; "
                f"stopped without saving or exporting: {_kept(r)}; lower lr (now {config.lr:g}) "
                "or check the data, then rerun (with --overwrite when lr changes)"
            )
        if config.objective != "grpo" and (reason := guard.check(r.state.step + 1, loss)):
            raise DivergedError(
                f"{reason}; stopped without saving or exporting: {_kept(r, guard.best_step)}; "
                f"lower lr (now {config.lr:g}; the run parameter learning_rate) and rerun with "
                "--overwrite, or set divergence_factor=0 to turn this guard off"
            )
        r.state.step += 1
        r.state.position = position
        tokens = result.tokens or r.batches.global_batch * r.manifest.seq_len
        r.state.tokens += tokens
        r.state.target_tokens += targets
        window.tokens += tokens
        window.targets += targets
        r.losses.append(loss)
        for phase in ("generate_s", "train_s"):  # GRPO's split of the step's time
            if phase in result.extra:
                r.phase_seconds[phase] = r.phase_seconds.get(phase, 0.0) + result.extra[phase]
        if r.state.step % config.log_every == 0 or r.state.step == r.total_steps:
            record = {"loss": loss, "lr": lr, "grad_norm": grad_norm, **result.extra}
            _write_metrics(r, window, record, position, per_token, peak)
            window = Window()
        every_n = config.checkpoint_every and r.state.step % config.checkpoint_every == 0
        if (every_n or r.save_agreed) and not r.stop_agreed:
            saving = time.perf_counter()
            save_checkpoint(r)
            last_saved = r.state.step
            window.started += time.perf_counter() - saving  # throughput measures training only
        if r.stop_agreed:
            r.state.preemptions += 1
            save_checkpoint(r)
            log.warning("SIGTERM: saved step %d, exiting to be resumed", r.state.step)
            raise Preempted
    return last_saved


def _kept(r: Run, rose_at: int | None = None) -> str:
    """Which checkpoints a stopped run leaves: only ones that exist are named. `rose_at`: the
    step after which the loss rose (a checkpoint from then on holds weights of the rise)."""
    complete = checkpoint_files.complete_checkpoints(checkpoints_dir(r))
    if rose_at is not None:
        before = [path for step, path in complete if step < rose_at]
        after = [path.rsplit("/", 1)[-1] for step, path in complete if step >= rose_at]
        kept = (
            f"{before[-1]} is the last checkpoint from before the loss rose"
            if before
            else "no checkpoint was saved before the loss rose"
        )
        return kept + (f" ({', '.join(after)} hold weights of the rise)" if after else "")
    if not complete:
        return "no checkpoint was saved"
    return f"the last complete checkpoint, {complete[-1][1]}, is intact"


def _flops(r: Run) -> tuple[float, float | None]:
    """(training FLOPs per token, peak FLOP/s of one device or None): the parts of MFU."""
    hf_config = r.model.causal_lm().config
    _, _, matmul = parameter_counts(r.model)
    per_token = flops_per_token(
        matmul,
        hf_config.num_hidden_layers,
        hf_config.hidden_size,
        r.manifest.seq_len,
        lora=bool(r.config.lora_rank),
    )
    return per_token, peak_flops(r.device, r.config.peak_flops)


def _write_metrics(
    r: Run,
    window: Window,
    record: dict[str, float],
    position: DataPosition,
    per_token: float,
    peak: float | None,
) -> None:
    """Collective (the peak memory of the most loaded process); rank 0 writes the record."""
    assert r.metrics is not None
    memory = torch.tensor([peak_memory_bytes(r.device)], dtype=torch.float64, device=r.device)
    dist.all_reduce(memory, op=dist.ReduceOp.MAX)  # the most loaded process counts
    elapsed = time.perf_counter() - window.started
    tps = window.tokens / elapsed
    r.metrics.write(
        r.state.step,
        {
            **record,
            "tokens_per_s": tps,
            "target_tokens_per_s": window.targets / elapsed,
            "mfu": tps * per_token / (peak * r.world_size) if peak else None,
            "peak_memory_gb": memory.item() / 1e9,
            "epoch": position.epoch,
        },
    )


def save_checkpoint(r: Run) -> None:
    r.state.scheduler = r.scheduler.state_dict()
    r.state.global_batch_rows = r.config.global_batch_rows(r.world_size)
    r.state.world_size = r.world_size
    r.state.config = r.config.to_dict()
    started = time.perf_counter()
    rollouts = r.rollouts.state_dict() if r.rollouts is not None else None
    path = checkpoint.save(
        checkpoints_dir(r), r.model, r.optimizer, r.state, keep=r.config.keep_checkpoints,
        rollouts=rollouts,
    )  # fmt: skip
    r.last_saved_at = time.monotonic()
    log.info("saved checkpoint %s in %.1fs", path, time.perf_counter() - started)
