"""The Pulumi program in infra/, run under Pulumi's unit-test mocks: every resource and grant.

No Pulumi service, CLI or cloud: `tests/fakes/pulumi_mocks.py` records what the program registers.
The expected grants below are the review copy of docs/deploy/README.md's IAM section.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_validation import PYTORCHJOB_CRD
from crd_validation import crd as vendored_crd
from fakes.pulumi_mocks import (
    GKE_CONFIG,
    IAM_WHERE,
    INFRA_DIR,
    VERTEX_CONFIG,
    RecordingMocks,
    iam_grants,
    run_stack,
    stack,
)

REPO = Path(__file__).resolve().parents[1]
PROJECT = "my-project"
EMAIL = "{}@my-project.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def vertex_stack() -> tuple[RecordingMocks, dict[str, Any]]:
    return stack(VERTEX_CONFIG)


@pytest.fixture(scope="module")
def gke_stack() -> tuple[RecordingMocks, dict[str, Any]]:
    return stack(GKE_CONFIG)


_grants = iam_grants


def sa(name: str) -> str:
    return f"serviceAccount:{EMAIL.format(name)}"


PIPELINE, TRAINER, DATAFLOW, BUILDER, NODES = (
    sa("llmft-pipelines"),
    sa("llmft-trainer"),
    sa("llmft-dataflow"),
    sa("llmft-builder"),
    sa("llmft-gke-nodes"),
)
BUCKET = "my-project-llmft"
BASE_GRANTS = {
    ("project", PROJECT, "roles/aiplatform.user", PIPELINE),
    ("project", PROJECT, "roles/dataflow.developer", PIPELINE),
    ("project", PROJECT, "roles/logging.logWriter", PIPELINE),
    # C1: the validate step of a console run reads the run's quota.
    ("project", PROJECT, "roles/cloudquotas.viewer", PIPELINE),
    ("bucket", BUCKET, "roles/storage.objectAdmin", PIPELINE),
    ("repository", "llmft", "roles/artifactregistry.reader", PIPELINE),
    ("secret", "llmft-hf-token", "roles/secretmanager.secretAccessor", PIPELINE),
    ("account", EMAIL.format("llmft-trainer"), "roles/iam.serviceAccountUser", PIPELINE),
    ("account", EMAIL.format("llmft-dataflow"), "roles/iam.serviceAccountUser", PIPELINE),
    ("bucket", BUCKET, "roles/storage.objectAdmin", TRAINER),
    # N6: Vertex replicas read the Hugging Face token as the trainer account.
    ("secret", "llmft-hf-token", "roles/secretmanager.secretAccessor", TRAINER),
    ("project", PROJECT, "roles/dataflow.worker", DATAFLOW),
    ("bucket", BUCKET, "roles/storage.objectAdmin", DATAFLOW),
    ("repository", "llmft", "roles/artifactregistry.reader", DATAFLOW),
    ("bucket", BUCKET, "roles/storage.objectViewer", BUILDER),
    ("repository", "llmft", "roles/artifactregistry.writer", BUILDER),
    ("project", PROJECT, "roles/logging.logWriter", BUILDER),
}
ALICE = "user:alice@example.com"
DEPLOYER_GRANTS = {
    ("project", PROJECT, "roles/aiplatform.user", ALICE),
    ("project", PROJECT, "roles/dataflow.developer", ALICE),
    ("project", PROJECT, "roles/cloudbuild.builds.editor", ALICE),
    ("project", PROJECT, "roles/cloudquotas.viewer", ALICE),
    ("bucket", BUCKET, "roles/storage.objectAdmin", ALICE),
    ("repository", "llmft", "roles/artifactregistry.writer", ALICE),
    ("repository", "llmft-pipelines", "roles/artifactregistry.writer", ALICE),
    ("account", EMAIL.format("llmft-pipelines"), "roles/iam.serviceAccountUser", ALICE),
    ("account", EMAIL.format("llmft-dataflow"), "roles/iam.serviceAccountUser", ALICE),
    ("account", EMAIL.format("llmft-builder"), "roles/iam.serviceAccountUser", ALICE),
}
WI = "serviceAccount:my-project.svc.id.goog[kubeflow/{}]"
GKE_GRANTS = {
    ("project", PROJECT, "roles/container.defaultNodeServiceAccount", NODES),
    ("repository", "llmft", "roles/artifactregistry.reader", NODES),
    ("project", PROJECT, "roles/container.clusterViewer", PIPELINE),
    (
        "account",
        EMAIL.format("llmft-pipelines"),
        "roles/iam.workloadIdentityUser",
        WI.format("llmft-pipeline"),
    ),
    (
        "account",
        EMAIL.format("llmft-trainer"),
        "roles/iam.workloadIdentityUser",
        WI.format("llmft-trainer"),
    ),
}


def test_vertex_only_stack_grants_exactly_these_roles(vertex_stack):
    mocks, _ = vertex_stack
    assert _grants(mocks) == BASE_GRANTS
    assert not [r for r in mocks.resources if r.typ.startswith(("kubernetes:", "gcp:container"))]


def test_gke_stack_adds_node_workload_identity_and_deployer_grants(gke_stack):
    mocks, _ = gke_stack
    assert _grants(mocks) == BASE_GRANTS | DEPLOYER_GRANTS | GKE_GRANTS
    # Workload Identity members exist only once the cluster (and so the identity pool) does.
    for r in mocks.of_type("gcp:serviceaccount/iAMMember:IAMMember"):
        if r.inputs["role"] == "roles/iam.workloadIdentityUser":
            assert r.name.startswith("sa-")


def test_apis(vertex_stack, gke_stack):
    from llmft_infra.cloud import APIS

    for (mocks, _), extra in ((vertex_stack, set()), (gke_stack, {"container.googleapis.com"})):
        services = mocks.of_type("gcp:projects/service:Service")
        assert {s.inputs["service"] for s in services} == set(APIS) | extra
        assert all(s.inputs["disableOnDestroy"] is False for s in services)


IAM_TYPES = tuple(IAM_WHERE)


def test_every_grant_waits_for_the_apis(vertex_stack, gke_stack):
    """N16: project-level grants call the Cloud Resource Manager API, the others IAM and the
    resource's own API; on a fresh project each must be enabled before the first grant."""
    from llmft_infra.cloud import APIS

    assert "cloudresourcemanager.googleapis.com" in APIS
    apis = {f"api-{api.split('.')[0]}" for api in APIS}
    for mocks in (vertex_stack[0], gke_stack[0]):
        grants = [r for r in mocks.resources if r.typ in IAM_TYPES]
        assert grants
        for grant in grants:
            assert apis <= set(mocks.depends_on[grant.name]), grant.name
    gke_part = [
        r.name
        for r in gke_stack[0].resources
        if r.typ in IAM_TYPES
        and r.inputs["role"].split(".")[-1]
        in ("defaultNodeServiceAccount", "clusterViewer", "workloadIdentityUser")
    ]
    assert len(gke_part) == 4
    assert all("api-container" in gke_stack[0].depends_on[name] for name in gke_part)


