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
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from components.launchers.base import TRAINER_ENTRYPOINT, Launcher, LogSink, TrainLaunch
from components.launchers.customjob import CustomJobOptions
from components.launchers.gke import GkeLauncher, GkeOptions
from components.launchers.local import LocalLauncher, LocalOptions
from components.launchers.node_setup import GPUDIRECT_SETUPS, ephemeral_storage_request
from components.launchers.pytorchjob import DEADLINE_GRACE_S, PyTorchJobOptions, deadline_for
from components.launchers.vertex import VertexLauncher, VertexOptions
from components.params.run_params import Backend, Capacity, RdzvBackend, choices
from components.platform.node_facts import interconnect, interconnect_note
from components.platform.platform_facts import gke_accelerator
from components.preflight.train_fit import weight_bytes
from trainer import storage

logger = logging.getLogger(__name__)

BackendOptions = LocalOptions | GkeOptions | VertexOptions
"""Where and how training runs; its type is the backend."""


@dataclass(frozen=True)
class TrainRequest:
    """The `train` component's parameters (components/kfp_components.py), by the same names;
    each run parameter's meaning and default are in components/params/run_params.py."""

    backend: Backend
    run_id: str
    base_model: str
    dataset_uri: str
    """The packed dataset (the preprocess step's `dataset_uri` output)."""
    rdzv_endpoint: str
    """The etcd step's output ("" lets the launcher choose)."""
    rdzv_backend: RdzvBackend
    nodes: int
    nproc_per_node: int
    max_steps: int
    learning_rate: float
    trainer_overrides: Mapping[str, Any]
    quantize_base: str
    objective: str
    project: str
    region: str
    work_uri: str
    namespace: str
    gke_cluster: str
    machine_type: str
    accelerator_type: str
    accelerator_count: int
    service_account: str
    hf_token_secret: str
    train_timeout_s: int
    """The launcher cancels the job after this long; the job carries it too, plus a grace."""
    capacity: Capacity
    max_wait_minutes: int
    reservation: str
    gpu_hour_price_usd: float
    budget_timeout_s: int
    """The training job's timeout from the budget (the validate step's output; 0: none)."""
    model: Any
    """The Model artifact written: its `.uri` and `.metadata` are set here."""
    gcp_resources: str
    """Path of the component's gcp_resources output (Vertex: cancel with the pipeline)."""
    # --- TensorBoard, Experiments and CMEK (issue 30) ---
    tensorboard: str = ""
    """Vertex AI TensorBoard instance the CustomJob uploads its events to ("" for none)."""
    experiment: str = ""
    """Vertex AI Experiment that gets a run with the parameters and final metrics ("" none)."""
    encryption_key: str = ""
    """Cloud KMS key of the CustomJob ("" for Google-managed encryption)."""


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
    from components.runtime.artifacts import data_artifact_uri

    model = request.model
    model.uri = data_artifact_uri(
        model.uri, work_uri=request.work_uri, run_id=request.run_id, name="model"
    )
    launch = trainer_launch(request, model.uri)
    options = backend_options(request)
    if note := interconnect_note(
        request.machine_type, request.nodes, gpudirect=request.gpudirect, backend=request.backend
    ):
        logger.warning("%s", note)  # C8: a multi-node run says what bandwidth it assumes
    metadata = train(launch, options, timeout_s=training_timeout_s(request))
    metadata |= record_actual_cost(request, metadata.pop("job_times"), launch.trainer.output)
    model.metadata.update(metadata)
    if request.experiment:
        from components.serving.experiments import log_experiment_run

        log_experiment_run(
            experiment=request.experiment,
            run_id=request.run_id,
            project=request.project,
            location=request.region,
            params=experiment_params(request),
            metrics=model.metadata,
        )
    return (str(model.metadata["model_uri"]),)


def training_timeout_s(request: TrainRequest) -> int:
    """When the launcher cancels the job: `train_timeout_s`, or earlier when the budget leaves
    less (`budget_timeout_s`), so that the job's own deadline (`DEADLINE_GRACE_S` later, for a
    launcher killed before it could cancel) still falls within the budget."""
    timeout = request.train_timeout_s
    if request.budget_timeout_s:
        timeout = min(timeout, max(request.budget_timeout_s - DEADLINE_GRACE_S, 60))
    return timeout


