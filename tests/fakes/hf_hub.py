"""A Hugging Face Hub on loopback: file downloads as the real hub answers them.

`huggingface_hub.hf_hub_download` asks `HEAD {endpoint}/{repo}/resolve/{revision}/{file}` for the
commit and ETag, then GETs the file. Gated repositories answer 401 with `X-Error-Code:
GatedRepo` to a request without a token; unknown repositories and files 404 with
`RepoNotFound` / `EntryNotFound`, which is how the client tells its errors apart. Point a process
at it with `HF_ENDPOINT=hub.url` (and `HF_HUB_OFFLINE=0`: the tests' default is offline).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from typing import Any


class FakeHub:
    """`repos`: {"owner/name": {"config.json": bytes}}; `gated`: the repos that need a token.
    `requests` records (method, path, Authorization header, status) of each request."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: set[str] = frozenset()) -> None:
        self.repos, self.gated = repos, set(gated)
        self.requests: list[tuple[str, str, str | None, int]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _answer(self, body: bool) -> None:
                auth = self.headers.get("Authorization")
                status, data, headers = hub.resolve(self.path.split("?")[0], auth)
                hub.requests.append((self.command, self.path, auth, status))
                self.send_response(status)
                for name, value in {**headers, "Content-Type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def resolve(self, path: str, auth: str | None) -> tuple[int, bytes, dict[str, str]]:
        parts = path.strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":  # e.g. the client's optional API lookups
            return 404, b'{"error": "Not found"}', {}
        repo, filename = "/".join(parts[:2]), "/".join(parts[4:])
        if repo in self.gated and not auth:
            return 401, b'{"error": "Access restricted"}', {"X-Error-Code": "GatedRepo"}
        files = self.repos.get(repo)
        if files is None:
            return 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}
        if filename not in files:
            return 404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"}
        data = files[filename]
        etag = f'"{hashlib.sha1(data).hexdigest()}"'
        return 200, data, {"X-Repo-Commit": "0" * 40, "ETag": etag}

    def files_served(self) -> list[tuple[str, str | None]]:
        """(path, Authorization) of each file download (a GET answered 200)."""
        return [(p, a) for m, p, a, s in self.requests if m == "GET" and s == 200]

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
