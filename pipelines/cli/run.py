"""`llmft run`: the fine-tune pipeline on this machine (kfp.local), on Vertex AI Pipelines or on
KFP. Phases: check the backend, then either run locally or load the deploy config and submit."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli import options as opt
from pipelines.cli.common import check_choice, parse_params, user_errors

BackendOpt = Annotated[
    str, typer.Option(help="local (this machine), vertex (Vertex AI Pipelines) or kfp (KFP).")
]
DisplayNameOpt = Annotated[str | None, typer.Option(help="Run name prefix.")]
ExperimentOpt = Annotated[
    str | None, typer.Option(help="Vertex AI Experiment / KFP experiment to file the run in.")
]
FailurePolicyOpt = Annotated[
    str | None, typer.Option(help="Vertex: fast or slow.", show_default="slow")
]
ScheduleTimeOpt = Annotated[
    str | None,
    typer.Option(help="Fill the schedule-time placeholder (backfill), e.g. 2026-01-05T03:00:00Z."),
]
WaitOpt = Annotated[bool, typer.Option(help="Follow the run and exit non-zero if it fails.")]
VerboseOpt = Annotated[
    bool, typer.Option(help="Local: also stream the tasks' logs to the terminal.")
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        help="vertex/kfp: check the config and parameters as a submission would, and against "
        "the platform facts (machines, GPUs, node sizes); print the parameters, submit nothing "
        "(no credentials or server needed)."
    ),
]


@user_errors
@opt.with_deploy_flags
def run_cmd(
    backend: BackendOpt = "local",
    config: opt.ConfigOpt = None,
    param: opt.ParamOpt = None,
    display_name: DisplayNameOpt = None,
    experiment: ExperimentOpt = None,
    failure_policy: FailurePolicyOpt = None,
    schedule_time: ScheduleTimeOpt = None,
    wait: WaitOpt = False,
    verbose: VerboseOpt = False,
    dry_run: DryRunOpt = False,
    *,
    deploy: dict[str, Any],
) -> None:
    """Run the fine-tune pipeline: on this machine, on Vertex AI Pipelines, or on KFP."""
    from components.param_checks import TARGETS

    params = parse_params(param)
    # Keyed as the deploy config names them (pipelines/deploy/config.py: flag_overrides).
    remote = dict(
        deploy, display_name=display_name, experiment=experiment, failure_policy=failure_policy
    )
    if check_choice(backend, TARGETS) == "local":
        if dry_run:
            raise ValueError("--dry-run checks a cloud launch: use --backend vertex or kfp")
        _warn_ignored({**remote, "schedule_time": schedule_time, "wait": wait or None})
        _run_local(params, config, verbose)
    else:
        _submit(backend, config, params, remote, schedule_time, wait, dry_run)


def _warn_ignored(remote: dict[str, Any]) -> None:
    """Warn about each remote-only flag given with `--backend local` (it would do nothing)."""
    ignored = [
        "--label" if name == "labels" else f"--{name.replace('_', '-')}"
        for name, value in remote.items()
        if value not in (None, [], {})
    ]
    if ignored:
        typer.secho(f"warning: --backend local ignores {', '.join(ignored)}", err=True)


def _run_local(params: dict[str, Any], config: Path | None, verbose: bool) -> None:
    """The pipeline through kfp.local; exit code 1 when a required step failed."""
    from pipelines.local_run import run_local

    result = run_local(params, config, verbose=verbose)
    if not result.succeeded:
        raise typer.Exit(1)


def parse_schedule_time(text: str | None) -> dt.datetime | None:
    """`--schedule-time` as a datetime (a trailing Z means UTC), None when not given."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--schedule-time {text!r} is not like 2026-01-05T03:00:00Z") from None


def _submit(
    backend: Any,
    config: Path | None,
    params: dict[str, Any],
    remote: dict[str, Any],
    schedule_time: str | None,
    wait: bool,
    dry_run: bool = False,
) -> None:
    """Load the deploy config (file + flags) and submit one run to Vertex AI or KFP (or, with
    `dry_run`, check it and print the run's parameters)."""
    import json

    from pipelines.deploy.config import load_for
    from pipelines.deploy.submit import dry_run as check_run
    from pipelines.deploy.submit import submit_kfp, submit_vertex

    cfg = load_for(backend, config, parameters=params, **remote)
    when = parse_schedule_time(schedule_time)
    if dry_run:
        checked = check_run(cfg, backend, schedule_time=when)
        typer.echo(
            f"dry run: a {backend} run of {cfg.template} passes validation; nothing was "
            "submitted. Its parameters:"
        )
        typer.echo(json.dumps(checked, indent=2, sort_keys=True))
        return
    submit = submit_vertex if backend == "vertex" else submit_kfp
    submit(cfg, schedule_time=when, wait=wait, report=typer.echo)
