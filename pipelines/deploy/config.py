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
ValueError, so a user fixes them all in one go.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from components.run_params import K8S_LABEL_NAME, PROJECT_ID, REGION, RunParams

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
    """Pipeline parameters; names must exist in the template."""
    vertex: VertexSettings = field(default_factory=VertexSettings)
    kfp: KfpSettings = field(default_factory=KfpSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)


_PROJECT = re.compile(PROJECT_ID[0])
_REGION = re.compile(REGION[0])
_SA_EMAIL = re.compile(r"^[a-z][a-z0-9-]{4,61}[a-z0-9]@[a-z0-9.-]+\.gserviceaccount\.com$")
_NETWORK = re.compile(r"^projects/[0-9]+/global/networks/[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_K8S_NAME = re.compile(f"^{K8S_LABEL_NAME[0]}$")
_AR_REGISTRY = re.compile(r"^https://[a-z0-9-]+-kfp\.pkg\.dev/[^/]+/[^/]+/?$")
_KMS_KEY = re.compile(r"^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$")


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


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
    import yaml

    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a YAML mapping at the top level")
        data = loaded or {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    errors: list[str] = []
    config = _build(DeployConfig, data, "", errors)
    if errors:
        raise ValueError(_format(path, errors))
    return typing.cast(DeployConfig, config)


def _format(path: Path | None, errors: list[str]) -> str:
    where = f" in {path}" if path else ""
    return f"{len(errors)} config problem(s){where}:\n  - " + "\n  - ".join(errors)


def _check_time(name: str, text: str | None, errors: list[str]) -> dt.datetime | None:
    if text is None:
        return None
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        errors.append(f"{name}: {text!r} is not an RFC 3339 time like 2026-01-05T03:00:00Z")
        return None
    if stamp.tzinfo is None:
        errors.append(f"{name}: {text!r} has no time zone; append Z for UTC")
        return None
    return stamp


def _vertex_errors(v: VertexSettings, purpose: Purpose, errors: list[str]) -> None:
    if purpose == "upload":
        if not v.registry:
            errors.append(
                "vertex.registry: set the Artifact Registry KFP repository, "
                "https://<region>-kfp.pkg.dev/<project>/<repo> (--registry)"
            )
        elif not (_AR_REGISTRY.match(v.registry) or _is_url(v.registry)):
            errors.append(f"vertex.registry: {v.registry!r} is not an https:// repository URL")
        return
    if not v.project:
        errors.append("vertex.project: set the Google Cloud project id (--project)")
    elif not _PROJECT.fullmatch(v.project):
        errors.append(f"vertex.project: {v.project!r} is not a project id (lowercase, 6-30 chars)")
    if not _REGION.fullmatch(v.region):
        errors.append(f"vertex.region: {v.region!r} is not a region like us-central1")
    if purpose in ("run", "schedule"):
        if not v.pipeline_root:
            errors.append(
                "vertex.pipeline_root: set a gs:// prefix for run artifacts (--pipeline-root)"
            )
        elif not v.pipeline_root.startswith("gs://"):
            errors.append(f"vertex.pipeline_root: {v.pipeline_root!r} must start with gs://")
    if v.service_account and not _SA_EMAIL.match(v.service_account):
        errors.append(
            f"vertex.service_account: {v.service_account!r} is not a service-account email "
            "(<name>@<project>.iam.gserviceaccount.com)"
        )
    if v.network and not _NETWORK.match(v.network):
        errors.append(
            f"vertex.network: {v.network!r} must look like projects/<number>/global/networks/<name>"
        )
    for key, value in v.labels.items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            errors.append(
                f"vertex.labels: {key}={value} (keys: lowercase letter first, then [a-z0-9_-]; "
                "values: [a-z0-9_-], at most 63 chars)"
            )
    if v.failure_policy not in (None, "fast", "slow"):
        errors.append(f"vertex.failure_policy: {v.failure_policy!r} must be fast or slow")
    if v.encryption_key and not _KMS_KEY.match(v.encryption_key):
        errors.append(
            "vertex.encryption_key: expected projects/<p>/locations/<l>/keyRings/<r>/cryptoKeys/<k>"
        )


def _kfp_errors(k: KfpSettings, purpose: Purpose, errors: list[str]) -> None:
    if k.host is not None and not _is_url(k.host):
        errors.append(f"kfp.host: {k.host!r} must start with http:// or https://")
    if k.namespace is not None and not _K8S_NAME.match(k.namespace):
        errors.append(f"kfp.namespace: {k.namespace!r} is not a Kubernetes namespace name")
    if k.service_account is not None and not _K8S_NAME.match(k.service_account):
        errors.append(f"kfp.service_account: {k.service_account!r} is not a Kubernetes name")
    if (k.pipeline_id is None) != (k.version_id is None):
        errors.append("kfp.pipeline_id and kfp.version_id go together: set both or neither")


def _schedule_errors(s: ScheduleSettings, backend: Backend, errors: list[str]) -> None:
    from pipelines.deploy.cron import parse_cron

    if not s.cron:
        errors.append(
            "schedule.cron: set when to run, e.g. --cron 'CRON_TZ=Europe/Berlin 0 3 * * 1'"
        )
    else:
        try:
            cron = parse_cron(s.cron)
            if backend == "kfp":
                cron.to_kfp()
        except ValueError as exc:
            errors.append(f"schedule.cron: {exc}")
    if s.max_concurrent_runs < 1:
        errors.append("schedule.max_concurrent_runs: must be at least 1")
    if s.max_run_count is not None and s.max_run_count < 1:
        errors.append("schedule.max_run_count: must be at least 1 (or unset for no limit)")
    start = _check_time("schedule.start_time", s.start_time, errors)
    end = _check_time("schedule.end_time", s.end_time, errors)
    if start and end and end <= start:
        errors.append("schedule.end_time: must be after schedule.start_time")


def validate(config: DeployConfig, backend: Backend, purpose: Purpose) -> None:
    """Check what `purpose` on `backend` needs; raise one ValueError listing every problem.

    Purposes: `run` (one-off submission), `schedule` (create or update a schedule), `upload`
    (publish a template), `manage` (list/pause/resume/delete schedules).
    """
    errors: list[str] = []
    if purpose in ("run", "schedule", "upload"):
        has_kfp_version = backend == "kfp" and config.kfp.version_id is not None
        if not config.template and not has_kfp_version:
            errors.append(
                "template: set the compiled pipeline (--template compiled/fine_tune.<target>.yaml)"
            )
        elif config.template and _is_url(config.template) and backend == "kfp":
            errors.append(
                "template: KFP takes a local compiled YAML (or kfp.pipeline_id + kfp.version_id "
                "from `llmft upload --target kfp`), not a URL"
            )
        elif config.template and purpose == "upload" and _is_url(config.template):
            errors.append("template: upload takes a local compiled YAML")
        elif (
            config.template and not _is_url(config.template) and not Path(config.template).is_file()
        ):
            errors.append(f"template: {config.template} does not exist (run `llmft compile`)")
    if backend == "vertex":
        _vertex_errors(config.vertex, purpose, errors)
    else:
        _kfp_errors(config.kfp, purpose, errors)
    if purpose == "schedule":
        _schedule_errors(config.schedule, backend, errors)
    if errors:
        raise ValueError(_format(None, errors))


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
        if name in ("template", "display_name", "parameters"):
            overrides[name] = value
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
    """`load_config` with flags, defaulting the template to the backend's compiled target."""
    config = load_config(path, flag_overrides(backend, **flags))
    if config.template is None and not (backend == "kfp" and config.kfp.version_id):
        config.template = default_template(backend)
    return config
