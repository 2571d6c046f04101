"""What a compiled pipeline template declares, and checking run parameters against it.

Parameters are checked here, before any request leaves the machine, so a typo in a `--param`
name fails with the list of valid names instead of a server-side error minutes later.

Recurring fine-tunes read new data each time: a string parameter (typically the input URI) may
contain KFP's schedule-time placeholder `{{$.pipeline_job_schedule_time_utc}}`
(`dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER`). Backends do not expand placeholders inside
runtime parameter values, so the pipeline's validate step replaces it with the run's scheduled
time, which the pipeline receives through the same placeholder. A one-off run has no scheduled
time: `fill_schedule_time` substitutes the window the user names (a backfill), and a one-off run
that leaves the placeholder unfilled is refused.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.params.run_params import SCHEDULE_TIME_PLACEHOLDER

_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "STRING": (str,),
    "NUMBER_INTEGER": (int,),
    "NUMBER_DOUBLE": (int, float),
    "BOOLEAN": (bool,),
    "LIST": (list,),
    "STRUCT": (dict,),
}


@dataclass(frozen=True)
class TemplateParameter:
    """One input of the pipeline's root DAG."""

    name: str
    type: str
    """KFP parameter type: STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, LIST or STRUCT."""
    default: Any
    optional: bool
    description: str


@dataclass(frozen=True)
class TemplateInfo:
    """The facts about a compiled template that deployment needs."""

    path: Path
    name: str
    """pipelineInfo.name: the KFP pipeline / Artifact Registry package name."""
    parameters: dict[str, TemplateParameter]
    kubernetes_platform: bool
    """True when a kfp-kubernetes `platforms:` document follows (Vertex cannot load it)."""
    sha256: str


def read_template(path: str | Path) -> TemplateInfo:
    """Load a compiled pipeline YAML written by `llmft compile` (or any KFP v2 compiler).

    Raises:
        FileNotFoundError: path does not exist.
        ValueError: the file is not a KFP v2 pipeline spec.
    """
    import yaml

    path = Path(path)
    raw = path.read_bytes()
    try:
        docs = [doc for doc in yaml.safe_load_all(raw) if doc is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not YAML: {exc}") from None
    return template_info(docs, path, raw)


def template_info(docs: list[Any], path: Path, raw: bytes) -> TemplateInfo:
    """Facts from the YAML documents of a template (a local file or one fetched from a registry)."""
    if not docs or not isinstance(docs[0], dict) or "pipelineInfo" not in docs[0]:
        raise ValueError(
            f"{path} is not a compiled KFP pipeline (no pipelineInfo); run `llmft compile`"
        )
    spec = docs[0]
    inputs = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    parameters = {
        name: TemplateParameter(
            name=name,
            type=meta.get("parameterType", "STRING"),
            default=meta.get("defaultValue"),
            optional=bool(meta.get("isOptional", "defaultValue" in meta)),
            description=meta.get("description", ""),
        )
        for name, meta in inputs.items()
    }
    return TemplateInfo(
        path=path,
        name=spec["pipelineInfo"]["name"],
        parameters=parameters,
        kubernetes_platform=any("platforms" in doc for doc in docs[1:]),
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def parameter_errors(info: TemplateInfo, params: dict[str, Any]) -> list[str]:
    """Unknown names, missing required values and wrong types, all at once."""
    errors = []
    for name, value in params.items():
        param = info.parameters.get(name)
        if param is None:
            known = ", ".join(sorted(info.parameters)) or "none"
            errors.append(f"parameter {name!r} is not in {info.path.name} (known: {known})")
            continue
        allowed = _PYTHON_TYPES.get(param.type, (object,))
        is_bool_for_number = isinstance(value, bool) and param.type.startswith("NUMBER")
        if not isinstance(value, allowed) or is_bool_for_number:
            errors.append(f"parameter {name!r} wants {param.type}, got {value!r}")
    for name, param in info.parameters.items():
        if not param.optional and name not in params:
            errors.append(f"parameter {name!r} is required ({param.description or param.type})")
    return errors


def check_for_backend(info: TemplateInfo, backend: str) -> None:
    """Refuse the kfp-kubernetes template on Vertex, which fails to parse its second document."""
    if backend == "vertex" and info.kubernetes_platform:
        raise ValueError(
            f"{info.path} carries kfp-kubernetes platform config, which Vertex AI cannot load: "
            "use the vertex target (compiled/fine_tune.vertex.yaml)"
        )


def uses_schedule_time(params: dict[str, Any]) -> list[str]:
    """Names of parameters whose value contains the schedule-time placeholder."""
    return [k for k, v in params.items() if isinstance(v, str) and SCHEDULE_TIME_PLACEHOLDER in v]


def fill_schedule_time(params: dict[str, Any], when: dt.datetime) -> dict[str, Any]:
    """Replace the placeholder with `when` in UTC, RFC 3339 like the backends write it.

    Used for one-off runs and backfills: the run reads the window it would have read had a
    schedule started it at `when`.
    """
    if when.tzinfo is None:
        raise ValueError(f"schedule time {when.isoformat()} has no time zone; append Z for UTC")
    stamp = when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        k: v.replace(SCHEDULE_TIME_PLACEHOLDER, stamp) if isinstance(v, str) else v
        for k, v in params.items()
    }
