"""Register a fine-tuned model in Vertex AI Model Registry, and find the current champion.

`register_model` uploads the exported Hugging Face directory (already on GCS) with the serving
container the user chose, labelled with the run id (so cleanup and audits can find what a run
produced), as a new version of an existing model when `parent_model` is given. The pipeline runs
it only when the evaluation gate passed (dsl.If).

`latest_registered_version` finds the newest version of a registered model: the champion that a
recurring fine-tune's evaluation compares against. `versions_by_run` lists every version with its
run label and aliases (`llmft history`: which run's model is registered, which holds the
`champion` alias). All go through the aiplatform SDK and its GAPIC client (Model.upload,
Model.list, ModelRegistry, ModelServiceClient), never hand-built REST calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from components.launchers.vertex import api_endpoint
from components.runtime.run_identity import (
    GCP_LABEL_KEY,
    GCP_LABEL_VALUE,
    VERTEX_RUN_LABEL,
    vertex_labels,
)
from components.serving.presets import ServingContainer

log = logging.getLogger(__name__)


@dataclass
class RegisteredVersion:
    """One version of a model in the registry."""

    resource_name: str
    """projects/P/locations/L/models/ID (without the version)."""
    version_id: str
    display_name: str
    artifact_uri: str
    """Where the version's files are (gs://): what evaluation loads as the champion."""
    labels: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)

    @property
    def versioned_name(self) -> str:
        return f"{self.resource_name}@{self.version_id}"


def _version_of(model: Any) -> RegisteredVersion:
    return RegisteredVersion(
        resource_name=model.resource_name,
        version_id=str(model.version_id),
        display_name=model.display_name,
        artifact_uri=model.uri or "",
        labels=dict(model.labels or {}),
        aliases=list(model.version_aliases or []),
    )


def _label_errors(labels: dict[str, str]) -> list[str]:
    errors = []
    for key, value in labels.items():
        if not GCP_LABEL_KEY.match(key):
            errors.append(
                f"label key {key!r} is not valid on Vertex AI (lowercase, starts with a letter, <= 63 chars)"
            )
        if not GCP_LABEL_VALUE.match(value):
            errors.append(
                f"label value {value!r} of {key!r} is not valid on Vertex AI (lowercase letters, digits, '_', '-', <= 63 chars)"
            )
    return errors


def _tag(image: str) -> str | None:
    """The image's tag ("" for a digest reference), None when it has neither."""
    if "@" in image:
        return ""
    _, sep, tag = image.rpartition("/")[2].partition(":")
    return tag if sep else None


def _registration_errors(artifact_uri: str, display_name: str, image: str) -> list[str]:
    """What Vertex would refuse, or what would make a version unreproducible (an unpinned image)."""
    errors = []
    if not artifact_uri.startswith("gs://"):
        errors.append(
            f"artifact_uri {artifact_uri!r} must be a gs:// directory: Vertex AI serves models "
            "from Cloud Storage (point the trainer's output at a bucket)"
        )
    if not image:
        errors.append("serving_container_image_uri is empty: pass the prediction container image")
    elif _tag(image) == "latest":
        errors.append(
            f"serving container {image!r} uses :latest: pin a version tag "
            "or digest so a registered version always serves with the same container"
        )
    elif _tag(image) is None:
        # Google's prebuilt serving images carry the version in the repository name and are
        # documented without a tag, so an untagged image is allowed, with a warning.
        log.warning("serving container %s has no tag or digest", image)
    if not display_name:
        errors.append("display_name is empty: name the registry model")
    return errors


def register_model(
    *,
    artifact_uri: str,
    display_name: str,
    serving: ServingContainer,
    run_id: str,
    project: str,
    location: str,
    parent_model: str | None = None,
    description: str | None = None,
    version_aliases: list[str] | None = None,
    is_default_version: bool = True,
    labels: dict[str, str] | None = None,
    credentials: Any = None,
) -> RegisteredVersion:
    """Upload the model at `artifact_uri` to Vertex AI Model Registry.

    Args:
        artifact_uri: gs:// directory of the exported model (the trainer's output).
        display_name: the registry model's display name.
        serving: the prediction container Vertex starts with the model files.
        run_id: the pipeline run id; the version is labelled with it.
        project: Google Cloud project.
        location: Vertex AI region.
        parent_model: resource name or id of an existing model: upload as its new version.
        description: version description.
        version_aliases: extra aliases for the new version (e.g. ["champion"]).
        is_default_version: make the new version the model's default (what serving picks).
        labels: extra labels; the run-id labels are always added.
        credentials: google-auth credentials; default: the environment's.
    """
    from google.cloud import aiplatform

    all_labels = {**(labels or {}), **vertex_labels(run_id)}
    errors = _label_errors(all_labels)
    errors += _registration_errors(artifact_uri, display_name, serving.image_uri)
    if errors:
        raise ValueError("cannot register the model: " + "; ".join(errors))

    log.info(
        "registering %s as %s (%s) with %s, labels %s",
        artifact_uri,
        f"a new version of {parent_model}" if parent_model else "a new model",
        display_name,
        serving.image_uri,
        all_labels,
    )
    model = aiplatform.Model.upload(
        display_name=display_name,
        artifact_uri=artifact_uri,
        parent_model=parent_model or None,
        is_default_version=is_default_version,
        # The SDK appends "default" to the list it is given: pass a copy, not the caller's list.
        version_aliases=list(version_aliases) if version_aliases else None,
        version_description=description,
        description=description,
        **serving.upload_arguments(),
        labels=all_labels,
        project=project,
        location=location,
        credentials=credentials,
        sync=True,
    )
    version = _version_of(model)
    log.info("registered %s", version.versioned_name)
    return version


