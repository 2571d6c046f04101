"""Recurring fine-tunes: create, list, pause, resume, delete and repoint schedules.

Vertex AI: a `PipelineJobSchedule` (five-field cron with optional `CRON_TZ=`, max concurrent runs,
start/end time, max run count). A schedule stores its own copy of the pipeline spec, so
publishing a new template version does not reach it: `update_schedules` rewrites the copy
(`UpdateSchedule` on `create_pipeline_job_request`), keeping each schedule's parameter values.

KFP: a recurring run in an experiment. Its cron has six fields, seconds first, and is translated
(and the translation reported). Recurring runs cannot be edited, so `update_schedules` creates
the replacement first and deletes the old one after, keeping trigger, concurrency and parameters.

Recurring runs should do new work each time; see pipelines/deploy/template.py for the
schedule-time placeholder in the input URI and the `latest-registered` starting model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pipelines.deploy.clients import (
    cloud_errors,
    google_credentials,
    kfp_client,
    kfp_host,
    kfp_ui_url,
    schedule_service,
    vertex_schedule_url,
)
from pipelines.deploy.config import DeployConfig, validate
from pipelines.deploy.cron import parse_cron
from pipelines.deploy.submit import prepare_parameters, remote_template, vertex_job
from pipelines.deploy.template import read_template

if TYPE_CHECKING:
    import kfp.client
    from google.auth.credentials import Credentials

Report = Callable[[str], None]
Action = Literal["pause", "resume", "delete"]


@dataclass(frozen=True)
class Scheduled:
    """A schedule the backend accepted (created or repointed)."""

    backend: str
    name: str
    """Vertex: schedule resource name; KFP: recurring run id."""
    url: str
    cron: str
    """The expression as sent to the backend."""


@dataclass(frozen=True)
class ScheduleSummary:
    """One line of `llmft schedule --list`."""

    name: str
    display_name: str
    state: str
    cron: str
    next_run: str


# ----------------------------------------------------------------------------- Vertex AI


def _vertex_parent(config: DeployConfig) -> str:
    return f"projects/{config.vertex.project}/locations/{config.vertex.region}"


def _vertex_name(config: DeployConfig, ident: str) -> str:
    return ident if ident.startswith("projects/") else f"{_vertex_parent(config)}/schedules/{ident}"


def create_vertex_schedule(
    config: DeployConfig, *, credentials: Credentials | None = None, report: Report = print
) -> Scheduled:
    """Create a PipelineJobSchedule from the config's template, parameters and schedule."""
    from google.cloud import aiplatform

    validate(config, "vertex", "schedule")
    # Parameters first: a mistake is reported before credentials or the server are needed.
    params = prepare_parameters(config, "vertex", schedule_time=None, recurring=True)
    credentials = google_credentials(credentials)
    remote = remote_template(config, credentials)
    if remote is not None:
        params = prepare_parameters(
            config, "vertex", schedule_time=None, recurring=True, info=remote
        )
    v, s = config.vertex, config.schedule
    assert s.cron and v.project
    cron = parse_cron(s.cron).to_vertex()
    if v.experiment:
        report(
            "warning: vertex.experiment is ignored for schedules (Vertex files scheduled runs itself)"
        )
    with cloud_errors("creating the Vertex AI schedule"):
        job = vertex_job(config, params, credentials)
        schedule = aiplatform.PipelineJobSchedule(
            pipeline_job=job,
            display_name=s.display_name,
            credentials=credentials,
            project=v.project,
            location=v.region,
        )
        schedule.create(
            cron=cron,
            start_time=s.start_time,
            end_time=s.end_time,
            allow_queueing=s.allow_queueing,
            max_run_count=s.max_run_count,
            max_concurrent_run_count=s.max_concurrent_runs,
            service_account=v.service_account,
            network=v.network,
        )
    name = schedule.resource_name
    url = vertex_schedule_url(v.project, v.region, name.rsplit("/", 1)[-1])
    report(f"created schedule {name} ({cron})\n{url}")
    return Scheduled("vertex", name, url, cron)


def _vertex_list(config: DeployConfig, svc: Any, display_name: str | None) -> list[Any]:
    from google.cloud.aiplatform_v1.types import ListSchedulesRequest

    flt = f'display_name="{display_name}"' if display_name else ""
    request = ListSchedulesRequest(parent=_vertex_parent(config), filter=flt)
    return [s for s in svc.list_schedules(request=request) if "create_pipeline_job_request" in s]


def _vertex_summary(schedule: Any) -> ScheduleSummary:
    next_run = schedule.next_run_time
    return ScheduleSummary(
        name=schedule.name,
        display_name=schedule.display_name,
        state=schedule.state.name,
        cron=schedule.cron,
        next_run=next_run.isoformat() if next_run else "-",
    )


