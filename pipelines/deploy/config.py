"""Typed submission and schedule settings, read from a YAML file and command-line flags.

A config file looks like docs/deploy/example.yaml:

    template: compiled/fine_tune.vertex.yaml     # or an Artifact Registry URI
    display_name: llmft-fine-tune
    parameters: {base_model: latest-registered, ...}
    vertex: {project: ..., region: us-central1, pipeline_root: gs://..., ...}
    kfp: {host: http://localhost:8080, experiment: llmft, ...}
    schedule: {cron: "CRON_TZ=Europe/Berlin 0 3 * * 1", max_concurrent_runs: 1, ...}

Flags override the file (`overrides` below uses dotted keys such as `vertex.project`). The whole
config is checked once, for the backend and purpose at hand, and every problem is reported in one
ValueError, so a user fixes them all in one go (the checks: pipelines/deploy/checks.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from components.params.run_params import RunParams
from trainer.config_file import read_yaml_mapping

DERIVED_WORK_DIR = "llmft-work"
"""A run without `work_uri` keeps its scratch in this folder under its gs:// pipeline root
(pipelines/deploy/submit.py); the stack's lifecycle rule expires it there (infra settings)."""

Backend = Literal["vertex", "kfp"]
Purpose = Literal["run", "schedule", "upload", "manage"]


@dataclass
class VertexSettings:
    """Where and as whom a run executes on Vertex AI Pipelines."""

    project: str | None = None
    """Google Cloud project id that owns the pipeline runs."""
    region: str = RunParams.region
    """Vertex AI region; the Artifact Registry repository should be in the same one."""
    pipeline_root: str | None = None
    """gs:// prefix where runs write their artifacts (required: no implicit buckets)."""
    service_account: str | None = None
    """Service account the run acts as (needs the roles listed in docs/deploy/README.md)."""
    network: str | None = None
    """VPC to peer with, `projects/<number>/global/networks/<name>` (to reach a private GKE)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels on the PipelineJob (billing, ownership)."""
    experiment: str | None = None
    """Vertex AI Experiment to file one-off runs under (schedules do not support it)."""
    enable_caching: bool | None = None
    """Override every task's caching; None keeps the compiled settings (side-effect tasks never cache)."""
    failure_policy: str | None = None
    """`fast` stops scheduling new tasks after a failure; `slow` (Vertex's default) runs what it can."""
    registry: str | None = None
    """Artifact Registry KFP repository, `https://<region>-kfp.pkg.dev/<project>/<repo>`."""
    encryption_key: str | None = None
    """Cloud KMS key for CMEK, `projects/.../cryptoKeys/<key>`."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Pipeline parameters for runs on Vertex AI only, over the shared `parameters` (e.g. the
    trainer's service-account email, where KFP needs a Kubernetes name)."""


@dataclass
class KfpSettings:
    """Which Kubeflow Pipelines endpoint to talk to, and how runs are filed there."""

    host: str | None = None
    """KFP API endpoint, e.g. `http://localhost:8080` after `kubectl port-forward`."""
    namespace: str | None = None
    """Profile namespace of a multi-user KFP; None for single-user installs."""
    experiment: str = "llmft"
    """KFP experiment the runs and recurring runs belong to (created when missing)."""
    service_account: str | None = None
    """Kubernetes service account the run's pods use (see docs/deploy/rbac.yaml)."""
    pipeline_root: str | None = None
    """Where artifacts go; None uses the KFP installation's default (MinIO or GCS)."""
    enable_caching: bool | None = None
    """Override every task's caching; None keeps the compiled settings."""
    pipeline_name: str = "llmft-fine-tune"
    """Name of the uploaded pipeline in the KFP UI."""
    pipeline_id: str | None = None
    """Uploaded pipeline to run instead of a local template (printed by `llmft upload`)."""
    version_id: str | None = None
    """Uploaded pipeline version to run (with pipeline_id)."""
    iap_client_id: str | None = None
    """OAuth client id when the endpoint sits behind Identity-Aware Proxy."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Pipeline parameters for runs on KFP only, over the shared `parameters` (e.g. the
    training pods' Kubernetes service account)."""


@dataclass
class ScheduleSettings:
    """When a recurring fine-tune runs."""

    cron: str | None = None
    """Five fields, Vertex syntax, optional `CRON_TZ=<zone>` prefix (translated for KFP)."""
    display_name: str = "llmft-scheduled-fine-tune"
    """Name of the schedule; `--update` finds the schedules to repoint by this name."""
    max_concurrent_runs: int = 1
    """Runs allowed at once; 1 keeps a slow run from overlapping the next one."""
    start_time: str | None = None
    """RFC 3339 time of the first possible run (default: now)."""
    end_time: str | None = None
    """RFC 3339 time after which no run starts (default: never)."""
    max_run_count: int | None = None
    """Stop after this many runs (Vertex only; KFP has no such limit)."""
    allow_queueing: bool = False
    """Vertex: queue a run that would exceed max_concurrent_runs instead of skipping it."""
    catchup: bool = False
    """KFP: after a pause, start every missed run (True) or only the latest (False)."""


@dataclass
class DeployConfig:
    """Everything `llmft run|schedule|upload` needs besides credentials."""

    template: str | None = None
    """Compiled pipeline: a local YAML or (Vertex) a registry URI `<registry>/<package>/<tag|sha256:...>`."""
    display_name: str = "llmft-fine-tune"
    """Run display name (a timestamp is added by the backends' job ids)."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Pipeline parameters; names must exist in the template. `vertex.parameters` and
    `kfp.parameters` override them for runs on that backend; `--param` flags override both."""
    vertex: VertexSettings = field(default_factory=VertexSettings)
    kfp: KfpSettings = field(default_factory=KfpSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)


