"""Run the fine-tune pipeline on this machine: `llmft run --backend local` (= `make demo`).

The very same pipeline function the cloud runs, executed by `kfp.local` with the SubprocessRunner:
Beam DirectRunner preprocessing, a local etcd, torchrun agents training through etcd-v3, the
evaluator and the exit-handler cleanup. With no data or model given, it first writes the quickstart
assets (`llmft sample-data`, `llmft tiny-model`) into the work directory.

Every task's output (kfp.local's, Beam's, the ranks') goes to `<workdir>/logs/pipeline-*.log`; the
terminal shows a live step table with the trainer's progress (pipelines/local_progress.py), then
the before/after metrics and where the outputs are.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.params.param_values import params_from_mapping
from components.params.run_checks import run_errors
from components.params.run_params import RunParams, fields
from components.preflight.validation import (
    data_errors,
    mix_data_errors,
    model_errors,
    reward_module_errors,
)
from components.runtime.run_identity import STATE_DIR_ENV
from components.serving.mlflow_tracking import tracking_errors
from pipelines.local_progress import RunWatcher, follow_file, watching
from pipelines.quickstart.sample_data import write_sample_data
from pipelines.quickstart.tiny_model import build_tiny_model
from pipelines.step_errors import step_error
from trainer import storage
from trainer.config_file import read_yaml_mapping

QUICKSTART_PRESET: dict[str, Any] = {
    # Sized for the quickstart's tiny model and sample data, so the demo fine-tune finishes in a
    # few minutes on 2 CPU cores and still clearly beats the base model. Applied only when the run
    # uses the tiny model (no base_model given), under anything the user sets; every other
    # parameter keeps its one default (components/params/run_params.py).
    "seq_len": 256,
    "nproc_per_node": 2,  # 2 nodes x 2 processes on CPU (the default, 0, is one per GPU)
    "max_steps": 120,
    "learning_rate": 2e-3,
    "max_eval_examples": 64,
}
DEFAULT_WORKDIR = "runs/demo"


def resolve_parameters(params: dict[str, Any], config_file: Path | None) -> tuple[RunParams, Path]:
    """Config file < `--param`s over the schema's defaults (and the quickstart preset when the
    tiny model is used), checked before anything is written: every problem in one ValueError.

    Empty `train_data_uri` / `base_model` are filled with where the quickstart assets will be
    written (`prepare_quickstart_assets` writes them after this check passes).
    """
    # etcd's client imports requests (~200 modules): only for an etcd rendezvous
    from components.etcd.local import EtcdNotFoundError, find_etcd
    from components.params.run_checks import raise_errors
    from components.preflight.validation import evaluation_errors

    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(_read_config(config_file))
    values.update(params)
    workdir = Path(str(values.pop("workdir", DEFAULT_WORKDIR))).resolve()
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"workdir {str(workdir)!r} is a file: give a directory for the run")
    assets = workdir / "assets"
    quickstart = {}
    if not values.get("train_data_uri"):
        quickstart["train_data_uri"] = str(assets / "sample_data" / "train.jsonl")
    if not values.get("base_model"):
        quickstart["base_model"] = str(assets / "tiny_model")
        quickstart |= QUICKSTART_PRESET
    given = {k: v for k, v in values.items() if not (k in quickstart and v == "")}
    resolved = params_from_mapping({**quickstart, **given})
    errors = run_errors(resolved)
    for key, value in resolved.as_dict().items():
        if "python3" in json.dumps(value):
            # kfp.local's SubprocessRunner replaces "python3" everywhere in a task's command line.
            errors.append(
                f"{key}={value!r} contains 'python3', which kfp.local rewrites in task inputs: "
                "pass a path without it (e.g. a symlink)"
            )
    if "train_data_uri" not in quickstart:
        errors += data_errors(resolved.train_data_uri, remote=False)
    errors += mix_data_errors(resolved, remote=False)
    if "base_model" not in quickstart:
        errors += model_errors(resolved.base_model)
    errors += reward_module_errors(resolved.reward_module, remote=True)
    # The validate step's own checks that need no download, here before anything is written
    # (the step runs them again on this machine: remote=True, as there).
    errors += evaluation_errors(resolved, resolved.base_model, remote=True, check_machine=False)
    if problem := storage.not_writable(str(workdir)):
        errors.append(f"workdir {str(workdir)!r}: {problem}")
    errors += tracking_errors(  # here, where the local run's steps will reach the server
        resolved.tracking_uri,
        resolved.tracking_token_secret,
        target="local",
        project=resolved.project,
    )
    if resolved.rdzv_backend != "c10d":
        try:
            find_etcd()
        except EtcdNotFoundError as exc:
            hint = str(exc).replace("`--rdzv-backend c10d`", "rdzv_backend=c10d")
            errors.append(f"rdzv_backend={resolved.rdzv_backend!r}: {hint}")
    if resolved.backend != "local":
        errors.append(
            f"backend={resolved.backend!r}: `llmft run --backend local` trains on this machine; "
            "use `llmft run --backend vertex|kfp` for the cloud"
        )
    raise_errors(errors)
    return resolved, workdir


def _read_config(path: Path) -> dict[str, Any]:
    """A YAML mapping of parameter: value (or a deploy config with a `parameters:` section)."""
    loaded = read_yaml_mapping(path)
    if not isinstance(loaded.get("parameters", {}), dict):
        raise ValueError(f"config file {path} must be a YAML mapping of parameter: value")
    return dict(loaded.get("parameters", loaded))


def prepare_quickstart_assets(params: RunParams, workdir: Path) -> None:
    """Write the sample data and the tiny model where `resolve_parameters` pointed, if missing."""
    assets = workdir / "assets"
    data_dir = assets / "sample_data"
    if (
        params.train_data_uri == str(data_dir / "train.jsonl")
        and not (data_dir / "train.jsonl").exists()
    ):
        write_sample_data(data_dir)
    model_dir = assets / "tiny_model"
    if params.base_model == str(model_dir) and not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, data_dir=data_dir)


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
    errors: dict[str, str] = field(default_factory=dict)
    """Each failed step's reason, from the run log (pipelines/step_errors.py)."""

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
    params: dict[str, Any], config_file: Path | None = None, verbose: bool = False
) -> LocalRunResult:
    """Run `fine_tune` through kfp.local; returns what happened. Never leaves a process behind.

    Everything the tasks print (kfp.local, Beam, the torchrun ranks) goes to
    `<workdir>/logs/pipeline-*.log` at the file-descriptor level, so nothing scrolls through the
    live step table; `verbose` also streams that log to the terminal. Step states and the verdict
    come from `pipelines.local_progress`, which never reads the log.
    """
    params_, workdir = resolve_parameters(params, config_file)  # checked: nothing written yet
    workdir.mkdir(parents=True, exist_ok=True)
    prepare_quickstart_assets(params_, workdir)
    resolved = params_.as_dict()
    state_dir = workdir / "state"
    # The tasks' local etcd/launcher state lives here.
    os.environ[STATE_DIR_ENV] = str(state_dir)
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"pipeline-{time.strftime('%Y%m%d-%H%M%S')}.log"

    sys.stdout.flush()
    sys.stderr.flush()
    terminal_fd = os.dup(1)
    console = _start(workdir, resolved, log_file, terminal_fd)
    watcher = RunWatcher(
        pipeline_root=workdir / "pipeline_root",
        workdir=workdir,
        total_steps=int(resolved.get("max_steps") or 0) or None,
    )
    interrupted = _execute(resolved, watcher, console, log_file, terminal_fd, verbose, state_dir)
    result = _collect(watcher, interrupted, log_file)
    console.print(watcher.renderable())
    _print_summary(console, result)
    console.file.flush()
    os.close(terminal_fd)
    return result


