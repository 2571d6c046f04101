"""GPUDirect networking for a GPU pool whose machines need it for full GPU-to-GPU bandwidth across
nodes (A3 High: GPUDirect-TCPX, 4 GPU NICs; A3 Mega: GPUDirect-TCPXO, 8), per Google's GKE guide
(cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx; the facts in
components/platform/node_facts.py, cloud audit 2026-12-07 C8):

- one VPC network and subnet per GPU NIC (MTU 8244), with a firewall rule letting the nodes talk
  on them;
- the node pool attached to them (`network_config.additional_node_network_configs`), the cluster
  with multi-networking (needs Dataplane V2, which the cluster has);
- in the cluster, a `GKENetworkParamSet` and a `Network` per VPC named `vpc1`..`vpcN` (the names
  the pods' `networking.gke.io/interfaces` annotation uses: components/launchers/node_setup.py);
- the NRI device injector DaemonSet (gives the pods' receive-data-path manager the GPU devices
  its annotation names) and the NCCL plugin installer DaemonSet, both vendored from
  GoogleCloudPlatform/container-engine-accelerators (infra/vendor/gpudirect/, commit 992db81).

A3 Ultra and A4 (GPUDirect-RDMA, node_facts.RDMA_SOURCE) instead get:

- one VPC and subnet for the second gVNIC (MTU 8896, a firewall rule as above) and one VPC with the
  zone's RoCE network profile (`ZONE-vpc-roce`) and 8 subnets, one per RDMA NIC (no firewall rule:
  such a network allows ingress implicitly and takes no rules); the GPU pool in that one zone;
- the pool attached to the gVNIC subnet and the 8 RDMA subnets, the cluster multi-networking;
- the Network objects `gvnic-1` (NetDevice) and `rdma-0`..`rdma-7` (RDMA) the pods name;
- the gIB NCCL plugin installer DaemonSet, built here from the guide's facts (`gib_installer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from components.platform.node_facts import (
    GIB_HOST_DIR,
    GIB_INSTALL_COMMAND,
    GIB_INSTALLER_IMAGE,
    GPU_NODE_LABEL,
    GPUDIRECT_NETWORKS,
    RDMA_ACCELERATORS,
    RDMA_HOST_NETWORK,
    RDMA_MTU,
    RDMA_NETWORK,
    RDMA_NETWORK_PROFILE,
    interconnect,
)
from llmft_infra.settings import GkeSettings, Settings

VENDOR = Path(__file__).resolve().parents[1] / "vendor" / "gpudirect"
INSTALLERS = {
    "gpudirect-tcpx": VENDOR / "nccl-tcpx-installer.yaml",
    "gpudirect-tcpxo": VENDOR / "nccl-tcpxo-installer.yaml",
}
DEVICE_INJECTOR = VENDOR / "nri-device-injector.yaml"
"""The NRI device injector DaemonSet (container-engine-accelerators nri_device_injector/, same
commit): injects the devices a pod's `devices.gke.io/container.<name>` annotation lists; Google's
TCPX/TCPXO manifests rely on it for their unprivileged receive-data-path manager."""
MTU = 8244
"""The GPU NIC networks' MTU in Google's guide."""
SUBNET_RANGE = "192.168.{index}.0/24"
FIREWALL_SOURCE = "192.168.0.0/16"
RDMA = "gpudirect-rdma"
SETUPS = (*INSTALLERS, RDMA)


def setup_of(gke: GkeSettings) -> str | None:
    """The GPUDirect setup the pool needs and the settings ask for, or None."""
    entry = interconnect(gke.gpu_machine_type)
    if not gke.gpudirect or entry is None or entry.gke_setup not in SETUPS:
        return None
    return entry.gke_setup


@dataclass
class GpuNetworks:
    setup: str
    networks: list[gcp.compute.Network]
    """One per subnet (RDMA: the gVNIC VPC, then the RoCE VPC once per RDMA subnet)."""
    subnets: list[gcp.compute.Subnetwork]

    def node_network_configs(
        self,
    ) -> list[gcp.container.NodePoolNetworkConfigAdditionalNodeNetworkConfigArgs]:
        return [
            gcp.container.NodePoolNetworkConfigAdditionalNodeNetworkConfigArgs(
                network=n.name, subnetwork=s.name
            )
            for n, s in zip(self.networks, self.subnets, strict=True)
        ]


def build_networks(settings: Settings, setup: str, after: Sequence[pulumi.Resource]) -> GpuNetworks:
    """The VPCs, subnets and firewall rule of the GPU NICs."""
    if setup == RDMA:
        return _rdma_networks(settings, after)
    networks, subnets = [], []
    for index in range(1, GPUDIRECT_NETWORKS[setup] + 1):
        network = gcp.compute.Network(
            f"gpu-net-{index}",
            name=f"llmft-gpu-net-{index}",
            project=settings.project,
            auto_create_subnetworks=False,
            mtu=MTU,
            opts=pulumi.ResourceOptions(depends_on=list(after)),
        )
        subnets.append(
            gcp.compute.Subnetwork(
                f"gpu-subnet-{index}",
                name=f"llmft-gpu-subnet-{index}",
                project=settings.project,
                region=settings.region,
                network=network.id,
                ip_cidr_range=SUBNET_RANGE.format(index=index),
            )
        )
        gcp.compute.Firewall(
            f"gpu-net-{index}-internal",
            name=f"llmft-gpu-net-{index}-internal",
            project=settings.project,
            network=network.name,
            allows=[{"protocol": "tcp"}, {"protocol": "udp"}, {"protocol": "icmp"}],
            source_ranges=[FIREWALL_SOURCE],
        )
        networks.append(network)
    return GpuNetworks(setup, networks, subnets)


def _vpc(
    settings: Settings, index: str, after: Sequence[pulumi.Resource], profile: str | None = None
) -> gcp.compute.Network:
    return gcp.compute.Network(
        f"gpu-net-{index}",
        name=f"llmft-gpu-net-{index}",
        project=settings.project,
        auto_create_subnetworks=False,
        mtu=RDMA_MTU,
        network_profile=profile,
        opts=pulumi.ResourceOptions(depends_on=list(after)),
    )


def _subnet(
    settings: Settings, name: str, network: gcp.compute.Network, cidr: str
) -> gcp.compute.Subnetwork:
    return gcp.compute.Subnetwork(
        f"gpu-subnet-{name}",
        name=f"llmft-gpu-subnet-{name}",
        project=settings.project,
        region=settings.region,
        network=network.id,
        ip_cidr_range=cidr,
    )


def _rdma_networks(settings: Settings, after: Sequence[pulumi.Resource]) -> GpuNetworks:
    """The second gVNIC's VPC (192.168.0.0/24, with its firewall rule) and the RoCE VPC in the GPU
    pool's zone with one subnet per RDMA NIC (192.168.1-8.0/24), as the guide creates them."""
    gke = settings.gke
    assert gke is not None and gke.single_zone()  # settings: RDMA needs one zone
    gvnic = _vpc(settings, "gvnic", after)
    gcp.compute.Firewall(
        "gpu-net-gvnic-internal",
        name="llmft-gpu-net-gvnic-internal",
        project=settings.project,
        network=gvnic.name,
        allows=[{"protocol": "tcp"}, {"protocol": "udp"}, {"protocol": "icmp"}],
        source_ranges=[FIREWALL_SOURCE],
    )
    profile = RDMA_NETWORK_PROFILE.format(zone=gke.single_zone())
    rdma = _vpc(
        settings, "rdma", after, f"projects/{settings.project}/global/networkProfiles/{profile}"
    )
    nics = GPUDIRECT_NETWORKS[RDMA]
    subnets = [_subnet(settings, "gvnic", gvnic, SUBNET_RANGE.format(index=0))] + [
        _subnet(settings, f"rdma-{i}", rdma, SUBNET_RANGE.format(index=i + 1)) for i in range(nics)
    ]
    return GpuNetworks(RDMA, [gvnic] + [rdma] * nics, subnets)


