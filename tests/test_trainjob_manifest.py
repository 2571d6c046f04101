"""The TrainJob manifest (Kubeflow Trainer v2.3.0): `build_trainjob`, the ClusterTrainingRuntimes
it references, and `llmft render trainjob`, validated against the released CRDs' schemas and the
CEL rules that apply on create (tests/crd_validation.py), and a reviewed golden file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_validation import cel_errors, cel_rules, crd_schema, pruned_fields, validate

from components.launchers import TrainLaunch
from components.launchers.pytorchjob import PyTorchJobOptions, build_pytorchjob
from components.launchers.trainjob import (
    NAME_MAX,
    RESERVED_ENV,
    build_cluster_training_runtime,
    build_trainjob,
    runtime_restarts,
    trainjob_name,
)
from components.runtime.run_identity import K8S_RUN_LABEL
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
RUN = "fine-tune-20261202-abc"
NAME = trainjob_name(RUN)


@pytest.fixture(scope="module")
def trainjob_schema() -> dict[str, Any]:
    return crd_schema("trainer.kubeflow.org_trainjobs.v2.3.0.yaml", "v1alpha1")


@pytest.fixture(scope="module")
def runtime_schema() -> dict[str, Any]:
    return crd_schema("trainer.kubeflow.org_clustertrainingruntimes.v2.3.0.yaml", "v1alpha1")


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


def options(**kwargs: Any) -> PyTorchJobOptions:
    base: dict[str, Any] = {
        "namespace": "ml",
        "accelerator": "nvidia-h100-80gb",
        "cpu": "96",
        "memory": "900Gi",
        "service_account": "llmft-trainer",
        "hf_token_secret": "hf-token",
        "active_deadline_seconds": 86400,
        "kueue_queue": "llmft",
    }
    return PyTorchJobOptions(**(base | kwargs))


def node_pod(job: dict[str, Any]) -> dict[str, Any]:
    [patch] = job["spec"]["runtimePatches"]
    [replicated] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["name"] == "node"
    return dict(replicated["template"]["spec"]["template"])


def test_7b_4x4_trainjob_validates_and_runs_the_pytorchjobs_torchrun(
    trainjob_schema: dict, golden: Any
) -> None:
    job = build_trainjob(launch=seven_b_launch(), options=options())
    validate(trainjob_schema, job)
    # The CEL rules that apply on create were evaluated (the name's two), none of the
    # transition rules (`oldSelf`: update only).
    assert [rule for _, rule in cel_rules(trainjob_schema, job)] == [
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "size(self.metadata.name) <= 63",
    ]
    golden.check("trainjob_7b_etcd_v3.json", job)
    spec, trainer = job["spec"], job["spec"]["trainer"]
    v1 = build_pytorchjob(launch=seven_b_launch(), options=options(kueue_queue=None))
    [v1_container] = v1["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert trainer["command"] == v1_container["command"]  # the same torchrun, explicit flags
    assert "--rdzv-backend=etcd-v3" in trainer["command"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 4
    assert trainer["resourcesPerNode"] == v1_container["resources"]
    env = {e["name"]: e for e in trainer["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
    }
    assert env["LLMFT_EXPECT_CUDA"]["value"] == "1" and env["LD_LIBRARY_PATH"]["value"]
    assert not RESERVED_ENV & set(env)  # the torch plugin's webhook refuses those
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "llmft-torch-v1-r3",
    }
    assert spec["suspend"] is True and spec["activeDeadlineSeconds"] == 86400
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "llmft"
    pod = node_pod(job)
    assert pod["metadata"]["labels"][K8S_RUN_LABEL] == RUN  # TrainJob labels do not propagate
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
    assert pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert pod["spec"]["serviceAccountName"] == "llmft-trainer"
    assert pod["spec"]["containers"] == [
        {"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    ]  # no env there: the JobSet plugin refuses runtimePatches env on `node`


def test_the_cel_evaluator_catches_what_the_api_server_would(trainjob_schema: dict) -> None:
    job = build_trainjob(launch=seven_b_launch(), options=options())
    for name, message in (
        ("9-starts-with-a-digit", "RFC 1035"),
        ("a" * 64, "no more than 63"),
    ):
        bad = {**job, "metadata": {**job["metadata"], "name": name}}
        assert any(message in error for error in cel_errors(trainjob_schema, bad)), name
    managed = {**job, "spec": {**job["spec"], "managedBy": "someone/else"}}
    assert any("ManagedBy must be" in e for e in cel_errors(trainjob_schema, managed))
    assert cel_errors(trainjob_schema, job) == []


def test_a_field_the_crd_does_not_declare_is_caught_not_pruned(trainjob_schema: dict) -> None:
    """The API server silently drops undeclared fields of a CRD's object and jsonschema lets
    them pass: `validate` names them (here a Trainer v1-style `podTemplateOverrides`, which
    v2.3.0 replaced with runtimePatches, and a misspelt numProcPerNode)."""
    job = build_trainjob(launch=seven_b_launch(), options=options())
    assert pruned_fields(trainjob_schema, job) == []
    stale = {**job, "spec": {**job["spec"], "podTemplateOverrides": []}}
    typo = {**job, "spec": {**job["spec"], "trainer": {**job["spec"]["trainer"],
                                                       "numProcsPerNode": 8}}}  # fmt: skip
    assert pruned_fields(trainjob_schema, stale) == [".spec.podTemplateOverrides"]
    assert pruned_fields(trainjob_schema, typo) == [".spec.trainer.numProcsPerNode"]
    with pytest.raises(AssertionError, match="would prune"):
        validate(trainjob_schema, typo)


def test_long_run_ids_get_short_distinct_rfc1035_names() -> None:
    long_a, long_b = "x" * 80 + "-a", "x" * 80 + "-b"
    names = {trainjob_name(long_a), trainjob_name(long_b)}
    assert len(names) == 2
    assert all(len(n) <= NAME_MAX and n[0].isalpha() for n in names)
    assert trainjob_name(RUN) == f"llmft-train-{RUN}"  # short ones are the PyTorchJob's name


def test_runtimes_validate_and_docs_deploy_holds_exactly_them(runtime_schema: dict) -> None:
    built = [build_cluster_training_runtime(restarts=r) for r in runtime_restarts()]
    for runtime in built:
        validate(runtime_schema, runtime)
        template = runtime["spec"]["template"]["spec"]
        [node] = template["replicatedJobs"]
        assert node["template"]["spec"]["backoffLimit"] == 0
        assert node["template"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        assert "successPolicy" not in template  # JobSet's default, All: Complete = every node
    assert [r["metadata"]["name"] for r in built] == ["llmft-torch-v1-r3", "llmft-torch-v1-r10"]
    assert [r["spec"]["template"]["spec"]["failurePolicy"] for r in built] == [
        {"maxRestarts": 3},
        {"maxRestarts": 10},
    ]
    documented = [
        d for d in yaml.safe_load_all((ROOT / "docs/deploy/trainjob-runtimes.yaml").read_text())
    ]
    assert documented == built


def test_spot_capacity_picks_the_spot_runtime_and_nodes(trainjob_schema: dict) -> None:
    job = build_trainjob(
        launch=seven_b_launch(),
        options=options(capacity="spot", restarts_per_node=10, termination_grace_s=30),
    )
    validate(trainjob_schema, job)
    assert job["spec"]["runtimeRef"]["name"] == "llmft-torch-v1-r10"
    pod = node_pod(job)["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert pod["terminationGracePeriodSeconds"] == 30
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in pod["tolerations"]  # fmt: skip


def test_c10d_rendezvous_is_node_zeros_stable_hostname(trainjob_schema: dict) -> None:
    job = build_trainjob(launch=seven_b_launch("c10d"), options=options(kueue_queue=None))
    validate(trainjob_schema, job)
    assert f"--rdzv-endpoint={NAME}-node-0-0.{NAME}:29400" in job["spec"]["trainer"]["command"]
    assert "suspend" not in job["spec"]
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]


@pytest.mark.parametrize(
    ("setup", "accelerator", "daemon"),
    [
        ("gpudirect-tcpx", "nvidia-h100-80gb", "tcpx-daemon"),
        ("gpudirect-tcpxo", "nvidia-h100-mega-80gb", "tcpxo-daemon"),
        ("gpudirect-rdma", "nvidia-h200-141gb", None),
    ],
)
def test_a_gpudirect_trainjob_uses_the_runtime_variant_carrying_the_nic_setup(
    trainjob_schema: dict, runtime_schema: dict, setup: str, accelerator: str, daemon: str | None
) -> None:
    """v2.3.0's runtimePatches cannot add a container (a patch's containers[] has only name, env,
    securityContext, volumeMounts), so the setup's pod patch lives in a ClusterTrainingRuntime
    variant; the job's spec.trainer carries the NCCL env and the command prefix. Both objects
    pass their CRD's schema and CEL rules, with nothing pruned."""
    runtime = build_cluster_training_runtime(restarts=3, gpudirect=setup)
    validate(runtime_schema, runtime)
    suffix = setup.removeprefix("gpudirect-")
    assert runtime["metadata"]["name"] == f"llmft-torch-v1-r3-{suffix}"
    [replicated] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]
    interfaces = pod["metadata"]["annotations"]["networking.gke.io/interfaces"]
    assert ("rdma-7" in interfaces) == (setup == "gpudirect-rdma")
    assert [c["name"] for c in pod["spec"]["containers"]] == ["node"]
    sidecars = pod["spec"].get("initContainers", [])
    assert [(c["name"], c["restartPolicy"]) for c in sidecars] == (
        [(daemon, "Always")] if daemon else []
    )
    node = pod["spec"]["containers"][0]
    assert node["volumeMounts"] and "env" not in node and "command" not in node

    gpus = options(accelerator=accelerator, gpus_per_node=8, gpudirect=setup)
    launch = replace(seven_b_launch(), nproc_per_node=8)
    job = build_trainjob(launch=launch, options=gpus)
    validate(trainjob_schema, job)
    assert job["spec"]["runtimeRef"]["name"] == f"llmft-torch-v1-r3-{suffix}"
    trainer = job["spec"]["trainer"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    if setup == "gpudirect-tcpx":
        assert env["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"
        assert trainer["command"][:3] == ["python", "-m", "torch.distributed.run"]
    else:
        prefix = "source /usr/local/gib" if setup == "gpudirect-rdma" else "NCCL_LIB_DIR="
        assert trainer["command"][:2] == ["/bin/bash", "-c"]
        assert trainer["command"][2].startswith(prefix)
    # The pod's own patch is unchanged: placement, labels, /dev/shm.
    assert node_pod(job)["spec"]["containers"] == [
        {"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    ]
    with pytest.raises(ValueError, match="built for all 8 GPUs"):
        four = replace(launch, nproc_per_node=4)
        build_trainjob(launch=four, options=replace(gpus, gpus_per_node=4))


def test_what_a_trainjob_cannot_do_is_refused_in_one_message() -> None:
    with pytest.raises(ValueError) as err:
        build_trainjob(
            launch=seven_b_launch(),
            options=options(
                min_nodes=2,
                restarts_per_node=5,
                env={"PET_NNODES": "4"},
                kueue_queue="Bad Queue",
            ),
        )
    for text in ("min_nodes=2", "restarts_per_node=5", "PET_NNODES", "kueue_queue='Bad Queue'"):
        assert text in str(err.value)
    with pytest.raises(ValueError, match="set kueue_queue"):
        build_trainjob(launch=seven_b_launch(), options=options(kueue_queue=None,
                                                                gang_scheduling=True))  # fmt: skip


def test_a_queued_pytorchjob_carries_the_kueue_label_and_starts_suspended() -> None:
    import jsonschema

    schema = crd_schema("kubeflow.org_pytorchjobs.yaml", "v1")
    job = build_pytorchjob(launch=seven_b_launch(), options=options())
    jsonschema.validate(job, schema)
    assert pruned_fields(schema, job) == []
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "llmft"
    assert job["spec"]["runPolicy"]["suspend"] is True
    pod_labels = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    assert "kueue.x-k8s.io/queue-name" not in pod_labels
    with pytest.raises(ValueError, match="Kueue admits the job whole"):
        build_pytorchjob(launch=seven_b_launch(), options=options(gang_scheduling=True))


def test_render_trainjob_cli_prints_a_valid_manifest(trainjob_schema: dict) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    result = CliRunner().invoke(
        app,
        ["render", "trainjob", "--nodes", "4", "--nproc-per-node", "4", "--kueue-queue", "llmft",
         "--max-steps", "1000", "--set", "lr=2e-5"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    job = yaml.safe_load(result.output)
    validate(trainjob_schema, job)
    trainer = TrainConfig.from_json(job["spec"]["trainer"]["command"][-1])
    assert (trainer.max_steps, trainer.lr) == (1000, 2e-5)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "llmft"

    bad = CliRunner().invoke(app, ["render", "trainjob", "--kueue-queue", "Bad Queue"])
    assert bad.exit_code == 2 and bad.output.startswith("error: ")
    assert "apiVersion" not in bad.output
