"""components/runtime/secrets.py against Secret Manager's REST API, answered at the HTTP boundary of a real
SecretManagerServiceClient (anonymous credentials, REST transport)."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from fakes.recording import FakeHttp, Router
from google.auth.credentials import AnonymousCredentials


def _secret_manager(router: Router) -> Any:
    from google.cloud import secretmanager

    client = secretmanager.SecretManagerServiceClient(
        credentials=AnonymousCredentials(), transport="rest"
    )
    client._transport._session.mount("https://", FakeHttp(router))
    return client


def test_secret_manager_read_is_optional() -> None:
    """components/runtime/secrets.py against Secret Manager's REST API (answered at the HTTP boundary):
    the value when the secret exists, None (and a note) when it is missing or not readable."""
    from components.runtime.secrets import read_secret, secret_version_name

    name = secret_version_name("llmft-hf-token", "p")
    assert name == "projects/p/secrets/llmft-hf-token/versions/latest"
    assert secret_version_name("projects/q/secrets/s/versions/3", "p").startswith("projects/q/")
    router = Router()
    payload = {"data": base64.b64encode(b"the-value\n").decode()}
    router.on("GET", f"/v1/{name}:access", (200, {"name": name, "payload": payload}))
    router.on(
        "GET",
        "/v1/projects/p/secrets/denied/versions/latest:access",
        (403, {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}),
    )
    router.on(
        "GET",
        "/v1/projects/p/secrets/failing/versions/latest:access",
        (500, {"error": {"code": 500, "message": "internal", "status": "INTERNAL"}}),
    )
    client = _secret_manager(router)
    assert read_secret(name, client) == "the-value"
    assert read_secret("projects/p/secrets/missing/versions/latest", client) is None
    assert read_secret("projects/p/secrets/denied/versions/latest", client) is None
    assert read_secret("projects/p/secrets/failing/versions/latest", client) is None


def test_pipeline_tasks_load_the_token_only_when_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks on Vertex (evaluate, preprocess) read the token by name into their own env; an
    HF_TOKEN already set (KFP mounts the Secret) or no project/secret (local) is left alone."""
    from components.runtime.secrets import load_hf_token

    name = "projects/p/secrets/llmft-hf-token/versions/latest"
    router = Router()
    router.on(
        "GET",
        f"/v1/{name}:access",
        (200, {"name": name, "payload": {"data": base64.b64encode(b"tok").decode()}}),
    )
    client = _secret_manager(router)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert not load_hf_token(project="", secret="llmft-hf-token", client=client)
    assert load_hf_token(project="p", secret="llmft-hf-token", client=client)
    assert os.environ["HF_TOKEN"] == "tok"
    assert not load_hf_token(project="p", secret="llmft-hf-token", client=client)  # already set
    assert len(router.requests) == 1