def record_actual_cost(
    request: TrainRequest, times: Mapping[str, str], output: str
) -> dict[str, Any]:
    """The training job's actual GPU-hours and cost, from its own start and end times, written to
    OUTPUT/cost.json (the evaluate step's report reads it) and returned for the Model's metadata."""
    from components.preflight import cost

    cloud = request.backend != "local" and bool(request.accelerator_type)
    gpus = request.nodes * request.accelerator_count if cloud else 0
    price = (
        cost.gpu_hour_price(
            request.accelerator_type, request.capacity, override=request.gpu_hour_price_usd
        )
        if gpus
        else 0.0
    )
    actual = cost.actual_cost(
        started=times["started_at"],
        ended=times["ended_at"],
        gpus=gpus,
        gpu_hour_usd=price,
        capacity=request.capacity,
    )
    summary_path = output.rstrip("/") + "/summary.json"
    if storage.exists(summary_path):
        summary = read_summary(output)
        actual |= {k: summary.get(k) for k in ("attempts", "preemptions")}
    storage.write_text(output.rstrip("/") + "/" + cost.COST_FILE, json.dumps(actual, indent=2))
    logger.info("actual training cost: %s", json.dumps(actual))
    return {"gpu_hours": actual["gpu_hours"], "cost_usd": actual["cost_usd"]}


def experiment_params(request: TrainRequest) -> dict[str, Any]:
    """The run's training parameters as Vertex Experiments records them (scalars only)."""
    params: dict[str, Any] = {
        "backend": request.backend,
        "base_model": request.base_model,
        "nodes": request.nodes,
        "nproc_per_node": request.nproc_per_node,
        "max_steps": request.max_steps,
        "learning_rate": request.learning_rate,
        "machine_type": request.machine_type,
        "accelerator_type": request.accelerator_type,
        "accelerator_count": request.accelerator_count,
    }
    for key, value in sorted((request.trainer_overrides or {}).items()):
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            params[f"trainer.{key}"] = value
    return params


def vertex_output_directory(request: TrainRequest) -> str:
    """The CustomJob's base_output_directory: Vertex puts AIP_TENSORBOARD_LOG_DIR (and
    AIP_MODEL_DIR, AIP_CHECKPOINT_DIR) under it."""
    from components.runtime.run_identity import safe_run_id

    return storage.join(request.work_uri, "runs", safe_run_id(request.run_id), "vertex")


def trainer_launch(request: TrainRequest, model_uri: str) -> TrainLaunch:
    """What the request runs: the trainer's config (paths as the workers see them) on N x P."""
    from components.params.param_checks import resolve_nproc_per_node
    from components.params.trainer_params import trainer_config
    from components.platform.capacity import trainer_overrides_for

    local = request.backend == "local"
    data = str(request.dataset_uri)
    if not local:
        check_worker_readable(data)
    export_dir = storage.normalize(model_uri) if local else model_uri
    output = run_directory(
        backend=request.backend,
        work_uri=request.work_uri,
        run_id=request.run_id,
        model_dir=export_dir,
    )
    trainer = trainer_config(
        trainer_overrides_for(request.capacity, request.trainer_overrides or {}),
        max_steps=request.max_steps,
        learning_rate=request.learning_rate,
        quantize_base=request.quantize_base,
        objective=request.objective,
        model=request.base_model,
        data=storage.normalize(data) if local else data,
        output=output,
    )
    return TrainLaunch(
        run_id=request.run_id,
        trainer=dataclasses.replace(trainer, export_dir=export_dir),
        nodes=request.nodes,
        nproc_per_node=resolve_nproc_per_node(
            request.backend, request.nproc_per_node, request.accelerator_count
        ),
        rdzv_backend=request.rdzv_backend,
        rdzv_endpoint=request.rdzv_endpoint,
    )


def backend_options(request: TrainRequest) -> BackendOptions:
    """The request's backend, with the run parameters that concern it."""
    if request.backend == "gke":
        job = PyTorchJobOptions(
            namespace=request.namespace,
            accelerator=gke_accelerator(request.accelerator_type),
            gpus_per_node=request.accelerator_count or None,
            service_account=request.service_account or None,
            hf_token_secret=request.hf_token_secret or None,
            # Ends the job on the cluster even if this step is killed before it can cancel.
            active_deadline_seconds=deadline_for(training_timeout_s(request)),
            # C6: each pod copies the base model to its node's disk; C8: the GPU NIC networks.
            ephemeral_storage=ephemeral_storage_request(weight_bytes(request.base_model)),
            gpudirect=gpudirect_setup(request),
            **gke_capacity(request),
        )
        return GkeOptions(job=job, cluster=request.gke_cluster)
    if request.backend == "vertex":
        custom_job = CustomJobOptions(
            machine_type=request.machine_type,
            accelerator_type=request.accelerator_type or None,
            accelerator_count=request.accelerator_count or None,
            service_account=request.service_account or None,
            hf_token_secret=request.hf_token_secret or None,
            timeout_s=deadline_for(training_timeout_s(request)),
            **vertex_capacity(request),
            tensorboard=request.tensorboard or None,
            base_output_directory=vertex_output_directory(request) if request.tensorboard else None,
            encryption_key=request.encryption_key or None,
        )
        return VertexOptions(
            project=request.project,
            location=request.region,
            job=custom_job,
            gcp_resources_path=request.gcp_resources or None,
        )
    if request.backend == "local":
        return LocalOptions()
    raise unknown_backend(request.backend)


