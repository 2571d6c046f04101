"""The optional GKE part: cluster, node pools, Workload Identity, namespace, RBAC, Kubeflow Trainer
v2 and Kueue (llmft_infra/kubeflow.py), and the Training Operator v1 where asked.

- Workload Identity on the cluster and every pool (pods never see the node's credentials); the
  nodes run as their own account with only the node role and image pulls.
- A CPU pool for KFP, the per-run etcd and component pods; a GPU pool that autoscales from zero
  (no GPU node while nothing trains) with GKE-managed NVIDIA drivers.
- Kubernetes objects go through a provider bound to this cluster: the namespace,
  docs/deploy/rbac.yaml (the pipeline's and the trainer's service accounts and the pipeline's
  Role; read from that file, placeholders filled in) and the vendored Training Operator v1.9
  manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from components.platform.node_facts import GPU_TAINT
from llmft_infra import gpudirect
from llmft_infra.cloud import Cloud, Grants, member_of
from llmft_infra.kubeflow import Kubeflow, build_kubeflow
from llmft_infra.settings import (
    NODE_ACCOUNT,
    RBAC_FILE,
    TRAINER_ACCOUNT,
    TRAINING_OPERATOR_FILE,
    GkeSettings,
    Names,
    Settings,
)

CLUSTER_NAME = "llmft"
gpu_driver = gcp.container.NodePoolNodeConfigGuestAcceleratorGpuDriverInstallationConfigArgs
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
"""Access is decided by IAM, not by legacy scopes."""
DATAPATH_PROVIDER = "ADVANCED_DATAPATH"
"""GKE Dataplane V2, which enforces NetworkPolicy (cloud.google.com/kubernetes-engine/docs/
concepts/dataplane-v2: "built-in network policy enforcement"; set at cluster creation only)."""
PROJECT_PLACEHOLDER = "PROJECT_ID"
"""What docs/deploy/rbac.yaml writes in place of the project id."""


def _vendored_namespace() -> str:
    import yaml

    docs = yaml.safe_load_all(TRAINING_OPERATOR_FILE.read_text())
    return next(d["metadata"]["name"] for d in docs if d and d["kind"] == "Namespace")


TRAINING_OPERATOR_NAMESPACE = _vendored_namespace()
"""The vendored manifest's namespace (kustomize set it; its webhook and bindings name it)."""


@dataclass
class Gke:
    cluster: gcp.container.Cluster
    cpu_pool: gcp.container.NodePool
    gpu_pool: gcp.container.NodePool
    provider: k8s.Provider
    namespaces: dict[str, k8s.core.v1.Namespace]
    rbac: k8s.yaml.ConfigFile
    training_operator: k8s.yaml.ConfigFile | None
    kubeflow: Kubeflow
    """Trainer v2, its runtimes, Kueue and the queues (llmft_infra/kubeflow.py)."""


TRAINER_KSA_OLD_RESOURCE = "ksa-trainer"
"""The trainer's Kubernetes service account was once a resource of its own by this name (parented
by the stack); it now comes from rbac.yaml's ConfigFile. The alias keeps a stack created before
that move from creating the object again (AlreadyExists from pulumi-kubernetes >= 4.29) and then
deleting it with the old resource (review of issue 29, P6)."""


