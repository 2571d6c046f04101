"""Run the Pulumi program of infra/ under Pulumi's own unit-test mocks (no engine, no cloud).

`run_stack(settings)` executes `build_stack` with `pulumi.runtime.set_mocks`: every resource the
program registers is recorded with its inputs (as the engine would receive them, camelCase), the
providers' computed outputs are filled the way the Google Cloud APIs fill them, and the
`kubernetes:yaml:decode` function (what pulumi-kubernetes' provider does for `ConfigFile`) is
answered by parsing the YAML. The stack outputs come back resolved.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml

INFRA_DIR = Path(__file__).resolve().parents[2] / "infra"
if str(INFRA_DIR) not in sys.path:
    sys.path.insert(0, str(INFRA_DIR))

PROJECT_NUMBER = "123456789012"
SECRET_SIG = "4dabf18193072939515e22adb298388d"
"""Pulumi's marker of a secret value in serialized properties (pulumi.runtime.rpc)."""


def unwrap_secrets(value: Any) -> Any:
    """Inputs with secret values replaced by the values (tests compare plain data)."""
    if isinstance(value, dict):
        if SECRET_SIG in value:
            return unwrap_secrets(value["value"])
        return {k: unwrap_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(v) for v in value]
    return value


@dataclass
class Recorded:
    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str | None


class RecordingMocks(pulumi.runtime.Mocks):
    """Records registrations; computes what the real providers would return."""

    def __init__(self) -> None:
        self.resources: list[Recorded] = []
        self.depends_on: dict[str, list[str]] = {}
        """Resource name -> names of its explicit `depends_on` (the mocks' registration carries
        no dependencies, so a stack transformation records them)."""
        self.aliases: dict[str, list[pulumi.Alias]] = {}
        """Resource name -> its `pulumi.Alias` options (recorded the same way)."""

    def record_dependencies(self, args: pulumi.ResourceTransformationArgs) -> None:
        """A stack transformation: note `args.opts.depends_on` by resource name, change nothing.

        Only for this mocks' own stack: set_mocks keeps the process's root stack resource once
        made (pulumi/runtime/mocks.py `set_mocks`), so an earlier stack's transformation still
        runs for later stacks and would overwrite its records with theirs."""
        from pulumi.runtime.settings import get_monitor

        if getattr(get_monitor(), "mocks", None) is not self:
            return None
        depends = args.opts.depends_on if args.opts else None
        if isinstance(depends, pulumi.Resource):
            depends = [depends]
        self.depends_on[args.name] = [d._name for d in depends or []]
        aliases = args.opts.aliases if args.opts else None
        self.aliases[args.name] = [a for a in aliases or [] if isinstance(a, pulumi.Alias)]
        return None

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(
            Recorded(args.typ, args.name, unwrap_secrets(args.inputs), args.provider)
        )
        outputs = dict(args.inputs)
        inputs = args.inputs
        project = inputs.get("project", "my-project")
        if args.typ == "gcp:serviceaccount/account:Account":
            email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
            outputs.update(email=email, name=f"projects/{project}/serviceAccounts/{email}")
        elif args.typ == "gcp:artifactregistry/repository:Repository":
            outputs["name"] = inputs["repositoryId"]
        elif args.typ == "gcp:secretmanager/secret:Secret":
            outputs["name"] = f"projects/{PROJECT_NUMBER}/secrets/{inputs['secretId']}"
        elif args.typ == "gcp:container/cluster:Cluster":
            outputs.update(endpoint="203.0.113.10", masterAuth={"clusterCaCertificate": "Q0E="})
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "kubernetes:yaml:decode":
            text = args.args["text"]
            return {"result": [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]}
        raise AssertionError(f"the program called {args.token}, which these mocks do not model")

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> Recorded:
        (match,) = [r for r in self.resources if r.name == name]
        return match


VERTEX_CONFIG: dict[str, Any] = {"project": "my-project", "region": "us-central1"}
"""The smallest stack: Vertex AI only."""
GKE_CONFIG: dict[str, Any] = {
    "project": "my-project",
    "region": "us-central1",
    "deployers": ["user:alice@example.com"],
    "labels": {"team": "ml"},
    "gke": {
        "gpu_node_locations": ["us-central1-a"],
        "accelerator_type": "nvidia-l4",
        "accelerator_count": 2,
        "gpu_machine_type": "g2-standard-24",
    },
}
"""Everything: GKE with the Training Operator, a deployer."""

_RUNS: dict[str, tuple[RecordingMocks, dict[str, Any]]] = {}


def stack(config: dict[str, Any]) -> tuple[RecordingMocks, dict[str, Any]]:
    """run_stack for a config, once per test session (the Training Operator CRD takes seconds)."""
    import json

    from llmft_infra.settings import parse_settings

    key = json.dumps(config, sort_keys=True)
    if key not in _RUNS:
        _RUNS[key] = run_stack(parse_settings(config))
    return _RUNS[key]


def run_stack(settings: Any, extra: Any = None) -> tuple[RecordingMocks, dict[str, Any]]:
    """Run build_stack(settings) (then `extra()`, e.g. to add a resource) under mocks."""
    from llmft_infra.program import build_stack

    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="llmft-infra", stack="test", preview=False)
    outputs: dict[str, Any] = {}

    @pulumi.runtime.test
    def program() -> Any:
        pulumi.runtime.register_stack_transformation(mocks.record_dependencies)
        result = build_stack(settings)
        if extra is not None:
            extra()
        return pulumi.Output.all(**result).apply(outputs.update)

    program()
    return mocks, outputs


IAM_WHERE = {
    "gcp:projects/iAMMember:IAMMember": ("project", "project"),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("bucket", "bucket"),
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": ("repository", "repository"),
    "gcp:secretmanager/secretIamMember:SecretIamMember": ("secret", "secretId"),
    "gcp:serviceaccount/iAMMember:IAMMember": ("account", "serviceAccountId"),
    "gcp:bigquery/datasetIamMember:DatasetIamMember": ("dataset", "datasetId"),
}
"""IAM member resource type -> (scope kind, the input naming the scope)."""


def iam_grants(mocks: RecordingMocks) -> set[tuple[str, str, str, str]]:
    """(scope kind, scope, role, member); scope = project/bucket/repository/secret/account name."""
    grants = set()
    for r in mocks.resources:
        if r.typ in IAM_WHERE:
            kind, key = IAM_WHERE[r.typ]
            scope = str(r.inputs[key]).rsplit("/", 1)[-1]
            grants.add((kind, scope, r.inputs["role"], r.inputs["member"]))
    return grants
