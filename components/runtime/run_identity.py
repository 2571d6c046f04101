"""Names and labels derived from a pipeline run id.

Why: an exit-handler task cannot consume the outputs of the tasks it guards, so cleanup finds what a
run created by label, and every step names what it creates from the same run id
(`dsl.PIPELINE_JOB_ID_PLACEHOLDER` in the pipeline, a generated id locally).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from components.platform.kfp_backend import KFP_FEATURE_FLOORS, version_text

MANAGED_BY = "llmft"
K8S_RUN_LABEL = "llmft.dev/run-id"
"""Kubernetes label key (prefix/name form) carried by every object a run creates."""
VERTEX_RUN_LABEL = "llmft-run-id"
"""Vertex AI label key (no '/' or '.' allowed there) carried by every job a run creates."""
GCP_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
"""A Google Cloud (Vertex AI, GCS, Dataflow) label key: a lowercase letter, then lowercase letters,
digits, '_' or '-'; at most 63 characters."""
GCP_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
"""A Google Cloud label value: lowercase letters, digits, '_' or '-'; at most 63 characters."""

STATE_DIR_ENV = "LLMFT_STATE_DIR"
"""Root of local runs' state; `llmft run --backend local` points it at `<workdir>/state`."""

_MAX = 40


PLACEHOLDER_START = "{{$."
"""How an unresolved KFP placeholder starts."""


def check_placeholder_resolved(name: str, value: str) -> str | None:
    """A literal `{{$.` means the backend did not resolve a KFP placeholder; using it would name
    every run's resources alike."""
    if PLACEHOLDER_START in value:
        floor = version_text(KFP_FEATURE_FLOORS["pipeline_job_uuid placeholder"][0])
        return (
            f"{name}={value!r} is an unresolved KFP placeholder: this backend is too old to "
            f"resolve it (KFP >= {floor} resolves the run id; see docs/deploy/README.md)"
        )
    return None


def safe_run_id(run_id: str) -> str:
    """A run id usable as a label value and inside DNS-1123 names (lowercase, digits, '-').

    Long or unusual ids are shortened with a hash suffix so two different runs never collide.
    """
    if not run_id or not run_id.strip():
        raise ValueError(
            "run id is empty: pass the pipeline's run id (dsl.PIPELINE_JOB_ID_PLACEHOLDER)"
        )
    if problem := check_placeholder_resolved("run id", run_id):
        raise ValueError(problem)  # hashing it would give every run of this backend one name
    cleaned = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    if cleaned == run_id and len(cleaned) <= _MAX:
        return cleaned
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return f"{cleaned[: _MAX - 9].strip('-')}-{digest}".strip("-")


def k8s_labels(run_id: str, component: str | None = None) -> dict[str, str]:
    labels = {"app.kubernetes.io/managed-by": MANAGED_BY, K8S_RUN_LABEL: safe_run_id(run_id)}
    if component:
        labels["app.kubernetes.io/component"] = component
    return labels


def k8s_selector(run_id: str) -> str:
    """Label selector matching every Kubernetes object of a run."""
    return f"{K8S_RUN_LABEL}={safe_run_id(run_id)}"


def vertex_labels(run_id: str) -> dict[str, str]:
    return {"managed-by": MANAGED_BY, VERTEX_RUN_LABEL: safe_run_id(run_id)}


def resource_name(kind: str, run_id: str) -> str:
    """`llmft-<kind>-<run>`: a DNS-1123 label (<= 63 chars) unique per run and kind."""
    return f"{MANAGED_BY}-{kind}-{safe_run_id(run_id)}"[:63].rstrip("-")


def state_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Root of local per-run state: `root`, else $LLMFT_STATE_DIR, else `<tmp>/llmft-runs`.

    Read at call time: the local pipeline's tasks are separate processes that find what an
    earlier task started (etcd pid, launcher processes) under the same root.
    """
    if root is not None:
        return Path(root)
    return Path(os.environ.get(STATE_DIR_ENV) or Path(tempfile.gettempdir()) / "llmft-runs")


def run_state_dir(run_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    """A local run's state directory: `<state_root(root)>/<safe run id>`."""
    return state_root(root) / safe_run_id(run_id)
