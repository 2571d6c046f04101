"""Distributed checkpoints (DCP) on a local path or a gs:// (any fsspec) URI, with a completion
marker and retention.

Layout of one checkpoint, `OUTPUT/checkpoints/step-00000120/`:

    .metadata, __*_*.distcp     DCP: sharded model + optimizer state (each rank writes its shards)
    trainer_state.json          step, data position, scheduler, config snapshot (rank 0)
    rng/rank-00003.pt           each rank's RNG states (dropout differs per rank)
    COMPLETE                    written last, by rank 0, after every rank has finished: JSON
                                {"step", "files": {relative path: size in bytes}}

Only directories with COMPLETE count: a run killed mid-save leaves an incomplete directory that
resume ignores and the next retention pass deletes. DCP also reshards on load, so a retry with a
different world size resumes from the same checkpoint. A checkpoint made from another model, data
or training recipe (`RESUME_MUST_MATCH`) is refused (`check_resume`), never silently continued.

A complete checkpoint whose files no longer match its COMPLETE list (one deleted or truncated
since: `damage`), or that fails to load, is passed over for the one before it, with a warning;
the trainer then demotes it (COMPLETE becomes DAMAGED, with the reason) so that retention never
keeps it in place of a good one. When every complete checkpoint is damaged the run stops with an
error (`NoResumableCheckpoint`) instead of starting again from step 0.
"""

from __future__ import annotations

import io
import json
import logging
import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer import storage
from trainer.config import TrainConfig
from trainer.data import DataPosition

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
STEP_DIR = re.compile(r"step-(\d{8})$")


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


def step_dir(checkpoints: str, step: int) -> str:
    return f"{checkpoints.rstrip('/')}/step-{step:08d}"


def complete_checkpoints(checkpoints: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint, oldest first."""
    found = []
    for entry in storage.listdir(checkpoints):
        match = STEP_DIR.search(entry)
        if match and storage.exists(f"{entry}/{MARKER}"):
            found.append((int(match.group(1)), step_dir(checkpoints, int(match.group(1)))))
    return sorted(found)


class NoResumableCheckpoint(ValueError):
    """Complete checkpoints exist but every one of them is damaged: starting over from step 0
    must be the user's choice (--overwrite), never a silent one."""


def damage(path: str) -> str:
    """Why the complete checkpoint at `path` cannot be resumed ("" when its files are as its
    COMPLETE marker lists them). A marker without a file list (older checkpoints) is not
    judged here; a failed load is the trainer's fallback for those."""
    try:
        marker = json.loads(storage.read_text(f"{path}/{MARKER}"))
    except ValueError:
        return ""  # "step N": written before markers listed their files
    listed: dict[str, int] = marker.get("files", {}) if isinstance(marker, dict) else {}
    if not listed:
        return ""
    found = storage.file_sizes(path)
    missing = sorted(name for name in listed if name not in found)
    if missing:
        return f"{', '.join(missing)} missing"
    wrong = sorted(name for name, size in listed.items() if found[name] != size)
    if wrong:
        name = wrong[0]
        return f"{name} has {found[name]} bytes, {listed[name]} were written" + (
            f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        )
    return ""


def resumable_checkpoints(
    checkpoints: str,
) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
    """(step, path) of every complete, undamaged checkpoint, newest first; and (step, path, why)
    of each damaged one newer than the newest good one.

    Raises:
        NoResumableCheckpoint: there are complete checkpoints, all damaged.
    """
    good: list[tuple[int, str]] = []
    damaged: list[tuple[int, str, str]] = []
    for step, path in reversed(complete_checkpoints(checkpoints)):
        problem = damage(path)
        if not problem:
            good.append((step, path))
        elif not good:
            damaged.append((step, path, problem))
    if damaged and not good:
        raise no_resumable_checkpoint(checkpoints, damaged)
    return good, damaged


def describe_damage(damaged: list[tuple[int, str, str]]) -> str:
    """ "step 4 (why); step 2 (why)" for (step, path, why) triples."""
    return "; ".join(f"step {step} ({why})" for step, _, why in damaged)


def no_resumable_checkpoint(
    checkpoints: str, damaged: list[tuple[int, str, str]]
) -> NoResumableCheckpoint:
    return NoResumableCheckpoint(
        f"no checkpoint under {checkpoints} can be resumed: {describe_damage(damaged)}: restore the "
        "files, or pass --overwrite (resume=false) to delete them and start over from step 0"
    )


def latest_checkpoint(checkpoints: str) -> tuple[int, str] | None:
    """The newest complete checkpoint that is not damaged (`resumable_checkpoints`): a damaged
    newer one is passed over with a warning."""
    good, damaged = resumable_checkpoints(checkpoints)
    if not good:
        return None
    if damaged:
        log.warning(
            "checkpoint %s damaged: falling back to step %d", describe_damage(damaged), good[0][0]
        )
    return good[0]


def demote(path: str, reason: str) -> None:
    """Turn the complete checkpoint at `path` into an incomplete one (rank 0): resume no longer
    picks it and retention treats it as a partial save. DAMAGED keeps the reason."""
    storage.write_text(f"{path}/DAMAGED", reason + "\n")
    storage.remove(f"{path}/{MARKER}")


RESUME_MUST_MATCH = (
    "model",
    "tokenizer",
    "data",
    "seq_len",
    "seed",
    "shuffle",
    "lr",
    "min_lr_ratio",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_eps",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "quantize_base",
    "objective",
    "dpo_beta",
)
"""TrainConfig fields a resumed run must share with its checkpoint: what its weights and optimizer
state were made from and for. Continuing with another model or dataset would export the old
run's weights under the new run's name. The rest (max_steps, epochs, batch sizes, engine,
checkpoint and logging settings) may change on resume."""
_LOCATIONS = ("model", "data")


def read_state(path: str) -> TrainerState:
    """The trainer state (step, data position, config snapshot) of the checkpoint at `path`."""
    with storage.open(f"{path}/{STATE_FILE}", "r") as f:
        return TrainerState.from_dict(json.load(f))


def resume_conflicts(saved: Mapping[str, Any], config: TrainConfig) -> list[str]:
    """How `config` differs from a checkpoint's saved config in `RESUME_MUST_MATCH` (empty when
    it may resume; a checkpoint without a saved config is not judged)."""
    conflicts = []
    for name in RESUME_MUST_MATCH:
        if name not in saved:
            continue
        then, now = saved[name], getattr(config, name)
        if name == "tokenizer":
            then, now = then or saved.get("model"), config.resolved_tokenizer()
        if name in (*_LOCATIONS, "tokenizer") and then and now:
            same = storage.same_location(str(then), str(now))
        else:
            same = then == now
        if not same:
            conflicts.append(f"{name} {then!r} there, {now!r} now")
    return conflicts


def check_resume(checkpoints: str, config: TrainConfig) -> None:
    """Refuse to resume from the newest complete checkpoint under `checkpoints` when it was made
    by another run (`resume_conflicts`); nothing to check when there is none.

    Raises:
        ValueError: one line: what differs, and the way out.
    """
    latest = latest_checkpoint(checkpoints)
    if latest is None:
        return
    step, path = latest
    conflicts = resume_conflicts(read_state(path).config, config)
    if conflicts:
        raise ValueError(
            f"{config.output!r} holds a checkpoint (step {step}) of another run: "
            + "; ".join(conflicts)
            + ": pass a new --output, or --overwrite to delete its checkpoints and start over"
        )


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
) -> str:
    """Collective: every rank calls it. Returns the checkpoint path."""
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
