"""The GPU node facts and the pod additions that use them (cloud audit 2026-12-07): the Dataflow
disk (C4), the GPU pool's taint kept off by non-training pods (C5), ephemeral storage sized from
the base model (C6), the GPUDirect pod setups (TCPX, TCPXO, RDMA) and the multi-node bandwidth
assumption (C8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from crd_validation import PYTORCHJOB_CRD, crd_schema

from components.etcd.manifests import build_etcd_statefulset
from components.launchers import TrainLaunch
from components.launchers.node_setup import ephemeral_storage_request, gpudirect_patch
from components.launchers.pytorchjob import PyTorchJobOptions, build_pytorchjob
from components.platform import node_facts
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def launch(nodes: int = 2, procs: int = 8) -> TrainLaunch:
    trainer = TrainConfig(model="gs://b/m", data="gs://b/d", output="gs://b/o", max_steps=10)
    return TrainLaunch(run_id="run-1", trainer=trainer, nodes=nodes, nproc_per_node=procs)


def schema() -> dict[str, Any]:
    return crd_schema(PYTORCHJOB_CRD, "v1")


def worker(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


def test_a_70b_model_gets_its_disk_and_request() -> None:
    weights = node_facts.model_bytes(70_000_000_000)
    assert ephemeral_storage_request(weights) == "154Gi"
    assert ephemeral_storage_request(None) is None
    # The stack's default node disk hosts that request, the image pulled twice, GKE's share.
    disk = node_facts.GPU_NODE_DISK_GB
    assert (
        disk * (1 - node_facts.GKE_DISK_RESERVED_FRACTION) >= 154 + 2 * node_facts.IMAGE_UNPACKED_GB
    )
    assert disk > 100  # GKE's default boot disk, which a 70B copy overflowed


def test_the_training_pod_requests_ephemeral_storage_without_a_limit() -> None:
    options = PyTorchJobOptions(accelerator="nvidia-h100-80gb", ephemeral_storage="154Gi")
    job = build_pytorchjob(launch=launch(), options=options)
    jsonschema.validate(job, schema())
    resources = worker(job)["spec"]["containers"][0]["resources"]
    assert resources["requests"]["ephemeral-storage"] == "154Gi"
    assert "ephemeral-storage" not in resources["limits"]


def test_gpu_pods_tolerate_the_taint_and_etcd_stays_off_gpu_nodes() -> None:
    job = build_pytorchjob(launch=launch(), options=PyTorchJobOptions(accelerator="nvidia-l4"))
    taint = node_facts.GPU_TAINT
    assert {"key": taint["key"], "operator": "Exists", "effect": "NoSchedule"} in worker(job)[
        "spec"
    ]["tolerations"]
    etcd = build_etcd_statefulset(run_id="run-1", namespace="ml")["spec"]["template"]["spec"]
    terms = etcd["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": node_facts.GPU_NODE_LABEL, "operator": "DoesNotExist"}]}
    ]
    assert "tolerations" not in etcd


@pytest.mark.parametrize(("setup", "nics"), [("gpudirect-tcpx", 4), ("gpudirect-tcpxo", 8)])
def test_gpudirect_pods_join_the_gpu_nic_networks(setup: str, nics: int) -> None:
    options = PyTorchJobOptions(accelerator="nvidia-h100-80gb", gpus_per_node=8, gpudirect=setup)
    job = build_pytorchjob(launch=launch(), options=options)
    jsonschema.validate(job, schema())
    template = worker(job)
    interfaces = json.loads(template["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [i["network"] for i in interfaces] == ["default"] + [
        f"vpc{i}" for i in range(1, nics + 1)
    ]
    assert [c["name"] for c in template["spec"]["containers"]] == ["pytorch"]
    # The receive-data-path manager is a native sidecar: a regular container that never exits
    # would keep the Job's pod Running after the trainer finishes (Google's best-practice.md).
    [sidecar] = template["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    daemon = f"devices.gke.io/container.{sidecar['name']}"
    assert "/dev/nvidia7" in template["metadata"]["annotations"][daemon]
    trainer = template["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    if setup == "gpudirect-tcpx":
        assert env["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"
        assert trainer["command"][:3] == ["python", "-m", "torch.distributed.run"]
    else:
        assert trainer["command"][:2] == ["/bin/bash", "-c"]
        assert trainer["command"][2].startswith("NCCL_LIB_DIR=/usr/local/nvidia/lib64 source")
        assert "exec python -m torch.distributed.run" in trainer["command"][2]
    assert {v["name"] for v in template["spec"]["volumes"]} >= {"nvidia", "sys", "proc-sys", "dshm"}


def test_gpudirect_rdma_pods_join_the_rdma_networks_and_source_the_gib_settings() -> None:
    """A3 Ultra / A4 (node_facts.RDMA_SOURCE): eth1 on gvnic-1, eth2..eth9 on rdma-0..7, no
    daemon beside the trainer, the gIB directory mounted and its NCCL settings sourced first."""
    options = PyTorchJobOptions(
        accelerator="nvidia-h200-141gb", gpus_per_node=8, gpudirect="gpudirect-rdma"
    )
    job = build_pytorchjob(launch=launch(), options=options)
    jsonschema.validate(job, schema())
    template = worker(job)
    interfaces = json.loads(template["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert interfaces == [
        {"interfaceName": "eth0", "network": "default"},
        {"interfaceName": "eth1", "network": "gvnic-1"},
    ] + [{"interfaceName": f"eth{i + 2}", "network": f"rdma-{i}"} for i in range(8)]
    assert [c["name"] for c in template["spec"]["containers"]] == ["pytorch"]
    trainer = template["spec"]["containers"][0]
    assert {"name": "gib", "mountPath": node_facts.GIB_POD_DIR} in trainer["volumeMounts"]
    assert {"name": "gib", "hostPath": {"path": "/home/kubernetes/bin/gib"}} in template["spec"][
        "volumes"
    ]
    assert trainer["command"][:2] == ["/bin/bash", "-c"]
    assert trainer["command"][2].startswith(
        "source /usr/local/gib/scripts/set_nccl_env.sh && exec python -m torch.distributed.run"
    )
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["LD_LIBRARY_PATH"].startswith("/usr/local/nvidia/lib64")


def test_gpudirect_needs_gpus_and_a_known_setup() -> None:
    with pytest.raises(ValueError, match="gpudirect='gpudirect-ib'"):
        build_pytorchjob(
            launch=launch(),
            options=PyTorchJobOptions(accelerator="nvidia-h200-141gb", gpudirect="gpudirect-ib"),
        )
    with pytest.raises(ValueError, match="llmft sets up"):
        gpudirect_patch("gpudirect-ib", 8)


def test_interconnect_facts_and_the_stated_assumption() -> None:
    high = node_facts.interconnect("a3-highgpu-8g")
    assert high is not None and high.gke_setup == "gpudirect-tcpx" and high.gpu_nic_gbps == 800
    assert node_facts.interconnect("a3-highgpu-4g").gke_setup == "gvnic"  # type: ignore[union-attr]
    assert node_facts.interconnect_note("a3-highgpu-8g", 1, gpudirect=False) is None
    slow = node_facts.interconnect_note("a3-highgpu-8g", 2, gpudirect=False)
    # The A3 High primary NIC: up to 200 Gbit/s (GKE's GPUDirect-TCPX guide; review Q5).
    assert slow and "200 Gbit/s per node" in slow and "network-bound" in slow
    fast = node_facts.interconnect_note("a3-highgpu-8g", 2, gpudirect=True)
    assert fast and "800 Gbit/s per node" in fast and "network-bound" not in fast
    g2 = node_facts.interconnect_note("g2-standard-24", 2, gpudirect=False)
    assert g2 and "network-bound" not in g2
    # A3 Ultra / A4: two gVNICs "provide an additional 400 Gbps" together (compute/docs/gpus/
    # gpu-network-bandwidth): NCCL's sockets on the primary one alone get 200 of it.
    for machine in ("a3-ultragpu-8g", "a4-highgpu-8g"):
        primary = node_facts.interconnect_note(machine, 2, gpudirect=False)
        assert primary and "200 Gbit/s per node" in primary and "network-bound" in primary


def test_the_dataflow_disk_is_sized_from_the_image() -> None:
    assert node_facts.dataflow_disk_gb(node_facts.IMAGE_UNPACKED_GB) == node_facts.DATAFLOW_DISK_GB
    assert node_facts.dataflow_disk_gb(12) == 50
    assert node_facts.dataflow_disk_gb(40) == 110
