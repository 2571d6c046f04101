"""A run's checkpoint directory as files, without torch: the layout, which checkpoints are complete
and undamaged, and whether this run may resume from the newest (trainer/checkpoint.py saves and
loads them with DCP).

Layout of one checkpoint, `OUTPUT/checkpoints/step-00000120/`:

    .metadata, __*_*.distcp     DCP: sharded model + optimizer state (each rank writes its shards)
    trainer_state.json          step, data position, scheduler, config snapshot (rank 0)
    rng/rank-00003.pt           each rank's RNG states (dropout differs per rank)
    rollouts/rank-00003.pt      GRPO only, between two steps of one rollout: each rank's rollout
    COMPLETE                    written last, by rank 0, after every rank has finished: JSON
                                {"step", "files": {relative path: size in bytes}}

Only directories with COMPLETE count: a run killed mid-save leaves an incomplete directory that
resume ignores and the next retention pass deletes. A checkpoint made from another model, data
or training recipe (`RESUME_MUST_MATCH`) is refused (`check_resume`), never silently continued.

A complete checkpoint whose files no longer match its COMPLETE list (one deleted or truncated
since: `damage`) is passed over for the one before it, with a warning; the trainer then demotes it
(COMPLETE becomes DAMAGED, with the reason) so that retention never keeps it in place of a good
one. When every complete checkpoint is damaged the run stops with an error
(`NoResumableCheckpoint`) instead of starting again from step 0.

No torch, so the train step's preflight checks a resume in the launcher's process
(components/preflight/launch_checks.py) without loading it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from trainer import storage
from trainer.config import TrainConfig

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
ROLLOUTS_DIR = "rollouts"
STEP_DIR = re.compile(r"step-(\d{8})$")


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


def saved_config(path: str) -> dict[str, Any]:
    """The config snapshot in the checkpoint at `path` (its trainer_state.json; {} when none)."""
    with storage.open(f"{path}/{STATE_FILE}", "r") as f:
        return dict(json.load(f).get("config") or {})


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
    conflicts = resume_conflicts(saved_config(path), config)
    if conflicts:
        raise ValueError(
            f"{config.output!r} holds a checkpoint (step {step}) of another run: "
            + "; ".join(conflicts)
            + ": pass a new --output, or --overwrite to delete its checkpoints and start over"
        )
