"""The retention controller: the replay share of a schedule's next run, from how much the last
one retained (no I/O: components/schedules/state.py keeps its state).

Retention is what the quality gate checks against forgetting: the share of the general probes the
base answered that the tuned model still answers (`general_retained`), and for each `eval_tasks`
task the tuned score over the base's; the lowest of them counts.

The rule, after each finished run:
- forgetting (retention below the target, or the gate refused the model for it): the share
  doubles, at least to STEP_UP_MIN, at most CAP;
- comfortable (retention at least COMFORT above the target): the share falls by DECAY (x0.8),
  never below the user's `replay_fraction` (the floor);
- otherwise it stays.
The target is `retention_target`, or `min_general_retained` when that is 0; with both 0 the
controller only records (the share stays at `replay_fraction`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CAP = 0.5
"""The most replay: half the packed tokens stay the new data."""
STEP_UP_MIN = 0.05
"""A share raised from (nearly) nothing starts here."""
DECAY = 0.8
COMFORT = 0.05


def retention(metrics: Mapping[str, float]) -> float | None:
    """The lowest retention the gate checks: general_retained and tuned/base per harness task."""
    values = []
    if "general_retained" in metrics:
        values.append(float(metrics["general_retained"]))
    for name, base in metrics.items():
        if name.startswith("base_task_") and base:
            tuned = metrics.get("tuned_task_" + name.removeprefix("base_task_"))
            if tuned is not None:
                values.append(float(tuned) / float(base))
    return min(values) if values else None


@dataclass(frozen=True)
class Decision:
    share: float
    """The replay share of the next run."""
    reason: str


def next_share(
    current: float,
    *,
    floor: float,
    target: float,
    retained: float | None,
    refused_for_forgetting: bool = False,
) -> Decision:
    """The rule of the module docstring."""
    floor = min(floor, CAP)
    current = max(current, floor)
    if target <= 0:
        return Decision(floor, "no retention target: replay stays at replay_fraction")
    if refused_for_forgetting or (retained is not None and retained < target):
        share = min(CAP, max(2 * current, STEP_UP_MIN))
        what = "the gate refused for forgetting" if refused_for_forgetting else "retention"
        return Decision(share, f"{what} {_pct(retained)} < target {target:.2f}: replay raised")
    if retained is not None and retained >= target + COMFORT:
        share = max(floor, round(current * DECAY, 6))
        return Decision(share, f"retention {_pct(retained)} comfortable: replay lowered")
    return Decision(current, f"retention {_pct(retained)} near the target: replay kept")


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f}"
