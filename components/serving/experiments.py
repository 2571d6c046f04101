"""Log a run's parameters and final metrics to Vertex AI Experiments.

The train step calls `log_experiment_run` when the `experiment` run parameter is set: the
experiment (created when missing) gets an experiment run named after the pipeline run, with the
training parameters and the trainer's final numbers (loss, tokens, steps). A retried task resumes
the same experiment run instead of failing on "already exists". Per-step curves go to the
TensorBoard instance (`tensorboard` parameter, CustomJobSpec.tensorboard).

Goes through the aiplatform SDK (`aiplatform.init(experiment=...)`, `start_run`, `log_params`,
`log_metrics`); tests fake its MetadataService boundary (tests/fakes/vertex.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from components.runtime.run_identity import safe_run_id

log = logging.getLogger(__name__)


def experiment_run_name(run_id: str) -> str:
    """The experiment run's name: the pipeline run id as Vertex accepts it
    (lowercase letters, digits and '-')."""
    return safe_run_id(run_id)


def scalar_params(params: Mapping[str, Any]) -> dict[str, str | int | float]:
    """What Experiments stores as parameters: strings and numbers (bools as strings)."""
    out: dict[str, str | int | float] = {}
    for key, value in params.items():
        if isinstance(value, bool):
            out[key] = str(value).lower()
        elif isinstance(value, int | float | str):
            out[key] = value
    return out


def final_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers among `metrics` (Model artifact metadata also holds paths)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def log_experiment_run(
    *,
    experiment: str,
    run_id: str,
    project: str,
    location: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, Any],
    credentials: Any = None,
) -> str:
    """Create (or resume) the experiment run of `run_id` and log `params` and `metrics`;
    returns the experiment run's name."""
    from google.api_core import exceptions
    from google.cloud import aiplatform
    from google.cloud.aiplatform import initializer

    # aiplatform.init, called on the SDK's current config object; project first: init looks the
    # experiment up before it applies the project.
    config = initializer.global_config
    config.init(project=project, location=location, credentials=credentials)
    # No backing TensorBoard lookup: curves go to the CustomJob's TensorBoard (`tensorboard`).
    config.init(experiment=experiment, experiment_tensorboard=False)
    name = experiment_run_name(run_id)
    try:
        run = aiplatform.start_run(name)
    except exceptions.AlreadyExists:
        run = aiplatform.start_run(name, resume=True)
    try:
        run.log_params(scalar_params(params))
        if values := final_metrics(metrics):
            run.log_metrics(dict[str, float | int | str](values))
    finally:
        aiplatform.end_run()
    log.info("logged run %s to Vertex AI Experiment %s", name, experiment)
    return name
