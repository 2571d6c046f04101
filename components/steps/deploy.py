"""The pipeline's deploy step: serve the model and prove it answers a chat prompt.

`run(DeployRequest)` is what the `deploy` KFP component calls, after `register`, when
`deploy_endpoint` is set:
- in the cloud, the registered version goes to the Vertex AI endpoint (components/serving/endpoints.py:
  create or reuse, machine and accelerators, Spot, champion/challenger traffic, smoke prompt,
  rollback of what it deployed when anything fails);
- in a local run (`local=True`), the exported model is served on this machine by a real
  OpenAI-compatible server (`transformers serve`, components/serving/local_serving.py), asked the smoke
  prompt, and stopped.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from types import FrameType
from typing import Any

from components.serving.endpoints import DeployOptions, VertexClients, deploy_version
from components.serving.lineage import RESOURCE_NAME_KEY, SERVED_MODEL_NAME_KEY

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeployRequest:
    """The `deploy` component's parameters (components/kfp_components.py), by the same names;
    the run parameters' meanings are in components/params/run_params.py."""

    model_uri: str
    """The exported model (the train step's `model_uri` output): served locally."""
    vertex_model: Any
    """The register step's `google.VertexModel` artifact (`.metadata["resourceName"]`:
    `projects/P/locations/L/models/M@V`); None in a local run."""
    run_id: str
    project: str
    region: str
    serving_preset: str
    deploy_endpoint: str
    deploy_machine_type: str
    deploy_accelerator_type: str
    deploy_accelerator_count: int
    deploy_spot: bool
    deploy_traffic_percent: int
    encryption_key: str
    local: bool
    """Serve on this machine (the local pipeline) instead of a Vertex endpoint."""
    gate_passed: bool = True
    """The evaluate step's verdict (the local pipeline passes it; the cloud ones run the step
    only when it passed)."""
    clients: Any = None
    """Injected `VertexClients` (tests); default: the GAPIC clients of `region`."""


def _raise_on_sigterm() -> None:
    """Turn a cancelled task's SIGTERM into an exception, so the deployment is rolled back."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}: the run was cancelled")

    signal.signal(signal.SIGTERM, handler)


def run(request: DeployRequest) -> tuple[str, str]:
    """Deploy (or serve locally) and smoke-test; returns (endpoint or server URL, answer)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not request.deploy_endpoint or not request.gate_passed:
        # Only the local pipeline runs this step unconditionally (see pipelines/fine_tune.py).
        log.info(
            "nothing to deploy: %s",
            "deploy_endpoint is empty" if request.gate_passed else "the gate did not pass",
        )
        return "", ""
    if request.local:
        from components.serving.local_serving import serve_and_smoke
        from trainer import storage

        model_dir = storage.normalize(request.model_uri)
        if storage.is_remote(model_dir):
            model_dir = str(storage.copy_to_local(model_dir, storage.cache_dir() / "serve"))
        result = serve_and_smoke(model_dir)
        return result.url, result.answer
    if request.vertex_model is None:
        raise ValueError("deploy needs the registered version: set register_model=true")
    metadata = request.vertex_model.metadata
    version = str(metadata[RESOURCE_NAME_KEY])
    _raise_on_sigterm()
    deployment = deploy_version(
        version=version,
        options=DeployOptions(
            endpoint=request.deploy_endpoint,
            machine_type=request.deploy_machine_type,
            accelerator_type=request.deploy_accelerator_type,
            accelerator_count=request.deploy_accelerator_count,
            spot=request.deploy_spot,
            traffic_percent=request.deploy_traffic_percent,
            encryption_key=request.encryption_key,
        ),
        preset=request.serving_preset,  # type: ignore[arg-type]
        served_model_name=str(metadata.get(SERVED_MODEL_NAME_KEY) or ""),
        project=request.project,
        location=request.region,
        run_id=request.run_id,
        clients=request.clients or VertexClients.for_location(request.region),
    )
    log.info(
        "deployed %s to %s as %s; traffic %s",
        version,
        deployment.endpoint,
        deployment.deployed_model_id,
        deployment.traffic_split,
    )
    if deployment.left:
        log.warning(
            "could not undeploy %s from %s (no traffic): undeploy them by hand",
            ", ".join(deployment.left),
            deployment.endpoint,
        )
    return deployment.endpoint, deployment.answer
