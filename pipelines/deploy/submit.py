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

from pipelines.deploy.clients import (
    cloud_errors,
    google_credentials,
    kfp_client,
    kfp_host,
    kfp_ui_url,
    vertex_run_url,
)
from pipelines.deploy.config import DeployConfig, validate
from pipelines.deploy.template import (
    check_for_backend,
    fill_schedule_time,
    parameter_errors,
    read_template,
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


def prepare_parameters(
    config: DeployConfig, backend: str, *, schedule_time: dt.datetime | None, recurring: bool
) -> dict[str, Any]:
    """Check the parameters against a local template and settle the schedule-time placeholder.

    Raises:
        ValueError: every parameter problem at once; or a one-off run left the schedule-time
            placeholder unfilled (a recurring run keeps it for the pipeline to resolve).
    """
    params = dict(config.parameters)
    # The pipeline's own `backend` parameter says where the trainer runs; its compiled default
    # is `local`, which cannot work on a cloud backend.
    trainer_default = {"vertex": "vertex", "kfp": "gke"}[backend]
    params.setdefault("backend", trainer_default)
    if params["backend"] == "local":
        raise ValueError(
            f"parameter backend=local runs the trainer on this machine; on {backend} use "
            f"backend={trainer_default}" + (" or backend=gke" if backend == "vertex" else "")
        )
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
    if template and not template.startswith(("http://", "https://")):
        info = read_template(template)
        check_for_backend(info, backend)
        errors = parameter_errors(info, params)
        if errors:
            raise ValueError(f"{len(errors)} parameter problem(s):\n  - " + "\n  - ".join(errors))
    return params


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
        location=v.location,
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
    params = prepare_parameters(config, "vertex", schedule_time=schedule_time, recurring=False)
    credentials = google_credentials(credentials)
    v = config.vertex
    with cloud_errors("submitting to Vertex AI Pipelines"):
        job = vertex_job(config, params, credentials)
        job.submit(service_account=v.service_account, network=v.network, experiment=v.experiment)
    assert v.project
    url = vertex_run_url(v.project, v.location, job.job_id)
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
