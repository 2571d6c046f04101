"""The evaluate step's part for recurring runs: complete the run's record, move the retention
controller (components/schedules/controller.py) and show it in the report."""

from __future__ import annotations

import html
import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from components.schedules import controller, state
from trainer import storage

FORGETTING_CHECKS = ("general_retained", "task_regression")
HISTORY_KEPT = 50


def finish_run(
    record_uri: str,
    params: Any,
    *,
    metrics: Mapping[str, float],
    passed: bool,
    checks: Sequence[Mapping[str, Any]] = (),
    dataset_uri: str = "",
    run_dir: str = "",
) -> dict[str, Any]:
    """Write the run's outcome into its record and the controller's next share; returns the
    controller state written (also shown by `report_section`)."""
    record = state.read_record(record_uri) if storage.exists(record_uri) else {}
    root = posixpath.dirname(posixpath.dirname(record_uri))
    retained = controller.retention(metrics)
    refused = not passed and any(
        not c.get("passed") and str(c.get("name", "")).startswith(FORGETTING_CHECKS) for c in checks
    )
    target = params.retention_target or params.min_general_retained
    current = float(record.get("replay_fraction", params.replay_fraction))
    decision = controller.next_share(
        current,
        floor=params.replay_fraction,
        target=target,
        retained=retained,
        refused_for_forgetting=refused,
    )
    previous = state.read_controller(root) or {}
    entry = {
        "run_id": record.get("run_id", ""),
        "at": state.now(),
        "retention": retained,
        "share_used": current,
        "share_next": decision.share,
        "reason": decision.reason,
    }
    ctl = {
        "share": decision.share,
        "target": target,
        "floor": params.replay_fraction,
        "reason": decision.reason,
        "updated_by": entry["run_id"],
        "updated": entry["at"],
        "history": ([*previous.get("history", []), entry])[-HISTORY_KEPT:],
    }
    state.write_controller(root, ctl)
    state.update_record(
        record_uri,
        status=state.FINISHED,
        finished=entry["at"],
        passed=bool(passed),
        retention=retained,
        refused_for_forgetting=refused,
        eval_loss_before=metrics.get("base_eval_loss"),
        eval_loss_after=metrics.get("tuned_eval_loss"),
        next_replay_fraction=decision.share,
        controller_reason=decision.reason,
        **_dataset_facts(dataset_uri),
        **_training_facts(run_dir),
    )
    return ctl


def _read_json(uri: str) -> dict[str, Any]:
    try:
        return dict(json.loads(storage.read_text(uri))) if uri and storage.exists(uri) else {}
    except (OSError, ValueError):
        return {}


def _dataset_facts(dataset_uri: str) -> dict[str, Any]:
    manifest = _read_json(f"{dataset_uri.rstrip('/')}/manifest.json" if dataset_uri else "")
    if not manifest:
        return {}
    stats = manifest.get("stats", {})
    train = manifest.get("splits", {}).get("train", {})
    shares = {label: s.get("share") for label, s in stats.get("mix", {}).get("sources", {}).items()}
    return {"records_read": stats.get("records_read"), "tokens": train.get("tokens"), "mix": shares}


def _training_facts(run_dir: str) -> dict[str, Any]:
    root = run_dir.rstrip("/")
    summary = _read_json(f"{root}/summary.json" if root else "")
    cost = _read_json(f"{root}/cost.json" if root else "")
    return {
        "steps": summary.get("steps"),
        "gpu_hours": cost.get("gpu_hours"),
        "cost_usd": cost.get("cost_usd"),
    }


def report_section(ctl: Mapping[str, Any]) -> str:
    """The controller's state as an HTML section for the evaluation report."""
    rows = "".join(
        f"<tr><td>{html.escape(str(h.get('run_id', '')))}</td>"
        f"<td>{_fmt(h.get('retention'))}</td><td>{_fmt(h.get('share_used'))}</td>"
        f"<td>{_fmt(h.get('share_next'))}</td><td>{html.escape(str(h.get('reason', '')))}</td></tr>"
        for h in ctl.get("history", [])[-10:]
    )
    return (
        '<section id="retention-controller"><h2>Retention controller</h2>'
        f"<p>Next run's replay share: <b>{_fmt(ctl.get('share'))}</b> (target retention "
        f"{_fmt(ctl.get('target'))}, floor {_fmt(ctl.get('floor'))}): "
        f"{html.escape(str(ctl.get('reason', '')))}</p>"
        "<table><tr><th>run</th><th>retention</th><th>replay used</th><th>replay next</th>"
        f"<th>why</th></tr>{rows}</table></section>"
    )


def add_to_report(report_path: str, section: str) -> None:
    with open(report_path, encoding="utf-8") as f:
        text = f.read()
    text = text.replace("</body>", section + "</body>", 1) if "</body>" in text else text + section
    with open(report_path, "w", encoding="utf-8") as f:
        f.write(text)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
