"""A local run's step table and verdict do not depend on where its output goes (a terminal or a
pipe): `pipelines.local_progress.RunWatcher` reads them from the task directories kfp.local
leaves, and `run_local` prints the same table and summary to either console.

This holds in process what tests/test_pipeline_local.py once proved by running the whole pipeline
twice per outcome (in a pseudo-terminal and piped); that file now runs each outcome once and
keeps both modes only for Ctrl-C, where the terminal path really differs (the ^C typed into it).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from pipelines.local_progress import EXECUTOR_OUTPUT, STEP_NAMES, RunWatcher
from pipelines.local_run import _collect, _print_summary

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
_ROW = re.compile(r"^[│|] (\S+)\s+[│|] (\w+)\s+[│|]", re.M)

SUCCEEDED = dict.fromkeys(STEP_NAMES, "succeeded") | {"register": "skipped"}
TRAIN_FAILED = SUCCEEDED | dict.fromkeys(("train",), "failed") | {
    "evaluate": "skipped", "deploy": "skipped", "register": "skipped",
}  # fmt: skip


def _finished_run(workdir: Path, states: dict[str, str]) -> RunWatcher:
    """What kfp.local leaves: a task directory per step that ran, with the executor's output
    only for those that succeeded; evaluate's metrics as the executor records them."""
    run_dir = workdir / "pipeline_root" / "llmft-fine-tune-2026-12-07"
    for step, state in states.items():
        if state == "skipped":
            continue
        (run_dir / step).mkdir(parents=True)
        if state == "succeeded":
            output: dict = {}
            if step == "evaluate":
                metrics = {"base_eval_loss": 4.0, "tuned_eval_loss": 2.0, "passed": True}
                output = {"artifacts": {"metrics": {"artifacts": [{"metadata": metrics}]}}}
            (run_dir / step / EXECUTOR_OUTPUT).write_text(json.dumps(output))
    watcher = RunWatcher(pipeline_root=workdir / "pipeline_root", workdir=workdir, total_steps=20)
    return watcher


def _printed(watcher: RunWatcher, log_file: Path, terminal: bool) -> str:
    """The table and summary `run_local` prints after the run, to a terminal or a pipe."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=100)
    result = _collect(watcher, interrupted=False, log_file=log_file)
    console.print(watcher.renderable())
    _print_summary(console, result)
    return _ANSI.sub("", out.getvalue())


@pytest.mark.parametrize(
    ("states", "verdict"),
    [(SUCCEEDED, "fine-tune succeeded"), (TRAIN_FAILED, "fine-tune failed: train")],
    ids=["succeeded", "train-failed"],
)
def test_the_step_table_and_verdict_are_the_same_on_a_terminal_and_a_pipe(
    tmp_path: Path, states: dict[str, str], verdict: str
) -> None:
    printed = {}
    for terminal in (True, False):
        workdir = tmp_path / ("tty" if terminal else "pipe")
        watcher = _finished_run(workdir, states)
        watcher.finish()
        assert watcher.succeeded == (verdict == "fine-tune succeeded")  # the exit code's source
        text = _printed(watcher, tmp_path / "pipeline.log", terminal)
        table = text[text.rindex("llmft fine-tune (local)") :]
        printed[terminal] = (dict(_ROW.findall(table)), verdict in text)
    assert printed[True] == printed[False] == (states, True)
