"""Token-weighted loss and perplexity of a causal LM on packed rows, over target tokens only.

Why token-weighted: averaging per-row or per-batch means would weight a short answer's tokens more
than a long one's; summing negative log-likelihoods over every target token and dividing once gives
the number the trainer minimises, comparable across models and batch sizes.

Packed rows are scored the way they are trained, with the trainer's own loss module
(`trainer.model.CausalLMLoss`: per-document attention that honours sliding windows, soft-capping
and attention sinks, and the model's own logit post-processing), so the evaluation loss is the
training loss for every model family. Models that attention cannot apply to (the trainer refuses
them) are called with `position_ids`, no attention mask and `use_cache=False`, which makes
transformers restrict attention to each document.

Preference rows (a `pair_ids` column) also give each pair's response log-probabilities
(`LossResult.pair_logps`, trainer/preference.py's `sum_by_pair` over the same per-token losses),
from which evaluate.py computes the DPO win rate of one model against another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.packed_data.reader import PackedRows


@dataclass
class LossResult:
    loss: float
    """Mean negative log-likelihood per target token (nats)."""
    perplexity: float
    target_tokens: int
    rows: int
    pair_logps: Any = None
    """Preference rows only: [pairs, 2] float64 numpy array, log p(chosen | prompt) and
    log p(rejected | prompt) of every pair in row order; None for other data."""


def score_rows(model: Any, rows: PackedRows, *, device: Any, batch_size: int = 4) -> LossResult:
    """Mean NLL and perplexity over tokens whose loss_mask is 1.

    Token t is predicted from the logits at t-1, so the mask is read shifted by one; the schema
    guarantees a document's first token is never a target, so no prediction crosses a boundary.
    """
    import torch
    import torch.nn.functional as F

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    # the trainer's model code imports torch (seconds): only when rows are scored
    from trainer.attention import document_attention_in
    from trainer.model import CausalLMLoss
    from trainer.preference import sum_by_pair

    total_nll = 0.0
    total_targets = 0
    pair_logps: list[Any] = []
    with torch.inference_mode(), document_attention_in(model) as packed_exact:
        loss_module = CausalLMLoss(model)
        for start in range(0, len(rows), batch_size):
            batch = rows.slice(start, start + batch_size)
            input_ids = torch.tensor(batch.input_ids, dtype=torch.long, device=device)
            position_ids = torch.tensor(batch.position_ids, dtype=torch.long, device=device)
            mask = torch.tensor(batch.loss_mask, dtype=torch.bool, device=device)
            if packed_exact:
                losses = loss_module.token_losses(input_ids, position_ids, mask)
                total_nll += float(losses.double().sum())
                total_targets += losses.numel()
                if batch.pair_ids is not None:
                    pair_ids = torch.tensor(batch.pair_ids, dtype=torch.long, device=device)
                    logps = -losses.double().to(device)
                    pair_logps.append(sum_by_pair(logps, mask, pair_ids).cpu().numpy())
                continue
            logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
            # A model spread over GPUs may return its logits on another device than the inputs'.
            targets = input_ids[:, 1:].to(logits.device)
            target_mask = mask[:, 1:].to(logits.device)
            # Row by row in float32: bf16 log-softmax over a large vocabulary loses precision,
            # and a whole batch of float32 logits can be gigabytes for 100k+ vocabularies.
            row_losses = []
            for i in range(input_ids.shape[0]):
                row_mask = target_mask[i]
                if not bool(row_mask.any()):
                    continue
                row_logits = logits[i, :-1][row_mask].float()
                row_losses.append(
                    F.cross_entropy(row_logits, targets[i][row_mask], reduction="none").double()
                )
                total_nll += float(row_losses[-1].sum())
                total_targets += int(row_mask.sum())
            del logits
            if batch.pair_ids is not None:  # the losses in row-major order, as sum_by_pair takes
                logps = -torch.cat(row_losses).cpu() if row_losses else torch.zeros(0).double()
                pair_ids = torch.tensor(batch.pair_ids, dtype=torch.long)
                pair_logps.append(sum_by_pair(logps, mask.cpu(), pair_ids).numpy())
    if total_targets == 0:
        raise ValueError(
            "the eval rows contain no target tokens (loss_mask is 0 everywhere): check the "
            "preprocessing of the eval split (prompt-only or empty responses?)"
        )
    loss = total_nll / total_targets
    # exp() overflows past ~709 nats; an untrained model is far below that, but keep it finite.
    perplexity = math.exp(loss) if loss < 700 else math.inf
    return LossResult(
        loss=loss,
        perplexity=perplexity,
        target_tokens=total_targets,
        rows=len(rows),
        pair_logps=np.concatenate(pair_logps) if rows.pair_ids is not None else None,
    )
