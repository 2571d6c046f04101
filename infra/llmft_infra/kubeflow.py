"""Kubeflow Trainer v2 and Kueue on the GKE cluster: released Helm charts at pinned versions,
llmft's ClusterTrainingRuntimes, and a Kueue ClusterQueue sized to the GPU pool with a LocalQueue
in the run namespace, so a training job is admitted whole or not at all.

Sources: kubeflow/trainer v2.3.0 (charts/kubeflow-trainer/Chart.yaml: the chart, JobSet 0.12.0 as
its dependency; .github/workflows/publish-helm-charts.yaml: pushed to oci://ghcr.io/kubeflow/
charts), kubernetes-sigs/kueue v0.19.2 (charts/kueue: the chart at oci://registry.k8s.io/kueue/
charts, its manager configuration in `managerConfig.controllerManagerConfigYaml`;
site/static/examples/admin/single-clusterqueue-setup.yaml: ResourceFlavor, ClusterQueue,
LocalQueue in kueue.x-k8s.io/v1beta2). Nothing here has been applied to a real cluster by the
tests: they run the program under Pulumi's mocks (tests/test_infra_stack.py).

Choices:
- The ClusterQueue covers the GPUs of the GPU pool at its autoscaling maximum: `gpu_max_nodes`
  per zone x zones x `accelerator_count` (zones: `gpu_node_locations`, else 1 for a zonal and 3
  for a regional cluster, GKE's default spread). It does not cover cpu or memory, and Kueue is told
  to ignore what a ClusterQueue does not cover (`quotaCheckStrategy: IgnoreUndeclared`): with
  its default a pod requesting cpu or memory would never be admitted.
- Kueue's TrainJob integration is on in its default configuration; the PyTorchJob one is not,
  so it is turned on here when the Training Operator v1 is installed too.
- Kueue manages only jobs that carry a queue label (`manageJobsWithoutQueueName` stays false):
  the per-run etcd StatefulSet and KFP's own pods are never queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.launchers.pytorchjob import GKE_ACCELERATOR_LABEL, GPU_RESOURCE
from components.launchers.trainjob import (
    GROUP,
    RUNTIME_KIND,
    VERSION,
    build_cluster_training_runtime,
    runtime_restarts,
)
from llmft_infra import gpudirect
from llmft_infra.settings import GkeSettings

TRAINER_CHART = "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
TRAINER_CHART_VERSION = "2.3.0"
TRAINER_NAMESPACE = "kubeflow-system"
KUEUE_CHART = "oci://registry.k8s.io/kueue/charts/kueue"
KUEUE_CHART_VERSION = "0.19.2"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
RESOURCE_FLAVOR = "llmft-gpu"
CLUSTER_QUEUE = "llmft-gpus"
LOCAL_QUEUE = "llmft"
"""The LocalQueue in the run namespace: the `kueue_queue` a run names."""
REGIONAL_ZONES = 3


@dataclass
class Kubeflow:
    trainer: k8s.helm.v3.Release | None
    runtimes: list[k8s.apiextensions.CustomResource]
    kueue: k8s.helm.v3.Release | None
    queues: list[k8s.apiextensions.CustomResource]


def gpu_quota(gke: GkeSettings) -> int:
    """GPUs of the GPU pool at its autoscaling maximum (see the module's docstring)."""
    zonal = gke.location.count("-") == 2  # us-central1-a; a region is us-central1
    zones = len(gke.gpu_node_locations) or (1 if zonal else REGIONAL_ZONES)
    return gke.gpu_max_nodes * zones * gke.accelerator_count


def kueue_manager_config(*, pytorchjob: bool) -> str:
    """Kueue's manager configuration: the chart's defaults, with the integrations llmft uses."""
    import yaml

    frameworks = ["batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]
    if pytorchjob:
        frameworks.append("kubeflow.org/pytorchjob")
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "integrations": {"frameworks": frameworks},
        # Quota only for what the ClusterQueue covers (the GPUs): with the default
        # BlockUndeclared, a pod requesting cpu or memory (a LimitRange default, `--cpu`) would
        # be "resource cpu unavailable in ClusterQueue" forever (kueue v0.19.2
        # apis/config/v1beta2/configuration_types.go QuotaCheckStrategy, beta and on in 0.19;
        # pkg/scheduler/flavorassigner/flavorassigner.go findFlavorForPodSets).
        "resources": {"quotaCheckStrategy": "IgnoreUndeclared"},
    }
    return str(yaml.safe_dump(config, sort_keys=False))


def build_kubeflow(
    gke: GkeSettings,
    provider: k8s.Provider,
    namespaces: dict[str, k8s.core.v1.Namespace],
    operator: pulumi.Resource | None = None,
) -> Kubeflow:
    """Trainer v2 (+ our runtimes) and Kueue (+ the queues), as the settings ask. Kueue comes
    after the job CRDs it integrates (Trainer v2's, the Training Operator's `operator`): it
    defers an integration whose CRD is not served yet and polls for it with a back-off of up to
    2 min (kueue v0.19.2 pkg/controller/jobframework/setup.go), a window in which a queued
    job would not be admitted."""
    on_cluster = pulumi.ResourceOptions(provider=provider)
    trainer, runtimes = None, []
    if gke.trainer_v2:
        trainer = k8s.helm.v3.Release(
            "kubeflow-trainer",
            chart=TRAINER_CHART,
            version=TRAINER_CHART_VERSION,
            namespace=TRAINER_NAMESPACE,
            create_namespace=True,
            values={"jobset": {"install": True}},
            opts=on_cluster,
        )
        # A GPUDirect pool's jobs reference the runtime variant that carries its NIC setup.
        variants = dict.fromkeys((None, gpudirect.setup_of(gke)))
        runtimes = [
            _runtime(restarts, provider, trainer, setup)
            for setup in variants
            for restarts in runtime_restarts()
        ]
    kueue, queues = None, []
    if gke.kueue:
        kueue = k8s.helm.v3.Release(
            "kueue",
            chart=KUEUE_CHART,
            version=KUEUE_CHART_VERSION,
            namespace=KUEUE_NAMESPACE,
            create_namespace=True,
            values={
                "managerConfig": {
                    "controllerManagerConfigYaml": kueue_manager_config(
                        pytorchjob=gke.training_operator
                    )
                }
            },
            opts=pulumi.ResourceOptions(
                provider=provider, depends_on=[r for r in (trainer, operator) if r is not None]
            ),
        )
        queues = _queues(gke, provider, kueue, namespaces[gke.namespace])
    return Kubeflow(trainer=trainer, runtimes=runtimes, kueue=kueue, queues=queues)


def _runtime(
    restarts: int, provider: k8s.Provider, trainer: k8s.helm.v3.Release, setup: str | None = None
) -> k8s.apiextensions.CustomResource:
    manifest = build_cluster_training_runtime(restarts=restarts, gpudirect=setup)
    return k8s.apiextensions.CustomResource(
        f"runtime-{manifest['metadata']['name']}",
        api_version=f"{GROUP}/{VERSION}",
        kind=RUNTIME_KIND,
        metadata=manifest["metadata"],
        spec=manifest["spec"],
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[trainer]),
    )


