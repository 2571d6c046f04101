"""Vertex AI, faked at its two client boundaries.

- the CustomJob launcher's REST transport: mount `fakes.recording.FakeHttp` on its session;
- `FakeModelService`: an in-memory Model Registry behind ModelServiceClient's methods
  (`install_model_registry`; the `fake_registry` fixture in tests/conftest.py);
- `FakeVertex`: replaces methods of the GAPIC service clients (PipelineService, ScheduleService,
  MetadataService: the gRPC boundary) and records the request protos the real `aiplatform` SDK
  builds.
"""

from __future__ import annotations

from typing import Any, ClassVar

from google.api_core import exceptions, operation
from google.cloud.aiplatform.utils import gcs_utils
from google.cloud.aiplatform_v1.services.metadata_service import MetadataServiceClient
from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient
from google.cloud.aiplatform_v1.services.schedule_service import ScheduleServiceClient
from google.cloud.aiplatform_v1.types import (
    Context,
    CreatePipelineJobRequest,
    CreateScheduleRequest,
    MetadataStore,
    PipelineJob,
    PipelineState,
    Schedule,
    UpdateScheduleRequest,
    model_service,
)
from google.cloud.aiplatform_v1.types import model as gca_model
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, timestamp_pb2


class FakeVertex:
    """Records the request protos the aiplatform SDK sends to PipelineService, ScheduleService
    and MetadataService, and answers like them (in memory)."""

    _METHODS: ClassVar[dict[type, tuple[str, ...]]] = {
        PipelineServiceClient: ("create_pipeline_job", "get_pipeline_job"),
        ScheduleServiceClient: (
            "create_schedule", "list_schedules", "update_schedule", "pause_schedule",
            "resume_schedule", "delete_schedule",
        ),
        MetadataServiceClient: ("get_metadata_store", "get_context", "add_context_children"),
    }  # fmt: skip

    def __init__(self, monkeypatch: Any) -> None:
        self.jobs: list[Any] = []  # CreatePipelineJobRequest
        self.schedules: dict[str, Any] = {}  # name -> Schedule
        self.created_schedules: list[Any] = []  # CreateScheduleRequest
        self.updates: list[Any] = []  # UpdateScheduleRequest
        self.calls: list[tuple[str, str]] = []
        self.experiment_children: list[tuple[str, list[str]]] = []
        self.states = ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"]
        for cls, names in self._METHODS.items():
            for name in names:
                monkeypatch.setattr(
                    cls, name, lambda client, *a, _m=name, **k: getattr(self, _m)(*a, **k)
                )
        # PipelineJob.submit creates the pipeline-root bucket through Cloud Storage first.
        monkeypatch.setattr(
            gcs_utils,
            "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
            lambda **kw: None,
        )

    def create_pipeline_job(self, request: Any = None, **kw: Any) -> Any:
        req = CreatePipelineJobRequest(request) if request else CreatePipelineJobRequest(
            parent=kw["parent"], pipeline_job=kw["pipeline_job"],
            pipeline_job_id=kw.get("pipeline_job_id"),
        )  # fmt: skip
        self.jobs.append(req)
        job = PipelineJob(req.pipeline_job)
        job.name = f"{req.parent}/pipelineJobs/{req.pipeline_job_id}"
        job.state = PipelineState.PIPELINE_STATE_PENDING
        job.job_detail.pipeline_run_context.name = (
            f"{req.parent}/metadataStores/default/contexts/{req.pipeline_job_id}"
        )
        return job

    def get_pipeline_job(self, request: Any = None, *, name: str, **kw: Any) -> Any:
        job = PipelineJob(self.jobs[-1].pipeline_job, name=name)
        job.job_detail.pipeline_run_context.name = f"{name}-context"
        state = self.states.pop(0) if self.states else "PIPELINE_STATE_SUCCEEDED"
        job.state = PipelineState[state]
        return job

    def create_schedule(self, request: Any = None, **kw: Any) -> Any:
        req = (
            CreateScheduleRequest(request)
            if request
            else CreateScheduleRequest(parent=kw["parent"], schedule=kw["schedule"])
        )
        self.created_schedules.append(req)
        schedule = Schedule(req.schedule)
        schedule.name = f"{req.parent}/schedules/{len(self.schedules) + 100}"
        schedule.state = Schedule.State.ACTIVE
        self.schedules[schedule.name] = schedule
        return schedule

    def list_schedules(self, request: Any = None, **kw: Any) -> Any:
        self.calls.append(("list_schedules", request.filter))
        wanted = request.filter.partition('"')[2].rstrip('"') if request.filter else None
        return [s for s in self.schedules.values() if wanted in (None, s.display_name)]

    def update_schedule(self, request: Any = None, **kw: Any) -> Any:
        req = UpdateScheduleRequest(schedule=kw["schedule"], update_mask=kw["update_mask"])
        self.updates.append(req)
        return req.schedule

    def _by_name(self, method: str, name: str) -> None:
        self.calls.append((method, name))
        if name not in self.schedules:
            raise exceptions.NotFound(f"Schedule {name} not found")

    def pause_schedule(self, request: Any = None, *, name: str = "", **kw: Any) -> None:
        self._by_name("pause_schedule", name)

    def resume_schedule(self, request: Any = None, *, name: str = "", **kw: Any) -> None:
        self._by_name("resume_schedule", name)

    def delete_schedule(self, request: Any = None, *, name: str = "", **kw: Any) -> None:
        self._by_name("delete_schedule", name)

    def get_metadata_store(self, request: Any = None, *, name: str, **kw: Any) -> Any:
        return MetadataStore(name=name)

    def get_context(self, request: Any = None, *, name: str, **kw: Any) -> Any:
        return Context(
            name=name, schema_title="system.Experiment", metadata={"experiment_deleted": False}
        )

    def add_context_children(
        self, request: Any = None, *, context: str, child_contexts: list[str], **kw: Any
    ) -> None:
        self.experiment_children.append((context, list(child_contexts)))


