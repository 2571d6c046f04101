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

A3 Ultra and A4 (RDMA) need an RDMA network profile and the gIB plugin instead: not set up here
(the stack refuses nothing for them; a multi-node run says it assumes the primary NIC).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from components.platform.node_facts import GPUDIRECT_NETWORKS, interconnect
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


def setup_of(gke: GkeSettings) -> str | None:
    """The GPUDirect setup the pool needs and the settings ask for, or None."""
    entry = interconnect(gke.gpu_machine_type)
    if not gke.gpudirect or entry is None or entry.gke_setup not in INSTALLERS:
        return None
    return entry.gke_setup


@dataclass
class GpuNetworks:
    setup: str
    networks: list[gcp.compute.Network]
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


def build_cluster_objects(
    gpu: GpuNetworks, provider: k8s.Provider, after: list[pulumi.Resource]
) -> k8s.yaml.ConfigFile:
    """The Network objects the pods attach to, the NRI device injector and the NCCL plugin
    installer."""
    on_cluster = pulumi.ResourceOptions(provider=provider, depends_on=after)
    for index, (network, subnet) in enumerate(zip(gpu.networks, gpu.subnets, strict=True), 1):
        name = f"vpc{index}"
        params = k8s.apiextensions.CustomResource(
            f"gke-network-params-{index}",
            api_version="networking.gke.io/v1",
            kind="GKENetworkParamSet",
            metadata={"name": name},
            spec={"vpc": network.name, "vpcSubnet": subnet.name, "deviceMode": "NetDevice"},
            opts=on_cluster,
        )
        k8s.apiextensions.CustomResource(
            f"gke-network-{index}",
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
    # The receive-data-path manager is not privileged: it gets the GPU devices from the NRI device
    # injector, which acts on the pod's devices.gke.io annotation (node_setup.py). Without the
    # injector the annotation is ignored and the manager cannot open the GPUs (review Q2).
    k8s.yaml.ConfigFile("nri-device-injector", file=str(DEVICE_INJECTOR), opts=on_cluster)
    return k8s.yaml.ConfigFile(
        "nccl-plugin-installer", file=str(INSTALLERS[gpu.setup]), opts=on_cluster
    )
