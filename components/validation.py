"""Validate a fine-tune run's parameters up front, before anything costly starts.

The pipeline's first step calls `check_run_parameters`; `llmft run` calls it too, so a bad
parameter fails in a second on the user's machine instead of an hour into a cloud run. All errors
are collected and reported together (the torchtune habit), each saying what to change.
"""

from __future__ import annotations

import json
import re
from typing import Any

BACKENDS = ("local", "gke", "vertex")
RDZV_BACKENDS = ("etcd-v3", "etcd-v2", "c10d")
RUNNERS = ("DirectRunner", "DataflowRunner")
DATA_KINDS = ("instruction", "text")
TARGETS = ("local", "vertex", "kfp")
"""Where the pipeline itself runs: the local runner (kfp.local), Vertex AI Pipelines, KFP."""
TARGET_BACKENDS = {"local": ("local",), "vertex": ("vertex", "gke"), "kfp": ("gke", "vertex")}
"""Trainer backends each pipeline executor can drive; `local` needs the local runner's machine."""
SCHEDULE_TIME_PLACEHOLDER = "{{$.pipeline_job_schedule_time_utc}}"
"""KFP's schedule-time placeholder, written literally in `train_data_uri` by scheduled runs."""
LATEST_REGISTERED = "latest-registered"
"""`base_model` value meaning: continue from the latest version in Vertex AI Model Registry."""


# -- named checks: each returns an error message, or None when the value is fine -----------------

_TOKEN = re.compile(r"\b(hf_[A-Za-z0-9]{30,}|api_[A-Za-z0-9]{30,})\b")
_SA_EMAIL = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z0-9-]+\.iam\.gserviceaccount\.com$")
_COMPUTE_SA = re.compile(r"^[0-9]+-compute@developer\.gserviceaccount\.com$")
_KSA = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SECRET_NAME = re.compile(
    r"^(projects/[^/]+/secrets/)?[A-Za-z0-9_-]{1,255}(/versions/[A-Za-z0-9_-]+)?$"
)
PLACEHOLDER_START = "{{$."
"""How an unresolved KFP placeholder starts (a backend too old to resolve it passes it as is)."""


def check_not_a_token(name: str, value: Any) -> str | None:
    """Refuse a parameter value that looks like a Hugging Face token: parameters are stored in
    the run's spec and shown in the console; tokens come from a Secret by name."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if _TOKEN.search(text):
        return (
            f"{name} looks like a Hugging Face token: never pass a token as a parameter; store it "
            "in a Kubernetes Secret or Secret Manager and give the secret's name in hf_token_secret"
        )
    return None


def check_backend_for_target(backend: str, target: str) -> str | None:
    """`local` trains on the machine running the pipeline: only the local runner has one."""
    if target in TARGET_BACKENDS and backend not in TARGET_BACKENDS[target]:
        allowed = " or ".join(TARGET_BACKENDS[target])
        return (
            f"backend={backend!r} cannot run from a {target} pipeline (it would train inside a "
            f"pipeline task): use backend={allowed}"
        )
    return None


def check_nproc_per_node(backend: str, nproc_per_node: int, accelerator_count: int) -> str | None:
    """One training process per GPU: 0 means "one per accelerator" on GPU machines."""
    if backend == "local" or accelerator_count <= 0 or nproc_per_node in (0, accelerator_count):
        return None
    return (
        f"nproc_per_node={nproc_per_node} with accelerator_count={accelerator_count}: training "
        f"runs one process per GPU; set nproc_per_node to {accelerator_count} or 0 (automatic)"
    )


def resolve_nproc_per_node(backend: str, nproc_per_node: int, accelerator_count: int) -> int:
    """The processes per node to start: `nproc_per_node`, or for 0 one per accelerator (1 on
    CPU machines and locally)."""
    if nproc_per_node > 0:
        return nproc_per_node
    return accelerator_count if backend != "local" and accelerator_count > 0 else 1


def check_service_account(backend: str, service_account: str) -> str | None:
    """Vertex replicas take a Google service-account email; GKE pods a Kubernetes service account
    (bound to a Google one with Workload Identity). Empty on GKE would run the PyTorchJob as the
    namespace's `default` account, which gets 403s on gs:// mid-run."""
    if backend == "vertex" and service_account and not _SA_EMAIL.match(service_account):
        return (
            f"service_account={service_account!r}: on Vertex give a service-account email "
            "(NAME@PROJECT.iam.gserviceaccount.com), or leave it empty for the Vertex AI Custom "
            "Code Service Agent"
        )
    if backend == "gke":
        if not service_account:
            return (
                "service_account is empty: on GKE name the Kubernetes service account of the "
                "training pods (bound to a Google service account by Workload Identity, e.g. "
                "llmft-pipeline from docs/deploy/rbac.yaml)"
            )
        if not _KSA.match(service_account):
            return (
                f"service_account={service_account!r}: on GKE give the Kubernetes service "
                "account's name (not a Google service-account email); Workload Identity maps it"
            )
    return None


