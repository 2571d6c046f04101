"""components/serving/registry.py against the aiplatform SDK's own request objects, offline.

The SDK's GAPIC ModelServiceClient is the cloud boundary: its methods are replaced by an in-memory
registry that records every request proto (UploadModelRequest, ListModelsRequest, ...) and answers
with real response protos; everything above it (aiplatform.Model.upload, Model.list,
ModelRegistry) is the real SDK code with anonymous credentials.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakes.vertex import FakeModelService
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.types import model_service

from components.serving import registry

PROJECT, LOCATION = "my-project", "us-central1"
PARENT = f"projects/{PROJECT}/locations/{LOCATION}"
IMAGE = "us-docker.pkg.dev/my-project/serving/pytorch-vllm-serve:0.11.0"


def _register(**overrides: Any) -> registry.RegisteredVersion:
    """`register_model` with test defaults; `serving_container_<field>=` set the container's."""
    prefix = "serving_container_"
    serving = {
        k.removeprefix(prefix): overrides.pop(k) for k in list(overrides) if k.startswith(prefix)
    }
    kwargs: dict[str, Any] = dict(
        artifact_uri="gs://bucket/runs/run-1/model",
        display_name="tiny-llama-ft",
        serving=registry.ServingContainer(**{"image_uri": IMAGE, **serving}),
        run_id="fine-tune-20261202-1",
        project=PROJECT,
        location=LOCATION,
        credentials=AnonymousCredentials(),
    )
    kwargs.update(overrides)
    return registry.register_model(**kwargs)


def test_register_new_model_builds_upload_request(fake_registry: FakeModelService) -> None:
    version = _register(
        serving_container_ports=[8080],
        serving_container_predict_route="/predict",
        serving_container_health_route="/health",
        serving_container_args=["--max-model-len", "4096"],
        labels={"team": "nlp"},
        description="first fine-tune",
    )
    (request,) = [
        r for r in fake_registry.requests if isinstance(r, model_service.UploadModelRequest)
    ]
    assert request.parent == PARENT
    assert request.parent_model == ""
    model = request.model
    assert model.display_name == "tiny-llama-ft"
    assert model.artifact_uri == "gs://bucket/runs/run-1/model"
    assert model.container_spec.image_uri == IMAGE
    assert list(model.container_spec.args) == ["--max-model-len", "4096"]
    assert [p.container_port for p in model.container_spec.ports] == [8080]
    assert model.container_spec.predict_route == "/predict"
    assert model.container_spec.health_route == "/health"
    assert dict(model.labels) == {
        "team": "nlp",
        "managed-by": "llmft",
        "llmft-run-id": "fine-tune-20261202-1",
    }
    assert list(model.version_aliases) == ["default"]
    assert model.version_description == "first fine-tune"
    assert version.resource_name == f"{PARENT}/models/1000"
    assert version.version_id == "1"
    assert version.artifact_uri == "gs://bucket/runs/run-1/model"


def test_register_as_new_version_of_parent(fake_registry: FakeModelService) -> None:
    first = _register()
    aliases = ["champion"]
    second = _register(
        artifact_uri="gs://bucket/runs/run-2/model",
        run_id="run-2",
        parent_model="1000",
        version_aliases=aliases,
    )
    uploads = [r for r in fake_registry.requests if isinstance(r, model_service.UploadModelRequest)]
    # A bare id is expanded to the full resource name the API requires.
    assert uploads[1].parent_model == first.resource_name
    assert list(uploads[1].model.version_aliases) == ["champion", "default"]
    assert aliases == ["champion"], "the caller's list must not be mutated"
    assert second.resource_name == first.resource_name
    assert second.version_id == "2"
    assert second.labels["llmft-run-id"] == "run-2"


