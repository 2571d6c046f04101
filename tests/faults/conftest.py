"""What the fault tests share: a preprocessing run over hand-made inputs, and a small packed
dataset, both built on the session fixtures of tests/conftest.py (`tiny_model_dir`,
`sample_data_dir`); and waiting on explicit signals (a file, a process's end) with a failsafe
deadline only."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

FAILSAFE_S = 180.0
"""How long a wait for a signal may take before the test fails (never a pause: waits poll)."""


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = FAILSAFE_S) -> Any:
    """Poll `condition` until it returns something truthy; fail with `what` after the failsafe."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # polling a condition, not waiting for time to pass
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def preprocess(
    inputs: list[Path], out: Path, tokenizer: Path, *extra: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the real Beam pipeline on `inputs`; return its stats and its dead letters."""
    from beam_preprocess.pipeline import run
    from trainer.packed_data.format import STATS_FILE

    argv = [
        *(f"--input={path}" for path in inputs),
        f"--output={out}",
        f"--tokenizer={tokenizer}",
        "--seq-len=512",
        "--direct_num_workers=1",
        *extra,
    ]
    run(argv)
    stats = json.loads((out / STATS_FILE).read_text())
    letters = [
        json.loads(line)
        for shard in sorted((out / "rejected").glob("*.jsonl"))
        for line in shard.read_text().splitlines()
    ]
    return stats, letters


def instruction_rows(n: int, tag: str) -> list[dict[str, str]]:
    """`n` distinct prompt/response records (distinct, so that dedup keeps them all)."""
    return [
        {"prompt": f"{tag} question {i}: what is {i} plus {i}?", "response": f"It is {2 * i}."}
        for i in range(n)
    ]


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A small packed dataset (seq_len 64) made with the tiny model's tokenizer."""
    from packed_fixtures import write_packed_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    records = instruction_rows(48, "small")
    out = tmp_path_factory.mktemp("fault_dataset")
    write_packed_dataset(out, tokenizer, {"train": records[:40], "eval": records[40:]}, seq_len=64)
    return out
