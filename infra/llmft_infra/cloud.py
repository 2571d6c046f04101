"""The Google Cloud part: APIs, bucket, repositories, the token secret, service accounts, IAM.

Every role is granted with an additive `*IamMember` (never an authoritative policy that would
drop other members) at the narrowest scope the permission exists at: the bucket, a repository,
the secret, a service account. Only roles Google Cloud offers no narrower scope for are bound on
the project; `llmft_infra.policy` lists them with the reason, and the tests fail on any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from llmft_infra.settings import (
    DATAFLOW_ACCOUNT,
    KFP_REPOSITORY,
    SCRATCH_NONCURRENT_DAYS,
    SCRATCH_PREFIXES,
    SOFT_DELETE_RETENTION_S,
    TRAINER_ACCOUNT,
    Names,
    Settings,
)

APIS = (
    "aiplatform.googleapis.com",
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    # Project-level IAM grants (projects.setIamPolicy) go through this API; a fresh project
    # answers 403 "has not been used" without it.
    "cloudresourcemanager.googleapis.com",
    # `llmft run` and the validate step read the GPU and CPU quota a run needs before it starts
    # (components/preflight/quota.py).
    "cloudquotas.googleapis.com",
    "compute.googleapis.com",
    "dataflow.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
)
"""What the pipeline touches; GKE adds container.googleapis.com."""
BIGQUERY_API = "bigquery.googleapis.com"
"""Enabled when the settings name BigQuery datasets (C7)."""

BUILDER_ACCOUNT = "llmft-builder"
"""Cloud Build runs as this account (`gcloud builds submit --service-account`), not the default."""


@dataclass
class Cloud:
    """Handles to what `build_cloud` created, for the GKE part and the stack outputs."""

    apis: dict[str, gcp.projects.Service]
    bucket: gcp.storage.Bucket
    docker_repo: gcp.artifactregistry.Repository
    kfp_repo: gcp.artifactregistry.Repository
    hf_token: gcp.secretmanager.Secret
    accounts: dict[str, gcp.serviceaccount.Account]
    """By role: pipeline, trainer, dataflow, builder (and nodes, added by the GKE part)."""
    grants: list[pulumi.Resource] = field(default_factory=list)


class Grants:
    """Create IAM member resources, one per (scope, role, member), with readable names."""

    def __init__(
        self,
        settings: Settings,
        cloud_grants: list[pulumi.Resource],
        apis: dict[str, gcp.projects.Service],
    ) -> None:
        self.settings = settings
        self.created = cloud_grants
        self.apis = apis
        """Every grant waits for these (the GKE part adds its API before its grants)."""

    def _name(self, scope: str, role: str, who: str) -> str:
        return f"{scope}-{role.removeprefix('roles/').replace('.', '-')}-{who}"

    def _opts(self, depends_on: list[pulumi.Resource] | None = None) -> pulumi.ResourceOptions:
        """After the APIs: an IAM call to a service not yet enabled fails with 403."""
        return pulumi.ResourceOptions(depends_on=[*self.apis.values(), *(depends_on or [])])

    def project(
        self,
        role: str,
        who: str,
        member: pulumi.Input[str],
        depends_on: list[pulumi.Resource] | None = None,
    ) -> None:
        """Project-wide: only for roles that have no narrower scope (see policy.py)."""
        self.created.append(
            gcp.projects.IAMMember(
                self._name("project", role, who),
                project=self.settings.project,
                role=role,
                member=member,
                opts=self._opts(depends_on),
            )
        )

    def bucket(
        self, bucket: gcp.storage.Bucket, role: str, who: str, member: pulumi.Input[str]
    ) -> None:
        self.created.append(
            gcp.storage.BucketIAMMember(
                self._name("bucket", role, who),
                bucket=bucket.name,
                role=role,
                member=member,
                opts=self._opts(),
            )
        )

    def repository(
        self,
        repo: gcp.artifactregistry.Repository,
        role: str,
        who: str,
        member: pulumi.Input[str],
    ) -> None:
        self.created.append(
            gcp.artifactregistry.RepositoryIamMember(
                self._name(repo.pulumi_resource_name, role, who),
                project=repo.project,
                location=repo.location,
                repository=repo.name,
                role=role,
                member=member,
                opts=self._opts(),
            )
        )

    def secret(
        self, secret: gcp.secretmanager.Secret, role: str, who: str, member: pulumi.Input[str]
    ) -> None:
        self.created.append(
            gcp.secretmanager.SecretIamMember(
                self._name("secret", role, who),
                project=secret.project,
                secret_id=secret.secret_id,
                role=role,
                member=member,
                opts=self._opts(),
            )
        )

    def account(
        self,
        account: gcp.serviceaccount.Account,
        role: str,
        who: str,
        member: pulumi.Input[str],
        depends_on: list[pulumi.Resource] | None = None,
    ) -> None:
        """On one service account (actAs, Workload Identity), not on every account of the project."""
        self.created.append(
            gcp.serviceaccount.IAMMember(
                self._name(account.pulumi_resource_name, role, who),
                service_account_id=account.name,
                role=role,
                member=member,
                opts=self._opts(depends_on),
            )
        )

    def dataset(self, dataset: str, role: str, who: str, member: pulumi.Input[str]) -> None:
        """On one BigQuery dataset (`DATASET` in the stack's project or `PROJECT.DATASET`)."""
        project, _, dataset_id = dataset.rpartition(".")
        self.created.append(
            gcp.bigquery.DatasetIamMember(
                self._name(f"dataset-{dataset.replace('.', '-')}", role, who),
                project=project or self.settings.project,
                dataset_id=dataset_id,
                role=role,
                member=member,
                opts=self._opts(),
            )
        )


def member_of(account: gcp.serviceaccount.Account) -> pulumi.Output[str]:
    return account.email.apply(lambda email: f"serviceAccount:{email}")


def build_cloud(settings: Settings, names: Names) -> tuple[Cloud, Grants]:
    """Create the project-level part; returns the handles and the grant helper (GKE adds more)."""
    project = settings.project
    wanted = (*APIS, BIGQUERY_API) if settings.bigquery_datasets else APIS
    apis = {
        api: gcp.projects.Service(
            f"api-{api.split('.')[0]}", project=project, service=api, disable_on_destroy=False
        )
        for api in wanted
    }
    after_apis = pulumi.ResourceOptions(depends_on=list(apis.values()))
    bucket = _bucket(settings, after_apis)
    docker_repo, kfp_repo, hf_token = _repositories_and_secret(settings, names, after_apis)
    accounts = _accounts(project, names, after_apis)
    cloud = Cloud(apis, bucket, docker_repo, kfp_repo, hf_token, accounts)
    grants = Grants(settings, cloud.grants, cloud.apis)
    _grant_service_accounts(grants, cloud)
    _grant_deployers(grants, cloud, settings.deployers)
    return cloud, grants


def _bucket(settings: Settings, after_apis: pulumi.ResourceOptions) -> gcp.storage.Bucket:
    """The one bucket: versioned, never public, run scratch expiring."""
    project = settings.project
    bucket = gcp.storage.Bucket(
        "bucket",
        name=settings.bucket,
        project=project,
        location=settings.region,
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        # Overwritten or deleted objects stay recoverable for a while; run scratch expires.
        versioning={"enabled": True},
        lifecycle_rules=[
            {
                "action": {"type": "Delete"},
                "condition": {
                    "days_since_noncurrent_time": settings.noncurrent_version_days,
                    "with_state": "ARCHIVED",
                },
            },
            {
                "action": {"type": "Delete"},
                "condition": {
                    "age": settings.scratch_retention_days,
                    "matches_prefixes": list(SCRATCH_PREFIXES),
                },
            },
            {
                "action": {"type": "Delete"},
                "condition": {
                    "days_since_noncurrent_time": SCRATCH_NONCURRENT_DAYS,
                    "with_state": "ARCHIVED",
                    "matches_prefixes": list(SCRATCH_PREFIXES),
                },
            },
        ],
        # Versioning keeps deleted objects; soft delete would bill them again (settings.py).
        soft_delete_policy={"retention_duration_seconds": SOFT_DELETE_RETENTION_S},
        force_destroy=False,
        labels=settings.labels,
        opts=after_apis,
    )
    return bucket


def _repositories_and_secret(
    settings: Settings, names: Names, after_apis: pulumi.ResourceOptions
) -> tuple[
    gcp.artifactregistry.Repository, gcp.artifactregistry.Repository, gcp.secretmanager.Secret
]:
    """The image and pipeline-template repositories, and the (empty) HF token secret."""
    project = settings.project
    docker_repo = gcp.artifactregistry.Repository(
        "docker-repo",
        project=project,
        location=settings.region,
        repository_id=names.docker_repository,
        format="DOCKER",
        description="llmft images (one image for every component, trainer and Dataflow worker)",
        docker_config={"immutable_tags": True},
        labels=settings.labels,
        opts=after_apis,
    )
    kfp_repo = gcp.artifactregistry.Repository(
        "kfp-repo",
        project=project,
        location=settings.region,
        repository_id=KFP_REPOSITORY,
        format="KFP",
        description="llmft compiled pipeline templates",
        labels=settings.labels,
        opts=after_apis,
    )
    hf_token = gcp.secretmanager.Secret(
        "hf-token",
        project=project,
        secret_id=names.hf_token_secret,
        replication={"auto": {}},
        labels=settings.labels,
        opts=after_apis,
    )
    return docker_repo, kfp_repo, hf_token


def _accounts(
    project: str, names: Names, after_apis: pulumi.ResourceOptions
) -> dict[str, gcp.serviceaccount.Account]:
    """One service account per job: pipeline, trainer, Dataflow workers, Cloud Build."""

    def account(key: str, account_id: str, what: str) -> gcp.serviceaccount.Account:
        return gcp.serviceaccount.Account(
            f"sa-{key}",
            project=project,
            account_id=account_id,
            display_name=f"llmft {key}",
            description=what,
            opts=after_apis,
        )

    accounts = {
        "pipeline": account(
            "pipeline",
            names.pipeline_account,
            "Runs llmft pipelines (Vertex AI Pipelines, KFP pods)",
        ),
        "trainer": account(
            "trainer", TRAINER_ACCOUNT, "llmft training replicas (CustomJob, PyTorchJob)"
        ),
        "dataflow": account("dataflow", DATAFLOW_ACCOUNT, "llmft Dataflow preprocessing workers"),
        "builder": account("builder", BUILDER_ACCOUNT, "Cloud Build of the llmft image"),
    }
    return accounts


def _grant_service_accounts(grants: Grants, cloud: Cloud) -> None:
    """What each service account may do, at the narrowest scope the permission exists at."""
    bucket, docker_repo, hf_token, accounts = (
        cloud.bucket,
        cloud.docker_repo,
        cloud.hf_token,
        cloud.accounts,
    )
    pipeline, trainer = member_of(accounts["pipeline"]), member_of(accounts["trainer"])
    dataflow, builder = member_of(accounts["dataflow"]), member_of(accounts["builder"])

    # The pipeline: submits CustomJobs, registers models, writes run metadata (Vertex AI has no
    # per-resource IAM for these); submits Dataflow jobs; reads and writes the bucket; pulls the
    # image; reads the token; starts jobs that run as the trainer and Dataflow accounts.
    grants.project("roles/aiplatform.user", "pipeline", pipeline)
    grants.project("roles/dataflow.developer", "pipeline", pipeline)
    grants.project("roles/logging.logWriter", "pipeline", pipeline)
    # The validate step of a console run reads the run's GPU/CPU quota (C1).
    grants.project("roles/cloudquotas.viewer", "pipeline", pipeline)
    grants.bucket(bucket, "roles/storage.objectAdmin", "pipeline", pipeline)
    grants.repository(docker_repo, "roles/artifactregistry.reader", "pipeline", pipeline)
    grants.secret(hf_token, "roles/secretmanager.secretAccessor", "pipeline", pipeline)
    grants.account(accounts["trainer"], "roles/iam.serviceAccountUser", "pipeline", pipeline)
    grants.account(accounts["dataflow"], "roles/iam.serviceAccountUser", "pipeline", pipeline)

    # Training replicas read the dataset and base model, write checkpoints and the model; on
    # Vertex AI each replica reads the Hugging Face token at start (components/runtime/secrets.py), so a
    # gated model downloads there too.
    grants.bucket(bucket, "roles/storage.objectAdmin", "trainer", trainer)
    grants.secret(hf_token, "roles/secretmanager.secretAccessor", "trainer", trainer)

    # Dataflow workers: the worker role (project-only), the bucket, the custom container.
    grants.project("roles/dataflow.worker", "dataflow", dataflow)
    grants.bucket(bucket, "roles/storage.objectAdmin", "dataflow", dataflow)
    grants.repository(docker_repo, "roles/artifactregistry.reader", "dataflow", dataflow)

    # BigQuery sources (C7): Beam's EXPORT read runs a query job and creates a temporary dataset
    # in the project (bigquery.user), then reads only the datasets named in the settings.
    if grants.settings.bigquery_datasets:
        grants.project("roles/bigquery.user", "dataflow", dataflow)
        for dataset in grants.settings.bigquery_datasets:
            grants.dataset(dataset, "roles/bigquery.dataViewer", "dataflow", dataflow)

    # Cloud Build: reads the staged source from the bucket, pushes the image, writes its log.
    grants.bucket(bucket, "roles/storage.objectViewer", "builder", builder)
    grants.repository(docker_repo, "roles/artifactregistry.writer", "builder", builder)
    grants.project("roles/logging.logWriter", "builder", builder)


def _grant_deployers(grants: Grants, cloud: Cloud, deployers: tuple[str, ...]) -> None:
    """People (or a CI identity) who build, publish and launch."""
    bucket, docker_repo, kfp_repo, accounts = (
        cloud.bucket,
        cloud.docker_repo,
        cloud.kfp_repo,
        cloud.accounts,
    )
    for index, member in enumerate(deployers):
        who = f"deployer{index}"
        grants.project("roles/aiplatform.user", who, member)
        grants.project("roles/dataflow.developer", who, member)
        grants.project("roles/cloudbuild.builds.editor", who, member)
        grants.project("roles/cloudquotas.viewer", who, member)  # `llmft run` reads quota
        grants.bucket(bucket, "roles/storage.objectAdmin", who, member)
        grants.repository(docker_repo, "roles/artifactregistry.writer", who, member)
        grants.repository(kfp_repo, "roles/artifactregistry.writer", who, member)
        for key in ("pipeline", "dataflow", "builder"):
            grants.account(accounts[key], "roles/iam.serviceAccountUser", who, member)
