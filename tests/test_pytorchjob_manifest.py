"""The PyTorchJob manifest: `build_pytorchjob` and `llmft render pytorchjob`, validated against the
Training Operator's CRD (the pod against Kubernetes' own schema) and a reviewed golden file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from crd_validation import PYTORCHJOB_CRD, crd_schema

from components.launchers import TrainLaunch
from components.launchers.pytorchjob import PyTorchJobOptions, build_pytorchjob, job_name
from components.runtime.run_identity import K8S_RUN_LABEL
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
RUN = "fine-tune-20261202-abc"
NAME = job_name(RUN)


@pytest.fixture(scope="module")
def pytorchjob_schema() -> dict[str, Any]:
    return crd_schema(PYTORCHJOB_CRD, "v1")


def seven_b_launch(rdzv: str = "etcd-v3") -> TrainLaunch:
    return TrainLaunch(
        run_id=RUN,
        trainer=TrainConfig(
            model="gs://bucket/models/llama-7b",
            data="gs://bucket/runs/r1/dataset",
            output="gs://bucket/runs/r1/train",
            max_steps=1000,
            lr=2e-5,
            activation_checkpointing=True,
        ),
        nodes=4,
        nproc_per_node=4,
        rdzv_backend=rdzv,
    )


def test_7b_4x4_etcd_v3_job_validates_and_passes_torchrun_args(
    pytorchjob_schema: dict, golden: Any
) -> None:
    job = build_pytorchjob(
        launch=seven_b_launch(),
        options=PyTorchJobOptions(
            namespace="ml",
            accelerator="nvidia-h100-80gb",
            cpu="96",
            memory="900Gi",
            service_account="llmft-trainer",
            hf_token_secret="hf-token",
            active_deadline_seconds=86400,
            gang_scheduling=True,
            scheduling_queue="gpu-queue",
        ),
    )
    jsonschema.validate(job, pytorchjob_schema)
    golden.check("pytorchjob_7b_etcd_v3.json", job)
    spec = job["spec"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    assert worker["replicas"] == 4 and spec["nprocPerNode"] == "4"
    # The operator does not know etcd-v3: no rdzvBackend, everything in torchrun's flags.
    assert spec["elasticPolicy"] == {
        "minReplicas": 4,
        "maxReplicas": 4,
        "maxRestarts": 0,
        "rdzvId": RUN,
    }
    etcd = f"llmft-etcd-{RUN}.ml.svc.cluster.local:2379"
    assert container["command"] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=4",
        "--nproc-per-node=4",
        "--rdzv-backend=etcd-v3",
        f"--rdzv-endpoint={etcd}",
        f"--rdzv-id={RUN}",
        "--max-restarts=0",
        "-m",
        "trainer",
        "--config-json",
        seven_b_launch().trainer.to_json(),
    ]
    # Every rank gets the whole trainer config, exactly as built.
    assert TrainConfig.from_json(container["command"][-1]) == seven_b_launch().trainer
    assert container["name"] == "pytorch"
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": 4, "cpu": "96", "memory": "900Gi"},
        "requests": {"cpu": "96", "memory": "900Gi"},
    }
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["serviceAccountName"] == "llmft-trainer"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
    }
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "None",
        "ttlSecondsAfterFinished": 86400,
        "backoffLimit": 13,  # 3 restarts for each of 4 nodes, + 1 (see the arithmetic test)
        "activeDeadlineSeconds": 86400,
        "schedulingPolicy": {"minAvailable": 4, "queue": "gpu-queue"},
    }
    for labels in (job["metadata"]["labels"], worker["template"]["metadata"]["labels"]):
        assert labels[K8S_RUN_LABEL] == RUN and labels["app.kubernetes.io/managed-by"] == "llmft"
    assert "value" not in env["HF_TOKEN"]  # the token itself never appears in the manifest


def test_gpu_pods_get_the_driver_mount_and_expect_cuda_cpu_pods_neither() -> None:
    """N1: GKE mounts the driver at /usr/local/nvidia/lib64, off pip torch's loader path."""
    from components.platform.platform_facts import GKE_NVIDIA_LIBRARY_PATH

    def env_of(options: PyTorchJobOptions) -> dict[str, str]:
        job = build_pytorchjob(launch=seven_b_launch(), options=options)
        [container] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    gpu = env_of(PyTorchJobOptions(accelerator="nvidia-h100-80gb"))
    assert "/usr/local/nvidia/lib64" in gpu["LD_LIBRARY_PATH"].split(":")
    assert gpu["LD_LIBRARY_PATH"] == GKE_NVIDIA_LIBRARY_PATH
    assert gpu["LLMFT_EXPECT_CUDA"] == "1"
    cpu = env_of(PyTorchJobOptions(accelerator=None))
    assert "LD_LIBRARY_PATH" not in cpu and "LLMFT_EXPECT_CUDA" not in cpu
    # An explicit env still wins (a custom image with its own loader path).
    assert env_of(PyTorchJobOptions(env={"LD_LIBRARY_PATH": "/x"}))["LD_LIBRARY_PATH"] == "/x"


