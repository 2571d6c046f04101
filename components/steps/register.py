"""The pipeline's register step: upload the tuned model to Vertex AI Model Registry.

`run(RegisterRequest)` is what the `register` KFP component calls (only when the gate passed and
`register_model` is set); the registry calls are in components/registry.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.registry import ServingContainer, register_model, resolve_model


@dataclass(frozen=True)
class RegisterRequest:
    """The `register` component's parameters (components/kfp_components.py), by the same names;
    each run parameter's meaning and default are in components/run_params.py."""

    model_uri: str
    """The exported Hugging Face model (the train step's `model_uri` output)."""
    base_model: str
    """What it was fine-tuned from (for the version's description; "" to leave it out)."""
    run_id: str
    project: str
    region: str
    registered_model: str
    """The registry model to add a version to (resource name, id, or display name; a new
    display name creates the model)."""
    serving_image: str
    credentials: Any = None
    """Google credentials (tests pass anonymous ones); default: Application Default."""


def run(request: RegisterRequest) -> str:
    """Upload the exported model at `model_uri` as a new version; return the version's name."""
    parent, display_name = resolve_model(
        model=request.registered_model,
        project=request.project,
        location=request.region,
        credentials=request.credentials,
    )
    description = f"fine-tuned by llmft run {request.run_id}"
    if request.base_model:
        description += f" from {request.base_model}"
    version = register_model(
        artifact_uri=request.model_uri,
        display_name=display_name,
        serving=ServingContainer(image_uri=request.serving_image),
        run_id=request.run_id,
        project=request.project,
        location=request.region,
        parent_model=parent,
        description=description,
        credentials=request.credentials,
    )
    return version.versioned_name