def _start(workdir: Path, resolved: dict[str, Any], log_file: Path, terminal_fd: int) -> Any:
    """Point kfp.local at the work dir and log every resolved setting once, on the terminal."""
    from kfp import local
    from rich.console import Console

    console = Console(file=open(terminal_fd, "w", buffering=1, closefd=False))  # noqa: SIM115
    # kfp.local warns for any image without "python" in its name; ours has the package and runs
    # here in this very environment, which is the point of the local backend.
    warnings.filterwarnings(
        "ignore", message="You may be attemping to run a task", category=RuntimeWarning
    )
    console.print(f"[bold]llmft[/] local run in {workdir}")
    cloud = {name for name, f in fields().items() if f.metadata.get("cloud")}
    for key in sorted(set(resolved) - cloud):
        console.print(f"  {key} = {resolved[key]!r}", highlight=False)
    console.print(f"  log: {log_file} (with the {len(cloud)} cloud settings)", highlight=False)
    with open(log_file, "a") as log:
        log.write("resolved settings (all of them):\n")
        log.writelines(f"  {key} = {resolved[key]!r}\n" for key in sorted(resolved))
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(workdir / "pipeline_root"),
        raise_on_error=False,
    )
    return console


def _execute(
    resolved: dict[str, Any],
    watcher: RunWatcher,
    console: Any,
    log_file: Path,
    terminal_fd: int,
    verbose: bool,
    state_dir: Path,
) -> bool:
    """Run the local build of the pipeline with output to the log; True when interrupted.
    Whatever happens, the run's local state (processes, etcd) is swept afterwards."""
    from rich.live import Live

    # the pipeline imports kfp (~1,500 modules), the cleanup step and the watchdog ~120 more:
    # only when a local run executes (`llmft run` imports this module for every backend)
    from components.steps.cleanup import cleanup_local_state
    from pipelines.fine_tune import build_fine_tune
    from pipelines.watchdog import Watchdog

    # SIGTERM (e.g. from a scheduler) and SIGHUP (the terminal closed) are handled like Ctrl-C so
    # the cleanup after this runs; a SIGKILL leaves it to the watchdog.
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # `nohup llmft run` ignores it
        signals.append(signal.SIGHUP)
    previous = {
        sig: signal.signal(sig, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        for sig in signals
    }
    watchdog = Watchdog(state_dir, log_file.with_name("watchdog.log"))
    watchdog.start()
    follow_stop = threading.Event()
    follower: threading.Thread | None = None
    try:
        with _output_to(log_file), _root_logging_to(sys.stdout):
            follower = follow_file(log_file, terminal_fd, follow_stop) if verbose else None
            live_table = console.is_terminal and not verbose
            live = (
                Live(
                    watcher.renderable(),
                    console=console,
                    refresh_per_second=4,
                    transient=True,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                if live_table
                else contextlib.nullcontext()
            )
            with live as display, watching(watcher, display if live_table else None):
                build_fine_tune("local")(**resolved)
        return False
    except KeyboardInterrupt:
        return True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        cleanup_local_state(state_dir)  # whatever the exit handler could not reach
        watchdog.stop()
        follow_stop.set()
        if follower is not None:
            follower.join()


def _collect(watcher: RunWatcher, interrupted: bool, log_file: Path) -> LocalRunResult:
    """The run's outcome, also written to `<run_dir>/metrics.json` when evaluation ran."""
    watcher.finish()
    run_dir = watcher.run_dir
    result = LocalRunResult(
        succeeded=not interrupted and watcher.succeeded,
        failed_steps=watcher.failed + (["interrupted"] if interrupted else []),
        run_dir=run_dir,
        log_file=log_file,
        metrics=_artifact_metadata(run_dir, "evaluate", "metrics"),
        model=_artifact_metadata(run_dir, "train", "model"),
        errors={
            step: error
            for step in watcher.failed
            if (error := step_error(log_file, step)) is not None
        },
    )
    if run_dir is not None and result.metrics:
        # One file with the run's outcome: the Metrics artifact lives only in kfp.local's records.
        summary = {"succeeded": result.succeeded, "metrics": result.metrics, "model": result.model}
        (run_dir / "metrics.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return result


@contextlib.contextmanager
def _output_to(log_file: Path):  # type: ignore[no-untyped-def]
    """Point file descriptors 1 and 2 (this process and every child it starts) at the run log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for each in (fd, *saved):
            os.close(each)


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


def _print_summary(console: Any, result: LocalRunResult) -> None:
    from rich.table import Table

    console.print()
    if result.succeeded:
        console.print("[bold green]fine-tune succeeded[/]")
    else:
        console.print(
            f"[bold red]fine-tune failed[/]: {', '.join(result.failed_steps) or 'see log'}"
        )
        for step, error in result.errors.items():  # the reason, not only the log's path
            console.print(f"error: {step}: {error}", soft_wrap=True, highlight=False, markup=False)
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
        names = ("eval_loss", "perplexity", "exact_match", "chrf", "general_correct")
        for name in (*names, "win_rate", "reward_margin"):
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
