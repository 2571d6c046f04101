"""What a training pod needs from its GPU node beyond GPUs, for any Kubernetes job kind
(the PyTorchJob's pod template; a TrainJob's GPUDirect runtime, components/launchers/trainjob.py):
an ephemeral-storage request sized from the base model (C6), the GPUDirect-TCPX/TCPXO/RDMA setup
that gives A3, A3 Ultra and A4 nodes their GPU NICs' bandwidth (C8), GKE's driver mount and the CUDA expectation (`gpu_env`) and one zone for a
multi-node job's pods (`same_zone_affinity`).

GPUDirect follows Google's own manifests (GoogleCloudPlatform/container-engine-accelerators
gpudirect-tcpx/nccl-test-latest.yaml, nccl-config.yaml, gpudirect-tcpxo/nccl-test-latest.yaml
and README.md at commit 992db81, 2026-06; cloud.google.com/kubernetes-engine/docs/how-to/
gpu-bandwidth-gpudirect-tcpx): the pod is attached to the node pool's additional networks
(`vpc1`..`vpcN`, created by infra/llmft_infra/gpudirect.py), the receive-data-path manager runs
beside the trainer with the GPU devices it needs (a native sidecar, as Google's best-practice.md
asks, so that the pod completes when the trainer exits), and NCCL finds the plugin the installer
DaemonSet put under /usr/local/nvidia/lib64. Unverified offline: that the NCCL bundled with the
image's torch loads this plugin (Google tests it with the installer's own NCCL).

GPUDirect-RDMA (A3 Ultra, A4) follows Google's guide and test pods (node_facts.RDMA_SOURCE): no
daemon beside the trainer; the pod joins `gvnic-1` and `rdma-0`..`rdma-7`, mounts the gIB
directory the installer DaemonSet fills (infra/llmft_infra/gpudirect.py) and sources its NCCL
settings before torchrun. Unverified offline likewise: that the image's NCCL works with the gIB
plugin the installer put beside the driver (the guide's pods use Google's diagnostic image).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from components.platform.node_facts import (
    GIB_HOST_DIR,
    GIB_NCCL_ENV,
    GIB_POD_DIR,
    GPUDIRECT_NETWORKS,
    RDMA_HOST_NETWORK,
    RDMA_NETWORK,
    ephemeral_storage_gib,
)
from components.platform.platform_facts import GKE_NVIDIA_LIBRARY_PATH
from components.runtime.run_identity import k8s_labels
from trainer.cuda_guard import expect_cuda_env

NVIDIA_LIB = "/usr/local/nvidia/lib64"

_TCPX_ENV = {
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_CROSS_NIC": "0",
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_P2P_PXN_LEVEL": "0",
    "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": "eth1,eth2,eth3,eth4",
    "NCCL_GPUDIRECTTCPX_CTRL_DEV": "eth0",
    "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": "/run/tcpx",
    "NCCL_DYNAMIC_CHUNK_SIZE": "524288",
    "NCCL_P2P_NET_CHUNKSIZE": "524288",
    "NCCL_P2P_PCI_CHUNKSIZE": "524288",
    "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
    "NCCL_BUFFSIZE": "4194304",
    "NCCL_NSOCKS_PERTHREAD": "4",
    "NCCL_SOCKET_NTHREADS": "1",
    "NCCL_GPUDIRECTTCPX_TX_BINDINGS": (
        "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177"
    ),
    "NCCL_GPUDIRECTTCPX_RX_BINDINGS": (
        "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191"
    ),
    "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": "500000",
}
"""NCCL's environment for GPUDirect-TCPX on a3-highgpu-8g (nccl-config.yaml's run-nccl.sh)."""
_TCPXO_ENV = {"NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices"}
"""TCPXO's other settings come from the installer's nccl-env-profile.sh, sourced at start."""
TCPXO_PROFILE = f"NCCL_LIB_DIR={NVIDIA_LIB} source {NVIDIA_LIB}/nccl-env-profile.sh"

_DAEMON = {
    "gpudirect-tcpx": (
        "tcpx-daemon",
        "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/tcpgpudmarxd-dev:v2.0.12",
        ["/tcpgpudmarxd/build/app/tcpgpudmarxd", "--gpu_nic_preset", "a3vm",
         "--gpu_shmem_type", "fd", "--uds_path", "/run/tcpx", "--setup_param",
         "--verbose 128 2 0"],
        ["NET_ADMIN"],
    ),
    "gpudirect-tcpxo": (
        "tcpxo-daemon",
        "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.21",
        ["/bin/sh", "-c",
         "chmod 755 /fts/entrypoint_rxdm_container.sh && "
         "/fts/entrypoint_rxdm_container.sh --num_hops=2"],
        ["NET_ADMIN", "NET_BIND_SERVICE"],
    ),
}  # fmt: skip
"""The receive-data-path manager per setup: (container, image pinned as Google's manifest does,
command, capabilities)."""
RDMA = "gpudirect-rdma"
GPUDIRECT_SETUPS = (*_DAEMON, RDMA)
"""The GPUDirect setups the launcher can add to a pod."""


@dataclass
class PodPatch:
    """Additions to a pod template for one node setup."""

    annotations: dict[str, str] = field(default_factory=dict)
    sidecars: list[dict[str, Any]] = field(default_factory=list)
    """Containers that run beside the trainer for the pod's life: added as native sidecars
    (`initContainers` with `restartPolicy: Always`, Kubernetes >= 1.29), so the pod completes
    when the trainer exits (a regular container that never exits keeps a Job's pod Running:
    container-engine-accelerators gpudirect-tcpxo/best-practice.md, "Automatic Sidecar
    Termination")."""
    volumes: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Environment of the training container."""
    mounts: list[dict[str, Any]] = field(default_factory=list)
    """Volume mounts of the training container."""
    command_prefix: str = ""
    """Shell run before the training command (the training container then starts via bash)."""


def gpudirect_patch(setup: str, gpus: int) -> PodPatch:
    """The pod additions of `setup` (one of GPUDIRECT_SETUPS) for `gpus` GPUs.

    Raises:
        ValueError: a setup that is not one of those.
    """
    if setup == RDMA:
        return rdma_patch()
    if setup not in _DAEMON:
        raise ValueError(f"GPUDirect setup {setup!r}: llmft sets up {', '.join(GPUDIRECT_SETUPS)}")
    name, image, command, capabilities = _DAEMON[setup]
    networks = GPUDIRECT_NETWORKS[setup]
    interfaces = [{"interfaceName": "eth0", "network": "default"}] + [
        {"interfaceName": f"eth{i}", "network": f"vpc{i}"} for i in range(1, networks + 1)
    ]
    devices = [f"/dev/nvidia{i}" for i in range(gpus)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    if setup == "gpudirect-tcpxo":
        devices.append("/dev/dmabuf_import_helper")
    host = {"nvidia": "/home/kubernetes/bin/nvidia/lib64", "sys": "/sys", "proc-sys": "/proc/sys"}
    if setup == "gpudirect-tcpx":
        host["tcpx-socket"] = "/run/tcpx"
    else:
        host["aperture-devices"] = "/dev/aperture_devices"
    daemon_mounts = [
        {"name": "nvidia", "mountPath": NVIDIA_LIB},
        {"name": "sys", "mountPath": "/hostsysfs"},
        {"name": "proc-sys", "mountPath": "/hostprocsysfs"},
    ]
    if setup == "gpudirect-tcpx":
        daemon_mounts.append({"name": "tcpx-socket", "mountPath": "/run/tcpx"})
    patch = PodPatch(
        annotations={
            "networking.gke.io/default-interface": "eth0",
            "networking.gke.io/interfaces": json.dumps(interfaces),
            f"devices.gke.io/container.{name}": "".join(f"- path: {d}\n" for d in devices),
        },
        sidecars=[
            {
                "name": name,
                "image": image,
                "restartPolicy": "Always",
                "command": command,
                "securityContext": {"capabilities": {"add": capabilities}},
                "env": [{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB}],
                "volumeMounts": daemon_mounts,
            }
        ],
        volumes=[{"name": k, "hostPath": {"path": v}} for k, v in host.items()],
    )
    if setup == "gpudirect-tcpx":
        patch.env = dict(_TCPX_ENV)
        patch.mounts = [{"name": "tcpx-socket", "mountPath": "/run/tcpx"}]
    else:
        patch.env = dict(_TCPXO_ENV)
        patch.mounts = [{"name": "aperture-devices", "mountPath": "/dev/aperture_devices"}]
        patch.command_prefix = TCPXO_PROFILE
    return patch


def rdma_patch() -> PodPatch:
    """GPUDirect-RDMA's pod additions (node_facts.RDMA_SOURCE): eth1 on the second gVNIC's network,
    eth2..eth9 on the RDMA NICs', the gIB directory, and its NCCL settings sourced first (GKE's
    driver mount already gives /usr/local/nvidia/lib64, where the installer put the plugin, and
    `gpu_env` puts it on LD_LIBRARY_PATH)."""
    nics = GPUDIRECT_NETWORKS[RDMA]
    interfaces = [
        {"interfaceName": "eth0", "network": "default"},
        {"interfaceName": "eth1", "network": RDMA_HOST_NETWORK},
    ] + [
        {"interfaceName": f"eth{i + 2}", "network": RDMA_NETWORK.format(index=i)}
        for i in range(nics)
    ]
    return PodPatch(
        annotations={
            "networking.gke.io/default-interface": "eth0",
            "networking.gke.io/interfaces": json.dumps(interfaces),
        },
        volumes=[{"name": "gib", "hostPath": {"path": GIB_HOST_DIR}}],
        mounts=[{"name": "gib", "mountPath": GIB_POD_DIR}],
        command_prefix=GIB_NCCL_ENV,
    )


def apply_patch(template: dict[str, Any], container: str, patch: PodPatch) -> None:
    """Add `patch` to a pod template (`{"metadata": ..., "spec": ...}`) in place; `container` is
    the training container's name."""
    if patch.annotations:
        metadata = template.setdefault("metadata", {})
        metadata.setdefault("annotations", {}).update(patch.annotations)
    spec = template["spec"]
    if patch.volumes:
        spec.setdefault("volumes", []).extend(patch.volumes)
    trainer = next(c for c in spec["containers"] if c["name"] == container)
    if patch.env:
        trainer.setdefault("env", []).extend({"name": k, "value": v} for k, v in patch.env.items())
    if patch.mounts:
        trainer.setdefault("volumeMounts", []).extend(patch.mounts)
    if patch.command_prefix:
        command = " ".join(shlex.quote(part) for part in trainer["command"])
        trainer["command"] = ["/bin/bash", "-c", f"{patch.command_prefix} && exec {command}"]
    if patch.sidecars:
        spec.setdefault("initContainers", []).extend(patch.sidecars)


