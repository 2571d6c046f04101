"""The setup phase: process group, model directory, tokenizer, dataset, model, optimizer, resume."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer import attention_support, checkpoint, checkpoint_files, storage
from trainer.config import TrainConfig
from trainer.cuda_guard import check_cuda
from trainer.data import TrainBatches
from trainer.grpo.batches import PromptBatches
from trainer.grpo.reward_module import run_rewards
from trainer.metrics import MetricsWriter
from trainer.model import build_model, parameter_counts, resolve_model_dir
from trainer.packed_data.format import (
    PREFERENCE_KIND,
    PROMPTS_KIND,
    TokenizerIdentity,
    compatibility_errors,
    read_manifest,
)
from trainer.run_state import Run, checkpoints_dir

log = logging.getLogger("trainer")


def setup(config: TrainConfig) -> Run:
    """Collective: every rank builds the same run (its own data shard), resumed when it can be."""
    device, backend = device_and_backend(config)
    if config.objective == "grpo" and config.grpo_use_vllm:
        from trainer.grpo import vllm_rollout  # GRPO's optional engine, only when chosen

        if problem := vllm_rollout.unavailable(device):
            raise ValueError(problem)
    if device.type == "cpu" and (cores := bind_cpu_cores()):
        log.info("worker bound to CPU cores %s", ",".join(map(str, cores)))
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
    r = Run(config, device, dist.get_rank(), dist.get_world_size(), config.output.rstrip("/"))
    if r.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: setattr(r, "stop_requested", True))
    stop_with_agent()
    torch.manual_seed(config.seed)
    _data(r)
    r.model = build_model(config, r.model_dir, device)
    if config.objective == "grpo" and config.grpo_use_vllm:
        longest = r.manifest.seq_len + config.grpo_max_completion_tokens
        r.generator = vllm_rollout.VllmRollouts(config, r.model_dir, r.rank, longest)
    r.optimizer = build_optimizer(config, r.model, device)
    r.scheduler = torch.optim.lr_scheduler.LambdaLR(
        r.optimizer, lr_lambda(config.warmup_steps, r.total_steps, config.min_lr_ratio)
    )
    r.metrics = MetricsWriter(
        r.output,
        enabled=r.rank == 0,
        tensorboard=config.tensorboard,
        tracking_uri=config.tracking_uri,
        tracking_run_id=config.tracking_run_id,
    )

    if config.resume:
        _resume(r)
    r.attempt = record_attempt(r)
    log_settings(r)
    return r


ATTEMPTS_DIR = "attempts"


def record_attempt(r: Run) -> int:
    """Rank 0 writes OUTPUT/attempts/attempt-NNNNN.json for this start (the step it starts from):
    a run restarted after a preemption or a crash counts its starts here, also when the SIGTERM
    checkpoint did not fit the grace period. Returns this start's number (1 = first)."""
    number = torch.zeros(1, dtype=torch.int64, device=r.device)
    if r.rank == 0:
        folder = f"{r.output}/{ATTEMPTS_DIR}"
        number[0] = len(storage.listdir(folder)) + 1
        with storage.open(f"{folder}/attempt-{int(number[0]):05d}.json", "w") as f:
            json.dump({"start_step": r.state.step, "world_size": r.world_size}, f)
    dist.broadcast(number, src=0)
    return int(number[0])


