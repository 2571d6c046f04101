"""What a local run is doing, read from what kfp.local and the KFP executor write, never from logs.

`llmft run --backend local` shows each step's state and the trainer's progress while it runs, and
decides its exit code from the same source. Log text is no such source: kfp.local colours it, and a
terminal (rich's live display captures `sys.stdout` there) changes what reaches a parser. So:

- running: kfp.local runs a task as a child process (`sh -c '... python3 -m
  kfp.dsl.executor_main' --executor_input JSON ...`); the JSON names the task's output file, `<run dir>/<task>/executor_output.json`.
- succeeded: that file exists. The KFP executor writes it only after the component function
  returned (kfp/dsl/executor.py `write_executor_output`); a failed task never writes it.
- failed: the task ran (its process was seen, or its task directory exists) and wrote no output.
- skipped: never ran (a failed upstream step, or a false `dsl.If`, e.g. register when the gate
  did not pass).

The trainer's progress comes from its `metrics.jsonl` (one JSON record per logged step).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

STEP_NAMES = (
    "validate-inputs",
    "preprocess",
    "etcd-up",
    "train",
    "evaluate",
    "register",
    "deploy",
    "cleanup",
)
REQUIRED_STEPS = ("validate-inputs", "preprocess", "etcd-up", "train", "evaluate", "cleanup")
"""Steps a successful run always completes (register runs only when the gate passes)."""
EXECUTOR_OUTPUT = "executor_output.json"


@dataclass
class StepState:
    status: str = "pending"  # pending | running | succeeded | failed | skipped
    started: float | None = None
    ended: float | None = None

    @property
    def seconds(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.time()) - self.started


def _executor_task_root(cmdline: list[str]) -> Path | None:
    """The task root a `kfp.dsl.executor_main` process writes to, from its executor input."""
    if "--executor_input" not in cmdline or not any("kfp.dsl.executor_main" in a for a in cmdline):
        return None
    at = cmdline.index("--executor_input") + 1
    try:
        executor_input = json.loads(cmdline[at])
        return Path(executor_input["outputs"]["outputFile"]).parent
    except (IndexError, ValueError, KeyError, TypeError):
        return None


@dataclass
class TrainProgress:
    step: int
    total: int | None
    loss: float | None
    tokens_per_s: float | None
    seconds_left: float | None

    def line(self) -> str:
        parts = [f"train step {self.step}" + (f"/{self.total}" if self.total else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s")
        if self.seconds_left is not None:
            minutes, seconds = divmod(int(self.seconds_left), 60)
            parts.append(f"{minutes}m{seconds:02d}s left")
        return "  ".join(parts)


def read_train_progress(metrics_file: Path, total_steps: int | None) -> TrainProgress | None:
    """The latest training record of a trainer's metrics.jsonl, with a time-left estimate."""
    try:
        lines = metrics_file.read_text().splitlines()
    except OSError:
        return None
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if "loss" in record:
            records.append(record)
    if not records:
        return None
    last, first = records[-1], records[0]
    seconds_left = None
    if total_steps and last["step"] > first["step"]:
        per_step = (last["time"] - first["time"]) / (last["step"] - first["step"])
        seconds_left = max(0.0, (total_steps - last["step"]) * per_step)
    return TrainProgress(
        step=int(last["step"]),
        total=total_steps or None,
        loss=last.get("loss"),
        tokens_per_s=last.get("tokens_per_s"),
        seconds_left=seconds_left,
    )


