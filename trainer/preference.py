"""DPO on packed preference rows: per-response log-probabilities and the sigmoid loss.

Direct Preference Optimization (Rafailov et al. 2023, eq. 7): for a prompt x with a chosen
response y_w and a rejected one y_l,

    loss = -log sigmoid( beta * [(log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x))] )

where log pi(y|x) sums the token log-probabilities of the response only (the prompt tokens are not
targets), pi is the model being trained and ref the reference (here: the same model with its LoRA
adapters disabled, trainer/model.py). The implicit rewards are r = beta x (log pi - log ref); the
metrics are their margin r_w - r_l and the accuracy (share of pairs with r_w > r_l), which on held
out pairs is the win rate of the chosen response under the trained model.

A packed row holds whole pairs: its `pair_ids` column gives each token's document, 2k+1 for the
chosen response of the row's k-th pair and 2k+2 for the rejected one (trainer/packed_data/format.py).
"""

from __future__ import annotations

import torch
from torch import nn

STATS = ("loss", "reward_margin", "reward_accuracy")
"""What `dpo_stats` sums over pairs, in order (the loop divides by the pair count)."""


def pairs_per_row(pair_ids: torch.Tensor) -> torch.Tensor:
    """[rows] number of pairs in each row (a row's k pairs use ids 1..2k)."""
    return pair_ids.amax(dim=1) // 2


def sum_by_pair(
    logps: torch.Tensor, loss_mask: torch.Tensor, pair_ids: torch.Tensor
) -> torch.Tensor:
    """[pairs, 2] (chosen, rejected) sums of `logps`, the per-target-token log-probabilities in the
    row-major order of the targets (`CausalLMLoss.token_losses`'s order); pairs in row order."""
    select = loss_mask[:, 1:].bool()
    document = pair_ids[:, 1:][select]  # the document of each predicted (target) token
    rows = torch.arange(len(pair_ids), device=pair_ids.device)[:, None].expand_as(select)[select]
    counts = pairs_per_row(pair_ids)
    first = torch.cumsum(counts, 0) - counts  # index of each row's first pair
    pair = first[rows] + (document - 1) // 2
    side = (document - 1) % 2  # 0 chosen, 1 rejected
    out = torch.zeros(int(counts.sum()), 2, dtype=logps.dtype, device=logps.device)
    return out.index_put((pair, side), logps, accumulate=True)


def dpo_losses(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """[pairs] sigmoid DPO loss from [pairs, 2] (chosen, rejected) log-probabilities."""
    return -nn.functional.logsigmoid(margins(policy, reference, beta))


def margins(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """[pairs] reward margins r_w - r_l, with r = beta x (log pi - log ref)."""
    rewards = beta * (policy - reference)
    return rewards[:, 0] - rewards[:, 1]


def dpo_stats(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """[3]: sums over pairs of the loss (differentiable), the reward margin and correct pairs."""
    margin = margins(policy, reference, beta)
    loss = -nn.functional.logsigmoid(margin)
    detached = margin.detach()
    return torch.stack([loss.sum(), detached.sum(), (detached > 0).sum().to(loss.dtype)])
