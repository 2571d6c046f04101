"""Run the fine-tune pipeline on this machine: `llmft run --backend local` (= `make demo`).

The very same pipeline function the cloud runs, executed by `kfp.local` with the SubprocessRunner:
Beam DirectRunner preprocessing, a local etcd, torchrun agents training through etcd-v3, the
evaluator and the exit-handler cleanup. With no data or model given, it first writes the quickstart
assets (`llmft sample-data`, `llmft tiny-model`) into the work directory.

kfp.local prints every task's log to stdout; we send that to `<workdir>/logs/pipeline.log` and show
a compact progress table instead, then the before/after metrics and where the outputs are.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LOCAL_ONLY_KEYS = ("workdir",)
DEMO_DEFAULTS: dict[str, Any] = {
    # Sized so the demo fine-tune finishes in a few minutes on 2 CPU cores and still clearly
    # beats the base model; every other parameter keeps the pipeline's own default.
    "backend": "local",
    "seq_len": 256,
    "nodes": 2,
    "nproc_per_node": 2,
    "rdzv_backend": "etcd-v3",
    "max_steps": 120,
    "learning_rate": 2e-3,
    "max_eval_examples": 100,
    "trainer_overrides": {},
}
STEP_NAMES = (
    "validate-inputs",
    "preprocess",
    "etcd-up",
    "train",
    "evaluate",
    "register",
    "cleanup",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXECUTING = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")


def pipeline_parameter_names() -> list[str]:
    from pipelines.fine_tune import build_fine_tune

    func = build_fine_tune("vertex").pipeline_func  # type: ignore[attr-defined]
    return list(inspect.signature(func).parameters)


def resolve_parameters(
    params: dict[str, Any], config_file: Path | None
) -> tuple[dict[str, Any], Path]:
    """Merge config file < --param flags over the demo defaults; split off local-only keys."""
    merged: dict[str, Any] = dict(DEMO_DEFAULTS)
    if config_file is not None:
        if not config_file.exists():
            raise FileNotFoundError(f"config file {config_file} does not exist")
        loaded = yaml.safe_load(config_file.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(
                f"config file {config_file} must be a YAML mapping of parameter: value"
            )
        merged.update(loaded.get("parameters", loaded))
    merged.update(params)
    workdir = Path(str(merged.pop("workdir", "runs/demo"))).resolve()
    known = set(pipeline_parameter_names())
    unknown = sorted(set(merged) - known)
    if unknown:
        raise ValueError(
            f"unknown pipeline parameter(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}, workdir"
        )
    if merged.get("backend") != "local":
        raise ValueError(
            "`llmft run --backend local` runs the local backend; use --backend vertex|kfp for the cloud"
        )
    return merged, workdir


def prepare_quickstart_assets(params: dict[str, Any], workdir: Path) -> None:
    """Fill in sample data and the tiny model when the user gave no data or model."""
    assets = workdir / "assets"
    if not params.get("train_data_uri"):
        data_dir = assets / "sample_data"
        if not (data_dir / "train.jsonl").exists():
            from pipelines.quickstart.sample_data import write_sample_data

            write_sample_data(data_dir)
        params["train_data_uri"] = str(data_dir / "train.jsonl")
    if not params.get("base_model"):
        model_dir = assets / "tiny_model"
        if not (model_dir / "config.json").exists():
            from pipelines.quickstart.tiny_model import build_tiny_model

            build_tiny_model(model_dir, data_dir=assets / "sample_data")
        params["base_model"] = str(model_dir)


@dataclass
class StepProgress:
    """Task states parsed from kfp.local's log lines."""

    started: dict[str, float] = field(default_factory=dict)
    finished: dict[str, tuple[str, float]] = field(default_factory=dict)

    def feed(self, line: str) -> None:
        line = _ANSI.sub("", line)
        if m := _EXECUTING.search(line):
            self.started[m.group(1)] = time.monotonic()
        elif m := _FINISHED.search(line):
            name, status = m.group(1), m.group(2)
            self.finished[name] = (
                status,
                time.monotonic() - self.started.get(name, time.monotonic()),
            )

    @property
    def failed(self) -> list[str]:
        return [name for name, (status, _) in self.finished.items() if status != "SUCCESS"]

    def table(self):  # type: ignore[no-untyped-def]
        from rich.table import Table

        table = Table(title="llmft fine-tune (local)", expand=False)
        table.add_column("step")
        table.add_column("status")
        table.add_column("time", justify="right")
        for name in STEP_NAMES:
            if name in self.finished:
                status, seconds = self.finished[name]
                style = "green" if status == "SUCCESS" else "red"
                table.add_row(name, f"[{style}]{status.lower()}[/]", f"{seconds:.0f}s")
            elif name in self.started:
                table.add_row(
                    name, "[yellow]running[/]", f"{time.monotonic() - self.started[name]:.0f}s"
                )
            else:
                table.add_row(name, "[dim]pending[/]", "")
        return table