class FakeModelService:
    """An in-memory Model Registry behind ModelServiceClient's methods (records request protos,
    answers with real response protos). `parent`: `projects/P/locations/L`."""

    def __init__(self, parent: str) -> None:
        self.parent = parent
        self.requests: list[Any] = []
        self.models: dict[str, list[gca_model.Model]] = {}  # model name -> versions

    def _add(self, model: gca_model.Model, parent_model: str | None) -> gca_model.Model:
        name = parent_model or f"{self.parent}/models/{1000 + len(self.models)}"
        versions = self.models.setdefault(name, [])
        stored = gca_model.Model(model)
        stored.name = name
        stored.version_id = str(len(versions) + 1)
        stored.version_create_time = timestamp_pb2.Timestamp(seconds=1_700_000_000 + len(versions))
        if parent_model and versions:
            stored.display_name = versions[0].display_name
        if "default" in stored.version_aliases:
            for other in versions:
                other.version_aliases = [a for a in other.version_aliases if a != "default"]
        versions.append(stored)
        return stored

    def upload_model(self, request: Any = None, **_: Any) -> operation.Operation:
        self.requests.append(request)
        stored = self._add(request.model, request.parent_model or None)
        response = model_service.UploadModelResponse(
            model=stored.name, model_version_id=stored.version_id
        )
        packed = any_pb2.Any()
        packed.Pack(model_service.UploadModelResponse.pb(response))
        op = operations_pb2.Operation(
            name=f"{stored.name}/operations/1", done=True, response=packed
        )
        return operation.Operation(
            op,
            refresh=lambda: op,
            cancel=lambda: None,
            result_type=model_service.UploadModelResponse,
            metadata_type=model_service.UploadModelOperationMetadata,
        )

    def get_model(self, request: Any = None, name: str | None = None, **_: Any) -> gca_model.Model:
        full = name or model_service.GetModelRequest(request).name
        self.requests.append(model_service.GetModelRequest(name=full))
        return self._lookup(full)

    def _lookup(self, full: str) -> gca_model.Model:
        """The version `full` names (`M`, `M@id` or `M@alias`), without recording a request."""
        base, _, version = full.partition("@")
        versions = self.models.get(base)
        if not versions:
            raise exceptions.NotFound(f"model {full} not found")
        for v in versions:
            if version in (v.version_id, *v.version_aliases) or (
                not version and "default" in v.version_aliases
            ):
                return v
        raise exceptions.NotFound(f"version {full} not found")

    def list_models(self, request: Any = None, **_: Any) -> list[gca_model.Model]:
        # Like the GAPIC client, accept a dict (the SDK's list helpers pass one) or the proto.
        request = model_service.ListModelsRequest(request)
        self.requests.append(request)
        wanted = request.filter.partition("=")[2].strip('"')
        found = [
            next(v for v in versions if "default" in v.version_aliases)
            for versions in self.models.values()
            if versions[0].display_name == wanted
        ]
        return list(reversed(found))

    def list_model_versions(self, request: Any = None, **_: Any) -> list[gca_model.Model]:
        request = model_service.ListModelVersionsRequest(request)
        self.requests.append(request)
        if request.name not in self.models:
            raise exceptions.NotFound(f"model {request.name} not found")
        return list(self.models[request.name])

    def import_model_evaluation(self, request: Any = None, **_: Any) -> Any:
        request = model_service.ImportModelEvaluationRequest(request)
        self.requests.append(request)
        self._lookup(request.parent)  # NotFound for an unknown version, like the service
        evaluation = type(request.model_evaluation)(request.model_evaluation)
        evaluation.name = f"{request.parent.partition('@')[0]}/evaluations/{len(self.requests)}"
        return evaluation

    def merge_version_aliases(self, request: Any = None, **_: Any) -> gca_model.Model:
        request = model_service.MergeVersionAliasesRequest(request)
        self.requests.append(request)
        version = self._lookup(request.name)
        aliases = list(version.version_aliases)
        for alias in request.version_aliases:
            if alias.startswith("-"):
                aliases = [a for a in aliases if a != alias[1:]]
            else:
                holders = [
                    v
                    for v in self.models[request.name.partition("@")[0]]
                    if alias in v.version_aliases and v is not version
                ]
                if holders:  # the service refuses an alias another version holds
                    raise exceptions.FailedPrecondition(f"alias {alias} is already in use")
                aliases.append(alias)
        version.version_aliases = aliases
        return version


