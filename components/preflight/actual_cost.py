"""The training job's actual cost, from its own start and end times: the record (`cost.json`) the
train step writes into the trainer's run directory and the evaluate step keeps in metrics.json
and the report. The estimate before launch is components/preflight/cost.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

COST_FILE = "cost.json"
"""The training job's actual cost (`actual_cost`), written by the train step into the trainer's
run directory; the evaluate step keeps it in metrics.json and the report."""


def actual_cost(
    *,
    started: str,
    ended: str,
    gpus: int,
    gpu_hour_usd: float,
    capacity: str,
    queued_s: float = 0.0,
) -> dict[str, Any]:
    """The training job's cost from its own start and end times (ISO 8601 with a zone), less
    `queued_s`: time the job waited suspended in a Kueue queue (no pod, no GPU held) is recorded
    as `queue_wait_s` and not billed."""
    start, end = dt.datetime.fromisoformat(started), dt.datetime.fromisoformat(ended)
    hours = max(0.0, ((end - start).total_seconds() - queued_s) / 3600)
    return {
        "started": started,
        "ended": ended,
        "queue_wait_s": round(queued_s, 1),
        "hours": round(hours, 4),
        "gpus": gpus,
        "gpu_hours": round(hours * gpus, 4),
        "gpu_hour_usd": gpu_hour_usd,
        "capacity": capacity,
        "cost_usd": round(hours * gpus * gpu_hour_usd, 2),
    }