def _data(r: Run) -> None:
    """The model directory, tokenizer, dataset manifest and batches; the run's step count."""
    from transformers import AutoTokenizer

    config = r.config
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    r.model_dir = resolve_model_dir(config.model, local_rank=local_rank)
    attention_support.check_model(config.attention, r.model_dir)
    tokenizer_dir = (
        r.model_dir
        if config.resolved_tokenizer() == config.model
        else resolve_model_dir(config.resolved_tokenizer(), local_rank=local_rank)
    )
    r.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    r.manifest = read_manifest(config.data)
    if r.manifest.chat_template:  # the template the data was rendered with (exported with it)
        r.tokenizer.chat_template = r.manifest.chat_template
    errors = compatibility_errors(r.manifest, TokenizerIdentity.of(r.tokenizer), config.seq_len)
    preference = r.manifest.data_kind == PREFERENCE_KIND
    prompts = r.manifest.data_kind == PROMPTS_KIND
    if prompts != (config.objective == "grpo"):
        errors.append(
            f"objective={config.objective} does not train on {r.manifest.data_kind} data: "
            + (
                "set objective=grpo (with rewards) for prompt records"
                if prompts
                else "objective=grpo needs a prompts dataset (llmft preprocess --data-kind prompts)"
            )
        )
    elif preference != (config.objective == "dpo"):
        errors.append(
            f"objective={config.objective} does not train on {r.manifest.data_kind} data: "
            + (
                "set objective=dpo for preference pairs"
                if preference
                else "objective=dpo needs a preference dataset (llmft preprocess --data-kind "
                "preference)"
            )
        )
    if errors:
        raise ValueError(f"dataset {config.data} does not fit this run: " + "; ".join(errors))
    if prompts:
        r.rewards = run_rewards(config.rewards, config.reward_module)
    dealing: dict[str, Any] = {
        "rank": r.rank,
        "world_size": r.world_size,
        "micro_batch_size": config.micro_batch_size,
        "grad_accum_steps": config.grad_accum_steps,
        "seed": config.seed,
        "shuffle": config.shuffle,
    }
    if prompts:
        r.batches = PromptBatches(
            config.data, r.manifest, iterations=config.grpo_num_iterations, **dealing
        )
    else:
        r.batches = TrainBatches(config.data, r.manifest, **dealing)
    r.total_steps = config.max_steps or config.epochs * r.batches.steps_per_epoch
    if config.warmup_steps >= r.total_steps:
        raise ValueError(
            f"warmup_steps ({config.warmup_steps}) must be below the run's {r.total_steps} steps"
        )


def _resume(r: Run) -> None:
    """Model, optimizer, scheduler and trainer state from the newest checkpoint that loads, if
    any: a damaged one (trainer/checkpoint_files.py) is passed over for the one before, said in the log,
    and demoted; when none loads the run stops (NoResumableCheckpoint), never restarting at 0."""
    config = r.config
    folder = checkpoints_dir(r)
    good, damaged = checkpoint_files.resumable_checkpoints(folder)
    if not good:
        return
    checkpoint_files.check_resume(folder, config)  # another run's checkpoint: refused
    dist.barrier()  # every rank has read the markers before rank 0 demotes a damaged one
    for step, path, why in damaged:
        log.warning("checkpoint step %d is damaged (%s): passed over", step, why)
        if r.rank == 0:
            checkpoint_files.demote(path, why)
    for step, path in good:
        failure = _load(r, path)
        if failure is None:
            break
        damaged.append((step, path, failure))
        log.warning("checkpoint %s does not load (%s): trying the one before", path, failure)
        if r.rank == 0:
            checkpoint_files.demote(path, failure)
    else:
        raise checkpoint_files.no_resumable_checkpoint(folder, damaged)
    if damaged:
        log.warning(
            "resuming from step %d: newer checkpoint(s) damaged: %s",
            step,
            checkpoint_files.describe_damage(damaged),
        )
    r.scheduler.load_state_dict(r.state.scheduler)
    r.resumed_from_step = step
    if config.objective == "grpo" and (saved := checkpoint.load_rollouts(path, r.state)):
        from trainer.grpo.buffer import RolloutBuffer  # GRPO's code, only when chosen

        r.rollouts = RolloutBuffer.from_state(saved, r.device)
    if r.state.global_batch_rows != config.global_batch_rows(r.world_size):
        log.warning(
            "global batch changed (%d -> %d rows): the data order continues from the same row",
            r.state.global_batch_rows,
            config.global_batch_rows(r.world_size),
        )


def _load(r: Run, path: str) -> str | None:
    """Collective: load the checkpoint at `path` into the run; None when every rank loaded it,
    else why some rank could not (then all ranks try the one before together)."""
    from torch.distributed.checkpoint.api import CheckpointException

    log.info("resuming from %s", path)
    failure = ""
    try:
        r.state = checkpoint.load(path, r.model, r.optimizer)
    # DCP's CheckpointException is a BaseException (raised on every rank); the rest is a
    # truncated RNG or state file of this rank.
    except (Exception, CheckpointException) as exc:
        cause: BaseException = exc
        if isinstance(exc, CheckpointException) and exc.failures:  # rank -> (error, stack)
            first = next(iter(exc.failures.values()))
            cause = first[0] if isinstance(first, tuple) else first
        text = str(cause).splitlines()[0] if str(cause) else ""
        failure = f"{type(cause).__name__}: {text}"[:300]
    failed = torch.tensor([1 if failure else 0], device=r.device)
    dist.all_reduce(failed)
    if not failed.item():
        return None
    return failure or "another rank could not load it"