def install_model_registry(monkeypatch: Any, project: str, location: str) -> FakeModelService:
    """Put a `FakeModelService` behind ModelServiceClient and give the SDK a fresh config with
    anonymous credentials (it resolves some objects with its global credentials)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.aiplatform import initializer
    from google.cloud.aiplatform_v1.services.model_service import ModelServiceClient

    fake = FakeModelService(f"projects/{project}/locations/{location}")
    for method in (
        "upload_model", "get_model", "list_models", "list_model_versions",
        "import_model_evaluation", "merge_version_aliases",
    ):  # fmt: skip
        monkeypatch.setattr(
            ModelServiceClient, method, lambda self, *a, _m=method, **k: getattr(fake, _m)(*a, **k)
        )
    monkeypatch.setattr(initializer, "global_config", initializer._Config())
    initializer.global_config.init(
        project=project, location=location, credentials=AnonymousCredentials()
    )
    return fake


class _Done:
    """A finished long-running operation (`.result()` returns its value)."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def result(self, timeout: Any = None) -> Any:
        return self.value


class FakeEndpoints:
    """EndpointService and PredictionService in memory, for `components.serving.endpoints.VertexClients`
    (`clients()`): records every request proto and answers with real response protos.

    `answers` maps a deployed model id to what its server returns for a chat request (None:
    a response without a chat completion, as a broken server gives); `predict_order` is the order in which a split endpoint's deployed
    models answer predict calls (default: the newest).
    """

    def __init__(self, parent: str) -> None:
        from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint

        self.parent = parent
        self.requests: list[Any] = []
        self.endpoints: dict[str, gca_endpoint.Endpoint] = {}
        self.answers: dict[str, str | None] = {}
        self.predict_order: list[str] = []
        self._ids = 0

    def clients(self) -> Any:
        from components.serving.endpoints import VertexClients

        return VertexClients(endpoints=self, predictions=self)

    def _next_id(self, start: int) -> str:
        self._ids += 1
        return str(start + self._ids)

    def add_endpoint(self, display_name: str, deployed: dict[str, int]) -> str:
        """An existing endpoint serving `deployed` (id -> traffic percent)."""
        from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint

        name = f"{self.parent}/endpoints/{self._next_id(500)}"
        self.endpoints[name] = gca_endpoint.Endpoint(
            name=name,
            display_name=display_name,
            deployed_models=[gca_endpoint.DeployedModel(id=i) for i in deployed],
            traffic_split=deployed,
        )
        return name

    def list_endpoints(self, request: Any = None, **_: Any) -> list[Any]:
        from google.cloud.aiplatform_v1.types import endpoint_service

        request = endpoint_service.ListEndpointsRequest(request)
        self.requests.append(request)
        if not request.filter:
            return list(self.endpoints.values())
        wanted = request.filter.partition("=")[2].strip('"')
        return [e for e in self.endpoints.values() if e.display_name == wanted]

    def get_endpoint(self, request: Any = None, **_: Any) -> Any:
        from google.cloud.aiplatform_v1.types import endpoint_service

        request = endpoint_service.GetEndpointRequest(request)
        self.requests.append(request)
        if request.name not in self.endpoints:
            raise exceptions.NotFound(f"endpoint {request.name} not found")
        return self.endpoints[request.name]

    def create_endpoint(self, request: Any = None, **_: Any) -> _Done:
        from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint
        from google.cloud.aiplatform_v1.types import endpoint_service

        request = endpoint_service.CreateEndpointRequest(request)
        self.requests.append(request)
        created = gca_endpoint.Endpoint(request.endpoint)
        created.name = f"{request.parent}/endpoints/{self._next_id(500)}"
        self.endpoints[created.name] = created
        return _Done(created)

    def deploy_model(self, request: Any = None, **_: Any) -> _Done:
        from google.cloud.aiplatform_v1.types import endpoint as gca_endpoint
        from google.cloud.aiplatform_v1.types import endpoint_service

        request = endpoint_service.DeployModelRequest(request)
        self.requests.append(request)
        endpoint = self.endpoints[request.endpoint]
        deployed = gca_endpoint.DeployedModel(request.deployed_model)
        deployed.id = self._next_id(9000)
        endpoint.deployed_models.append(deployed)
        split = dict(request.traffic_split)
        split[deployed.id] = split.pop("0", 0)
        endpoint.traffic_split = split
        self.answers.setdefault(deployed.id, "4")
        return _Done(endpoint_service.DeployModelResponse(deployed_model=deployed))

    def undeploy_model(self, request: Any = None, **_: Any) -> _Done:
        from google.cloud.aiplatform_v1.types import endpoint_service

        request = endpoint_service.UndeployModelRequest(request)
        self.requests.append(request)
        endpoint = self.endpoints[request.endpoint]
        kept = [d for d in endpoint.deployed_models if d.id != request.deployed_model_id]
        del endpoint.deployed_models[:]
        endpoint.deployed_models.extend(kept)
        endpoint.traffic_split = dict(request.traffic_split)
        return _Done(endpoint_service.UndeployModelResponse())

    def delete_endpoint(self, request: Any = None, **_: Any) -> _Done:
        from google.cloud.aiplatform_v1.types import endpoint_service

        request = endpoint_service.DeleteEndpointRequest(request)
        self.requests.append(request)
        self.endpoints.pop(request.name, None)
        return _Done()

    def _answering(self, endpoint: str) -> str:
        if self.predict_order:
            return self.predict_order.pop(0)
        endpoint_ = self.endpoints[endpoint]
        serving = [
            d.id for d in endpoint_.deployed_models if endpoint_.traffic_split.get(d.id, 0) > 0
        ]
        return serving[-1]  # the newest deployed model that gets traffic

    def predict(
        self, request: Any = None, *, endpoint: str = "", instances: Any = (), **_: Any
    ) -> Any:
        from google.cloud.aiplatform_v1.types import prediction_service

        # Like the GAPIC client: a request, or flattened fields merged into one.
        request = prediction_service.PredictRequest(request)
        if endpoint:
            request.endpoint = endpoint
        request.instances.extend(instances)
        self.requests.append(request)
        model = self._answering(request.endpoint)
        response = prediction_service.PredictResponse(deployed_model_id=model)
        response.predictions.extend([self._completion(self.answers.get(model))])
        return response

    @staticmethod
    def _completion(content: str | None) -> dict[str, Any]:
        if content is None:
            return {"error": "model not loaded"}
        return {"choices": [{"message": {"role": "assistant", "content": content}}]}

    def raw_predict(self, request: Any = None, **_: Any) -> Any:
        import json

        from google.api import httpbody_pb2
        from google.cloud.aiplatform_v1.types import prediction_service

        request = prediction_service.RawPredictRequest(request)
        self.requests.append(request)
        body = self._completion(self.answers.get(self._answering(request.endpoint)))
        return httpbody_pb2.HttpBody(
            data=json.dumps(body).encode(), content_type="application/json"
        )


