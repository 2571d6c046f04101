"""The named cross-field checks of a run's parameters, each returning an error message or None.

`RunParams.errors()` (components/params/run_params.py) calls them all, so the pipeline's first step,
`llmft run` and `llmft run --target ...` apply the same rules; a few are also used where a run is
submitted (`check_pipeline_root`) or named (`run_identity.check_placeholder_resolved`). They take plain values
so that launchers and the CLI can call them without a `RunParams`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from components.serving.presets import preset_image_error
from trainer.packed_data.format import PREFERENCE_KIND, PROMPTS_KIND

TARGETS = ("local", "vertex", "kfp")
"""Where the pipeline itself runs: the local runner (kfp.local), Vertex AI Pipelines, KFP."""
TARGET_BACKENDS = {"local": ("local",), "vertex": ("vertex", "gke"), "kfp": ("gke", "vertex")}
"""Trainer backends each pipeline executor can drive; `local` needs the local runner's machine."""

# -- named checks: each returns an error message, or None when the value is fine -----------------

_TOKEN = re.compile(r"\b(hf_[A-Za-z0-9]{30,}|api_[A-Za-z0-9]{30,})\b")
_SA_EMAIL = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z0-9-]+\.iam\.gserviceaccount\.com$")
_COMPUTE_SA = re.compile(r"^[0-9]+-compute@developer\.gserviceaccount\.com$")
_KSA = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SECRET_NAME = re.compile(
    r"^(projects/[^/]+/secrets/)?[A-Za-z0-9_-]{1,255}(/versions/[A-Za-z0-9_-]+)?$"
)
"""How an unresolved KFP placeholder starts (a backend too old to resolve it passes it as is)."""


def redact_tokens(text: str) -> str:
    """`text` with anything that looks like a token replaced: error messages quote values, and a
    token must never reach a terminal, a log or a report, even inside a complaint about it."""
    return _TOKEN.sub("<redacted token>", text)


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


def check_objective_data(objective: str, data_kind: str) -> str | None:
    """DPO trains on preference pairs (`data_kind=preference`), GRPO on prompt records
    (`data_kind=prompts`), and each of those kinds only with its objective (the trainer refuses
    either mismatch, but only after preprocessing). The reference model DPO needs (the base with
    the LoRA adapters off: `lora_rank` in trainer_overrides) is the trainer's own check, run with
    the overrides'."""
    wants = {"dpo": PREFERENCE_KIND, "grpo": PROMPTS_KIND}
    if wants.get(objective) == data_kind:
        return None
    if objective == "dpo":
        return (
            f"objective=dpo trains on preference pairs but data_kind={data_kind!r}: set "
            "data_kind=preference (records {prompt, chosen, rejected}, or chat pairs; "
            "docs/preprocess.md)"
        )
    if objective == "grpo":
        return (
            f"objective=grpo trains on prompt records but data_kind={data_kind!r}: set "
            "data_kind=prompts (records with a prompt and the columns your rewards read; "
            "docs/grpo.md)"
        )
    if data_kind == PREFERENCE_KIND:
        return (
            f"data_kind=preference makes preference pairs, which objective={objective!r} cannot "
            "train on: set objective=dpo (with lora_rank in trainer_overrides)"
        )
    if data_kind == PROMPTS_KIND:
        return (
            f"data_kind=prompts makes prompt records without answers, which objective="
            f"{objective!r} cannot train on: set objective=grpo (with rewards or reward_module)"
        )
    return None


def check_rewards(objective: str, rewards: str, reward_module: str, backend: str) -> str | None:
    """GRPO needs at least one reward; rewards mean nothing to other objectives; a cloud training
    job reads a reward module from gs:// (a path on this machine is not on its disks). Whether
    the file exists and defines the function: `reward_module_errors` (preflight/validation.py)."""
    given = bool(rewards.strip() or reward_module)
    if objective == "grpo" and not given:
        return (
            "objective=grpo needs a reward: set rewards (built-ins as JSON, e.g. "
            '[{"name": "exact_match", "column": "answer"}]) or reward_module (a Python file)'
        )
    if objective != "grpo" and given:
        return f"rewards and reward_module apply to objective=grpo only (objective={objective})"
    if reward_module and backend != "local" and not reward_module.startswith("gs://"):
        return (
            f"reward_module={reward_module!r}: a {backend} training job reads it from gs://; "
            "copy the file to your bucket and give its gs:// URI"
        )
    return None


def check_service_account(
    backend: str, service_account: str, trainer_ksa: str = "the trainer's account"
) -> str | None:
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
        trainer = trainer_ksa  # the kfp target's default (docs/deploy/rbac.yaml)
        if not service_account:
            return (
                "service_account is empty: on GKE name the Kubernetes service account of the "
                "training pods (bound to a Google service account by Workload Identity), e.g. "
                f"--param service_account={trainer} from docs/deploy/rbac.yaml"
            )
        if not _KSA.match(service_account):
            # Review P4: a from-stack config gives the Vertex target the trainer's email.
            return (
                f"service_account={service_account!r}: on GKE give the Kubernetes service "
                "account's name (not a Google service-account email), which Workload Identity "
                f"maps to the Google account: --param service_account={trainer} "
                "(docs/deploy/rbac.yaml)"
            )
    return None