def update_vertex_schedules(
    config: DeployConfig, *, credentials: Credentials | None = None, report: Report = print
) -> list[Scheduled]:
    """Point every schedule named `schedule.display_name` at the config's template.

    Each schedule keeps its parameter values (config parameters override them; values the new
    template no longer declares are dropped, with a warning), pipeline root, service account,
    network and labels.
    """
    from google.cloud.aiplatform_v1.types import CreatePipelineJobRequest, Schedule
    from google.protobuf import field_mask_pb2, json_format

    validate(config, "vertex", "manage")
    if not config.template:
        raise ValueError("--update needs the new template (--template URI or path)")
    credentials = google_credentials(credentials)
    info = remote_template(config, credentials) or read_template(config.template)
    known = set(info.parameters)
    svc = schedule_service(config.vertex.project or "", config.vertex.region, credentials)
    display_name = config.schedule.display_name
    updated = []
    with cloud_errors("updating Vertex AI schedules"):
        matches = _vertex_list(config, svc, display_name)
        if not matches:
            raise ValueError(
                f"no pipeline schedule named {display_name!r} in {_vertex_parent(config)}: check "
                "--display-name, or create one with `llmft schedule`"
            )
        for old in matches:
            old_job = old.create_pipeline_job_request.pipeline_job
            runtime = json_format.MessageToDict(type(old_job).pb(old_job).runtime_config)
            params = {**runtime.get("parameterValues", {}), **config.parameters}
            dropped = sorted(set(params) - known)
            if dropped:
                report(
                    f"warning: {old.name}: dropping parameters the new template lacks: {dropped}"
                )
            params = {k: v for k, v in params.items() if k in known}
            root = config.vertex.pipeline_root or runtime.get("gcsOutputDirectory")
            retargeted = dataclasses.replace(
                config,
                parameters=params,
                vertex=dataclasses.replace(config.vertex, pipeline_root=root),
            )
            params = prepare_parameters(
                retargeted, "vertex", schedule_time=None, recurring=True, info=info
            )
            new = vertex_job(retargeted, params, credentials)._gca_resource
            job = type(old_job)(old_job)
            job.pipeline_spec = new.pipeline_spec
            job.runtime_config = new.runtime_config
            job.template_uri = new.template_uri
            request = CreatePipelineJobRequest(
                parent=old.create_pipeline_job_request.parent, pipeline_job=job
            )
            svc.update_schedule(
                schedule=Schedule(name=old.name, create_pipeline_job_request=request),
                update_mask=field_mask_pb2.FieldMask(paths=["create_pipeline_job_request"]),
            )
            schedule_id = old.name.rsplit("/", 1)[-1]
            url = vertex_schedule_url(
                config.vertex.project or "", config.vertex.region, schedule_id
            )
            report(f"updated {old.name} -> {config.template}")
            updated.append(Scheduled("vertex", old.name, url, old.cron))
    return updated


# ----------------------------------------------------------------------------- KFP


def _kfp_filter(display_name: str) -> str:
    return json.dumps(
        {
            "predicates": [
                {"operation": "EQUALS", "key": "display_name", "stringValue": display_name}
            ]
        }
    )


def _kfp_list(client: Any, config: DeployConfig, display_name: str | None) -> list[Any]:
    found: list[Any] = []
    token = ""
    while True:
        page = client.list_recurring_runs(
            page_token=token,
            page_size=100,
            namespace=config.kfp.namespace,
            filter=_kfp_filter(display_name) if display_name else None,
        )
        found.extend(page.recurring_runs or [])
        token = page.next_page_token or ""
        if not token:
            return found


def create_kfp_schedule(
    config: DeployConfig,
    *,
    client: kfp.client.Client | None = None,
    report: Report = print,
    replace: Any = None,
) -> Scheduled:
    """Create a KFP recurring run (cron translated to six fields, which is reported).

    Args:
        replace: an existing recurring run whose trigger, concurrency, catch-up, service account,
            enabled state and parameters to copy (used by `update_kfp_schedules`).
    """
    validate(config, "kfp", "schedule" if replace is None else "manage")
    k, s = config.kfp, config.schedule
    if replace is not None and replace.runtime_config and replace.runtime_config.parameters:
        # The replaced run's values stay unless the config sets them again.
        merged = {**replace.runtime_config.parameters, **config.parameters}
        config = dataclasses.replace(config, parameters=merged)
    params = prepare_parameters(config, "kfp", schedule_time=None, recurring=True)
    client = client or kfp_client(k)
    kwargs: dict[str, Any]
    if replace is None:
        assert s.cron
        cron = parse_cron(s.cron).to_kfp()
        report(
            f"KFP cron {cron!r}: translated from {s.cron!r} (KFP takes six fields, seconds first)"
        )
        for name, ignored in (
            ("max_run_count", s.max_run_count),
            ("allow_queueing", s.allow_queueing),
        ):
            if ignored:
                report(
                    f"warning: schedule.{name} is ignored on KFP (no such setting; use end_time)"
                )
        kwargs = dict(
            cron_expression=cron,
            start_time=s.start_time,
            end_time=s.end_time,
            max_concurrency=s.max_concurrent_runs,
            no_catchup=not s.catchup,
            enabled=True,
            service_account=k.service_account,
            pipeline_root=k.pipeline_root,
        )
        display_name = s.display_name
    else:
        trigger = replace.trigger.cron_schedule or replace.trigger.periodic_schedule
        cron = getattr(trigger, "cron", None) or f"every {trigger.interval_second}s"
        runtime = replace.runtime_config
        kwargs = dict(
            cron_expression=getattr(trigger, "cron", None),
            interval_second=getattr(trigger, "interval_second", None),
            start_time=trigger.start_time,
            end_time=trigger.end_time,
            max_concurrency=replace.max_concurrency,
            no_catchup=replace.no_catchup,
            enabled=replace.mode != "DISABLE",
            service_account=k.service_account or replace.service_account,
            pipeline_root=k.pipeline_root or (runtime.pipeline_root if runtime else None),
        )
        display_name = replace.display_name
    with cloud_errors("creating the KFP recurring run"):
        experiment = client.create_experiment(k.experiment, namespace=k.namespace)
        created = client.create_recurring_run(
            experiment_id=experiment.experiment_id,
            job_name=display_name,
            params=params,
            pipeline_package_path=None if k.version_id else config.template,
            pipeline_id=k.pipeline_id,
            version_id=k.version_id,
            enable_caching=k.enable_caching,
            **kwargs,
        )
    url = kfp_ui_url(kfp_host(k), "recurringrun", created.recurring_run_id)
    report(f"created recurring run {created.recurring_run_id} ({display_name})\n{url}")
    return Scheduled("kfp", created.recurring_run_id, url, str(cron))


