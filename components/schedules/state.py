"""A schedule's records under `work_uri`: one JSON file per run and the retention controller's
state, read and written through trainer/storage.py (local paths and gs:// alike).

    <work_uri>/schedules/<key>/runs/<run id>.json   what the run read, decided and measured
    <work_uri>/schedules/<key>/controller.json      the replay share the next run starts from

The key names the schedule: a hash of `train_data_uri` as written (with its schedule-time
placeholder, so every window of one schedule shares it) and `registered_model`. Nothing here
is ever deleted by a run: a failed run leaves its record "started" and the controller as the
last finished run left it. Without a `work_uri` nothing is recorded (a local run may set one
to a local directory).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

from trainer import storage

RUNS = "runs"
CONTROLLER = "controller.json"
STARTED, SKIPPED, FINISHED = "started", "skipped", "finished"


def schedule_key(train_data_uri: str, registered_model: str) -> str:
    """The schedule a run belongs to (its template, not its window)."""
    text = f"{train_data_uri}\n{registered_model}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def schedule_root(work_uri: str, key: str) -> str:
    """Where the schedule's records live; "" without a work_uri (nothing is recorded)."""
    return f"{work_uri.rstrip('/')}/schedules/{key}" if work_uri else ""


def run_record_uri(root: str, run_id: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in run_id) or "run"
    return f"{root}/{RUNS}/{safe}.json"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_record(uri: str, record: dict[str, Any]) -> None:
    storage.write_text(uri, json.dumps(record, indent=2, sort_keys=True))


def read_record(uri: str) -> dict[str, Any]:
    return dict(json.loads(storage.read_text(uri)))


def update_record(uri: str, **values: Any) -> dict[str, Any]:
    """Merge `values` into the run's record (created if missing)."""
    record = read_record(uri) if storage.exists(uri) else {}
    record.update(values)
    write_record(uri, record)
    return record


def runs(root: str) -> list[dict[str, Any]]:
    """Every run record of the schedule, oldest first (by start time, then run id)."""
    out = []
    for uri in storage.listdir(f"{root}/{RUNS}"):
        if uri.endswith(".json"):
            try:
                out.append(read_record(uri))
            except (ValueError, OSError):
                continue  # a record being written, or damaged: history goes on without it
    return sorted(out, key=lambda r: (r.get("started", ""), r.get("run_id", "")))


def last_successful(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest run that finished with the gate passed."""
    done = [r for r in records if r.get("status") == FINISHED and r.get("passed")]
    return done[-1] if done else None


def read_controller(root: str) -> dict[str, Any] | None:
    uri = f"{root}/{CONTROLLER}"
    return read_record(uri) if storage.exists(uri) else None


def write_controller(root: str, state: dict[str, Any]) -> None:
    write_record(f"{root}/{CONTROLLER}", state)