class FakeMetadata:
    """Vertex ML Metadata (what Vertex AI Experiments stores runs in), in memory behind
    MetadataServiceClient's methods (`install`): records every request proto, keeps contexts."""

    METHODS = (
        "get_metadata_store", "create_metadata_store", "get_context", "create_context",
        "update_context", "add_context_children", "list_contexts", "get_artifact",
        "create_artifact", "list_artifacts", "add_context_artifacts_and_executions",
        "list_executions",
    )  # fmt: skip

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.contexts: dict[str, Any] = {}
        self.unexpected: list[str] = []

    def install(self, monkeypatch: Any) -> FakeMetadata:
        for name in self.METHODS:
            monkeypatch.setattr(
                MetadataServiceClient,
                name,
                lambda client, *a, _m=name, **k: getattr(self, _m)(*a, **k),
            )
        return self

    @staticmethod
    def _req(cls: Any, request: Any, kw: dict[str, Any]) -> Any:
        fields = {k: v for k, v in kw.items() if k not in ("retry", "timeout", "metadata")}
        return cls(request) if request is not None else cls(**fields)

    def get_metadata_store(self, request: Any = None, **kw: Any) -> Any:
        from google.cloud.aiplatform_v1.types import metadata_service

        request = self._req(metadata_service.GetMetadataStoreRequest, request, kw)
        self.requests.append(request)
        return MetadataStore(name=request.name)

    def create_metadata_store(self, request: Any = None, **kw: Any) -> Any:
        raise AssertionError("the default metadata store exists")

    def get_context(self, request: Any = None, **kw: Any) -> Any:
        from google.cloud.aiplatform_v1.types import metadata_service

        request = self._req(metadata_service.GetContextRequest, request, kw)
        self.requests.append(request)
        if request.name not in self.contexts:
            raise exceptions.NotFound(f"context {request.name} not found")
        return self.contexts[request.name]

    def create_context(self, request: Any = None, **kw: Any) -> Any:
        from google.cloud.aiplatform_v1.types import metadata_service

        request = self._req(metadata_service.CreateContextRequest, request, kw)
        self.requests.append(request)
        name = f"{request.parent}/contexts/{request.context_id}"
        if name in self.contexts:
            raise exceptions.AlreadyExists(f"context {name} exists")
        context = Context(request.context)
        context.name = name
        self.contexts[name] = context
        return context

    def update_context(self, request: Any = None, **kw: Any) -> Any:
        from google.cloud.aiplatform_v1.types import metadata_service

        request = self._req(metadata_service.UpdateContextRequest, request, kw)
        self.requests.append(request)
        self.contexts[request.context.name] = Context(request.context)
        return self.contexts[request.context.name]

    def add_context_children(self, request: Any = None, **kw: Any) -> Any:
        from google.cloud.aiplatform_v1.types import metadata_service

        request = self._req(metadata_service.AddContextChildrenRequest, request, kw)
        self.requests.append(request)
        return metadata_service.AddContextChildrenResponse()

    def list_contexts(self, request: Any = None, **kw: Any) -> Any:
        from google.cloud.aiplatform_v1.types import metadata_service

        request = self._req(metadata_service.ListContextsRequest, request, kw)
        self.requests.append(request)
        return []

    def _unexpected(self, name: str) -> Any:
        self.unexpected.append(name)
        raise AssertionError(f"unexpected MetadataService call {name}")

    def get_artifact(self, request: Any = None, **kw: Any) -> Any:
        from google.cloud.aiplatform_v1.types import metadata_service

        # Resuming a run looks for the pre-2022 "run as artifact" form first; there is none.
        request = self._req(metadata_service.GetArtifactRequest, request, kw)
        self.requests.append(request)
        raise exceptions.NotFound(f"artifact {request.name} not found")

    def create_artifact(self, request: Any = None, **kw: Any) -> Any:
        return self._unexpected("create_artifact")

    def list_artifacts(self, request: Any = None, **kw: Any) -> Any:
        return self._unexpected("list_artifacts")

    def add_context_artifacts_and_executions(self, request: Any = None, **kw: Any) -> Any:
        return self._unexpected("add_context_artifacts_and_executions")

    def list_executions(self, request: Any = None, **kw: Any) -> Any:
        return self._unexpected("list_executions")
