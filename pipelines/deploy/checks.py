"""The checks of a deploy config for what a command is about to do (`validate`).

A config is checked once, for the backend and the purpose at hand (run, schedule, upload,
manage), and every problem is reported in one ValueError, so a user fixes them all in one go.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from components.launchers.vocab import K8S_LABEL_NAME, PROJECT_ID, REGION
from components.runtime.run_identity import GCP_LABEL_KEY, GCP_LABEL_VALUE
from pipelines.deploy.config import (
    Backend,
    DeployConfig,
    KfpSettings,
    Purpose,
    ScheduleSettings,
    VertexSettings,
    format_problems,
)
from pipelines.deploy.cron import parse_cron

_PROJECT = re.compile(PROJECT_ID[0])
_REGION = re.compile(REGION[0])
_SA_EMAIL = re.compile(r"^[a-z][a-z0-9-]{4,61}[a-z0-9]@[a-z0-9.-]+\.gserviceaccount\.com$")
_NETWORK = re.compile(r"^projects/[0-9]+/global/networks/[a-z]([-a-z0-9]*[a-z0-9])?$")
_K8S_NAME = re.compile(f"^{K8S_LABEL_NAME[0]}$")
_AR_REGISTRY = re.compile(r"^https://[a-z0-9-]+-kfp\.pkg\.dev/[^/]+/[^/]+/?$")
_KMS_KEY = re.compile(r"^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$")


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


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
        if not GCP_LABEL_KEY.match(key) or not GCP_LABEL_VALUE.match(value):
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


def _kfp_errors(k: KfpSettings, errors: list[str]) -> None:
    if k.host is not None and not _is_url(k.host):
        errors.append(f"kfp.host: {k.host!r} must start with http:// or https://")
    if k.namespace is not None and not _K8S_NAME.match(k.namespace):
        errors.append(f"kfp.namespace: {k.namespace!r} is not a Kubernetes namespace name")
    if k.service_account is not None and not _K8S_NAME.match(k.service_account):
        errors.append(f"kfp.service_account: {k.service_account!r} is not a Kubernetes name")
    if (k.pipeline_id is None) != (k.version_id is None):
        errors.append("kfp.pipeline_id and kfp.version_id go together: set both or neither")


def _schedule_errors(s: ScheduleSettings, backend: Backend, errors: list[str]) -> None:
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
        _kfp_errors(config.kfp, errors)
    if purpose == "schedule":
        _schedule_errors(config.schedule, backend, errors)
    if errors:
        raise ValueError(format_problems(None, errors))