def _queues(
    gke: GkeSettings,
    provider: k8s.Provider,
    kueue: k8s.helm.v3.Release,
    namespace: k8s.core.v1.Namespace,
) -> list[k8s.apiextensions.CustomResource]:
    """A ResourceFlavor for the GPU pool's nodes, a ClusterQueue with its GPUs, a LocalQueue."""
    after_kueue = pulumi.ResourceOptions(provider=provider, depends_on=[kueue])
    flavor = k8s.apiextensions.CustomResource(
        "kueue-flavor",
        api_version=KUEUE_API,
        kind="ResourceFlavor",
        metadata={"name": RESOURCE_FLAVOR},
        spec={"nodeLabels": {GKE_ACCELERATOR_LABEL: gke.accelerator_type}},
        opts=after_kueue,
    )
    cluster_queue = k8s.apiextensions.CustomResource(
        "kueue-cluster-queue",
        api_version=KUEUE_API,
        kind="ClusterQueue",
        metadata={"name": CLUSTER_QUEUE},
        spec=cluster_queue_spec(gke),
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[kueue, flavor]),
    )
    local_queue = k8s.apiextensions.CustomResource(
        "kueue-local-queue",
        api_version=KUEUE_API,
        kind="LocalQueue",
        metadata={"name": LOCAL_QUEUE, "namespace": gke.namespace},
        spec={"clusterQueue": CLUSTER_QUEUE},
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[cluster_queue, namespace]),
    )
    return [flavor, cluster_queue, local_queue]


def cluster_queue_spec(gke: GkeSettings) -> dict[str, Any]:
    """Only the run namespace's jobs, up to the GPU pool's GPUs (`gpu_quota`)."""
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": gke.namespace}},
        "resourceGroups": [
            {
                "coveredResources": [GPU_RESOURCE],
                "flavors": [
                    {
                        "name": RESOURCE_FLAVOR,
                        "resources": [{"name": GPU_RESOURCE, "nominalQuota": gpu_quota(gke)}],
                    }
                ],
            }
        ],
    }
