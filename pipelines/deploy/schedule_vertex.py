"""Recurring fine-tunes on Vertex AI: `PipelineJobSchedule`s (five-field cron with optional
`CRON_TZ=`, max concurrent runs, start/end time, max run count).

A schedule stores its own copy of the pipeline spec, so publishing a new template version does
not reach it: `update_vertex_schedules` rewrites the copy (`UpdateSchedule` on
`create_pipeline_job_request`), keeping each schedule's parameter values.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pipelines.deploy.checks import validate
from pipelines.deploy.clients import (
    cloud_errors,
    google_credentials,
    schedule_service,
    vertex_schedule_url,
)
from pipelines.deploy.config import DeployConfig
from pipelines.deploy.cron import parse_cron
from pipelines.deploy.schedule_types import Action, Report, Scheduled, ScheduleSummary
from pipelines.deploy.submit import (
    prepare_parameters,
    remote_template,
    vertex_job,
    vertex_parameters,
)
from pipelines.deploy.template import read_template

if TYPE_CHECKING:
    from google.auth.credentials import Credentials


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
    params, credentials = vertex_parameters(
        config, schedule_time=None, recurring=True, credentials=credentials
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
    svc = schedule_service(config.vertex.region, credentials)
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


def list_vertex_schedules(
    config: DeployConfig, display_name: str | None, credentials: Credentials | None = None
) -> list[ScheduleSummary]:
    """The project's pipeline schedules (optionally only those named `display_name`)."""
    validate(config, "vertex", "manage")
    svc = schedule_service(config.vertex.region, google_credentials(credentials))
    with cloud_errors("listing Vertex AI schedules"):
        return [_vertex_summary(s) for s in _vertex_list(config, svc, display_name)]


def manage_vertex_schedule(
    config: DeployConfig,
    action: Action,
    ident: str,
    credentials: Credentials | None = None,
    report: Report = print,
) -> None:
    """Pause, resume or delete one schedule (id or resource name)."""
    validate(config, "vertex", "manage")
    svc = schedule_service(config.vertex.region, google_credentials(credentials))
    name = _vertex_name(config, ident)
    with cloud_errors(f"{action} {name}"):
        if action == "pause":
            svc.pause_schedule(name=name)
        elif action == "resume":
            svc.resume_schedule(name=name)
        else:
            svc.delete_schedule(name=name)
    report(f"{action}d {name}" if action != "delete" else f"deleting {name}")
