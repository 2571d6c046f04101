"""Least privilege, checked over every IAM grant and bucket the infra program creates.

The policy (infra/llmft_infra/policy.py) fails on primitive roles, public members, authoritative
IAM resources, ACLs, public buckets and project-wide roles that have a narrower scope. The stack
passes it; the same stack with one primitive role added fails it.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakes.pulumi_mocks import GKE_CONFIG, VERTEX_CONFIG, RecordingMocks, run_stack, stack


def _pairs(mocks: RecordingMocks) -> list[tuple[str, dict[str, Any]]]:
    return [(r.typ, r.inputs) for r in mocks.resources]


@pytest.fixture(scope="module", params=["vertex", "gke"])
def full_stack(request: pytest.FixtureRequest) -> RecordingMocks:
    return stack(VERTEX_CONFIG if request.param == "vertex" else GKE_CONFIG)[0]


def test_the_stack_follows_the_policy(full_stack):
    from llmft_infra.policy import iam_grants, violations

    assert violations(_pairs(full_stack)) == []
    grants = iam_grants(_pairs(full_stack))
    assert len(grants) >= 15
    # Every project-wide grant is one the policy explains; everything else is resource-scoped.
    from llmft_infra.policy import PROJECT_ONLY_ROLES

    assert {role for scope, role, _ in grants if scope == "project"} <= set(PROJECT_ONLY_ROLES)
    assert {scope for scope, _, _ in grants} == {
        "project", "bucket", "repository", "secret", "service account"
    }  # fmt: skip


def test_the_policy_fails_when_a_primitive_role_is_added():
    import pulumi_gcp as gcp
    from llmft_infra.policy import violations
    from llmft_infra.settings import parse_settings

    def add_editor() -> None:
        gcp.projects.IAMMember(
            "quick-fix",
            project="my-project",
            role="roles/editor",
            member="serviceAccount:llmft-pipelines@my-project.iam.gserviceaccount.com",
        )

    mocks, _ = run_stack(
        parse_settings({"project": "my-project", "region": "us-central1"}), add_editor
    )
    found = violations(_pairs(mocks))
    assert found == [
        "gcp:projects/iAMMember:IAMMember roles/editor for "
        "serviceAccount:llmft-pipelines@my-project.iam.gserviceaccount.com: primitive role"
    ]


BUCKET_OK = {"name": "b", "uniformBucketLevelAccess": True, "publicAccessPrevention": "enforced"}


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        (("gcp:storage/bucketIAMMember:BucketIAMMember", {"role": "roles/owner", "member": "user:a@b.c"}),
         "primitive role"),
        (("gcp:serviceaccount/iAMMember:IAMMember", {"role": "roles/viewer", "member": "user:a@b.c"}),
         "primitive role"),
        (("gcp:storage/bucketIAMMember:BucketIAMMember", {"role": "roles/storage.objectViewer", "member": "allUsers"}),
         "grants allUsers (public)"),
        (("gcp:secretmanager/secretIamMember:SecretIamMember",
          {"role": "roles/secretmanager.secretAccessor", "member": "allAuthenticatedUsers"}),
         "grants allAuthenticatedUsers (public)"),
        (("gcp:projects/iAMMember:IAMMember", {"role": "roles/storage.objectAdmin", "member": "user:a@b.c"}),
         "project-wide roles/storage.objectAdmin"),
        (("gcp:projects/iAMMember:IAMMember", {"role": "roles/iam.serviceAccountUser", "member": "user:a@b.c"}),
         "project-wide roles/iam.serviceAccountUser"),
        (("gcp:projects/iAMBinding:IAMBinding", {"role": "roles/aiplatform.user", "members": ["user:a@b.c"]}),
         "use an additive *IamMember grant"),
        (("gcp:storage/bucketIAMPolicy:BucketIAMPolicy", {"policyData": "{}"}), "use an additive *IamMember grant"),
        (("gcp:storage/bucketACL:BucketACL", {"bucket": "b", "roleEntities": ["READER:allUsers"]}), "ACLs bypass"),
        (("gcp:storage/bucket:Bucket", {**BUCKET_OK, "publicAccessPrevention": "inherited"}),
         "public access prevention must be enforced"),
        (("gcp:storage/bucket:Bucket", {**BUCKET_OK, "uniformBucketLevelAccess": False}),
         "uniform bucket-level access must be on"),
    ],
)  # fmt: skip
def test_each_rule_catches_its_violation(resource, expected):
    from llmft_infra.policy import violations

    found = violations([resource])
    assert len(found) >= 1 and any(expected in line for line in found), found


def test_allowed_grants_pass():
    from llmft_infra.policy import violations

    assert (
        violations(
            [
                (
                    "gcp:projects/iAMMember:IAMMember",
                    {"role": "roles/dataflow.worker", "member": "user:a@b.c"},
                ),
                (
                    "gcp:storage/bucketIAMMember:BucketIAMMember",
                    {"role": "roles/storage.objectAdmin", "member": "user:a@b.c"},
                ),
                ("gcp:storage/bucket:Bucket", BUCKET_OK),
            ]
        )
        == []
    )