def update_kfp_schedules(
    config: DeployConfig, *, client: kfp.client.Client | None = None, report: Report = print
) -> list[Scheduled]:
    """Replace every recurring run named `schedule.display_name` with one on the new template."""
    validate(config, "kfp", "manage")
    if not config.template and not config.kfp.version_id:
        raise ValueError(
            "--update needs the new template (--template PATH or --pipeline-id/--version-id)"
        )
    client = client or kfp_client(config.kfp)
    display_name = config.schedule.display_name
    with cloud_errors("listing KFP recurring runs"):
        matches = _kfp_list(client, config, display_name)
    if not matches:
        raise ValueError(
            f"no KFP recurring run named {display_name!r}: check --display-name, or create one "
            "with `llmft schedule`"
        )
    updated = []
    for old in matches:
        new = create_kfp_schedule(config, client=client, report=report, replace=old)
        with cloud_errors(f"deleting the replaced recurring run {old.recurring_run_id}"):
            client.delete_recurring_run(old.recurring_run_id)
        report(f"replaced {old.recurring_run_id} with {new.name}")
        updated.append(new)
    return updated


# ----------------------------------------------------------------------------- both


def list_schedules(
    config: DeployConfig,
    backend: str,
    *,
    display_name: str | None = None,
    credentials: Credentials | None = None,
    client: kfp.client.Client | None = None,
) -> list[ScheduleSummary]:
    """Schedules of pipelines (optionally only those named `display_name`)."""
    if backend == "vertex":
        validate(config, "vertex", "manage")
        svc = schedule_service(
            config.vertex.project or "", config.vertex.region, google_credentials(credentials)
        )
        with cloud_errors("listing Vertex AI schedules"):
            return [_vertex_summary(s) for s in _vertex_list(config, svc, display_name)]
    validate(config, "kfp", "manage")
    client = client or kfp_client(config.kfp)
    with cloud_errors("listing KFP recurring runs"):
        runs = _kfp_list(client, config, display_name)
    return [
        ScheduleSummary(
            name=r.recurring_run_id,
            display_name=r.display_name,
            state=str(r.status or r.mode),
            cron=(r.trigger.cron_schedule.cron if r.trigger and r.trigger.cron_schedule else "-"),
            next_run="-",
        )
        for r in runs
    ]


def manage_schedule(
    config: DeployConfig,
    backend: str,
    action: Action,
    ident: str,
    *,
    credentials: Credentials | None = None,
    client: kfp.client.Client | None = None,
    report: Report = print,
) -> None:
    """Pause, resume or delete one schedule (Vertex id or resource name; KFP recurring run id)."""
    if backend == "vertex":
        validate(config, "vertex", "manage")
        svc = schedule_service(
            config.vertex.project or "", config.vertex.region, google_credentials(credentials)
        )
        name = _vertex_name(config, ident)
        with cloud_errors(f"{action} {name}"):
            if action == "pause":
                svc.pause_schedule(name=name)
            elif action == "resume":
                svc.resume_schedule(name=name)
            else:
                svc.delete_schedule(name=name)
        report(f"{action}d {name}" if action != "delete" else f"deleting {name}")
        return
    validate(config, "kfp", "manage")
    client = client or kfp_client(config.kfp)
    with cloud_errors(f"{action} recurring run {ident}"):
        if action == "pause":
            client.disable_recurring_run(ident)
        elif action == "resume":
            client.enable_recurring_run(ident)
        else:
            client.delete_recurring_run(ident)
    report(f"{action}d recurring run {ident}")
