"""The run parameters of the Model Registry and serving: a section of `RunParams`
(components/params/run_params.py inherits it), declared like the rest (`param(..., steps=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.params.param_schema import param
from components.serving.presets import ENDPOINT_NAME, IMAGE_REFERENCE, LoraServing, ServingPreset

LATEST_REGISTERED = "latest-registered"
"""`base_model` / `champion_model` value: the newest version of `registered_model` in the Vertex AI
Model Registry (resolved by the pipeline's first step)."""


@dataclass(frozen=True)
class ServingParams:
    """Register the model that passed the gate, deploy it to an endpoint, smoke-test it."""

    register_model: bool = param(
        False,
        "Upload the tuned model to Vertex AI Model Registry when it passes the gate.",
        cloud=True,
    )
    registered_model: str = param(
        "",
        "Vertex AI model (resource name or display name) to add versions to or take "
        f'"{LATEST_REGISTERED}" from.',
        steps=("register", "evaluate"),
        cloud=True,
    )
    serving_image: str = param(
        "",
        "Serving container image (pinned tag) for the registered model, started as "
        "serving_preset says (e.g. Model Garden's pytorch-vllm-serve image for vertex-vllm); "
        "required when register_model is true.",
        pattern=IMAGE_REFERENCE,
        steps=("register",),
        cloud=True,
    )
    serving_preset: ServingPreset = param(
        "vertex-vllm",
        'How serving_image starts the model (components/serving/presets.py): "vertex-vllm" (Vertex AI '
        'Model Garden pytorch-vllm-serve image), "vllm-openai" (vLLM\'s own OpenAI server image), '
        'or "custom" (the image alone, e.g. a TGI image that reads AIP_STORAGE_URI itself).',
        steps=("register", "deploy"),
        cloud=True,
    )
    lora_serving: LoraServing = param(
        "merged",
        'For a LoRA run: serve the "merged" model, or the base model plus the "adapter" with '
        "vLLM --enable-lora (refused until verified on a real project: docs/deploy/README.md).",
        steps=("register",),
        cloud=True,
    )
    deploy_endpoint: str = param(
        "",
        "Deploy the registered version to this Vertex AI endpoint (resource name or display name; "
        "created when missing) and send it a smoke prompt; empty: no deployment. A local run "
        "serves the model on this machine instead (any non-empty value).",
        pattern=ENDPOINT_NAME,
        steps=("deploy",),
    )
    deploy_machine_type: str = param(
        "g2-standard-12",
        "Machine type serving the deployed model (e.g. g2-standard-12 + 1 L4).",
        steps=("deploy",),
        cloud=True,
    )
    deploy_accelerator_type: str = param(
        "NVIDIA_L4",
        "Accelerator of the serving machine (Vertex name); empty for CPU.",
        steps=("deploy",),
        cloud=True,
    )
    deploy_accelerator_count: int = param(
        1,
        "Accelerators per serving replica (vLLM shards the model over them).",
        ge=0,
        steps=("register", "deploy"),
        cloud=True,
    )
    deploy_spot: bool = param(
        False,
        "Serve on Spot VMs (cheaper; replicas may be preempted).",
        steps=("deploy",),
        cloud=True,
    )
    deploy_traffic_percent: int = param(
        100,
        "Traffic share of the new version when the endpoint already serves earlier versions "
        "(champion/challenger); 100 replaces them once the smoke prompt passed.",
        ge=1,
        le=100,
        steps=("deploy",),
        cloud=True,
    )
