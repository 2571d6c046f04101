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

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.runtime.run_identity import resource_name, vertex_labels
from components.serving.presets import ServingPreset, chat_answer, chat_body

log = logging.getLogger(__name__)

DEPLOY_TIMEOUT_S = 3 * 3600
"""How long a deployment may take (a GPU machine, an image pull and a model load from gs://)."""
SMOKE_ATTEMPTS = 20
"""Chat requests sent before giving up (the new model is alone on the endpoint it is tested on;
the Model Garden preset's answers are still checked to come from it)."""


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
    from components.platform.platform_facts import machine_accelerator_errors

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
        from google.cloud import aiplatform_v1
        from google.cloud.aiplatform import initializer

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


def challenger_split(current: dict[str, int], share: int) -> dict[str, int]:
    """The traffic split with the new model ("0", as DeployModel names it) at `share` percent and
    the current models keeping the rest in their proportions (largest remainders first)."""
    serving = {k: v for k, v in current.items() if v > 0}
    if not serving or share >= 100:
        return {"0": 100}
    rest = 100 - share
    total = sum(serving.values())
    exact = {k: v * rest / total for k, v in serving.items()}
    split = {k: int(x) for k, x in exact.items()}
    by_remainder = sorted(exact, key=lambda k: (-(exact[k] - split[k]), k))
    for k in by_remainder[: rest - sum(split.values())]:
        split[k] += 1
    return {**split, "0": share}


def smoke(
    clients: VertexClients,
    *,
    endpoint: str,
    preset: ServingPreset,
    served_model_name: str,
    deployed_model_id: str,
    attempts: int = SMOKE_ATTEMPTS,
) -> str:
    """Send the smoke chat prompt; return the answer.

    Raises:
        RuntimeError: no chat completion came back (or, with the Model Garden preset, none from
            the new model).
    """
    from google.api import httpbody_pb2
    from google.cloud import aiplatform_v1

    body = chat_body(preset, served_model_name)
    problems: list[str] = []
    for _ in range(attempts):
        try:
            if preset == "vertex-vllm":
                # Flattened arguments, as the SDK's Endpoint.predict calls it (proto-plus cannot
                # build a PredictRequest with Value instances in one go).
                response = clients.predictions.predict(
                    endpoint=endpoint, instances=json.loads(body)["instances"]
                )
                predictions = [_plain(p) for p in response.predictions]
                answer = chat_answer({"predictions": predictions})
                if answer is not None and response.deployed_model_id == deployed_model_id:
                    return answer
                problems.append(
                    f"{response.deployed_model_id or '?'} answered {answer!r}"
                    if answer is not None
                    else f"no chat completion in {predictions!r:.200}"
                )
                continue
            http_body = httpbody_pb2.HttpBody(data=body, content_type="application/json")
            raw = clients.predictions.raw_predict(
                request=aiplatform_v1.RawPredictRequest(endpoint=endpoint, http_body=http_body)
            )
            answer = chat_answer(bytes(raw.data))
            if answer is not None:
                return answer
            problems.append(f"no answer in {bytes(raw.data)[:200]!r}")
        except Exception as exc:  # a refused request is a failed smoke test, reported below
            problems.append(f"{type(exc).__name__}: {exc}")
        if len(problems) >= 3 and preset != "vertex-vllm":
            break
    raise RuntimeError(
        f"the smoke prompt got no answer from the new model on {endpoint}: "
        + "; ".join(problems[-3:])
    )


def _plain(value: Any) -> Any:
    """A prediction as plain Python (proto-plus gives Struct/list wrappers or protobuf Values)."""
    from google.protobuf import json_format, struct_pb2

    if isinstance(value, struct_pb2.Value):
        return json_format.MessageToDict(value)
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "RepeatedComposite":
        return [_plain(v) for v in value]
    return value


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
        if earlier:
            deployment.answer = smoke_alone(
                clients, version=version, options=options, project=project,
                location=location, run_id=run_id, preset=preset,
                served_model_name=served_model_name,
            )  # fmt: skip
        split = challenger_split(earlier, options.traffic_percent)
        deployment.deployed_model_id = _deploy(
            clients, endpoint.name, version, options, run_id, split
        )
        if on_deployed:
            on_deployed(deployment)
        if not earlier:
            deployment.answer = smoke(
                clients, endpoint=endpoint.name, preset=preset,
                served_model_name=served_model_name,
                deployed_model_id=deployment.deployed_model_id,
            )  # fmt: skip
        log.info("smoke prompt answered: %r", deployment.answer)
    except BaseException:
        rollback(clients, deployment, restore_split=earlier)
        raise
    # Tested and serving its share: from here on nothing rolls the new version back.
    if options.traffic_percent >= 100:
        for old in sorted(earlier):  # a proto map: no order of its own
            try:
                _undeploy(clients, endpoint.name, old, {deployment.deployed_model_id: 100})
                deployment.replaced.append(old)
            except Exception:  # best-effort: the old model stays deployed with no traffic
                log.exception(
                    "could not undeploy %s from %s (it gets no traffic)", old, endpoint.name
                )
                deployment.left.append(old)
    try:
        final = clients.endpoints.get_endpoint(request={"name": endpoint.name})
        deployment.traffic_split = dict(final.traffic_split)
    except Exception:
        log.exception("could not read back the traffic split of %s", endpoint.name)
        deployment.traffic_split = {
            (deployment.deployed_model_id if k == "0" else k): v for k, v in split.items()
        }
    return deployment


