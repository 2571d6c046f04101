"""The training run in named phases: setup -> train -> save -> cleanup.

Run under torchrun on every node (see trainer/__main__.py). `cleanup` always runs and always
destroys the process group, whatever happened before.

Per optimizer step the gradient is exactly that of the mean loss over all target tokens of the
global batch, independent of how tokens fall on ranks and micro-batches: backward runs on summed
losses and the gradients are divided by the global target count afterwards (see `_step`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trainer import attention, checkpoint
from trainer.checkpoint import TrainerState
from trainer.config import TrainConfig
from trainer.data import DataPosition, MicroBatch, TrainBatches, eval_batches
from trainer.metrics import MetricsWriter, flops_per_token, peak_flops, peak_memory_bytes

log = logging.getLogger("trainer")

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: the task is retryable, not finished


class NonFiniteLossError(RuntimeError):
    """Loss or gradient norm became NaN/inf; the last complete checkpoint is left untouched."""


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was saved."""


@dataclass
class Run:
    """What setup builds and the later phases use."""

    config: TrainConfig
    device: torch.device
    rank: int
    world_size: int
    output: str
    model_dir: str = ""
    tokenizer: Any = None
    manifest: Any = None
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    batches: TrainBatches | None = None
    metrics: MetricsWriter | None = None
    total_steps: int = 0
    state: TrainerState = field(default_factory=TrainerState)
    resumed_from_step: int | None = None
    losses: list[float] = field(default_factory=list)
    eval_loss: float | None = None
    started: float = field(default_factory=time.time)
    stop_requested: bool = False
    """Set by the SIGTERM handler on this rank."""
    stop_agreed: bool = False
    """Some rank had stop_requested at the last step's all-reduce: all ranks stop together."""