def gib_installer() -> dict[str, Any]:
    """The gIB NCCL plugin installer DaemonSet on A3 Ultra and A4 nodes (node_facts.RDMA_SOURCE):
    a privileged init container copies the plugin into the driver's lib64 and the gib
    directory, then a pause container keeps the pod (nccl-rdma-installer.yaml at RDMA_SOURCE's
    commit, whose martian-logging container Google has since removed)."""
    labels = {"k8s-app": "nccl-rdma-installer"}
    host = "/usr/local/home/kubernetes/bin"
    affinity = {"key": GPU_NODE_LABEL, "operator": "In", "values": list(RDMA_ACCELERATORS)}
    pod = {
        "priorityClassName": "system-node-critical",
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [affinity]}]
                }
            }
        },
        "tolerations": [{"operator": "Exists"}],
        "hostNetwork": True,
        "hostPID": True,
        "volumes": [
            {
                "name": "library-dir-host",
                "hostPath": {
                    "path": "/home/kubernetes/bin/nvidia/lib64",
                    "type": "DirectoryOrCreate",
                },
            },
            {"name": "gib", "hostPath": {"path": GIB_HOST_DIR}},
        ],
        "initContainers": [
            {
                "name": "nccl-rdma-installer",
                "image": GIB_INSTALLER_IMAGE,
                "resources": {"requests": {"cpu": "150m"}},
                "securityContext": {"privileged": True},
                "volumeMounts": [
                    {"name": "library-dir-host", "mountPath": f"{host}/nvidia/lib64"},
                    {"name": "gib", "mountPath": f"{host}/gib"},
                ],
                "command": ["/bin/sh", "-c", GIB_INSTALL_COMMAND],
            }
        ],
        "containers": [{"name": "pause", "image": PAUSE_IMAGE}],
    }
    return {
        "metadata": {"name": "nccl-rdma-installer", "namespace": "kube-system", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


PAUSE_IMAGE = (
    "gke.gcr.io/pause:3.8@sha256:880e63f94b145e46f1b1082bb71b85e21f16b99b180b9996407d61240ceb9830"
)
"""The installer's idle container, pinned by digest as Google's manifest pins it."""


def _network_objects(
    gpu: GpuNetworks, provider: k8s.Provider, after: list[pulumi.Resource]
) -> None:
    """A GKENetworkParamSet and a Network per subnet, named as the pods' annotation names them."""
    if gpu.setup == RDMA:
        names = [RDMA_HOST_NETWORK] + [
            RDMA_NETWORK.format(index=i) for i in range(len(gpu.subnets) - 1)
        ]
        modes = ["NetDevice"] + ["RDMA"] * (len(gpu.subnets) - 1)
        keys = names
    else:
        names = [f"vpc{i}" for i in range(1, len(gpu.subnets) + 1)]
        modes = ["NetDevice"] * len(gpu.subnets)
        keys = [str(i) for i in range(1, len(gpu.subnets) + 1)]  # the stack's first names
    for key, name, mode, network, subnet in zip(
        keys, names, modes, gpu.networks, gpu.subnets, strict=True
    ):
        params = k8s.apiextensions.CustomResource(
            f"gke-network-params-{key}",
            api_version="networking.gke.io/v1",
            kind="GKENetworkParamSet",
            metadata={"name": name},
            spec={"vpc": network.name, "vpcSubnet": subnet.name, "deviceMode": mode},
            opts=pulumi.ResourceOptions(provider=provider, depends_on=after),
        )
        k8s.apiextensions.CustomResource(
            f"gke-network-{key}",
            api_version="networking.gke.io/v1",
            kind="Network",
            metadata={"name": name},
            spec={
                "parametersRef": {
                    "group": "networking.gke.io",
                    "kind": "GKENetworkParamSet",
                    "name": name,
                },
                "type": "Device",
            },
            opts=pulumi.ResourceOptions(provider=provider, depends_on=[params, *after]),
        )


def build_cluster_objects(
    gpu: GpuNetworks, provider: k8s.Provider, after: list[pulumi.Resource]
) -> pulumi.Resource:
    """The Network objects the pods attach to and the NCCL plugin installer (TCPX/TCPXO: with
    the NRI device injector)."""
    on_cluster = pulumi.ResourceOptions(provider=provider, depends_on=after)
    _network_objects(gpu, provider, after)
    if gpu.setup == RDMA:
        installer = gib_installer()
        return k8s.apps.v1.DaemonSet(
            "nccl-rdma-installer",
            metadata=installer["metadata"],
            spec=installer["spec"],
            opts=on_cluster,
        )
    # The receive-data-path manager is not privileged: it gets the GPU devices from the NRI device
    # injector, which acts on the pod's devices.gke.io annotation (node_setup.py). Without the
    # injector the annotation is ignored and the manager cannot open the GPUs (review Q2).
    k8s.yaml.ConfigFile("nri-device-injector", file=str(DEVICE_INJECTOR), opts=on_cluster)
    return k8s.yaml.ConfigFile(
        "nccl-plugin-installer", file=str(INSTALLERS[gpu.setup]), opts=on_cluster
    )
