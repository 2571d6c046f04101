"""docs/deploy/rbac.yaml grants exactly what the code asks the Kubernetes API for.

What the code needs is not listed by hand: the Kubernetes fakes (tests/fakes/k8s_api.py) classify
every request the launcher, etcd and cleanup tests make as the (apiGroup, resource, verb) that
authorizes it; tests/golden/rbac_permissions.json is that set, rewritten by `--update-goldens` and
reviewed. A test whose requests need more fails at once (tests/conftest.py); this module holds the
Role against the file, and the file against what this session observed when it ran all of
goldens.RBAC_SOURCES (a permission no test needs any more is stale). conftest runs it last.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from goldens import RBAC_SOURCES, rbac_permissions

REPO = Path(__file__).resolve().parents[1]
RBAC = list(yaml.safe_load_all((REPO / "docs/deploy/rbac.yaml").read_text()))

KFP_ITSELF = {
    ("", "configmaps", "get"): "KFP's driver reads the kfp-launcher ConfigMap (default root)",
    ("", "secrets", "get"): "KFP's launcher reads the MinIO credentials (default object store)",
    ("argoproj.io", "workflowtaskresults", "create"): "Argo's executor reports task outputs",
    ("argoproj.io", "workflowtaskresults", "patch"): "Argo's executor reports task outputs",
}
"""Granted beyond our code's own requests: KFP's and Argo's processes run in the same pods, as the
same service account (KFP v2 on Argo 3.4+ docs); no fake here sees their requests."""


def _granted(role: dict) -> set[tuple[str, str, str]]:
    granted = set()
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        if "secrets" in rule["resources"] or "configmaps" in rule["resources"]:
            assert rule["resourceNames"], "secrets/configmaps only by name"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.update((group, resource, verb) for verb in rule["verbs"])
    return granted


@pytest.mark.parametrize("doc", RBAC, ids=[d["kind"] for d in RBAC])
def test_rbac_objects_validate_against_kubernetes_schemas(doc: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, "1.30", strict=True)


def test_rbac_validation_is_not_a_rubber_stamp() -> None:
    import kubernetes_validate

    role = next(d for d in RBAC if d["kind"] == "Role")
    broken = {**role, "rules": [{**role["rules"][0], "verb": ["get"]}]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30", strict=True)


def test_role_grants_exactly_what_the_code_asks_for_and_kfp_needs() -> None:
    kinds = [d["kind"] for d in RBAC]
    # namespaced only, no ClusterRole
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "ServiceAccount"]
    account, role, binding, trainer = RBAC
    granted = _granted(role)
    needed = rbac_permissions()
    assert not needed & KFP_ITSELF.keys(), "a KFP-only permission is now used by our code"
    assert sorted(needed - granted) == [], "the code asks for these; the Role does not grant them"
    assert sorted(granted - needed - KFP_ITSELF.keys()) == [], "granted, but nothing asks for it"
    assert KFP_ITSELF.keys() <= granted
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    sa_subject = next(s for s in binding["subjects"] if s["kind"] == "ServiceAccount")
    assert sa_subject["name"] == account["metadata"]["name"] == "llmft-pipeline"
    assert {d["metadata"]["namespace"] for d in RBAC} == {sa_subject["namespace"]}
    example = yaml.safe_load((REPO / "docs/deploy/example.yaml").read_text())
    assert example["kfp"]["service_account"] == "llmft-pipeline"
    # N18: the training pods' account is bound to nothing (no Kubernetes API rights) and is the
    # kfp target's default for the PyTorchJob pods.
    from components.params.run_params import RunParams

    assert trainer["metadata"]["name"] == RunParams.for_target("kfp").service_account
    assert trainer["metadata"]["name"] == example["kfp"]["parameters"]["service_account"]
    assert trainer["metadata"]["name"] not in {s["name"] for s in binding["subjects"]}
    assert trainer["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "llmft-trainer@PROJECT_ID.iam.gserviceaccount.com"
    }


def test_every_reviewed_permission_is_still_asked_for(request: pytest.FixtureRequest) -> None:
    """Only meaningful after the fakes' tests ran in this session (conftest orders this last)."""
    ran = {item.path.name for item in request.session.items}
    if not set(RBAC_SOURCES) <= ran:
        pytest.skip(f"needs {', '.join(RBAC_SOURCES)} in the same run")
    from fakes.k8s_api import OBSERVED_PERMISSIONS

    assert sorted(rbac_permissions() - OBSERVED_PERMISSIONS) == [], (
        "no test asks for these any more: drop them from docs/deploy/rbac.yaml and "
        "rerun with --update-goldens"
    )
