"""Fault: a refusal inside the local pipeline was hidden from the terminal (issue 51, round 3).

`llmft run --backend local --param eval_tasks=no_such_task` started the pipeline, whose validate
step refused it; the terminal said only "fine-tune failed: validate-inputs" (exit 1), the reason
was in the log file. Now the validate step's checks that need no download run in `llmft run`
before anything is written (exit 2, the `error:` line), and a step that still fails (here:
every record rejected, which only preprocessing can find) has its reason printed under the table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.conftest import error_lines, llmft_process

pytestmark = pytest.mark.e2e


def test_unknown_eval_task_is_refused_before_the_pipeline_starts(tmp_path: Path):
    workdir = tmp_path / "w"
    result = llmft_process(
        "run", "--backend", "local", "--param", "eval_tasks=no_such_task",
        "--param", f"workdir={workdir}",
    )  # fmt: skip
    assert result.returncode == 2, result.output[-3000:]
    assert result.output.startswith("error: "), result.output[-3000:]
    assert "unknown eval_tasks no_such_task" in result.output
    assert not workdir.exists()  # not even the quickstart assets


@pytest.mark.slow
def test_a_failed_steps_reason_is_shown_under_the_table(tmp_path: Path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join('{"prompt": "cut off ' + str(i) + "\n" for i in range(30)))
    result = llmft_process(
        "run", "--backend", "local", "--param", f"train_data_uri={data}",
        "--param", f"workdir={tmp_path / 'w'}",
    )  # fmt: skip
    assert result.returncode == 1, result.output[-3000:]
    assert "fine-tune failed: preprocess" in result.output, result.output[-3000:]
    errors = error_lines(result.output)
    assert len(errors) == 1, result.output[-3000:]
    assert errors[0].startswith("error: preprocess: 30 of 30 records (100.0%) were rejected")
    assert "--max-rejected-fraction" in errors[0], errors
    table_end = result.output.index("fine-tune failed")
    assert result.output.index(errors[0]) > table_end  # under the table, not in a log
