"""Quota facts: which Google Cloud quota a run's GPUs and Dataflow workers count against, and how
to read it, each with its source and the date it was checked.

A fresh project has little or no GPU quota, and nothing else stops a run before it has paid for
Dataflow (cloud audit 2026-12-07, C1): components/preflight/quota.py reads the quotas named here
through the Cloud Quotas API and refuses a run that needs more than is granted.

To update a fact: change it, its source line and CHECKED, then run tests/test_quota.py.
"""

from __future__ import annotations

from components.platform.platform_facts import accelerator

CHECKED = "2026-12-07"
"""When these facts were last compared with their sources."""

# --- reading quota -------------------------------------------------------------------------------

CLOUD_QUOTAS_SOURCE = (
    "cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.services.quotaInfos/list "
    "(GET https://cloudquotas.googleapis.com/v1/{parent=projects/*/locations/*/services/*}/"
    "quotaInfos, pageSize/pageToken, needs cloudquotas.quotas.get); QuotaInfo: quotaId, metric, "
    "dimensionsInfos[] {dimensions, details.value, applicableLocations} ordered from the more "
    "specific dimensions to the less specific (cloud.google.com/docs/quotas/reference/rest/v1/"
    "projects.locations.services.quotaInfos#QuotaInfo); cloud.google.com/docs/quotas/permissions "
    "(viewing quota programmatically needs resourcemanager.projects.get and the Cloud Quotas "
    "read permission)"
)
CLOUD_QUOTAS_ENDPOINT = "https://cloudquotas.googleapis.com/v1"
QUOTA_READ_PERMISSION = "cloudquotas.quotas.get"
QUOTA_VIEWER_ROLE = "roles/cloudquotas.viewer"
"""The predefined role that carries QUOTA_READ_PERMISSION (the stack grants it to the pipeline
account and the deployers: infra/llmft_infra/cloud.py)."""
QUOTA_CONSOLE = "https://console.cloud.google.com/iam-admin/quotas?project={project}"
"""Where a project's quota is seen and an increase asked for (cloud.google.com/docs/quotas/
view-manage#requesting_higher_quota); `gcloud beta quotas preferences create` does the same."""
UNLIMITED = -1
"""A negative QuotaDetails.value is read as no limit (Service Usage's convention for unlimited
quota; not seen on a GPU quota, so never a refusal)."""

# --- Vertex AI custom training -------------------------------------------------------------------

VERTEX_SERVICE = "aiplatform.googleapis.com"
VERTEX_GPU_SOURCE = (
    "cloud.google.com/vertex-ai/docs/quotas (custom training GPU quotas are per region and must be "
    "requested for a new project); cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws#quota "
    "(an H100 job counts against aiplatform.googleapis.com/custom_model_training_nvidia_h100_gpus; "
    "with Dynamic Workload Scheduler (flex-start) against custom_model_training_preemptible_nvidia_"
    "h100_gpus instead, billed on demand); Spot jobs use the preemptible metric too "
    "(cloud.google.com/vertex-ai/docs/training/use-spot-vms). The other GPUs' metric names follow "
    "the same pattern with the slug below"
)
_VERTEX_SLUG = {
    "NVIDIA_B200": "nvidia_b200",
    "NVIDIA_H200_141GB": "nvidia_h200",
    "NVIDIA_H100_MEGA_80GB": "nvidia_h100_mega",
    "NVIDIA_H100_80GB": "nvidia_h100",
    "NVIDIA_A100_80GB": "nvidia_a100_80gb",
    "NVIDIA_TESLA_A100": "nvidia_a100",
    "NVIDIA_L4": "nvidia_l4",
    "NVIDIA_TESLA_T4": "nvidia_t4",
    "NVIDIA_TESLA_V100": "nvidia_v100",
}
"""Vertex accelerator name -> the slug in its custom-training quota metric."""


def vertex_gpu_metric(accelerator_name: str, *, preemptible: bool) -> str:
    """The Vertex AI custom-training quota metric a job on these GPUs counts against."""
    slug = _VERTEX_SLUG[accelerator(accelerator_name).vertex_name]
    kind = "preemptible_" if preemptible else ""
    return f"{VERTEX_SERVICE}/custom_model_training_{kind}{slug}_gpus"


# --- Compute Engine (GKE nodes, Dataflow workers) ------------------------------------------------

