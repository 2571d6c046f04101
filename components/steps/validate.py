"""The pipeline's first step: check every run parameter, then resolve what the run reads.

`run(ValidateRequest)` is what the `validate_inputs` KFP component calls. The rules live with the
parameters (components/params/run_params.py) and are applied as in `llmft run` (components/preflight/validation.py),
now with the run's schedule time and access to its data. Every problem is reported in one
ValueError; a mistake is permanent, so the step is never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.evaluation.loading import is_hub_id
from components.params.param_values import params_from_mapping
from components.params.run_params import (
    LATEST_REGISTERED,
    SCHEDULE_TIME_PLACEHOLDER,
    RunParams,
    fields,
    raise_errors,
)
from components.preflight import cost, quota
from components.preflight.validation import data_errors, evaluation_errors, fit_errors
from components.runtime.secrets import load_hf_token


@dataclass(frozen=True)
class ValidateRequest(RunParams):
    """The `validate_inputs` component's parameters: every run parameter (`RunParams`, with its
    one default) plus where and when the run happens."""

    target: str = ""
    """The pipeline's compile target (local, vertex, kfp; "" skips the target's rules)."""
    run_id: str = ""
    """The run's id (checked resolved: an unresolved placeholder is an error)."""
    schedule_time: str = ""
    """The schedule time that fills the placeholder in `train_data_uri` ("" when unscheduled)."""


def run(request: ValidateRequest) -> tuple[str, str, str, int, dict[str, Any]]:
    """Fill in the schedule time, check everything, resolve the models, estimate the cost.

    Returns:
        (base_model, train_data_uri, champion_model, budget_timeout_s, cost_estimate) for this
        run; `latest-registered` resolves to the newest registered version's URI (no champion yet
        on a first run gives ""); the timeout keeps the training job within max_cost_usd (0:
        no budget); the estimate is printed and returned (components/preflight/cost.py).
    """
    uri = str(request.train_data_uri)
    if SCHEDULE_TIME_PLACEHOLDER in uri:
        schedule_time = request.schedule_time
        if not schedule_time or SCHEDULE_TIME_PLACEHOLDER in schedule_time:
            raise ValueError(
                f"train_data_uri contains {SCHEDULE_TIME_PLACEHOLDER} but this run was not started "
                "by a schedule: submit it with `llmft run --schedule-time ...` or give a fixed URI"
            )
        uri = uri.replace(SCHEDULE_TIME_PLACEHOLDER, schedule_time)
    values = {name: getattr(request, name) for name in fields()}
    params = params_from_mapping({**values, "train_data_uri": uri})
    errors = params.errors(target=request.target, run_id=request.run_id)
    raise_errors(errors + data_errors(uri, remote=True))
    base_model = resolve_model(params.base_model, params)
    if request.target == "vertex" and is_hub_id(base_model):
        # The fit check and the estimate read its config.json from the Hub (KFP on GKE has
        # HF_TOKEN from the Kubernetes Secret already; local runs need no token).
        load_hf_token(project=params.project, secret=params.hf_token_secret)
    raise_errors(
        evaluation_errors(params, base_model, remote=True, check_machine=request.target == "vertex")
        + fit_errors(params, base_model, remote=True)
    )
    estimate = cost.estimate_for(params, remote=True, base_model=base_model)
    print(
        "cost estimate (components/preflight/cost.py; an estimate, not a quote):\n"
        + estimate.table()
    )
    raise_errors([e for e in [cost.budget_error(estimate, params.max_cost_usd)] if e])
    if request.target in ("vertex", "kfp"):
        # A console run has not been through `llmft run`'s quota check (C1).
        report = quota.quota_check(params)
        for warning in report.warnings:
            print(f"warning: {warning}")
        raise_errors(report.errors)
    timeout_s = cost.budget_timeout_s(estimate, params.max_cost_usd)
    return base_model, uri, resolve_champion(params), timeout_s, estimate.to_dict()


def resolve_model(model: str, params: RunParams) -> str:
    """`model`, or for `latest-registered` the newest registered version's URI."""
    if model != LATEST_REGISTERED:
        return model
    from components.serving.registry import latest_registered_model_uri

    return latest_registered_model_uri(
        registered_model=params.registered_model, project=params.project, region=params.region
    )


def resolve_champion(params: RunParams) -> str:
    """The model to beat besides the base; "" for none (nothing registered yet on a first run)."""
    try:
        return resolve_model(params.champion_model, params)
    except ValueError:
        return ""
