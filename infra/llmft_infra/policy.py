"""Least-privilege rules every IAM grant and bucket of the stack must follow.

`violations(resources)` takes the stack's resources as (type token, inputs) pairs, as Pulumi's
unit-test mocks see them, and returns one line per broken rule:

- no primitive role (owner, editor, viewer), at any scope;
- no `allUsers` / `allAuthenticatedUsers` member;
- no authoritative IAM policy or binding resource (they silently remove other members);
- a project-wide grant only for roles Google Cloud has no narrower scope for (PROJECT_ONLY_ROLES);
- every bucket with uniform bucket-level access and public access prevention enforced, and no
  ACL resources on buckets or objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PRIMITIVE_ROLES = frozenset({"roles/owner", "roles/editor", "roles/viewer"})
PUBLIC_MEMBERS = frozenset({"allUsers", "allAuthenticatedUsers"})

PROJECT_ONLY_ROLES: Mapping[str, str] = {
    "roles/aiplatform.user": "Vertex AI jobs, pipelines, models and metadata have no per-resource IAM",
    "roles/dataflow.developer": "Dataflow jobs have no per-job IAM",
    "roles/dataflow.worker": "granted on the project only",
    "roles/logging.logWriter": "log writing is granted on the project (or folder/org)",
    "roles/cloudbuild.builds.editor": "Cloud Build builds have no per-build IAM",
    "roles/container.clusterViewer": "GKE has no per-cluster IAM; Kubernetes RBAC narrows it",
    "roles/container.defaultNodeServiceAccount": "Google's minimal role for node accounts, project only",
    "roles/cloudquotas.viewer": "quota is read per project (cloudquotas.quotas.get)",
    "roles/bigquery.user": (
        "BigQuery jobs (jobs.create) and the temporary dataset Beam's EXPORT read of a query "
        "creates (datasets.create) are project permissions; table data stays per dataset"
    ),
}
"""Roles that may be bound on the project, each with the reason no narrower scope exists."""

IAM_MEMBER_TYPES = {
    "gcp:projects/iAMMember:IAMMember": "project",
    "gcp:storage/bucketIAMMember:BucketIAMMember": "bucket",
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": "repository",
    "gcp:secretmanager/secretIamMember:SecretIamMember": "secret",
    "gcp:serviceaccount/iAMMember:IAMMember": "service account",
    "gcp:bigquery/datasetIamMember:DatasetIamMember": "dataset",
}
"""The additive grant resources the stack may use, by scope."""

BUCKET_TYPE = "gcp:storage/bucket:Bucket"


def iam_grants(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, str, str]]:
    """(scope, role, member) of every additive grant among `resources`."""
    return [
        (IAM_MEMBER_TYPES[typ], inputs["role"], inputs["member"])
        for typ, inputs in resources
        if typ in IAM_MEMBER_TYPES
    ]


def violations(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Every broken rule, one line each; empty when the stack follows them all."""
    found = []
    for typ, inputs in resources:
        lowered = typ.lower()
        iam_like = "iam" in lowered
        if iam_like and typ not in IAM_MEMBER_TYPES:
            found.append(f"{typ}: use an additive *IamMember grant, not a policy or binding")
        if "acl" in lowered or "accesscontrol" in lowered:
            found.append(f"{typ}: ACLs bypass uniform bucket-level access")
        if typ == BUCKET_TYPE:
            name = inputs.get("name", "?")
            if inputs.get("uniformBucketLevelAccess") is not True:
                found.append(f"bucket {name}: uniform bucket-level access must be on")
            if inputs.get("publicAccessPrevention") != "enforced":
                found.append(f"bucket {name}: public access prevention must be enforced")
        if not iam_like:
            continue
        role = str(inputs.get("role", ""))
        members = [inputs["member"]] if "member" in inputs else list(inputs.get("members", []))
        if role in PRIMITIVE_ROLES:
            found.append(f"{typ} {role} for {', '.join(map(str, members))}: primitive role")
        for member in members:
            if member in PUBLIC_MEMBERS:
                found.append(f"{typ} {role}: grants {member} (public)")
        if (
            IAM_MEMBER_TYPES.get(typ) == "project"
            and role not in PROJECT_ONLY_ROLES
            and role not in PRIMITIVE_ROLES
        ):
            found.append(
                f"project-wide {role} for {', '.join(map(str, members))}: grant it on the "
                "resource (bucket, repository, secret, service account) instead"
            )
    return found
