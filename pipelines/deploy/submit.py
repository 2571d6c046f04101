"""Submit one pipeline run to Vertex AI Pipelines or KFP, optionally waiting and reporting status.

Vertex: `aiplatform.PipelineJob` (template path or registry URI, pipeline root, parameters,
caching, labels, failure policy, CMEK) then `submit(service_account, network, experiment)`.
KFP: `kfp.Client.create_run_from_pipeline_package` into an experiment, or `run_pipeline` for a
template already uploaded with `llmft upload --target kfp`.

Both return the console URL at once; with `wait=True` they poll and report each state change
until the run ends, and raise ValueError if it did not succeed.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from components.params.param_checks import check_pipeline_root
from components.params.param_values import field_errors, params_from_mapping
from components.params.run_checks import run_errors
from components.params.run_params import RunParams, fields
from components.platform.task_resources import kfp_gpu_node_errors
from pipelines.deploy.checks import validate
from pipelines.deploy.clients import (
    cloud_errors,
    google_credentials,
    kfp_client,
    kfp_host,
    kfp_ui_url,
    vertex_run_url,
)
from pipelines.deploy.config import DERIVED_WORK_DIR, DeployConfig
from pipelines.deploy.template import (
    TemplateInfo,
    check_for_backend,
    fill_schedule_time,
    parameter_errors,
    read_template,
    template_info,
    uses_schedule_time,
)

if TYPE_CHECKING:
    import kfp.client
    from google.auth.credentials import Credentials

Report = Callable[[str], None]

_VERTEX_DONE = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED"}
_KFP_DONE = {"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"}


@dataclass(frozen=True)
class Submitted:
    """A run that the backend accepted."""

    backend: str
    run_id: str
    """Vertex: the PipelineJob resource name; KFP: the run id."""
    url: str
    state: str | None = None
    """Final state when waited for, else None."""


def remote_template(config: DeployConfig, credentials: Credentials) -> TemplateInfo | None:
    """Fetch a registry-URI template (Vertex) so its parameters are checked like a local one's."""
    if not config.template or not config.template.startswith(("http://", "https://")):
        return None
    import json
    from pathlib import Path

    from google.cloud.aiplatform.utils import yaml_utils

    with cloud_errors(f"fetching {config.template}"):
        spec = yaml_utils.load_yaml(config.template, config.vertex.project, credentials)
    return template_info([spec], Path(config.template), json.dumps(spec, sort_keys=True).encode())


def prepare_parameters(
    config: DeployConfig,
    backend: str,
    *,
    schedule_time: dt.datetime | None,
    recurring: bool,
    info: TemplateInfo | None = None,
) -> dict[str, Any]:
    """Check the parameters against the template and settle the schedule-time placeholder.

    `info` is the template when already loaded (a registry URI, see `remote_template`);
    otherwise a local template path is read here.

    Raises:
        ValueError: every parameter problem at once; or a one-off run left the schedule-time
            placeholder unfilled (a recurring run keeps it for the pipeline to resolve).
    """
    params = dict(config.parameters)
    # The pipeline's own `backend` parameter says where the trainer runs (each compiled target
    # defaults it: vertex / gke); `local` cannot work on a cloud backend.
    trainer_default = RunParams.for_target(backend).backend
    params.setdefault("backend", trainer_default)
    if params["backend"] == "local":
        raise ValueError(
            f"parameter backend=local runs the trainer on this machine; on {backend} use "
            f"backend={trainer_default}" + (" or backend=gke" if backend == "vertex" else "")
        )
    if backend == "kfp" and (
        problem := check_pipeline_root(params["backend"], config.kfp.pipeline_root)
    ):
        raise ValueError(problem)
    if schedule_time is not None:
        params = fill_schedule_time(params, schedule_time)
    elif not recurring and uses_schedule_time(params):
        names = ", ".join(uses_schedule_time(params))
        raise ValueError(
            f"parameter(s) {names} contain the schedule-time placeholder, but a one-off run has no "
            "scheduled time: pass --schedule-time 2026-01-05T03:00:00Z to choose the window, or "
            "use `llmft schedule`"
        )
    template = config.template
    if info is None and template and not template.startswith(("http://", "https://")):
        info = read_template(template)
    if info is not None:
        check_for_backend(info, backend)
        params = _derived_defaults(info, config, backend, params)
    errors = (parameter_errors(info, params) if info else []) or _run_parameter_errors(
        info, params, backend
    )
    ours = info is None or set(_run_fields()) <= set(info.parameters)
    if not errors and backend == "kfp" and ours:
        errors = _gpu_node_errors(params)
    if errors:
        raise ValueError(f"{len(errors)} parameter problem(s):\n  - " + "\n  - ".join(errors))
    return params