COMPUTE_SERVICE = "compute.googleapis.com"
COMPUTE_GPU_SOURCE = (
    "cloud.google.com/compute/resource-usage#gpu_quota (regional GPU quota per model, NVIDIA_H100_"
    "GPUS etc., and PREEMPTIBLE_* for Spot VMs; GKE nodes count against the project's Compute "
    "Engine quota); cloud.google.com/docs/quotas/configure-dimensions (Compute Engine's gpu_family "
    "dimension: GPUS-PER-GPU-FAMILY-per-project-region counts GPUs of one family per region)"
)
_COMPUTE_MODEL = {
    "NVIDIA_B200": "NVIDIA_B200",
    "NVIDIA_H200_141GB": "NVIDIA_H200",
    "NVIDIA_H100_MEGA_80GB": "NVIDIA_H100_MEGA",
    "NVIDIA_H100_80GB": "NVIDIA_H100",
    "NVIDIA_A100_80GB": "NVIDIA_A100_80GB",
    "NVIDIA_TESLA_A100": "NVIDIA_A100",
    "NVIDIA_L4": "NVIDIA_L4",
    "NVIDIA_TESLA_T4": "NVIDIA_T4",
    "NVIDIA_TESLA_V100": "NVIDIA_V100",
}
"""Vertex accelerator name -> Compute Engine's GPU model in its quota names."""
GPU_FAMILY_QUOTA_ID = "GPUS-PER-GPU-FAMILY-per-project-region"
"""The per-family GPU quota (dimension `gpu_family`) that newer GPU models are granted under."""
GPUS_ALL_REGIONS_METRIC = f"{COMPUTE_SERVICE}/gpus_all_regions"
"""The project-wide GPU quota (GPUS_ALL_REGIONS, quota ID GPUS-ALL-REGIONS-per-project, a global
quota: applicableLocations ["global"]) that bounds every Compute Engine GPU on top of the regional
per-model quota (cloud.google.com/compute/resource-usage#gpu_quota, "GPUs (all regions)"; the
Compute API's Quota.Metric GPUS_ALL_REGIONS). A fresh project often has 0 here even where a
regional GPU quota is granted. Read as counting Spot/preemptible GPUs too (not confirmed offline:
cloud round-4 review Q1)."""
GLOBAL = "global"
"""The location of a quota that is not per region or zone (DimensionsInfo.applicableLocations)."""
CPUS_METRIC = f"{COMPUTE_SERVICE}/cpus"
"""Regional vCPUs (the CPUS quota): Dataflow workers are Compute Engine VMs and count against it
(cloud.google.com/dataflow/docs/guides/common-errors#worker-pool-failure, "quota")."""


def compute_gpu_metric(accelerator_name: str, *, preemptible: bool) -> str:
    """The Compute Engine quota metric of these GPUs (`compute.googleapis.com/nvidia_h100_gpus`,
    `.../preemptible_nvidia_h100_gpus`)."""
    model = _COMPUTE_MODEL[accelerator(accelerator_name).vertex_name].lower()
    kind = "preemptible_" if preemptible else ""
    return f"{COMPUTE_SERVICE}/{kind}{model}_gpus"


def compute_gpu_family(accelerator_name: str) -> str:
    """The `gpu_family` dimension value of these GPUs (`NVIDIA_H100`)."""
    return _COMPUTE_MODEL[accelerator(accelerator_name).vertex_name]


# --- Dataflow workers ------------------------------------------------------------------------------

DATAFLOW_WORKER_SOURCE = (
    "cloud.google.com/dataflow/docs/guides/configure-worker-vm (default batch worker machine "
    "type n1-standard-1); cloud.google.com/dataflow/docs/horizontal-autoscaling (batch jobs "
    "autoscale up to max_num_workers within the available quota)"
)
DATAFLOW_DEFAULT_MACHINE = "n1-standard-1"

# --- the GKE GPU pool's size -----------------------------------------------------------------------

GKE_ENDPOINT = "https://container.googleapis.com/v1"
NODE_POOLS_SOURCE = (
    "cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters."
    "nodePools/list (GET v1/{parent=projects/*/locations/*/clusters/*}/nodePools, needs "
    "container.clusters.get); NodePool: config.machineType, initialNodeCount, locations, "
    "autoscaling {enabled, maxNodeCount (per zone), totalMaxNodeCount}"
)
CLUSTER_VIEWER_ROLE = "roles/container.clusterViewer"
"""A predefined role with container.clusters.get (reads the node pools)."""
