"""What ties a registered version to its run in Vertex AI: the `google.VertexModel` artifact that
GCPC's components chain from, the gate's metrics as the version's model evaluation, and the
`champion` alias.

- `vertex_model_fields`: the uri and metadata GCPC's `VertexModel` artifact carries
  (`google_cloud_pipeline_components.types.artifact_types.VertexModel`: schema
  `google.VertexModel` 0.0.1, metadata `resourceName`), so `ModelDeployOp`,
  `ModelBatchPredictOp` etc. take the register step's output as their `model` input.
- `skip_gate_evaluation`: the gate's metrics are not imported as a Vertex model evaluation
  (cloud audit 2026-12-07, C11). A model evaluation carries a metrics schema, and GCPC imports
  only its own evaluators' metrics, each under the schema that fits them
  (google_cloud_pipeline_components/container/_implementation/model_evaluation/
  import_model_evaluation.py, PROBLEM_TYPE_TO_SCHEMA_URI: classification, regression,
  forecasting, text-generation, question-answering, summarization, embedding). The gate's
  metrics (eval loss, perplexity, exact match, chrF, win rate, task scores) fit none of them: sent
  under the text-generation schema they would be rejected, or kept meaning something else, after
  the upload. They stay in the run's Metrics artifact (Vertex ML Metadata) instead.
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
GCPC_EVALUATION_SCHEMAS = "gs://google-cloud-aiplatform/schema/modelevaluation/"
"""Where the metrics schemas GCPC imports with live (one per problem type)."""
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


def skip_gate_evaluation(versioned_name: str, metrics: Mapping[str, Any]) -> None:
    """Say, in the step's log, why the gate's metrics are not the version's model evaluation
    (module docstring) and where they are."""
    names = ", ".join(evaluation_metrics(metrics)) or "none"
    log.warning(
        "warning: the gate's metrics (%s) are not imported as a model evaluation of %s: no "
        "Vertex metrics schema under %s fits them (GCPC imports only its own evaluators' "
        "metrics); they are in this run's Metrics artifact",
        names,
        versioned_name,
        GCPC_EVALUATION_SCHEMAS,
    )


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