def test_bucket_is_private_versioned_and_expires_scratch_only(vertex_stack):
    (bucket,) = vertex_stack[0].of_type("gcp:storage/bucket:Bucket")
    assert bucket.inputs["name"] == BUCKET
    assert bucket.inputs["location"] == "us-central1"
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced"
    assert bucket.inputs["versioning"] == {"enabled": True}
    assert bucket.inputs["forceDestroy"] is False
    rules = [(r["action"]["type"], r["condition"]) for r in bucket.inputs["lifecycleRules"]]
    scratch = ["work/", "pipeline-root/llmft-work/", "kfp-root/llmft-work/"]
    assert rules == [
        ("Delete", {"daysSinceNoncurrentTime": 7, "withState": "ARCHIVED"}),
        ("Delete", {"age": 14, "matchesPrefixes": scratch}),
        # C3: scratch's old versions go after a day, not after the bucket's 7.
        ("Delete", {"daysSinceNoncurrentTime": 1, "withState": "ARCHIVED", "matchesPrefixes": scratch}),
    ]  # fmt: skip
    # C3: versioning keeps deleted objects already; soft delete would bill them again.
    assert bucket.inputs["softDeletePolicy"] == {"retentionDurationSeconds": 0}


def test_every_derived_work_uri_expires(vertex_stack, tmp_path):
    """C3: the work_uri a run uses, written by `config from-stack` or derived from either pipeline
    root when the config has none (pipelines/deploy/submit.py), lies under a prefix the lifecycle
    rule expires."""
    from pipelines.deploy.config import load_for
    from pipelines.deploy.from_stack import config_from_stack
    from pipelines.deploy.submit import _derived_defaults
    from pipelines.deploy.template import read_template

    mocks, outputs = vertex_stack
    (bucket,) = mocks.of_type("gcp:storage/bucket:Bucket")
    prefixes = bucket.inputs["lifecycleRules"][1]["condition"]["matchesPrefixes"]
    config = config_from_stack(outputs)
    uris = [config["parameters"].pop("work_uri")]
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(config))
    for backend in ("vertex", "kfp"):
        cfg = load_for(backend, path)
        uris.append(_derived_defaults(read_template(cfg.template), cfg, backend, {})["work_uri"])
    root = f"gs://{BUCKET}/"
    assert len(set(uris)) == 3
    for uri in uris:
        assert uri.startswith(root)
        assert any((uri.removeprefix(root) + "/").startswith(p) for p in prefixes), uri


def test_repositories_and_image_names_match_the_code(vertex_stack):
    from components.runtime.image import IMAGE_REPOSITORY, VERSION

    mocks, outputs = vertex_stack
    repos = {
        r.inputs["format"]: r.inputs
        for r in mocks.of_type("gcp:artifactregistry/repository:Repository")
    }
    assert set(repos) == {"DOCKER", "KFP"}
    assert repos["DOCKER"]["repositoryId"] == IMAGE_REPOSITORY.split("/")[-2] == "llmft"
    assert repos["DOCKER"]["dockerConfig"] == {"immutableTags": True}
    assert repos["KFP"]["repositoryId"] == "llmft-pipelines"
    assert {r["location"] for r in repos.values()} == {"us-central1"}
    assert outputs["image"] == f"us-central1-docker.pkg.dev/my-project/llmft/llmft:{VERSION}"
    assert outputs["kfp_registry"] == "https://us-central1-kfp.pkg.dev/my-project/llmft-pipelines"


