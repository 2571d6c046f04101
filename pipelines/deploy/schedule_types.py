"""What schedule commands return, shared by `schedule` and the per-backend modules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

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
