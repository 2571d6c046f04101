"""Fakes at the HTTP boundary of the cloud SDKs, for the GKE and Vertex launcher tests.

`FakeKube` replaces the REST layer under a real `kubernetes.client.ApiClient`: the client builds,
serializes and deserializes everything as usual, and the fake records each request (method, path,
query, JSON body) and answers from canned API responses, in order, per route. `FakeHttp` does the
same for a `requests` session (the Vertex SDK's REST transport).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests
import urllib3
from kubernetes import client
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException

Reply = tuple[int, Any]


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class _Route:
    method: str
    pattern: re.Pattern[str]
    replies: list[Reply | Callable[[Recorded], Reply]]
    repeat_last: bool


@dataclass
class Router:
    requests: list[Recorded] = field(default_factory=list)
    routes: list[_Route] = field(default_factory=list)

    def on(
        self,
        method: str,
        path_regex: str,
        *replies: Reply | Callable[[Recorded], Reply],
        repeat_last: bool = True,
    ) -> Router:
        """Answer `method path` with `replies` in turn (the last one repeats by default)."""
        self.routes.append(_Route(method, re.compile(path_regex + "$"), list(replies), repeat_last))
        return self

    def answer(self, recorded: Recorded) -> Reply:
        self.requests.append(recorded)
        for route in self.routes:
            if route.method == recorded.method and route.pattern.match(recorded.path):
                if not route.replies:
                    break
                reply = route.replies[0]
                if len(route.replies) > 1 or not route.repeat_last:
                    route.replies.pop(0)
                return reply(recorded) if callable(reply) else reply
        return 404, {
            "kind": "Status",
            "status": "Failure",
            "reason": "NotFound",
            "message": f"no fake route for {recorded.method} {recorded.path}",
            "code": 404,
        }

    def sent(self, method: str, path_regex: str) -> list[Recorded]:
        pattern = re.compile(path_regex + "$")
        return [r for r in self.requests if r.method == method and pattern.match(r.path)]


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
    router = Router()
    configuration = client.Configuration()
    configuration.host = "https://fake-cluster"
    api_client = client.ApiClient(configuration)
    api_client.rest_client = _FakeRest(router)
    return api_client, router


class FakeHttp(requests.adapters.BaseAdapter):
    """A `requests` transport adapter answering from a `Router` (mount it on a session)."""

    def __init__(self, router: Router) -> None:
        super().__init__()
        self.router = router

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        parts = urlsplit(request.url or "")
        body = request.body
        if isinstance(body, bytes):
            body = body.decode()
        status, payload = self.router.answer(
            Recorded(
                request.method or "",
                parts.path,
                dict(parse_qsl(parts.query)),
                json.loads(body) if body else None,
            )
        )
        response = requests.Response()
        response.status_code = status
        response._content = json.dumps(payload).encode()
        response.headers["content-type"] = "application/json"
        response.request = request
        response.url = request.url or ""
        return response

    def close(self) -> None:
        pass
