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
import warnings
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
    "max_eval_examples": 64,
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


def pipeline_defaults() -> dict[str, Any]:
    """The pipeline's parameters and their defaults, from the one pipeline source."""
    from pipelines.fine_tune import build_fine_tune

    func = build_fine_tune("local").pipeline_func  # type: ignore[attr-defined]
    return {name: p.default for name, p in inspect.signature(func).parameters.items()}


def resolve_parameters(
    params: dict[str, Any], config_file: Path | None
) -> tuple[dict[str, Any], Path]:
    """Merge config file < --param flags over the demo defaults; split off local-only keys."""
    defaults = pipeline_defaults()
    merged: dict[str, Any] = {**defaults, **DEMO_DEFAULTS}
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
    known = set(defaults)
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
    done: bool = False
    """Set when the pipeline returned: steps that never started were skipped."""

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
                table.add_row(name, "[dim]skipped[/]" if self.done else "[dim]pending[/]", "")
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
    """Evaluation scalars (base_*, tuned_*, *_delta, passed)."""
    model: dict[str, Any]
    """The Model artifact's metadata (model_uri, steps, tokens, final_loss, ...)."""

    def output(self, task: str, name: str) -> Path | None:
        if self.run_dir is None:
            return None
        path = self.run_dir / task / name
        return path if path.exists() else None


def _artifact_metadata(run_dir: Path | None, task: str, output: str) -> dict[str, Any]:
    """An output artifact's metadata, as kfp.local recorded it in the task's executor output."""
    path = run_dir / task / "executor_output.json" if run_dir else None
    if path is None or not path.exists():
        return {}
    artifacts = (
        json.loads(path.read_text()).get("artifacts", {}).get(output, {}).get("artifacts", [])
    )
    return dict(artifacts[0].get("metadata", {})) if artifacts else {}


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
    # kfp.local warns for any image without "python" in its name; ours has the package and runs
    # here in this very environment, which is the point of the local backend.
    warnings.filterwarnings(
        "ignore", message="You may be attemping to run a task", category=RuntimeWarning
    )
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
        with (
            open(log_file, "w") as log,
            contextlib.redirect_stdout(_LogTee(log, progress)),
            _root_logging_to(log),
        ):
            live = (
                Live(progress.table(), console=console, refresh_per_second=2, transient=False)
                if show_progress
                else contextlib.nullcontext()
            )
            with live as display:
                stop_refresh = _refresh_thread(display, progress) if show_progress else None
                try:
                    build_fine_tune("local")(**resolved)
                finally:
                    progress.done = True
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
        metrics=_artifact_metadata(run_dir, "evaluate", "metrics"),
        model=_artifact_metadata(run_dir, "train", "model"),
    )
    if run_dir is not None and result.metrics:
        # One file with the run's outcome: the Metrics artifact lives only in kfp.local's records.
        summary = {"succeeded": result.succeeded, "metrics": result.metrics, "model": result.model}
        (run_dir / "metrics.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    _print_summary(console, result)
    return result


@contextlib.contextmanager
def _root_logging_to(stream: Any):  # type: ignore[no-untyped-def]
    """Send root-logger records (kfp.local's orchestrator warnings) to the run log, not stderr."""
    import logging

    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


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
    from rich.table import Table

    console.print()
    if result.succeeded:
        console.print("[bold green]fine-tune succeeded[/]")
    else:
        console.print(
            f"[bold red]fine-tune failed[/]: {', '.join(result.failed_steps) or 'see log'}"
        )
    where = {
        "packed dataset": result.output("preprocess", "dataset"),
        "model": result.model.get("model_uri"),
        "training run": result.model.get("run_uri"),
        "metrics": result.run_dir / "metrics.json" if result.metrics and result.run_dir else None,
        "report": result.output("evaluate", "report"),
        "log": result.log_file,
    }
    for label, path in where.items():
        if path:
            console.print(f"  {label:15s} {path}", soft_wrap=True, highlight=False)
    if result.model:
        m = result.model
        console.print(
            f"  trained {m.get('steps')} steps on {m.get('tokens')} tokens "
            f"({m.get('target_tokens')} targets), final loss {m.get('final_loss', float('nan')):.3f}",
            highlight=False,
        )
    if result.metrics:
        table = Table(title="before / after (eval split)")
        for column in ("metric", "base", "tuned", "delta"):
            table.add_column(column, justify="left" if column == "metric" else "right")
        for name in ("eval_loss", "perplexity", "exact_match", "chrf"):
            if f"tuned_{name}" in result.metrics:
                table.add_row(
                    name,
                    f"{result.metrics.get(f'base_{name}', float('nan')):.4g}",
                    f"{result.metrics[f'tuned_{name}']:.4g}",
                    f"{result.metrics.get(f'{name}_delta', float('nan')):+.4g}",
                )
        console.print(table)
        gate = "passed" if result.metrics.get("passed") else "did not pass"
        console.print(f"  quality gate: {gate}")