def check_dataflow_service_account(preprocess_runner: str, account: str) -> str | None:
    """Dataflow workers run as this email; empty means the Compute Engine default account."""
    valid = not account or _SA_EMAIL.match(account) or _COMPUTE_SA.match(account)
    if preprocess_runner == "DataflowRunner" and not valid:
        return (
            f"dataflow_service_account={account!r} is not a service-account email "
            "(NAME@PROJECT.iam.gserviceaccount.com); empty uses the Compute Engine default"
        )
    return None


def check_secret_name(name: str, value: str) -> str | None:
    """A Secret Manager / Kubernetes Secret name (optional: empty means no token)."""
    if value and not _SECRET_NAME.match(value):
        return (
            f"{name}={value!r}: give a secret's name (e.g. llmft-hf-token, or "
            "projects/P/secrets/NAME on Vertex); never the secret's value"
        )
    return None


def check_eval_accelerator(target: str, accelerator_type: str, count: int) -> str | None:
    """Cloud evaluation runs on a GPU (bf16); on Vertex the type must be a Vertex name."""
    if target not in ("vertex", "kfp"):
        return None
    if count < 1:
        return f"eval_accelerator_count={count}: evaluation in the cloud runs on at least 1 GPU"
    if target == "vertex":
        from google.cloud import aiplatform_v1

        if accelerator_type not in aiplatform_v1.AcceleratorType.__members__:
            return (
                f"eval_accelerator_type={accelerator_type!r} is not a Vertex accelerator name "
                "(e.g. NVIDIA_L4, NVIDIA_A100_80GB)"
            )
    return None


def check_pipeline_root(backend: str, pipeline_root: str | None) -> str | None:
    """KFP's default pipeline root is its MinIO store (minio://), which PyTorchJob pods, Vertex
    replicas and Dataflow workers cannot read: cloud trainers need a gs:// root."""
    if backend in ("gke", "vertex") and not (pipeline_root or "").startswith("gs://"):
        got = pipeline_root or "the cluster's default, usually minio://"
        return (
            f"backend={backend} on KFP needs a gs:// pipeline root (got {got}): the training "
            "workers read the run's artifacts from it; pass --pipeline-root gs://BUCKET/root"
        )
    return None


def check_placeholder_resolved(name: str, value: str) -> str | None:
    """A literal `{{$.` means the backend did not resolve a KFP placeholder; using it would name
    every run's resources alike."""
    if PLACEHOLDER_START in value:
        return (
            f"{name}={value!r} is an unresolved KFP placeholder: this backend is too old to "
            "resolve it (KFP >= 2.4 resolves the run id; see docs/deploy/README.md)"
        )
    return None