def test_secret_is_created_without_a_value(vertex_stack):
    from components.params.run_params import RunParams

    HF_TOKEN_SECRET = RunParams.hf_token_secret

    mocks, _ = vertex_stack
    (secret,) = mocks.of_type("gcp:secretmanager/secret:Secret")
    assert secret.inputs["secretId"] == HF_TOKEN_SECRET
    assert secret.inputs["replication"] == {"auto": {}}
    assert not [r for r in mocks.resources if "secretVersion" in r.typ]


def test_service_accounts(vertex_stack, gke_stack):
    ids = {
        r.inputs["accountId"] for r in vertex_stack[0].of_type("gcp:serviceaccount/account:Account")
    }
    assert ids == {"llmft-pipelines", "llmft-trainer", "llmft-dataflow", "llmft-builder"}
    ids = {
        r.inputs["accountId"] for r in gke_stack[0].of_type("gcp:serviceaccount/account:Account")
    }
    assert "llmft-gke-nodes" in ids


def test_cluster_and_pools(gke_stack):
    mocks, _ = gke_stack
    cluster = mocks.named("gke").inputs
    assert cluster["workloadIdentityConfig"] == {"workloadPool": "my-project.svc.id.goog"}
    assert cluster["removeDefaultNodePool"] is True
    assert cluster["nodeConfig"]["serviceAccount"] == EMAIL.format("llmft-gke-nodes")
    assert cluster["deletionProtection"] is True
    assert cluster["location"] == "us-central1"
    # N13: Dataplane V2 enforces the per-run etcd's NetworkPolicy (inert without it).
    assert cluster["datapathProvider"] == "ADVANCED_DATAPATH"
    cpu, gpu = mocks.named("cpu-pool").inputs, mocks.named("gpu-pool").inputs
    for pool in (cpu, gpu):
        config = pool["nodeConfig"]
        assert config["serviceAccount"] == EMAIL.format("llmft-gke-nodes")
        assert config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert config["oauthScopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert cpu["autoscaling"] == {"minNodeCount": 1, "maxNodeCount": 3}
    assert cpu["nodeConfig"]["machineType"] == "e2-standard-8"
    # Idle cost: zero GPU nodes.
    assert gpu["initialNodeCount"] == 0
    assert gpu["autoscaling"] == {"minNodeCount": 0, "maxNodeCount": 2, "locationPolicy": "ANY"}
    assert gpu["nodeLocations"] == ["us-central1-a"]
    assert gpu["nodeConfig"]["machineType"] == "g2-standard-24"
    assert gpu["nodeConfig"]["guestAccelerators"] == [
        {
            "type": "nvidia-l4",
            "count": 2,
            "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"},
        }
    ]


