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

from components.params.by_step import DeployParams
from components.serving.endpoints import DeployOptions, VertexClients, deploy_version
from components.serving.lineage import RESOURCE_NAME_KEY, SERVED_MODEL_NAME_KEY
from components.serving.local_serving import serve_and_smoke
from components.steps.component_spec import StepComponent, component_input
from trainer import storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeployRequest:
    """The `deploy` component: its run parameters and its own inputs and outputs."""

    params: DeployParams
    """The run parameters the deploy step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    model_uri: str = component_input("str")
    """The exported model (the train step's `model_uri` output): served locally."""
    run_id: str = component_input("str")
    local: bool = component_input("bool")
    """Serve on this machine (the local pipeline) instead of a Vertex endpoint."""
    vertex_model: Any = component_input("Input[VertexModel]", optional=True, default=None)
    """The register step's `google.VertexModel` artifact (`.metadata["resourceName"]`:
    `projects/P/locations/L/models/M@V`); None in a local run."""
    gate_passed: bool = component_input("bool", optional=True, default=True)
    """The evaluate step's verdict (the local pipeline passes it; the cloud ones run the step
    only when it passed)."""
    clients: Any = None
    """Injected `VertexClients` (tests); default: the GAPIC clients of `region`."""


COMPONENT = StepComponent(
    name="deploy",
    request=DeployRequest,
    returns=(("endpoint", "str"), ("answer", "str")),
    doc="""Deploy the registered version to a Vertex AI endpoint (or, in a local run, serve the model
on this machine) and send it a smoke chat prompt; fail when it does not answer.

Returns:
    endpoint: the endpoint's resource name (locally: the server's chat URL).
    answer: the model's answer to the smoke prompt.
""",
)


def _raise_on_sigterm() -> None:
    """Turn a cancelled task's SIGTERM into an exception, so the deployment is rolled back."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}: the run was cancelled")

    signal.signal(signal.SIGTERM, handler)


def run(request: DeployRequest) -> tuple[str, str]:
    """Deploy (or serve locally) and smoke-test; returns (endpoint or server URL, answer)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not request.params.deploy_endpoint or not request.gate_passed:
        # Only the local pipeline runs this step unconditionally (see pipelines/fine_tune.py).
        log.info(
            "nothing to deploy: %s",
            "deploy_endpoint is empty" if request.gate_passed else "the gate did not pass",
        )
        return "", ""
    if request.local:
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
            endpoint=request.params.deploy_endpoint,
            machine_type=request.params.deploy_machine_type,
            accelerator_type=request.params.deploy_accelerator_type,
            accelerator_count=request.params.deploy_accelerator_count,
            spot=request.params.deploy_spot,
            traffic_percent=request.params.deploy_traffic_percent,
            encryption_key=request.params.encryption_key,
        ),
        preset=request.params.serving_preset,  # type: ignore[arg-type]
        served_model_name=str(metadata.get(SERVED_MODEL_NAME_KEY) or ""),
        project=request.params.project,
        location=request.params.region,
        run_id=request.run_id,
        clients=request.clients or VertexClients.for_location(request.params.region),
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