def run_parameter_errors(
    *,
    backend: str,
    train_data_uri: str,
    data_kind: str,
    base_model: str,
    seq_len: int,
    eval_fraction: float,
    preprocess_runner: str,
    nodes: int,
    nproc_per_node: int,
    rdzv_backend: str,
    max_steps: int,
    learning_rate: float,
    project: str = "",
    region: str = "",
    work_uri: str = "",
    registered_model: str = "",
    register_model: bool = False,
    serving_image: str = "",
    max_eval_examples: int = 1,
    target: str = "",
    run_id: str = "",
    accelerator_count: int = 0,
    service_account: str = "",
    dataflow_service_account: str = "",
    hf_token_secret: str = "",
    eval_accelerator_type: str = "",
    eval_accelerator_count: int = 1,
    **others: Any,
) -> list[str]:
    """Every problem with these run parameters, each with what to change; [] when valid.

    `target` is where the pipeline runs (local, vertex, kfp; "" skips the check): the compiled
    pipeline passes its own.
    """
    given = {**others, **{k: v for k, v in locals().items() if k != "others"}}
    errors = [p for name, value in given.items() if (p := check_not_a_token(name, value))]

    def need(ok: bool, message: str) -> None:
        if not ok:
            errors.append(message)

    need(backend in BACKENDS, f"backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    need(
        bool(train_data_uri.strip()),
        "train_data_uri is empty: give a file, glob or gs:// URI of JSONL/JSON/CSV/Parquet records",
    )
    need(data_kind in DATA_KINDS, f"data_kind={data_kind!r}: choose one of {', '.join(DATA_KINDS)}")
    need(
        bool(base_model.strip()),
        f"base_model is empty: give a local path, gs:// URI, hub id or {LATEST_REGISTERED!r}",
    )
    need(16 <= seq_len <= 131072, f"seq_len={seq_len}: use a value between 16 and 131072")
    need(0.0 < eval_fraction < 0.5, f"eval_fraction={eval_fraction}: use a fraction in (0, 0.5)")
    need(
        preprocess_runner in RUNNERS,
        f"preprocess_runner={preprocess_runner!r}: choose one of {', '.join(RUNNERS)}",
    )
    need(nodes >= 1, f"nodes={nodes}: use at least 1")
    need(
        rdzv_backend in RDZV_BACKENDS,
        f"rdzv_backend={rdzv_backend!r}: choose one of {', '.join(RDZV_BACKENDS)}",
    )
    need(max_steps >= 1, f"max_steps={max_steps}: use at least 1")
    need(0.0 < learning_rate < 1.0, f"learning_rate={learning_rate}: use a value in (0, 1)")
    need(max_eval_examples >= 1, f"max_eval_examples={max_eval_examples}: use at least 1")
    need(nproc_per_node >= 0, f"nproc_per_node={nproc_per_node}: use 0 (one per GPU) or more")
    need(accelerator_count >= 0, f"accelerator_count={accelerator_count}: use 0 (CPU) or more")
    for problem in (
        check_backend_for_target(backend, target),
        check_nproc_per_node(backend, nproc_per_node, accelerator_count),
        check_service_account(backend, service_account),
        check_dataflow_service_account(preprocess_runner, dataflow_service_account),
        check_secret_name("hf_token_secret", hf_token_secret),
        check_placeholder_resolved("run id", run_id),
        check_eval_accelerator(target, eval_accelerator_type, eval_accelerator_count),
    ):
        if problem:
            errors.append(problem)

    cloud = backend in ("gke", "vertex") or preprocess_runner == "DataflowRunner"
    if cloud:
        need(
            bool(project),
            "project is empty: set the Google Cloud project id for cloud backends and Dataflow",
        )
        need(bool(region), "region is empty: set a Google Cloud region such as us-central1")
        need(
            work_uri.startswith("gs://"),
            f"work_uri={work_uri!r}: cloud runs need a gs:// URI for shared run files",
        )
        need(
            train_data_uri.startswith("gs://"),
            f"train_data_uri={train_data_uri!r}: workers in the cloud cannot read local files; upload the data to gs://",
        )
    if base_model == LATEST_REGISTERED or register_model:
        need(
            bool(registered_model),
            "registered_model is empty: name the Vertex AI model (resource name or display name) to "
            f"register to or to take {LATEST_REGISTERED!r} from",
        )
    if register_model:
        need(
            bool(serving_image),
            "serving_image is empty: registering a model needs a serving container image",
        )
        need(":latest" not in serving_image, "serving_image uses :latest: pin a version tag")
    if project:
        need(
            re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", project) is not None,
            f"project={project!r} is not a valid Google Cloud project id",
        )
    return errors


def _raise_if_any(errors: list[str]) -> None:
    if errors:
        raise ValueError(
            f"{len(errors)} invalid run parameter(s):\n" + "\n".join(f"  - {e}" for e in errors)
        )


def check_run_parameters(**params: Any) -> None:
    """Raise ValueError listing every problem with the run parameters."""
    _raise_if_any(run_parameter_errors(**params))


def validate_and_resolve(
    *, schedule_time: str, champion_model: str = "", **params: Any
) -> tuple[str, str, str]:
    """The validate_inputs step: fill in the schedule time, check everything, resolve the models.

    Returns:
        (base_model, train_data_uri, champion_model) for this run; `latest-registered` resolves to
        the newest registered version's URI (no champion yet on a first run gives "").
    """
    uri = str(params["train_data_uri"])
    if SCHEDULE_TIME_PLACEHOLDER in uri:
        if not schedule_time or SCHEDULE_TIME_PLACEHOLDER in schedule_time:
            raise ValueError(
                f"train_data_uri contains {SCHEDULE_TIME_PLACEHOLDER} but this run was not started "
                "by a schedule: submit it with `llmft run --schedule-time ...` or give a fixed URI"
            )
        uri = uri.replace(SCHEDULE_TIME_PLACEHOLDER, schedule_time)
        params["train_data_uri"] = uri
    errors = run_parameter_errors(**params)
    if champion_model == LATEST_REGISTERED and not params.get("registered_model"):
        errors.append(
            "champion_model is 'latest-registered' but registered_model is empty: name the model"
        )
    _raise_if_any(errors)
    from_registry = {
        "model": params["registered_model"],
        "project": params["project"],
        "location": params["region"],
    }
    base_model = str(params["base_model"])
    if base_model == LATEST_REGISTERED:
        from components.registry import latest_registered_model_uri

        base_model = latest_registered_model_uri(**from_registry)
    if champion_model == LATEST_REGISTERED:
        from components.registry import latest_registered_model_uri

        try:
            champion_model = latest_registered_model_uri(**from_registry)
        except ValueError:
            champion_model = ""  # nothing registered yet: the first run has no champion
    return base_model, uri, champion_model