def check_dataflow_service_account(preprocess_runner: str, account: str) -> str | None:
    """Dataflow workers run as this email, which must be given (issue 29 N17): left empty,
    Dataflow runs them as the Compute Engine default account, which in organizations under the
    secure-by-default `iam.automaticIamGrantsForDefaultServiceAccounts` constraint holds no
    roles, so the job fails on gs:// and `dataflow.worker` after it started. Naming the default
    account explicitly (NUMBER-compute@developer.gserviceaccount.com) is accepted."""
    if preprocess_runner != "DataflowRunner":
        return None
    if not account:
        return (
            "dataflow_service_account is empty: with DataflowRunner name the workers' service "
            "account (e.g. llmft-dataflow@PROJECT.iam.gserviceaccount.com, which `llmft config "
            "from-stack` writes); the Compute Engine default account it would fall back to has "
            "no roles in organizations with secure-by-default IAM, and the job would fail on "
            "gs:// after starting"
        )
    if not (_SA_EMAIL.match(account) or _COMPUTE_SA.match(account)):
        return (
            f"dataflow_service_account={account!r} is not a service-account email "
            "(NAME@PROJECT.iam.gserviceaccount.com)"
        )
    return None


def check_machine_accelerator(
    backend: str, machine_type: str, accelerator_type: str, accelerator_count: int
) -> list[str]:
    """The training machine and its GPUs, against components/platform/platform_facts.py (issue 29 N15).

    Vertex: the machine type fixes the GPU model and count (a3-highgpu-8g is 8 x H100 80GB).
    GKE: `machine_type` names the GPU node pool's machine; a pod may take part of a node, so
    the count must be at most what one node carries.
    """
    # not at the top: these keep `llmft --help` ~12 ms faster (it imports this module)
    from components.platform.platform_facts import machine_accelerator_errors, node_gpu_errors

    if backend not in ("vertex", "gke"):
        return []
    if accelerator_count > 0 and not accelerator_type:
        return [
            f"accelerator_count={accelerator_count} but accelerator_type is empty: name the GPU "
            "or set accelerator_count=0 for CPU-only training"
        ]
    if backend == "vertex":
        count = accelerator_count if accelerator_type else 0
        found = machine_accelerator_errors(machine_type, accelerator_type, count)
        return [f"machine_type={machine_type!r}: {e}" for e in found]
    if not accelerator_type or accelerator_count <= 0:
        return []
    if check_gke_accelerator(backend, accelerator_type):
        return []  # an unknown name: check_gke_accelerator reports it
    return [
        f"machine_type={machine_type!r}: {e}"
        for e in node_gpu_errors(machine_type, accelerator_type, accelerator_count)
    ]


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


def check_gke_accelerator(backend: str, accelerator_type: str) -> str | None:
    """On GKE the accelerator becomes a node selector: the name must have a GKE label."""
    if backend != "gke":
        return None
    # not at the top: these keep `llmft --help` ~12 ms faster (it imports this module)
    from components.platform.platform_facts import gke_accelerator

    try:
        gke_accelerator(accelerator_type)
    except ValueError as exc:
        return f"accelerator_type: {exc}"
    return None


def check_cloud_locations(
    *, cloud: bool, project: str, region: str, work_uri: str, train_data_uri: str
) -> list[str]:
    """A cloud run (a cloud trainer or Dataflow) needs a project, a region, a gs:// work_uri and
    data its workers can read."""
    if not cloud:
        return []
    errors = []
    if not project:
        errors.append("project is empty: cloud backends and Dataflow need a project id")
    if not region:
        errors.append("region is empty: set a Google Cloud region such as us-central1")
    if not work_uri.startswith("gs://"):
        errors.append(f"work_uri={work_uri!r}: cloud runs need a gs:// URI for shared run files")
    if train_data_uri and not train_data_uri.startswith(("gs://", "hf://", "bq://")):
        errors.append(
            f"train_data_uri={train_data_uri!r}: workers in the cloud cannot read "
            "local files; upload the data to gs://"
        )
    return errors


def check_registry(
    *,
    latest: str,
    models: tuple[str, ...],
    register_model: bool,
    registered_model: str,
    serving_image: str,
    serving_preset: str,
) -> list[str]:
    """Reading the latest registered version (one of `models` is the value `latest`) or
    registering needs the model's name; registering also needs a pinned serving image that the
    serving preset can start (components/serving/presets.py)."""
    errors = []
    if (latest in models or register_model) and not registered_model:
        errors.append(
            "registered_model is empty: name the Vertex AI model (resource name or display "
            f"name) to register to or to take {latest!r} from"
        )
    if register_model:
        if not serving_image:
            errors.append(
                "serving_image is empty: registering a model needs a serving container image"
            )
        elif serving_image.endswith(":latest"):
            errors.append(f"serving_image={serving_image!r} uses :latest: pin a version")
        if pairing := preset_image_error(serving_preset, serving_image):
            errors.append(pairing)
    return errors