def test_latest_registered_version_is_the_champion(fake_registry: FakeModelService) -> None:
    assert (
        registry.latest_registered_version(
            project=PROJECT, location=LOCATION, display_name="tiny-llama-ft"
        )
        is None
    )
    first = _register()
    _register(
        artifact_uri="gs://bucket/runs/run-2/model",
        run_id="run-2",
        parent_model=first.resource_name,
    )
    by_name = registry.latest_registered_version(
        project=PROJECT, location=LOCATION, display_name="tiny-llama-ft"
    )
    assert by_name is not None
    assert (by_name.version_id, by_name.artifact_uri) == ("2", "gs://bucket/runs/run-2/model")
    list_request = [
        r for r in fake_registry.requests if isinstance(r, model_service.ListModelsRequest)
    ][-1]
    assert list_request.parent == PARENT
    assert list_request.filter == 'display_name="tiny-llama-ft"'
    versions_request = [
        r for r in fake_registry.requests if isinstance(r, model_service.ListModelVersionsRequest)
    ][-1]
    assert versions_request.name == first.resource_name
    by_parent = registry.latest_registered_version(
        project=PROJECT, location=LOCATION, parent_model=first.resource_name
    )
    assert by_parent == by_name
    missing = registry.latest_registered_version(
        project=PROJECT, location=LOCATION, parent_model=f"{PARENT}/models/999"
    )
    assert missing is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"artifact_uri": "/local/model"}, "must be a gs:// directory"),
        ({"serving_container_image_uri": "vllm/vllm-openai:latest"}, "uses :latest"),
        ({"labels": {"Team": "NLP"}}, "label key 'Team'"),
    ],
)
def test_register_rejects_bad_inputs_before_calling_vertex(
    fake_registry: FakeModelService, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _register(**overrides)
    assert fake_registry.requests == []


def test_register_collects_all_errors(fake_registry: FakeModelService) -> None:
    with pytest.raises(ValueError) as info:
        _register(artifact_uri="model", serving_container_image_uri="", display_name="")
    text = str(info.value)
    assert (
        "gs://" in text
        and "serving_container_image_uri is empty" in text
        and "display_name" in text
    )


def test_register_the_trained_model_by_uri(fake_registry: FakeModelService) -> None:
    """The `register` component's entry: display name -> new model, then versions of it."""
    from components.params.step_params import request_of
    from components.steps.register import COMPONENT as REGISTER_STEP
    from components.steps.register import run as register

    first = register(request_of(REGISTER_STEP, model_uri="gs://bucket/runs/run-1/train/model", base_model="gs://bucket/base",
        run_id="run-1", project=PROJECT, region=LOCATION, registered_model="tiny-llama-ft",
        serving_image=IMAGE,
    ))  # fmt: skip
    assert first == f"{PARENT}/models/1000@1"
    second = register(request_of(REGISTER_STEP, model_uri="gs://bucket/runs/run-2/train/model", base_model="", run_id="run-2",
        project=PROJECT, region=LOCATION, registered_model="tiny-llama-ft", serving_image=IMAGE,
    ))  # fmt: skip
    assert second == f"{PARENT}/models/1000@2"
    uploads = [r for r in fake_registry.requests if isinstance(r, model_service.UploadModelRequest)]
    assert uploads[0].parent_model == "" and uploads[1].parent_model == f"{PARENT}/models/1000"
    assert uploads[0].model.artifact_uri == "gs://bucket/runs/run-1/train/model"
    assert uploads[1].model.artifact_uri == "gs://bucket/runs/run-2/train/model"
    assert uploads[0].model.description == "fine-tuned by llmft run run-1 from gs://bucket/base"
    assert uploads[1].model.display_name == "tiny-llama-ft"
    assert uploads[1].model.labels["llmft-run-id"] == "run-2"
    # By resource name too, and "latest-registered" resolves to the newest files.
    third = register(request_of(REGISTER_STEP, model_uri="gs://bucket/runs/run-3/train/model", base_model="", run_id="run-3",
        project=PROJECT, region=LOCATION, registered_model=f"{PARENT}/models/1000", serving_image=IMAGE,
    ))  # fmt: skip
    assert third == f"{PARENT}/models/1000@3"
    assert (
        registry.latest_registered_model_uri(
            registered_model="tiny-llama-ft", project=PROJECT, region=LOCATION
        )
        == "gs://bucket/runs/run-3/train/model"
    )


def test_latest_registered_model_uri_errors(fake_registry: FakeModelService) -> None:
    with pytest.raises(ValueError, match="has no registered version with files yet"):
        registry.latest_registered_model_uri(
            registered_model="never-registered", project=PROJECT, region=LOCATION
        )
    with pytest.raises(ValueError, match="does not exist in my-project/us-central1"):
        registry.latest_registered_model_uri(
            registered_model=f"{PARENT}/models/424242", project=PROJECT, region=LOCATION
        )


def test_untagged_serving_image_is_allowed_with_a_warning(
    fake_registry: FakeModelService, caplog: pytest.LogCaptureFixture
) -> None:
    image = "us-docker.pkg.dev/deeplearning-platform-release/gcr.io/huggingface-text-generation-inference-cu124.2-4.ubuntu2204.py311"
    with caplog.at_level("WARNING", logger="components.serving.registry"):
        _register(serving_container_image_uri=image)
    assert "has no tag or digest" in caplog.text
