"""The pipeline's train step: launch the trainer on the chosen backend, wait, describe the model.

`run(TrainRequest)` is what the `train` KFP component calls; `train(launch, options)` is the
step's core, which `llmft train` calls too. It starts N nodes x P processes with the launcher of
the options' backend (`LocalOptions`, `GkeOptions`, `VertexOptions`), follows them (SIGTERM
cancels what it started), and returns the metadata of the Model artifact read from the trainer's
OUTPUT/summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from components.launchers.base import (
    TRAINER_ENTRYPOINT,
    BackendOptions,
    Launcher,
    LogSink,
    TrainLaunch,
)
from components.launchers.vocab import BACKENDS, DEADLINE_GRACE_S, resolve_nproc_per_node
from components.params.by_step import TrainParams
from components.params.trainer_params import trainer_config
from components.platform.capacity import trainer_overrides_for
from components.platform.node_facts import interconnect_note
from components.preflight.actual_cost import COST_FILE, actual_cost
from components.preflight.launch_checks import preflight
from components.preflight.prices import gpu_hour_price
from components.runtime.artifacts import data_artifact_uri
from components.runtime.run_identity import safe_run_id
from components.serving.experiments import log_experiment_run
from components.serving.mlflow_tracking import end_failed, finish_train, open_tracked_step, run_tags
from components.steps.component_spec import StepComponent, component_input
from trainer import storage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainRequest:
    """The `train` component: its run parameters and its own inputs and outputs."""

    params: TrainParams
    """The run parameters the train step takes (`steps=(...)` in components/params/run_params.py;
    components/params/step_params.py `for_step`)."""
    run_id: str = component_input("str")
    dataset_uri: str = component_input("str")
    """The packed dataset (the preprocess step's `dataset_uri` output)."""
    rdzv_endpoint: str = component_input("str")
    """The etcd step's output ("" lets the launcher choose)."""
    budget_timeout_s: int = component_input("int")
    """The training job's timeout from the budget (the validate step's output; 0: none)."""
    model: Any = component_input("Output[Model]")
    """The Model artifact written: its `.uri` and `.metadata` are set here."""
    gcp_resources: str = component_input("OutputPath(str)")
    """Path of the component's gcp_resources output (Vertex: cancel with the pipeline)."""
    schedule_time: str = component_input("str", default="")
    """The run's schedule time (scheduled runs), a tag of its MLflow run."""


COMPONENT = StepComponent(
    name="train",
    request=TrainRequest,
    returns=(("model_uri", "str"),),
    doc="""Fine-tune with FSDP2 on N nodes x P processes: local torchrun agents, a PyTorchJob on GKE or
a Vertex AI CustomJob. Exports a Hugging Face model directory as the Model artifact.

The dataset comes by URI (the workers read it; an input artifact would first be downloaded
into this small launcher pod).

Returns:
    model_uri: where the exported Hugging Face model is (the Model artifact's files).
""",
)


def run(request: TrainRequest) -> tuple[str]:
    """The `train` component: train, describe the Model artifact, return `(model_uri,)`.

    The Model artifact holds the exported Hugging Face model only (the KFP launcher downloads
    every input artifact before a task runs: evaluate and register must not fetch optimizer
    state). The run directory (checkpoints, metrics.jsonl, TensorBoard, summary.json) is
    `run_directory(...)`: under `work_uri` in the cloud, keyed by the run id so a retried task
    resumes from its checkpoints; next to the artifact locally (inside the local run's pipeline
    root, where `llmft run`'s step table finds its metrics.jsonl). `nproc_per_node=0` starts one
    process per accelerator.
    """
    model = request.model
    model.uri = data_artifact_uri(
        model.uri, work_uri=request.params.work_uri, run_id=request.run_id, name="model"
    )
    launch = trainer_launch(request, model.uri)
    options = backend_options(request)
    p = request.params
    if note := interconnect_note(p.machine_type, p.nodes, gpudirect=p.gpudirect, backend=p.backend):
        logger.warning("%s", note)  # C8: a multi-node run says what bandwidth it assumes
    tags = run_tags(
        base_model=p.base_model,
        backend=p.backend,
        dataset_uri=str(request.dataset_uri),
        schedule=request.schedule_time,
    )
    tracked, mlflow_run = open_tracked_step(
        p.tracking_uri,
        p.tracking_token_secret,
        project=p.project,
        run_id=request.run_id,
        step="train",
        experiment=p.experiment,
        tags=tags,
    )
    if mlflow_run:  # the trainer's rank 0 logs its metrics into the step's MLflow run
        trainer = dataclasses.replace(
            launch.trainer, tracking_uri=p.tracking_uri, tracking_run_id=mlflow_run
        )
        launch = dataclasses.replace(launch, trainer=trainer)
    try:
        metadata = train(launch, options, timeout_s=training_timeout_s(request))
    except BaseException:
        end_failed(tracked, mlflow_run)
        raise
    metadata |= record_actual_cost(request, metadata.pop("job_times"), launch.trainer.output)
    model.metadata.update(metadata)
    finish_train(
        tracked,
        mlflow_run,
        params=experiment_params(request),
        metadata=model.metadata,
        run_dir=launch.trainer.output,
    )
    if request.params.experiment:
        log_experiment_run(
            experiment=request.params.experiment,
            run_id=request.run_id,
            project=request.params.project,
            location=request.params.region,
            params=experiment_params(request),
            metrics=model.metadata,
        )
    return (str(model.metadata["model_uri"]),)


def training_timeout_s(request: TrainRequest) -> int:
    """When the launcher cancels the job: `train_timeout_s`, or earlier when the budget leaves
    less (`budget_timeout_s`), so that the job's own deadline (`DEADLINE_GRACE_S` later, for a
    launcher killed before it could cancel) still falls within the budget."""
    timeout = request.params.train_timeout_s
    if request.budget_timeout_s:
        timeout = min(timeout, max(request.budget_timeout_s - DEADLINE_GRACE_S, 60))
    return timeout


def record_actual_cost(
    request: TrainRequest, times: Mapping[str, Any], output: str
) -> dict[str, Any]:
    """The training job's actual GPU-hours and cost, from its own start and end times, written to
    OUTPUT/cost.json (the evaluate step's report reads it) and returned for the Model's metadata."""
    cloud = request.params.backend != "local" and bool(request.params.accelerator_type)
    gpus = request.params.nodes * request.params.accelerator_count if cloud else 0
    price = (
        gpu_hour_price(
            request.params.accelerator_type,
            request.params.capacity,
            override=request.params.gpu_hour_price_usd,
        )
        if gpus
        else 0.0
    )
    actual = actual_cost(
        started=times["started_at"],
        ended=times["ended_at"],
        gpus=gpus,
        gpu_hour_usd=price,
        capacity=request.params.capacity,
        queued_s=float(times.get("queued_s") or 0.0),
    )
    summary_path = output.rstrip("/") + "/summary.json"
    if storage.exists(summary_path):
        summary = read_summary(output)
        actual |= {k: summary.get(k) for k in ("attempts", "preemptions")}
    storage.write_text(output.rstrip("/") + "/" + COST_FILE, json.dumps(actual, indent=2))
    logger.info("actual training cost: %s", json.dumps(actual))
    return {"gpu_hours": actual["gpu_hours"], "cost_usd": actual["cost_usd"]}


def experiment_params(request: TrainRequest) -> dict[str, Any]:
    """The run's training parameters as Vertex Experiments records them (scalars only)."""
    params: dict[str, Any] = {
        "backend": request.params.backend,
        "base_model": request.params.base_model,
        "nodes": request.params.nodes,
        "nproc_per_node": request.params.nproc_per_node,
        "max_steps": request.params.max_steps,
        "learning_rate": request.params.learning_rate,
        "machine_type": request.params.machine_type,
        "accelerator_type": request.params.accelerator_type,
        "accelerator_count": request.params.accelerator_count,
    }
    for key, value in sorted((request.params.trainer_overrides or {}).items()):
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            params[f"trainer.{key}"] = value
    return params


def trainer_launch(request: TrainRequest, model_uri: str) -> TrainLaunch:
    """What the request runs: the trainer's config (paths as the workers see them) on N x P."""
    local = request.params.backend == "local"
    data = str(request.dataset_uri)
    if not local:
        check_worker_readable(data)
    export_dir = storage.normalize(model_uri) if local else model_uri
    output = run_directory(
        backend=request.params.backend,
        work_uri=request.params.work_uri,
        run_id=request.run_id,
        model_dir=export_dir,
    )
    trainer = trainer_config(
        trainer_overrides_for(request.params.capacity, request.params.trainer_overrides or {}),
        max_steps=request.params.max_steps,
        learning_rate=request.params.learning_rate,
        quantize_base=request.params.quantize_base,
        objective=request.params.objective,
        rewards=request.params.rewards,
        reward_module=request.params.reward_module,
        model=request.params.base_model,
        data=storage.normalize(data) if local else data,
        output=output,
    )
    return TrainLaunch(
        run_id=request.run_id,
        trainer=dataclasses.replace(trainer, export_dir=export_dir),
        nodes=request.params.nodes,
        nproc_per_node=resolve_nproc_per_node(
            request.params.backend, request.params.nproc_per_node, request.params.accelerator_count
        ),
        rdzv_backend=request.params.rdzv_backend,
        rdzv_endpoint=request.rdzv_endpoint,
    )


def backend_options(request: TrainRequest) -> BackendOptions:
    """The request's backend, with the run parameters that concern it (its own step module)."""
    # Only the chosen backend's module is imported, here: a GKE launch loads neither the Vertex
    # launcher nor the local processes and etcd, a local run no cloud launcher (measured in
    # docs/architecture.md, "The train step's backends"; tests/test_import_contracts.py).
    p = request.params
    if p.backend == "gke":
        from components.steps.train_gke import gke_options

        return gke_options(p, timeout_s=training_timeout_s(request))
    if p.backend == "vertex":
        # the chosen backend's module only (see above)
        from components.steps.train_vertex import vertex_options

        return vertex_options(
            p,
            run_id=request.run_id,
            gcp_resources=request.gcp_resources,
            timeout_s=training_timeout_s(request),
        )
    if p.backend == "local":
        # the chosen backend's module only (see above)
        from components.steps.train_local import local_options

        return local_options()
    raise unknown_backend(p.backend)


def unknown_backend(backend: str) -> ValueError:
    """The error for a backend that is none of the schema's choices."""
    return ValueError(f"backend={backend!r}: choose one of {', '.join(BACKENDS)}")


def launcher(options: BackendOptions, *, log: LogSink | None = None) -> Launcher:
    """The launcher of the options' backend (the options make it: their type is the backend)."""
    return options.launcher(log=log)


def train(
    launch: TrainLaunch,
    options: BackendOptions,
    *,
    timeout_s: float | None = None,
    log: LogSink | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train `launch` where `options` say and return the Model artifact's metadata.

    Paths in `launch.trainer` are as the workers see them (gs:// on GKE and Vertex;
    `export_dir` is where the HF model goes). Vertex always rendezvouses with c10d at the primary
    replica: another rdzv_backend is ignored there, with a warning. With an entrypoint other than
    the trainer's (tests run a stand-in script) the trainer's preflight is skipped. `overwrite`
    deletes the checkpoints a previous run left in the output (once the preflight passed) instead
    of refusing to resume from another run's checkpoint.

    Returns:
        base_model, steps, tokens, target_tokens, final_loss, model_uri (+ run facts).

    Raises:
        ValueError: invalid options or inputs (all listed together), before anything starts.
        LaunchFailed: the run failed or was cancelled (with the reason and last log lines).
    """
    if options.backend == "vertex" and launch.rdzv_backend != "c10d":
        logger.warning(
            "rdzv_backend=%s is ignored on Vertex: c10d at the primary replica",
            launch.rdzv_backend,
        )
        launch = dataclasses.replace(launch, rdzv_backend="c10d", rdzv_endpoint="")
    launch.validate()
    local = options.backend == "local"
    if launch.entrypoint == TRAINER_ENTRYPOINT:
        launch.trainer.validate()  # before the lock creates the output directory
    held: AbstractContextManager[None] = nullcontext()
    if local:  # checked, then locked: one run at a time into a local output
        from components.steps.train_local import checked_output

        held = checked_output(launch)
    with held, storage.disk_errors_named(launch.trainer.output):  # the launcher's logs and state
        if launch.entrypoint == TRAINER_ENTRYPOINT:
            preflight(launch.trainer, local=local, overwrite=overwrite)
        if overwrite:
            storage.remove(launch.trainer.checkpoints_dir())
        runner = options.launcher(log=log)
        result = runner.run(launch, timeout=timeout_s)
        runner.log(f"[launcher] {result.describe()}")
        result.raise_for_status()
    output = launch.trainer.output
    metadata = model_metadata(
        read_summary(output), output=output, launch=launch, backend=runner.backend
    )
    times = {k: result.details[k] for k in ("started_at", "ended_at")}
    times["queued_s"] = result.details.get("queued_s", 0.0)  # GKE: waiting in a Kueue queue
    return {**metadata, "job_times": times}


def read_summary(output: str) -> dict[str, Any]:
    """OUTPUT/summary.json written by the trainer (local path or any fsspec URI)."""
    path = output.rstrip("/") + "/summary.json"
    try:
        with storage.open(path, "r") as handle:
            return dict(json.load(handle))
    except FileNotFoundError:
        raise RuntimeError(
            f"the training run ended without {path}: the trainer did not finish its export"
        ) from None


def model_metadata(
    summary: Mapping[str, Any], *, output: str, launch: TrainLaunch, backend: str
) -> dict[str, Any]:
    """Model artifact metadata: what it was trained from, for what (`objective`; with DPO its
    `dpo_beta`, which the evaluate step scales the implicit rewards by, and `quantize_base` with
    the trainer's `compute_dtype`, from which it rebuilds DPO's reference after QLoRA), how far,
    where the HF files are (`model_uri`) and where the run's checkpoints, metrics and
    TensorBoard logs are (`run_uri`)."""
    trainer = launch.trainer
    dpo = {"dpo_beta": trainer.dpo_beta} if trainer.objective == "dpo" else {}
    if trainer.objective == "grpo":  # the evaluation answers as long as the rollouts could
        dpo = {"grpo_max_completion_tokens": trainer.grpo_max_completion_tokens}
    quantized = (
        {
            "quantize_base": trainer.quantize_base,
            "compute_dtype": summary.get("compute_dtype", trainer.dtype),
        }
        if trainer.quantize_base != "none"
        else {}
    )
    export_dir = launch.trainer.export_dir
    model_uri = summary.get("model_dir") or export_dir or output.rstrip("/") + "/model"
    return {
        "base_model": summary.get("base_model", launch.model),
        "steps": summary.get("steps"),
        "tokens": summary.get("tokens"),
        "target_tokens": summary.get("target_tokens"),
        "final_loss": summary.get("final_loss"),
        "objective": trainer.objective,
        **dpo,
        **quantized,
        "model_uri": model_uri,
        "run_uri": output,
        "dataset_uri": launch.data,  # lineage: the data came by URI, not as an input artifact
        "run_id": launch.run_id,
        "backend": backend,
        "nodes": launch.nodes,
        "nproc_per_node": launch.nproc_per_node,
        "rdzv_backend": launch.rdzv_backend,
    }


def run_directory(*, backend: str, work_uri: str, run_id: str, model_dir: str) -> str:
    """The trainer's run directory: `<work_uri>/runs/<run>/train` in the cloud (workers write it,
    a retry resumes from it) and for a local run with a remote `work_uri`; otherwise locally
    `<artifact dir>/../train-run`, beside the Model artifact."""
    if backend == "local" and not storage.is_remote(work_uri):
        return os.path.join(os.path.dirname(model_dir.rstrip("/")), "train-run")
    if backend != "local" and not work_uri.startswith("gs://"):
        raise ValueError(
            f"work_uri={work_uri!r}: the {backend} backend keeps the run's checkpoints and logs "
            "under a gs:// work_uri"
        )
    return f"{work_uri.rstrip('/')}/runs/{safe_run_id(run_id)}/train"


def check_worker_readable(uri: str) -> None:
    """Cloud workers read artifacts by gs:// URI; KFP's default minio:// root is out of reach."""
    if not uri.startswith("gs://"):
        raise ValueError(
            f"the dataset artifact is at {uri!r}, which PyTorchJob pods and Vertex replicas cannot "
            "read: run the pipeline with a gs:// pipeline root (llmft run --pipeline-root gs://...)"
        )