def rbac_transformation(project: str, names: Names, namespace: str) -> Any:
    """Fill rbac.yaml's placeholders: the project id, and the namespace if it is not KFP's default;
    alias the trainer's service account to the resource it used to be."""

    def fill(obj: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        text = json.dumps(obj).replace(PROJECT_PLACEHOLDER, project)
        filled = json.loads(text)
        if filled.get("metadata", {}).get("namespace") == names.rbac_namespace:
            filled["metadata"]["namespace"] = namespace
        for subject in filled.get("subjects", []):
            if subject.get("namespace") == names.rbac_namespace:
                subject["namespace"] = namespace
        obj.clear()
        obj.update(filled)
        if filled.get("kind") == "ServiceAccount" and filled["metadata"]["name"] == TRAINER_ACCOUNT:
            old = pulumi.Alias(name=TRAINER_KSA_OLD_RESOURCE, parent=pulumi.ROOT_STACK_RESOURCE)
            opts.aliases = [*(opts.aliases or []), old]

    return fill


def operator_transformation(obj: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
    """Adapt the vendored Training Operator objects to this stack without editing the file.

    - Its Namespace object is created by the stack (shared with KFP), so it is dropped here.
    - The webhook certificate Secret is filled by the operator at run time: Pulumi creates it
      empty and must not reset it on the next `pulumi up`.
    """
    if obj.get("kind") == "Namespace":
        obj.clear()
        obj.update({"apiVersion": "v1", "kind": "List", "items": []})
    elif obj.get("kind") == "Secret":
        opts.ignore_changes = [*(opts.ignore_changes or []), "data", "stringData"]


def kubeconfig(cluster: gcp.container.Cluster) -> pulumi.Output[str]:
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin (no static credentials)."""

    def render(args: list[Any]) -> str:
        name, endpoint, ca = args
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": name,
                        "cluster": {
                            "server": f"https://{endpoint}",
                            "certificate-authority-data": ca,
                        },
                    }
                ],
                "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
                "current-context": name,
                "users": [
                    {
                        "name": name,
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "gke-gcloud-auth-plugin",
                                "provideClusterInfo": True,
                                "installHint": "gcloud components install gke-gcloud-auth-plugin",
                            }
                        },
                    }
                ],
            }
        )

    return pulumi.Output.all(
        cluster.name, cluster.endpoint, cluster.master_auth.cluster_ca_certificate
    ).apply(render)


def _node_config(account: gcp.serviceaccount.Account, pool: str) -> dict[str, Any]:
    """What every pool's nodes share: their account, Workload Identity metadata, secure boot."""
    return {
        "service_account": account.email,
        "oauth_scopes": SCOPES,
        "workload_metadata_config": {"mode": "GKE_METADATA"},
        "shielded_instance_config": {"enable_secure_boot": True},
        "labels": {"llmft.dev/pool": pool},
    }


def build_gke(settings: Settings, names: Names, cloud: Cloud, grants: Grants) -> Gke:
    """Create the cluster and everything in it; IAM for its accounts goes through `grants`."""
    gke = settings.gke
    assert gke is not None
    api, nodes = _node_account(settings, cloud, grants)
    setup = gpudirect.setup_of(gke)
    after_apis = [api, cloud.apis["compute.googleapis.com"]]
    networks = gpudirect.build_networks(settings, setup, after_apis) if setup else None
    cluster = _cluster(settings, api, nodes, cloud, multi_networking=networks is not None)
    cpu_pool, gpu_pool = _node_pools(gke, settings.project, cluster, nodes, networks)
    provider, namespaces = _namespaces(gke, cluster, cpu_pool)
    if networks is not None:
        gpudirect.build_cluster_objects(networks, provider, [gpu_pool])
    _workload_identity(gke, settings.project, names, cloud, grants, cluster)
    rbac, operator = _kubernetes_objects(gke, settings.project, names, provider, namespaces)
    kubeflow = build_kubeflow(gke, provider, namespaces, operator)
    return Gke(cluster, cpu_pool, gpu_pool, provider, namespaces, rbac, operator, kubeflow)


def _node_account(
    settings: Settings, cloud: Cloud, grants: Grants
) -> tuple[gcp.projects.Service, gcp.serviceaccount.Account]:
    """The GKE API and the nodes' own account (node role and image pulls only)."""
    project = settings.project
    api = gcp.projects.Service(
        "api-container",
        project=project,
        service="container.googleapis.com",
        disable_on_destroy=False,
    )
    cloud.apis["container.googleapis.com"] = api
    nodes = gcp.serviceaccount.Account(
        "sa-nodes",
        project=project,
        account_id=NODE_ACCOUNT,
        display_name="llmft nodes",
        description="GKE nodes of the llmft cluster: logs, metrics, image pulls",
        opts=pulumi.ResourceOptions(depends_on=[api]),
    )
    cloud.accounts["nodes"] = nodes
    node_member = member_of(nodes)
    grants.project("roles/container.defaultNodeServiceAccount", "nodes", node_member)
    grants.repository(cloud.docker_repo, "roles/artifactregistry.reader", "nodes", node_member)
    return api, nodes


def _cluster(
    settings: Settings,
    api: Any,
    nodes: gcp.serviceaccount.Account,
    cloud: Cloud,
    *,
    multi_networking: bool = False,
) -> gcp.container.Cluster:
    """The cluster, with Workload Identity and no default pool."""
    gke = settings.gke
    assert gke is not None
    project = settings.project
    cluster = gcp.container.Cluster(
        "gke",
        name=CLUSTER_NAME,
        project=project,
        location=gke.location,
        # Pools are managed below; the default one (created by the API) is removed at once and
        # runs as the node account meanwhile, never as the Compute Engine default account.
        remove_default_node_pool=True,
        initial_node_count=1,
        node_config=gcp.container.ClusterNodeConfigArgs(**_node_config(nodes, "default")),
        workload_identity_config={"workload_pool": f"{project}.svc.id.goog"},
        # Dataplane V2 (eBPF) enforces NetworkPolicy: without it the per-run etcd's policy
        # (components/etcd/manifests.py) is inert and any pod could reach that etcd. It can only
        # be chosen when the cluster is created.
        datapath_provider=DATAPATH_PROVIDER,
        # GPUDirect pools attach their nodes to one VPC per GPU NIC (llmft_infra/gpudirect.py).
        enable_multi_networking=multi_networking or None,
        release_channel={"channel": "REGULAR"},
        deletion_protection=gke.deletion_protection,
        resource_labels=settings.labels,
        opts=pulumi.ResourceOptions(depends_on=[api, cloud.apis["compute.googleapis.com"]]),
    )
    return cluster


def _node_pools(
    gke: GkeSettings,
    project: str,
    cluster: gcp.container.Cluster,
    nodes: gcp.serviceaccount.Account,
    networks: gpudirect.GpuNetworks | None = None,
) -> tuple[gcp.container.NodePool, gcp.container.NodePool]:
    """A CPU pool for KFP, etcd and component pods; a GPU pool that scales from zero, tainted so
    that only pods asking for GPUs land on it (C5), with a disk for the base model's copy (C6),
    gVNIC and, for A3 High/Mega/Ultra and A4, the GPU NIC networks (C8)."""
    cpu_pool = gcp.container.NodePool(
        "cpu-pool",
        name="cpu",
        project=project,
        location=gke.location,
        cluster=cluster.name,
        initial_node_count=gke.cpu_min_nodes,
        autoscaling={"min_node_count": gke.cpu_min_nodes, "max_node_count": gke.cpu_max_nodes},
        management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
        node_config=gcp.container.NodePoolNodeConfigArgs(
            **_node_config(nodes, "cpu"), machine_type=gke.cpu_machine_type
        ),
    )
    gpu_pool = gcp.container.NodePool(
        "gpu-pool",
        name="gpu",
        project=project,
        location=gke.location,
        cluster=cluster.name,
        node_locations=list(gke.gpu_node_locations) or None,
        # Zero GPU nodes while nothing trains: the autoscaler adds them for a pending PyTorchJob
        # and removes them ~10 minutes after the pods are gone.
        initial_node_count=0,
        autoscaling=gcp.container.NodePoolAutoscalingArgs(
            min_node_count=0, max_node_count=gke.gpu_max_nodes, location_policy="ANY"
        ),
        management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
        node_config=gcp.container.NodePoolNodeConfigArgs(
            **_node_config(nodes, "gpu"),
            machine_type=gke.gpu_machine_type,
            spot=gke.gpu_spot,
            # Not left to GKE: it taints a GPU pool only when a non-GPU pool existed first, and
            # Pulumi creates both at once (GPU_TAINT_SOURCE). GPU pods tolerate it.
            taints=[gcp.container.NodePoolNodeConfigTaintArgs(**GPU_TAINT)],
            disk_size_gb=gke.gpu_disk_size_gb,
            gvnic=gcp.container.NodePoolNodeConfigGvnicArgs(enabled=True),
            guest_accelerators=[
                gcp.container.NodePoolNodeConfigGuestAcceleratorArgs(
                    type=gke.accelerator_type,
                    count=gke.accelerator_count,
                    # GKE installs and upgrades the NVIDIA driver (no driver DaemonSet to manage).
                    gpu_driver_installation_config=gpu_driver(gpu_driver_version="LATEST"),
                )
            ],
        ),
        network_config=(
            gcp.container.NodePoolNetworkConfigArgs(
                additional_node_network_configs=networks.node_network_configs()
            )
            if networks
            else None
        ),
    )
    return cpu_pool, gpu_pool


def _namespaces(
    gke: GkeSettings, cluster: gcp.container.Cluster, cpu_pool: gcp.container.NodePool
) -> tuple[k8s.Provider, dict[str, k8s.core.v1.Namespace]]:
    """A Kubernetes provider bound to the cluster, and the run and operator namespaces."""
    provider = k8s.Provider(
        "gke-cluster",
        kubeconfig=kubeconfig(cluster),
        enable_server_side_apply=True,
        opts=pulumi.ResourceOptions(depends_on=[cpu_pool]),
    )
    on_cluster = pulumi.ResourceOptions(provider=provider)
    namespaces = {
        ns: k8s.core.v1.Namespace(
            f"ns-{ns}",
            metadata={"name": ns, "labels": {"app.kubernetes.io/part-of": "llmft"}},
            opts=on_cluster,
        )
        for ns in sorted({gke.namespace, TRAINING_OPERATOR_NAMESPACE})
    }

    return provider, namespaces


def _workload_identity(
    gke: GkeSettings,
    project: str,
    names: Names,
    cloud: Cloud,
    grants: Grants,
    cluster: gcp.container.Cluster,
) -> None:
    """Which Google accounts the cluster's Kubernetes service accounts act as."""
    # Workload Identity: the pipeline's pods (rbac.yaml's service account) act as the pipeline
    # account, the PyTorchJob pods as the trainer account.
    pool = f"serviceAccount:{project}.svc.id.goog"
    for key, ksa in (("pipeline", names.pipeline_ksa), ("trainer", TRAINER_ACCOUNT)):
        grants.account(
            cloud.accounts[key],
            "roles/iam.workloadIdentityUser",
            f"ksa-{ksa}",
            f"{pool}[{gke.namespace}/{ksa}]",
            depends_on=[cluster],
        )
    # Vertex AI Pipelines driving this cluster (backend=gke) fetch its credentials as the pipeline
    # account; what it may do inside is rbac.yaml's Role. GKE has no per-cluster IAM.
    grants.project(
        "roles/container.clusterViewer", "pipeline", member_of(cloud.accounts["pipeline"])
    )


def _kubernetes_objects(
    gke: GkeSettings,
    project: str,
    names: Names,
    provider: k8s.Provider,
    namespaces: dict[str, k8s.core.v1.Namespace],
) -> tuple[k8s.yaml.ConfigFile, k8s.yaml.ConfigFile | None]:
    """docs/deploy/rbac.yaml (both service accounts, the Role) and the Training Operator."""
    in_namespace = pulumi.ResourceOptions(provider=provider, depends_on=[namespaces[gke.namespace]])
    rbac = k8s.yaml.ConfigFile(
        "rbac",
        file=str(RBAC_FILE),
        transformations=[rbac_transformation(project, names, gke.namespace)],
        opts=in_namespace,
    )
    operator = None
    if gke.training_operator:
        operator = k8s.yaml.ConfigFile(
            "training-operator",
            file=str(TRAINING_OPERATOR_FILE),
            transformations=[operator_transformation],
            opts=pulumi.ResourceOptions(
                provider=provider, depends_on=[namespaces[TRAINING_OPERATOR_NAMESPACE]]
            ),
        )
    return rbac, operator
