"""Capacity types (on-demand, Spot, flex-start) and the defaults that change with them.

On preemptible capacity (Spot) a machine can be taken with 30 s notice, of which a GKE pod gets
`GKE_SPOT_POD_GRACE_S` (components/platform/platform_facts.py): too short for a SIGTERM checkpoint of a
large model to gs://. So a Spot run also checkpoints by time (`SPOT_CHECKPOINT_MINUTES`, which
bounds the work a preemption loses), restarts more often, and every restart resumes from the
newest complete checkpoint. Flex-start (Dynamic Workload Scheduler) waits for its machines, then
runs them without preemption for up to 7 days: only the wait changes.

How each backend asks for the capacity: components/launchers/customjob.py (`scheduling.strategy`)
and components/launchers/pytorchjob.py (node selectors and tolerations).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

Capacity = Literal["on-demand", "spot", "flex-start"]
CAPACITIES: tuple[str, ...] = get_args(Capacity)
"""The `capacity` run parameter's choices."""
PREEMPTIBLE = ("spot",)
"""Capacity types whose machines can be taken away mid-run."""
SPOT_CHECKPOINT_MINUTES = 10.0
"""Time-based checkpoint interval on Spot unless trainer_overrides sets one: a preemption loses
at most this much work when its SIGTERM checkpoint does not fit the grace period."""
POD_TERMINATION_GRACE_S = 30
"""terminationGracePeriodSeconds of a Spot run's GKE pods: Kubernetes' default, never less. A
preempted Spot node caps non-system pods at GKE_SPOT_POD_GRACE_S anyway, so a shorter setting
gains nothing there and only cuts the SIGTERM checkpoint window of every other termination
(cancel, scale-down, node upgrade or drain). The train step does not know the checkpoint's size
(the model is read by the workers), so no measured checkpoint time is added here: the cost
estimate's note says when a SIGTERM checkpoint exceeds the Spot grace (components/preflight/cost.py)."""
SPOT_RESTARTS_PER_NODE = 10
"""PyTorchJob container restarts per node on Spot (on-demand keeps PyTorchJobOptions' 3): each
preemption of a node costs one."""


def preemptible(capacity: str) -> bool:
    return capacity in PREEMPTIBLE


def trainer_overrides_for(capacity: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`overrides` with the capacity's trainer defaults filled in where the user set none."""
    values = dict(overrides)
    if preemptible(capacity):
        values.setdefault("checkpoint_every_minutes", SPOT_CHECKPOINT_MINUTES)
    return values