def gpudirect_setup(request: TrainRequest) -> str | None:
    """The GPUDirect pod setup of a multi-node GKE run with `gpudirect` on, on a machine family
    that needs one (node_facts.INTERCONNECTS); None otherwise."""
    entry = interconnect(request.machine_type)
    if not request.gpudirect or request.nodes < 2 or entry is None:
        return None
    return entry.gke_setup if entry.gke_setup in GPUDIRECT_SETUPS else None


def gke_capacity(request: TrainRequest) -> dict[str, Any]:
    """PyTorchJobOptions for the capacity: on Spot the pods keep at least Kubernetes' default
    grace period (POD_TERMINATION_GRACE_S; a preemption itself gives only GKE_SPOT_POD_GRACE_S)
    and more restarts (the budget's deadline is `training_timeout_s`)."""
    from components.platform.capacity import (
        POD_TERMINATION_GRACE_S,
        SPOT_RESTARTS_PER_NODE,
        preemptible,
    )

    options: dict[str, Any] = {"capacity": request.capacity}
    if preemptible(request.capacity):
        options |= {
            "termination_grace_s": POD_TERMINATION_GRACE_S,
            "restarts_per_node": SPOT_RESTARTS_PER_NODE,
        }
    return options


def vertex_capacity(request: TrainRequest) -> dict[str, Any]:
    """CustomJobOptions for the capacity: on Spot a restarted replica restarts them all (the
    rendezvous needs every replica; they resume from the newest checkpoint). The budget's timeout
    is `training_timeout_s`."""
    from components.platform.capacity import preemptible

    return {
        "capacity": request.capacity,
        "max_wait_s": request.max_wait_minutes * 60 or None,
        "reservation": request.reservation or None,
        "restart_job_on_worker_restart": preemptible(request.capacity),
    }


def unknown_backend(backend: str) -> ValueError:
    """The error for a backend that is none of the schema's choices."""
    return ValueError(f"backend={backend!r}: choose one of {', '.join(choices('backend'))}")


def launcher(options: BackendOptions, *, log: LogSink | None = None) -> Launcher:
    """The launcher of the options' backend (the one place a backend maps to its launcher)."""
    if isinstance(options, LocalOptions):
        return LocalLauncher(options, log=log)
    if isinstance(options, GkeOptions):
        return GkeLauncher(options, log=log)
    return VertexLauncher(options, log=log)


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
    from components.preflight.launch_checks import check_rendezvous, preflight

    if isinstance(options, VertexOptions) and launch.rdzv_backend != "c10d":
        logger.warning(
            "rdzv_backend=%s is ignored on Vertex: c10d at the primary replica",
            launch.rdzv_backend,
        )
        launch = dataclasses.replace(launch, rdzv_backend="c10d", rdzv_endpoint="")
    launch.validate()
    local = isinstance(options, LocalOptions)
    if launch.entrypoint == TRAINER_ENTRYPOINT:
        launch.trainer.validate()  # before the lock creates the output directory
    if local:  # also before the lock: a run that cannot start creates nothing
        if problem := storage.not_writable(launch.trainer.output):
            raise ValueError(f"output {launch.trainer.output!r}: {problem}")
        check_rendezvous(launch.rdzv_backend, launch.rdzv_endpoint)
    # One run at a time into a local output: a second one is refused before it reads or deletes
    # anything of the first's (the lock goes with this process, however it ends).
    with storage.exclusive_output(launch.trainer.output, "llmft train") if local else nullcontext():
        if launch.entrypoint == TRAINER_ENTRYPOINT:
            preflight(launch.trainer, local=local, overwrite=overwrite)
        if overwrite:
            storage.remove(launch.trainer.checkpoints_dir())
        runner = launcher(options, log=log)
        result = runner.run(launch, timeout=timeout_s)
        runner.log(f"[launcher] {result.describe()}")
        result.raise_for_status()
    output = launch.trainer.output
    metadata = model_metadata(
        read_summary(output), output=output, launch=launch, backend=runner.backend
    )
    times = {k: result.details[k] for k in ("started_at", "ended_at")}
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
    from components.runtime.run_identity import safe_run_id

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
