"""The pipeline's train step: launch the trainer on the chosen backend, wait, describe the model.

`run_train_step` is what the `train` KFP component calls (through `run_train_component`, which maps
the component's flat parameters); `llmft train` calls it too. It starts N nodes x P processes with
the backend's launcher, follows them (SIGTERM cancels what it started), and returns the metadata of
the Model artifact read from the trainer's OUTPUT/summary.json.
"""

from __future__ import annotations

import json
import logging
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
    import fsspec

    path = output.rstrip("/") + "/summary.json"
    try:
        with fsspec.open(path, "r") as handle:
            return dict(json.load(handle))
    except FileNotFoundError:
        raise RuntimeError(
            f"the training run ended without {path}: the trainer did not finish its export"
        ) from None


def model_metadata(
    summary: Mapping[str, Any], *, output: str, launch: TrainLaunch, backend: str
) -> dict[str, Any]:
    """Model artifact metadata: what it was trained from, how far, and where the HF files are."""
    model_uri = summary.get("model_dir") or output.rstrip("/") + "/model"
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
    model: str,
    data: str,
    output: str,
    nodes: int = 1,
    nproc_per_node: int = 1,
    rdzv_backend: str = "etcd-v3",
    rdzv_endpoint: str = "",
    max_steps: int | None = None,
    trainer_overrides: Mapping[str, Any] | None = None,
    config_file: str | None = None,
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
        model, data, output: as the workers see them (gs:// on GKE and Vertex).
        nodes, nproc_per_node: N nodes x P processes.
        rdzv_backend, rdzv_endpoint: torchrun rendezvous ("" endpoint: the backend's default; see
            each launcher). Vertex always uses c10d at the primary replica.
        max_steps, trainer_overrides, config_file: what the trainer is told.
        max_restarts: torchrun restarts of the worker group.
        timeout_s: give up (and cancel) after this long.
        gcp_resources_path: the component's gcp_resources output (Vertex: cancel-with-pipeline).
        log: where progress and logs go (default stdout).
        entrypoint: what torchrun runs (default `-m trainer`).
        local: LocalLauncher options (log_dir, state_root, grace_s, ...).
        gke: GkeLauncher options (api_client, cluster, namespace, job_options, poll_s, ...).
        vertex: VertexLauncher options (project, location, job_options, client, poll_s, ...).

    Returns:
        base_model, steps, tokens, target_tokens, final_loss, model_uri (+ run facts).

    Raises:
        ValueError: invalid options (all listed together).
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
        run_id=run_id, model=model, data=data, output=output, nodes=nodes,
        nproc_per_node=nproc_per_node, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
        max_steps=max_steps if max_steps and max_steps > 0 else None,
        trainer_overrides=dict(trainer_overrides or {}), config_file=config_file or None,
        max_restarts=max_restarts, **({"entrypoint": tuple(entrypoint)} if entrypoint else {}),
    )  # fmt: skip
    launch.validate()
    if backend == "local" and launch.entrypoint == TRAINER_ENTRYPOINT:
        preflight_local(launch)
    options: dict[str, Any] = dict({"local": local, "gke": gke, "vertex": vertex}[backend] or {})
    if log is not None:
        options["log"] = log
    if backend == "vertex" and gcp_resources_path:
        options.setdefault("gcp_resources_path", gcp_resources_path)
    launcher = get_launcher(backend, **options)
    result = launcher.run(launch, timeout=timeout_s)
    launcher.log(f"[launcher] {result.describe()}")
    result.raise_for_status()
    return model_metadata(read_summary(output), output=output, launch=launch, backend=backend)


def preflight_local(launch: TrainLaunch) -> None:
    """Check the trainer's config and inputs here, before any node starts, so a typo is one clear
    line instead of N torchrun agents failing (the trainer checks again on every rank)."""
    from beam_preprocess.schema import read_manifest
    from trainer.config import load_config

    load_config(launch.trainer_args())  # ValueError listing every config problem
    model = launch.model
    if model.startswith(("/", ".", "~")):
        from trainer.gguf import is_gguf

        local = Path(model).expanduser()
        if not (local.is_file() if is_gguf(model) else local.is_dir()):
            raise ValueError(
                f"model {model!r} is neither a directory nor a .gguf file: pass a Hugging Face "
                "model directory or a GGUF file"
            )
    if "://" not in launch.data:
        read_manifest(launch.data)  # ValueError when it is not a packed dataset


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

    The trainer writes its run directory to the Model artifact's URI (`output_uri`); the HF model
    is `<output_uri>/model` (metadata `model_uri`). `learning_rate` > 0 sets the trainer's `lr`.
    """
    overrides = dict(trainer_overrides or {})
    if learning_rate and learning_rate > 0:
        overrides.setdefault("lr", learning_rate)
    output = _local_path(output_uri) if backend == "local" else output_uri
    common: dict[str, Any] = {}
    if backend == "gke":
        job_options: dict[str, Any] = {"accelerator": gke_accelerator(accelerator_type)}
        if accelerator_count:
            job_options["gpus_per_node"] = accelerator_count
        if service_account:
            job_options["service_account"] = service_account
        if hf_token_secret:
            job_options["hf_token_secret"] = hf_token_secret
        common["gke"] = {
            "cluster": gke_cluster,
            "namespace": namespace or "default",
            "job_options": job_options,
        }
    elif backend == "vertex":
        if hf_token_secret:
            logger.warning(
                "hf_token_secret is ignored on Vertex: grant the job's service account "
                "access to the model instead"
            )
        vertex_options: dict[str, Any] = {
            "machine_type": machine_type,
            "accelerator_type": accelerator_type or None,
        }
        if accelerator_count:
            vertex_options["accelerator_count"] = accelerator_count
        if service_account:
            vertex_options["service_account"] = service_account
        common["vertex"] = {"project": project, "location": region, "job_options": vertex_options}
    return run_train_step(
        backend=backend, run_id=run_id, model=base_model, data=_local_path(data) if backend == "local" else data,
        output=output, nodes=nodes, nproc_per_node=nproc_per_node, rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint, max_steps=max_steps, trainer_overrides=overrides,
        gcp_resources_path=gcp_resources_path, **common,
    )  # fmt: skip


def _local_path(uri: str) -> str:
    """kfp.local hands out plain paths; `file://` URIs are accepted too."""
    return uri[len("file://") :] if uri.startswith("file://") else uri
