"""Recurring fine-tunes on KFP: recurring runs in an experiment.

KFP's cron has six fields, seconds first: the five-field expression is translated (and the
translation reported). Recurring runs cannot be edited, so `update_kfp_schedules` creates the
replacement first and deletes the old one after, keeping trigger, concurrency and parameters.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from pipelines.deploy.checks import validate
from pipelines.deploy.clients import (
    cloud_errors,
    kfp_client,
    kfp_host,
    kfp_ui_url,
)
from pipelines.deploy.config import DeployConfig
from pipelines.deploy.cron import parse_cron
from pipelines.deploy.schedule_types import Action, Report, Scheduled, ScheduleSummary
from pipelines.deploy.submit import prepare_parameters

if TYPE_CHECKING:
    import kfp.client


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
    if replace is None:
        cron, kwargs = _new_trigger(config, report)
        display_name = s.display_name
    else:
        cron, kwargs = _copied_trigger(config, replace)
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


def _new_trigger(config: DeployConfig, report: Report) -> tuple[str, dict[str, Any]]:
    """The KFP cron (reported) and recurring-run settings from the config's schedule section."""
    k, s = config.kfp, config.schedule
    assert s.cron
    cron = parse_cron(s.cron).to_kfp()
    report(f"KFP cron {cron!r}: translated from {s.cron!r} (KFP takes six fields, seconds first)")
    for name, ignored in (
        ("max_run_count", s.max_run_count),
        ("allow_queueing", s.allow_queueing),
    ):
        if ignored:
            report(f"warning: schedule.{name} is ignored on KFP (no such setting; use end_time)")
    return cron, dict(
        cron_expression=cron,
        start_time=s.start_time,
        end_time=s.end_time,
        max_concurrency=s.max_concurrent_runs,
        no_catchup=not s.catchup,
        enabled=True,
        service_account=k.service_account,
        pipeline_root=k.pipeline_root,
    )


def _copied_trigger(config: DeployConfig, replace: Any) -> tuple[str, dict[str, Any]]:
    """The trigger, concurrency, catch-up and enabled state of the recurring run replaced."""
    k = config.kfp
    trigger = replace.trigger.cron_schedule or replace.trigger.periodic_schedule
    cron = getattr(trigger, "cron", None) or f"every {trigger.interval_second}s"
    runtime = replace.runtime_config
    return cron, dict(
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


def list_kfp_schedules(
    config: DeployConfig, display_name: str | None, client: kfp.client.Client | None = None
) -> list[ScheduleSummary]:
    """The recurring runs (optionally only those named `display_name`)."""
    validate(config, "kfp", "manage")
    client = client or kfp_client(config.kfp, check_version=False)
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


def manage_kfp_schedule(
    config: DeployConfig,
    action: Action,
    ident: str,
    client: kfp.client.Client | None = None,
    report: Report = print,
) -> None:
    """Pause (disable), resume (enable) or delete one recurring run."""
    validate(config, "kfp", "manage")
    client = client or kfp_client(config.kfp, check_version=False)
    with cloud_errors(f"{action} recurring run {ident}"):
        if action == "pause":
            client.disable_recurring_run(ident)
        elif action == "resume":
            client.enable_recurring_run(ident)
        else:
            client.delete_recurring_run(ident)
    report(f"{action}d recurring run {ident}")
