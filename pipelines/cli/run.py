"""`llmft run`: the fine-tune pipeline on this machine (kfp.local), on Vertex AI Pipelines or on
KFP. Phases: check the backend, then either run locally or load the deploy config and submit."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from components.params.param_checks import TARGETS
from components.params.run_params import RunParams
from pipelines.cli import options as opt
from pipelines.cli.common import check_choice, parse_params, user_errors

# lazy imports: each command imports the modules of its work in its body, so that `llmft --help`
# (0.4 s) does not pay for them: the preflight, local-run and submit modules take +0.2 s to import
# after pipelines.cli (min of 3, shared 2-core machine).

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
        help="Check the config and parameters as a submission would (vertex/kfp: also against "
        "the platform facts: machines, GPUs, node sizes), print the cost estimate per step and "
        "the parameters; start nothing (needs no credentials or server)."
    ),
]
DRY_RUN_PARAMETERS = "Its parameters:"
"""Ends the dry run's summary line; the run's parameters follow as JSON."""
PricesOpt = Annotated[
    Path | None,
    typer.Option(
        help="YAML/JSON prices overriding the dated table in components/preflight/prices.py, e.g. "
        "'NVIDIA_H100_80GB: {spot: 3.5}' (USD per GPU-hour)."
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
    prices: PricesOpt = None,
    *,
    deploy: dict[str, Any],
) -> None:
    """Run the fine-tune pipeline: on this machine, on Vertex AI Pipelines, or on KFP.

    The cost estimate is printed first; a run whose training cannot fit its GPUs, or whose
    estimate exceeds max_cost_usd, is refused before anything starts. --dry-run stops after the
    estimate."""
    params = parse_params(param)
    # Keyed as the deploy config names them (pipelines/deploy/config.py: flag_overrides).
    remote = dict(
        deploy, display_name=display_name, experiment=experiment, failure_policy=failure_policy
    )
    if check_choice(backend, TARGETS) == "local":
        _warn_ignored({**remote, "schedule_time": schedule_time, "wait": wait or None})
        from pipelines.local_run import resolve_parameters

        _check_fit_and_cost(resolve_parameters(params, config)[0], prices, remote=False)
        if not dry_run:
            _run_local(params, config, verbose)
    else:
        _submit(backend, config, params, remote, schedule_time, wait, dry_run, prices)


def _check_fit_and_cost(run_params: Any, prices: Path | None, *, remote: bool) -> None:
    """Refuse a run whose training cannot fit its GPUs (components/preflight/train_fit.py); print its cost
    estimate and refuse it over max_cost_usd (ValueError: exit 2)."""
    from components.preflight import cost, run_cost
    from components.preflight.prices import load_prices
    from components.preflight.train_fit import training_fit_error

    if error := training_fit_error(run_params, run_params.base_model, remote=remote):
        raise ValueError(error)
    table = load_prices(str(prices)) if prices else None
    estimate = run_cost.estimate_for(run_params, remote=remote, prices=table)
    typer.echo("cost estimate (components/preflight/cost.py; an estimate, not a quote):")
    typer.echo(estimate.table())
    if error := cost.budget_error(estimate, run_params.max_cost_usd):
        raise ValueError(error)


def _check_quota(run_params: Any, *, dry_run: bool) -> None:
    """Refuse a run that needs more GPU or CPU quota than the project is granted
    (components/preflight/quota.py); a quota that cannot be read is a warning. A dry run reads
    quota only where application-default login was done (it needs no access otherwise); a real
    run without any access is left to the submission, which says so in its own error."""
    from components.preflight import quota

    if not quota.needs_for(run_params):
        return
    session = None
    if quota.SESSION_FACTORY is quota.default_session:
        if dry_run and not quota.local_credentials():
            typer.secho(
                "warning: quota not checked: a dry run reads it only after "
                "`gcloud auth application-default login`",
                err=True,
            )
            return
        try:
            session = quota.default_session()
        except quota.QuotaUnreadable as exc:
            if dry_run:
                typer.secho(f"warning: quota not checked: {exc}", err=True)
            return
    report = quota.quota_check(run_params, session=session)
    for warning in report.warnings:
        typer.secho(f"warning: {warning}", err=True)
    if report.errors:
        raise ValueError("; ".join(report.errors))


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
    prices: Path | None = None,
) -> None:
    """Load the deploy config (file + flags), make every check a submission makes, estimate the
    cost and submit one run to Vertex AI or KFP (with `dry_run`, print the parameters instead:
    no credentials or server are needed up to there)."""
    import json

    from components.params.param_values import params_from_mapping
    from pipelines.deploy.config import load_for
    from pipelines.deploy.submit import dry_run as check_run
    from pipelines.deploy.submit import submit_kfp, submit_vertex

    cfg = load_for(backend, config, parameters=params, **remote)
    when = parse_schedule_time(schedule_time)
    checked = check_run(cfg, backend, schedule_time=when)
    run_params = params_from_mapping(checked, base=RunParams.for_target(backend))
    _check_fit_and_cost(run_params, prices, remote=False)
    _check_quota(run_params, dry_run=dry_run)
    if dry_run:
        typer.echo(
            f"dry run: a {backend} run of {cfg.template} passes validation; nothing was sent. "
            f"{DRY_RUN_PARAMETERS}"
        )
        typer.echo(json.dumps(checked, indent=2, sort_keys=True))
        return
    submit = submit_vertex if backend == "vertex" else submit_kfp
    submit(cfg, schedule_time=when, wait=wait, report=typer.echo)
