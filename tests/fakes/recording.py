"""What every fake here shares: the recorded request, a route table, a local HTTP server.

`Router` answers requests from canned replies per (method, path regex), in order, and records them;
`FakeHttp` answers from a `Router` as a `requests` transport adapter (Google's REST clients: mount
it on the client's session); `LocalHttpServer` is a real HTTP server on loopback for SDKs that must
be exercised over the wire.
"""

from __future__ import annotations

import email.parser
import http.server
import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests

Reply = tuple[int, Any]


@dataclass
class Recorded:
    """One request as the service received it (path without the query; JSON body decoded)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    files: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


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


def _multipart(content_type: str, raw: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    message = email.parser.BytesParser().parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw
    )
    fields, files = {}, {}
    for part in message.get_payload():  # type: ignore[union-attr]
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if part.get_filename():
            files[name] = payload
        else:
            fields[name] = payload.decode()
    return fields, files


class LocalHttpServer:
    """A real HTTP server on 127.0.0.1 (its own thread) that records every request and answers
    with `self.handle(recorded)`; use it as a context manager. The port is the server's own
    (bound and listening at once), so nothing is picked and handed over."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ctype = self.headers.get("Content-Type", "")
                files: dict[str, bytes] = {}
                body: Any = None
                if ctype.startswith("multipart/"):
                    body, files = _multipart(ctype, raw)
                elif raw:
                    body = json.loads(raw)
                rec = Recorded(self.command, url.path, query, body, files, dict(self.headers))
                owner.requests.append(rec)
                status, payload, *headers = owner.handle(rec)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (headers[0] if headers else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_POST = do_DELETE = do_PATCH = _serve

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def handle(self, rec: Recorded) -> tuple[int, Any] | tuple[int, Any, dict[str, str]]:
        """(status, JSON payload or bytes[, extra response headers]) for one request."""
        raise NotImplementedError

    def __enter__(self) -> LocalHttpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def calls(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path == path]


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