def _derived_defaults(
    info: TemplateInfo, config: DeployConfig, backend: str, params: dict[str, Any]
) -> dict[str, Any]:
    """Fill pipeline parameters that the deploy settings already answer, unless given.

    On Vertex the run's project and region are the trainer's, and the pipeline's CMEK key
    (`vertex.encryption_key`) is the CustomJob's and a created endpoint's; `work_uri` (shared run
    files) defaults to a folder under the pipeline root, which is gs:// on Vertex.
    """
    derived: dict[str, Any] = {}
    root = config.vertex.pipeline_root if backend == "vertex" else config.kfp.pipeline_root
    if backend == "vertex":
        derived = {"project": config.vertex.project, "region": config.vertex.region}
        # The pipeline's CMEK key also covers the training CustomJob and a created endpoint.
        derived["encryption_key"] = config.vertex.encryption_key or ""
    if root and root.startswith("gs://"):
        derived["work_uri"] = f"{root.rstrip('/')}/{DERIVED_WORK_DIR}"
    filled = dict(params)
    for name, value in derived.items():
        if name in info.parameters and value and not filled.get(name):
            filled[name] = value
    return filled


def _run_fields() -> dict[str, Any]:
    return fields()


def _gpu_node_errors(params: dict[str, Any]) -> list[str]:
    """KFP on GKE: the evaluate task's request against the GPU pool's machine (`machine_type`),
    for every run, schedule and dry run (review of issue 29, P1): a pod no node can host stays
    Pending after training was paid for, and KFP has no pending timeout."""
    known = {name: value for name, value in params.items() if name in fields()}
    run = params_from_mapping(known, base=RunParams.for_target("kfp"))
    return kfp_gpu_node_errors(run.machine_type) if run.backend == "gke" else []


def _run_parameter_errors(
    info: TemplateInfo | None, params: dict[str, Any], target: str
) -> list[str]:
    """The pipeline's own first-step checks (components/params/run_params.py), run here first, over the
    target's defaults (what the compiled template fills in for parameters not given).

    With our template (it declares every run parameter) all rules apply; with a template not yet
    fetched (a registry URI, a KFP pipeline version) the single-field rules of the values given;
    for any other template only the generic name/type checks of `parameter_errors`.
    """
    if info is None:
        return field_errors(params)
    if not set(fields()) <= set(info.parameters):
        return []
    base = RunParams.for_target(target)
    return run_errors(params_from_mapping(params, base=base), target=target)


def vertex_parameters(
    config: DeployConfig,
    *,
    schedule_time: dt.datetime | None,
    recurring: bool,
    credentials: Credentials | None,
) -> tuple[dict[str, Any], Credentials]:
    """The parameters of a Vertex AI run or schedule, and the credentials found for it.

    They are checked first without credentials or a server (a mistake is reported before either
    is needed), then again against the registry's template when `config.template` is a registry
    URI (`remote_template`).
    """
    params = prepare_parameters(config, "vertex", schedule_time=schedule_time, recurring=recurring)
    credentials = google_credentials(credentials)
    remote = remote_template(config, credentials)
    if remote is not None:
        params = prepare_parameters(
            config, "vertex", schedule_time=schedule_time, recurring=recurring, info=remote
        )
    return params, credentials


def dry_run(
    config: DeployConfig, backend: str, *, schedule_time: dt.datetime | None = None
) -> dict[str, Any]:
    """Every check `submit_vertex`/`submit_kfp` makes before contacting anything; the parameters
    the run would get. Needs no credentials and no server (a registry-URI or uploaded template
    is checked by name and type only, as it is not fetched).

    Raises:
        ValueError: every config or parameter problem, as a real submission would report them.
    """
    validate(config, "vertex" if backend == "vertex" else "kfp", "run")
    return prepare_parameters(config, backend, schedule_time=schedule_time, recurring=False)


