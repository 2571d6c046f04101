"""Validate an object as the API server would on create: the CRD's openAPIV3Schema (jsonschema)
and its CEL rules (`x-kubernetes-validations`, evaluated with cel-python).

Rules that compare with `oldSelf` are transition rules, which the API server evaluates on update
only (kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/
#transition-rules): a create skips them, and so does `cel_errors`. A rule is evaluated wherever
its node has a value (object properties, array items, map values), with `self` bound to it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

SCHEMAS = Path(__file__).parent / "schemas"


# Vendored from kubeflow/training-operator release-1.9 (the copy in the project's shared/schemas).
PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"


@functools.cache
def crd(file: str) -> dict[str, Any]:
    """schemas/`file`, read once per process (libyaml's loader: the CRDs are 0.5-0.9 MB, seconds
    each with the pure-Python one). Do not modify it."""
    return dict(yaml.load((SCHEMAS / file).read_text(), Loader=yaml.CSafeLoader))


def crd_schema(file: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of `version` in schemas/`file` (the cached `crd`: do not modify it)."""
    served = next(v for v in crd(file)["spec"]["versions"] if v["name"] == version)
    return dict(served["schema"]["openAPIV3Schema"])


def _rules(schema: dict[str, Any], value: Any, path: str) -> list[tuple[str, dict, Any]]:
    found = [(path, rule, value) for rule in schema.get("x-kubernetes-validations") or []]
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                found += _rules(sub, value[key], f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                found += _rules(extra, item, f"{path}[{key!r}]")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += _rules(schema["items"], item, f"{path}[{index}]")
    return found


def cel_rules(schema: dict[str, Any], obj: Any) -> list[tuple[str, str]]:
    """(path, rule) of every CEL rule that applies to `obj` on create."""
    return [
        (path, rule["rule"])
        for path, rule, _ in _rules(schema, obj, "")
        if "oldSelf" not in rule["rule"]
    ]


def cel_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    """The messages of the create-time CEL rules that `obj` breaks."""
    env = celpy.Environment()
    errors = []
    for path, rule, value in _rules(schema, obj, ""):
        if "oldSelf" in rule["rule"]:
            continue
        program = env.program(env.compile(rule["rule"]))
        if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
            errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    return errors


def pruned_fields(schema: dict[str, Any], obj: Any, path: str = "") -> list[str]:
    """Fields of `obj` its schema does not declare: the API server silently drops them from a
    structural CRD's objects (pruning: kubernetes.io/docs/tasks/extend-kubernetes/custom-
    resources/custom-resource-definitions/#field-pruning), and jsonschema lets them pass, so a
    misspelt field name would otherwise pass every test and do nothing on a cluster."""
    found: list[str] = []
    if isinstance(obj, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        declared = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if key in declared:
                found += pruned_fields(declared[key], value, f"{path}.{key}")
            elif isinstance(extra, dict):
                found += pruned_fields(extra, value, f"{path}[{key!r}]")
            elif not (path == ".metadata" or (path == "" and key in ("apiVersion", "kind"))):
                found.append(f"{path}.{key}")  # metadata is ObjectMeta's, not the CRD's
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            found += pruned_fields(schema["items"], item, f"{path}[{index}]")
    return found


def validate(schema: dict[str, Any], obj: Any) -> None:
    """Raise if the API server would refuse `obj` by its schema or CEL rules, or would drop
    a field of it (`pruned_fields`)."""
    jsonschema.validate(obj, schema)
    pruned = pruned_fields(schema, obj)
    if pruned:
        raise AssertionError("fields the API server would prune: " + ", ".join(pruned))
    errors = cel_errors(schema, obj)
    if errors:
        raise AssertionError("CEL rules broken:\n" + "\n".join(errors))
