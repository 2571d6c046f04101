"""`llmft history`: a schedule's runs, one row each, from the records under work_uri
(components/schedules/history.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
        typer.echo(f"schedule {key}: {len(records)} runs")
        typer.echo(history.table(records))
        typer.echo("")
        pages.append((key, records))
    if html is not None:
        key, records = pages[0] if len(pages) == 1 else ("all", [r for _, rs in pages for r in rs])
        html.write_text(history.page(f"llmft schedule {key}", records))
        typer.echo(f"wrote {html}")