def test_kubernetes_objects_use_the_cluster_provider(gke_stack):
    mocks, _ = gke_stack
    k8s = [
        r
        for r in mocks.resources
        if r.typ.startswith("kubernetes:") and r.typ != "kubernetes:yaml:ConfigFile"
    ]
    assert k8s and all(r.provider and "::gke-cluster::" in r.provider for r in k8s)
    (namespace,) = mocks.of_type("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["name"] == "kubeflow"
    (trainer,) = [
        r.inputs["metadata"]
        for r in mocks.of_type("kubernetes:core/v1:ServiceAccount")
        if r.inputs["metadata"]["name"] == "llmft-trainer"
    ]
    assert (trainer["name"], trainer["namespace"]) == ("llmft-trainer", "kubeflow")
    assert trainer["annotations"] == {
        "iam.gke.io/gcp-service-account": EMAIL.format("llmft-trainer")
    }


def test_rbac_is_applied_from_docs_deploy_rbac_yaml(gke_stack):
    mocks, _ = gke_stack
    docs = {
        d["kind"]: d for d in yaml.safe_load_all((REPO / "docs/deploy/rbac.yaml").read_text()) if d
    }
    (role,) = mocks.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert role.inputs["rules"] == docs["Role"]["rules"]
    assert role.inputs["metadata"]["namespace"] == "kubeflow"
    (binding,) = mocks.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.inputs["subjects"][1]["name"] == EMAIL.format("llmft-pipelines")
    (pipeline_ksa,) = [
        r.inputs
        for r in mocks.of_type("kubernetes:core/v1:ServiceAccount")
        if r.inputs["metadata"]["name"] == "llmft-pipeline"
    ]
    assert pipeline_ksa["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": EMAIL.format("llmft-pipelines")
    }
    assert "PROJECT_ID" not in json.dumps([r.inputs for r in mocks.resources])


def test_the_trainer_ksa_keeps_the_identity_of_its_old_resource(gke_stack):
    """Review P6: the trainer's KSA moved from its own resource `ksa-trainer` (parented by the
    stack) into the rbac ConfigFile. Without an alias `pulumi up` on an older stack creates the
    object again (AlreadyExists) and would then delete the old resource, i.e. the KSA itself."""
    import pulumi
    from llmft_infra.cluster import TRAINER_KSA_OLD_RESOURCE

    mocks, _ = gke_stack
    assert TRAINER_KSA_OLD_RESOURCE == "ksa-trainer"  # the name the stack used before N18
    (trainer,) = [
        r
        for r in mocks.of_type("kubernetes:core/v1:ServiceAccount")
        if r.inputs["metadata"]["name"] == "llmft-trainer"
    ]
    (alias,) = [a for a in mocks.aliases[trainer.name] if a.name == "ksa-trainer"]
    assert alias.parent is pulumi.ROOT_STACK_RESOURCE  # the old one had no parent
    others = [r.name for r in mocks.of_type("kubernetes:core/v1:ServiceAccount") if r != trainer]
    named = [a.name for name in others for a in mocks.aliases[name]]
    assert others and "ksa-trainer" not in named


def test_rbac_follows_a_custom_namespace():
    from llmft_infra.settings import parse_settings

    mocks, outputs = run_stack(
        parse_settings({**GKE_CONFIG, "gke": {"namespace": "ml-team", "training_operator": False}})
    )
    (binding,) = mocks.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.inputs["metadata"]["namespace"] == "ml-team"
    assert binding.inputs["subjects"][0]["namespace"] == "ml-team"
    assert {
        n.inputs["metadata"]["name"] for n in mocks.of_type("kubernetes:core/v1:Namespace")
    } == {
        "ml-team",
        "kubeflow",
    }
    assert not mocks.of_type("kubernetes:apps/v1:Deployment")
    assert ("account", EMAIL.format("llmft-trainer"), "roles/iam.workloadIdentityUser",
            "serviceAccount:my-project.svc.id.goog[ml-team/llmft-trainer]") in _grants(mocks)  # fmt: skip
    assert outputs["namespace"] == "ml-team"


def test_training_operator_is_the_vendored_pinned_release(gke_stack):
    from llmft_infra.settings import TRAINING_OPERATOR_FILE

    mocks, _ = gke_stack
    header = TRAINING_OPERATOR_FILE.read_text()[:1500]
    assert "tag v1.9.0" in header and "6f74c7f6b2ed6c27aabd82d0a316b23f0646059c" in header
    (deployment,) = mocks.of_type("kubernetes:apps/v1:Deployment")
    (container,) = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "kubeflow/training-operator:v1-5170a36"
    assert container["args"] == ["--enable-scheme=pytorchjob"]
    (crd,) = mocks.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    assert crd.inputs["spec"]["versions"] == vendored_crd(PYTORCHJOB_CRD)["spec"]["versions"]
    (webhook,) = mocks.of_type(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration"
    )
    assert [w["name"] for w in webhook.inputs["webhooks"]] == [
        "validator.pytorchjob.training-operator.kubeflow.org"
    ]
    # The stack owns the namespace: the manifest's own Namespace object is not applied twice.
    assert len(mocks.of_type("kubernetes:core/v1:Namespace")) == 1


def test_flex_template_spec_in_the_bucket(vertex_stack):
    from beam_preprocess.flex_template import metadata
    from components.runtime.image import VERSION

    mocks, outputs = vertex_stack
    spec_object = mocks.named("flex-template-spec").inputs
    assert spec_object["name"] == "dataflow/templates/preprocess.json"
    spec = json.loads(spec_object["content"])
    docker = "us-central1-docker.pkg.dev/my-project/llmft"
    assert (
        spec["image"] == f"{docker}/llmft-flex-launcher:{VERSION}" == outputs["flex_template_image"]
    )
    assert spec["sdkInfo"] == {"language": "PYTHON"}
    assert spec["metadata"] == metadata()
    assert spec["defaultEnvironment"] == {
        "serviceAccountEmail": EMAIL.format("llmft-dataflow"),
        "sdkContainerImage": f"{docker}/llmft:{VERSION}",
        "tempLocation": f"gs://{BUCKET}/work/dataflow/tmp",
        "stagingLocation": f"gs://{BUCKET}/work/dataflow/staging",
        # C4: a worker disk that holds the CUDA-sized image twice while it is pulled.
        "diskSizeGb": 50,
    }
    assert outputs["flex_template_spec"] == f"gs://{BUCKET}/dataflow/templates/preprocess.json"
    assert not mocks.of_type("gcp:dataflow/flexTemplateJob:FlexTemplateJob")


def test_flex_template_job_example_when_configured():
    from llmft_infra.settings import parse_settings

    job_config = {
        "input": "gs://b/raw/*.jsonl",
        "output": "gs://b/ds",
        "tokenizer": "gs://b/tok",
        "seq_len": 1024,
    }
    mocks, _ = run_stack(
        parse_settings(
            {"project": PROJECT, "region": "us-central1", "flex_template_job": job_config}
        )
    )
    (job,) = mocks.of_type("gcp:dataflow/flexTemplateJob:FlexTemplateJob")
    assert job.inputs["containerSpecGcsPath"] == f"gs://{BUCKET}/dataflow/templates/preprocess.json"
    assert job.inputs["parameters"] == {
        "input": "gs://b/raw/*.jsonl", "output": "gs://b/ds", "tokenizer": "gs://b/tok", "seq_len": "1024",
    }  # fmt: skip
    assert job.inputs["serviceAccountEmail"] == EMAIL.format("llmft-dataflow")
    assert job.inputs["onDelete"] == "cancel"


def test_metadata_file_matches_the_pipeline_options():
    """infra/dataflow/preprocess-metadata.json is generated: regenerate with
    `python -m llmft_infra` (from infra/) when the options change."""
    from beam_preprocess.flex_template import metadata

    committed = json.loads((INFRA_DIR / "dataflow" / "preprocess-metadata.json").read_text())
    assert committed == metadata()


def test_outputs(gke_stack):
    _, outputs = gke_stack
    assert outputs["gke_cluster"] == "projects/my-project/locations/us-central1/clusters/llmft"
    assert outputs["pipeline_root"] == f"gs://{BUCKET}/pipeline-root"
    assert outputs["pipeline_service_account"] == EMAIL.format("llmft-pipelines")
    assert (outputs["pipeline_ksa"], outputs["trainer_ksa"]) == ("llmft-pipeline", "llmft-trainer")
    assert (outputs["accelerator_type"], outputs["accelerator_count"]) == ("nvidia-l4", 2)


def test_settings_errors_are_reported_together():
    from llmft_infra.settings import parse_settings

    with pytest.raises(ValueError) as info:
        parse_settings(
            {
                "project": "X",
                "region": "uscentral",
                "deployers": ["allUsers"],
                "labels": "team=ml",
                "gke": {"accelerator_type": "NVIDIA_L4", "gpu_max_nodes": 0, "colour": "red"},
            }
        )
    message = str(info.value)
    for fragment in (
        "project:",
        "region:",
        "deployers:",
        "labels: expected",
        "gke.accelerator_type",
        "gke.gpu_max_nodes",
        "gke.colour: unknown",
    ):
        assert fragment in message


def test_gpu_machine_must_carry_the_accelerators():
    """N3: GKE rejects a GPU pool whose machine type cannot carry its accelerators, ~10 minutes
    into `pulumi up`; the stack refuses it first, naming the machine types that fit."""
    from llmft_infra.settings import parse_settings

    base = {"project": PROJECT, "region": "us-central1"}
    with pytest.raises(ValueError, match=r"cannot run on a3-highgpu-8g.*use g2-standard-96"):
        parse_settings({**base, "gke": {"accelerator_type": "nvidia-l4"}})
    with pytest.raises(ValueError, match="cannot run on g2-standard-24: it carries 2 x NVIDIA_L4"):
        parse_settings({**base, "gke": {"accelerator_type": "nvidia-l4", "gpu_machine_type": "g2-standard-24"}})  # fmt: skip
    with pytest.raises(ValueError, match="cpu_machine_type: a2-highgpu-1g carries GPUs"):
        parse_settings({**base, "gke": {"cpu_machine_type": "a2-highgpu-1g"}})
    with pytest.raises(ValueError, match="accelerator 'nvidia-x1' is unknown"):
        parse_settings({**base, "gke": {"accelerator_type": "nvidia-x1"}})
    for gke in (
        {},  # the defaults: a3-highgpu-8g with 8 x nvidia-h100-80gb
        GKE_CONFIG["gke"],  # g2-standard-24 with 2 x nvidia-l4
        {"gpu_machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4", "accelerator_count": 2},
        {"gpu_machine_type": "z9-future-8g", "accelerator_type": "nvidia-l4", "accelerator_count": 2},
    ):  # fmt: skip
        assert parse_settings({**base, "gke": gke}).gke is not None


def test_gpu_machine_must_host_the_kfp_evaluate_task():
    """Review P1: KFP's evaluate task runs on a GPU node; a pool of machines that cannot host its
    request passes `pulumi up`, and the task then stays Pending after training was paid for."""
    from llmft_infra.settings import parse_settings

    from components.platform.task_resources import KFP_STEP_REQUESTS

    cpu, memory = KFP_STEP_REQUESTS["evaluate"]
    base = {"project": PROJECT, "region": "us-central1"}
    small = {"gpu_machine_type": "g2-standard-4", "accelerator_type": "nvidia-l4", "accelerator_count": 1}  # fmt: skip
    with pytest.raises(
        ValueError,
        match=rf"gke.gpu_machine_type: .*the evaluate task requests {cpu} CPU / {memory}",
    ):
        parse_settings({**base, "gke": small})
    assert parse_settings({**base, "gke": {**small, "gpu_machine_type": "g2-standard-8"}}).gke


def test_example_stack_config_and_pulumi_config_load():
    """Pulumi.example.yaml is valid, and load_settings reads it the way `pulumi up` passes config."""
    import pulumi
    from llmft_infra.settings import load_settings

    example = yaml.safe_load((INFRA_DIR / "Pulumi.example.yaml").read_text())["config"]
    flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in example.items()}
    pulumi.runtime.set_all_config(flat)
    try:
        settings = load_settings()
    finally:
        pulumi.runtime.set_all_config({})
    assert settings.project == "my-project" and settings.deployers == ("user:alice@example.com",)
    assert settings.gke is not None and settings.gke.accelerator_type == "nvidia-l4"
    assert settings.gke.gpu_node_locations == ("us-central1-a", "us-central1-c")


