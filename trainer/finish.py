"""The save phase: eval loss, the exported model, and summary.json."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from trainer import storage
from trainer.data import MicroBatch, eval_batches
from trainer.export import export_model
from trainer.grpo_step import held_out_rewards
from trainer.model import compute_dtype, dtype_name
from trainer.packed_data.format import EVAL_SPLIT
from trainer.packed_data.prompts import read_prompts
from trainer.run_state import Run

log = logging.getLogger("trainer")


@torch.no_grad()
def evaluate(r: Run) -> dict[str, float] | None:
    """Eval-split metrics (None if the dataset has none): `eval_loss`, the mean loss per target
    token; with objective=dpo the mean DPO loss per pair, `eval_reward_margin` and
    `eval_win_rate` (share of held-out pairs whose chosen response the trained model prefers
    over the rejected one by its implicit reward, trainer/preference.py)."""
    if r.config.objective == "grpo":
        return _grpo_eval(r)
    dpo = r.config.objective == "dpo"
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
        pair_ids=torch.zeros(1, seq_len, dtype=torch.int64) if dpo else None,
    )
    batches = batches + [filler] * (int(most.item()) - len(batches))
    r.model.eval()
    # [loss sum, loss units, (dpo) margin sum, correct pairs]
    totals = torch.zeros(4 if dpo else 2, dtype=torch.float64, device=r.device)
    for mb in batches:
        inputs = [mb.input_ids, mb.position_ids, mb.loss_mask]
        if dpo:
            assert mb.pair_ids is not None, "objective=dpo needs a preference dataset"
            inputs.append(mb.pair_ids)
        out = r.model(*(t.to(r.device) for t in inputs)).double().reshape(-1)
        units = mb.pairs if dpo else mb.target_tokens
        totals += torch.cat([out[:1], torch.tensor([units], device=r.device).double(), out[1:]])
    dist.all_reduce(totals)
    r.model.train()
    if totals[1] == 0:
        return None
    values = (totals / totals[1]).tolist()
    if not dpo:
        return {"eval_loss": values[0]}
    return {"eval_loss": values[0], "eval_reward_margin": values[2], "eval_win_rate": values[3]}


def _grpo_eval(r: Run) -> dict[str, float] | None:
    """objective=grpo: mean reward and pass rate of greedy completions on the eval split's
    prompts (`eval_reward`, `eval_pass_rate`); `eval_loss` is the negated mean reward, so that
    lower is better as for the other objectives."""
    records = read_prompts(r.config.data, r.manifest, EVAL_SPLIT)[: r.config.eval_max_rows]
    scores = held_out_rewards(r, records, r.config.micro_batch_size * r.config.grpo_group_size)
    if scores is None:
        return None
    return {"eval_loss": -scores["eval_reward"], **scores}


def save(r: Run) -> None:
    if r.config.eval_at_end:
        scores = evaluate(r)
        if scores is not None:
            r.eval_loss = scores["eval_loss"]
            r.eval_scores = scores
            assert r.metrics is not None
            r.metrics.write(r.state.step, scores)
    model_out = r.config.export_dir.rstrip("/") or f"{r.output}/model"
    if r.config.export:
        export_model(r.model, r.config, r.model_dir, model_out, r.tokenizer)
    if r.rank == 0:
        summary = {
            "base_model": r.config.model,
            "steps": r.state.step,
            "tokens": r.state.tokens,
            "target_tokens": r.state.target_tokens,
            "final_loss": r.losses[-1] if r.losses else None,
            "eval_loss": r.eval_loss,
            **{k: v for k, v in r.eval_scores.items() if k != "eval_loss"},
            "objective": r.config.objective,
            # What DPO's reference (the base, adapters off) multiplied by: the evaluation rebuilds
            # it from these (components/evaluation/evaluate.py).
            "quantize_base": r.config.quantize_base,
            "compute_dtype": dtype_name(compute_dtype(r.config, r.device)),
            "model_dir": model_out if r.config.export else None,
            "resumed_from_step": r.resumed_from_step,
            "attempts": r.attempt,
            "preemptions": r.state.preemptions,
            "wall_time_s": time.time() - r.started,
            **{f"{phase}_total": value for phase, value in r.phase_seconds.items()},
            "world_size": r.world_size,
            "data_position": asdict(r.state.position),
        }
        with storage.open(f"{r.output}/summary.json", "w") as f:
            json.dump(summary, f, indent=2)
        log.info("summary: %s", json.dumps(summary))
