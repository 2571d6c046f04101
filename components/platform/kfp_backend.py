"""Which KFP backend release honours each feature the compiled pipeline uses, each with its source
(a file and line of kubeflow/pipelines at that tag): `llmft` refuses to submit to an older
backend (pipelines/deploy/clients.py) and docs/deploy/README.md's table is tested against these
(tests/test_deploy_docs.py). The facts of the machines and GPUs are in platform_facts.py.

To update a fact: change its table and its source, then run tests/test_platform_facts.py and
tests/test_deploy_docs.py.
"""

from __future__ import annotations

KFP_FEATURE_FLOORS: dict[str, tuple[tuple[int, int, int], str]] = {
    "accelerator count from a parameter": (
        (2, 4, 0),
        "kubeflow/pipelines backend/src/v2/driver/driver.go:513@2.4.0 (resourceCount resolved "
        "from the task's inputs; 2.3.0 reads only a constant count)",
    ),
    "kubernetes platform config (unknown fields tolerated)": (
        (2, 4, 1),
        "kubeflow/pipelines backend/src/v2/cmd/driver/main.go: strict jsonpb at 2.4.0, "
        "util.UnmarshalString (DiscardUnknown) from 2.4.1",
    ),
    "pipeline_job_uuid placeholder": (
        (2, 5, 0),
        "kubeflow/pipelines backend/src/v2/driver/driver.go:1648@2.5.0 (#11599; 2.4.1 passes "
        "the placeholder through as a constant)",
    ),
    "secretAsEnv": (
        (2, 0, 0),
        "kubeflow/pipelines backend/src/v2/driver/driver.go:502@2.0.0",
    ),
    "activeDeadlineSeconds": (
        (2, 1, 0),
        "kubeflow/pipelines backend/src/v2/driver/driver.go:607@2.1.0 (absent at 2.0.5)",
    ),
    "podMetadata labels": (
        (2, 1, 0),
        "kubeflow/pipelines backend/src/v2/compiler/argocompiler/container.go:300@2.1.0 "
        "(absent at 2.0.5)",
    ),
    "secretAsEnv secretNameParameter": (
        (2, 5, 0),
        "kubeflow/pipelines backend/src/v2/driver/driver.go:905@2.5.0 (absent at 2.4.1, which "
        "reads secretName, compiled with the same name)",
    ),
    "task resource requests (resourceCpuRequest, resourceMemoryRequest)": (
        (2, 4, 0),
        "kubeflow/pipelines#11500 (the driver read only the deprecated cpuLimit-style fields) "
        "and #11839 (the resource_* fields are read by backends from 2.4)",
    ),
    "secretAsEnv optional": (
        (2, 15, 0),
        "kubeflow/pipelines backend/src/v2/driver/k8s.go:340@2.15.0",
    ),
    "securityContext": (
        (2, 16, 0),
        "kubeflow/pipelines backend/src/v2/driver/k8s.go:724@2.16.0",
    ),
    "pipeline_job_schedule_time_utc placeholder": (
        (2, 16, 0),
        "kubeflow/pipelines backend/src/v2/driver/resolve.go:440@2.16.0 (kubeflow/pipelines#13474)",
    ),
}
"""Features the compiled KFP YAML uses -> (first KFP backend release that honours it, source).
The releases between 2.5.0 and 2.14.0 do not exist (the backend's numbering jumped to the SDK's)."""

KFP_PLATFORM_FIELDS: dict[str, str] = {
    "activeDeadlineSeconds": "activeDeadlineSeconds",
    "podMetadata.labels": "podMetadata labels",
    "secretAsEnv.secretName": "secretAsEnv",
    "secretAsEnv.keyToEnv": "secretAsEnv",
    "secretAsEnv.secretNameParameter": "secretAsEnv secretNameParameter",
    "secretAsEnv.optional": "secretAsEnv optional",
    "securityContext.runAsUser": "securityContext",
    "securityContext.runAsGroup": "securityContext",
    "securityContext.runAsNonRoot": "securityContext",
}
"""Field of the compiled KFP YAML's Kubernetes platform spec (an executor's key, then the key
inside it or inside its list items) -> its feature in KFP_FEATURE_FLOORS. A field the compiled
YAML uses must be listed (tests/test_deploy_docs.py), so a new one cannot slip past the floor."""


def kfp_backend_floor() -> tuple[int, int, int]:
    """The oldest KFP backend that runs the compiled KFP pipeline as intended."""
    return max(version for version, _ in KFP_FEATURE_FLOORS.values())


def version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))
