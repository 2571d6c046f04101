"""Recurring fine-tunes: create, list, pause, resume, delete and repoint schedules.

Creating and repointing differ per backend and live in their own modules:
`schedule_vertex` (Vertex AI `PipelineJobSchedule`s) and `schedule_kfp` (KFP recurring runs).
What both return is in
`schedule_types`; this module holds the commands that look the same on both (list, pause,
resume, delete). Recurring runs should do new work each time; see pipelines/deploy/template.py
for the schedule-time placeholder in the input URI and the `latest-registered` starting model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines.deploy.schedule_kfp import list_kfp_schedules, manage_kfp_schedule
from pipelines.deploy.schedule_types import Action, Report, ScheduleSummary
from pipelines.deploy.schedule_vertex import list_vertex_schedules, manage_vertex_schedule

if TYPE_CHECKING:
    import kfp.client
    from google.auth.credentials import Credentials

    from pipelines.deploy.config import DeployConfig


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
        return list_vertex_schedules(config, display_name, credentials)

    return list_kfp_schedules(config, display_name, client)


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
        manage_vertex_schedule(config, action, ident, credentials, report)
        return

    manage_kfp_schedule(config, action, ident, client, report)
