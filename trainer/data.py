"""Packed Parquet rows -> per-rank micro-batches, in a deterministic, resumable order.

Shards are read by trainer/packed_data (the format and its one reader, shared with evaluation);
this module decides which rows each rank reads when, and hands them to torch.

Order: epoch `e` visits the split's rows in `permutation(seed + e)` (or file order without
shuffle). Optimizer step `s` of the epoch takes the `G` rows at `[offset, offset + G)` of that
order, where `G = micro_batch_size x grad_accum_steps x world_size`; within a step, micro-batch
`k` of rank `r` is the slice `(k x world + r) x micro_batch_size`. The position is therefore just
`(epoch, offset)`: a checkpoint stores it, and a resumed run continues with the very next rows,
even with a different world size. A rank holds only the rows it will read this epoch (1/world of
the split), so host memory per node does not grow with the number of processes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from trainer.packed_data.format import EVAL_SPLIT, TRAIN_SPLIT, Manifest
from trainer.packed_data.reader import PackedRows, read_selected, shard_paths, shard_row_counts

log = logging.getLogger(__name__)


@dataclass
class DataPosition:
    """Where the next optimizer step starts: epoch number and rows of that epoch consumed."""

    epoch: int = 0
    offset: int = 0


@dataclass
class MicroBatch:
    """One forward/backward pass worth of packed rows (int64 tensors, shape [rows, seq_len])."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    """1 where the token is a target (predicted from the token before it)."""
    pair_ids: torch.Tensor | None = None
    """Preference data only: each token's pair document (trainer/packed_data/format.py)."""

    @property
    def target_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def pairs(self) -> int:
        """Preference pairs in these rows (0 without `pair_ids`): a row's k pairs have ids 1..2k."""
        if self.pair_ids is None:
            return 0
        return int((self.pair_ids.amax(dim=1) // 2).sum())

    def labels(self) -> torch.Tensor:
        """Hugging Face convention: the token id where it is a target, -100 elsewhere."""
        return torch.where(
            self.loss_mask.bool(), self.input_ids, torch.full_like(self.input_ids, -100)
        )


def to_micro_batch(rows: PackedRows, lo: int, hi: int) -> MicroBatch:
    def tensor(column: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(column[lo:hi].astype(np.int64))

    return MicroBatch(
        input_ids=tensor(rows.input_ids),
        position_ids=tensor(rows.position_ids),
        loss_mask=tensor(rows.loss_mask),
        pair_ids=None if rows.pair_ids is None else tensor(rows.pair_ids),
    )


def epoch_steps(rows: int, global_batch: int, *, unit: str) -> tuple[int, int]:
    """(global_batch, steps per epoch) of a split of `rows` (rows or prompts): refused when it
    holds less than one global batch. What is past the last full global batch of an epoch is
    skipped (a different subset each epoch when shuffling): every step has the same shape, which
    compile needs."""
    if rows < global_batch:
        raise ValueError(
            f"the training split has {rows} {unit}, fewer than one global batch of "
            f"{global_batch} (micro_batch_size x grad_accum_steps x world size): lower "
            "micro_batch_size or grad_accum_steps, or use fewer processes"
        )
    return global_batch, rows // global_batch


def epoch_order(rows: int, epoch: int, *, seed: int, shuffle: bool) -> np.ndarray:
    """The order epoch `epoch` visits a split's rows in: `permutation(seed, epoch)`, or file
    order without shuffle (the same on every rank, so ranks deal from one order)."""
    if not shuffle:
        return np.arange(rows)
    return np.random.default_rng([seed, epoch]).permutation(rows)


class TrainBatches:
    """This rank's micro-batches for each optimizer step, from a `DataPosition` onwards."""

    def __init__(
        self,
        data_dir: str,
        manifest: Manifest,
        *,
        rank: int,
        world_size: int,
        micro_batch_size: int,
        grad_accum_steps: int,
        seed: int,
        shuffle: bool,
    ) -> None:
        self.paths = shard_paths(data_dir, manifest, TRAIN_SPLIT)
        self.counts = shard_row_counts(self.paths)
        self.rows = sum(self.counts)
        self.seq_len = manifest.seq_len
        self.rank, self.world_size = rank, world_size
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps
        self.seed, self.shuffle = seed, shuffle
        self.global_batch, self.steps_per_epoch = epoch_steps(
            self.rows, micro_batch_size * grad_accum_steps * world_size, unit="rows"
        )

    def order(self, epoch: int) -> np.ndarray:
        return epoch_order(self.rows, epoch, seed=self.seed, shuffle=self.shuffle)

    def _my_slots(self, offset: int) -> np.ndarray:
        """Positions in the epoch order this rank reads, step by step, from `offset`."""
        steps = (self.rows - offset) // self.global_batch
        mbs, world = self.micro_batch_size, self.world_size
        k = np.arange(self.grad_accum_steps)[:, None] * world * mbs + self.rank * mbs
        within = (k + np.arange(mbs)[None, :]).reshape(-1)
        return (offset + np.arange(steps)[:, None] * self.global_batch + within[None, :]).reshape(
            -1
        )

    def iterate(self, position: DataPosition) -> Iterator[tuple[list[MicroBatch], DataPosition]]:
        """Endless: yields (micro-batches of one step, position after that step)."""
        epoch, offset = position.epoch, position.offset
        while True:
            slots = self._my_slots(offset)
            if len(slots) == 0:
                epoch, offset = epoch + 1, 0
                continue
            rows = read_selected(self.paths, self.counts, self.seq_len, self.order(epoch)[slots])
            per_step = self.grad_accum_steps * self.micro_batch_size
            for step in range(len(slots) // per_step):
                micro = [
                    to_micro_batch(rows, lo, lo + self.micro_batch_size)
                    for lo in range(step * per_step, (step + 1) * per_step, self.micro_batch_size)
                ]
                offset += self.global_batch
                yield micro, DataPosition(epoch, offset)
            epoch, offset = epoch + 1, 0


def eval_batches(
    data_dir: str,
    manifest: Manifest,
    *,
    rank: int,
    world_size: int,
    micro_batch_size: int,
    max_rows: int | None = None,
) -> list[MicroBatch]:
    """This rank's share (row i goes to rank i mod world) of the eval split, in batches."""
    paths = shard_paths(data_dir, manifest, EVAL_SPLIT)
    if not paths:
        return []
    counts = shard_row_counts(paths)
    total = sum(counts) if max_rows is None else min(sum(counts), max_rows)
    mine = np.arange(rank, total, world_size)
    rows = read_selected(paths, counts, manifest.seq_len, mine)
    return [
        to_micro_batch(rows, lo, min(lo + micro_batch_size, len(mine)))
        for lo in range(0, len(mine), micro_batch_size)
    ]
