"""SDK clients for Vertex AI and KFP, and the translation of their failures into user errors.

A missing login, an unreachable host or a refused permission are the usual first-day problems;
each becomes a ValueError whose one line says what to run or set, which `llmft` prints without a
stack trace. Credentials can be passed in (tests pass `AnonymousCredentials`); otherwise
Application Default Credentials are used.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from components.platform.kfp_backend import kfp_backend_floor, version_text

if TYPE_CHECKING:
    import kfp.client
    from google.auth.credentials import Credentials

    from pipelines.deploy.config import KfpSettings

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
KFP_HOST_ENV = "KF_PIPELINES_ENDPOINT"
"""The KFP SDK's own variable for the API endpoint, honoured when --host is not given."""
KFP_TOKEN_ENV = "KFP_TOKEN"
"""Bearer token for the KFP API (e.g. `gcloud auth print-access-token` behind a GKE gateway)."""

_LOGIN_HINT = (
    "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service-account key file"
)


def google_credentials(credentials: Credentials | None = None) -> Credentials:
    """Return `credentials`, or Application Default Credentials with a clear error if none."""
    if credentials is not None:
        return credentials
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        found, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except DefaultCredentialsError as exc:
        first = str(exc).split(". ")[0]
        raise ValueError(f"no Google Cloud credentials ({first}): {_LOGIN_HINT}") from None
    return found


@contextlib.contextmanager
def cloud_errors(action: str) -> Iterator[None]:
    """Turn auth, permission, not-found and connection failures inside the block into ValueError."""
    import google.api_core.exceptions as gexc
    import google.auth.exceptions as aexc
    import kfp_server_api
    import requests
    import urllib3

    try:
        yield
    except aexc.DefaultCredentialsError as exc:
        raise ValueError(f"{action}: no Google Cloud credentials ({exc}): {_LOGIN_HINT}") from None
    except (aexc.RefreshError, aexc.TransportError) as exc:
        raise ValueError(
            f"{action}: could not get an access token ({_first_line(exc)}): {_LOGIN_HINT}"
        ) from None
    except gexc.PermissionDenied as exc:
        raise ValueError(
            f"{action}: permission denied ({exc.message}); grant the roles listed in "
            "docs/deploy/README.md (IAM) to the caller"
        ) from None
    except gexc.Unauthenticated as exc:
        raise ValueError(f"{action}: not authenticated ({exc.message}): {_LOGIN_HINT}") from None
    except gexc.NotFound as exc:
        raise ValueError(
            f"{action}: not found ({exc.message}); check project, location and name"
        ) from None
    except (gexc.InvalidArgument, gexc.FailedPrecondition, gexc.AlreadyExists) as exc:
        raise ValueError(f"{action}: rejected by the service: {exc.message}") from None
    except (gexc.ServiceUnavailable, gexc.RetryError, gexc.DeadlineExceeded) as exc:
        raise ValueError(
            f"{action}: service unreachable ({_first_line(exc)}); check the network"
        ) from None
    except requests.HTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        hint = _LOGIN_HINT if status in (401, 403) else "check the URL"
        raise ValueError(f"{action}: HTTP {status} from {_url(exc)}: {hint}") from None
    except (requests.ConnectionError, requests.Timeout, urllib3.exceptions.HTTPError) as exc:
        raise ValueError(
            f"{action}: cannot connect ({_first_line(exc)}); check the host and network"
        ) from None
    except kfp_server_api.ApiException as exc:
        raise ValueError(
            f"{action}: KFP API answered {exc.status} {exc.reason}: {_kfp_message(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


def _url(exc: Any) -> str:
    request = getattr(exc, "request", None)
    return getattr(request, "url", None) or "the server"


def _kfp_message(exc: Any) -> str:
    import json

    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.body)[:200]
    return str(body.get("message") or body.get("error_message") or body)[:300]


def kfp_host(settings: KfpSettings) -> str:
    """The KFP endpoint from settings or KF_PIPELINES_ENDPOINT, or a ValueError saying how to get one."""
    host = settings.host or os.environ.get(KFP_HOST_ENV)
    if not host:
        raise ValueError(
            "no KFP host: pass --host (or kfp.host in the config, or set "
            f"{KFP_HOST_ENV}); for a cluster, `kubectl port-forward -n kubeflow "
            "svc/ml-pipeline-ui 8080:80` and use --host http://localhost:8080"
        )
    return host.rstrip("/")


