"""`llmft sample-prompts`: the packaged verifiable task for objective=grpo, as files a run takes.

    llmft sample-prompts DIR [--n 400] [--seed 0]
    -> DIR/prompts.jsonl   generated arithmetic prompts with their `answer` column
       DIR/rewards.json    the `rewards` parameter that scores them (trainer/grpo/tasks.py)

    llmft run --param train_data_uri=DIR/prompts.jsonl --param data_kind=prompts \
        --param objective=grpo --param rewards="$(cat DIR/rewards.json)" ...
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.grpo.tasks import ARITHMETIC_REWARDS, arithmetic


def write_prompts_task(out_dir: str | Path, n: int = 400, seed: int = 0) -> dict[str, Any]:
    """Write the task's prompts and rewards; returns what was written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in arithmetic(n, seed)))
    rewards = out / "rewards.json"
    rewards.write_text(ARITHMETIC_REWARDS + "\n")
    return {"prompts": str(prompts), "records": n, "rewards": str(rewards), "seed": seed}
