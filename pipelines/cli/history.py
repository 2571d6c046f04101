"""`llmft history`: a schedule's runs, one row each, from the records under work_uri
(components/schedules/history.py) and, for a schedule that registers its models, Vertex AI
Model Registry (which run's version became champion, which holds the alias now)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli.common import user_errors

# lazy imports: each command imports the modules of its work in its body, so that `llmft --help`
# (0.4 s) does not pay for them: the schedule history modules take +10 ms to import (python -X
# importtime, quiet 2-core machine).


@user_errors
def history_cmd(
    work_uri: Annotated[str, typer.Argument(help="The runs' work_uri (local directory or gs://).")],
    schedule: Annotated[
        str,
        typer.Option(help="One schedule's key (a folder under WORK_URI/schedules/); default: all."),
    ] = "",
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a page with the curves over time.")
    ] = None,
    registry: Annotated[
        bool,
        typer.Option(
            help="Read Vertex AI Model Registry for the champion column (where the runs "
            "registered their models, from their records)."
        ),
    ] = True,
) -> None:
    """One row per run of each schedule: when, records new/read, tokens, steps, eval loss
    before/after, retention, replay share, GPU-hours, cost, verdict, champion."""
    from components.schedules import history, state

    roots = history.schedules(work_uri)
    if schedule:
        roots = [r for r in roots if r.rstrip("/").rsplit("/", 1)[-1] == schedule]
        if not roots:
            raise ValueError(f"no schedule {schedule!r} under {work_uri}/schedules/")
    if not roots:
        raise ValueError(
            f"no schedule records under {work_uri}/schedules/ (runs write them when work_uri is set)"
        )
    pages = []
    for root in roots:
        records = state.runs(root)
        key = root.rstrip("/").rsplit("/", 1)[-1]
        registered = registered_versions(records) if registry else None
        typer.echo(f"schedule {key}: {len(records)} runs")
        typer.echo(history.table(records, registered))
        typer.echo("")
        pages.append((key, records, registered))
    if html is not None:
        if len(pages) == 1:
            key, records, registered = pages[0]
        else:  # several schedules on one page: the registry's answers apply per schedule
            key, records, registered = "all", [r for _, rs, _ in pages for r in rs], None
        html.write_text(history.page(f"llmft schedule {key}", records, registered))
        typer.echo(f"wrote {html}")


def registered_versions(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The schedule's model versions in the registry by run label (history.Registered), from
    where its newest registering run put them; None when no run registers, or (with a warning
    line) when the registry cannot be read: the table then says what the gate decided."""
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions

    from components.schedules.history import Registered
    from components.serving.lineage import CHAMPION_ALIAS
    from components.serving.registry import versions_by_run

    where = next((r["registry"] for r in reversed(records) if r.get("registry")), None)
    if not where:
        return None
    try:
        versions = versions_by_run(
            registered_model=where["model"], project=where["project"], region=where["region"]
        )
    except (exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError) as exc:
        typer.echo(f"warning: could not read Vertex AI Model Registry ({where['model']}): {exc}")
        return None
    return {
        run: Registered(v.version_id, CHAMPION_ALIAS in v.aliases) for run, v in versions.items()
    }
