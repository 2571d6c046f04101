"""Prompt records -> per-rank micro-batches of prompts, in the deterministic, resumable order of
trainer/data.py (`DataPosition` = (epoch, offset)), for objective=grpo.

Epoch `e` visits the records in `permutation(seed + e)` (file order without shuffle); a step takes
`micro_batch_size x grad_accum_steps x world` prompts, micro-batch `k` of rank `r` the slice
`(k x world + r) x micro_batch_size`, as packed rows are dealt. Each prompt's whole group of G
completions is generated, scored and trained on the rank that holds the prompt: the advantage needs
the group, so a group never straddles ranks. Prompt sets are small: every rank reads the split.
With grpo_num_iterations = mu each rollout trains mu steps (trainer/grpo_step.py
`rollout_batches`), so an epoch is mu x its rollouts in steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from trainer.data import DataPosition, epoch_order, epoch_steps
from trainer.packed_data.format import TRAIN_SPLIT, Manifest
from trainer.packed_data.prompts import read_prompts

Prompts = list[dict[str, Any]]


class PromptBatches:
    """This rank's micro-batches of prompt records for each optimizer step, from a position on."""

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
        iterations: int = 1,
    ) -> None:
        self.records = read_prompts(data_dir, manifest, TRAIN_SPLIT)
        self.rows = len(self.records)
        self.rank, self.world_size = rank, world_size
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps
        self.seed, self.shuffle = seed, shuffle
        self.global_batch, rollouts = epoch_steps(
            self.rows, micro_batch_size * grad_accum_steps * world_size, unit="prompts"
        )
        self.steps_per_epoch = rollouts * iterations
        """Each rollout trains `iterations` optimizer steps (grpo_num_iterations)."""

    def order(self, epoch: int) -> np.ndarray:
        return epoch_order(self.rows, epoch, seed=self.seed, shuffle=self.shuffle)

    def step_prompts(self, epoch: int, offset: int) -> list[Prompts]:
        """This rank's micro-batches of the step that starts at `offset` of epoch `epoch`."""
        order = self.order(epoch)
        mbs, world = self.micro_batch_size, self.world_size
        return [
            [self.records[int(i)] for i in order[offset + (k * world + self.rank) * mbs :][:mbs]]
            for k in range(self.grad_accum_steps)
        ]

    def iterate(self, position: DataPosition) -> Iterator[tuple[list[Prompts], DataPosition]]:
        """Endless: yields (micro-batches of one step, position after that step)."""
        epoch, offset = position.epoch, position.offset
        while True:
            if offset + self.global_batch > self.rows:
                epoch, offset = epoch + 1, 0
                continue
            micro = self.step_prompts(epoch, offset)
            offset += self.global_batch
            yield micro, DataPosition(epoch, offset)
