"""The Kubernetes API server, faked at the HTTP boundary under a real `kubernetes` client.

- `fake_kube()`: a real `ApiClient` whose REST layer answers from a `Router` in process (the
  client builds, serializes and deserializes everything as usual; watches stream).
- `KubeApiServer(respond)`: a real HTTP server on loopback answering `respond(method, path,
  body)`, for code that must go through the client's whole HTTP stack.

Both record every request, and every request is also classified as the RBAC permission it needs
(`rbac_permission`): tests/conftest.py fails a test whose requests need a permission missing from
tests/golden/rbac_permissions.json, and tests/test_rbac.py holds that file against the Role in
docs/deploy/rbac.yaml.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import urllib3
from kubernetes import client
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException

from fakes.recording import LocalHttpServer, Recorded, Reply, Router

Permission = tuple[str, str, str]
"""(apiGroup, resource[/subresource], verb), as a Role rule grants it."""

OBSERVED_PERMISSIONS: set[Permission] = set()
"""Every permission a Kubernetes fake was asked for in this test session."""
_UNCHECKED: set[Permission] = set()


def is_discovery(path: str) -> bool:
    """`/api`, `/apis`, `/api/v1`, `/apis/GROUP[/VERSION]`: discovery, which every authenticated
    user may read (the `system:discovery` ClusterRole), so it needs no Role rule."""
    parts = path.strip("/").split("/")
    return (parts[0] == "api" and len(parts) <= 2) or (parts[0] == "apis" and len(parts) <= 3)


def observe(method: str, path: str, query: dict[str, str]) -> None:
    """Record the permission a request needs (called by every Kubernetes fake); discovery needs
    none."""
    if is_discovery(path):
        return
    permission = rbac_permission(method, path, query)
    OBSERVED_PERMISSIONS.add(permission)
    _UNCHECKED.add(permission)


def take_unchecked() -> set[Permission]:
    """The permissions observed since the last call (tests/conftest.py checks them per test)."""
    taken = set(_UNCHECKED)
    _UNCHECKED.clear()
    return taken


def rbac_permission(method: str, path: str, query: dict[str, str]) -> Permission:
    """The (apiGroup, resource, verb) that authorizes this namespaced request, as the API server's
    RBAC authorizer derives it (kubernetes.io/docs/reference/access-authn-authz/authorization)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 4 and parts[2] == "namespaces":
        group, rest_ = "", parts[4:]
    elif parts[0] == "apis" and len(parts) >= 5 and parts[3] == "namespaces":
        group, rest_ = parts[1], parts[5:]
    else:
        raise AssertionError(f"not a namespaced resource request: {method} {path}")
    resource, name = rest_[0], (rest_[1] if len(rest_) > 1 else None)
    if len(rest_) > 2:
        resource = f"{resource}/{rest_[2]}"
    if method == "GET":
        verb = (
            "get" if name else ("watch" if query.get("watch") in ("true", "True", "1") else "list")
        )
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return group, resource, verb


class _RecordingRouter(Router):
    def answer(self, recorded: Recorded) -> Reply:
        observe(recorded.method, recorded.path, recorded.query)
        return super().answer(recorded)


class _StreamedResponse(urllib3.HTTPResponse):
    """A real API server streams watches chunked, which urllib3 reads with `amt=None`; a canned
    body is not chunked, so read it in blocks instead (what kubernetes' Watch sees is the same)."""

    def stream(self, amt: int | None = 2**16, decode_content: bool | None = None) -> Any:
        yield from super().stream(amt or 2**16, decode_content)


class _FakeRest(rest.RESTClientObject):
    def __init__(self, router: Router) -> None:  # no pool manager: nothing leaves the process
        self.router = router

    def request(
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        body: Any = None,
        post_params: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query)) | {str(k): str(v) for k, v in (query_params or [])}
        status, payload = self.router.answer(
            Recorded(method, parts.path, query, json.loads(json.dumps(body)) if body else None)
        )
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        response = _StreamedResponse(
            body=io.BytesIO(data),
            status=status,
            headers={"content-type": "application/json"},
            preload_content=_preload_content,
            reason="OK" if status < 400 else "Error",
        )
        if not _preload_content:
            return response
        wrapped = rest.RESTResponse(response)
        if not 200 <= status <= 299:
            raise ApiException(http_resp=wrapped)
        return wrapped


def fake_kube() -> tuple[client.ApiClient, Router]:
    """A real ApiClient whose HTTP layer is a `Router`."""
    router = _RecordingRouter()
    configuration = client.Configuration()
    configuration.host = "https://fake-cluster"
    api_client = client.ApiClient(configuration)
    api_client.rest_client = _FakeRest(router)
    return api_client, router


Responder = Callable[[str, str, Any], Reply]
"""`respond(method, path, body) -> (status, json)` for a `KubeApiServer`."""


class KubeApiServer(LocalHttpServer):
    """A Kubernetes API server on loopback; `respond(method, path, body) -> (status, json)`
    answers (the path without its query: see `requests[i].query`). Started at once; `close()`."""

    def __init__(self, respond: Responder) -> None:
        super().__init__()
        self._respond = respond
        self.__enter__()
        config = client.Configuration()
        config.host = self.url
        self.api_client = client.ApiClient(config)

    def handle(self, rec: Recorded) -> Reply:
        observe(rec.method, rec.path, rec.query)
        return self._respond(rec.method, rec.path, rec.body)

    def close(self) -> None:
        self.api_client.close()
        self.__exit__(None, None, None)