class _LogTee(io.TextIOBase):
    """stdout replacement: everything to the log file, each line to the progress parser."""

    def __init__(self, log_file: io.TextIOBase, progress: StepProgress) -> None:
        self._log, self._progress, self._partial = log_file, progress, ""

    def write(self, text: str) -> int:
        self._log.write(text)
        self._log.flush()
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._progress.feed(line)
        return len(text)

    def flush(self) -> None:
        self._log.flush()


def _latest_run_dir(pipeline_root: Path) -> Path | None:
    from pipelines.fine_tune import PIPELINE_NAME

    runs = sorted(pipeline_root.glob(f"{PIPELINE_NAME}-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


@dataclass
class LocalRunResult:
    succeeded: bool
    failed_steps: list[str]
    run_dir: Path | None
    log_file: Path
    metrics: dict[str, Any]

    def output(self, task: str, name: str) -> Path | None:
        if self.run_dir is None:
            return None
        path = self.run_dir / task / name
        return path if path.exists() else None


def _read_metrics(run_dir: Path | None) -> dict[str, Any]:
    """Scalars from the evaluate task's Metrics artifact (kfp.local stores them in executor output)."""
    if run_dir is None:
        return {}
    for candidate in sorted(run_dir.glob("evaluate/**/executor_output.json")):
        data = json.loads(candidate.read_text())
        for artifact_list in data.get("artifacts", {}).values():
            for artifact in artifact_list.get("artifacts", []):
                if "metadata" in artifact and artifact.get("metadata"):
                    meta = artifact["metadata"]
                    if any(isinstance(v, (int, float)) for v in meta.values()):
                        return meta
    return {}


def run_local(
    params: dict[str, Any], config_file: Path | None = None, show_progress: bool = True
) -> LocalRunResult:
    """Run `fine_tune` through kfp.local; returns what happened. Never leaves a process behind."""
    from kfp import local

    from components.validation import check_run_parameters
    from pipelines.fine_tune import build_fine_tune

    resolved, workdir = resolve_parameters(params, config_file)
    workdir.mkdir(parents=True, exist_ok=True)
    prepare_quickstart_assets(resolved, workdir)
    check_run_parameters(**resolved)

    state_dir = workdir / "state"
    os.environ["LLMFT_STATE_DIR"] = str(
        state_dir
    )  # the tasks' local etcd/launcher state lives here
    pipeline_root = workdir / "pipeline_root"
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"pipeline-{time.strftime('%Y%m%d-%H%M%S')}.log"

    from rich.console import Console
    from rich.live import Live

    console = Console(file=sys.__stdout__)
    console.print(f"[bold]llmft[/] local run in {workdir}")
    for key in sorted(resolved):
        console.print(f"  {key} = {resolved[key]!r}", highlight=False)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        raise_on_error=False,
    )
    progress = StepProgress()
    # SIGTERM (e.g. from a scheduler) is handled like Ctrl-C so the cleanup below always runs.
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    interrupted = False
    try:
        with open(log_file, "w") as log, contextlib.redirect_stdout(_LogTee(log, progress)):
            live = (
                Live(progress.table(), console=console, refresh_per_second=2, transient=False)
                if show_progress
                else contextlib.nullcontext()
            )
            with live as display:
                stop_refresh = _refresh_thread(display, progress) if show_progress else None
                try:
                    build_fine_tune("vertex", schedule_time=False)(**resolved)
                finally:
                    if stop_refresh:
                        stop_refresh()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        from components.cleanup_step import cleanup_local_state

        cleanup_local_state(state_dir)  # whatever the exit handler could not reach
    run_dir = _latest_run_dir(pipeline_root)
    result = LocalRunResult(
        succeeded=not interrupted and not progress.failed and "evaluate" in progress.finished,
        failed_steps=progress.failed + (["interrupted"] if interrupted else []),
        run_dir=run_dir,
        log_file=log_file,
        metrics=_read_metrics(run_dir),
    )
    _print_summary(console, result)
    return result


def _refresh_thread(display: Any, progress: StepProgress):  # type: ignore[no-untyped-def]
    import threading

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.5):
            display.update(progress.table())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def stop_and_join() -> None:
        stop.set()
        thread.join()
        display.update(progress.table())

    return stop_and_join


def _print_summary(console: Any, result: LocalRunResult) -> None:
    if result.succeeded:
        console.print("[bold green]fine-tune succeeded[/]")
    else:
        console.print(
            f"[bold red]fine-tune failed[/]: {', '.join(result.failed_steps) or 'see log'}"
        )
    for label, task, name in (
        ("packed dataset", "preprocess", "dataset"),
        ("model", "train", "model"),
        ("metrics", "evaluate", "metrics"),
        ("report", "evaluate", "report"),
    ):
        path = result.output(task, name)
        if path is not None:
            console.print(f"  {label:15s} {path}")
    console.print(f"  {'log':15s} {result.log_file}")
    if result.metrics:
        console.print("  before / after:")
        for key in sorted(result.metrics):
            console.print(f"    {key:28s} {result.metrics[key]}", highlight=False)
