"""Deploy a registered model version to a Vertex AI endpoint, prove it answers, split traffic.

`deploy_version` is what the `deploy` step runs after `register`:

1. find the endpoint (resource name, or display name; created with the run's labels and the
   pipeline's CMEK key when none has that name);
2. when the endpoint already serves earlier versions, smoke-test the new one alone first: a
   shared endpoint routes each request at random by its split and offers no per-deployed-model
   route, so the version is deployed to a temporary endpoint of its own, sent one chat prompt
   (components/serving/presets.py), and removed (`smoke_alone`);
3. deploy the version on the chosen machine and accelerators (Spot allowed) with its share: the
   challenger gets `traffic_percent` and the earlier ones keep the rest in their proportions;
   with 100 it replaces them (undeployed best-effort afterwards). On an endpoint serving nothing
   it gets 100 % and the smoke prompt is sent there;
4. on any failure (or SIGTERM) before the tested version serves its share, undeploy what this
   call deployed and delete the endpoints it created, so a failed run leaves nothing serving;
   once it serves, it is never rolled back.

Every call goes through the GAPIC clients (EndpointServiceClient, PredictionServiceClient), which
tests replace at that boundary (tests/fakes/vertex.py, goldens in tests/golden/).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.platform.platform_facts import machine_accelerator_errors
from components.runtime.run_identity import resource_name, vertex_labels
from components.serving.presets import ServingPreset
from components.serving.smoke import smoke
from components.serving.traffic import challenger_split, rescaled

log = logging.getLogger(__name__)

DEPLOY_TIMEOUT_S = 3 * 3600
"""How long a deployment may take (a GPU machine, an image pull and a model load from gs://)."""


@dataclass(frozen=True)
class DeployOptions:
    """Where and how the version serves (the `deploy_*` run parameters)."""

    endpoint: str
    """Endpoint resource name, numeric id or display name (created when no endpoint has it)."""
    machine_type: str
    accelerator_type: str
    """Vertex accelerator name; "" for a CPU machine."""
    accelerator_count: int
    spot: bool = False
    """Serve on Spot VMs (cheaper; replicas may be preempted)."""
    traffic_percent: int = 100
    """The new version's share when the endpoint serves earlier versions (100 replaces them)."""
    min_replicas: int = 1
    max_replicas: int = 1
    service_account: str = ""
    """Identity of the serving container (reads the model bucket); "" for Vertex's default."""
    encryption_key: str = ""
    """Cloud KMS key for a created endpoint (the pipeline's CMEK key)."""


def deploy_errors(options: DeployOptions) -> list[str]:
    """What Vertex would refuse about `options`, each with the fix ([] when fine)."""
    errors = []
    if not options.endpoint:
        errors.append("deploy_endpoint is empty: name the endpoint to deploy to")
    if not options.machine_type:
        errors.append("deploy_machine_type is empty: choose a machine type, e.g. g2-standard-12")
    count = options.accelerator_count if options.accelerator_type else 0
    errors += [
        f"deploy: {e}"
        for e in machine_accelerator_errors(options.machine_type, options.accelerator_type, count)
    ]
    if not 1 <= options.traffic_percent <= 100:
        errors.append(
            f"deploy_traffic_percent={options.traffic_percent}: give the new version's share, "
            "1-100 (100 replaces the versions the endpoint serves)"
        )
    if options.min_replicas < 1 or options.max_replicas < options.min_replicas:
        errors.append("deploy replicas: need 1 <= min_replicas <= max_replicas")
    return errors


@dataclass
class Deployment:
    """What one `deploy_version` call changed (what a rollback undoes)."""

    endpoint: str
    deployed_model_id: str = ""
    created_endpoint: bool = False
    replaced: list[str] = field(default_factory=list)
    """Deployed models of earlier versions undeployed because the new one took all traffic."""
    left: list[str] = field(default_factory=list)
    """Earlier deployed models that could not be undeployed (still deployed, no traffic)."""
    traffic_split: dict[str, int] = field(default_factory=dict)
    answer: str = ""


@dataclass(frozen=True)
class VertexClients:
    """The GAPIC clients used (tests pass fakes)."""

    endpoints: Any
    predictions: Any

    @classmethod
    def for_location(cls, location: str, credentials: Any = None) -> VertexClients:
        # the Vertex client (~2 s to import): only when Vertex is called
        from google.cloud import aiplatform_v1
        from google.cloud.aiplatform import initializer

        # the Vertex launcher (~60 modules): only for a cloud deployment
        from components.launchers.vertex import api_endpoint

        options = {"api_endpoint": api_endpoint(location)}
        credentials = credentials or initializer.global_config.credentials
        return cls(
            endpoints=aiplatform_v1.EndpointServiceClient(
                client_options=options, credentials=credentials
            ),
            predictions=aiplatform_v1.PredictionServiceClient(
                client_options=options, credentials=credentials
            ),
        )


def _is_resource_ref(endpoint: str) -> bool:
    return endpoint.startswith("projects/") or endpoint.isdigit()


def find_or_create_endpoint(
    clients: VertexClients, *, options: DeployOptions, project: str, location: str, run_id: str
) -> tuple[Any, bool]:
    """(the Endpoint proto, whether this call created it)."""
    # the Vertex client (~2 s to import): only when Vertex is called
    from google.cloud import aiplatform_v1

    parent = f"projects/{project}/locations/{location}"
    if _is_resource_ref(options.endpoint):
        name = (
            options.endpoint
            if "/" in options.endpoint
            else f"{parent}/endpoints/{options.endpoint}"
        )
        return clients.endpoints.get_endpoint(request={"name": name}), False
    found = list(
        clients.endpoints.list_endpoints(
            request=aiplatform_v1.ListEndpointsRequest(
                parent=parent, filter=f'display_name="{options.endpoint}"'
            )
        )
    )
    if found:
        # Several endpoints may share a display name: the oldest is the one that serves.
        return min(found, key=lambda e: (e.create_time, e.name)), False
    endpoint = aiplatform_v1.Endpoint(display_name=options.endpoint, labels=vertex_labels(run_id))
    if options.encryption_key:
        endpoint.encryption_spec = aiplatform_v1.EncryptionSpec(kms_key_name=options.encryption_key)
    log.info("creating endpoint %s in %s", options.endpoint, parent)
    operation = clients.endpoints.create_endpoint(
        request=aiplatform_v1.CreateEndpointRequest(parent=parent, endpoint=endpoint)
    )
    return operation.result(timeout=DEPLOY_TIMEOUT_S), True


def _deployed_model(version: str, options: DeployOptions, run_id: str) -> Any:
    # the Vertex client (~2 s to import): only when Vertex is called
    from google.cloud import aiplatform_v1

    machine = aiplatform_v1.MachineSpec(machine_type=options.machine_type)
    if options.accelerator_type:
        machine.accelerator_type = getattr(aiplatform_v1.AcceleratorType, options.accelerator_type)
        machine.accelerator_count = options.accelerator_count
    deployed = aiplatform_v1.DeployedModel(
        model=version,
        display_name=resource_name("serve", run_id),
        dedicated_resources=aiplatform_v1.DedicatedResources(
            machine_spec=machine,
            min_replica_count=options.min_replicas,
            max_replica_count=options.max_replicas,
            spot=options.spot,
        ),
    )
    if options.service_account:
        deployed.service_account = options.service_account
    return deployed


def deploy_version(
    *,
    version: str,
    options: DeployOptions,
    preset: ServingPreset,
    served_model_name: str,
    project: str,
    location: str,
    run_id: str,
    clients: VertexClients | None = None,
    on_deployed: Callable[[Deployment], None] | None = None,
) -> Deployment:
    """Deploy `version` (`projects/P/locations/L/models/M@V`), smoke-test it alone, settle traffic.

    The smoke prompt must reach the new model and nothing else. A shared Vertex endpoint routes
    each predict/rawPredict at random by its traffic split, and its only per-deployed-model
    route (`.../deployedModels/ID/invoke`) exists on dedicated endpoints alone; so when the
    endpoint already serves earlier versions the new one is first deployed to a temporary
    endpoint of its own (`llmft-smoke-<run>`, run labels: the run's cleanup finds it), smoke-
    tested there and removed, and only then deployed to the endpoint with its share (an extra
    deployment's time, the price of testing the challenger and not the champion). On an endpoint
    serving nothing the new model is deployed at 100 % and tested in place.

    Once the smoke test passed and the version is deployed with its share it is never rolled
    back: with 100 % the earlier models are undeployed best-effort (`Deployment.left` lists
    those that could not be). Before that, any failure (or SIGTERM) undeploys what this call
    deployed, gives the earlier models still deployed their traffic back and deletes the
    endpoints it created, then re-raises. `on_deployed` is called once the version is deployed
    to the endpoint (the step may record it for a cancelled run's cleanup).

    Raises:
        ValueError: invalid options (before any call).
        RuntimeError: the deployed model does not answer.
    """
    errors = deploy_errors(options)
    if errors:
        raise ValueError("cannot deploy: " + "; ".join(errors))
    clients = clients or VertexClients.for_location(location)
    endpoint, created = find_or_create_endpoint(
        clients, options=options, project=project, location=location, run_id=run_id
    )
    deployment = Deployment(endpoint=endpoint.name, created_endpoint=created)
    earlier = {k: v for k, v in endpoint.traffic_split.items() if v > 0}
    try:
        release = Release(version, options, project, location, run_id, preset, served_model_name)
        split = _deploy_tested(clients, deployment, earlier, release, on_deployed)
    except BaseException:
        rollback(clients, deployment, restore_split=earlier)
        raise
    # Tested and serving its share: from here on nothing rolls the new version back.
    if options.traffic_percent >= 100:
        _retire(clients, deployment, earlier)
    deployment.traffic_split = _final_split(clients, deployment, split)
    return deployment


@dataclass(frozen=True)
class Release:
    """What one `deploy_version` call deploys and where: its arguments, as its phases take them."""

    version: str
    options: DeployOptions
    project: str
    location: str
    run_id: str
    preset: ServingPreset
    served_model_name: str


def _deploy_tested(
    clients: VertexClients,
    deployment: Deployment,
    earlier: dict[str, int],
    release: Release,
    on_deployed: Callable[[Deployment], None] | None,
) -> dict[str, int]:
    """Smoke-test `version` (alone first when the endpoint serves `earlier` models, else in
    place) and deploy it with its share; `deployment` records what was done (what a rollback
    undoes). Returns the traffic split requested."""
    if earlier:
        deployment.answer = smoke_alone(clients, release)
    split = challenger_split(earlier, release.options.traffic_percent)
    deployment.deployed_model_id = _deploy(clients, deployment.endpoint, release, split)
    if on_deployed:
        on_deployed(deployment)
    if not earlier:
        deployment.answer = smoke(
            clients.predictions, endpoint=deployment.endpoint, preset=release.preset,
            served_model_name=release.served_model_name,
            deployed_model_id=deployment.deployed_model_id,
        )  # fmt: skip
    log.info("smoke prompt answered: %r", deployment.answer)
    return split


def _retire(clients: VertexClients, deployment: Deployment, earlier: dict[str, int]) -> None:
    """Undeploy the `earlier` models after the new one took all traffic, best-effort: one that
    cannot be undeployed stays deployed with no traffic (`Deployment.left`)."""
    for old in sorted(earlier):  # a proto map: no order of its own
        try:
            undeploy(clients, deployment.endpoint, old, {deployment.deployed_model_id: 100})
            deployment.replaced.append(old)
        except Exception:  # best-effort: the old model stays deployed with no traffic
            log.exception(
                "could not undeploy %s from %s (it gets no traffic)", old, deployment.endpoint
            )
            deployment.left.append(old)


def _final_split(
    clients: VertexClients, deployment: Deployment, split: dict[str, int]
) -> dict[str, int]:
    """The endpoint's traffic split as Vertex reports it after the deployment (the requested
    `split`, with the new model's id, when it cannot be read back)."""
    try:
        final = clients.endpoints.get_endpoint(request={"name": deployment.endpoint})
        return dict(final.traffic_split)
    except Exception:
        log.exception("could not read back the traffic split of %s", deployment.endpoint)
        return {(deployment.deployed_model_id if k == "0" else k): v for k, v in split.items()}


def _deploy(clients: VertexClients, endpoint: str, release: Release, split: dict[str, int]) -> str:
    """DeployModel the release's version to `endpoint` with `split` ("0": the new model); its
    deployed id."""
    # the Vertex client (~2 s to import): only when Vertex is called
    from google.cloud import aiplatform_v1

    version, options = release.version, release.options
    log.info(
        "deploying %s to %s on %s (%s x %s, spot=%s), traffic %s",
        version, endpoint, options.machine_type, options.accelerator_count,
        options.accelerator_type or "no GPU", options.spot, split,
    )  # fmt: skip
    operation = clients.endpoints.deploy_model(
        request=aiplatform_v1.DeployModelRequest(
            endpoint=endpoint,
            deployed_model=_deployed_model(version, options, release.run_id),
            traffic_split=split,
        )
    )
    return str(operation.result(timeout=DEPLOY_TIMEOUT_S).deployed_model.id)


def smoke_alone(clients: VertexClients, release: Release) -> str:
    """The smoke prompt answered by the release's version alone: deployed to a temporary endpoint of its own
    (`llmft-smoke-<run>`, created with the run's labels and CMEK key), tested there, then
    undeployed and the endpoint deleted whatever happened. Returns the answer."""
    name = resource_name("smoke", release.run_id)
    temporary = DeployOptions(
        **{**release.options.__dict__, "endpoint": name, "traffic_percent": 100}
    )
    endpoint, _ = find_or_create_endpoint(
        clients,
        options=temporary,
        project=release.project,
        location=release.location,
        run_id=release.run_id,
    )
    trial = Deployment(endpoint=endpoint.name, created_endpoint=True)
    try:
        trial.deployed_model_id = _deploy(clients, endpoint.name, release, {"0": 100})
        return smoke(
            clients.predictions, endpoint=endpoint.name, preset=release.preset,
            served_model_name=release.served_model_name,
            deployed_model_id=trial.deployed_model_id,
        )  # fmt: skip
    finally:
        rollback(clients, trial)


def undeploy(clients: VertexClients, endpoint: str, deployed_model_id: str, split: dict) -> None:
    # the Vertex client (~2 s to import): only when Vertex is called
    from google.cloud import aiplatform_v1

    log.info("undeploying %s from %s", deployed_model_id, endpoint)
    clients.endpoints.undeploy_model(
        request=aiplatform_v1.UndeployModelRequest(
            endpoint=endpoint, deployed_model_id=deployed_model_id, traffic_split=split
        )
    ).result(timeout=DEPLOY_TIMEOUT_S)


def rollback(
    clients: VertexClients, deployment: Deployment, restore_split: dict[str, int] | None = None
) -> None:
    """Undo a deployment: undeploy the model it deployed (giving the earlier models still
    deployed their traffic back, rescaled to 100) and delete the endpoint it created. Errors are
    logged, never raised: this runs while another error propagates."""
    # with the Vertex client: only when a deployment is rolled back
    from google.api_core import exceptions

    try:
        if deployment.deployed_model_id:
            restore = {k: v for k, v in (restore_split or {}).items() if v > 0}
            if restore:
                # Vertex refuses a split naming a model no longer deployed (INVALID_ARGUMENT).
                current = clients.endpoints.get_endpoint(request={"name": deployment.endpoint})
                deployed = {d.id for d in current.deployed_models} - {deployment.deployed_model_id}
                restore = {k: v for k, v in restore.items() if k in deployed}
            undeploy(
                clients,
                deployment.endpoint,
                deployment.deployed_model_id,
                rescaled(restore) if restore else {},
            )
        if deployment.created_endpoint:
            log.info("deleting endpoint %s created by the failed deployment", deployment.endpoint)
            clients.endpoints.delete_endpoint(request={"name": deployment.endpoint}).result(
                timeout=DEPLOY_TIMEOUT_S
            )
    except exceptions.NotFound:
        pass
    except Exception:
        log.exception("could not roll back the deployment on %s", deployment.endpoint)