@dataclass
class RunWatcher:
    """Polls this process's kfp.local task processes and their task roots.

    Call `poll()` (a background thread does, see `watching`) and `finish()` once kfp.local returned.
    """

    pipeline_root: Path
    workdir: Path
    total_steps: int | None = None
    steps: dict[str, StepState] = field(
        default_factory=lambda: {name: StepState() for name in STEP_NAMES}
    )
    run_dir: Path | None = None
    started_at: float = field(default_factory=time.time)
    train: TrainProgress | None = None
    _metrics_file: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def poll(self) -> None:
        running: dict[str, float] = {}
        for child in psutil.Process().children(recursive=False):
            try:
                root = _executor_task_root(child.cmdline())
                created = child.create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if root is not None and root.name in self.steps:
                running[root.name] = created
                self.run_dir = root.parent
        with self._lock:
            for name, state in self.steps.items():
                if name in running:
                    if state.status != "running":  # a new attempt of a retried task starts afresh
                        state.status, state.started, state.ended = "running", running[name], None
                elif state.status == "running" or (
                    # finished between two polls: a task that fast still leaves its output
                    state.status == "pending"
                    and self.run_dir is not None
                    and (self.run_dir / name / EXECUTOR_OUTPUT).exists()
                ):
                    self._settle(name, state)
            self._poll_train()

    def _settle(self, name: str, state: StepState) -> None:
        """A task whose process is gone: succeeded iff the executor wrote its output."""
        output = self.run_dir / name / EXECUTOR_OUTPUT if self.run_dir else None
        if state.started is None and output is not None and output.parent.exists():
            state.started = output.parent.stat().st_ctime  # finished between two polls
        if output is not None and output.exists():
            state.status, state.ended = "succeeded", output.stat().st_mtime
        else:
            state.status, state.ended = "failed", time.time()

    def _poll_train(self) -> None:
        if self.steps["train"].status != "running":
            return
        if self._metrics_file is None:
            found = [
                p
                for p in self.workdir.rglob("metrics.jsonl")
                if p.stat().st_mtime >= self.started_at
            ]
            self._metrics_file = max(found, key=lambda p: p.stat().st_mtime) if found else None
        if self._metrics_file is not None:
            self.train = read_train_progress(self._metrics_file, self.total_steps) or self.train

    def finish(self) -> None:
        """After kfp.local returned: settle what ran, mark the rest skipped."""
        self.poll()
        if self.run_dir is None:
            self.run_dir = latest_run_dir(self.pipeline_root)
        with self._lock:
            for name, state in self.steps.items():
                ran = self.run_dir is not None and (self.run_dir / name).exists()
                if state.status in ("running", "pending") and (state.status == "running" or ran):
                    if state.started is None and ran:
                        state.started = (self.run_dir / name).stat().st_ctime  # type: ignore[operator]
                    self._settle(name, state)
                elif state.status == "pending":
                    state.status = "skipped"

    @property
    def failed(self) -> list[str]:
        return [name for name, state in self.steps.items() if state.status == "failed"]

    @property
    def succeeded(self) -> bool:
        """The pipeline succeeded: no step failed and every required step completed."""
        return not self.failed and all(
            self.steps[name].status == "succeeded" for name in REQUIRED_STEPS
        )

    def renderable(self) -> Any:
        """The step table, plus the trainer's progress line while it trains."""
        from rich.console import Group
        from rich.table import Table

        styles = {
            "succeeded": "green",
            "failed": "red",
            "running": "yellow",
            "pending": "dim",
            "skipped": "dim",
        }
        table = Table(title="llmft fine-tune (local)", expand=False)
        for column in ("step", "status", "time"):
            table.add_column(column, justify="right" if column == "time" else "left")
        with self._lock:
            for name, state in self.steps.items():
                seconds = state.seconds
                table.add_row(
                    name,
                    f"[{styles[state.status]}]{state.status}[/]",
                    f"{seconds:.0f}s" if seconds is not None else "",
                )
            train = self.train if self.steps["train"].status == "running" else None
        return Group(table, train.line()) if train else table


def latest_run_dir(pipeline_root: Path) -> Path | None:
    # the pipeline's module imports kfp (~1,500 modules): only for its name here
    from pipelines.fine_tune import PIPELINE_NAME

    runs = sorted(pipeline_root.glob(f"{PIPELINE_NAME}-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


class watching:
    """Poll `watcher` from a background thread (and refresh `display`) until the block ends."""

    def __init__(self, watcher: RunWatcher, display: Any | None, interval: float = 0.25) -> None:
        self._watcher, self._display, self._interval = watcher, display, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._watcher.poll()
            if self._display is not None:
                self._display.update(self._watcher.renderable())

    def __enter__(self) -> watching:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def follow_file(path: Path, out_fd: int, stop: threading.Event) -> threading.Thread:
    """Copy what is appended to `path` to `out_fd` until `stop` is set (`--verbose`)."""

    def loop() -> None:
        with open(path, "rb") as src:
            while True:
                chunk = src.read(65536)
                if chunk:
                    os.write(out_fd, chunk)
                elif stop.wait(0.2):
                    rest = src.read()
                    if rest:
                        os.write(out_fd, rest)
                    return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread
