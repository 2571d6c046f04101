"""Stack settings of the llmft infrastructure, read once from Pulumi config and validated.

Set them with `pulumi config set llmft:<key> <value>` (or copy `Pulumi.example.yaml` to
`Pulumi.<stack>.yaml`). Every problem is reported in one ValueError, before anything is created.

The names of what the stack creates are not settings: they come from the code that uses them
(`names()` below reads docs/deploy/rbac.yaml, components/runtime/image.py and pipelines/fine_tune.py),
so a name is never typed twice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from components.params.run_params import (
    K8S_LABEL_NAME,
    PROJECT_ID,
    REGION,
    TARGET_DEFAULTS,
    RunParams,
)
from components.platform.node_facts import (
    GPU_NODE_DISK_GB,
    gpu_node_disk_gb,
    interconnect,
    model_bytes,
)
from components.platform.platform_facts import machine, machine_accelerator_errors
from components.platform.task_resources import kfp_gpu_node_errors
from components.runtime.run_identity import GCP_LABEL_KEY, GCP_LABEL_VALUE
from pipelines.deploy.config import DERIVED_WORK_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]
RBAC_FILE = REPO_ROOT / "docs" / "deploy" / "rbac.yaml"
TRAINING_OPERATOR_FILE = (
    Path(__file__).resolve().parents[1] / "vendor" / "training-operator-v1.9.0.yaml"
)

TRAINER_ACCOUNT: str = TARGET_DEFAULTS["kfp"]["service_account"]
"""Training replicas' Google service account id, and the name of their Kubernetes service
account (docs/deploy/rbac.yaml), which the kfp target's `service_account` defaults to."""
DATAFLOW_ACCOUNT = "llmft-dataflow"
"""Dataflow workers' service account id (the pipeline passes it as `service_account_email`)."""
NODE_ACCOUNT = "llmft-gke-nodes"
"""GKE nodes' service account id: logs, metrics and image pulls only (never the Compute default)."""
KFP_REPOSITORY = "llmft-pipelines"
"""Artifact Registry KFP repository for compiled templates (`llmft upload --target vertex`)."""
TEMPLATE_PREFIX = "dataflow/templates"
"""Where in the bucket the Dataflow Flex Template spec lives."""
PIPELINE_ROOT_PREFIX = "pipeline-root"
"""Vertex AI Pipelines' root in the bucket (the `pipeline_root` output)."""
KFP_ROOT_PREFIX = "kfp-root"
"""KFP's pipeline root in the bucket (the `kfp_pipeline_root` output)."""
WORK_PREFIX = "work"
"""Run scratch in the bucket (the `work_uri` output that `llmft config from-stack` writes)."""
SCRATCH_PREFIXES = (
    f"{WORK_PREFIX}/",
    f"{PIPELINE_ROOT_PREFIX}/{DERIVED_WORK_DIR}/",
    f"{KFP_ROOT_PREFIX}/{DERIVED_WORK_DIR}/",
)
"""Bucket prefixes of run scratch (Dataflow temp and staging, checkpoints) the lifecycle rule
expires: `work/`, and the folder a run without `work_uri` derives under either pipeline root
(pipelines/deploy/submit.py; cloud audit 2026-12-07 C3). Not the rest of the pipeline roots:
registered models point at their artifacts there."""
SCRATCH_NONCURRENT_DAYS = 1
"""Days an overwritten or deleted scratch object's old version is kept (versioning would keep
Dataflow's temp churn billed for `noncurrent_version_days` otherwise)."""
SOFT_DELETE_RETENTION_S = 0
"""The bucket's soft-delete retention: off. Versioning already keeps deleted objects recoverable
for `noncurrent_version_days`; soft delete on top would bill every deleted byte (Dataflow temp
and staging churn) again for 7 days. Beam warns to turn it off on buckets Dataflow uses for temp
and staging (apache_beam/options/pipeline_options.py `_warn_if_soft_delete_policy_enabled`;
cloud.google.com/storage/docs/soft-delete: a retention of 0 disables it)."""


@dataclass(frozen=True)
class Names:
    """Names the code already uses; the stack creates exactly these."""

    pipeline_account: str
    """Google service account of the pipeline (rbac.yaml's Workload Identity annotation)."""
    pipeline_ksa: str
    """Kubernetes service account of KFP's pods (rbac.yaml's ServiceAccount with the Role)."""
    rbac_namespace: str
    """Namespace rbac.yaml is written for (KFP's, `kubeflow`)."""
    docker_repository: str
    """Artifact Registry Docker repository id (components/runtime/image.py's IMAGE_REPOSITORY)."""
    image_name: str
    """Image name inside that repository."""
    hf_token_secret: str
    """Secret Manager secret id for the Hugging Face token (= the Kubernetes Secret's name)."""


def names() -> Names:
    """Read the names from the files that define them."""
    import yaml

    from components.runtime.image import IMAGE_REPOSITORY

    docs = [d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d]
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    bound = {s["name"] for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
    account = next(
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] in bound
    )
    gsa = account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
    repository, image = IMAGE_REPOSITORY.split("/")[-2:]
    return Names(
        pipeline_account=gsa.split("@")[0],
        pipeline_ksa=account["metadata"]["name"],
        rbac_namespace=account["metadata"]["namespace"],
        docker_repository=repository,
        image_name=image,
        hf_token_secret=RunParams.hf_token_secret,
    )


@dataclass(frozen=True)
class GkeSettings:
    """The optional GKE part: a cluster for KFP and PyTorchJob training."""

    location: str
    """Cluster location: a region (regional control plane) or a zone."""
    gpu_node_locations: tuple[str, ...] = ()
    """Zones of the GPU pool (where the accelerator exists); empty: the cluster's zones."""
    cpu_machine_type: str = "e2-standard-8"
    """Machines of the CPU pool (KFP, the per-run etcd, component pods)."""
    cpu_min_nodes: int = 1
    """Per zone; KFP's own services need at least one node at all times."""
    cpu_max_nodes: int = 3
    """Per zone."""
    gpu_machine_type: str = "a3-highgpu-8g"
    """Machines of the GPU pool; must fit accelerator_type x accelerator_count."""
    accelerator_type: str = "nvidia-h100-80gb"
    """GKE accelerator (`cloud.google.com/gke-accelerator` value), e.g. nvidia-l4, nvidia-a100-80gb."""
    accelerator_count: int = 8
    """Accelerators per GPU node (the pipeline's nproc_per_node)."""
    gpu_max_nodes: int = 2
    """Per zone; the pool scales from zero to this while a PyTorchJob waits for GPUs."""
    gpu_spot: bool = False
    """Spot VMs for the GPU pool (cheaper, preemptible; torchrun restarts from checkpoints)."""
    gpu_disk_size_gb: int = GPU_NODE_DISK_GB
    """Boot disk of each GPU node: holds the image and each training pod's copy of the base model
    (cloud audit 2026-12-07 C6). The default fits a 70B bf16 model; size it for your largest base
    model with `components.platform.node_facts.gpu_node_disk_gb(model_bytes(parameters))`."""
    gpudirect: bool = True
    """For a GPU machine that needs it for full GPU-to-GPU bandwidth across nodes (A3 High: TCPX,
    A3 Mega: TCPXO, A3 Ultra and A4: RDMA; components/platform/node_facts.py INTERCONNECTS): the
    additional VPC networks (one per GPU NIC; RDMA: a gVNIC VPC and a RoCE VPC with one subnet
    per NIC, in one zone: set one gpu_node_locations zone), multi-networking, and the NCCL plugin
    installer; runs then pass gpudirect=true. False: NCCL uses the primary NIC only (C8)."""
    namespace: str = RunParams.namespace
    """Namespace of KFP's pods, the per-run etcd and the PyTorchJobs."""
    training_operator: bool = True
    """Install the vendored Kubeflow Training Operator v1.9 (skip if the cluster has one; a new
    cluster needs it only for gke_job_api=pytorchjob: Trainer v2 is what `auto` prefers)."""
    trainer_v2: bool = True
    """Install Kubeflow Trainer v2 (its Helm chart, pinned; JobSet with it) and llmft's
    ClusterTrainingRuntimes (llmft_infra/kubeflow.py)."""
    kueue: bool = True
    """Install Kueue (its Helm chart, pinned) with a ClusterQueue sized to the GPU pool and the
    LocalQueue `llmft` in the run namespace (the run parameter kueue_queue names it)."""
    deletion_protection: bool = True
    """GKE deletion protection: `pulumi destroy` refuses until this is set to false."""

    def single_zone(self) -> str | None:
        """The one zone of the GPU pool (its one gpu_node_locations entry, else a zonal cluster's
        zone); None when it may span several."""
        if len(self.gpu_node_locations) == 1:
            return self.gpu_node_locations[0]
        if not self.gpu_node_locations and _ZONE.match(self.location):
            return self.location
        return None

    def needs_rdma(self) -> bool:
        """The pool gets GPUDirect-RDMA networks (A3 Ultra/A4 with gpudirect on)."""
        entry = interconnect(self.gpu_machine_type)
        return self.gpudirect and entry is not None and entry.gke_setup == "gpudirect-rdma"


@dataclass(frozen=True)
class FlexTemplateJobSettings:
    """An example Dataflow job from the preprocessing Flex Template (optional)."""

    input: str
    """Raw records, gs:// file or glob."""
    output: str
    """Dataset directory to write, gs://."""
    tokenizer: str
    """Tokenizer directory (gs://) or hub name."""
    seq_len: int = 512
    """Tokens per packed row."""
    max_workers: int = 10
    """Upper bound of Dataflow autoscaling."""


@dataclass(frozen=True)
class Settings:
    """Everything the stack is parameterised by."""

    project: str
    """Google Cloud project id."""
    region: str
    """Region of the bucket, the repositories, Vertex AI and Dataflow."""
    bucket: str
    """Pipeline-root and data bucket (created; never deleted by `pulumi destroy` while not empty)."""
    gke: GkeSettings | None = None
    """The GKE part, or None for Vertex AI only."""
    deployers: tuple[str, ...] = ()
    """Members (user:..., group:...) who build images, upload templates and launch runs."""
    scratch_retention_days: int = 14
    """Days before run scratch under work/ is deleted."""
    noncurrent_version_days: int = 7
    """Days an overwritten or deleted object version is kept (bucket versioning)."""
    bigquery_datasets: tuple[str, ...] = ()
    """BigQuery datasets (`DATASET` in the stack's project, or `PROJECT.DATASET`) that runs read
    with `bigquery_query`/`bq://` inputs: the Dataflow workers get `bigquery.dataViewer` on each
    and `bigquery.user` on the project (cloud audit 2026-12-07 C7); empty: no BigQuery access."""
    flex_template_job: FlexTemplateJobSettings | None = None
    """Launch one preprocessing job from the Flex Template (a working example); None: don't."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels on everything that takes labels (billing, ownership)."""

    @property
    def image_registry(self) -> str:
        """Host of the region's Docker registry."""
        return f"{self.region}-docker.pkg.dev"


_PROJECT = re.compile(f"^{PROJECT_ID[0]}$")
_REGION = re.compile(f"^{REGION[0]}$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_DATASET = re.compile(r"^([a-z][a-z0-9-]{4,28}[a-z0-9]\.)?[A-Za-z0-9_]{1,1024}$")
_MEMBER = re.compile(r"^(user|group|serviceAccount|domain):[^\s]+$")
_K8S_NAME = re.compile(f"^{K8S_LABEL_NAME[0]}$")


def _typed(cls: type, data: dict[str, Any], prefix: str, errors: list[str]) -> dict[str, Any]:
    """Keep the keys `cls` knows, coerced to their annotated scalar types; record the rest."""
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            errors.append(f"{prefix}{key}: unknown key (known: {', '.join(sorted(known))})")
            continue
        kind = str(known[key].type)
        try:
            if kind == "int":
                values[key] = int(value)
            elif kind == "bool":
                values[key] = value if isinstance(value, bool) else str(value).lower() == "true"
            elif kind.startswith("tuple"):
                if not isinstance(value, list | tuple):
                    raise TypeError
                values[key] = tuple(value)
            elif kind.startswith("dict") and not isinstance(value, dict):
                raise TypeError
            else:
                values[key] = value
        except (TypeError, ValueError):
            errors.append(f"{prefix}{key}: expected {kind}, got {value!r}")
    return values


def parse_settings(raw: dict[str, Any]) -> Settings:
    """Build Settings from plain config values (keys as in Pulumi.example.yaml, without `llmft:`).

    Raises:
        ValueError: listing every missing or invalid value, with what to set instead.
    """
    errors: list[str] = []
    raw = dict(raw)
    gke_raw = raw.pop("gke", None)
    job_raw = raw.pop("flex_template_job", None)
    values = _typed(Settings, raw, "", errors)
    project = values.get("project") or ""
    region = values.get("region") or ""
    if not _PROJECT.match(project):
        errors.append(
            f"project: {project!r} is not a project id (pulumi config set llmft:project ID)"
        )
    if not _REGION.match(region):
        errors.append(f"region: {region!r} is not a region like us-central1")
    values.setdefault("bucket", f"{project}-llmft")
    if not _BUCKET.match(values["bucket"]):
        errors.append(f"bucket: {values['bucket']!r} is not a bucket name")
    for member in values.get("deployers", ()):
        if not _MEMBER.match(member) or member.startswith(("allUsers", "allAuthenticatedUsers")):
            errors.append(
                f"deployers: {member!r} must be user:EMAIL, group:EMAIL or serviceAccount:EMAIL"
            )
    for key in ("scratch_retention_days", "noncurrent_version_days"):
        if values.get(key, 1) < 1:
            errors.append(f"{key}: must be at least 1 day")
    for dataset in values.get("bigquery_datasets", ()):
        if not _DATASET.match(str(dataset)):
            errors.append(
                f"bigquery_datasets: {dataset!r} is not DATASET or PROJECT.DATASET (letters, "
                "digits and underscores)"
            )
    for key, value in (values.get("labels") or {}).items():
        if not GCP_LABEL_KEY.match(str(key)) or not GCP_LABEL_VALUE.match(str(value)):
            errors.append(f"labels: {key}={value} is not a valid Google Cloud label")
    gke = None
    if gke_raw not in (None, False):
        gke_values = _typed(
            GkeSettings, dict(gke_raw) if gke_raw is not True else {}, "gke.", errors
        )
        gke_values.setdefault("location", region)
        gke = GkeSettings(**gke_values)
        _gke_errors(gke, region, errors)
    job = None
    if job_raw:
        job_values = _typed(FlexTemplateJobSettings, dict(job_raw), "flex_template_job.", errors)
        for key in ("input", "output", "tokenizer"):
            if not job_values.get(key):
                errors.append(f"flex_template_job.{key}: required for the example job")
        if not str(job_values.get("output", "gs://")).startswith("gs://"):
            errors.append("flex_template_job.output: Dataflow writes to gs:// only")
        job = FlexTemplateJobSettings(**job_values) if not errors else None
    if errors:
        raise ValueError(f"{len(errors)} stack setting problem(s):\n  - " + "\n  - ".join(errors))
    return Settings(gke=gke, flex_template_job=job, **values)


def _gke_errors(gke: GkeSettings, region: str, errors: list[str]) -> None:
    if not (
        gke.location == region or (_ZONE.match(gke.location) and gke.location.startswith(region))
    ):
        errors.append(f"gke.location: {gke.location!r} must be {region} or one of its zones")
    for zone in gke.gpu_node_locations:
        if not (_ZONE.match(zone) and zone.startswith(region)):
            errors.append(f"gke.gpu_node_locations: {zone!r} is not a zone of {region}")
    if gke.accelerator_type != gke.accelerator_type.lower() or not gke.accelerator_type.startswith(
        "nvidia-"
    ):
        errors.append(
            f"gke.accelerator_type: {gke.accelerator_type!r} is not a GKE accelerator like nvidia-l4"
        )
    if gke.accelerator_count < 1:
        errors.append("gke.accelerator_count: at least 1 (a CPU-only cluster needs no GPU pool)")
    elif gke.accelerator_type.startswith("nvidia-"):
        # GKE rejects a pool whose machine cannot carry its GPUs, ~10 minutes into `pulumi up`.
        errors += [
            f"gke.gpu_machine_type/accelerator_type/accelerator_count: {problem}"
            for problem in machine_accelerator_errors(
                gke.gpu_machine_type, gke.accelerator_type, gke.accelerator_count
            )
        ]
    # KFP's evaluate task runs on a GPU node: a machine that cannot host its request leaves it
    # Pending forever after training was paid for (review of issue 29, P1).
    errors += [f"gke.gpu_machine_type: {e}" for e in kfp_gpu_node_errors(gke.gpu_machine_type)]
    cpu_machine = machine(gke.cpu_machine_type)
    if cpu_machine is not None and cpu_machine.gpus:
        errors.append(
            f"gke.cpu_machine_type: {gke.cpu_machine_type} carries GPUs; the CPU pool needs a "
            f"machine without any, e.g. {GkeSettings.cpu_machine_type}"
        )
    if gke.cpu_min_nodes < 1 or gke.cpu_max_nodes < gke.cpu_min_nodes:
        errors.append("gke.cpu_min_nodes/cpu_max_nodes: need 1 <= min <= max")
    smallest = gpu_node_disk_gb(model_bytes(1_000_000_000))
    if gke.gpu_disk_size_gb < smallest:
        errors.append(
            f"gke.gpu_disk_size_gb: {gke.gpu_disk_size_gb} GB cannot hold the image and a 1B "
            f"model's copy; at least {smallest}"
        )
    if gke.gpu_max_nodes < 1:
        errors.append("gke.gpu_max_nodes: at least 1 (the pool scales between 0 and this)")
    if gke.needs_rdma() and gke.single_zone() is None:
        errors.append(
            f"gke.gpu_node_locations: {gke.gpu_machine_type} with gpudirect needs exactly one zone "
            "(its RDMA network is zonal: RDMA_NETWORK_PROFILE in components/platform/"
            "node_facts.py), or set gpudirect: false"
        )
    if not _K8S_NAME.match(gke.namespace):
        errors.append(f"gke.namespace: {gke.namespace!r} is not a Kubernetes namespace name")


def load_settings() -> Settings:
    """Read the `llmft` config namespace of the current stack (inside a Pulumi program)."""
    import pulumi

    config = pulumi.Config("llmft")
    gcp = pulumi.Config("gcp")
    raw: dict[str, Any] = {}
    for f in fields(Settings):
        text = config.get(f.name)
        if text is None:
            continue
        try:  # structured values (gke, labels, deployers) are stored as JSON
            raw[f.name] = json.loads(text)
        except json.JSONDecodeError:
            raw[f.name] = text
    raw.setdefault("project", gcp.get("project") or "")
    raw.setdefault("region", gcp.get("region") or "")
    return parse_settings(raw)
