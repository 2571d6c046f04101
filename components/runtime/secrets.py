"""Read a secret from Secret Manager at run time, by name (the Hugging Face token on Vertex).

Why at run time: a token passed as a pipeline parameter or written into a CustomJob's env is
stored in the run's spec and shown in the console. The Vertex launcher puts only the secret's
resource name in the replica's env (`HF_TOKEN_SECRET`); each replica reads the value before
torchrun starts:

    HF_TOKEN="$(python -m components.runtime.secrets "$HF_TOKEN_SECRET")"

The value goes to stdout only (captured by the shell, never logged). The token is optional
(public models need none): a secret that does not exist, or that the job's service account may
not read, gives no token and a one-line note on stderr saying what to grant.
"""

from __future__ import annotations

import sys
from typing import Any

HF_TOKEN_SECRET_ENV = "HF_TOKEN_SECRET"
"""Env var carrying the secret's resource name into a Vertex replica."""


def secret_version_name(secret: str, project: str) -> str:
    """`name`, `projects/P/secrets/NAME` or a full version name -> the version to access
    (`.../versions/latest` unless one is given)."""
    name = secret if secret.startswith("projects/") else f"projects/{project}/secrets/{secret}"
    return name if "/versions/" in name else f"{name}/versions/latest"


def read_secret(version_name: str, client: Any = None) -> str | None:
    """The secret's value, or None (with a note on stderr) when it is missing or not readable
    (no credentials, no such secret, no access, or the service failing after its client's own
    retries): the token is optional, and a step that needs it fails later saying so."""
    from google.api_core import exceptions
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import secretmanager

    try:
        client = client or secretmanager.SecretManagerServiceClient()
        response = client.access_secret_version(request={"name": version_name})
    except DefaultCredentialsError:
        print(
            f"[secrets] no Google credentials to read {version_name}: continuing without it",
            file=sys.stderr,
        )
        return None
    except exceptions.NotFound:
        print(f"[secrets] {version_name} does not exist: continuing without it", file=sys.stderr)
        return None
    except exceptions.Forbidden:  # PERMISSION_DENIED (gRPC) is a Forbidden (REST) too
        print(
            f"[secrets] no access to {version_name}: grant the job's service account "
            "roles/secretmanager.secretAccessor on it; continuing without it",
            file=sys.stderr,
        )
        return None
    except (exceptions.GoogleAPICallError, exceptions.RetryError) as exc:  # after the retries
        first = (str(exc).strip().splitlines() or [""])[0]
        print(
            f"[secrets] could not read {version_name} ({type(exc).__name__}: {first}): "
            "continuing without it",
            file=sys.stderr,
        )
        return None
    return str(response.payload.data.decode("utf-8")).strip()


def load_hf_token(*, project: str, secret: str, client: Any = None) -> bool:
    """Put the Hugging Face token in this process's HF_TOKEN (for `from_pretrained` of gated hub
    models in a pipeline task on Vertex). No-op when HF_TOKEN is already set (KFP on GKE mounts
    the Kubernetes Secret) or when no secret or project is named (local runs, public models).

    Returns:
        Whether a token was loaded.
    """
    return load_secret_env("HF_TOKEN", project=project, secret=secret, client=client)


def load_secret_env(env: str, *, project: str, secret: str, client: Any = None) -> bool:
    """Put secret `secret`'s value in this process's `env` (the HF token, the MLflow tracking
    token), unless `env` is already set (KFP on GKE mounts the Kubernetes Secret there) or no
    secret or project is named. Child processes (the local launcher's trainers) inherit it.

    Returns:
        Whether a value was loaded.
    """
    import os

    if os.environ.get(env) or not secret or not project:
        return False
    value = read_secret(secret_version_name(secret, project), client)
    if value:
        os.environ[env] = value
    return bool(value)


def secret_problem(param: str, secret: str, *, project: str, client: Any = None) -> str | None:
    """Why secret `secret` (named by run parameter `param`) cannot be read here, or None: a
    secret the run needs that does not exist is refused before anything starts."""
    if not secret:
        return None
    if not project:
        return f"{param}={secret!r}: set project (the Secret Manager project holding it)"
    if read_secret(secret_version_name(secret, project), client) is None:
        return (
            f"{param}={secret!r}: no such secret readable in project {project} (create it, or "
            "grant roles/secretmanager.secretAccessor)"
        )
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m components.runtime.secrets projects/P/secrets/NAME[/versions/V]")
        return 2
    value = read_secret(argv[0])
    if value:
        sys.stdout.write(value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
