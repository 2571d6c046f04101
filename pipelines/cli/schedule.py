"""`llmft schedule`: create, list, pause, resume, delete or --update recurring fine-tunes
(Vertex AI PipelineJobSchedules or KFP recurring runs). Phases: pick the one action, load the
deploy config (file + flags), then do the action in pipelines/deploy/schedule.py."""

from __future__ import annotations

import typing
from typing import Annotated, Any

import typer

from pipelines.cli import options as opt
from pipelines.cli.common import check_choice, parse_params, user_errors

# lazy imports: each command imports the modules of its work in its body, so that `llmft --help`
# (0.4 s) does not pay for them: the schedule modules (one per backend) take +0.06 s to import
# after pipelines.cli (min of 3, shared 2-core machine).

BackendOpt = Annotated[
    str, typer.Option(help="vertex (PipelineJobSchedule) or kfp (recurring run).")
]
CronOpt = Annotated[
    str | None,
    typer.Option(help="5 fields, optional CRON_TZ=<zone> prefix, e.g. 'CRON_TZ=UTC 0 3 * * 1'."),
]
DisplayNameOpt = Annotated[
    str | None, typer.Option(help="Schedule name (--update and --list match on it).")
]
MaxConcurrentOpt = Annotated[int | None, typer.Option(help="Runs at once.", show_default="1")]
StartOpt = Annotated[str | None, typer.Option(help="RFC 3339 time of the first run.")]
EndOpt = Annotated[str | None, typer.Option(help="RFC 3339 time after which none start.")]
MaxRunCountOpt = Annotated[int | None, typer.Option(help="Vertex: stop after N runs.")]
QueueingOpt = Annotated[
    bool | None, typer.Option(help="Vertex: queue runs over the concurrency limit.")
]
CatchupOpt = Annotated[bool | None, typer.Option(help="KFP: start missed runs after a pause.")]
ListOpt = Annotated[bool, typer.Option("--list", help="List schedules (of --display-name).")]
PauseOpt = Annotated[str | None, typer.Option(help="Pause this schedule id.")]
ResumeOpt = Annotated[str | None, typer.Option(help="Resume this schedule id.")]
DeleteOpt = Annotated[str | None, typer.Option(help="Delete this schedule id.")]
UpdateOpt = Annotated[
    bool,
    typer.Option("--update", help="Point the schedules named --display-name at --template."),
]
ExperimentOpt = Annotated[str | None, typer.Option(help="KFP: experiment of the recurring run.")]


@user_errors
@opt.with_deploy_flags
def schedule_cmd(
    backend: BackendOpt,
    config: opt.ConfigOpt = None,
    param: opt.ParamOpt = None,
    cron: CronOpt = None,
    display_name: DisplayNameOpt = None,
    max_concurrent_runs: MaxConcurrentOpt = None,
    start_time: StartOpt = None,
    end_time: EndOpt = None,
    max_run_count: MaxRunCountOpt = None,
    allow_queueing: QueueingOpt = None,
    catchup: CatchupOpt = None,
    list_: ListOpt = False,
    pause: PauseOpt = None,
    resume: ResumeOpt = None,
    delete: DeleteOpt = None,
    update: UpdateOpt = False,
    experiment: ExperimentOpt = None,
    *,
    deploy: dict[str, Any],
) -> None:
    """Create (default), list, pause, resume, delete or --update recurring fine-tunes."""
    from pipelines.deploy.config import Backend, load_for

    target = check_choice(backend, typing.get_args(Backend))
    action = _one_action(list_=list_, pause=pause, resume=resume, delete=delete, update=update)
    cfg = load_for(
        target, config, **deploy, parameters=parse_params(param), cron=cron,
        display_name=display_name, max_concurrent_runs=max_concurrent_runs,
        start_time=start_time, end_time=end_time, max_run_count=max_run_count,
        allow_queueing=allow_queueing, catchup=catchup, experiment=experiment,
    )  # fmt: skip
    if display_name:
        # One flag names both the run and the schedule; schedules match on the latter.
        cfg.schedule.display_name = display_name
    _do(action, cfg, target, pause or resume or delete or "", display_name)


def _one_action(**flags: Any) -> str:
    """The action the flags ask for ("create" when none); more than one is a user error."""
    actions = [name for name, on in flags.items() if on]
    if len(actions) > 1:
        names = ("--list" if name == "list_" else f"--{name}" for name in actions)
        raise ValueError(f"choose one of {', '.join(names)}")
    return actions[0] if actions else "create"


def _do(action: str, cfg: Any, target: Any, schedule_id: str, display_name: str | None) -> None:
    """Carry out one schedule action against the chosen backend."""
    from pipelines.deploy import schedule as sched

    if action == "list_":
        _print_schedules(sched.list_schedules(cfg, target, display_name=display_name))
    elif action in ("pause", "resume", "delete"):
        sched.manage_schedule(
            cfg, target, typing.cast(sched.Action, action), schedule_id, report=typer.echo
        )
    elif target == "vertex":
        from pipelines.deploy import schedule_vertex as vertex

        run = (
            vertex.update_vertex_schedules if action == "update" else vertex.create_vertex_schedule
        )
        run(cfg, report=typer.echo)
    else:
        from pipelines.deploy import schedule_kfp as kfp

        run_kfp = kfp.update_kfp_schedules if action == "update" else kfp.create_kfp_schedule
        run_kfp(cfg, report=typer.echo)


def _print_schedules(rows: list[Any]) -> None:
    """One tab-separated line per schedule on stdout; "no schedules" on stderr."""
    for row in rows:
        typer.echo(f"{row.name}\t{row.display_name}\t{row.state}\t{row.cron}\tnext: {row.next_run}")
    if not rows:
        typer.echo("no schedules", err=True)
