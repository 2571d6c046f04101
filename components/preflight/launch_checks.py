"""The train step's preflight: what every rank would find out on its own, found once, here.

Runs before torchrun or a cloud job starts (components/steps/train.py), so a mismatched tokenizer,
a model without enough positions or an empty dataset is one clear error instead of N tracebacks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.launchers.trainjob_api import resolve_job_api, serves_resource
from components.runtime.k8s_client import make_api_client
from trainer import storage
from trainer.attention_support import check_model
from trainer.checkpoint_files import check_resume
from trainer.config import TrainConfig
from trainer.gguf import gguf_errors, is_gguf
from trainer.packed_data.format import TokenizerIdentity, compatibility_errors, read_manifest


def preflight(config: TrainConfig, *, local: bool, overwrite: bool = False) -> None:
    """What the trainer would find out on every rank, found here once, before torchrun or a
    cloud job starts: each problem in one ValueError.

    Checks that the dataset is a non-empty packed dataset whose shards are intact
    (`trainer.packed_data.reader.shard_problems`: all pages read when `local`), that the model exists (a name that is
    neither a directory nor a hub id `owner/name` would go to the hub and fail on every rank),
    and, for a local model directory, that its tokenizer is the one the data was packed with and
    that it has positions for `seq_len` tokens. `local`: the model and data paths are on this
    machine (the local backend); otherwise only what is readable here (gs:// via fsspec) is read.
    A run that would resume from a checkpoint another run left in its output (another model,
    data or recipe: `trainer.checkpoint_files.RESUME_MUST_MATCH`) is refused, unless `overwrite` (the
    caller then deletes those checkpoints).
    """
    config.validate()
    errors: list[str] = []
    model_dir = _local_model_dir(config.model, errors, local=local)
    if model_dir is not None and (model_dir / "config.json").is_file():
        # A family feature the chosen attention cannot compute exactly (e.g. gpt-oss's sinks
        # with attention=sdpa) is refused here, before any node starts.
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
        # the shard reader imports numpy (~100 modules): only for a local dataset
        from trainer.packed_data.reader import shard_problems

        # Every page read and checked here when the data is on this machine; remote: footers.
        errors += shard_problems(config.data, manifest, read_pages=local)
    if config.resume and not overwrite and (local or "://" in config.output):
        errors += _resume_errors(config)
    if errors:
        raise ValueError("the training run cannot start:\n  - " + "\n  - ".join(errors))


def _resume_errors(config: TrainConfig) -> list[str]:
    """A checkpoint of another run in the output: the trainer would refuse it on every rank."""
    if not storage.exists(config.checkpoints_dir()):
        return []
    try:
        check_resume(config.checkpoints_dir(), config)
    except ValueError as exc:
        return [str(exc)]
    return []


def _local_model_dir(model: str, errors: list[str], *, local: bool) -> Path | None:
    """The model's local directory, None for a URI or a hub id; records a missing model."""
    if "://" in model:
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        return path

    if is_gguf(model):
        if local or path.is_file():
            errors += gguf_errors(model, f"model {model!r}")
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


def gke_job_api_errors(
    choice: str,
    *,
    cluster: str = "",
    api_client: Any = None,
    kueue_queue: str = "",
    namespace: str = "",
) -> list[str]:
    """Why the GKE cluster cannot run a training job with `gke_job_api=choice` ([] when it can):
    `auto` needs a TrainJob or a PyTorchJob CRD served, a named API its own; and a `kueue_queue`
    must be a LocalQueue of `namespace` (`kueue_queue_errors`). Asked of the cluster's API by the
    validate step, before preprocessing spends anything (components/launchers/trainjob_api.py
    `resolve_job_api`). `cluster`: Vertex AI Pipelines driving GKE; "" in the cluster (KFP on
    GKE) or with a kubeconfig."""
    from kubernetes import client

    if api_client is None:
        api_client = make_api_client(cluster=cluster)
    custom = client.CustomObjectsApi(api_client)
    errors = []
    try:
        resolve_job_api(choice, custom)
    except ValueError as exc:
        errors.append(str(exc))
    return errors + kueue_queue_errors(kueue_queue, namespace, custom)


KUEUE_GROUP, KUEUE_VERSIONS = "kueue.x-k8s.io", ("v1beta2", "v1beta1")
"""Kueue's API (v1beta2 since Kueue 0.15, v1beta1 before; kubernetes-sigs/kueue v0.19.2
charts/kueue/templates/crd/kueue.x-k8s.io_localqueues.yaml serves both)."""


def kueue_queue_errors(queue: str, namespace: str, custom: Any) -> list[str]:
    """Why `kueue_queue=queue` cannot admit a job of `namespace` ([] when it can, or no queue).

    A job labelled for a LocalQueue that does not exist, or on a cluster without Kueue, is
    created suspended and stays so: Kueue reports a missing LocalQueue only as its Workload's
    condition (kueue v0.19.2 pkg/controller/core/workload_controller.go, "LocalQueue %s doesn't
    exist"), which the launcher cannot read, so the train step would wait for the pipeline's
    task timeout (days). Needs `get` on localqueues (docs/deploy/rbac.yaml)."""
    from kubernetes.client.exceptions import ApiException

    if not queue:
        return []
    served = [v for v in KUEUE_VERSIONS if serves_resource(custom, KUEUE_GROUP, v, "localqueues")]
    if not served:
        return [
            f"kueue_queue={queue}: the cluster does not serve Kueue ({KUEUE_GROUP}): install "
            "Kueue (docs/deploy/README.md, 'A new GKE cluster') or leave kueue_queue empty"
        ]
    try:
        custom.get_namespaced_custom_object(KUEUE_GROUP, served[0], namespace, "localqueues", queue)
    except ApiException as exc:
        if exc.status == 404:
            return [
                f"kueue_queue={queue}: namespace {namespace} has no LocalQueue {queue} "
                f"(kubectl get localqueues -n {namespace}; infra/ creates 'llmft')"
            ]
        if exc.status == 403:
            return [
                f"kueue_queue={queue}: the pipeline's service account may not read LocalQueues: "
                "reapply docs/deploy/rbac.yaml"
            ]
        raise
    return []