def device_and_backend(config: TrainConfig) -> tuple[torch.device, str]:
    """The rank's device (its CUDA device, else CPU) and process-group backend.

    Raises:
        RuntimeError: the launcher gave this rank GPUs (`LLMFT_EXPECT_CUDA=1`) but CUDA is
            unavailable (trainer/cuda_guard.py).
        ValueError: backend=nccl without GPUs.
    """
    check_cuda(torch.cuda.is_available(), "the trainer")
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
    if config.compile and device.type == "cpu" and (missing := cpu_compile_missing()):
        raise ValueError(
            f"compile=true on CPU builds C++ kernels when the run starts, and {missing}: install "
            "it, or leave compile unset (eager, the CPU default)"
        )
    return device, backend


def stop_with_agent() -> None:
    """Have Linux send this worker SIGTERM (the preemption path: save, then stop) when the
    torchrun agent that started it dies (`PR_SET_PDEATHSIG`). The agent stops its workers on its
    own way out, but one that dies before it has (killed, or killed again while stopping them)
    left its workers running, holding their ports and devices: tests/faults/test_orphans.py
    found such a worker alive 40 minutes after its agent. Linux, under torchrun, only."""
    import ctypes

    if not _torchrun_worker_on_linux():
        return
    agent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if agent == 1 or os.getppid() != agent:  # the agent was gone before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def bind_cpu_cores() -> list[int] | None:
    """Bind this CPU worker to its own share of the cores it may use (None: left unbound).

    Under torchrun, local rank r of n takes the r-th of n equal slices of
    `os.sched_getaffinity(0)` (a `taskset` or container cpuset around torchrun is honoured); the
    threads it starts later (intra-op, gloo) inherit it. Why: the ranks of a synchronous step
    wait for the slowest one, and unbound the kernel moves workers and their gloo threads between
    cores, each move stalling every rank: bound, the benchmark's trainer runs ~2% faster
    (docs/performance.md). Left unbound with fewer cores than workers, or when a worker runs
    more intra-op threads (OMP_NUM_THREADS) than its slice has cores. GPU workers are not bound."""
    if not _torchrun_worker_on_linux():
        return None
    workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    allowed = sorted(os.sched_getaffinity(0))
    share = len(allowed) // workers
    if share < 1 or torch.get_num_threads() > share or not 0 <= rank < workers:
        return None
    cores = allowed[rank * share : (rank + 1) * share]
    os.sched_setaffinity(0, cores)
    return cores


def _torchrun_worker_on_linux() -> bool:
    """Whether this process is a torchrun worker on Linux (prctl and CPU affinity are Linux's)."""
    import sys

    return sys.platform.startswith("linux") and "TORCHELASTIC_RUN_ID" in os.environ


def cpu_compile_missing() -> str | None:
    """What torch.compile lacks here to build CPU kernels (None: nothing). Inductor compiles
    them with the system's C++ compiler (`CXX`, else g++ or clang++) against Python's headers
    (torch/_inductor/cpp_builder.py), which a fresh Debian does not have."""
    import shutil
    import sysconfig

    compilers = [c for c in (os.environ.get("CXX"), "g++", "clang++") if c]
    if not any(shutil.which(c) for c in compilers):
        return "no C++ compiler is installed (apt-get install g++)"
    if not (Path(sysconfig.get_path("include")) / "Python.h").exists():
        return "Python's headers are not installed (apt-get install python3-dev)"
    return None


def build_optimizer(config: TrainConfig, model: torch.nn.Module, device: torch.device):
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


def lr_lambda(warmup: int, total: int, min_ratio: float):
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


def log_settings(r: Run) -> None:
    if r.rank != 0:
        return

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
    assert r.metrics is not None
    skip = ("tracking_uri", "tracking_run_id", "resumed_from_step")  # per start, not per run
    r.metrics.log_params({k: v for k, v in settings.items() if k not in skip})
