"""A packaged verifiable task: generated two-number arithmetic with answers, and its rewards.

    records = arithmetic(n=64, seed=0)     # [{"id", "prompt": [messages], "answer": "42"}, ...]
    ARITHMETIC_REWARDS                     # the `rewards` JSON for it

Each record is a data_kind=prompts record: a chat prompt plus an `answer` column the reward reads.
The rewards: exact match of the completion's last number against `answer` (weight 1), and a format
reward for answering with the number alone (weight 0.5): a small instruct model starts out wordy
and often wrong, so both have room to rise under GRPO.
"""

from __future__ import annotations

import json
import random
from typing import Any

ARITHMETIC_REWARDS = json.dumps(
    [
        {"name": "exact_match", "column": "answer", "extract": "last_number", "weight": 1.0},
        {"name": "regex", "pattern": r"-?\d+", "mode": "fullmatch", "weight": 0.5},
    ]
)


def arithmetic(n: int, seed: int, max_operand: int = 20) -> list[dict[str, Any]]:
    """`n` distinct-by-seed questions "What is a + b?" / "a - b" / "a * b" with their answers."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        question = f"What is {a} {op} {b}? Reply with the number only."
        records.append(
            {
                "id": f"arith-{seed}-{i}",
                "prompt": [{"role": "user", "content": question}],
                "answer": str(value),
            }
        )
    return records