def vertex_job(config: DeployConfig, params: dict[str, Any], credentials: Credentials) -> Any:
    """Build (not submit) the `aiplatform.PipelineJob` for this config."""
    from google.cloud import aiplatform

    v = config.vertex
    assert config.template and v.project, "validate(config, 'vertex', ...) first"
    return aiplatform.PipelineJob(
        display_name=config.display_name,
        template_path=config.template,
        pipeline_root=v.pipeline_root,
        parameter_values=params,
        enable_caching=v.enable_caching,
        encryption_spec_key_name=v.encryption_key,
        labels=dict(v.labels) or None,
        credentials=credentials,
        project=v.project,
        location=v.region,
        failure_policy=v.failure_policy,
    )


def submit_vertex(
    config: DeployConfig,
    *,
    schedule_time: dt.datetime | None = None,
    credentials: Credentials | None = None,
    wait: bool = False,
    poll_seconds: float = 30.0,
    report: Report = print,
) -> Submitted:
    """Submit one run to Vertex AI Pipelines."""
    validate(config, "vertex", "run")
    params, credentials = vertex_parameters(
        config, schedule_time=schedule_time, recurring=False, credentials=credentials
    )
    v = config.vertex
    with cloud_errors("submitting to Vertex AI Pipelines"):
        job = vertex_job(config, params, credentials)
        job.submit(service_account=v.service_account, network=v.network, experiment=v.experiment)
    assert v.project
    url = vertex_run_url(v.project, v.region, job.job_id)
    report(f"submitted {job.resource_name}\n{url}")
    if not wait:
        return Submitted("vertex", job.resource_name, url)

    def poll() -> str:
        with cloud_errors("polling the Vertex AI pipeline run"):
            return str(job.state.name)

    state = _follow(poll, _VERTEX_DONE, poll_seconds, report)
    if state != "PIPELINE_STATE_SUCCEEDED":
        raise ValueError(f"run {job.job_id} ended {state}: see {url}")
    return Submitted("vertex", job.resource_name, url, state)


def submit_kfp(
    config: DeployConfig,
    *,
    schedule_time: dt.datetime | None = None,
    client: kfp.client.Client | None = None,
    wait: bool = False,
    poll_seconds: float = 30.0,
    report: Report = print,
) -> Submitted:
    """Submit one run to a KFP server, into `kfp.experiment`."""
    validate(config, "kfp", "run")
    params = prepare_parameters(config, "kfp", schedule_time=schedule_time, recurring=False)
    k = config.kfp
    client = client or kfp_client(k)
    run_name = f"{config.display_name}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
    with cloud_errors("submitting to KFP"):
        if k.version_id:
            experiment = client.create_experiment(k.experiment, namespace=k.namespace)
            run = client.run_pipeline(
                experiment_id=experiment.experiment_id,
                job_name=run_name,
                params=params,
                pipeline_id=k.pipeline_id,
                version_id=k.version_id,
                pipeline_root=k.pipeline_root,
                enable_caching=k.enable_caching,
                service_account=k.service_account,
            )
            run_id = run.run_id
        else:
            assert config.template
            result = client.create_run_from_pipeline_package(
                config.template,
                arguments=params,
                run_name=run_name,
                experiment_name=k.experiment,
                namespace=k.namespace,
                pipeline_root=k.pipeline_root,
                enable_caching=k.enable_caching,
                service_account=k.service_account,
            )
            run_id = result.run_id
    url = kfp_ui_url(kfp_host(k), "runs", run_id)
    report(f"submitted run {run_id}\n{url}")
    if not wait:
        return Submitted("kfp", run_id, url)

    def poll() -> str:
        with cloud_errors("polling the KFP run"):
            return str(client.get_run(run_id).state)

    state = _follow(poll, _KFP_DONE, poll_seconds, report)
    if state != "SUCCEEDED":
        raise ValueError(f"run {run_id} ended {state}: see {url}")
    return Submitted("kfp", run_id, url, state)


def _follow(poll: Callable[[], str], done: set[str], seconds: float, report: Report) -> str:
    """Report each state change until a terminal state; return it."""
    last = None
    while True:
        state = poll()
        if state != last:
            report(f"{dt.datetime.now(dt.UTC):%H:%M:%S} {state}")
            last = state
        if state in done:
            return state
        time.sleep(seconds)
