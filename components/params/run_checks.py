"""The checks of a whole run: every problem with a `RunParams`, each saying what to change.

`run_errors` applies each field's own rules (components/params/param_schema.py) and the named
cross-field checks of components/params/param_checks.py; `llmft run`, `llmft schedule` and the
pipeline's first step call it (components/preflight/validation.py, components/steps/validate.py),
so every problem is reported at once, before anything starts. Kept apart from the schema
(run_params.py) so that a step that only reads parameters does not import every check.
"""

from __future__ import annotations

import dataclasses

from beam_preprocess.data_shape import SETTINGS
from components.params import data_checks
from components.params import param_checks as checks
from components.params.param_schema import field_error
from components.params.run_params import LATEST_REGISTERED, TARGET_DEFAULTS, RunParams, choices
from components.params.trainer_params import trainer_override_errors
from components.runtime.run_identity import check_placeholder_resolved
from components.serving.presets import check_lora_serving
from trainer.tracking import tracking_uri_problem


def run_errors(params: RunParams, *, target: str = "", run_id: str = "") -> list[str]:
    """Every problem with these parameters, each saying what to change; [] when valid.

    `target` is where the pipeline runs (local, vertex, kfp; "" skips the target's rules): the
    compiled pipeline passes its own. `run_id` is the run's resolved id, when known.
    """
    errors = [
        e
        for f in dataclasses.fields(params)
        if (e := field_error(f, getattr(params, f.name), choices(f.name)))
    ]
    errors += [e for k, v in params.as_dict().items() if (e := checks.check_not_a_token(k, v))]
    errors += [e for e in _single_errors(params, target, run_id) if e]
    errors += _data_errors(params)
    errors += _launch_errors(params)
    errors += _quality_and_serving_errors(params)
    return errors


def _single_errors(params: RunParams, target: str, run_id: str) -> list[str | None]:
    """The named checks that each give one problem or None."""
    return [
        checks.check_backend_for_target(params.backend, target),
        checks.check_nproc_per_node(
            params.backend, params.nproc_per_node, params.accelerator_count
        ),
        checks.check_service_account(
            params.backend, params.service_account, TARGET_DEFAULTS["kfp"]["service_account"]
        ),
        checks.check_objective_data(params.objective, params.data_kind),
        checks.check_rewards(
            params.objective, params.rewards, params.reward_module, params.backend
        ),
        checks.check_dataflow_service_account(
            params.preprocess_runner, params.dataflow_service_account
        ),
        checks.check_secret_name("hf_token_secret", params.hf_token_secret),
        checks.check_secret_name("tracking_token_secret", params.tracking_token_secret),
        tracking_uri_problem(params.tracking_uri, resolve=False),
        data_checks.check_chat_template(params.chat_template),
        check_placeholder_resolved("run id", run_id),
        checks.check_eval_accelerator(
            target, params.eval_accelerator_type, params.eval_accelerator_count
        ),
        checks.check_gke_accelerator(params.backend, params.accelerator_type),
        checks.check_capacity(
            params.backend, params.capacity, params.reservation, params.max_wait_minutes
        ),
        checks.check_flex_start_accelerator(
            params.backend, params.capacity, params.accelerator_type
        ),
        check_lora_serving(params.lora_serving),
    ]


def _data_errors(params: RunParams) -> list[str]:
    """The records: their shape, their source, and where cloud runs keep them."""
    fields = {name: getattr(params, name) for name in SETTINGS if name.endswith("_field")}
    errors = data_checks.check_record_format(params.data_kind, params.record_format, fields)
    errors += data_checks.check_data_source(
        params.train_data_uri, params.bigquery_query, params.preprocess_runner
    )
    errors += data_checks.check_train_data_mix(
        params.train_data_mix,
        params.train_data_uri,
        params.replay_source,
        params.replay_fraction,
        params.data_kind,
    )
    errors += checks.check_cloud_locations(
        cloud=params.backend in ("gke", "vertex") or params.preprocess_runner == "DataflowRunner",
        project=params.project,
        region=params.region,
        work_uri=params.work_uri,
        train_data_uri=params.train_data_uri,
    )
    return errors


def _launch_errors(params: RunParams) -> list[str]:
    """The training job: its trainer settings and the machines it asks for."""
    errors = trainer_override_errors(
        params.trainer_overrides,
        max_steps=params.max_steps,
        learning_rate=params.learning_rate,
        quantize_base=params.quantize_base,
        objective=params.objective,
        rewards=params.rewards,
        reward_module=params.reward_module,
    )
    return errors + checks.check_machine_accelerator(
        params.backend, params.machine_type, params.accelerator_type, params.accelerator_count
    )


def _quality_and_serving_errors(params: RunParams) -> list[str]:
    """The quality gate, the registry and the endpoint."""
    errors = checks.check_eval_quality(
        eval_tasks=params.eval_tasks,
        max_task_regression=params.max_task_regression,
        judge_metric=params.judge_metric,
        judge_min_win_rate=params.judge_min_win_rate,
        project=params.project,
    )
    errors += checks.check_registry(
        latest=LATEST_REGISTERED,
        models=(params.base_model, params.champion_model),
        register_model=params.register_model,
        registered_model=params.registered_model,
        serving_image=params.serving_image,
        serving_preset=params.serving_preset,
    )
    return errors + checks.check_deploy(
        backend=params.backend,
        deploy_endpoint=params.deploy_endpoint,
        register_model=params.register_model,
        machine_type=params.deploy_machine_type,
        accelerator_type=params.deploy_accelerator_type,
        accelerator_count=params.deploy_accelerator_count,
        serving_preset=params.serving_preset,
        lora_serving=params.lora_serving,
    )


def check_run(params: RunParams) -> RunParams:
    """Raise one ValueError listing every problem; return the parameters when valid."""
    raise_errors(run_errors(params))
    return params


def raise_errors(errors: list[str]) -> None:
    """One ValueError listing every problem (the CLI prints it after `error:`)."""
    if errors:
        raise ValueError(
            f"{len(errors)} invalid run parameter(s):\n"
            + "\n".join(f"  - {checks.redact_tokens(e)}" for e in errors)
        )
