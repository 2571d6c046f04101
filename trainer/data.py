"""Packed Parquet rows -> per-rank micro-batches, in a deterministic, resumable order.

The dataset contract (columns, manifest, tokenizer identity) lives in beam_preprocess/schema.py;
this module only reads it.

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

from beam_preprocess import storage
from beam_preprocess.schema import COLUMNS, Manifest

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

    @property
    def target_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def labels(self) -> torch.Tensor:
        """Hugging Face convention: the token id where it is a target, -100 elsewhere."""
        return torch.where(
            self.loss_mask.bool(), self.input_ids, torch.full_like(self.input_ids, -100)
        )


def shard_paths(data_dir: str, manifest: Manifest, split: str) -> list[str]:
    info = manifest.splits.get(split)
    if info is None:
        return []
    return [data_dir.rstrip("/") + "/" + rel for rel in info.shards]


def read_rows(path: str, seq_len: int, keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Read one shard's columns as [rows, seq_len] int32 arrays; `keep` selects row indices."""
    import pyarrow.parquet as pq

    with storage.open(path, "rb") as f:
        table = pq.read_table(f, columns=list(COLUMNS))
    if keep is not None:
        table = table.take(keep)
    out = {}
    for name in COLUMNS:
        column = table.column(name).combine_chunks()
        lengths = np.diff(np.asarray(column.offsets))
        if len(lengths) and (lengths != seq_len).any():
            bad = int(np.flatnonzero(lengths != seq_len)[0])
            raise ValueError(
                f"{path}: row {bad} has {lengths[bad]} {name} values, the manifest says "
                f"seq_len={seq_len}: the dataset is corrupt, re-run preprocessing"
            )
        values = np.asarray(column.flatten(), dtype=np.int32)
        out[name] = values.reshape(-1, seq_len)
    # The first token of a document has no in-document predecessor: never a target, whatever
    # the writer did (the model would otherwise learn across a document boundary).
    out["loss_mask"] = np.where(out["position_ids"] == 0, 0, out["loss_mask"])
    return out


def shard_row_counts(paths: list[str]) -> list[int]:
    import pyarrow.parquet as pq

    counts = []
    for path in paths:
        with storage.open(path, "rb") as f:
            counts.append(pq.ParquetFile(f).metadata.num_rows)
    return counts


def load_selected(paths: list[str], counts: list[int], seq_len: int, rows: np.ndarray):
    """Rows with the given global indices (in that order), reading only shards that hold some."""
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    parts: dict[str, list[np.ndarray]] = {name: [] for name in COLUMNS}
    start = 0
    for path, count in zip(paths, counts, strict=True):
        lo, hi = np.searchsorted(sorted_rows, [start, start + count])
        if hi > lo:
            chunk = read_rows(path, seq_len, keep=sorted_rows[lo:hi] - start)
            for name in COLUMNS:
                parts[name].append(chunk[name])
        start += count
    stacked = {
        name: np.concatenate(chunks) if chunks else np.zeros((0, seq_len), np.int32)
        for name, chunks in parts.items()
    }
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return {name: array[inverse] for name, array in stacked.items()}


def to_micro_batch(arrays: dict[str, np.ndarray], lo: int, hi: int) -> MicroBatch:
    return MicroBatch(
        input_ids=torch.from_numpy(arrays["input_ids"][lo:hi].astype(np.int64)),
        position_ids=torch.from_numpy(arrays["position_ids"][lo:hi].astype(np.int64)),
        loss_mask=torch.from_numpy(arrays["loss_mask"][lo:hi].astype(np.int64)),
    )


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
        self.paths = shard_paths(data_dir, manifest, "train")
        self.counts = shard_row_counts(self.paths)
        self.rows = sum(self.counts)
        self.seq_len = manifest.seq_len
        self.rank, self.world_size = rank, world_size
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps
        self.seed, self.shuffle = seed, shuffle
        self.global_batch = micro_batch_size * grad_accum_steps * world_size
        if self.rows < self.global_batch:
            raise ValueError(
                f"the training split has {self.rows} rows, fewer than one global batch of "
                f"{self.global_batch} (micro_batch_size x grad_accum_steps x world size): lower "
                "micro_batch_size or grad_accum_steps, or use fewer processes"
            )
        # Rows past the last full global batch of an epoch are skipped (a different subset
        # each epoch when shuffling): every step has the same shape, which compile needs.
        self.steps_per_epoch = self.rows // self.global_batch

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.rows)
        return np.random.default_rng([self.seed, epoch]).permutation(self.rows)

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
            arrays = load_selected(self.paths, self.counts, self.seq_len, self.order(epoch)[slots])
            per_step = self.grad_accum_steps * self.micro_batch_size
            for step in range(len(slots) // per_step):
                micro = [
                    to_micro_batch(arrays, lo, lo + self.micro_batch_size)
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
    paths = shard_paths(data_dir, manifest, "eval")
    if not paths:
        return []
    counts = shard_row_counts(paths)
    total = sum(counts) if max_rows is None else min(sum(counts), max_rows)
    mine = np.arange(rank, total, world_size)
    arrays = load_selected(paths, counts, manifest.seq_len, mine)
    return [
        to_micro_batch(arrays, lo, min(lo + micro_batch_size, len(mine)))
        for lo in range(0, len(mine), micro_batch_size)
    ]