def run(config: TrainConfig) -> int:
    """Entry point: returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s [%(name)s] %(message)s"
    )
    r: Run | None = None
    try:
        r = setup(config)
        try:
            train(r)
        except Preempted:
            return PREEMPTED_EXIT_CODE
        save(r)
        return 0
    finally:
        cleanup(r)


# --- setup ------------------------------------------------------------------------------------


def setup(config: TrainConfig) -> Run:
    from transformers import AutoTokenizer

    from trainer.model import build_model, resolve_model_dir
    from trainer.packed_data.format import TokenizerIdentity, compatibility_errors, read_manifest

    device, backend = _device_and_backend(config)
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
    r = Run(config, device, dist.get_rank(), dist.get_world_size(), config.output.rstrip("/"))
    if r.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: setattr(r, "stop_requested", True))
    torch.manual_seed(config.seed)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    r.model_dir = resolve_model_dir(config.model, local_rank=local_rank)
    attention.check_model(config.attention, r.model_dir)
    tokenizer_dir = (
        r.model_dir
        if config.resolved_tokenizer() == config.model
        else resolve_model_dir(config.resolved_tokenizer(), local_rank=local_rank)
    )
    r.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    r.manifest = read_manifest(config.data)
    errors = compatibility_errors(r.manifest, TokenizerIdentity.of(r.tokenizer), config.seq_len)
    if errors:
        raise ValueError(f"dataset {config.data} does not fit this run: " + "; ".join(errors))
    r.batches = TrainBatches(
        config.data,
        r.manifest,
        rank=r.rank,
        world_size=r.world_size,
        micro_batch_size=config.micro_batch_size,
        grad_accum_steps=config.grad_accum_steps,
        seed=config.seed,
        shuffle=config.shuffle,
    )
    r.total_steps = config.max_steps or config.epochs * r.batches.steps_per_epoch
    if config.warmup_steps >= r.total_steps:
        raise ValueError(
            f"warmup_steps ({config.warmup_steps}) must be below the run's {r.total_steps} steps"
        )

    r.model = build_model(config, r.model_dir, device)
    r.optimizer = _optimizer(config, r.model, device)
    r.scheduler = torch.optim.lr_scheduler.LambdaLR(
        r.optimizer, _lr_lambda(config.warmup_steps, r.total_steps, config.min_lr_ratio)
    )
    r.metrics = MetricsWriter(r.output, enabled=r.rank == 0, tensorboard=config.tensorboard)

    latest = checkpoint.latest_checkpoint(_checkpoints(r)) if config.resume else None
    if latest is not None:
        step, path = latest
        log.info("resuming from %s", path)
        r.state = checkpoint.load(path, r.model, r.optimizer)
        r.scheduler.load_state_dict(r.state.scheduler)
        r.resumed_from_step = step
        if r.state.global_batch_rows != config.global_batch_rows(r.world_size):
            log.warning(
                "global batch changed (%d -> %d rows): the data order continues from the same row",
                r.state.global_batch_rows,
                config.global_batch_rows(r.world_size),
            )
    _log_settings(r)
    return r


def _device_and_backend(config: TrainConfig) -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("backend=nccl needs GPUs; use backend=gloo (or auto) on CPU")
    if config.dtype == "bf16" and device.type == "cpu":
        log.warning("dtype=bf16 on CPU is slow and less exact; fp32 (auto) is the CPU default")
    if config.compile and device.type == "cpu":
        log.warning(
            "compile=true on CPU: measured slower than eager (docs/performance.md); "
            "it pays off on GPU"
        )
    return device, backend


def _optimizer(config: TrainConfig, model: torch.nn.Module, device: torch.device):
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused kernel exists on CPU and CUDA (and works on DTensor shards); on CPU it steps a
    # 7M-parameter model ~3.5x faster than foreach. HF Trainer defaults to it too.
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=config.lr,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
        fused=fused,
        foreach=None if fused else True,
    )


def _lr_lambda(warmup: int, total: int, min_ratio: float):
    """lr multiplier of the optimizer step with 0-based index `step` (LambdaLR's counter).

    The `warmup` first steps ramp linearly towards the peak (step k of them uses k / (warmup + 1)),
    the next step uses the peak, once, and a cosine brings the multiplier down to `min_ratio` at
    the last step (index total - 1).
    """

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        decay_steps = total - 1 - warmup
        progress = min(1.0, (step - warmup) / decay_steps) if decay_steps > 0 else 0.0
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _checkpoints(r: Run) -> str:
    return f"{r.output}/checkpoints"


def _log_settings(r: Run) -> None:
    if r.rank != 0:
        return
    from trainer.model import parameter_counts

    total, trainable, _ = parameter_counts(r.model)
    assert r.batches is not None
    settings = {
        **r.config.to_dict(),
        "resolved_model_dir": r.model_dir,
        "world_size": r.world_size,
        "device": str(r.device),
        "seq_len": r.manifest.seq_len,
        "train_rows": r.batches.rows,
        "global_batch_rows": r.batches.global_batch,
        "steps_per_epoch": r.batches.steps_per_epoch,
        "total_steps": r.total_steps,
        "parameters": total,
        "trainable_parameters": trainable,
        "resumed_from_step": r.resumed_from_step,
    }
    log.info("settings:\n%s", json.dumps(settings, indent=2, default=str))


# --- train ------------------------------------------------------------------------------------


def train(r: Run) -> None:
    from trainer.model import parameter_counts

    assert r.batches is not None and r.metrics is not None
    config, model = r.config, r.model
    model.train()
    hf_config = model.causal_lm().config
    _, _, matmul = parameter_counts(model)
    per_token = flops_per_token(
        matmul,
        hf_config.num_hidden_layers,
        hf_config.hidden_size,
        r.manifest.seq_len,
        lora=bool(config.lora_rank),
    )
    peak = peak_flops(r.device, config.peak_flops)
    window = {"time": time.perf_counter(), "tokens": 0, "targets": 0}
    batches = r.batches.iterate(r.state.position)
    last_saved = r.state.step
    while r.state.step < r.total_steps:
        micro, position = next(batches)
        lr = r.optimizer.param_groups[0]["lr"]  # what this step uses; _step advances the schedule
        loss, grad_norm, targets = _step(r, micro)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise NonFiniteLossError(
                f"step {r.state.step + 1}: loss={loss} grad_norm={grad_norm} is not finite; "
                "stopped without saving, the last complete checkpoint under "
                f"{_checkpoints(r)} is intact: lower lr or check the data, then rerun to resume"
            )
        r.state.step += 1
        r.state.position = position
        tokens = r.batches.global_batch * r.manifest.seq_len
        r.state.tokens += tokens
        r.state.target_tokens += targets
        window["tokens"] += tokens
        window["targets"] += targets
        r.losses.append(loss)
        if r.state.step % config.log_every == 0 or r.state.step == r.total_steps:
            memory = torch.tensor(
                [peak_memory_bytes(r.device)], dtype=torch.float64, device=r.device
            )
            dist.all_reduce(memory, op=dist.ReduceOp.MAX)  # the most loaded process counts
            elapsed = time.perf_counter() - window["time"]
            tps = window["tokens"] / elapsed
            r.metrics.write(
                r.state.step,
                {
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_s": tps,
                    "target_tokens_per_s": window["targets"] / elapsed,
                    "mfu": tps * per_token / (peak * r.world_size) if peak else None,
                    "peak_memory_gb": memory.item() / 1e9,
                    "epoch": position.epoch,
                },
            )
            window = {"time": time.perf_counter(), "tokens": 0, "targets": 0}
        if config.checkpoint_every and r.state.step % config.checkpoint_every == 0:
            saving = time.perf_counter()
            _save_checkpoint(r)
            last_saved = r.state.step
            window["time"] += time.perf_counter() - saving  # throughput measures training only
        if r.stop_agreed:
            if r.state.step != last_saved:
                _save_checkpoint(r)
            log.warning("SIGTERM: saved step %d, exiting to be resumed", r.state.step)
            raise Preempted
    if config.checkpoint_at_end and r.state.step != last_saved:
        _save_checkpoint(r)


def _step(r: Run, micro: list[MicroBatch]) -> tuple[float, float, int]:
    """One optimizer step. Returns (global mean loss, grad norm, global target tokens).

    One all-reduce per step besides FSDP's own collectives: backward runs on the summed loss, and
    the division by the global target count, the gradient norm and the clipping are applied to
    the local gradient shards afterwards, from a single reduced vector
    [loss sum, target count, stop flag, squared gradient norm]. Synchronisation points are what
    a step loses most time on when processes share busy CPUs or a slow network.
    """
    model, device = r.model, r.device
    local_targets = sum(mb.target_tokens for mb in micro)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for k, mb in enumerate(micro):
        # Reduce (scatter, or all-reduce when replicated) gradients once per step, on the last
        # micro-batch: accumulation micro-steps need no collective.
        model.set_requires_gradient_sync(k == len(micro) - 1)
        loss = model(
            mb.input_ids.to(device, non_blocking=True),
            mb.position_ids.to(device, non_blocking=True),
            mb.loss_mask.to(device, non_blocking=True),
        )
        # FSDP averages gradients over ranks: x world_size turns that into the sum.
        (loss * r.world_size).backward()
        loss_sum += loss.detach().double()
    grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
    squared = torch.stack(torch._foreach_norm(grads)).double().pow(2).sum() if grads else 0.0
    squared = torch.as_tensor(squared, dtype=torch.float64, device=device)
    stats = torch.stack(
        [
            loss_sum,
            torch.tensor(float(local_targets), dtype=torch.float64, device=device),
            torch.tensor(float(r.stop_requested), dtype=torch.float64, device=device),
            # Sharded: each rank holds a distinct shard of every gradient, squared norms add up.
            # Replicated: every rank holds the whole reduced gradient, its norm is the global one.
            torch.zeros_like(squared) if model.replicated else squared,
        ]
    )
    dist.all_reduce(stats)
    loss_total, target_count, stop, squared_total = stats.tolist()
    if model.replicated:
        squared_total = float(squared)
    r.stop_agreed = stop > 0
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
    """The local shard of a DTensor (a view: in-place ops change the DTensor)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def _save_checkpoint(r: Run) -> None:
    r.state.scheduler = r.scheduler.state_dict()
    r.state.global_batch_rows = r.config.global_batch_rows(r.world_size)
    r.state.world_size = r.world_size
    r.state.config = r.config.to_dict()
    started = time.perf_counter()
    path = checkpoint.save(
        _checkpoints(r), r.model, r.optimizer, r.state, keep=r.config.keep_checkpoints
    )
    log.info("saved checkpoint %s in %.1fs", path, time.perf_counter() - started)


# --- save -------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(r: Run) -> float | None:
    """Mean loss per target token over the eval split (None if the dataset has none)."""
    batches = eval_batches(
        r.config.data,
        r.manifest,
        rank=r.rank,
        world_size=r.world_size,
        micro_batch_size=r.config.micro_batch_size,
        max_rows=r.config.eval_max_rows,
    )
    # Every rank must run the same number of forward passes (each one all-gathers FSDP shards),
    # even when the eval split has fewer rows than there are ranks: pad with target-free rows.
    most = torch.tensor([len(batches)], dtype=torch.int64, device=r.device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    if most.item() == 0:
        return None
    seq_len = r.manifest.seq_len
    filler = MicroBatch(
        input_ids=torch.zeros(1, seq_len, dtype=torch.int64),
        position_ids=torch.arange(seq_len, dtype=torch.int64).unsqueeze(0),
        loss_mask=torch.zeros(1, seq_len, dtype=torch.int64),
    )
    batches = batches + [filler] * (int(most.item()) - len(batches))
    r.model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=r.device)
    for mb in batches:
        loss = r.model(
            mb.input_ids.to(r.device), mb.position_ids.to(r.device), mb.loss_mask.to(r.device)
        )
        totals += torch.tensor([loss.item(), mb.target_tokens], device=r.device)
    dist.all_reduce(totals)
    r.model.train()
    return float(totals[0] / totals[1]) if totals[1] > 0 else None


def save(r: Run) -> None:
    from trainer.export import export_model

    if r.config.eval_at_end:
        r.eval_loss = evaluate(r)
        if r.eval_loss is not None:
            assert r.metrics is not None
            r.metrics.write(r.state.step, {"eval_loss": r.eval_loss})
    model_out = r.config.export_dir.rstrip("/") or f"{r.output}/model"
    if r.config.export:
        export_model(r.model, r.config, r.model_dir, model_out, r.tokenizer)
    if r.rank == 0:
        from trainer import storage

        summary = {
            "base_model": r.config.model,
            "steps": r.state.step,
            "tokens": r.state.tokens,
            "target_tokens": r.state.target_tokens,
            "final_loss": r.losses[-1] if r.losses else None,
            "eval_loss": r.eval_loss,
            "model_dir": model_out if r.config.export else None,
            "resumed_from_step": r.resumed_from_step,
            "wall_time_s": time.time() - r.started,
            "world_size": r.world_size,
            "data_position": asdict(r.state.position),
        }
        with storage.open(f"{r.output}/summary.json", "w") as f:
            json.dump(summary, f, indent=2)
        log.info("summary: %s", json.dumps(summary))


# --- cleanup ----------------------------------------------------------------------------------


def cleanup(r: Run | None) -> None:
    if r is not None and r.metrics is not None:
        r.metrics.close()
    if dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["DataPosition", "NonFiniteLossError", "Run", "run"]
