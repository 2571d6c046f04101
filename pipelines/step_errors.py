"""Why a step of a local run failed, read from the run log once the run is over.

`llmft run --backend local` sends every task's output to `<workdir>/logs/pipeline-*.log`; a
failed step's reason (the validate step's "unknown eval_tasks ...", the train step's "node 0
exited with status 1: ...") used to be only there, the terminal saying "fine-tune failed:
validate-inputs". kfp.local runs a task as `python -m kfp.dsl.executor_main`, which ends a failed
component with Python's traceback; kfp.local streams it into the log between "Executing task 'X'"
and "Task 'X' finished with status FAILURE" (indented, coloured). The exception that ended the
task is the last one of that block. The live step table never reads the log
(pipelines/local_progress.py says why); this is read once, after the run, for the summary only.
"""

from __future__ import annotations

import re
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXECUTING = re.compile(r"Executing task '(?P<task>[^']+)'")
_FAILED = re.compile(r"Task '(?P<task>[^']+)' finished with status FAILURE")
_EXCEPTION = re.compile(r"^(?:[\w]+\.)*(?P<kind>\w+): (?P<message>.*)$")
_PLAIN_KINDS = {"ValueError", "RuntimeError", "DiskFullError", "LaunchFailed", "FileNotFoundError"}
"""Exceptions whose message says it all (the project's own errors): shown without the class."""
MAX_LINES = 8
MAX_CHARS = 400


def step_error(log_file: Path, task: str) -> str | None:
    """The message of the exception that ended `task` (its last lines, trimmed), or None when
    the log holds no such failure (interrupted, or a task killed without a traceback)."""
    try:
        text = _ANSI.sub("", log_file.read_text(errors="replace"))
    except OSError:
        return None
    block: list[str] | None = None
    found: list[str] | None = None
    for line in text.splitlines():
        if (match := _EXECUTING.search(line)) and match["task"] == task:
            block = []
        elif (match := _FAILED.search(line)) and match["task"] == task and block is not None:
            found, block = block, None
        elif block is not None:
            block.append(line)
    return _last_exception(found) if found else None


def _last_exception(lines: list[str]) -> str | None:
    """The final exception of the last traceback in `lines` and the lines that continue it."""
    starts = [
        i for i, line in enumerate(lines) if line.strip() == "Traceback (most recent call last):"
    ]
    if not starts:
        return None
    body = lines[starts[-1] + 1 :]
    indent = len(lines[starts[-1]]) - len(lines[starts[-1]].lstrip())
    for at, line in enumerate(body):
        own = len(line) - len(line.lstrip())
        if own == indent and line.strip() and (match := _EXCEPTION.match(line.strip())):
            rest = [each[indent:].rstrip() for each in body[at + 1 :] if each.strip()]
            first = match["message"] if match["kind"] in _PLAIN_KINDS else line.strip()
            shown = [first, *rest][:MAX_LINES]
            return "\n".join(each[:MAX_CHARS] for each in shown)
    return None
