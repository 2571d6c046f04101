"""objective=grpo's evaluation: each model's greedy answer to every held-out prompt of a prompts
dataset (its eval split), scored by the run's rewards (trainer/grpo/rewards.py, the user's
reward module loaded here, inside the evaluation job): mean reward and pass rate (the share of
prompts whose first reward is > 0, e.g. an exact match), before (base) and after (tuned).

The answers come from the trainer's own rollout code (trainer/grpo/rollout.py `sample`, greedy):
the same prompt rendering, padding and stop at EOS as during training.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from trainer.packed_data.format import EVAL_SPLIT, Manifest
from trainer.packed_data.prompts import read_prompts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptExample:
    """A held-out prompt record: what generations.jsonl and the report show of it."""

    record: dict[str, Any]
    prompt_text: str
    reference: str
    """The record's `answer` column when it has one (shown beside the answers), else its columns."""


def read_prompt_examples(
    data_dir: str, manifest: Manifest, max_examples: int
) -> list[PromptExample]:
    """The first `max_examples` prompt records of the eval split."""
    records = read_prompts(data_dir, manifest, EVAL_SPLIT)[:max_examples]
    examples = []
    for record in records:
        prompt = record["prompt"]
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        columns = {k: v for k, v in record.items() if k != "prompt"}
        reference = columns.get("answer")
        if not isinstance(reference, str):
            reference = json.dumps(columns, sort_keys=True, default=str)
        examples.append(PromptExample(record, text, reference))
    return examples


def reward_scores(
    model: Any,
    tokenizer: Any,
    examples: list[PromptExample],
    rewards: list[Any],
    *,
    max_new_tokens: int,
    batch_size: int,
) -> tuple[list[str], float, float]:
    """(answers, mean reward, pass rate) of one greedy answer per prompt."""
    # torch (about 4 s to import): evaluate imports this module for every objective, and only
    # objective=grpo generates and scores answers here.
    from trainer.grpo.policy_step import columns_of, record_ids
    from trainer.grpo.rewards import score, total
    from trainer.grpo.rollout import Sampling, sample

    sampling = Sampling(group_size=1, max_completion_tokens=max_new_tokens)
    answers: list[str] = []
    values: list[float] = []
    passed: list[float] = []
    for lo in range(0, len(examples), batch_size):
        records = [ex.record for ex in examples[lo : lo + batch_size]]
        rollout = sample(model, tokenizer, [r["prompt"] for r in records], sampling, greedy=True)
        table = score(
            rewards,
            rollout.completions,
            rollout.prompts,
            columns_of(records, 1),
            record_ids(records, 1),
        )
        answers += rollout.completions
        values += total(table, rewards)
        passed += [float(row[0] > 0) for row in table]
    n = max(len(values), 1)
    return answers, sum(values) / n, sum(passed) / n
