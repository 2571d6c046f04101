"""Distributed checkpoints (DCP) on a local path or a gs:// (any fsspec) URI: save (every rank's
shards, RNG states, the trainer state, the completion marker last), load and retention.

The directory's layout, which checkpoints are complete and undamaged, and the resume rules are in
trainer/checkpoint_files.py (no torch). DCP reshards on load, so a retry with a different world
size resumes from the same checkpoint.
"""

from __future__ import annotations

import io
import json
import logging
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer import storage
from trainer.checkpoint_files import (
    MARKER,
    ROLLOUTS_DIR,
    STATE_FILE,
    STEP_DIR,
    complete_checkpoints,
    step_dir,
)
from trainer.data import DataPosition

log = logging.getLogger(__name__)


@dataclass
class TrainerState:
    """The non-tensor part of a checkpoint."""

    step: int = 0
    position: DataPosition = field(default_factory=DataPosition)
    scheduler: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    target_tokens: int = 0
    global_batch_rows: int = 0
    world_size: int = 0
    preemptions: int = 0
    """SIGTERMs this run has stopped for and saved on (counted across resumes)."""
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        data = dict(data)
        data["position"] = DataPosition(**data["position"])
        return cls(**data)


def read_state(path: str) -> TrainerState:
    """The trainer state (step, data position, config snapshot) of the checkpoint at `path`."""
    with storage.open(f"{path}/{STATE_FILE}", "r") as f:
        return TrainerState.from_dict(json.load(f))


def _options(model: torch.nn.Module) -> Any:
    """QLoRA (an NF4 base) saves only what trains: the frozen 4-bit base is rebuilt from the base
    model on resume, identically (trainer/quantize.py), and DCP does not write NF4 tensors. Not
    strict on load then: the frozen keys are absent by design, and DCP itself fails on a
    trainable key the checkpoint lacks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    quantized = bool(getattr(model, "quantized", None))
    return StateDictOptions(ignore_frozen_params=quantized, strict=not quantized)


def _app_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(model))
    return {"model": model_sd, "optim": optim_sd}


def save(
    checkpoints: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    keep: int,
    rollouts: dict[str, Any] | None = None,
) -> str:
    """Collective: every rank calls it. Returns the checkpoint path. `rollouts`: this rank's GRPO
    rollout that later steps still train on (trainer/grpo/buffer.py), saved beside its RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    path = step_dir(checkpoints, state.step)
    rank = dist.get_rank()
    if rank == 0:
        storage.remove(path)  # a leftover partial save of this very step
    app_state = _app_state(model, optimizer)
    _check_room(path, app_state)  # collective: includes the barrier before the first write
    # The disk filling up under the save (another writer) is named. No COMPLETE marker is
    # written then, so resume ignores this directory and uses the previous checkpoint.
    with storage.disk_errors_named(path):
        dcp.save(app_state, storage_writer=FsspecWriter(path))
        buffer = io.BytesIO()
        torch.save(rng_state(), buffer)
        with storage.open(f"{path}/rng/rank-{rank:05d}.pt", "wb") as f:
            f.write(buffer.getvalue())
        if rollouts is not None:
            buffer = io.BytesIO()
            torch.save(rollouts, buffer)
            with storage.open(f"{path}/{ROLLOUTS_DIR}/rank-{rank:05d}.pt", "wb") as f:
                f.write(buffer.getvalue())
        if rank == 0:
            with storage.open(f"{path}/{STATE_FILE}", "w") as f:
                json.dump(asdict(state), f, indent=2, default=str)
    dist.barrier()  # every rank's shards and RNG are durable before the marker says so
    if rank == 0:
        marker = {"step": state.step, "files": storage.file_sizes(path)}
        with storage.open(f"{path}/{MARKER}", "w") as f:
            json.dump(marker, f, indent=1, sort_keys=True)
        prune(checkpoints, keep)
    dist.barrier()
    return path


ROOM_MARGIN = 1.05
"""Free space a checkpoint needs beyond its tensors' bytes (DCP metadata, RNG, trainer state)."""


def _check_room(path: str, app_state: dict[str, Any]) -> None:
    """Collective. Refuse, on every rank alike, a save that does not fit the free space of the
    local disk of `path` (as rank 0 sees it), before any rank writes a byte: a full disk is
    named (storage.DiskFullError) instead of failing deep in a writer, and the previous
    checkpoint stays the newest complete one."""
    local = not storage.is_remote(path)
    size = free = 0.0
    if dist.get_rank() == 0 and local:
        import shutil

        # Global sizes: DCP writes each DTensor shard once and each replicated tensor once.
        size = float(_bytes_of(app_state))
        free = float(shutil.disk_usage(storage.mount_point(storage.local_path(path))).free)
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    # Rank 0's numbers, summed with zeros: every rank decides alike.
    sizes = torch.tensor([size, free], dtype=torch.float64, device=device)
    dist.all_reduce(sizes)
    needed, free = sizes[0].item() * ROOM_MARGIN, sizes[1].item()
    if local and needed > free:
        raise storage.DiskFullError(
            f"no space left for checkpoint {path}: it needs {needed / 1e6:.1f} MB on "
            f"{storage.describe_disk(path)}: free space there or write the output to another "
            "disk (the previous checkpoint is kept; the run resumes from it)"
        )


def _bytes_of(tree: Any) -> int:
    """Bytes of the tensors in a nested state dict (a DTensor: its global size)."""
    if isinstance(tree, Mapping):
        return sum(_bytes_of(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_bytes_of(v) for v in tree)
    if isinstance(tree, torch.Tensor):
        return int(tree.numel() * tree.element_size())
    return 0


def prune(checkpoints: str, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints, and incomplete ones older than them."""
    complete = complete_checkpoints(checkpoints)
    keep_steps = {step for step, _ in complete[-keep:]}
    newest = max(keep_steps, default=-1)
    for entry in storage.listdir(checkpoints):
        match = STEP_DIR.search(entry)
        if not match:
            continue
        step = int(match.group(1))
        if step not in keep_steps and step < newest:
            log.info("deleting old checkpoint %s", entry)
            storage.remove(entry)


def load(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainerState:
    """Collective: restore model, optimizer and this rank's RNG; return the trainer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state_dict = _app_state(model, optimizer)
    dcp.load(state_dict, storage_reader=FsspecReader(path))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state_dict["model"],
        optim_state_dict=state_dict["optim"],
        options=_options(model),
    )
    state = read_state(path)
    rng_file = f"{path}/rng/rank-{dist.get_rank():05d}.pt"
    if state.world_size == dist.get_world_size() and storage.exists(rng_file):
        with storage.open(rng_file, "rb") as f:
            set_rng_state(torch.load(io.BytesIO(f.read()), weights_only=False))
    else:
        log.warning(
            "world size changed (%s -> %s): RNG streams restart from the seed",
            state.world_size,
            dist.get_world_size(),
        )
    return state


def load_rollouts(path: str, state: TrainerState) -> dict[str, Any] | None:
    """This rank's saved GRPO rollout (see `save`), or None: none was pending, or the world size
    changed (each rank's rollout belongs to its own prompts; the next step generates anew)."""
    rollout_file = f"{path}/{ROLLOUTS_DIR}/rank-{dist.get_rank():05d}.pt"
    if not storage.exists(rollout_file):
        return None
    if state.world_size != dist.get_world_size():
        log.warning("world size changed: the rollout saved at step %d is not reused", state.step)
        return None
    with storage.open(rollout_file, "rb") as f:
        return dict(torch.load(io.BytesIO(f.read()), weights_only=True))


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