def check_capacity(
    backend: str, capacity: str, reservation: str, max_wait_minutes: int
) -> str | None:
    """Capacity types are cloud settings; a reservation is a Vertex setting (on GKE the node
    pool consumes it) and is on-demand capacity; waiting applies to queued capacity."""
    if backend == "local" and (capacity != "on-demand" or reservation):
        return (
            f"capacity={capacity!r}/reservation: the local backend trains on this machine; use "
            "backend=vertex or gke, or leave capacity=on-demand and reservation empty"
        )
    if reservation and backend != "vertex":
        return (
            "reservation is a Vertex AI setting: on GKE create the GPU node pool from the "
            "reservation (--reservation-affinity=specific) and leave reservation empty"
        )
    if reservation and capacity != "on-demand":
        return f"reservation with capacity={capacity!r}: a reservation is on-demand capacity"
    if max_wait_minutes and not (capacity == "flex-start" and backend == "vertex"):
        return (
            "max_wait_minutes applies to capacity=flex-start on Vertex AI (on GKE the cluster's "
            "queue decides): set those, or max_wait_minutes=0"
        )
    return None


def check_deploy(
    *,
    backend: str,
    deploy_endpoint: str,
    register_model: bool,
    machine_type: str,
    accelerator_type: str,
    accelerator_count: int,
    serving_preset: str,
    lora_serving: str,
) -> list[str]:
    """A cloud deployment deploys the registered version on a machine that carries the chosen
    accelerators; a LoRA adapter is served only by the Model Garden image (components/serving/presets.py).
    A local run (backend "local", which only the local runner runs) serves the exported model on
    its own machine instead."""
    errors = []
    if lora_serving == "adapter" and serving_preset != "vertex-vllm":
        errors.append(
            f"lora_serving=adapter with serving_preset={serving_preset}: only the vertex-vllm "
            "preset loads an adapter from gs://; use lora_serving=merged"
        )
    if deploy_endpoint and backend == "local":
        import importlib.util

        missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
        if missing:
            errors.append(
                f"deploy_endpoint on a local run serves with `transformers serve`, which needs "
                f"{' and '.join(missing)}: pip install 'llmft[serve]'"
            )
    if not deploy_endpoint or backend == "local":
        return errors
    if not register_model:
        errors.append(
            "deploy_endpoint is set but register_model is false: the deploy step deploys the "
            "registered version; set register_model=true"
        )
    # not at the top: these keep `llmft --help` ~12 ms faster (it imports this module)
    from components.platform.platform_facts import machine_accelerator_errors

    count = accelerator_count if accelerator_type else 0
    errors += [
        f"deploy_machine_type/deploy_accelerator_*: {e}"
        for e in machine_accelerator_errors(machine_type, accelerator_type, count)
    ]
    return errors


def check_eval_quality(
    *,
    eval_tasks: str,
    max_task_regression: float,
    judge_metric: str,
    judge_min_win_rate: float,
    project: str,
) -> list[str]:
    """A gate on harness tasks needs tasks; a gate on the judge needs the judge, and the judge
    (Vertex AI's evaluation service) needs a project."""
    errors = []
    if max_task_regression < 100.0 and not eval_tasks.strip(" ,"):
        errors.append(
            f"max_task_regression={max_task_regression} gates on harness tasks but eval_tasks is "
            "empty: name the tasks (e.g. eval_tasks=mmlu,arc_easy) or set it back to 100"
        )
    if judge_min_win_rate > 0 and not judge_metric:
        errors.append(
            f"judge_min_win_rate={judge_min_win_rate} gates on the judge but judge_metric is "
            'empty: choose one (e.g. judge_metric="text_quality") or set it to 0'
        )
    if judge_metric and not project:
        errors.append(
            f"judge_metric={judge_metric!r} runs in Vertex AI: set project (or leave it empty)"
        )
    return errors


# -- issue 30/32 review (P1, P6) ------------------------------------------------------------------


def check_flex_start_accelerator(backend: str, capacity: str, accelerator_type: str) -> str | None:
    """Vertex AI runs flex-start (DWS) jobs only on some GPUs (platform_facts.VERTEX_FLEX_START_GPUS)."""
    # not at the top: these keep `llmft --help` ~12 ms faster (it imports this module)
    from components.platform.platform_facts import VERTEX_FLEX_START_GPUS, vertex_flex_start

    if backend != "vertex" or capacity != "flex-start":
        return None
    try:
        if vertex_flex_start(accelerator_type):
            return None
    except ValueError:
        return None  # an unknown accelerator is check_machine_accelerator's error
    allowed = ", ".join(sorted(VERTEX_FLEX_START_GPUS))
    return (
        f"capacity=flex-start with accelerator_type={accelerator_type or '(none)'!r}: Vertex AI "
        f"offers flex-start only for {allowed}; choose one of those or capacity=on-demand/spot"
    )
