"""Facts about the machines a run's work lands on, each with its source and the date it was
checked: the Dataflow workers' disk, the GKE GPU pool's taint and disk, and how fast GPUs talk
across nodes on each GPU machine family (cloud audit 2026-12-07, C4, C5, C6, C8).

To update a fact: change it, its source line and CHECKED, then run tests/test_node_facts.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CHECKED = "2026-12-07"

# --- the image and Dataflow's worker disk (C4) -----------------------------------------------------

IMAGE_UNPACKED_GB = 12
"""Budget for the project image unpacked (python slim + CUDA torch and its NVIDIA wheels + Beam +
the package). Not measured here (the image is never built offline): docs/deploy/cloudbuild.yaml
fails the build when `docker image inspect` reports more, so the Dataflow disk below stays
sized for what is pushed."""
DATAFLOW_DISK_SOURCE = (
    "cloud.google.com/dataflow/docs/shuffle-for-batch#disk-size (batch jobs with Dataflow Shuffle, "
    "the default, get a 25 GB boot disk, part of it used for the operating system, binaries, logs "
    "and containers); cloud.google.com/dataflow/docs/reference/pipeline-options (disk_size_gb)"
)
DATAFLOW_DEFAULT_DISK_GB = 25
"""What a batch worker gets without `disk_size_gb` (DATAFLOW_DISK_SOURCE)."""


def dataflow_disk_gb(image_gb: float = IMAGE_UNPACKED_GB) -> int:
    """The worker boot disk for an image of `image_gb` unpacked: what the default disk keeps for
    the system, plus the image twice (compressed layers and unpacked files are both on disk while
    it is pulled), rounded up to 10 GB."""
    return int(math.ceil((DATAFLOW_DEFAULT_DISK_GB + 2 * image_gb) / 10) * 10)


DATAFLOW_DISK_GB = dataflow_disk_gb()
"""`disk_size_gb` of every Dataflow job the pipeline starts (components/steps/preprocess.py) and
of the Flex Template's default environment (infra/llmft_infra/flex_template.py)."""

# --- the GKE GPU pool: taint (C5) and disk (C6) -----------------------------------------------------

GPU_TAINT_SOURCE = (
    "cloud.google.com/kubernetes-engine/docs/how-to/gpus (GKE taints a GPU node pool "
    "nvidia.com/gpu=present:NoSchedule only when it is added to a cluster that already has a "
    "non-GPU pool; pods that request nvidia.com/gpu get the matching toleration from the "
    "ExtendedResourceToleration admission controller)"
)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
"""The GPU pool's taint as the GKE API (and pulumi-gcp) spells it: every pod without the
toleration (KFP's task pods, the per-run etcd) stays off the GPU nodes, so they scale down."""
GPU_NODE_LABEL = "cloud.google.com/gke-accelerator"
"""The label GKE puts on every GPU node (its accelerator): pods that must never land on a GPU
node require it to be absent (components/etcd/manifests.py)."""

NODE_DISK_SOURCE = (
    "kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction (a pod is evicted "
    "when the node's filesystem runs short, nodefs/imagefs); kubernetes.io/docs/concepts/"
    "configuration/manage-resources-containers#local-ephemeral-storage (an ephemeral-storage "
    "request makes the scheduler place the pod only where that much is allocatable); "
    "cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes#eviction-threshold "
    "(GKE reserves ~10% of the boot disk plus the eviction threshold)"
)
MODEL_DISK_HEADROOM = 1.1
"""The base model's copy on disk over its weights' bytes (tokenizer, config, partial files)."""
CACHE_GB = 10
"""Per training pod beside the model: Python and Triton caches, logs, the last local checkpoint
shard before upload."""
GKE_DISK_RESERVED_FRACTION = 0.2
"""Of a node's boot disk not allocatable to pods: GKE's reservation and eviction threshold
(NODE_DISK_SOURCE), rounded up."""


def model_bytes(parameters: int, bytes_per_parameter: int = 2) -> int:
    """Bytes of a model's weights on disk (bf16/fp16 safetensors: 2 per parameter)."""
    return parameters * bytes_per_parameter


def ephemeral_storage_gib(weight_bytes: int) -> int:
    """The training pod's ephemeral-storage request: its copy of the base model plus caches."""
    return math.ceil(weight_bytes * MODEL_DISK_HEADROOM / 2**30) + CACHE_GB


def gpu_node_disk_gb(weight_bytes: int, image_gb: float = IMAGE_UNPACKED_GB) -> int:
    """A GPU node's boot disk that hosts one training pod for a model of `weight_bytes`: the pod's
    request, the image twice while it is pulled, over what GKE leaves allocatable; rounded up to
    50 GB."""
    need = ephemeral_storage_gib(weight_bytes) + 2 * image_gb
    return int(math.ceil(need / (1 - GKE_DISK_RESERVED_FRACTION) / 50) * 50)


GPU_NODE_DISK_GB = gpu_node_disk_gb(model_bytes(70_000_000_000))
"""The stack's default GPU-node boot disk: sized for a 70B bf16 base model (the largest the
default A3 pool trains): 250 GB (infra/llmft_infra/settings.py `gke.gpu_disk_size_gb`)."""