def test_multi_node_pods_are_kept_in_one_zone(pytorchjob_schema: dict) -> None:
    """N8: a required podAffinity on the zone label, selecting this run's trainer pods."""
    job = build_pytorchjob(launch=seven_b_launch(), options=PyTorchJobOptions(namespace="ml"))
    jsonschema.validate(job, pytorchjob_schema)
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    [term] = template["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "topology.kubernetes.io/zone"
    selected = term["labelSelector"]["matchLabels"]
    assert selected[K8S_RUN_LABEL] == RUN
    # The selector matches the job's own pods (and so, via the run label, no other run's).
    assert selected.items() <= template["metadata"]["labels"].items()
    one_node = TrainLaunch(run_id=RUN, trainer=seven_b_launch().trainer, nodes=1)
    single = build_pytorchjob(launch=one_node, options=PyTorchJobOptions())
    assert "affinity" not in single["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def operator_past_backoff_limit(restart_counts: list[int], backoff_limit: int) -> bool:
    """Training Operator v1.9's `PastBackoffLimit`: restarts summed over the job's running pods."""
    total = sum(restart_counts)
    return total > 0 if backoff_limit == 0 else total >= backoff_limit


@pytest.mark.parametrize(("nodes", "restarts"), [(1, 0), (1, 3), (4, 3), (16, 2)])
def test_backoff_limit_gives_every_node_its_restarts(nodes: int, restarts: int) -> None:
    job = build_pytorchjob(
        launch=seven_b_launch(), options=PyTorchJobOptions(restarts_per_node=restarts)
    )
    limit = job["spec"]["runPolicy"]["backoffLimit"]
    launch_nodes = seven_b_launch().nodes
    from components.launchers.pytorchjob import backoff_limit_for

    assert limit == backoff_limit_for(launch_nodes, restarts)
    limit = backoff_limit_for(nodes, restarts)
    one_node_used_all = [restarts] + [0] * (nodes - 1)
    every_node_used_all = [restarts] * nodes
    assert not operator_past_backoff_limit(one_node_used_all, limit)
    assert not operator_past_backoff_limit(every_node_used_all, limit)
    assert operator_past_backoff_limit([restarts + 1, *every_node_used_all[1:]], limit)
    # The old fixed limit: three restarts on one of four nodes, or one on three, failed the job.
    if nodes == 4 and restarts == 3:
        assert operator_past_backoff_limit([1, 1, 1, 0], 3)


def test_pod_template_is_a_valid_kubernetes_pod() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    job = build_pytorchjob(
        launch=seven_b_launch(), options=PyTorchJobOptions(namespace="ml", hf_token_secret="hf:tok")
    )
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", **template["metadata"]},
        "spec": template["spec"],
    }
    kubernetes_validate.validate(pod, "1.30", strict=True)


def test_c10d_and_etcd_v2_tell_the_operator(pytorchjob_schema: dict) -> None:
    c10d = build_pytorchjob(
        launch=seven_b_launch("c10d"), options=PyTorchJobOptions(accelerator=None, min_nodes=2)
    )
    jsonschema.validate(c10d, pytorchjob_schema)
    elastic = c10d["spec"]["elasticPolicy"]
    assert elastic["rdzvBackend"] == "c10d" and elastic["rdzvHost"] == f"{NAME}-worker-0"
    assert elastic["rdzvPort"] == 29400 and elastic["minReplicas"] == 2
    pod = c10d["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert "--nnodes=2:4" in pod["containers"][0]["command"]
    v2 = build_pytorchjob(launch=seven_b_launch("etcd-v2"))
    assert v2["spec"]["elasticPolicy"]["rdzvBackend"] == "etcd-v2"
    assert v2["spec"]["elasticPolicy"]["rdzvHost"] == f"llmft-etcd-{RUN}.kubeflow.svc.cluster.local"


def test_builder_reports_every_bad_option() -> None:
    with pytest.raises(ValueError) as err:
        build_pytorchjob(
            launch=seven_b_launch(),
            options=PyTorchJobOptions(
                clean_pod_policy="Sometimes",
                min_nodes=9,
                gpus_per_node=2,
                priority_class="high",
                restart_policy="Maybe",
            ),
        )
    for text in (
        "clean_pod_policy",
        "min_nodes=9",
        "gpus_per_node=2 < nproc_per_node=4",
        "gang_scheduling",
        "restart_policy",
    ):
        assert text in str(err.value)


def test_render_pytorchjob_cli_prints_a_valid_manifest(pytorchjob_schema: dict) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    result = CliRunner().invoke(
        app,
        [
            "render",
            "pytorchjob",
            "--nodes",
            "4",
            "--nproc-per-node",
            "4",
            "--max-steps",
            "1000",
            "--set",
            "lr=2e-5",
        ],
    )
    assert result.exit_code == 0, result.output
    job = yaml.safe_load(result.output)
    jsonschema.validate(job, pytorchjob_schema)
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert command[-2] == "--config-json" and "&id" not in result.output
    trainer = TrainConfig.from_json(command[-1])
    assert (trainer.max_steps, trainer.lr, trainer.model) == (1000, 2e-5, "gs://BUCKET/models/base")

    bad = CliRunner().invoke(app, ["render", "pytorchjob", "--nodes", "0"])
    assert bad.exit_code == 2 and "nodes=0" in bad.output


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--namespace", "My_NS"], "namespace='My_NS' is not a Kubernetes name"),
        (["--service-account", "Trainer SA"], "service_account='Trainer SA' is not"),
        (["--hf-token-secret", "HF_TOKEN"], "secret for HF_TOKEN: 'HF_TOKEN' is not"),
        (["--hf-token-secret", "hf:bad key"], "secret key for HF_TOKEN: 'bad key'"),
        (["--memory", "lots"], "memory='lots' is not a Kubernetes quantity"),
        (["--cpu", "-4"], "cpu='-4' is not a Kubernetes quantity"),
        (["--shm-size", "64 GB"], "shm_size='64 GB' is not a Kubernetes quantity"),
        (["--active-deadline-seconds", "-5"], "active_deadline_seconds=-5: must be at least 1"),
        (["--max-steps", "-5"], "max_steps must be >= 1"),
    ],
)
def test_render_pytorchjob_refuses_what_the_api_server_would(
    flags: list[str], problem: str
) -> None:
    """One `error:` line (and its list), exit 2, nothing printed as a manifest."""
    from typer.testing import CliRunner

    from pipelines.cli import app

    result = CliRunner().invoke(app, ["render", "pytorchjob", *flags])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and problem in result.output
    assert "Traceback" not in result.output and "apiVersion" not in result.output