def ephemeral_storage_request(weight_bytes: int | None) -> str | None:
    """The training container's `ephemeral-storage` request for a base model of `weight_bytes`
    (None when the size is unknown: no request)."""
    if not weight_bytes:
        return None
    return f"{ephemeral_storage_gib(weight_bytes)}Gi"


ZONE_TOPOLOGY_KEY = "topology.kubernetes.io/zone"
"""The well-known node label of a node's zone (kubernetes.io/docs/reference/labels-annotations-
taints/#topologykubernetesiozone)."""


def gpu_env(gpus: int) -> dict[str, str]:
    """Environment of a pod given `gpus` GPUs on GKE: the driver mount on the loader path and the
    expectation of CUDA (trainer/cuda_guard.py); {} for CPU pods."""
    if gpus <= 0:
        return {}
    return {"LD_LIBRARY_PATH": GKE_NVIDIA_LIBRARY_PATH, **expect_cuda_env(gpus)}


def same_zone_affinity(run_id: str) -> dict[str, Any]:
    """A required podAffinity: every pod of the run's training job in the zone of the others.

    The first pod matches its own term, which the scheduler accepts when no other pod matches
    yet (kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-
    and-anti-affinity); the rest follow it into its zone.
    """
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": k8s_labels(run_id, "trainer")},
                    "topologyKey": ZONE_TOPOLOGY_KEY,
                }
            ]
        }
    }
