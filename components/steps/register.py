"""The pipeline's register step: upload the tuned model to Vertex AI Model Registry, serving-ready.

`run(RegisterRequest)` is what the `register` KFP component calls (only when the gate passed and
`register_model` is set). It
1. uploads the exported model with the serving preset's container (components/serving/presets.py: args,
   ports, routes, env for the vLLM images; the registry calls are in components/serving/registry.py);
2. attaches the evaluate step's metrics to the version as a model evaluation;
3. moves the `champion` alias to the new version (the gate passed, or this step would not run);
4. fills the `google.VertexModel` output artifact (components/serving/lineage.py) that GCPC's deploy and
   batch-prediction components take.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from components.params.by_step import RegisterParams
from components.serving.lineage import (
    CHAMPION_ALIAS,
    move_champion_alias,
    skip_gate_evaluation,
    vertex_model_fields,
)
from components.serving.presets import ADAPTER_SUBDIR, ServingSpec, serving_container
from components.serving.registry import model_client, register_model, resolve_model
from components.steps.component_spec import StepComponent, component_input
from trainer import storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegisterRequest:
    """The `register` component: its run parameters and its own inputs and outputs."""

    params: RegisterParams
    """The run parameters the register step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    model_uri: str = component_input("str")
    """The exported Hugging Face model (the train step's `model_uri` output)."""
    run_id: str = component_input("str")
    metrics: Any = component_input("Input[Metrics]", default=None)
    """The evaluate step's Metrics artifact (`.metadata`: the gate's metrics); None skips the
    model evaluation."""
    vertex_model: Any = component_input("Output[VertexModel]", default=None)
    """The `google.VertexModel` output artifact (`.uri`, `.metadata`), filled here."""
    credentials: Any = None
    """Google credentials (tests pass anonymous ones); default: Application Default."""


COMPONENT = StepComponent(
    name="register",
    request=RegisterRequest,
    returns="str",
    doc="""Upload the tuned model to Vertex AI Model Registry (a new version of `registered_model`)
with the serving preset's container, attach the gate's metrics as its model evaluation and
move the `champion` alias to it.

The model comes by URI: the registry reads it from gs://; an input artifact would first be
downloaded whole into this small pod.

Returns:
    The registered model version's resource name (also the `google.VertexModel` output that
    GCPC's deploy and batch-prediction components take).
""",
)


def served_model_name(display_name: str) -> str:
    """The name clients pass as `model` (the registry model's display name, lowercased)."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in display_name.lower())


def lora_rank(model_uri: str) -> int:
    """The rank of the LoRA adapter exported beside the merged model (0: no adapter)."""
    config = f"{model_uri.rstrip('/')}/{ADAPTER_SUBDIR}/adapter_config.json"
    if not storage.exists(config):
        return 0
    return int(json.loads(storage.read_text(config)).get("r") or 0)


def serving_spec(request: RegisterRequest, *, model_uri: str, display_name: str) -> ServingSpec:
    """The serving preset's inputs for this run's export. The adapter is looked for only when
    it is to be served (a merged export serves the same way whether LoRA trained it or not)."""
    rank = lora_rank(model_uri) if request.params.lora_serving == "adapter" else 0
    if request.params.lora_serving == "adapter" and not rank:
        raise ValueError(
            f"lora_serving=adapter but {model_uri} holds no {ADAPTER_SUBDIR}/: the run trained no "
            "LoRA adapter (set lora_rank in trainer_overrides, or use lora_serving=merged)"
        )
    base = request.params.base_model
    return ServingSpec(
        preset=request.params.serving_preset,  # type: ignore[arg-type]
        image=request.params.serving_image,
        served_model_name=served_model_name(display_name),
        max_model_len=request.params.seq_len,
        tensor_parallel_size=max(1, request.params.deploy_accelerator_count),
        lora=rank > 0,
        lora_serving=request.params.lora_serving,  # type: ignore[arg-type]
        base_model_uri=base,
        lora_rank=rank,
    )


def _alias_holders(client: Any, model: str, alias: str) -> list[str]:
    from google.api_core import exceptions

    try:
        return [str(client.get_model(request={"name": f"{model}@{alias}"}).version_id)]
    except exceptions.NotFound:
        return []


def run(request: RegisterRequest) -> str:
    """Upload the exported model at `model_uri` as a new version; return the version's name."""
    parent, display_name = resolve_model(
        model=request.params.registered_model,
        project=request.params.project,
        location=request.params.region,
        credentials=request.credentials,
    )
    description = f"fine-tuned by llmft run {request.run_id}"
    if request.params.base_model:
        description += f" from {request.params.base_model}"
    spec = serving_spec(request, model_uri=request.model_uri, display_name=display_name)
    serving = serving_container(spec)
    version = register_model(
        artifact_uri=request.model_uri,
        display_name=display_name,
        serving=serving,
        run_id=request.run_id,
        project=request.params.project,
        location=request.params.region,
        parent_model=parent,
        description=description,
        credentials=request.credentials,
    )
    client = model_client(request.params.region, request.credentials)
    if request.metrics is not None:
        skip_gate_evaluation(version.versioned_name, dict(request.metrics.metadata))
    move_champion_alias(
        client,
        model=version.resource_name,
        version_id=version.version_id,
        holders=_alias_holders(client, version.resource_name, CHAMPION_ALIAS),
    )
    if request.vertex_model is not None:
        uri, fields = vertex_model_fields(
            version.versioned_name, request.params.region, spec.served_model_name
        )
        request.vertex_model.uri = uri
        request.vertex_model.metadata.update(fields)
    return version.versioned_name