def _deploy(
    clients: VertexClients,
    endpoint: str,
    version: str,
    options: DeployOptions,
    run_id: str,
    split: dict[str, int],
) -> str:
    """DeployModel `version` to `endpoint` with `split` ("0": the new model); its deployed id."""
    from google.cloud import aiplatform_v1

    log.info(
        "deploying %s to %s on %s (%s x %s, spot=%s), traffic %s",
        version, endpoint, options.machine_type, options.accelerator_count,
        options.accelerator_type or "no GPU", options.spot, split,
    )  # fmt: skip
    operation = clients.endpoints.deploy_model(
        request=aiplatform_v1.DeployModelRequest(
            endpoint=endpoint,
            deployed_model=_deployed_model(version, options, run_id),
            traffic_split=split,
        )
    )
    return str(operation.result(timeout=DEPLOY_TIMEOUT_S).deployed_model.id)


def smoke_alone(
    clients: VertexClients,
    *,
    version: str,
    options: DeployOptions,
    project: str,
    location: str,
    run_id: str,
    preset: ServingPreset,
    served_model_name: str,
) -> str:
    """The smoke prompt answered by `version` alone: deployed to a temporary endpoint of its own
    (`llmft-smoke-<run>`, created with the run's labels and CMEK key), tested there, then
    undeployed and the endpoint deleted whatever happened. Returns the answer."""
    temporary = DeployOptions(
        **{**options.__dict__, "endpoint": resource_name("smoke", run_id), "traffic_percent": 100}
    )
    endpoint, _ = find_or_create_endpoint(
        clients, options=temporary, project=project, location=location, run_id=run_id
    )
    trial = Deployment(endpoint=endpoint.name, created_endpoint=True)
    try:
        trial.deployed_model_id = _deploy(
            clients, endpoint.name, version, options, run_id, {"0": 100}
        )
        return smoke(
            clients, endpoint=endpoint.name, preset=preset,
            served_model_name=served_model_name, deployed_model_id=trial.deployed_model_id,
        )  # fmt: skip
    finally:
        rollback(clients, trial)


def _undeploy(clients: VertexClients, endpoint: str, deployed_model_id: str, split: dict) -> None:
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
    from google.api_core import exceptions

    try:
        if deployment.deployed_model_id:
            restore = {k: v for k, v in (restore_split or {}).items() if v > 0}
            if restore:
                # Vertex refuses a split naming a model no longer deployed (INVALID_ARGUMENT).
                current = clients.endpoints.get_endpoint(request={"name": deployment.endpoint})
                deployed = {d.id for d in current.deployed_models} - {deployment.deployed_model_id}
                restore = {k: v for k, v in restore.items() if k in deployed}
            _undeploy(
                clients,
                deployment.endpoint,
                deployment.deployed_model_id,
                _rescaled(restore) if restore else {},
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


def undeploy_run(clients: VertexClients, *, project: str, location: str, run_id: str) -> list[str]:
    """Undeploy every deployed model this run deployed (display name `llmft-serve-<run>`) from the
    endpoints of `project`/`location`, and delete the endpoints the run created that serve nothing
    else: the cleanup of a failed or cancelled run whose deploy step could not roll back (killed
    before its undeploy finished). Returns what was removed."""
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    mine = resource_name("serve", run_id)
    run_label = vertex_labels(run_id)
    removed = []
    endpoints = clients.endpoints.list_endpoints(
        request=aiplatform_v1.ListEndpointsRequest(
            parent=f"projects/{project}/locations/{location}"
        )
    )
    for endpoint in endpoints:
        ours = [d.id for d in endpoint.deployed_models if d.display_name == mine]
        for deployed_id in ours:
            rest = {k: v for k, v in endpoint.traffic_split.items() if k != deployed_id and v > 0}
            total = sum(rest.values())
            split = _rescaled(rest) if total else {}
            try:
                _undeploy(clients, endpoint.name, deployed_id, split)
                removed.append(f"deployed model {deployed_id} on {endpoint.name}")
            except exceptions.NotFound:
                pass
        created_here = all(endpoint.labels.get(k) == v for k, v in run_label.items())
        others = [d for d in endpoint.deployed_models if d.id not in ours]
        if created_here and not others:
            try:
                clients.endpoints.delete_endpoint(request={"name": endpoint.name}).result(
                    timeout=DEPLOY_TIMEOUT_S
                )
                removed.append(f"endpoint {endpoint.name}")
            except exceptions.NotFound:
                pass
    return removed


def _rescaled(split: dict[str, int]) -> dict[str, int]:
    """`split` scaled to add up to 100 (largest remainders first)."""
    total = sum(split.values())
    exact = {k: v * 100 / total for k, v in split.items()}
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[: 100 - sum(out.values())]:
        out[k] += 1
    return out