def kfp_backend_error(host: str, tag_name: object) -> str | None:
    """Why the KFP backend of release `tag_name` (its healthz `tag_name`) cannot run the compiled
    pipeline as intended, or None. An unknown or unparseable tag is not judged."""
    found = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", str(tag_name or ""))
    if not found:
        return None
    version = tuple(int(part) for part in found.groups())
    floor = kfp_backend_floor()
    if version >= floor:
        return None
    return (
        f"KFP at {host} is backend {tag_name}; the compiled pipeline needs {version_text(floor)} "
        "or later (docs/deploy/README.md, KFP on GKE: on older ones optional Secrets, pod "
        "security settings or the schedule-time placeholder are silently dropped): upgrade "
        "Kubeflow Pipelines"
    )


def kfp_client(settings: KfpSettings, *, check_version: bool = True) -> kfp.client.Client:
    """A kfp.Client for the configured host, checked to answer before it is returned.

    kfp.Client retries an unreachable endpoint for half a minute before failing with a stack
    trace; one quick health probe first turns that into an immediate, readable error. The same
    probe reports the backend's release (`tag_name`, since KFP 2.0.0:
    backend/src/apiserver/main.go); with `check_version`, one older than the compiled
    pipeline's floor is refused before anything is uploaded, run or scheduled.
    """
    import warnings

    import requests
    from kfp.client import Client

    host = kfp_host(settings)
    token = os.environ.get(KFP_TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        probe = requests.get(f"{host}/apis/v2beta1/healthz", headers=headers, timeout=15)
    except requests.RequestException as exc:
        raise ValueError(
            f"cannot reach KFP at {host} ({type(exc).__name__}): check --host, and that "
            "`kubectl port-forward` (or the gateway) is running"
        ) from None
    if settings.iap_client_id:
        pass  # behind IAP the probe is redirected to a login page; kfp.Client brings the token
    elif probe.status_code in (401, 403):
        raise ValueError(
            f"KFP at {host} refused the request ({probe.status_code}): set {KFP_TOKEN_ENV} to a "
            "bearer token, or --iap-client-id for an IAP-protected endpoint"
        )
    elif probe.status_code >= 400:
        raise ValueError(
            f"{host} answered {probe.status_code} to /apis/v2beta1/healthz: is it a KFP API endpoint?"
        )
    elif check_version and (problem := kfp_backend_error(host, _healthz_tag(probe))):
        raise ValueError(problem)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", FutureWarning
        )  # "only works with KFP v2 backends": we are one
        return Client(
            host=host,
            existing_token=token,
            client_id=settings.iap_client_id,
            # Single-user installs: kfp.Client's own default namespace.
            **({"namespace": settings.namespace} if settings.namespace else {}),
        )


def kfp_ui_url(host: str, kind: str, ident: str) -> str:
    """Link to a run (`runs`) or recurring run (`recurringrun`) in the KFP UI behind `host`."""
    if kind == "runs":
        return f"{host}/#/runs/details/{ident}"
    return f"{host}/#/recurringrun/details/{ident}"


def vertex_run_url(project: str, location: str, job_id: str) -> str:
    """Console link to a Vertex AI pipeline run."""
    return (
        f"https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/"
        f"{job_id}?project={project}"
    )


def vertex_schedule_url(project: str, location: str, schedule_id: str) -> str:
    """Console link to a Vertex AI pipeline schedule."""
    return (
        f"https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/schedules/"
        f"{schedule_id}/detail?project={project}"
    )


def schedule_service(location: str, credentials: Credentials) -> Any:
    """A regional `ScheduleServiceClient` (list, pause, resume, delete, update schedules)."""
    from google.cloud import aiplatform_v1

    return aiplatform_v1.ScheduleServiceClient(
        credentials=credentials,
        client_options={"api_endpoint": f"{location}-aiplatform.googleapis.com"},
    )


def _healthz_tag(probe: Any) -> object:
    """The `tag_name` of a healthz answer (None when the body is not the JSON KFP sends)."""
    try:
        body = probe.json()
    except ValueError:
        return None
    return body.get("tag_name") if isinstance(body, dict) else None
