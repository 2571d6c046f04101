"""Replay sources (`replay_source`): what each name reads.

- `general`: the packaged general-instruction set (components/schedules/general_set.py), read
  from the installed package (the project image on Dataflow workers has the same path);
- `previous` or `previous:N`: the windows the schedule's last N successful runs trained on
  (their resolved `train_data_uri`, from the schedule's records); none yet (a first run) is a
  warning, not an error;
- anything else: a source as `train_data_uri` takes it (file, glob, gs://, hf://, bq://).
"""

from __future__ import annotations

import re
from typing import Any

from components.schedules.general_set import PATH as GENERAL_PATH
from components.schedules.state import FINISHED

GENERAL = "general"
PREVIOUS = re.compile(r"^previous(:(?P<n>\d+))?$")


def names(replay_source: str) -> list[str]:
    return [n.strip() for n in replay_source.split(",") if n.strip()]


def syntax_errors(replay_source: str) -> list[str]:
    errors = []
    for name in names(replay_source):
        match = PREVIOUS.match(name)
        if name.startswith("previous") and not (match and int(match["n"] or 1) >= 1):
            errors.append(f"replay_source {name!r}: write previous or previous:N (N >= 1)")
    return errors


def resolve(replay_source: str, records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the URIs to replay, warnings)."""
    uris: list[str] = []
    warnings: list[str] = []
    for name in names(replay_source):
        if name == GENERAL:
            uris.append(str(GENERAL_PATH))
            continue
        match = PREVIOUS.match(name)
        if match:
            n = int(match["n"] or 1)
            done = [r for r in records if r.get("status") == FINISHED and r.get("passed")]
            windows = [r["window_uri"] for r in done if r.get("window_uri")]
            unique = list(dict.fromkeys(reversed(windows)))[:n]
            if not unique:
                warnings.append(
                    f"replay_source {name}: no earlier successful run yet, nothing to replay"
                )
            uris += unique
            continue
        uris.append(name)
    return list(dict.fromkeys(uris)), warnings