def _build(cls: type, data: Any, prefix: str, errors: list[str]) -> Any:
    """Instantiate dataclass `cls` from a mapping, recording type errors and unknown keys."""
    if data is None:
        return cls()
    if not isinstance(data, dict):
        errors.append(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            errors.append(f"{prefix}{key}: unknown key (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for name in known & data.keys():
        value, hint = data[name], hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(typing.cast(type, hint), value, f"{prefix}{name}.", errors)
            continue
        checked = _coerce(value, hint)
        if checked is _INVALID:
            errors.append(f"{prefix}{name}: expected {_describe(hint)}, got {value!r}")
        else:
            values[name] = checked
    return cls(**values)


_INVALID = object()


def _coerce(value: Any, hint: Any) -> Any:
    """Return value if it fits the annotation (YAML timestamps become RFC 3339 text), else _INVALID."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        return None if type(None) in options else _INVALID
    for option in options:
        origin = typing.get_origin(option) or option
        if origin is str and isinstance(value, dt.datetime):
            stamp = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
            return stamp.isoformat().replace("+00:00", "Z")
        if origin is int and isinstance(value, bool):
            continue
        if origin is dict and isinstance(value, dict):
            value_type = typing.get_args(option)[1] if typing.get_args(option) else Any
            if value_type is str:
                return {str(k): str(v) for k, v in value.items()}
            return dict(value)
        if origin in (str, int, bool) and isinstance(value, origin):
            return value
    return _INVALID


def _describe(hint: Any) -> str:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    names = [getattr(typing.get_origin(o) or o, "__name__", str(o)) for o in options]
    return " or ".join("null" if n == "NoneType" else n for n in names)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if leaf in ("parameters", "labels") and isinstance(value, dict):
        node[leaf] = {**(node.get(leaf) or {}), **value}
    else:
        node[leaf] = value


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> DeployConfig:
    """Read `path` (YAML) and apply `overrides` (dotted keys; None values are ignored).

    Raises:
        FileNotFoundError: path does not exist.
        ValueError: the file is not a mapping, or keys are unknown or of the wrong type.
    """
    data = read_yaml_mapping(path) if path is not None else {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    errors: list[str] = []
    config = _build(DeployConfig, data, "", errors)
    if errors:
        raise ValueError(format_problems(path, errors))
    return typing.cast(DeployConfig, config)


def format_problems(path: Path | None, errors: list[str]) -> str:
    """Every config problem in one message, one per line."""
    where = f" in {path}" if path else ""
    return f"{len(errors)} config problem(s){where}:\n  - " + "\n  - ".join(errors)


_SHARED = ("pipeline_root", "service_account", "experiment", "enable_caching")
_VERTEX_ONLY = (
    "project",
    "region",
    "network",
    "labels",
    "failure_policy",
    "registry",
    "encryption_key",
)
_KFP_ONLY = ("host", "namespace", "pipeline_id", "version_id", "iap_client_id", "pipeline_name")
_SCHEDULE = tuple(f.name for f in dataclasses.fields(ScheduleSettings))


def flag_overrides(backend: Backend, **flags: Any) -> dict[str, Any]:
    """Map command-line flags (None = not given) to dotted config keys for `load_config`.

    Flags shared by both backends (`--service-account`, ...) land in the chosen backend's
    section; a flag that only means something on the other backend is an error, not ignored.
    """
    overrides: dict[str, Any] = {}
    misplaced = []
    for name, value in flags.items():
        if value is None or value == [] or value == {}:
            continue
        if name in ("template", "display_name"):
            overrides[name] = value
        elif name == "parameters":  # over the file's shared and this backend's parameters
            overrides[f"{backend}.parameters"] = value
        elif name in _SHARED:
            overrides[f"{backend}.{name}"] = value
        elif name in _VERTEX_ONLY:
            overrides[f"vertex.{name}"] = value
            if backend != "vertex":
                misplaced.append(f"--{name.replace('_', '-')} (vertex only)")
        elif name in _KFP_ONLY:
            overrides[f"kfp.{name}"] = value
            if backend != "kfp":
                misplaced.append(f"--{name.replace('_', '-')} (kfp only)")
        elif name in _SCHEDULE:
            overrides[f"schedule.{name}"] = value
        else:
            raise AssertionError(f"flag {name} has no config key")
    if misplaced:
        raise ValueError(f"with --backend {backend}, drop: {', '.join(misplaced)}")
    return overrides


def default_template(backend: Backend) -> str:
    """The compile target for `backend` as `llmft compile` writes it."""
    return str(Path("compiled") / f"fine_tune.{backend}.yaml")


def load_for(backend: Backend, path: Path | None, **flags: Any) -> DeployConfig:
    """`load_config` with flags, defaulting the template to the backend's compiled target.

    `parameters` of the result are the ones a run on `backend` gets: the shared ones, then the
    backend's own section's, then the flags'.
    """
    config = load_config(path, flag_overrides(backend, **flags))
    section: VertexSettings | KfpSettings = config.vertex if backend == "vertex" else config.kfp
    config.parameters = {**config.parameters, **section.parameters}
    if config.template is None and not (backend == "kfp" and config.kfp.version_id):
        config.template = default_template(backend)
    return config
