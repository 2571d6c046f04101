"""The pipeline's train step: launch the trainer on the chosen backend, wait, describe the model.

`run_train_step` is what the `train` KFP component calls (through `run_train_component`, which maps
the component's flat parameters); `llmft train` calls it too. It starts N nodes x P processes with
the backend's launcher, follows them (SIGTERM cancels what it started), and returns the metadata of
the Model artifact read from the trainer's OUTPUT/summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.launchers.base import (
    BACKENDS,
    TRAINER_ENTRYPOINT,
    LogSink,
    TrainLaunch,
    get_launcher,
)
from components.run_params import RunParams
from trainer import storage
from trainer.config import TrainConfig

logger = logging.getLogger(__name__)

GKE_ACCELERATORS = {
    "NVIDIA_H200_141GB": "nvidia-h200-141gb",
    "NVIDIA_H100_MEGA_80GB": "nvidia-h100-mega-80gb",
    "NVIDIA_H100_80GB": "nvidia-h100-80gb",
    "NVIDIA_A100_80GB": "nvidia-a100-80gb",
    "NVIDIA_TESLA_A100": "nvidia-tesla-a100",
    "NVIDIA_L4": "nvidia-l4",
    "NVIDIA_TESLA_T4": "nvidia-tesla-t4",
    "NVIDIA_TESLA_V100": "nvidia-tesla-v100",
}
"""Vertex accelerator names -> GKE's `cloud.google.com/gke-accelerator` values (they differ)."""


def gke_accelerator(name: str) -> str | None:
    """GKE accelerator label for a Vertex-style or GKE-style name; None/"" means CPU only."""
    if not name:
        return None
    return GKE_ACCELERATORS.get(name, name if name == name.lower() else None) or _unknown(name)


def _unknown(name: str) -> str:
    raise ValueError(
        f"accelerator {name!r}: use a GKE accelerator label (e.g. nvidia-h100-80gb) or one of "
        f"{', '.join(GKE_ACCELERATORS)}"
    )


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
    """Model artifact metadata: what it was trained from, how far, where the HF files are
    (`model_uri`) and where the run's checkpoints, metrics and TensorBoard logs are (`run_uri`)."""
    export_dir = launch.trainer.export_dir
    model_uri = summary.get("model_dir") or export_dir or output.rstrip("/") + "/model"
    return {
        "base_model": summary.get("base_model", launch.model),
        "steps": summary.get("steps"),
        "tokens": summary.get("tokens"),
        "target_tokens": summary.get("target_tokens"),
        "final_loss": summary.get("final_loss"),
        "model_uri": model_uri,
        "run_uri": output,
        "run_id": launch.run_id,
        "backend": backend,
        "nodes": launch.nodes,
        "nproc_per_node": launch.nproc_per_node,
        "rdzv_backend": launch.rdzv_backend,
    }


