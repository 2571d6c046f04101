"""The pipeline's first step: check every run parameter, then resolve what the run reads.

`run(ValidateRequest)` is what the `validate_inputs` KFP component calls. The rules live with the
parameters (components/params/run_params.py) and are applied as in `llmft run` (components/preflight/validation.py),
now with the run's schedule time and access to its data. Every problem is reported in one
ValueError; a mistake is permanent, so the step is never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.params.param_values import params_from_mapping
from components.params.run_checks import raise_errors, run_errors
from components.params.run_params import (
    LATEST_REGISTERED,
    SCHEDULE_TIME_PLACEHOLDER,
    RunParams,
    fields,
)
from components.preflight import cost, quota, run_cost
from components.preflight.launch_checks import gke_job_api_errors
from components.preflight.validation import (
    data_errors,
    evaluation_errors,
    fit_errors,
    mix_data_errors,
    reward_module_errors,
)
from components.runtime.model_location import is_hub_id
from components.runtime.secrets import load_hf_token
from components.schedules.plan import RunPlan, plan_run
from components.serving.mlflow_tracking import tracking_errors
from components.serving.registry import latest_registered_model_uri
from components.steps.component_spec import StepComponent, component_input


@dataclass(frozen=True)
class ValidateRequest:
    """The `validate_inputs` component: every run parameter plus where and when the run happens."""

    params: RunParams
    """The run parameters the validate_inputs step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    target: str = component_input("str", default="")
    """The pipeline's compile target (local, vertex, kfp; "" skips the target's rules)."""
    run_id: str = component_input("str", default="")
    """The run's id (checked resolved: an unresolved placeholder is an error)."""
    schedule_time: str = component_input("str", default="")
    """The schedule time that fills the placeholder in `train_data_uri` ("" when unscheduled)."""


COMPONENT = StepComponent(
    name="validate_inputs",
    request=ValidateRequest,
    returns=(
        ("base_model", "str"),
        ("train_data_uri", "str"),
        ("champion_model", "str"),
        ("budget_timeout_s", "int"),
        ("cost_estimate", "dict"),
        ("train_data_mix", "str"),
        ("proceed", "bool"),
        ("schedule_record", "str"),
    ),
    doc="""Check every run parameter before anything costly starts; resolve what a run reads;
estimate the run's cost and refuse it over max_cost_usd.

Returns:
    base_model: the model to start from (`latest-registered` resolved to a model URI).
    train_data_uri: the data URI with the schedule-time placeholder filled in.
    champion_model: the model to beat besides the base ("" for none).
    budget_timeout_s: the training job's timeout that keeps it within max_cost_usd (0: none).
    cost_estimate: expected GPU-hours, wall hours and USD per pipeline step.
    train_data_mix: the mix preprocessing reads, replay included (JSON; "" for the window alone).
    proceed: False when the run ends here ("skipped: nothing new", min_new_records).
    schedule_record: the run's record under work_uri ("" without one), completed by evaluate.
""",
)


def run(
    request: ValidateRequest,
) -> tuple[str, str, str, int, dict[str, Any], str, bool, str]:
    """Fill in the schedule time, check everything, resolve the models, estimate the cost, plan
    a scheduled run.

    Returns:
        (base_model, train_data_uri, champion_model, budget_timeout_s, cost_estimate,
        train_data_mix, proceed, schedule_record) for this run; `latest-registered` resolves to
        the newest registered version's URI (no champion yet on a first run gives ""); the
        timeout keeps the training job within max_cost_usd (0: no budget); the estimate is
        printed and returned (components/preflight/cost.py); the mix, whether the run proceeds
        and the schedule's record come from `schedule_plan`.
    """
    uri = scheduled_uri(str(request.params.train_data_uri), request.schedule_time)
    values = {name: getattr(request.params, name) for name in fields()}
    params = params_from_mapping({**values, "train_data_uri": uri})
    errors = run_errors(params, target=request.target, run_id=request.run_id)
    raise_errors(
        errors
        + data_errors(uri, remote=True)
        + reward_module_errors(params.reward_module, remote=True)
        + mix_data_errors(params, remote=True)
    )
    if params.backend == "gke" and request.target in ("kfp", "vertex"):
        raise_errors(cluster_errors(params))
    base_model = resolve_model(params.base_model, params)
    if request.target == "vertex" and is_hub_id(base_model):
        # The fit check and the estimate read its config.json from the Hub (KFP on GKE has
        # HF_TOKEN from the Kubernetes Secret already; local runs need no token).
        load_hf_token(project=params.project, secret=params.hf_token_secret)
    raise_errors(
        evaluation_errors(params, base_model, remote=True, check_machine=request.target == "vertex")
        + fit_errors(params, base_model, remote=True)
        # Here the host must resolve: this task runs where the steps will reach the server.
        + tracking_errors(
            params.tracking_uri,
            params.tracking_token_secret,
            target=request.target,
            project=params.project,
        )
    )
    estimate = run_cost.estimate_for(params, remote=True, base_model=base_model)
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
    plan = schedule_plan(request, uri)
    champion = resolve_champion(params)
    return (
        base_model,
        uri,
        champion,
        timeout_s,
        estimate.to_dict(),
        plan.train_data_mix,
        plan.proceed,
        plan.record_uri,
    )


def resolve_model(model: str, params: RunParams) -> str:
    """`model`, or for `latest-registered` the newest registered version's URI."""
    if model != LATEST_REGISTERED:
        return model

    return latest_registered_model_uri(
        registered_model=params.registered_model, project=params.project, region=params.region
    )


def resolve_champion(params: RunParams) -> str:
    """The model to beat besides the base; "" for none (nothing registered yet on a first run)."""
    try:
        return resolve_model(params.champion_model, params)
    except ValueError:
        return ""


def scheduled_uri(uri: str, schedule_time: str) -> str:
    """`train_data_uri` with the schedule's time filled in (refused outside a schedule)."""
    if SCHEDULE_TIME_PLACEHOLDER not in uri:
        return uri
    if not schedule_time or SCHEDULE_TIME_PLACEHOLDER in schedule_time:
        raise ValueError(
            f"train_data_uri contains {SCHEDULE_TIME_PLACEHOLDER} but this run was not started "
            "by a schedule: submit it with `llmft run --schedule-time ...` or give a fixed URI"
        )
    return uri.replace(SCHEDULE_TIME_PLACEHOLDER, schedule_time)


def cluster_errors(params: RunParams) -> list[str]:
    """The GKE cluster must serve the job API and have the Kueue queue before preprocessing
    spends anything."""
    return gke_job_api_errors(
        params.gke_job_api,
        cluster=params.gke_cluster,
        kueue_queue=params.kueue_queue,
        namespace=params.namespace,
    )


def schedule_plan(request: ValidateRequest, uri: str) -> RunPlan:
    """Recurring runs (components/schedules/): the mix with replay, an unchanged window, the
    record; its warnings, replay share and skip message printed."""
    plan, problems = plan_run(
        request.params,
        uri,
        request.run_id,
        request.schedule_time,
        lambda pattern: data_errors(pattern, remote=True),
        can_skip=request.target != "local",
    )
    raise_errors(problems)
    for warning in plan.warnings:
        print(f"warning: {warning}")
    if plan.replay_fraction > 0:
        sources = ", ".join(plan.replay_uris)
        print(f"replay: {plan.replay_fraction:.3f} of the packed tokens from {sources}")
    if plan.message:
        print(plan.message)
    return plan