# --- GPU-to-GPU bandwidth across nodes (C8) ----------------------------------------------------------

INTERCONNECT_SOURCE = (
    "cloud.google.com/compute/docs/gpus/gpu-network-bandwidth (per machine type: GPU NICs and "
    "their bandwidth; A3 High 4x200 Gbps GPU NICs, A3 Mega 8x200, A3 Ultra and A4 8x400 RDMA; "
    "the A3 High primary NIC up to 200 Gbps: the GKE GPUDirect-TCPX guide's A3 list; A3 Ultra and "
    "A4: two gVNICs providing an additional 400 Gbps together, 200 on the primary one; "
    "A2 and G2 one gVNIC, up to 100 Gbps); cloud.google.com/kubernetes-engine/docs/how-to/"
    "gpu-bandwidth-gpudirect-tcpx (GKE: gVNIC, multi-networking with one additional VPC per GPU "
    "NIC, the GPUDirect-TCPX/TCPXO NCCL plugin installed by a DaemonSet and its receive-data-path "
    "manager beside the training container); cloud.google.com/ai-hypercomputer/docs/create/"
    "gke-ai-hypercompute-custom (A3 Ultra/A4: RDMA network profile, gIB NCCL plugin); "
    "cloud.google.com/kubernetes-engine/docs/how-to/using-gvnic (gVNIC on GPU nodes)"
)


@dataclass(frozen=True)
class Interconnect:
    """How a machine family's GPUs reach GPUs on other nodes."""

    family: str
    """Machine-type prefix (`a3-highgpu-8g`, `g2-standard`)."""
    gpu_nic_gbps: int
    """Aggregate GPU-to-GPU bandwidth per node with the full setup (Gbit/s)."""
    primary_gbps: int
    """What NCCL gets over TCP sockets on the primary NIC alone (Gbit/s, the family's largest
    shape; smaller shapes get less)."""
    gke_setup: str
    """What gives `gpu_nic_gbps` on GKE: "gvnic" (nothing beyond gVNIC), "gpudirect-tcpx",
    "gpudirect-tcpxo" or "gpudirect-rdma"."""
    vertex: str
    """What Vertex AI does for a custom container on this family (from the sources read)."""

    @property
    def needs_gpudirect(self) -> bool:
        return self.gke_setup != "gvnic"

    def allreduce_gbytes_s(self, *, full: bool) -> float:
        """Upper bound of the inter-node all-reduce bus bandwidth (GB/s): the NIC line rate;
        NCCL tests reach roughly 70-90% of it."""
        return (self.gpu_nic_gbps if full else self.primary_gbps) / 8


_VERTEX_UNSTATED = (
    "not stated in the sources read: the estimate assumes the primary NIC unless the run is "
    "measured (docs/launchers.md, interconnect)"
)
INTERCONNECTS: tuple[Interconnect, ...] = (
    Interconnect("a3-highgpu-8g", 800, 200, "gpudirect-tcpx", _VERTEX_UNSTATED),
    Interconnect("a3-megagpu-8g", 1600, 200, "gpudirect-tcpxo", _VERTEX_UNSTATED),
    Interconnect("a3-ultragpu-8g", 3200, 200, "gpudirect-rdma", _VERTEX_UNSTATED),
    Interconnect("a4-highgpu-8g", 3200, 200, "gpudirect-rdma", _VERTEX_UNSTATED),
    Interconnect("a3-highgpu", 100, 100, "gvnic", "the primary NIC (gVNIC) only"),
    Interconnect("a2-ultragpu", 100, 100, "gvnic", "the primary NIC (gVNIC) only"),
    Interconnect("a2-highgpu", 100, 100, "gvnic", "the primary NIC (gVNIC) only"),
    Interconnect("g2-standard", 100, 100, "gvnic", "the primary NIC (gVNIC) only"),
)
"""Most specific prefix first (a3-highgpu-8g before the smaller a3-highgpu shapes)."""

GPUDIRECT_NETWORKS = {"gpudirect-tcpx": 4, "gpudirect-tcpxo": 8, "gpudirect-rdma": 8}
"""GPU NICs per node for each GPUDirect setup: TCPX/TCPXO one additional VPC each; RDMA one subnet
each of the one RoCE VPC (RDMA_SOURCE)."""

# --- GPUDirect-RDMA on A3 Ultra and A4 (C8), checked 2026-12-07 -----------------------------------