def find_model(
    *, display_name: str, project: str, location: str, credentials: Any = None
) -> str | None:
    """Resource name of the newest registry model called `display_name`, or None."""
    from google.cloud import aiplatform

    models = aiplatform.Model.list(
        filter=f'display_name="{display_name}"',
        order_by="create_time desc",
        project=project,
        location=location,
        credentials=credentials,
    )
    return models[0].resource_name if models else None


def latest_registered_version(
    *,
    project: str,
    location: str,
    parent_model: str | None = None,
    display_name: str | None = None,
    credentials: Any = None,
) -> RegisteredVersion | None:
    """The most recently created version of a registered model, or None when there is none yet.

    The model is `parent_model` (resource name or id) or else the newest model called
    `display_name`: the first run of a recurring fine-tune has no champion, and that is not an
    error.
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform

    if not parent_model and not display_name:
        raise ValueError("pass parent_model or display_name to find the registered model")
    name = parent_model or find_model(
        display_name=display_name or "", project=project, location=location, credentials=credentials
    )
    if not name:
        return None
    registry = aiplatform.models.ModelRegistry(
        name, project=project, location=location, credentials=credentials
    )
    try:
        versions = registry.list_versions()
    except exceptions.NotFound:
        return None
    if not versions:
        return None

    # Version ids are increasing integers; creation time breaks nothing but orders the rest.
    def order(v: Any) -> tuple[int, Any]:
        return (int(v.version_id) if str(v.version_id).isdigit() else -1, v.version_create_time)

    latest = max(versions, key=order)
    return _version_of(registry.get_model(version=str(latest.version_id)))


def _is_resource_ref(model: str) -> bool:
    """A model resource name or numeric id, as opposed to a display name."""
    return model.startswith("projects/") or model.isdigit()


def resolve_model(
    *, model: str, project: str, location: str, credentials: Any = None
) -> tuple[str | None, str]:
    """(resource name or None when no such model exists yet, display name) of `model`.

    `model` is a resource name, a numeric id, or a display name; a resource name or id that does
    not exist is a user error, a display name that does not exist means "create it".
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform

    if not model:
        raise ValueError(
            "registered model is empty: pass a Vertex AI model resource name or display name"
        )
    if not _is_resource_ref(model):
        return find_model(
            display_name=model, project=project, location=location, credentials=credentials
        ), model
    try:
        found = aiplatform.Model(
            model_name=model, project=project, location=location, credentials=credentials
        )
    except exceptions.NotFound:
        raise ValueError(
            f"registered model {model!r} does not exist in {project}/{location}: pass an existing "
            "model's resource name, or a display name to create a new model"
        ) from None
    return found.resource_name, found.display_name


def latest_registered_model_uri(
    *, registered_model: str, project: str, region: str, credentials: Any = None
) -> str:
    """The artifact URI of `registered_model`'s latest version (for "latest-registered")."""
    name, display_name = resolve_model(
        model=registered_model, project=project, location=region, credentials=credentials
    )
    version = (
        latest_registered_version(
            project=project, location=region, parent_model=name, credentials=credentials
        )
        if name
        else None
    )
    if version is None or not version.artifact_uri:
        raise ValueError(
            f"model {display_name!r} has no registered version with files yet: pass a base model "
            "for the first fine-tune (later runs can continue from the registered one)"
        )
    return version.artifact_uri


def model_client(region: str, credentials: Any = None) -> Any:
    """The Model Registry's GAPIC client for `region` (the register step's alias moves and
    `versions_by_run`), with the SDK's credentials unless `credentials` are given."""
    from google.cloud import aiplatform_v1
    from google.cloud.aiplatform import initializer

    return aiplatform_v1.ModelServiceClient(
        client_options={"api_endpoint": api_endpoint(region)},
        credentials=credentials or initializer.global_config.credentials,
    )


def versions_by_run(
    *, registered_model: str, project: str, region: str, credentials: Any = None
) -> dict[str, RegisteredVersion]:
    """Every version of `registered_model` that a run registered, by the run's label value
    (`llmft-run-id`: `safe_run_id(run id)`), with its aliases; {} when the model does not exist
    yet. One ListModels (a display name) and one paged ListModelVersions."""
    name, _ = resolve_model(
        model=registered_model, project=project, location=region, credentials=credentials
    )
    if not name:
        return {}
    client = model_client(region, credentials)
    found = {}
    for model in client.list_model_versions(request={"name": name}):
        run = dict(model.labels or {}).get(VERTEX_RUN_LABEL)
        if run:
            found[run] = RegisteredVersion(
                resource_name=model.name.partition("@")[0],
                version_id=str(model.version_id),
                display_name=model.display_name,
                artifact_uri=model.artifact_uri or "",
                labels=dict(model.labels),
                aliases=list(model.version_aliases),
            )
    return found
