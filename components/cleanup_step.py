"""The pipeline's cleanup (exit handler): delete everything that carries the run's label.

It knows only the run id (an exit handler cannot consume the guarded tasks' outputs) and must
succeed whatever state the run is in, so every deletion ignores what is already gone:
- local: stop the run's torchrun agents and workers, its etcd, and remove its state;
- gke: delete the run's PyTorchJobs and etcd StatefulSet/Service/PVCs by label;
- vertex: cancel the run's still-active CustomJobs (found by label).

Run by hand: `python -c "from components.cleanup_step import cleanup_run;
cleanup_run(backend='local', run_id='RUN')"`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from components.launchers.base import BACKENDS, get_launcher
from components.run_params import RunParams

logger = logging.getLogger(__name__)


def cleanup_run(
    *,
    backend: str,
    run_id: str,
    namespace: str = RunParams.namespace,
    gke_cluster: str = "",
    project: str = "",
    region: str = RunParams.region,
    api_client: Any = None,
    vertex_client: Any = None,
    state_root: str | None = None,
) -> list[str]:
    """Delete every resource of run `run_id` on `backend`; returns what was removed.

    Args:
        backend: local, gke or vertex.
        run_id: the pipeline run id.
        namespace, gke_cluster: where the run's Kubernetes objects live (gke).
        project, region: where the run's CustomJobs live (vertex).
        api_client, vertex_client: injected clients (tests); default ones are built otherwise.
        state_root: the local state root (default: $LLMFT_STATE_DIR or <tmp>/llmft-runs).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "local":
        launcher = get_launcher("local", state_root=state_root)
    elif backend == "gke":
        launcher = get_launcher(
            "gke", api_client=api_client, cluster=gke_cluster, namespace=namespace
        )
    else:
        launcher = get_launcher("vertex", project=project, location=region, client=vertex_client)
    removed = launcher.cleanup(run_id)
    for item in removed:
        logger.info("cleanup of run %s: %s", run_id, item)
    if not removed:
        logger.info("cleanup of run %s: nothing left to remove on %s", run_id, backend)
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
        removed += cleanup_run(backend="local", run_id=run_dir.name, state_root=str(root))
    return removed
