"""What ties a registered version to its run in Vertex AI: the `google.VertexModel` artifact that
GCPC's components chain from, the gate's metrics as the version's model evaluation, and the
`champion` alias.

- `vertex_model_fields`: the uri and metadata GCPC's `VertexModel` artifact carries
  (`google_cloud_pipeline_components.types.artifact_types.VertexModel`: schema
  `google.VertexModel` 0.0.1, metadata `resourceName`), so `ModelDeployOp`,
  `ModelBatchPredictOp` etc. take the register step's output as their `model` input.
- `import_gate_evaluation`: `ModelServiceClient.import_model_evaluation` on the version with the
  evaluate step's metrics (schema: Vertex's text-generation evaluation metrics, as GCPC's
  `model_evaluation` import uses for text generation).
- `move_champion_alias`: the alias leaves the version that held it and moves to the new one; the
  register step runs only when the gate passed, so only a version that passed holds it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from google_cloud_pipeline_components.types.artifact_types import VertexModel

__all__ = ["VertexModel"]

log = logging.getLogger(__name__)

CHAMPION_ALIAS = "champion"
TEXT_GENERATION_METRICS_SCHEMA = (
    "gs://google-cloud-aiplatform/schema/modelevaluation/general_text_generation_metrics_1.0.0.yaml"
)
"""The metrics schema GCPC's import_model_evaluation uses for problem type text-generation."""
RESOURCE_NAME_KEY = "resourceName"
"""The metadata key of GCPC's Vertex artifacts (artifact_types._RESOURCE_NAME_KEY)."""


SERVED_MODEL_NAME_KEY = "servedModelName"
"""Our extra metadata key: the name the serving container answers to (vLLM's `model`)."""


def vertex_model_fields(
    versioned_name: str, location: str, served_model_name: str
) -> tuple[str, dict[str, str]]:
    """(uri, metadata) of the `google.VertexModel` artifact for `versioned_name`
    (`projects/P/locations/L/models/M@V`), in the form GCPC's VertexModel.create documents,
    plus the served model name the deploy step's smoke prompt uses."""
    uri = f"https://{location}-aiplatform.googleapis.com/v1/{versioned_name}"
    return uri, {RESOURCE_NAME_KEY: versioned_name, SERVED_MODEL_NAME_KEY: served_model_name}


def evaluation_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric metrics (a KFP Metrics artifact's metadata also holds other keys)."""
    return {
        k: float(v)
        for k, v in sorted(metrics.items())
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def import_gate_evaluation(
    client: Any, *, versioned_name: str, metrics: Mapping[str, Any], run_id: str
) -> str:
    """Attach the gate's metrics to the version as a model evaluation; return its name."""
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format, struct_pb2

    values = evaluation_metrics(metrics)
    evaluation = aiplatform_v1.ModelEvaluation(
        display_name=f"llmft-gate-{run_id}"[:128],
        metrics_schema_uri=TEXT_GENERATION_METRICS_SCHEMA,
        metrics=json_format.ParseDict(values, struct_pb2.Value()),
        metadata=json_format.ParseDict(
            {"pipeline_job_id": run_id, "evaluation_step": "llmft evaluate (quality gate)"},
            struct_pb2.Value(),
        ),
    )
    created = client.import_model_evaluation(
        request=aiplatform_v1.ImportModelEvaluationRequest(
            parent=versioned_name, model_evaluation=evaluation
        )
    )
    log.info("attached the gate's metrics to %s as %s", versioned_name, created.name)
    return str(created.name)


def move_champion_alias(
    client: Any, *, model: str, version_id: str, holders: list[str], alias: str = CHAMPION_ALIAS
) -> None:
    """Take `alias` from the versions in `holders` (version ids) and give it to `version_id`."""
    from google.cloud import aiplatform_v1

    for old in holders:
        if old != version_id:
            client.merge_version_aliases(
                request=aiplatform_v1.MergeVersionAliasesRequest(
                    name=f"{model}@{old}", version_aliases=[f"-{alias}"]
                )
            )
    client.merge_version_aliases(
        request=aiplatform_v1.MergeVersionAliasesRequest(
            name=f"{model}@{version_id}", version_aliases=[alias]
        )
    )
    log.info("alias %s now names %s@%s", alias, model, version_id)