def run_train_step(
    *,
    backend: str,
    run_id: str,
    trainer: TrainConfig,
    nodes: int = 1,
    nproc_per_node: int = 1,
    rdzv_backend: str = RunParams.rdzv_backend,
    rdzv_endpoint: str = "",
    max_restarts: int = 0,
    timeout_s: float | None = None,
    gcp_resources_path: str | None = None,
    log: LogSink | None = None,
    entrypoint: tuple[str, ...] | None = None,
    local: Mapping[str, Any] | None = None,
    gke: Mapping[str, Any] | None = None,
    vertex: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train on `backend` and return the Model artifact's metadata.

    Args:
        backend: local, gke or vertex.
        run_id: the pipeline run id (names, labels, rendezvous id).
        trainer: the trainer's config (model, data, output as the workers see them: gs:// on GKE
            and Vertex; `export_dir` is where the HF model goes); every rank receives it as one
            JSON argument.
        nodes, nproc_per_node: N nodes x P processes.
        rdzv_backend, rdzv_endpoint: torchrun rendezvous ("" endpoint: the backend's default; see
            each launcher). Vertex always uses c10d at the primary replica.
        max_restarts: torchrun restarts of the worker group.
        timeout_s: give up (and cancel) after this long.
        gcp_resources_path: the component's gcp_resources output (Vertex: cancel-with-pipeline).
        log: where progress and logs go (default stdout).
        entrypoint: what torchrun runs (default `-m trainer`; tests run a stand-in script, and
            then the trainer's data preflight is skipped).
        local: LocalLauncher options (log_dir, state_root, grace_s, ...).
        gke: GkeLauncher options (api_client, cluster, namespace, job_options, poll_s, ...).
        vertex: VertexLauncher options (project, location, job_options, client, poll_s, ...).

    Returns:
        base_model, steps, tokens, target_tokens, final_loss, model_uri (+ run facts).

    Raises:
        ValueError: invalid options or inputs (all listed together), before anything starts.
        LaunchFailed: the run failed or was cancelled (with the reason and last log lines).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "vertex" and rdzv_backend != "c10d":
        logger.warning(
            "rdzv_backend=%s is ignored on Vertex: c10d at the primary replica", rdzv_backend
        )
        rdzv_backend, rdzv_endpoint = "c10d", ""
    launch = TrainLaunch(
        run_id=run_id, trainer=trainer, nodes=nodes, nproc_per_node=nproc_per_node,
        rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, max_restarts=max_restarts,
        **({"entrypoint": tuple(entrypoint)} if entrypoint else {}),
    )  # fmt: skip
    launch.validate()
    if launch.entrypoint == TRAINER_ENTRYPOINT:
        preflight(launch.trainer, local=backend == "local")
    options: dict[str, Any] = dict({"local": local, "gke": gke, "vertex": vertex}[backend] or {})
    if log is not None:
        options["log"] = log
    if backend == "vertex" and gcp_resources_path:
        options.setdefault("gcp_resources_path", gcp_resources_path)
    launcher = get_launcher(backend, **options)
    result = launcher.run(launch, timeout=timeout_s)
    launcher.log(f"[launcher] {result.describe()}")
    result.raise_for_status()
    output = trainer.output
    return model_metadata(read_summary(output), output=output, launch=launch, backend=backend)


def preflight(config: TrainConfig, *, local: bool) -> None:
    """What the trainer would find out on every rank, found here once, before torchrun or a
    cloud job starts: each problem in one ValueError.

    Checks that the dataset is a non-empty packed dataset, that the model exists (a name that is
    neither a directory nor a hub id `owner/name` would go to the hub and fail on every rank),
    and, for a local model directory, that its tokenizer is the one the data was packed with and
    that it has positions for `seq_len` tokens. `local`: the model and data paths are on this
    machine (the local backend); otherwise only what is readable here (gs:// via fsspec) is read.
    """
    from trainer.packed_data.format import read_manifest

    config.validate()
    errors: list[str] = []
    model_dir = _local_model_dir(config.model, errors, local=local)
    if model_dir is not None and (model_dir / "config.json").is_file():
        # A family feature the chosen attention cannot compute exactly (e.g. gpt-oss's sinks
        # with attention=sdpa) is refused here, before any node starts.
        from trainer.attention import check_model

        try:
            check_model(config.attention, str(model_dir))
        except ValueError as exc:
            errors.append(str(exc))
    manifest = None
    if local or "://" in config.data:
        try:
            manifest = read_manifest(config.data)
        except (FileNotFoundError, ValueError) as exc:
            errors.append(f"data {config.data!r}: {exc}")
    if manifest is not None:
        if manifest.splits["train"].rows == 0:
            errors.append(f"data {config.data!r} has no training rows: see its stats.json")
        if config.seq_len is not None and config.seq_len != manifest.seq_len:
            errors.append(
                f"seq_len={config.seq_len} but the dataset was packed with seq_len="
                f"{manifest.seq_len}: drop seq_len or re-run preprocessing"
            )
        if model_dir is not None:
            errors += _model_fits_errors(model_dir, config, manifest)
    if errors:
        raise ValueError("the training run cannot start:\n  - " + "\n  - ".join(errors))


def _local_model_dir(model: str, errors: list[str], *, local: bool) -> Path | None:
    """The model's local directory, None for a URI or a hub id; records a missing model."""
    if "://" in model:
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from trainer.gguf import is_gguf

    if is_gguf(model):
        if not path.is_file() and local:
            errors.append(f"model {model!r} does not exist: pass an existing .gguf file")
        return None  # converted on each node; its tokenizer is checked by the trainer
    if not local:
        return None  # a path inside the training image or on a shared volume
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        return None  # a hub id (owner/name): downloaded by every node
    errors.append(
        f"model {model!r} is not a directory here nor a hub id like owner/name: pass a Hugging "
        "Face model directory (llmft tiny-model writes one)"
    )
    return None


def _model_fits_errors(model_dir: Path, config: TrainConfig, manifest: Any) -> list[str]:
    """The tokenizer matches the dataset's, and the model has positions for its rows."""
    from trainer.packed_data.format import TokenizerIdentity, compatibility_errors

    errors = []
    model_config = model_dir / "config.json"
    if not model_config.is_file():
        return [f"model {str(model_dir)!r} has no config.json: pass a Hugging Face model directory"]
    positions = json.loads(model_config.read_text()).get("max_position_embeddings")
    if isinstance(positions, int) and positions < manifest.seq_len:
        errors.append(
            f"model {str(model_dir)!r} has {positions} positions but the dataset's rows are "
            f"{manifest.seq_len} tokens: re-run preprocessing with seq_len <= {positions}"
        )
    tokenizer_dir = Path(config.resolved_tokenizer()).expanduser()
    if tokenizer_dir.is_dir():
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        except (OSError, ValueError) as exc:
            return [*errors, f"tokenizer {str(tokenizer_dir)!r} does not load: {exc}"]
        errors += compatibility_errors(manifest, TokenizerIdentity.of(tokenizer), None)
    return errors


def run_train_component(
    *,
    backend: str,
    run_id: str,
    base_model: str,
    data: str,
    rdzv_endpoint: str,
    rdzv_backend: str,
    nodes: int,
    nproc_per_node: int,
    max_steps: int,
    learning_rate: float,
    trainer_overrides: Mapping[str, Any] | None,
    project: str,
    region: str,
    work_uri: str,
    namespace: str,
    gke_cluster: str,
    machine_type: str,
    accelerator_type: str,
    accelerator_count: int,
    service_account: str,
    hf_token_secret: str,
    output_uri: str,
    gcp_resources_path: str | None = None,
) -> dict[str, Any]:
    """The `train` KFP component's parameters mapped onto `run_train_step`.

    The Model artifact holds the exported Hugging Face model only (the KFP launcher downloads
    every input artifact before a task runs: evaluate and register must not fetch optimizer
    state). The run directory (checkpoints, metrics.jsonl, TensorBoard, summary.json) is
    `run_directory(...)`: under `work_uri` in the cloud, keyed by the run id so a retried task
    resumes from its checkpoints; next to the artifact locally (inside the local run's pipeline
    root, where `llmft run`'s step table finds its metrics.jsonl). `nproc_per_node=0` starts one
    process per accelerator.
    """
    from components.param_checks import resolve_nproc_per_node
    from components.run_params import trainer_config

    local = backend == "local"
    if not local:
        check_worker_readable(data)
    export_dir = storage.normalize(output_uri) if local else output_uri
    output = run_directory(backend=backend, work_uri=work_uri, run_id=run_id, model_dir=export_dir)
    trainer = trainer_config(
        dict(trainer_overrides or {}), max_steps=max_steps, learning_rate=learning_rate,
        model=base_model, data=storage.normalize(data) if local else data, output=output,
    )  # fmt: skip
    trainer = dataclasses.replace(trainer, export_dir=export_dir)
    nproc = resolve_nproc_per_node(backend, nproc_per_node, accelerator_count)
    common: dict[str, Any] = {}
    if backend == "gke":
        job_options: dict[str, Any] = {"accelerator": gke_accelerator(accelerator_type)}
        if accelerator_count:
            job_options["gpus_per_node"] = accelerator_count
        if service_account:
            job_options["service_account"] = service_account
        if hf_token_secret:
            job_options["hf_token_secret"] = hf_token_secret
        common["gke"] = {"cluster": gke_cluster, "namespace": namespace, "job_options": job_options}
    elif backend == "vertex":
        vertex_options: dict[str, Any] = {
            "machine_type": machine_type,
            "accelerator_type": accelerator_type or None,
            "hf_token_secret": hf_token_secret or None,
        }
        if accelerator_count:
            vertex_options["accelerator_count"] = accelerator_count
        if service_account:
            vertex_options["service_account"] = service_account
        common["vertex"] = {"project": project, "location": region, "job_options": vertex_options}
    return run_train_step(
        backend=backend, run_id=run_id, trainer=trainer, nodes=nodes,
        nproc_per_node=nproc, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
        gcp_resources_path=gcp_resources_path, **common,
    )  # fmt: skip


def run_directory(*, backend: str, work_uri: str, run_id: str, model_dir: str) -> str:
    """The trainer's run directory: `<work_uri>/runs/<run>/train` in the cloud (workers write it,
    a retry resumes from it) and for a local run with a remote `work_uri`; otherwise locally
    `<artifact dir>/../train-run`, beside the Model artifact."""
    from components.run_identity import safe_run_id
    from trainer import storage

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
