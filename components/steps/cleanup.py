"""The pipeline's cleanup (exit handler): delete everything that carries the run's label.

It knows only the run id (an exit handler cannot consume the guarded tasks' outputs) and must
succeed whatever state the run is in, so every deletion ignores what is already gone:
- local: stop the run's torchrun agents and workers, its etcd, and remove its state;
- gke: delete the run's PyTorchJobs and etcd StatefulSet/Service/PVCs by label;
- vertex: cancel the run's still-active CustomJobs (found by label).

Run by hand for local runs: `llmft cleanup --run-id RUN` (or, without a run id, every local run
whose launcher is gone: what an `llmft train` killed by SIGKILL or a lost terminal left behind).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.etcd import local as etcd_local
from components.launchers.gke import GkeOptions
from components.launchers.local import STATE_FILE, LocalOptions
from components.launchers.pytorchjob import PyTorchJobOptions
from components.launchers.run_processes import marked_pids
from components.launchers.vertex import VertexOptions
from components.params.by_step import CleanupParams
from components.params.step_params import for_step
from components.runtime.lifeline import alive
from components.serving.endpoints import VertexClients
from components.serving.teardown import undeploy_run
from components.steps.component_spec import StepComponent, component_input
from components.steps.train import BackendOptions, launcher, unknown_backend

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CleanupRequest:
    """The `cleanup` component: its run parameters and the run's id and final status, plus what
    tests and the local runner set."""

    params: CleanupParams
    """The run parameters the cleanup step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    run_id: str = component_input("str")
    status: Any = component_input("dsl.PipelineTaskFinalStatus", default=None)
    """The run's `dsl.PipelineTaskFinalStatus` (`.state`); a failed or cancelled run's
    deployments are undone. None: not known (nothing is undeployed)."""
    api_client: Any = None
    """An injected `kubernetes.client.ApiClient` (gke; tests); default: built from gke_cluster."""
    vertex_client: Any = None
    """An injected `aiplatform_v1.JobServiceClient` (vertex; tests)."""
    state_root: str | None = None
    """The local state root (default: $LLMFT_STATE_DIR or <tmp>/llmft-runs)."""
    endpoint_clients: Any = None
    """Injected `components.serving.endpoints.VertexClients` (tests); default: the region's."""

    def backend_options(self) -> BackendOptions:
        """Where the run's resources live, as the backend's launcher options."""
        p = self.params
        if p.backend == "local":
            return LocalOptions(state_root=self.state_root)
        if p.backend == "gke":
            job = PyTorchJobOptions(namespace=p.namespace)
            return GkeOptions(job=job, cluster=p.gke_cluster, api_client=self.api_client)
        if p.backend == "vertex":
            return VertexOptions(project=p.project, location=p.region, client=self.vertex_client)
        raise unknown_backend(p.backend)


COMPONENT = StepComponent(
    name="cleanup",
    request=CleanupRequest,
    returns=None,
    doc="""Exit handler: delete everything that carries this run's label; ignore what is gone. A
failed or cancelled run's deployments to Vertex AI endpoints are undeployed.
""",
)


def run(request: CleanupRequest) -> list[str]:
    """Delete every resource of the run on its backend; returns what was removed."""
    removed = launcher(request.backend_options()).cleanup(request.run_id)
    removed += undeploy_failed_run(request)
    for item in removed:
        logger.info("cleanup of run %s: %s", request.run_id, item)
    if not removed:
        logger.info(
            "cleanup of run %s: nothing left to remove on %s",
            request.run_id,
            request.params.backend,
        )
    return removed


def cleanup_local_state(state_root: str | os.PathLike[str]) -> list[str]:
    """Clean up every local run recorded under `state_root` (the local pipeline runner's last
    resort when its exit handler could not run): processes, etcd, state files."""
    root = Path(state_root)
    if not root.is_dir():
        return []
    removed: list[str] = []
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        # Directory names are safe run ids, and safe_run_id is idempotent on them.
        removed += run(
            CleanupRequest(
                params=for_step("cleanup", backend="local"),
                run_id=run_dir.name,
                state_root=str(root),
            )
        )
    return removed


def local_runs_by_liveness(state_root: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """(dead, live) run ids under `state_root`: a run is live while the process that follows it
    (its launcher, recorded in its state) runs, or, with no launcher recorded, while processes of
    the run or its etcd run (a pipeline's etcd step outlives its task on purpose)."""
    root = Path(state_root)
    dead: list[str] = []
    live: list[str] = []
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        try:
            pid = int(json.loads((run_dir / STATE_FILE).read_text()).get("launcher_pid") or 0)
        except (OSError, ValueError, AttributeError):
            pid = 0
        if pid:
            running = alive(pid)
        else:
            running = bool(marked_pids(str(run_dir))) or (
                etcd_local.status(run_dir.name, root=root) is not None
            )
        (live if running else dead).append(run_dir.name)
    return dead, live


# --- serving (issue 30) ----------------------------------------------------------------------------

FAILED_STATES = ("FAILED", "CANCELLED", "CANCELED")


def undeploy_failed_run(request: CleanupRequest) -> list[str]:
    """Undeploy what the deploy step of a failed or cancelled run left on Vertex AI endpoints
    (it rolls back itself, unless it was killed first). Only cloud runs deploy to endpoints."""
    state = str(getattr(request.status, "state", "") or "").upper()
    if (
        request.params.backend == "local"
        or not request.params.project
        or state not in FAILED_STATES
    ):
        return []

    clients = request.endpoint_clients or VertexClients.for_location(request.params.region)
    return undeploy_run(
        clients,
        project=request.params.project,
        location=request.params.region,
        run_id=request.run_id,
    )
