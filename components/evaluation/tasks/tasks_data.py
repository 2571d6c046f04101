"""Datasets of the project's lm-evaluation-harness tasks, read from the JSONL file next to them.

The task YAMLs name `load_facts` as their `custom_dataset` (`!function tasks_data.load_facts`), so
the data is found wherever the package is installed, with no download and no working-directory
assumption. Each record's `split` says whether it is a few-shot example (train) or scored (test).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FACTS = Path(__file__).with_name("llmft_facts.jsonl")


def load_facts(**_: Any) -> Any:
    """The facts file as a `datasets.DatasetDict` with `train` and `test` splits.

    lm-evaluation-harness passes the task's metadata and dataset_kwargs as keyword arguments;
    nothing in them changes what is read.
    """
    import datasets

    rows = [json.loads(line) for line in FACTS.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_list([r for r in rows if r["split"] == split])
            for split in ("train", "test")
        }
    )
