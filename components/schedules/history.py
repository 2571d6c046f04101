"""`llmft history`: one row per run of a schedule, from its records under `work_uri`
(components/schedules/state.py), as a table or an HTML page with the curves over time.

The records are what the runs' own validate and evaluate steps wrote, whatever ran them (local,
Vertex AI, KFP): when the run started, records new (the window check) and read (the manifest),
packed tokens, training steps, eval loss before and after, retention, the replay share used,
GPU-hours and cost (the train step's cost.json), the verdict, and whether the run's model
became champion. That last one comes from Vertex AI Model Registry when the caller read it
(`registered`: the versions by their `llmft-run-id` label, pipelines/cli/history.py): the
register step gives each version it uploads the `champion` alias, so a registered run's model
became champion, and the version holding the alias now is marked. Without the registry (a
local schedule, or it could not be read) a run that passed the gate shows "yes": it would have
been registered. The page draws the curves as inline SVG: no script, no network.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.runtime.run_identity import safe_run_id
from components.schedules import state
from trainer import storage

COLUMNS = (
    ("when", "started"),
    ("run", "run_id"),
    ("new", "records_new"),
    ("read", "records_read"),
    ("tokens", "tokens"),
    ("steps", "steps"),
    ("loss before", "eval_loss_before"),
    ("loss after", "eval_loss_after"),
    ("retention", "retention"),
    ("replay", "replay_fraction"),
    ("GPU-h", "gpu_hours"),
    ("cost $", "cost_usd"),
    ("verdict", "verdict"),
    ("champion", "champion"),
)


def schedules(work_uri: str) -> list[str]:
    """The schedule roots under `work_uri`."""
    return [p for p in storage.listdir(f"{work_uri.rstrip('/')}/schedules") if storage.isdir(p)]


def verdict(record: dict[str, Any]) -> str:
    status = record.get("status")
    if status == state.SKIPPED:
        return "skipped: nothing new"
    if status == state.FINISHED:
        if record.get("passed"):
            return "passed"
        return "refused (forgetting)" if record.get("refused_for_forgetting") else "refused"
    return "failed or running"


@dataclass(frozen=True)
class Registered:
    """A run's model version in Vertex AI Model Registry."""

    version_id: str
    champion_now: bool
    """It holds the `champion` alias now."""


def champion(record: dict[str, Any], registered: Mapping[str, Registered] | None) -> str:
    """Whether the run's model became champion. `registered`: the registry's versions by run
    label (`safe_run_id`); None: the registry was not read."""
    if registered is None:
        return "yes" if record.get("passed") else ""
    version = registered.get(safe_run_id(record["run_id"])) if record.get("run_id") else None
    if version is None:
        return "not registered" if record.get("passed") else ""
    return f"v{version.version_id} ({'champion now' if version.champion_now else 'was champion'})"


def rows(
    records: Sequence[dict[str, Any]], registered: Mapping[str, Registered] | None = None
) -> list[dict[str, Any]]:
    out = []
    for record in records:
        row = dict(record)
        row["verdict"] = verdict(record)
        row["champion"] = champion(record, registered)
        out.append(row)
    return out


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(
    records: Sequence[dict[str, Any]], registered: Mapping[str, Registered] | None = None
) -> str:
    """Plain-text table, one row per run, oldest first."""
    body = [[_cell(row.get(key)) for _, key in COLUMNS] for row in rows(records, registered)]
    heads = [name for name, _ in COLUMNS]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(heads)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(line.rstrip() for line in lines)


CURVES = (
    ("eval loss (after)", "eval_loss_after"),
    ("retention", "retention"),
    ("cost per run ($)", "cost_usd"),
    ("replay share", "replay_fraction"),
)


def _svg(title: str, points: list[tuple[int, float]], runs: int, key: str) -> str:
    width, height, pad = 420, 160, 30
    if not points:
        return f'<figure data-curve="{key}"><figcaption>{title}: no data yet</figcaption></figure>'
    low = min(v for _, v in points)
    high = max(v for _, v in points)
    span = (high - low) or 1.0

    def xy(i: int, v: float) -> tuple[float, float]:
        x = pad + (width - 2 * pad) * (i / max(runs - 1, 1))
        y = height - pad - (height - 2 * pad) * ((v - low) / span)
        return round(x, 1), round(y, 1)

    coords = [xy(i, v) for i, v in points]
    path = " ".join(f"{x},{y}" for x, y in coords)
    dots = "".join(f'<circle cx="{x}" cy="{y}" r="4"/>' for x, y in coords)
    return (
        f'<figure data-curve="{key}"><figcaption>{html.escape(title)} '
        f"({_cell(low)} to {_cell(high)})</figcaption>"
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ccc"/>'
        f'<polyline points="{path}" fill="none" stroke="#1f6feb" stroke-width="3"/>'
        f'<g fill="#1f6feb">{dots}</g></svg></figure>'
    )


def page(
    title: str,
    records: Sequence[dict[str, Any]],
    registered: Mapping[str, Registered] | None = None,
) -> str:
    """An HTML page: the curves over the runs, then the table."""
    data = rows(records, registered)
    charts = []
    for name, key in CURVES:
        points = [
            (i, float(r[key])) for i, r in enumerate(data) if isinstance(r.get(key), int | float)
        ]
        charts.append(_svg(name, points, len(data), key))
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(r.get(k)))}</td>" for _, k in COLUMNS) + "</tr>"
        for r in data
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:24px} figure{display:inline-block;margin:8px}"
        "table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:4px 8px}"
        "</style></head><body>"
        f"<h1>{html.escape(title)}</h1><div id='curves'>{''.join(charts)}</div>"
        f"<table id='runs'><tr>{head}</tr>{body}</table></body></html>"
    )
