"""The save phase: eval loss, the exported model, and summary.json."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from trainer.data import MicroBatch, eval_batches
from trainer.run_state import Run

log = logging.getLogger("trainer")


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
    # Every rank must run the same number of forward passes (sharded, each one all-gathers),
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
            "attempts": r.attempt,
            "preemptions": r.state.preemptions,
            "wall_time_s": time.time() - r.started,
            "world_size": r.world_size,
            "data_position": asdict(r.state.position),
        }
        with storage.open(f"{r.output}/summary.json", "w") as f:
            json.dump(summary, f, indent=2)
        log.info("summary: %s", json.dumps(summary))