RDMA_SOURCE = (
    "cloud.google.com/ai-hypercomputer/docs/create/gke-ai-hypercompute-custom (A3 Ultra/A4 on "
    "GKE Standard: a VPC and subnet for the second gVNIC (MTU 8896, a firewall rule for "
    "192.168.0.0/16), one VPC with the RoCE network profile and 8 subnets for the RDMA NICs, the "
    "cluster with Dataplane V2 and multi-networking, the node pool's additional node networks, "
    "GKENetworkParamSet+Network objects `gvnic-1` (deviceMode NetDevice) and `rdma-0`..`rdma-7` "
    "(deviceMode RDMA), the nccl-rdma-installer DaemonSet, and the pods' annotations eth0 "
    "default, eth1 gvnic-1, eth2..eth9 rdma-0..rdma-7, /home/kubernetes/bin/gib mounted at "
    "/usr/local/gib, LD_LIBRARY_PATH=/usr/local/nvidia/lib64 and the gIB plugin's "
    "set_nccl_env.sh sourced before NCCL starts); cloud.google.com/vpc/docs/rdma-network-profiles "
    "(RoCE profile `ZONE-vpc-roce`, MRDMA NICs of A3 Ultra, A4 and A4X only, the network and its "
    "instances in the profile's zone, MTU 8896, implicit allow-ingress: no firewall rules); "
    "github.com/GoogleCloudPlatform/container-engine-accelerators at 992db81 (the commit the "
    "TCPX/TCPXO manifests are vendored from): gpudirect-rdma/nccl-rdma-installer.yaml (image "
    "nccl-plugin-gib v1.1.1 since 155bfa4, 2026-03-09; `container_entry.sh install` without "
    "--install-nccl since 2da1c92, 2026-05-06: the plugin only, no NCCL copied beside the "
    "driver) and nccl-test.yaml (the installer's and a test pod's paths)"
)
RDMA_CHECKED = "2026-12-07"
RDMA_NETWORK_PROFILE = "{zone}-vpc-roce"
"""The RoCE network profile of a zone: the RDMA VPC and the GPU nodes live in that one zone."""
RDMA_MTU = 8896
"""MTU of the RDMA VPC (the profile's default) and, as the guide creates it, of the gVNIC VPC."""
RDMA_HOST_NETWORK = "gvnic-1"
"""The Network object of the second host NIC (eth1)."""
RDMA_NETWORK = "rdma-{index}"
"""The Network object of RDMA NIC `index` (0..7; eth2..eth9 in the pod)."""
RDMA_ACCELERATORS = ("nvidia-h200-141gb", "nvidia-b200")
"""GKE accelerators of A3 Ultra and A4: the installer DaemonSet runs on their nodes only."""
GIB_INSTALLER_IMAGE = "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"
"""The gIB NCCL plugin installer (pinned as nccl-rdma-installer.yaml pins it at RDMA_SOURCE's
commit)."""
GIB_INSTALL_COMMAND = (
    "set -ex; /scripts/container_entry.sh install; "
    "cp -r /var/lib/gib/lib64/. /usr/local/home/kubernetes/bin/nvidia/lib64; "
    "cp -r /var/lib/gib/. /usr/local/home/kubernetes/bin/gib"
)
"""What the installer runs (privileged, the node's two directories mounted under
/usr/local/home/kubernetes/bin): the gIB plugin into the driver's lib64, the plugin's scripts
into the gib directory. Not `--install-nccl`, which Google's manifest dropped: it put Google's
libnccl into /usr/local/nvidia/lib64, first on the training pods' LD_LIBRARY_PATH (`gpu_env`),
where it could stand in for the NCCL torch was built with."""
GIB_HOST_DIR = "/home/kubernetes/bin/gib"
GIB_POD_DIR = "/usr/local/gib"
GIB_NCCL_ENV = f"source {GIB_POD_DIR}/scripts/set_nccl_env.sh"
"""Run before the trainer (as the guide's pods do): the gIB plugin's NCCL settings."""


def interconnect(machine_type: str) -> Interconnect | None:
    """The family facts of `machine_type`; None for a machine these tables do not know."""
    for entry in INTERCONNECTS:
        if machine_type.startswith(entry.family):
            return entry
    return None


def interconnect_note(
    machine_type: str, nodes: int, *, gpudirect: bool, backend: str = "gke"
) -> str | None:
    """The bandwidth assumption of a multi-node run (None for one node or an unknown machine):
    what it gets per node, and when the family needs a GPUDirect setup the run does not have (on
    GKE: `gpudirect` off; on Vertex AI: not documented in the sources read), that its steps may be
    network-bound."""
    entry = interconnect(machine_type)
    if nodes < 2 or entry is None:
        return None
    full = not entry.needs_gpudirect or (gpudirect and backend == "gke")
    gbps = entry.gpu_nic_gbps if full else entry.primary_gbps
    note = (
        f"interconnect: {nodes} x {machine_type}, assumed {gbps} Gbit/s per node "
        f"(all-reduce at most ~{entry.allreduce_gbytes_s(full=full):.0f} GB/s)"
    )
    if not full:
        why = (
            f"without {entry.gke_setup} (gpudirect=false)"
            if backend == "gke"
            else f"Vertex AI's {entry.gke_setup} setup is {entry.vertex.split(':')[0]}"
        )
        note += (
            f": {why}, NCCL is assumed to use the primary NIC, not the {entry.gpu_nic_gbps} "
            "Gbit/s of the GPU NICs; multi-node steps may be network-bound"
        )
    return note