def test_the_entry_point_runs_the_program_with_the_stack_config():
    """infra/__main__.py as `pulumi up` runs it: config in, resources registered, outputs out."""
    import runpy

    import pulumi

    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="llmft-infra", stack="dev", preview=False)
    pulumi.runtime.set_all_config({"llmft:region": "europe-west4", "gcp:project": "other-project"})

    @pulumi.runtime.test
    def up() -> None:
        runpy.run_path(str(INFRA_DIR / "__main__.py"))

    try:
        up()
    finally:
        pulumi.runtime.set_all_config({})
    (bucket,) = mocks.of_type("gcp:storage/bucket:Bucket")
    assert (bucket.inputs["name"], bucket.inputs["location"]) == (
        "other-project-llmft",
        "europe-west4",
    )


def test_trainer_v2_and_kueue_come_from_their_pinned_charts(gke_stack):
    """Issue 47: Trainer v2 and Kueue from their released charts, our runtimes, and queues that
    admit a training job whole (what infra/llmft_infra/kubeflow.py cites)."""
    from components.launchers.trainjob import build_cluster_training_runtime, runtime_restarts

    mocks, _ = gke_stack
    releases = {r.name: r.inputs for r in mocks.of_type("kubernetes:helm.sh/v3:Release")}
    trainer, kueue = releases["kubeflow-trainer"], releases["kueue"]
    assert (trainer["chart"], trainer["version"], trainer["namespace"]) == (
        "oci://ghcr.io/kubeflow/charts/kubeflow-trainer", "2.3.0", "kubeflow-system")  # fmt: skip
    assert trainer["values"] == {"jobset": {"install": True}}
    assert (kueue["chart"], kueue["version"], kueue["namespace"]) == (
        "oci://registry.k8s.io/kueue/charts/kueue", "0.19.2", "kueue-system")  # fmt: skip
    config = yaml.safe_load(kueue["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["kind"] == "Configuration"
    assert "trainer.kubeflow.org/trainjob" in config["integrations"]["frameworks"]
    # The Training Operator is installed too (GKE_CONFIG's default): Kueue manages PyTorchJobs.
    assert "kubeflow.org/pytorchjob" in config["integrations"]["frameworks"]
    assert "manageJobsWithoutQueueName" not in config  # etcd and KFP pods are never queued
    # The ClusterQueue covers GPUs only: a cpu/memory request must not block admission forever.
    assert config["resources"] == {"quotaCheckStrategy": "IgnoreUndeclared"}
    # Kueue after the CRDs of the jobs it integrates (else a deferred integration for minutes).
    assert sorted(mocks.depends_on["kueue"]) == ["kubeflow-trainer", "training-operator"]

    runtimes = mocks.of_type("kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime")
    expected = [build_cluster_training_runtime(restarts=r) for r in runtime_restarts()]
    assert {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in runtimes} == {
        e["metadata"]["name"]: e["spec"] for e in expected
    }
    assert {r.inputs["metadata"]["name"]: r.inputs["metadata"] for r in runtimes} == {
        e["metadata"]["name"]: e["metadata"] for e in expected
    }
    assert all(mocks.depends_on[r.name] == ["kubeflow-trainer"] for r in runtimes)

    (flavor,) = mocks.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor")
    assert flavor.inputs["spec"] == {
        "nodeLabels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    }
    (cluster_queue,) = mocks.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
    # The GPU pool: 2 nodes at most in its one zone, 2 L4s each.
    assert cluster_queue.inputs["spec"]["resourceGroups"] == [
        {"coveredResources": ["nvidia.com/gpu"],
         "flavors": [{"name": "llmft-gpu",
                      "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}
    ]  # fmt: skip
    assert cluster_queue.inputs["spec"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kubeflow"}
    }
    (local_queue,) = mocks.of_type("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
    assert local_queue.inputs["metadata"] == {"name": "llmft", "namespace": "kubeflow"}
    assert local_queue.inputs["spec"] == {"clusterQueue": "llmft-gpus"}


def test_gpu_quota_follows_the_pool_and_both_installs_can_be_skipped():
    from llmft_infra.kubeflow import gpu_quota
    from llmft_infra.settings import GkeSettings, parse_settings

    assert gpu_quota(GkeSettings(location="us-central1", gpu_max_nodes=2)) == 2 * 3 * 8
    assert gpu_quota(GkeSettings(location="us-central1-a", gpu_max_nodes=2)) == 2 * 1 * 8
    assert gpu_quota(GkeSettings(location="us-central1", gpu_node_locations=("us-central1-a",
                                 "us-central1-b"), gpu_max_nodes=1)) == 16  # fmt: skip
    settings = {"trainer_v2": False, "kueue": False, "training_operator": False}
    mocks, _ = run_stack(parse_settings({**GKE_CONFIG, "gke": {**GKE_CONFIG["gke"], **settings}}))
    assert not mocks.of_type("kubernetes:helm.sh/v3:Release")
    assert not [r for r in mocks.resources if r.typ.startswith("kubernetes:kueue")]


def test_the_guides_kueue_hand_install_configures_kueue_as_the_stack_does():
    """docs/deploy/README.md's kueue-values.yaml (no Training Operator) is the stack's manager
    configuration, IgnoreUndeclared included (review T2)."""
    from llmft_infra.kubeflow import kueue_manager_config

    guide = (Path(__file__).resolve().parents[1] / "docs/deploy/README.md").read_text()
    block = guide.split("cat > kueue-values.yaml <<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    values = yaml.safe_load(block)
    documented = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert documented == yaml.safe_load(kueue_manager_config(pytorchjob=False))


def test_bigquery_sources_get_exactly_the_roles_they_need():
    """C7: `bigquery_query` / bq:// inputs run Beam's EXPORT read as the Dataflow account: a query
    job and a temporary dataset in the project (bigquery.user), table data of the named datasets
    only (dataViewer); nothing when no dataset is named (the exact sets above)."""
    mocks, _ = stack({**VERTEX_CONFIG, "bigquery_datasets": ["raw", "other-proj.events"]})
    bigquery = {g for g in _grants(mocks) if "bigquery" in g[2]}
    assert bigquery == {
        ("project", PROJECT, "roles/bigquery.user", DATAFLOW),
        ("dataset", "raw", "roles/bigquery.dataViewer", DATAFLOW),
        ("dataset", "events", "roles/bigquery.dataViewer", DATAFLOW),
    }
    (events,) = [
        r for r in mocks.of_type("gcp:bigquery/datasetIamMember:DatasetIamMember")
        if r.inputs["datasetId"] == "events"
    ]  # fmt: skip
    assert events.inputs["project"] == "other-proj"
    services = {s.inputs["service"] for s in mocks.of_type("gcp:projects/service:Service")}
    assert "bigquery.googleapis.com" in services


def test_bigquery_dataset_names_are_checked():
    from llmft_infra.settings import parse_settings

    with pytest.raises(ValueError, match=r"bigquery_datasets: 'a\.b\.c'"):
        parse_settings({**VERTEX_CONFIG, "bigquery_datasets": ["a.b.c"]})


def test_the_gpu_pool_is_tainted_sized_and_on_gvnic(gke_stack):
    """C5: the taint is set, not left to pool creation order; C6: the disk holds a 70B copy;
    C8: gVNIC on every GPU pool; a G2 pool needs no GPUDirect networks."""
    from components.platform.node_facts import GPU_NODE_DISK_GB

    mocks, _ = gke_stack
    config = mocks.named("gpu-pool").inputs["nodeConfig"]
    assert config["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
    ]
    assert config["diskSizeGb"] == GPU_NODE_DISK_GB == 250
    assert config["gvnic"] == {"enabled": True}
    assert "taints" not in mocks.named("cpu-pool").inputs["nodeConfig"]
    assert "networkConfig" not in mocks.named("gpu-pool").inputs
    assert not mocks.of_type("gcp:compute/network:Network")
    assert "enableMultiNetworking" not in mocks.named("gke").inputs


def test_an_a3_high_pool_gets_the_gpudirect_tcpx_networks():
    """C8: four GPU NIC networks, the pool on them, multi-networking, the Network objects the
    pods name, and the vendored NCCL plugin installer."""
    mocks, _ = stack({"project": "my-project", "region": "us-central1", "gke": True})
    networks = mocks.of_type("gcp:compute/network:Network")
    assert sorted(n.inputs["name"] for n in networks) == [f"llmft-gpu-net-{i}" for i in range(1, 5)]
    assert {n.inputs["mtu"] for n in networks} == {8244}
    pool = mocks.named("gpu-pool").inputs
    assert len(pool["networkConfig"]["additionalNodeNetworkConfigs"]) == 4
    assert mocks.named("gke").inputs["enableMultiNetworking"] is True
    kinds = {
        (r.inputs.get("kind"), r.inputs.get("metadata", {}).get("name")) for r in mocks.resources
    }
    assert {("Network", f"vpc{i}") for i in range(1, 5)} <= kinds
    assert {("GKENetworkParamSet", f"vpc{i}") for i in range(1, 5)} <= kinds
    assert ("DaemonSet", "nccl-tcpx-installer") in kinds
    # Review Q2: the pods' tcpx-daemon is unprivileged and gets the GPUs only through the NRI
    # device injector acting on its devices.gke.io annotation.
    assert ("DaemonSet", "device-injector") in kinds
    no_gpudirect = stack(
        {"project": "my-project", "region": "us-central1", "gke": {"gpudirect": False}}
    )
    assert not no_gpudirect[0].of_type("gcp:compute/network:Network")


@pytest.mark.unit
def test_the_gib_installer_installs_the_plugin_as_googles_manifest_does() -> None:
    """container-engine-accelerators@992db81 gpudirect-rdma/nccl-rdma-installer.yaml: image
    nccl-plugin-gib:v1.1.1 and `container_entry.sh install` without --install-nccl (dropped in
    2da1c92): no libnccl of Google's ahead of torch's on the trainer's LD_LIBRARY_PATH."""
    from llmft_infra.gpudirect import gib_installer

    [init] = gib_installer()["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"
    script = init["command"][2]
    assert "/scripts/container_entry.sh install;" in script
    assert "--install-nccl" not in script
    assert script.endswith("cp -r /var/lib/gib/. /usr/local/home/kubernetes/bin/gib")


def test_an_a3_ultra_pool_gets_the_gpudirect_rdma_networks():
    """C8, RDMA (node_facts.RDMA_SOURCE): a gVNIC VPC with its firewall rule, a RoCE VPC in the
    pool's zone with one subnet per RDMA NIC and no firewall rule, the pool on all nine subnets,
    the Network objects the pods name, and the gIB installer DaemonSet on H200/B200 nodes."""
    from llmft_infra.settings import parse_settings

    from components.platform.node_facts import GIB_INSTALLER_IMAGE

    gke = {
        "gpu_machine_type": "a3-ultragpu-8g",
        "accelerator_type": "nvidia-h200-141gb",
        "gpu_node_locations": ["us-central1-b"],
    }
    mocks, outputs = stack({"project": "my-project", "region": "us-central1", "gke": gke})
    networks = {n.inputs["name"]: n.inputs for n in mocks.of_type("gcp:compute/network:Network")}
    assert set(networks) == {"llmft-gpu-net-gvnic", "llmft-gpu-net-rdma"}
    assert networks["llmft-gpu-net-rdma"]["networkProfile"] == (
        "projects/my-project/global/networkProfiles/us-central1-b-vpc-roce"
    )
    assert {n["mtu"] for n in networks.values()} == {8896}
    firewalls = mocks.of_type("gcp:compute/firewall:Firewall")
    assert [f.inputs["network"] for f in firewalls] == ["llmft-gpu-net-gvnic"]
    # Pulumi registers resources concurrently: compare by name, never by registration order.
    subnets = {
        s.inputs["name"]: s.inputs for s in mocks.of_type("gcp:compute/subnetwork:Subnetwork")
    }
    assert {name: s["ipCidrRange"] for name, s in subnets.items()} == {
        "llmft-gpu-subnet-gvnic": "192.168.0.0/24",
        **{f"llmft-gpu-subnet-rdma-{i}": f"192.168.{i + 1}.0/24" for i in range(8)},
    }
    pool = mocks.named("gpu-pool").inputs
    configs = pool["networkConfig"]["additionalNodeNetworkConfigs"]
    assert [c["network"] for c in configs] == ["llmft-gpu-net-gvnic"] + ["llmft-gpu-net-rdma"] * 8
    assert [c["subnetwork"] for c in configs] == ["llmft-gpu-subnet-gvnic"] + [
        f"llmft-gpu-subnet-rdma-{i}" for i in range(8)
    ]
    assert pool["nodeLocations"] == ["us-central1-b"]
    assert mocks.named("gke").inputs["enableMultiNetworking"] is True
    params = {
        r.inputs["metadata"]["name"]: r.inputs["spec"]
        for r in mocks.resources
        if r.inputs.get("kind") == "GKENetworkParamSet"
    }
    assert params["gvnic-1"]["deviceMode"] == "NetDevice"
    assert [params[f"rdma-{i}"]["vpcSubnet"] for i in range(8)] == [
        f"llmft-gpu-subnet-rdma-{i}" for i in range(8)
    ]
    assert {params[f"rdma-{i}"]["deviceMode"] for i in range(8)} == {"RDMA"}
    installer = mocks.named("nccl-rdma-installer").inputs
    pod = installer["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["image"] == GIB_INSTALLER_IMAGE
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [
        "nvidia-h200-141gb",
        "nvidia-b200",
    ]
    daemonsets = [r for r in mocks.resources if r.inputs.get("kind") == "DaemonSet"]
    assert "device-injector" not in {d.inputs["metadata"]["name"] for d in daemonsets}
    assert outputs["gpudirect"] is True
    # A TrainJob of this pool references the RDMA runtime variant: infra installs it beside ours.
    runtimes = mocks.of_type("kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime")
    assert {r.inputs["metadata"]["name"] for r in runtimes} == {
        "llmft-torch-v1-r3", "llmft-torch-v1-r10", "llmft-torch-v1-r3-rdma",
        "llmft-torch-v1-r10-rdma"}  # fmt: skip
    # The RoCE network is zonal: a pool that may span zones is refused before anything exists.
    with pytest.raises(ValueError, match="needs exactly one zone"):
        parse_settings(
            {"project": "p-1234", "region": "us-central1", "gke": {**gke, "gpu_node_locations": []}}
        )
